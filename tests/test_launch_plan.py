"""LaunchPlan building: environment, argv and cores for each option (no worker starts)."""

import json
import shlex
from pathlib import Path

import pytest

from cpuopt_helpers import planning, system
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.errors import CpuoptError

from tests.conftest import FIXTURES as FIX
from tests.conftest import LIBS
from tests.conftest import make_machine as machine


def plan(config=RunConfig(), env=None, **kw):
    return planning.build_plan(config, machine(**kw), base_env=env or {}, python="/py")


def test_defaults_use_all_physical_cores_of_one_instance():
    p = plan()
    (inst,) = p.instances
    assert inst.cores == tuple(range(56))  # physical cores of both sockets, no SMT siblings
    assert inst.env["OMP_NUM_THREADS"] == "56" and inst.env["MKL_NUM_THREADS"] == "56"
    assert "LD_PRELOAD" not in inst.env and "MALLOC_CONF" not in inst.env and "KMP_AFFINITY" not in inst.env
    # one instance on both sockets: each thread's pages on its own node (--membind=0,1 would fill node 0 first)
    assert inst.argv[:3] == ("numactl", "--physcpubind=" + ",".join(map(str, range(56))), "--localalloc")
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
    p = plan(RunConfig(instances=2, threads=28))
    assert [set(i.cores) for i in p.instances] == [set(range(28)), set(range(28, 56))]
    p = plan(RunConfig(instances=2, threads=56))  # more threads than cores: each instance one socket, with siblings
    assert set(p.instances[0].cores) == set(range(28)) | set(range(56, 84))
    assert set(p.instances[1].cores) == set(range(28, 56)) | set(range(84, 112))
    assert [i.argv[2] for i in p.instances] == ["--membind=0", "--membind=1"]


