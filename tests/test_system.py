"""Topology, ISA and library discovery, fed with fixtures of other machines."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cpuopt_helpers import system
from cpuopt_helpers.errors import CpuoptError

FIX = Path(__file__).parent / "fixtures"


def topo(name):
    return system.Topology(tuple(system.parse_lscpu_parse((FIX / name).read_text())))


def test_two_socket_xeon_with_smt():
    t = topo("lscpu_p_xeon_2s_smt.txt")
    assert (t.logical_cores, t.physical_cores, t.sockets) == (112, 56, 2)
    assert sorted(t.numa_nodes) == [0, 1]
    assert t.numa_nodes[0][:3] == [0, 1, 2] and 56 in t.numa_nodes[0]
    order = t.core_order()
    # one thread per physical core first, socket 0 before socket 1, then the SMT siblings
    assert order[:28] == list(range(28)) and order[28:56] == list(range(28, 56))
    assert order[56:] == list(range(56, 112))
    assert t.node_of(57) == 0 and t.node_of(30) == 1


def test_arm_box_without_smt():
    t = topo("lscpu_p_graviton3.txt")
    assert (t.logical_cores, t.physical_cores, t.sockets, list(t.numa_nodes)) == (64, 64, 1, [0])
    flags = system.parse_isa_flags((FIX / "cpuinfo_graviton3.txt").read_text())
    assert not flags["avx2"] and not flags["avx512f"]
    assert flags["sve"] and flags["asimd"] and flags["bf16"]


@pytest.mark.parametrize("fixture,expected", [
    ("cpuinfo_cooperlake.txt", {"avx2": True, "avx512f": True, "avx512_bf16": True, "amx_bf16": False}),
    ("cpuinfo_sapphire_rapids.txt", {"avx512_bf16": True, "amx_bf16": True, "amx_tile": True}),
    ("cpuinfo_epyc_avx2.txt", {"avx2": True, "fma": True, "avx512f": False, "avx512_bf16": False}),
])
def test_isa_flags(fixture, expected):
    flags = system.parse_isa_flags((FIX / fixture).read_text())
    assert set(system.ISA_FLAGS) <= set(flags)
    assert {k: flags[k] for k in expected} == expected


def test_cpu_model_and_memory():
    assert "8380H" in system.parse_cpu_model((FIX / "cpuinfo_cooperlake.txt").read_text())
    assert system.parse_meminfo_gib("MemTotal:       24576000 kB\n") == pytest.approx(23.4, abs=0.1)


def _touch(path: Path, target: str | None = None):
    path.parent.mkdir(parents=True, exist_ok=True)
    if target:
        path.symlink_to(target)
    else:
        path.write_bytes(b"\x7fELF")


def test_find_versioned_libraries_in_fake_dirs(tmp_path):
    deb = tmp_path / "usr/lib/x86_64-linux-gnu"
    venv = tmp_path / "venv/lib"
    _touch(deb / "libjemalloc.so.2")
    _touch(deb / "libtcmalloc_minimal.so.4.5.10")
    _touch(deb / "libtcmalloc_minimal.so.4", "libtcmalloc_minimal.so.4.5.10")
    _touch(deb / "libjemalloc_extra.so")  # not a match
    _touch(venv / "libiomp5.so")
    dirs = [str(venv), str(deb), str(tmp_path / "missing")]
    assert system.find_libraries("jemalloc", dirs) == [str(deb / "libjemalloc.so.2")]
    tc = system.find_libraries("tcmalloc", dirs)
    assert len(tc) == 1 and Path(tc[0]).resolve() == (deb / "libtcmalloc_minimal.so.4.5.10").resolve()
    assert system.find_libraries("iomp", dirs) == [str(venv / "libiomp5.so")]
    _touch(venv / "libjemalloc.so")  # an unversioned name is preferred, as the launchers expect
    assert system.find_libraries("jemalloc", dirs)[0] == str(venv / "libjemalloc.so")


def test_find_libraries_from_ldconfig_cache(tmp_path):
    paths = system.parse_ldconfig((FIX / "ldconfig_p.txt").read_text())
    assert "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2" in paths and len(paths) == 3
    lib = tmp_path / "libjemalloc.so.2"
    _touch(lib)
    assert system.find_libraries("jemalloc", [], [str(lib), "/nonexistent/libjemalloc.so.9"]) == [str(lib)]
    assert system.find_libraries("tcmalloc", [], [str(lib)]) == []


@pytest.mark.slow  # the command, which probes oneDNN's ISA and the IPEX runtime in interpreters of their own
def test_doctor_json_reports_this_machine():
    proc = subprocess.run([sys.executable, "-m", "cpuopt_helpers", "doctor", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    for key in ("physical_cores", "logical_cores", "sockets", "numa_nodes", "isa", "allocators", "openmp",
                "numactl", "versions", "missing"):
        assert key in facts
    facts = system.Facts.from_dict(facts)
    assert facts.logical_cores == len(os.sched_getaffinity(0))
    assert 1 <= facts.physical_cores <= facts.logical_cores
    cpuinfo = Path("/proc/cpuinfo").read_text()
    assert facts.isa["avx2"] == (" avx2 " in cpuinfo)
    assert facts.isa["avx512f"] == (" avx512f " in cpuinfo)
    assert facts.versions["torch"].startswith("2.13.0")
    assert facts.versions["onednn"]
    # every missing piece comes with the command that installs it
    for kind, path in facts.allocators.items():
        assert (path is None) == (kind in facts.missing)
        assert path is None or os.path.exists(path)


def test_doctor_text_lists_install_commands_for_missing():
    facts = system.Facts.from_dict({
             "cpu_model": "X", "physical_cores": 2, "logical_cores": 2, "sockets": 1, "numa_nodes": {"0": [0, 1]},
             "isa": {"avx2": True}, "memory_gib": 1.0,
             "versions": {"python": "3.11", "torch": "2.13", "onednn": "3.12", "mkl": None,
                          "openmp_runtime": "gnu", "cpu_capability": "AVX2", "onednn_bf16_supported": False},
             "allocators": {"jemalloc": None, "tcmalloc": "/x/libtcmalloc.so.4"}, "openmp": {"intel": None},
             "numactl": {"present": False, "works": False, "reason": "numactl not installed"},
             "missing": {"jemalloc": system.INSTALL_HINTS["jemalloc"], "numactl": system.INSTALL_HINTS["numactl"]},
             "bf16": system.bf16_gate({"avx2": True}, False, None)})
    text = system.format_facts(facts)
    assert "apt-get install libjemalloc2" in text and "apt-get install numactl" in text
    assert "jemalloc     not found" in text
    assert "bf16         not accelerated: no AVX512-BF16, AMX or AVX-NE-CONVERT" in text
    container = kernel_view("container_quota_v2", affinity=set(range(8)))
    text = system.format_facts(facts.replace(topology={"notes": system.topology_notes(container)}))
    assert "quota        cgroup CPU quota 2.5 CPUs\n             -> more than 2 busy thread(s) get throttled" in text


def test_loaded_openmp_runtime_from_maps():
    gomp = "7f00-7f01 r-xp 0 08:01 1 /venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1\n"
    iomp = "7f00-7f01 r-xp 0 08:01 1 /venv/lib/libiomp5.so\n"
    assert system.loaded_openmp(gomp) == "gnu"
    assert system.loaded_openmp(gomp + iomp) == "intel"  # preloaded iomp takes over the symbols
    assert system.loaded_openmp("").startswith("unknown")


def test_onednn_isa_probe_is_cached_per_cpu_torch_and_isa_cap(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    probes = []

    def fake_run(cmd, **kw):
        probes.append(kw["env"].get("ONEDNN_MAX_CPU_ISA"))
        isa = "Intel AVX2" if kw["env"].get("ONEDNN_MAX_CPU_ISA") else "Intel AVX-512"
        return subprocess.CompletedProcess(cmd, 0, f"onednn_verbose,v1,info,cpu,isa:{isa}\n", "")

    monkeypatch.setattr(system.subprocess, "run", fake_run)
    system.onednn_isa.cache_clear()
    assert system.onednn_isa() == "Intel AVX-512" and len(probes) == 1
    system.onednn_isa.cache_clear()  # as a new process would: read from the file, no probe
    assert system.onednn_isa() == "Intel AVX-512" and len(probes) == 1
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # a cap changes the dispatch: probed anew
    system.onednn_isa.cache_clear()
    assert system.onednn_isa() == "Intel AVX2" and probes == [None, "AVX2"]
    assert len(json.loads(system.onednn_isa_cache_file().read_text())) == 2
    monkeypatch.setattr(system.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "boom"))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41")
    system.onednn_isa.cache_clear()
    assert system.onednn_isa() is None  # a failed probe is said as unknown and not cached
    assert len(json.loads(system.onednn_isa_cache_file().read_text())) == 2
    system.onednn_isa.cache_clear()


# --- the CPUs a process may use: lscpu, affinity, cgroup cpuset and quota, SMT, hybrid cores ---

MACHINES = FIX / "machines"


def kernel_view(name, affinity=None):
    """The topology a process would see on a fixture machine: its lscpu text and kernel files."""
    root = MACHINES / name
    cpus = system.parse_lscpu_parse((root / "lscpu_p.txt").read_text())
    limits = system.read_cgroup_limits(str(root))
    return system.restrict(cpus, affinity, limits["cpuset"], limits["quota"], system.read_core_kinds(str(root)))


def notes(t):
    return {n["fact"]: n for n in system.topology_notes(t)}


def test_plain_lscpu_p_names_its_columns_in_the_header():
    t = topo("lscpu_p_xeon_2s_snc2.txt")  # `lscpu -p`: CPU,Core,Socket,Node,,L1d,L1i,L2,L3
    assert (t.logical_cores, t.physical_cores, t.sockets, t.smt) == (160, 80, 2, 2)
    assert sorted(t.numa_nodes) == [0, 1, 2, 3] and t.numa_nodes[1][:2] == [20, 21] and 100 in t.numa_nodes[1]
    assert list(t.domains()) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    reordered = "# CPU,Node,Socket,Core\n0,1,0,5\n1,1,0,5\n2,,,\n"
    assert system.parse_lscpu_parse(reordered) == [system.Cpu(0, 5, 0, 1), system.Cpu(1, 5, 0, 1),
                                                   system.Cpu(2, 2, 0, 0)]  # empty core: its own core
    with pytest.raises(CpuoptError, match="line 2 is not lscpu -p's"):
        system.parse_lscpu_parse("0,0,0,0\nCPU(s): 8\n")


def test_cpu_lists_and_quotas_as_the_kernel_writes_them():
    assert system.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11] and system.parse_cpu_list("\n") == []
    assert system.format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11" and system.format_cpu_list([]) == ""
    with pytest.raises(CpuoptError, match="cannot read CPU list '1-x'"):
        system.parse_cpu_list("1-x")
    assert system.parse_cpu_max("250000 100000\n") == 2.5 and system.parse_cpu_max("max 100000\n") is None
    assert system.parse_cfs_quota("250000\n", "100000\n") == 2.5 and system.parse_cfs_quota("-1", "100000") is None
    assert [system.quota_threads(q) for q in (2.5, 0.5, 4.0, 3.9999999999, None)] == [2, 1, 4, 4, None]


@pytest.mark.parametrize("name,version", [("container_quota_v2", 2), ("container_quota_v1", 1)])
def test_a_container_with_a_quota_of_2_5_cpus_uses_2(name, version):
    limits = system.read_cgroup_limits(str(MACHINES / name))
    assert (limits["version"], limits["quota"], limits["cpuset"]) == (version, 2.5, list(range(8)))
    t = kernel_view(name, affinity=set(range(8)))
    # 8 vCPUs (4 cores x SMT 2) allowed; the quota keeps 2 busy: one thread per physical core
    assert [c.cpu for c in t.cpus] == [0, 1] and t.physical_cores == 2 and len(t.machine) == 8
    said = notes(t)
    assert said["quota"]["value"] == "cgroup CPU quota 2.5 CPUs"
    assert "threads default to 2 (floor of the quota" in said["quota"]["threads"]
    assert "os.cpu_count() says 8" in said["cpus"]["threads"]


def test_a_cpuset_that_excludes_cpu_0():
    limits = system.read_cgroup_limits(str(MACHINES / "cpuset_without_cpu0"))
    assert limits["cpuset"] == [1, 2, 3] and limits["quota"] == 4.0  # the pod's quota, two levels up
    t = kernel_view("cpuset_without_cpu0", affinity={0, 1, 2, 3})  # usable = affinity & cpuset
    assert [c.cpu for c in t.cpus] == [1, 2, 3] and t.cpuset == (1, 2, 3)
    said = notes(t)
    assert said["cpuset"]["value"] == "cgroup cpuset 1-3, excluding CPU 0" and "131011" in said["cpuset"]["threads"]
    assert "no cap" in said["quota"]["threads"] and said["threads"]["value"] == "default 3"
    assert [c.cpu for c in kernel_view("cpuset_without_cpu0", affinity={2, 3}).cpus] == [2, 3]


def test_a_hybrid_laptop_hands_out_performance_cores_first():
    limits = system.read_cgroup_limits(str(MACHINES / "hybrid_laptop"))
    assert limits["quota"] is None and limits["cpuset"] == list(range(16))  # cpu.max "max 100000": no quota
    t = kernel_view("hybrid_laptop")
    assert (t.logical_cores, t.physical_cores, t.smt) == (16, 12, 2)
    assert {c.cpu for c in t.cpus if c.kind == "performance"} == set(range(8))
    order = t.core_order()
    # one CPU per performance core, then the efficiency cores, then the performance cores' siblings
    assert order[:4] == [0, 2, 4, 6] and order[4:12] == list(range(8, 16)) and order[12:] == [1, 3, 5, 7]
    assert notes(t)["hybrid"]["value"] == "4 performance and 8 efficiency cores"
    assert "--threads 4" in notes(t)["hybrid"]["threads"]
    assert system.parse_core_kinds("0-7\n", "") == {}  # a machine with one kind of core


def test_two_socket_xeon_notes_say_what_placement_does():
    said = notes(topo("lscpu_p_xeon_2s_smt.txt"))
    assert said["numa"]["value"].startswith("2 socket(s), 2 NUMA node(s): node 0 on socket 0: 28 cores")
    assert "up to 28 threads stays inside one node" in said["numa"]["threads"]
    assert "threads default to one per physical core (56)" in said["smt"]["threads"]
    snc = notes(topo("lscpu_p_xeon_2s_snc2.txt"))["numa"]
    assert "sub-NUMA clustering" in snc["value"] and "up to 20 threads" in snc["threads"]


def test_no_cpu_left_is_a_clear_error():
    cpus = system.parse_lscpu_parse("0,0,0,0\n1,1,0,0\n")
    with pytest.raises(CpuoptError, match="no CPU is left"):
        system.restrict(cpus, {0}, [1])


def test_this_process_sees_its_affinity_mask():
    t = system.topology()
    assert {c.cpu for c in t.cpus} <= os.sched_getaffinity(0) and t.physical_cores >= 1


@pytest.mark.skipif(not shutil.which("taskset") or 1 not in os.sched_getaffinity(0), reason="needs taskset and CPU 1")
def test_under_taskset_one_cpu_is_usable():
    code = "from cpuopt_helpers import system, planning; t = system.topology(); print([c.cpu for c in t.cpus], " \
           "planning.default_threads(t))"
    proc = subprocess.run(["taskset", "-c", "1", sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[1]", "1"]


def test_a_saved_doctor_json_plans_the_same_cpus(tmp_path):
    t = kernel_view("container_quota_v2", affinity=set(range(8)))
    path = tmp_path / "doctor.json"
    path.write_text(json.dumps({"physical_cores": t.physical_cores, "topology": t.to_dict()}))
    back, facts = system.read_topology_file(str(path))
    assert back == t and facts["physical_cores"] == 2
    back, facts = system.read_topology_file(str(FIX / "lscpu_p_xeon_2s_smt.txt"))
    assert (back.physical_cores, back.sockets, facts) == (56, 2, {})


@pytest.mark.parametrize("content,needle", [
    (None, "cannot read topology file"),
    ("", "lists no CPU"),
    ("Architecture: x86_64\nCPU(s): 8\n", "line 1 is not lscpu -p's"),
    ('{"physical_cores": 8}', "without the topology section"),
    ('{"topology": {"machine": [[0, 0]]}}', "topology section is malformed"),
    ("{not json", "is not valid JSON"),
])
def test_a_bad_topology_file_is_one_clear_line(tmp_path, content, needle):
    path = tmp_path / "server.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CpuoptError, match=needle) as err:
        system.read_topology_file(str(path))
    assert "\n" not in str(err.value) and "doctor --json" in str(err.value)


def test_the_l3_caches_come_from_lscpu_and_survive_a_saved_doctor_file():
    epyc = topo("lscpu_p_epyc_32c_4ccx.txt")
    assert [c.l3 for c in epyc.cpus[:9]] == [0] * 8 + [1] and epyc.cpus[32].l3 == 0  # a sibling shares its core's
    assert list(epyc.caches()) == [(0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3)]
    said = notes(epyc)["l3"]
    assert said["value"].startswith("4 L3 caches (core complexes) in 1 NUMA node(s): L3 0 on node 0: 8 cores")
    assert "up to 8 threads (one a core) is kept inside one L3" in said["threads"]
    assert "l3" not in notes(topo("lscpu_p_xeon_2s_snc2.txt"))  # one L3 a socket: the nodes say it all
    joined = "# CPU,Core,Socket,Node,L1d:L1i:L2:L3\n0,0,0,0,0:0:0:0\n1,1,0,0,1:1:1:1\n"  # lscpu -p=...,CACHE, newer
    assert [c.l3 for c in system.parse_lscpu_parse(joined)] == [0, 1]
    assert [c.l3 for c in system.parse_lscpu_parse("0,0,0,0\n1,1,0,0\n")] == [None, None]
    assert system.Topology.from_dict(epyc.to_dict()).caches() == epyc.caches()
    old = {"machine": [r[:5] for r in epyc.to_dict()["machine"]]}  # saved before cpuopt read the L3
    assert system.Topology.from_dict(old).caches() == {} and "l3" not in notes(system.Topology.from_dict(old))
