"""LaunchPlan building: environment, argv and cores for each option (no worker starts)."""

import shlex
from pathlib import Path

import pytest

from cpuopt_helpers import launch, system
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.errors import CpuoptError

FIX = Path(__file__).parent / "fixtures"
LIBS = {"jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        "iomp": "/venv/lib/libiomp5.so"}


def machine(numactl=True, taskset=True, libs=LIBS, fixture="lscpu_p_xeon_2s_smt.txt"):
    topo = system.Topology(tuple(system.parse_lscpu_parse((FIX / fixture).read_text())))
    return launch.Machine(topo, dict(libs), numactl, taskset)


def plan(config=RunConfig(), env=None, **kw):
    return launch.build_plan(config, machine(**kw), base_env=env or {}, python="/py")


def test_defaults_use_all_physical_cores_of_one_instance():
    p = plan()
    (inst,) = p.instances
    assert inst.cores == tuple(range(56))  # physical cores of both sockets, no SMT siblings
    assert inst.env["OMP_NUM_THREADS"] == "56" and inst.env["MKL_NUM_THREADS"] == "56"
    assert "LD_PRELOAD" not in inst.env and "MALLOC_CONF" not in inst.env and "KMP_AFFINITY" not in inst.env
    assert inst.argv[:3] == ("numactl", "--physcpubind=" + ",".join(map(str, range(56))), "--membind=0,1")
    assert inst.argv[3:6] == ("/py", "-m", "cpuopt_helpers.worker")
    assert RunConfig.from_json(inst.argv[-1]).threads == 56


def test_instances_get_disjoint_cores_within_a_socket():
    p = plan(RunConfig(instances=4, threads=14))
    cores = [set(i.cores) for i in p.instances]
    assert all(len(c) == 14 for c in cores)
    assert set().union(*cores) == set(range(56))
    assert [i.argv[2] for i in p.instances] == ["--membind=0", "--membind=0", "--membind=1", "--membind=1"]
    assert [i.env["CPUOPT_INSTANCE"] for i in p.instances] == ["0", "1", "2", "3"]


def test_smt_siblings_used_only_beyond_physical_cores():
    p = plan(RunConfig(instances=2, threads=56))
    assert set(p.instances[0].cores) == set(range(56))
    assert set(p.instances[1].cores) == set(range(56, 112))


def test_jemalloc_preloads_versioned_library_with_run_cpu_conf():
    inst = plan(RunConfig(allocator="jemalloc")).instances[0]
    assert inst.env["LD_PRELOAD"] == LIBS["jemalloc"]
    assert inst.env["MALLOC_CONF"] == "oversize_threshold:1,background_thread:true,metadata_thp:auto"


def test_tcmalloc_and_intel_openmp_preload_in_order():
    inst = plan(RunConfig(allocator="tcmalloc", omp_runtime="intel", kmp_blocktime=200)).instances[0]
    assert inst.env["LD_PRELOAD"] == f"{LIBS['tcmalloc']}:{LIBS['iomp']}"
    assert inst.env["KMP_AFFINITY"] == "granularity=fine,compact,1,0"
    assert inst.env["KMP_BLOCKTIME"] == "200"
    assert plan(RunConfig(omp_runtime="intel")).instances[0].env["KMP_BLOCKTIME"] == "1"


def test_missing_allocator_is_a_clear_error():
    with pytest.raises(CpuoptError, match="jemalloc library not found.*apt-get install libjemalloc2"):
        plan(RunConfig(allocator="jemalloc"), libs={"jemalloc": None, "tcmalloc": None, "iomp": None})
    with pytest.raises(CpuoptError, match="pip install intel-openmp"):
        plan(RunConfig(omp_runtime="intel"), libs={"iomp": None})


def test_user_environment_wins_with_a_warning():
    p = plan(RunConfig(allocator="jemalloc"), env={"OMP_NUM_THREADS": "3", "LD_PRELOAD": "/my/lib.so"})
    inst = p.instances[0]
    assert inst.env["OMP_NUM_THREADS"] == "3"
    assert inst.env["LD_PRELOAD"] == f"/my/lib.so:{LIBS['jemalloc']}"
    assert len(p.warnings) == 1 and "OMP_NUM_THREADS=3" in p.warnings[0]


def test_extra_env_from_config():
    inst = plan(RunConfig(env=(("OMP_PROC_BIND", "close"),))).instances[0]
    assert inst.env["OMP_PROC_BIND"] == "close"


def test_pinning_falls_back_from_numactl_to_taskset_to_the_worker():
    p = plan(RunConfig(instances=2, threads=2), numactl=False)
    assert p.pinning == "taskset" and p.instances[1].argv[:3] == ("taskset", "-c", "2,3")
    p = plan(RunConfig(instances=2, threads=2), numactl=False, taskset=False)
    assert p.pinning == "sched_setaffinity" and p.instances[1].argv[0] == "/py"
    assert p.instances[1].env["CPUOPT_CORES"] == "2,3"  # the worker pins itself from this


def test_explicit_cores_must_exist():
    with pytest.raises(CpuoptError, match="not available here"):
        plan(RunConfig(instances=1, threads=2, cores=((0, 500),)))
    p = plan(RunConfig(instances=2, threads=1, cores=((5,), (60,))))
    assert [i.cores for i in p.instances] == [(5,), (60,)]


def test_validation_uses_the_machine():
    with pytest.raises(CpuoptError, match="more than the 2 logical cores"):
        plan(RunConfig(threads=4), fixture="lscpu_p_epyc_2core.txt")


def test_shell_command_can_be_pasted():
    p = plan(RunConfig(instances=2, threads=1, allocator="tcmalloc"))
    text = p.shell_command()
    lines = text.splitlines()
    assert len(lines) == 3 and lines[-1] == "wait" and lines[0].endswith(" &")
    words = shlex.split(lines[0])
    assert words[0] == "env" and f"LD_PRELOAD={LIBS['tcmalloc']}" in words
    config_json = words[words.index("--config") + 1]
    assert RunConfig.from_json(config_json).allocator == "tcmalloc"


def test_scatter_spreads_each_instance_across_sockets():
    p = plan(RunConfig(instances=2, threads=4, affinity="scatter"))
    sockets = [{0 if c < 28 else 1 for c in inst.cores} for inst in p.instances]
    assert sockets == [{0, 1}, {0, 1}]
    assert not set(p.instances[0].cores) & set(p.instances[1].cores)
    compact = plan(RunConfig(instances=2, threads=4))
    assert [set(i.cores) for i in compact.instances] == [{0, 1, 2, 3}, {4, 5, 6, 7}]


def test_affinity_none_pins_nothing():
    p = plan(RunConfig(threads=4, affinity="none", omp_runtime="intel"))
    inst = p.instances[0]
    assert p.pinning == "none" and inst.argv[0] == "/py" and "CPUOPT_CORES" not in inst.env
    assert "KMP_AFFINITY" not in inst.env and inst.env["OMP_NUM_THREADS"] == "4"


def test_oversubscription_only_when_asked():
    with pytest.raises(CpuoptError, match="--oversubscribe"):
        plan(RunConfig(threads=4), fixture="lscpu_p_epyc_2core.txt")
    p = plan(RunConfig(threads=4, oversubscribe=True), fixture="lscpu_p_epyc_2core.txt")
    assert p.instances[0].env["OMP_NUM_THREADS"] == "4" and p.instances[0].cores == (0, 1)


def test_run_cpu_plan_leaves_every_choice_to_run_cpu():
    p = plan(RunConfig(launcher="run_cpu", allocator="jemalloc"))
    (inst,) = p.instances
    assert p.pinning == "run_cpu" and inst.argv[1:3] == ("-m", "torch.backends.xeon.run_cpu")
    assert inst.argv[3].endswith("worker.py")
    assert not {"OMP_NUM_THREADS", "LD_PRELOAD", "CPUOPT_CORES"} & set(inst.env)


def test_user_command_plan():
    p = launch.build_plan(RunConfig(instances=2, threads=2, allocator="tcmalloc"), machine(), base_env={},
                          command=["python", "train.py", "--epochs", "1"])
    assert [i.argv[3:] for i in p.instances] == [("python", "train.py", "--epochs", "1")] * 2
    assert p.instances[1].argv[:3] == ("numactl", "--physcpubind=2,3", "--membind=0")
    assert p.instances[1].env["LD_PRELOAD"] == LIBS["tcmalloc"]


def test_parse_core_list():
    assert launch.parse_core_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    with pytest.raises(CpuoptError, match="cannot read core list"):
        launch.parse_core_list("0-x")
    with pytest.raises(CpuoptError, match="twice"):
        launch.parse_core_list("0-2,1")


def test_a_users_inductor_cache_wins_with_a_warning_for_compiled_runs():
    assert not plan(RunConfig(compile="default"), env={}).warnings  # the worker makes a fresh cache itself
    assert not plan(RunConfig(), env={"TORCHINDUCTOR_CACHE_DIR": "/c"}).warnings  # eager runs compile nothing
    p = plan(RunConfig(compile="default"), env={"TORCHINDUCTOR_CACHE_DIR": "/c"})
    assert any("TORCHINDUCTOR_CACHE_DIR=/c" in w and "cold" in w for w in p.warnings)
    assert "TORCHINDUCTOR_CACHE_DIR" not in p.instances[0].env
    p = plan(RunConfig(compile="default", env={"TORCHINDUCTOR_CACHE_DIR": "/mine"}))
    assert any("TORCHINDUCTOR_CACHE_DIR=/mine" in w for w in p.warnings)


def test_run_json_module_fixes_threads_and_cores_and_keeps_the_users_value(monkeypatch, caplog):
    from cpuopt_helpers.launch import run_json_module

    monkeypatch.chdir(Path(__file__).parent.parent)  # tests.print_env importable, as for user workloads
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    got = run_json_module("tests.print_env", [], "env probe", threads=3, cores=[0, 2])
    assert got == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3", "CPUOPT_CORES": "0,2"}
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    got = run_json_module("tests.print_env", [], "env probe", threads=3)
    assert got["OMP_NUM_THREADS"] == "1" and got["MKL_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS=1 from your environment overrides the planned 3 for the env probe" in caplog.text
    with pytest.raises(CpuoptError, match=r"env probe failed \(exit code 1\): told to fail"):
        run_json_module("tests.print_env", ["fail"], "env probe", error=CpuoptError)
