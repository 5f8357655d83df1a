"""Machine facts: topology, ISA flags, allocator and OpenMP libraries, versions.

Parsers take text (``lscpu -p`` output, ``/proc/cpuinfo``, ``ldconfig -p``) so that
tests feed fixtures of other machines; ``collect_facts`` is the one function that reads
this machine.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx_ne_convert")

# Library kinds -> file-name patterns; versioned names (libjemalloc.so.2) count too.
LIBRARY_PATTERNS = {
    "jemalloc": (r"libjemalloc\.so(\.\d+)*$",),
    "tcmalloc": (r"libtcmalloc\.so(\.\d+)*$", r"libtcmalloc_minimal\.so(\.\d+)*$"),
    "iomp": (r"libiomp5\.so$",),
}

INSTALL_HINTS = {
    "jemalloc": "apt-get install libjemalloc2   (conda: conda install -c conda-forge jemalloc)",
    "tcmalloc": "apt-get install libtcmalloc-minimal4   (conda: conda install -c conda-forge gperftools)",
    "iomp": "pip install intel-openmp",
    "numactl": "apt-get install numactl   (conda: conda install -c conda-forge numactl)",
}


@dataclass(frozen=True)
class Cpu:
    """One logical CPU: its id, physical core, socket and NUMA node."""

    cpu: int
    core: int
    socket: int
    node: int


def parse_lscpu_parse(text: str) -> list[Cpu]:
    """Parse ``lscpu -p=CPU,CORE,SOCKET,NODE`` output (comment lines start with '#')."""
    cpus = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(",")
        values = [int(f) if f.strip().isdigit() else 0 for f in fields[:4]]
        values += [0] * (4 - len(values))
        cpus.append(Cpu(*values))
    return sorted(cpus, key=lambda c: c.cpu)


@dataclass(frozen=True)
class Topology:
    """Logical CPUs grouped into physical cores, sockets and NUMA nodes."""

    cpus: tuple[Cpu, ...]

    @property
    def logical_cores(self) -> int:
        return len(self.cpus)

    @property
    def physical_cores(self) -> int:
        return len({(c.socket, c.core) for c in self.cpus})

    @property
    def sockets(self) -> int:
        return len({c.socket for c in self.cpus})

    @property
    def numa_nodes(self) -> dict[int, list[int]]:
        nodes: dict[int, list[int]] = {}
        for c in self.cpus:
            nodes.setdefault(c.node, []).append(c.cpu)
        return nodes

    def core_order(self) -> list[int]:
        """Logical CPU ids, first one per physical core (by socket), then SMT siblings.

        Handing out consecutive chunks of this list gives one thread per physical core
        and keeps an instance inside a socket whenever the counts allow.
        """
        seen: set[tuple[int, int]] = set()
        first, siblings = [], []
        for c in sorted(self.cpus, key=lambda c: (c.socket, c.core, c.cpu)):
            key = (c.socket, c.core)
            (siblings if key in seen else first).append(c.cpu)
            seen.add(key)
        return first + siblings

    def node_of(self, cpu: int) -> int:
        return next(c.node for c in self.cpus if c.cpu == cpu)


def parse_isa_flags(cpuinfo: str) -> dict[str, bool]:
    """ISA flags that matter for training, from /proc/cpuinfo or lscpu's Flags line."""
    match = re.search(r"^(?:flags|Flags|Features)\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    present = set(match.group(1).split()) if match else set()
    flags = {flag: flag in present for flag in ISA_FLAGS}
    # ARM: asimd (NEON), sve and bf16 are the counterparts worth knowing.
    for arm_flag in ("asimd", "sve", "bf16"):
        if arm_flag in present:
            flags[arm_flag] = True
    return flags


def parse_cpu_model(cpuinfo: str) -> str:
    match = re.search(r"^(?:model name|Model name|CPU part)\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    return match.group(1).strip() if match else platform.processor() or "unknown"


def parse_meminfo_gib(meminfo: str) -> float:
    match = re.search(r"^MemTotal:\s+(\d+)\s+kB", meminfo, re.MULTILINE)
    return round(int(match.group(1)) / 2**20, 1) if match else 0.0


def parse_ldconfig(text: str) -> list[str]:
    """Library paths listed by ``ldconfig -p`` ("libfoo.so.1 (libc6,x86-64) => /path")."""
    return [line.split("=>", 1)[1].strip() for line in text.splitlines() if "=>" in line]


def find_libraries(kind: str, search_dirs: list[str], ldconfig_paths: list[str] = ()) -> list[str]:
    """Every file of a library kind in the search dirs and ldconfig's cache, best first.

    Unversioned names come first (what the launchers look for), then versioned ones such
    as Debian's ``libjemalloc.so.2``, which PyTorch's launcher does not find.
    """
    patterns = [re.compile(p) for p in LIBRARY_PATTERNS[kind]]
    found: list[str] = []
    candidates = []
    for directory in search_dirs:
        if os.path.isdir(directory):
            candidates += sorted(glob.glob(os.path.join(directory, "lib*.so*")))
    candidates += list(ldconfig_paths)
    for path in candidates:
        name = os.path.basename(path)
        if any(p.match(name) for p in patterns) and os.path.exists(path):
            real = os.path.realpath(path)
            if real not in {os.path.realpath(f) for f in found}:
                found.append(path)
    return sorted(found, key=lambda p: (p.count(".so.") > 0, len(os.path.basename(p))))


def library_search_dirs() -> list[str]:
    """Where allocators and OpenMP runtimes live: the venv, conda, the system."""
    dirs = [os.path.join(sys.prefix, "lib")]
    if os.environ.get("CONDA_PREFIX"):
        dirs.append(os.path.join(os.environ["CONDA_PREFIX"], "lib"))
    dirs += [os.path.expanduser("~/.local/lib"), "/usr/local/lib", "/usr/lib64", "/usr/lib"]
    dirs += glob.glob("/usr/lib/*-linux-gnu")
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def _run(argv: list[str], timeout: float = 10) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


@functools.lru_cache(maxsize=1)
def ldconfig_paths() -> tuple[str, ...]:
    for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        proc = _run([exe, "-p"])
        if proc is not None and proc.returncode == 0:
            return tuple(parse_ldconfig(proc.stdout))
    return ()


@functools.lru_cache(maxsize=None)
def locate_library(kind: str) -> str | None:
    """The library of this kind to preload on this machine, or None."""
    found = find_libraries(kind, library_search_dirs(), list(ldconfig_paths()))
    return found[0] if found else None


@functools.lru_cache(maxsize=1)
def numactl_status() -> dict:
    """Whether numactl is installed and actually allowed to bind here (a trial call)."""
    exe = shutil.which("numactl")
    if exe is None:
        return {"present": False, "works": False, "path": None, "reason": "numactl not installed"}
    cpu = sorted(os.sched_getaffinity(0))[0]
    proc = _run([exe, f"--physcpubind={cpu}", "--localalloc", "true"])
    works = proc is not None and proc.returncode == 0
    reason = "" if works else (proc.stderr.strip().splitlines() or ["trial call failed"])[-1] if proc else "trial call failed"
    return {"present": True, "works": works, "path": exe, "reason": reason}


@functools.lru_cache(maxsize=1)
def topology() -> Topology:
    """This machine's topology from lscpu, restricted to the CPUs this process may use."""
    proc = _run(["lscpu", "-p=CPU,CORE,SOCKET,NODE"])
    allowed = os.sched_getaffinity(0)
    if proc is not None and proc.returncode == 0:
        cpus = [c for c in parse_lscpu_parse(proc.stdout) if c.cpu in allowed]
    else:
        cpus = [Cpu(i, i, 0, 0) for i in sorted(allowed)]
    return Topology(tuple(cpus))


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def loaded_openmp(maps: str) -> str:
    """Which OpenMP runtime a process has loaded, from its /proc/PID/maps text."""
    if "libiomp5" in maps:
        return "intel"
    if "libgomp" in maps:
        return "gnu"
    return "unknown" if maps else "unknown (no /proc/self/maps)"


def torch_facts() -> dict:
    """torch, oneDNN and MKL versions, the OpenMP runtime and oneDNN's bf16 view."""
    import torch

    info = torch.__config__.show()
    onednn = re.search(r"MKL-DNN v([\d.]+)", info)
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", info)
    parallel = torch.__config__.parallel_info()
    backend = re.search(r"ATen parallel backend: (\S+)", parallel)
    try:
        bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        bf16 = False
    return {
        "torch": torch.__version__,
        "onednn": onednn.group(1) if onednn else None,
        "mkl": mkl.group(1) if mkl else None,
        "parallel_backend": backend.group(1) if backend else None,
        "openmp_runtime": loaded_openmp(_read("/proc/self/maps")),
        "onednn_bf16_supported": bf16,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


# A convolution large enough for PyTorch to hand to oneDNN (small ones take another path).
ONEDNN_ISA_PROBE = "import torch; torch.nn.functional.conv2d(torch.randn(4, 16, 32, 32), torch.randn(16, 16, 3, 3))"


def onednn_isa_cache_key() -> str:
    """What decides oneDNN's dispatch: this Python and torch, the CPU, the ISA caps in the environment."""
    import torch

    cpuinfo = _read("/proc/cpuinfo")
    parts = [sys.executable, torch.__version__, str(Path(torch.__file__).parent), parse_cpu_model(cpuinfo),
             " ".join(sorted(set(re.findall(r"^flags\s*:\s*(.*)$", cpuinfo, re.M)))),
             os.environ.get("ONEDNN_MAX_CPU_ISA", ""), os.environ.get("DNNL_MAX_CPU_ISA", "")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def onednn_isa_cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cpuopt" / "onednn_isa.json"


@functools.lru_cache(maxsize=1)
def onednn_isa() -> str | None:
    """The ISA oneDNN dispatches to, from the header of its verbose log (a tiny probe process).

    The answer is cached per Python, torch, CPU and ISA caps (the probe starts torch: ~3 s
    of every CLI call and notebook otherwise); a failed probe is not cached.
    """
    key, path = onednn_isa_cache_key(), onednn_isa_cache_file()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if isinstance(cached, dict) and isinstance(cached.get(key), str):
        return cached[key]
    try:
        proc = subprocess.run([sys.executable, "-c", ONEDNN_ISA_PROBE], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, ONEDNN_VERBOSE="1"))
    except (OSError, subprocess.TimeoutExpired):
        proc = None
    match = re.search(r"isa:([^\n]+)", proc.stdout) if proc is not None else None
    if not match:
        return None
    isa = match.group(1).strip()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({**(cached if isinstance(cached, dict) else {}), key: isa}))
        os.replace(tmp, path)
    except OSError:
        pass
    return isa


def bf16_gate(isa: dict, onednn_bf16_supported: bool, onednn_isa_line: str | None) -> dict:
    """Whether this CPU has a bf16 fast path for training, which one, and why (or why not).

    A fast path needs native bf16 arithmetic in the ISA (AMX tiles, or AVX512-BF16 dot
    products) and oneDNN willing to use it. oneDNN also "supports" bf16 on plain AVX-512 by
    emulation, and AVX-NE-CONVERT only converts: neither makes bf16 faster than fp32.
    """
    onednn_says = f"oneDNN reports bf16 support: {'yes' if onednn_bf16_supported else 'no'}"
    if onednn_isa_line:
        onednn_says += f"; oneDNN dispatches to: {onednn_isa_line}"
    if isa.get("amx_bf16") and isa.get("amx_tile"):
        path, why = "amx", "AMX tiles with bf16 (amx_bf16, amx_tile)"
    elif isa.get("avx512_bf16"):
        path, why = "avx512_bf16", "AVX512-BF16 dot-product instructions (avx512_bf16)"
    else:
        path = None
        why = ("only bf16 conversions (avx_ne_convert), no bf16 arithmetic" if isa.get("avx_ne_convert")
               else "no AVX512-BF16, AMX or AVX-NE-CONVERT")
    if path and onednn_bf16_supported:
        return {"accelerated": True, "path": path, "reason": f"{why}; {onednn_says}"}
    if path:
        return {"accelerated": False, "path": None, "reason": f"the CPU has {why} but {onednn_says}"}
    return {"accelerated": False, "path": None,
            "reason": f"{why}: bf16 runs on emulated or reference kernels, slower than fp32; {onednn_says}"}


def fingerprint(facts: dict) -> str:
    """A short id of the machine and software a result was measured on."""
    key = {k: facts.get(k) for k in ("hostname", "cpu_model", "physical_cores", "logical_cores", "memory_gib")}
    key["torch"] = facts.get("versions", {}).get("torch")
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def collect_facts() -> dict:
    """Everything `cpuopt doctor` reports about this machine, as plain JSON-able data."""
    topo = topology()
    cpuinfo = _read("/proc/cpuinfo")
    versions = {"python": platform.python_version(), **torch_facts()}
    allocators = {k: locate_library(k) for k in ("jemalloc", "tcmalloc")}
    openmp = {"gnu": "bundled with torch (libgomp)", "intel": locate_library("iomp")}
    numactl = numactl_status()
    missing = {k: INSTALL_HINTS[k] for k, v in allocators.items() if v is None}
    if openmp["intel"] is None:
        missing["iomp"] = INSTALL_HINTS["iomp"]
    if not numactl["present"]:
        missing["numactl"] = INSTALL_HINTS["numactl"]
    facts = {
        "hostname": platform.node(),
        "cpu_model": parse_cpu_model(cpuinfo),
        "physical_cores": topo.physical_cores,
        "logical_cores": topo.logical_cores,
        "sockets": topo.sockets,
        "numa_nodes": {str(k): v for k, v in topo.numa_nodes.items()},
        "isa": parse_isa_flags(cpuinfo),
        "memory_gib": parse_meminfo_gib(_read("/proc/meminfo")),
        "allocators": allocators,
        "openmp": openmp,
        "numactl": numactl,
        "versions": versions,
        "missing": missing,
    }
    facts["bf16"] = bf16_gate(facts["isa"], versions["onednn_bf16_supported"], onednn_isa())
    facts["fingerprint"] = fingerprint(facts)
    return facts


def format_facts(facts: dict) -> str:
    """The human-readable doctor report."""
    isa = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in facts["isa"].items())
    v = facts["versions"]
    lines = [
        f"CPU          {facts['cpu_model']}",
        f"cores        {facts['physical_cores']} physical, {facts['logical_cores']} logical, "
        f"{facts['sockets']} socket(s), NUMA nodes {facts['numa_nodes']}",
        f"ISA          {isa}",
        f"memory       {facts['memory_gib']} GiB",
        f"software     python {v['python']}, torch {v['torch']}, oneDNN {v['onednn']}, MKL {v['mkl']}, "
        f"OpenMP {v['openmp_runtime']}, capability {v['cpu_capability']}",
        f"bf16         {'accelerated (' + facts['bf16']['path'] + ')' if facts['bf16']['accelerated'] else 'not accelerated'}:"
        f" {facts['bf16']['reason']}",
    ]
    for kind, path in facts["allocators"].items():
        lines.append(f"{kind:<12} {path or 'not found'}")
    lines.append(f"{'intel omp':<12} {facts['openmp']['intel'] or 'not found'}")
    n = facts["numactl"]
    lines.append(f"{'numactl':<12} {'works' if n['works'] else ('present but refused: ' + n['reason'] if n['present'] else 'not found')}")
    ipex = facts.get("ipex_runtime")
    if ipex:
        if ipex["available"]:
            isa = ipex.get("ipex_isa") or {}
            lines.append(f"{'ipex':<12} {ipex['path']}: torch {ipex['torch']}, IPEX {ipex['ipex']}, "
                         f"ISA {isa.get('current', '?')} (highest {isa.get('highest', '?')})")
        else:
            lines.append(f"{'ipex':<12} not available: {ipex['reason']}")
    if facts["missing"]:
        lines.append("missing      install with:")
        lines += [f"  {kind:<10} {hint}" for kind, hint in facts["missing"].items()]
    else:
        lines.append("missing      nothing")
    return "\n".join(lines)