def test_jemalloc_preloads_versioned_library_with_run_cpu_conf_keeping_freed_memory():
    inst = plan(RunConfig(allocator="jemalloc")).instances[0]
    assert inst.env["LD_PRELOAD"] == LIBS["jemalloc"]
    assert inst.env["MALLOC_CONF"] == ("oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                                       "dirty_decay_ms:-1,muzzy_decay_ms:-1")


def test_tcmalloc_and_intel_openmp_preload_in_order():
    inst = plan(RunConfig(allocator="tcmalloc", omp_runtime="intel", kmp_blocktime=200)).instances[0]
    assert inst.env["LD_PRELOAD"] == f"{LIBS['tcmalloc']}:{LIBS['iomp']}"
    assert inst.env["KMP_AFFINITY"] == "granularity=fine,compact,1,0"
    assert inst.env["KMP_BLOCKTIME"] == "200"
    assert plan(RunConfig(omp_runtime="intel")).instances[0].env["KMP_BLOCKTIME"] == "1"


def test_missing_allocator_is_a_clear_error():
    with pytest.raises(CpuoptError, match=r"jemalloc \(--allocator jemalloc\) is not installed on this machine; "
                                          r"install it: apt-get install libjemalloc2"):
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
    with pytest.raises(CpuoptError, match=r"--cores names CPUs 500 that this machine lacks; use CPUs from 0-"):
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
    p = plan(RunConfig(launcher="run_cpu"))
    (inst,) = p.instances
    assert p.pinning == "run_cpu" and inst.argv[1:3] == ("-m", "torch.backends.xeon.run_cpu")
    assert inst.argv[3].endswith("worker.py")
    assert not {"OMP_NUM_THREADS", "LD_PRELOAD", "CPUOPT_CORES"} & set(inst.env)


def test_user_command_plan():
    p = planning.build_plan(RunConfig(instances=2, threads=2, allocator="tcmalloc"), machine(), base_env={},
                          command=["python", "train.py", "--epochs", "1"])
    assert [i.argv[3:] for i in p.instances] == [("python", "train.py", "--epochs", "1")] * 2
    assert p.instances[1].argv[:3] == ("numactl", "--physcpubind=2,3", "--membind=0")
    assert p.instances[1].env["LD_PRELOAD"] == LIBS["tcmalloc"]


def test_parse_core_list():
    assert planning.parse_core_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    with pytest.raises(CpuoptError, match="cannot read core list"):
        planning.parse_core_list("0-x")
    with pytest.raises(CpuoptError, match="twice"):
        planning.parse_core_list("0-2,1")


def test_a_users_inductor_cache_wins_with_a_warning_for_compiled_runs():
    assert not plan(RunConfig(compile="default"), env={}).warnings  # the worker makes a fresh cache itself
    assert not plan(RunConfig(), env={"TORCHINDUCTOR_CACHE_DIR": "/c"}).warnings  # eager runs compile nothing
    p = plan(RunConfig(compile="default"), env={"TORCHINDUCTOR_CACHE_DIR": "/c"})
    assert any("TORCHINDUCTOR_CACHE_DIR=/c" in w and "cold" in w for w in p.warnings)
    assert "TORCHINDUCTOR_CACHE_DIR" not in p.instances[0].env
    p = plan(RunConfig(compile="default", env={"TORCHINDUCTOR_CACHE_DIR": "/mine"}))
    assert any("TORCHINDUCTOR_CACHE_DIR=/mine" in w for w in p.warnings)


def test_a_thread_count_in_the_environment_that_is_no_count_is_refused():
    assert plan(env={"OMP_NUM_THREADS": "4,2"}).instances[0].env["OMP_NUM_THREADS"] == "4,2"  # OpenMP's nested form
    for junk in ("abc", "0", "", "2,x"):
        with pytest.raises(CpuoptError, match=f"MKL_NUM_THREADS='{junk}' in your environment is not a thread count"):
            plan(env={"MKL_NUM_THREADS": junk})


def test_run_json_module_fixes_threads_and_cores_and_keeps_the_users_value(monkeypatch, caplog):
    from cpuopt_helpers.runtimes import run_json_module

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


# --- placement that respects sockets and NUMA nodes ---

def sockets_of(inst):
    return {0 if c % 56 < 28 else 1 for c in inst.cores}  # the 2x28 fixture: siblings are CPU + 56


@pytest.mark.parametrize("instances,threads", [(2, 28), (3, 14), (4, 14), (5, 9), (8, 7), (6, 9), (7, 7)])
def test_default_threads_keep_every_instance_inside_one_socket(instances, threads):
    p = plan(RunConfig(instances=instances))
    assert [len(i.cores) for i in p.instances] == [threads] * instances
    assert all(len(sockets_of(i)) == 1 for i in p.instances)
    assert all(i.argv[2] == f"--membind={sockets_of(i).pop()}" for i in p.instances)  # memory on the rank's node
    assert len({c for i in p.instances for c in i.cores}) == instances * threads


def test_a_layout_that_would_straddle_is_refused_unless_asked():
    with pytest.raises(CpuoptError, match="3 instances x 18 threads do not fit.*28, 28 physical cores.*use 14 threads "
                                          "per instance or fewer.*--affinity scatter, or --cores"):
        plan(RunConfig(instances=3, threads=18))
    asked = plan(RunConfig(instances=3, threads=18, affinity="scatter"))
    assert all(len(sockets_of(i)) == 2 for i in asked.instances)
    own = plan(RunConfig(instances=1, threads=4, cores=((26, 27, 28, 29),)))  # the user's cores, as given
    assert own.instances[0].cores == (26, 27, 28, 29) and own.instances[0].argv[2] == "--localalloc"


def test_sub_numa_clustering_nodes_and_sockets():
    snc = dict(fixture="lscpu_p_xeon_2s_snc2.txt")  # 2 sockets x 2 nodes x 20 cores
    p = plan(RunConfig(instances=4), **snc)
    assert [i.argv[2] for i in p.instances] == ["--membind=0", "--membind=1", "--membind=2", "--membind=3"]
    p = plan(RunConfig(instances=2, threads=40), **snc)  # a rank of a socket: its two nodes, never 3
    assert [set(i.cores) for i in p.instances] == [set(range(40)), set(range(40, 80))]
    assert [i.argv[2] for i in p.instances] == ["--localalloc", "--localalloc"]
    (inst,) = plan(RunConfig(threads=30), **snc).instances
    assert set(inst.cores) == set(range(30))  # node 0 and half of node 1, both on socket 0
    with pytest.raises(CpuoptError, match="3 instances x 25 threads do not fit.*use 20 threads per instance"):
        plan(RunConfig(instances=3, threads=25), **snc)  # a third rank larger than a node would straddle sockets


def test_threads_default_to_the_cpus_a_quota_leaves():
    m = planning.Machine(system.restrict(system.parse_lscpu_parse((FIX / "machines/container_quota_v2/lscpu_p.txt")
                                                                .read_text()), quota=2.5), dict(LIBS), True, True)
    (inst,) = planning.build_plan(RunConfig(), m, base_env={}, python="/py").instances
    assert inst.env["OMP_NUM_THREADS"] == "2" and inst.cores == (0, 1)
    with pytest.raises(CpuoptError, match="more than the 2 logical cores"):
        planning.build_plan(RunConfig(threads=4), m, base_env={}, python="/py")


def test_refused_numactl_falls_back_to_taskset_and_says_memory_is_not_bound():
    m = planning.Machine(machine().topology, dict(LIBS), False, True,
                       numactl_refused="memory binding refused: set_mempolicy: Operation not permitted")
    p = planning.build_plan(RunConfig(instances=2), m, base_env={}, python="/py")
    assert p.pinning == "taskset" and p.instances[1].argv[:3] == ("taskset", "-c", ",".join(map(str, range(28, 56))))
    (warning,) = p.warnings
    assert "set_mempolicy: Operation not permitted" in warning and "memory is not" in warning
    assert not plan(RunConfig(instances=2), numactl=False).warnings  # numactl absent: taskset, nothing refused


def test_numactl_binds_memory_to_the_ranks_node():
    from cpuopt_helpers import rank_exec

    assert rank_exec.numactl_argv([28, 29], [1]) == ["numactl", "--physcpubind=28,29", "--membind=1"]
    assert rank_exec.numactl_argv([0, 28], ["0", "1"])[2] == "--localalloc"


def test_torchrun_ranks_each_get_a_node(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    p = planning.build_torchrun_plan(RunConfig(), machine(fixture="lscpu_p_xeon_2s_snc2.txt"), ["python", str(script)],
                                   4, base_env={}, python="/py")
    env = p.instances[0].env
    assert env["CPUOPT_RANK_NODES"] == "0;1;2;3" and env["OMP_NUM_THREADS"] == "20"


def test_a_machine_from_its_saved_doctor_json(tmp_path):
    facts = {"topology": machine().topology.to_dict(), "allocators": {"jemalloc": "/srv/lib/libjemalloc.so.2",
                                                                     "tcmalloc": None},
             "openmp": {"intel": None}, "numactl": {"present": True, "works": False, "reason": "binding refused: x"}}
    path = tmp_path / "server.json"
    path.write_text(json.dumps(facts))
    m = planning.Machine.from_file(str(path))
    assert m.topology.physical_cores == 56 and m.source == str(path) and m.numactl_refused == "binding refused: x"
    p = planning.build_plan(RunConfig(instances=2, allocator="jemalloc"), m, base_env={}, python="/py")
    assert p.pinning == "taskset" and p.instances[0].env["LD_PRELOAD"] == "/srv/lib/libjemalloc.so.2"


class Exiting:
    """A stand-in for a worker process: running until its ``exits_after``-th poll, then exited with ``code``."""

    def __init__(self, code: int, exits_after: int):
        self.code, self.left, self.returncode = code, exits_after, None

    def poll(self):
        self.left -= 1
        if self.left <= 0:
            self.returncode = self.code
        return self.returncode


def test_the_rank_that_failed_first_is_named_even_when_its_peer_exits_before_it(tmp_path):
    """Rank 1 crashed (its note is the earlier) and is still exiting when rank 0, failing because
    its peer is gone, has exited: the launcher waits for rank 1 and names it."""
    from cpuopt_helpers import launch

    config = RunConfig(instances=2, threads=1, mode="ddp")
    lp = planning.build_plan(config, machine("lscpu_p_epyc_2core.txt"))
    (tmp_path / f"{lp.instances[1].index}.failed").write_text("100.0")
    (tmp_path / f"{lp.instances[0].index}.failed").write_text("100.5")
    rank0, rank1 = Exiting(1, exits_after=1), Exiting(1, exits_after=5)
    watch = launch.Watch([rank0, rank1], str(tmp_path), lp)
    errs = [tmp_path / "0.err", tmp_path / "1.err"]
    for i, err in enumerate(errs):
        err.write_text(f"rank {i}'s traceback\n")
    status, reason = watch.outcome(*watch.wait(60), [None, None], [str(e) for e in errs])
    assert rank1.returncode == 1  # waited for, within launch.FAILED_GRACE_S
    assert status == "failed" and reason == "instance 1 exited with code 1; stderr tail of instance 1:\nrank 1's traceback"
    alone = launch.Watch([Exiting(1, exits_after=1), Exiting(0, exits_after=10**6)], str(tmp_path / "none"), lp)
    assert alone.wait(60) == ("failed", "instance 0 exited with code 1")  # no notes: the first exit, at once


def test_a_failed_runs_reason_reads_in_one_line_ending_with_its_exception():
    """`cpuopt compare`'s "failed run:" line: the first line, then the exception the stderr tail ends with."""
    from cpuopt_helpers.launch import BAD_INPUT, reason_line

    tail = "Traceback (most recent call last):\n  File \"x.py\", line 1\nModuleNotFoundError: No module named 'torch'\n"
    assert reason_line(f"instance 0 exited with code 1; stderr tail of instance 0:\n{tail}") == \
        "instance 0 exited with code 1; stderr tail of instance 0: | ModuleNotFoundError: No module named 'torch'"
    assert reason_line(f"{BAD_INPUT}no such option (instance 0); stderr tail of instance 0:\n{tail}") == \
        "no such option (instance 0)"
    assert reason_line("15 s timeout") == "15 s timeout" and reason_line(None) == ""
