"""Topology, ISA and library discovery, fed with fixtures of other machines."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cpuopt_helpers import system

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
    assert facts["logical_cores"] == len(os.sched_getaffinity(0))
    assert 1 <= facts["physical_cores"] <= facts["logical_cores"]
    cpuinfo = Path("/proc/cpuinfo").read_text()
    assert facts["isa"]["avx2"] == (" avx2 " in cpuinfo)
    assert facts["isa"]["avx512f"] == (" avx512f " in cpuinfo)
    assert facts["versions"]["torch"].startswith("2.13.0")
    assert facts["versions"]["onednn"]
    # every missing piece comes with the command that installs it
    for kind, path in facts["allocators"].items():
        assert (path is None) == (kind in facts["missing"])
        assert path is None or os.path.exists(path)


def test_doctor_text_lists_install_commands_for_missing():
    facts = {"cpu_model": "X", "physical_cores": 2, "logical_cores": 2, "sockets": 1, "numa_nodes": {"0": [0, 1]},
             "isa": {"avx2": True}, "memory_gib": 1.0,
             "versions": {"python": "3.11", "torch": "2.13", "onednn": "3.12", "mkl": None,
                          "openmp_runtime": "gnu", "cpu_capability": "AVX2", "onednn_bf16_supported": False},
             "allocators": {"jemalloc": None, "tcmalloc": "/x/libtcmalloc.so.4"}, "openmp": {"intel": None},
             "numactl": {"present": False, "works": False, "reason": "numactl not installed"},
             "missing": {"jemalloc": system.INSTALL_HINTS["jemalloc"], "numactl": system.INSTALL_HINTS["numactl"]},
             "bf16": system.bf16_gate({"avx2": True}, False, None)}
    text = system.format_facts(facts)
    assert "apt-get install libjemalloc2" in text and "apt-get install numactl" in text
    assert "jemalloc     not found" in text
    assert "bf16         not accelerated: no AVX512-BF16, AMX or AVX-NE-CONVERT" in text


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
