"""Machine facts: topology, ISA flags, allocator and OpenMP libraries, versions.

Parsers take text (``lscpu -p`` output, ``/proc/cpuinfo``, ``ldconfig -p``, cgroup files)
so that tests feed fixtures of other machines; ``topology`` and ``collect_facts`` read
this machine, and ``read_cgroup_limits`` / ``read_core_kinds`` read the kernel's files
under a root folder that tests replace with a fixture tree.

The CPUs a process uses (``topology()``), as the kernel lets it:

| fact               | read from                                                  | effect on plans         |
|--------------------|------------------------------------------------------------|-------------------------|
| CPUs, cores, nodes | ``lscpu -p=CPU,CORE,SOCKET,NODE,CACHE``                    | instances inside a node |
| L3 caches          | the same, its L3 column                                    | and inside one L3       |
| affinity mask      | ``os.sched_getaffinity(0)`` (taskset, numactl)             | only these CPUs         |
| cgroup cpuset      | v2 ``cpuset.cpus.effective``, v1 ``cpuset.effective_cpus`` | only these CPUs         |
| cgroup CPU quota   | v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``, ``cfs_period_us`` | floor(quota) CPUs, >= 1 |
| SMT siblings       | CPUs that share a (socket, core)                           | one thread a core first |
| hybrid cores       | ``/sys/devices/cpu_core/cpus``, ``.../cpu_atom/cpus``      | performance cores first |

Hybrid cores come from the kernel's own lists of Intel's core PMUs, not from lscpu's
MAXMHZ: max clocks also differ between the cores of one kind (favoured cores of Turbo
Boost Max 3.0), so a clock threshold would misread servers as hybrid.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cpuopt_helpers import peak
from cpuopt_helpers.errors import CpuoptError

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
    """One logical CPU: its id, physical core, socket and NUMA node, and on hybrid CPUs its kind."""

    cpu: int
    core: int
    socket: int
    node: int
    kind: str = ""  # "performance" or "efficiency" on hybrid CPUs, else ""
    l3: int | None = None  # the L3 cache it shares, by lscpu's id; None where lscpu does not say


LSCPU_COLUMNS = ("cpu", "core", "socket", "node", "l3")


def lscpu_columns(header: str) -> list[tuple[int, int | None] | None] | None:
    """Where each of LSCPU_COLUMNS is in lscpu -p's header line ("# CPU,Core,Socket,Node,,L1d,L1i,L2,L3";
    with -p=...,CACHE some versions join the caches: "...,Node,L1d:L1i:L2:L3"): (column, part within
    the column or None) each, None where absent; None for a comment that names no columns."""
    names = [n.strip().lower() for n in header.lstrip("#").split(",")]
    if "cpu" not in names or "core" not in names:
        return None
    found = []
    for name in LSCPU_COLUMNS:
        at = None
        for i, n in enumerate(names):
            parts = n.split(":")
            if name in parts:
                at = (i, None if len(parts) == 1 else parts.index(name))
                break
        found.append(at)
    return found


def parse_lscpu_parse(text: str) -> list[Cpu]:
    """Parse ``lscpu -p=CPU,CORE,SOCKET,NODE,CACHE`` or plain ``lscpu -p`` output.

    Comment lines start with '#'; the one that names the columns ("# CPU,Core,Socket,Node,,
    L1d,L1i,L2,L3") says where each is, else they are taken in that order (CPU, core,
    socket, node). An empty node or socket (a machine without NUMA) reads as 0, an empty
    core as the CPU itself, an absent L3 as unknown (None); a line that is not numbers is
    refused with its line number.
    """
    columns: list[tuple[int, int | None] | None] = [(0, None), (1, None), (2, None), (3, None), None]
    cpus = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line.startswith("#"):
            columns = lscpu_columns(line) or columns
            continue
        if not line:
            continue
        fields = [f.strip() for f in line.split(",")]
        values = [_lscpu_field(fields, at) for at in columns]
        if not values[0].isdecimal() or not all(v.isdecimal() for v in values if v):
            raise CpuoptError(f"line {number} is not lscpu -p's CPU,Core,Socket,Node numbers: {line[:60]!r}")
        cpu, core, socket, node, l3 = (int(v) if v else None for v in values)
        cpus.append(Cpu(cpu, cpu if core is None else core, socket or 0, node or 0, l3=l3))
    return sorted(cpus, key=lambda c: c.cpu)


def _lscpu_field(fields: list[str], at: tuple[int, int | None] | None) -> str:
    """The text at ``at`` (see ``lscpu_columns``) of one line's fields; "" where absent."""
    if at is None or at[0] >= len(fields):
        return ""
    column, part = at
    if part is None:
        return fields[column]
    parts = fields[column].split(":")
    return parts[part] if part < len(parts) else ""


def parse_cpu_list(text: str) -> list[int]:
    """The kernel's CPU list ('0-3,8,10-11', as in cpuset.cpus or cpu_core/cpus): sorted ids; empty -> []."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo and not hi:
            continue
        if not lo.isdecimal() or (hi and not hi.isdecimal()):
            raise CpuoptError(f"cannot read CPU list {text.strip()!r}; the kernel writes it like 0-3,8")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def format_cpu_list(cpus) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8' (the kernel's syntax, also what taskset -c takes)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max`` ("QUOTA PERIOD" in microseconds; "max PERIOD": no quota): the quota in CPUs."""
    parts = text.split()
    if len(parts) == 2 and parts[0].isdecimal() and parts[1].isdecimal() and int(parts[1]) > 0:
        return int(parts[0]) / int(parts[1])
    return None


def parse_cfs_quota(quota_us: str, period_us: str) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` (-1: no quota) over ``cpu.cfs_period_us``: the quota in CPUs."""
    quota, period = quota_us.strip(), period_us.strip()
    if quota.isdecimal() and period.isdecimal() and int(quota) > 0 and int(period) > 0:
        return int(quota) / int(period)
    return None


def quota_threads(quota: float | None) -> int | None:
    """Threads a CPU quota keeps busy without throttling: floor(quota), at least 1 (None: no quota)."""
    return None if quota is None else max(1, math.floor(quota + 1e-9))


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/self/cgroup ("ID:CONTROLLERS:PATH" lines): controller -> cgroup path; v2's line under ''."""
    paths = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def parse_core_kinds(core_cpus: str, atom_cpus: str) -> dict[int, str]:
    """Intel hybrid CPUs: cpu -> "performance" (cpu_core/cpus) or "efficiency" (cpu_atom/cpus); {} elsewhere."""
    if not atom_cpus.strip():
        return {}
    kinds = {c: "performance" for c in parse_cpu_list(core_cpus)}
    kinds.update({c: "efficiency" for c in parse_cpu_list(atom_cpus)})
    return kinds


@dataclass(frozen=True)
class Topology:
    """The CPUs a process uses, grouped into physical cores, sockets and NUMA nodes.

    ``cpus`` are the usable ones; ``machine`` (every CPU lscpu lists), ``affinity``,
    ``cpuset`` and ``quota`` say how they were found (see ``restrict``); None: not known
    or no limit.
    """

    cpus: tuple[Cpu, ...]
    machine: tuple[Cpu, ...] = ()
    affinity: tuple[int, ...] | None = None
    cpuset: tuple[int, ...] | None = None
    quota: float | None = None

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

    @property
    def smt(self) -> int:
        """Hardware threads per physical core (the most any core has)."""
        per_core: dict[tuple[int, int], int] = {}
        for c in self.cpus:
            per_core[(c.socket, c.core)] = per_core.get((c.socket, c.core), 0) + 1
        return max(per_core.values(), default=1)

    def core_order(self) -> list[int]:
        """Logical CPU ids, first one per physical core (by socket), then SMT siblings.

        Handing out consecutive chunks of this list gives one thread per physical core
        and keeps an instance inside a socket whenever the counts allow. On hybrid CPUs
        the performance cores come first.
        """
        seen: set[tuple[int, int]] = set()
        first, siblings = [], []
        for c in sorted(self.cpus, key=lambda c: (c.kind == "efficiency", c.socket, c.core, c.cpu)):
            key = (c.socket, c.core)
            (siblings if key in seen else first).append(c.cpu)
            seen.add(key)
        return first + siblings

    def node_of(self, cpu: int) -> int:
        return next(c.node for c in self.cpus if c.cpu == cpu)

    def domains(self) -> dict[tuple[int, int], list[int]]:
        """(socket, NUMA node) -> its CPUs in core order: the units an instance should not straddle."""
        return self._grouped(lambda c: (c.socket, c.node))

    def caches(self) -> dict[tuple[int, int, int], list[int]]:
        """(socket, NUMA node, L3) -> its CPUs in core order: the units an instance that fits in one
        is kept inside, so that its threads share a last-level cache (an L3 that spans NUMA nodes,
        as under sub-NUMA clustering, is cut at them). Empty where lscpu named no L3."""
        if any(c.l3 is None for c in self.cpus):
            return {}
        return self._grouped(lambda c: (c.socket, c.node, c.l3))

    def _grouped(self, key) -> dict:
        """key(Cpu) -> the CPUs with that key in core order, keys sorted."""
        by_cpu = {c.cpu: c for c in self.cpus}
        out: dict = {}
        for cpu in self.core_order():
            out.setdefault(key(by_cpu[cpu]), []).append(cpu)
        return dict(sorted(out.items()))

    def summary(self) -> str:
        nodes = len(self.numa_nodes)
        return (f"{self.sockets} socket(s), {nodes} NUMA node(s), {self.physical_cores} physical / "
                f"{self.logical_cores} logical CPUs usable")

    def to_dict(self) -> dict:
        """The JSON form `cpuopt doctor --json` saves, which ``from_dict`` (and --topology) reads back."""
        return {"machine": [[c.cpu, c.core, c.socket, c.node, c.kind, c.l3] for c in self.machine or self.cpus],
                "affinity": None if self.affinity is None else list(self.affinity),
                "cpuset": None if self.cpuset is None else list(self.cpuset),
                "quota": self.quota, "usable": [c.cpu for c in self.cpus]}

    @classmethod
    def from_dict(cls, d: dict) -> "Topology":
        try:
            cpus = [Cpu(int(r[0]), int(r[1]), int(r[2]), int(r[3]), str(r[4]) if len(r) > 4 else "",
                        int(r[5]) if len(r) > 5 and r[5] is not None else None)  # no L3: saved before cpuopt read it
                    for r in d["machine"]]
            return restrict(cpus, d.get("affinity"), d.get("cpuset"), d.get("quota"))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CpuoptError(f"its topology section is malformed ({type(exc).__name__}: {exc}); save it again "
                              "with `cpuopt doctor --json`") from None


def restrict(cpus: list[Cpu], affinity=None, cpuset=None, quota: float | None = None,
             kinds: dict[int, str] | None = None) -> Topology:
    """The CPUs a process uses: lscpu's CPUs inside its affinity mask and its cgroup's cpuset,
    then at most floor(quota) of them (one per physical core first, from socket 0), with
    hybrid kinds applied. Pure: tests and --topology feed other machines."""
    machine = tuple(dataclasses.replace(c, kind=(kinds or {}).get(c.cpu, c.kind)) for c in cpus)
    allowed = tuple(c for c in machine
                    if (affinity is None or c.cpu in affinity) and (cpuset is None or c.cpu in cpuset))
    if not allowed:
        raise CpuoptError(f"no CPU is left: lscpu lists {format_cpu_list(c.cpu for c in machine) or 'none'}, "
                          f"affinity {format_cpu_list(affinity or [])}, cpuset {format_cpu_list(cpuset or [])}")
    usable = Topology(allowed)
    cap = quota_threads(quota)
    if cap is not None and cap < len(allowed):
        keep = set(usable.core_order()[:cap])
        usable = Topology(tuple(c for c in allowed if c.cpu in keep))
    return Topology(usable.cpus, machine, None if affinity is None else tuple(sorted(affinity)),
                    None if cpuset is None else tuple(sorted(cpuset)), quota)


def _cgroup_dirs(mount: Path, path: str) -> list[Path]:
    """The process's cgroup folder and its parents up to the mount, innermost first (those that exist).

    In a container the mount is often the container's own cgroup while /proc/self/cgroup
    names its path on the host; walking up then finds the mount itself.
    """
    parts = [p for p in path.split("/") if p]
    dirs = [mount.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()]


def read_cgroup_limits(root: str = "/") -> dict:
    """This process's cgroup CPU quota and cpuset, read under ``root`` (tests give a fixture tree).

    Returns {"version": 2 | 1 | None, "quota": CPUs or None, "quota_file", "cpuset": [cpus]
    or None, "cpuset_file"}. A quota anywhere up the hierarchy limits the process: the
    smallest one counts. The effective cpuset already includes the parents' limits.
    """
    base = Path(root)
    paths = parse_proc_cgroup(_read(base / "proc/self/cgroup"))
    fs = base / "sys/fs/cgroup"
    out: dict = {"version": None, "quota": None, "quota_file": None, "cpuset": None, "cpuset_file": None}
    if (fs / "cgroup.controllers").is_file():
        out["version"] = 2
        dirs = _cgroup_dirs(fs, paths.get("", "/"))
        quotas = [(parse_cpu_max(_read(d / "cpu.max")), d / "cpu.max") for d in dirs]
        cpusets = [d / "cpuset.cpus.effective" for d in dirs]
    else:
        mount = next((fs / m for m in ("cpu", "cpu,cpuacct", "cpuacct,cpu") if (fs / m).is_dir()), None)
        dirs = _cgroup_dirs(mount, paths.get("cpu", "/")) if mount else []
        quotas = [(parse_cfs_quota(_read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")),
                   d / "cpu.cfs_quota_us") for d in dirs]
        cpuset_dirs = _cgroup_dirs(fs / "cpuset", paths.get("cpuset", "/")) if (fs / "cpuset").is_dir() else []
        cpusets = [d / name for d in cpuset_dirs for name in ("cpuset.effective_cpus", "cpuset.cpus")]
        out["version"] = 1 if mount or cpuset_dirs else None
    found = [(q, f) for q, f in quotas if q is not None]
    if found:
        out["quota"], quota_file = min(found, key=lambda qf: qf[0])
        out["quota_file"] = str(quota_file)
    for f in cpusets:
        try:
            listed = parse_cpu_list(_read(f))
        except CpuoptError:  # a kernel file we cannot read is no limit we know of
            continue
        if listed:
            out["cpuset"], out["cpuset_file"] = listed, str(f)
            break
    return out


def read_core_kinds(root: str = "/") -> dict[int, str]:
    """Hybrid performance/efficiency cores from the kernel's PMU lists under ``root`` ({} elsewhere)."""
    base = Path(root) / "sys/devices"
    try:
        return parse_core_kinds(_read(base / "cpu_core/cpus"), _read(base / "cpu_atom/cpus"))
    except CpuoptError:
        return {}


def read_topology_file(path: str) -> tuple[Topology, dict]:
    """Another machine's topology from its saved `cpuopt doctor --json` or its `lscpu -p` text,
    and the doctor's other facts ({} for lscpu text). A file that is neither is refused in one line."""
    what = "give a saved `cpuopt doctor --json` or `lscpu -p` output of that machine"
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise CpuoptError(f"cannot read topology file {path}: {why}; {what}") from None
    if text.lstrip().startswith(("{", "[")):
        try:
            doctor = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CpuoptError(f"topology file {path} is not valid JSON ({exc.msg}, line {exc.lineno}); "
                              f"{what}") from None
        if not isinstance(doctor, dict) or not isinstance(doctor.get("topology"), dict):
            raise CpuoptError(f"topology file {path} is JSON without the topology section of `cpuopt doctor --json` "
                              f"(an older cpuopt, or another tool); {what}")
        try:
            return Topology.from_dict(doctor["topology"]), doctor
        except CpuoptError as exc:
            raise CpuoptError(f"topology file {path}: {exc}") from None
    try:
        cpus = parse_lscpu_parse(text)
        if not cpus:
            raise CpuoptError("it lists no CPU")
        return restrict(cpus), {}
    except CpuoptError as exc:
        raise CpuoptError(f"topology file {path}: {exc}; {what}") from None


def topology_notes(topo: Topology) -> list[dict]:
    """Each fact about the CPUs this process sees, with what it means for threads:
    [{"fact": name, "value": what the kernel says, "threads": what that means}]."""
    notes = []
    machine = {c.cpu for c in topo.machine or topo.cpus}
    usable = [c.cpu for c in topo.cpus]
    physical, default = topo.physical_cores, topo.physical_cores

    def note(fact: str, value: str, threads: str) -> None:
        notes.append({"fact": fact, "value": value, "threads": threads})

    note("cpus", f"{len(usable)} usable of the machine's {len(machine)} logical CPUs: {format_cpu_list(usable)}",
         "threads and instances are placed on these only" + (
             f" (os.cpu_count() says {len(machine)}, counting CPUs this process may not use)"
             if len(usable) < len(machine) else ""))
    if topo.affinity is not None and set(topo.affinity) != machine:
        note("affinity", f"mask {format_cpu_list(topo.affinity)} (taskset, numactl or the container runtime)",
             "cpuopt plans inside it")
    if topo.cpuset is not None and set(topo.cpuset) != machine:
        zero = ", excluding CPU 0" if 0 in machine and 0 not in topo.cpuset else ""
        note("cpuset", f"cgroup cpuset {format_cpu_list(topo.cpuset)}{zero}",
             "pinning uses only these CPUs" + (" (PyTorch's run_cpu falls back to taskset when CPU 0 is excluded, "
                                               "pytorch#131011; cpuopt plans on the cpuset directly)" if zero else ""))
    if topo.quota is not None:
        cap = quota_threads(topo.quota)
        allowed = machine & set(machine if topo.affinity is None else topo.affinity) & set(
            machine if topo.cpuset is None else topo.cpuset)
        note("quota", f"cgroup CPU quota {topo.quota:g} CPUs",
             f"more than {cap} busy thread(s) get throttled: threads default to {cap} (floor of the quota, at "
             f"least 1), pinned to {cap} of the {len(allowed)} allowed CPUs" if cap < len(allowed) else
             f"the quota is no smaller than the {len(allowed)} allowed CPUs: no cap")
    notes += placement_notes(topo)
    smt = topo.smt
    note("smt", f"{smt} hardware thread(s) per core: {physical} physical, {len(usable)} logical",
         f"threads default to one per physical core ({physical}); SMT siblings are used only when a layout needs "
         "more threads than cores" if smt > 1 else "no SMT siblings: one thread per CPU")
    kinds = {c.kind for c in topo.cpus}
    if "efficiency" in kinds:
        perf = len({(c.socket, c.core) for c in topo.cpus if c.kind == "performance"})
        eff = len({(c.socket, c.core) for c in topo.cpus if c.kind == "efficiency"})
        note("hybrid", f"{perf} performance and {eff} efficiency cores",
             "OpenMP splits work evenly, so a team that mixes them waits for its efficiency cores: cores are handed "
             f"out performance first; compare --threads {perf} (performance cores only) with {physical}")
    note("threads", f"default {default}", "the physical cores among the usable CPUs, never os.cpu_count()")
    return notes


def placement_notes(topo: Topology) -> list[dict]:
    """``topology_notes``' notes on the units instances are kept inside: NUMA nodes, and L3 caches
    where a node holds several."""
    notes = []

    def note(fact: str, value: str, threads: str) -> None:  # topology_notes' form
        notes.append({"fact": fact, "value": value, "threads": threads})

    core_of = {c.cpu: (c.socket, c.core) for c in topo.cpus}
    cores = {key: len({core_of[c] for c in cpus}) for key, cpus in topo.domains().items()}
    smallest = min(cores.values())
    snc = len(topo.numa_nodes) > topo.sockets
    note("numa", f"{topo.sockets} socket(s), {len(topo.numa_nodes)} NUMA node(s)"
         + (" (sub-NUMA clustering: several nodes a socket)" if snc else "")
         + ": " + ", ".join(f"node {n} on socket {s}: {k} cores" for (s, n), k in cores.items()),
         "one node: no placement to respect" if len(cores) == 1 else
         f"an instance or rank of up to {smallest} threads stays inside one node, its memory bound there; larger "
         "ones take whole nodes of one socket, then whole sockets")
    caches = {key: len({core_of[c] for c in cpus}) for key, cpus in topo.caches().items()}
    if len(caches) > len(cores):
        note("l3", f"{len(caches)} L3 caches (core complexes) in {len(cores)} NUMA node(s): "
             + ", ".join(f"L3 {l3} on node {n}: {k} cores" for (_, n, l3), k in caches.items()),
             f"an instance or rank of up to {min(caches.values())} threads (one a core) is kept inside one L3 where "
             "the whole layout fits so (threads that share no L3 exchange data through the fabric); on a VM the "
             "host's placement of the vCPUs may differ from what the guest is told")
    return notes


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


def parse_cpu_vendor(cpuinfo: str) -> str | None:
    """/proc/cpuinfo's vendor_id: GenuineIntel, AuthenticAMD, ... (None where it has none, e.g. ARM)."""
    match = re.search(r"^vendor_id\s*:\s*(\S+)", cpuinfo, re.MULTILINE)
    return match.group(1) if match else None


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
    reason = ""
    if not works:
        said = (proc.stderr.strip().splitlines() or ["trial call failed"])[-1] if proc else "trial call failed"
        cpus_only = _run([exe, f"--physcpubind={cpu}", "true"])
        what = "memory binding" if cpus_only is not None and cpus_only.returncode == 0 else "binding"
        reason = f"{what} refused: {said}"
    return {"present": True, "works": works, "path": exe, "reason": reason}


@functools.lru_cache(maxsize=1)
def topology() -> Topology:
    """This machine as this process sees it: lscpu's CPUs inside the affinity mask and the
    cgroup's cpuset, capped by its CPU quota, with hybrid core kinds (see ``restrict``)."""
    proc = _run(["lscpu", "-p=CPU,CORE,SOCKET,NODE,CACHE"])
    affinity = os.sched_getaffinity(0)
    try:
        cpus = parse_lscpu_parse(proc.stdout) if proc is not None and proc.returncode == 0 else []
    except CpuoptError:
        cpus = []
    if not affinity <= {c.cpu for c in cpus}:  # no lscpu, or it does not know our CPUs: one core each
        cpus = [Cpu(i, i, 0, 0) for i in sorted(affinity)]
    limits = read_cgroup_limits()
    try:
        return restrict(cpus, affinity, limits["cpuset"], limits["quota"], read_core_kinds())
    except CpuoptError:  # a cpuset that misses the affinity mask: trust the mask, as the kernel does
        return restrict(cpus, affinity, None, limits["quota"], read_core_kinds())


def _read(path) -> str:
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


def user_cache_file(name: str) -> Path:
    """A file of answers kept between processes: ``$XDG_CACHE_HOME/cpuopt/NAME`` (``~/.cache/cpuopt``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cpuopt" / name


def read_cache(path: Path) -> dict:
    """The answers kept in ``path`` by key; none where it is missing or unreadable."""
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return cached if isinstance(cached, dict) else {}


def keep_in_cache(path: Path, key: str, value) -> None:
    """Add one answer to ``path``, replacing the file whole (a reader never sees half of it); where it
    cannot be written, the answer is simply asked again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({**read_cache(path), key: value}))
        os.replace(tmp, path)
    except OSError:
        pass


def onednn_isa_cache_file() -> Path:
    return user_cache_file("onednn_isa.json")


@functools.lru_cache(maxsize=1)
def onednn_isa() -> str | None:
    """The ISA oneDNN dispatches to, from the header of its verbose log (a tiny probe process).

    The answer is cached per Python, torch, CPU and ISA caps (the probe starts torch: ~3 s
    of every CLI call and notebook otherwise); a failed probe is not cached.
    """
    key, path = onednn_isa_cache_key(), onednn_isa_cache_file()
    cached = read_cache(path).get(key)
    if isinstance(cached, str):
        return cached
    try:
        proc = subprocess.run([sys.executable, "-c", ONEDNN_ISA_PROBE], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, ONEDNN_VERBOSE="1"))
    except (OSError, subprocess.TimeoutExpired):
        proc = None
    match = re.search(r"isa:([^\n]+)", proc.stdout) if proc is not None else None
    if not match:
        return None
    isa = match.group(1).strip()
    keep_in_cache(path, key, isa)
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


@dataclass(frozen=True)
class Facts:
    """What `cpuopt doctor` knows of a machine. Read here with ``collect_facts``; another
    machine's come from its `cpuopt doctor --json` (``from_dict``: unknown keys are dropped,
    missing ones take the defaults below, e.g. no bf16 fast path)."""

    fingerprint: str = ""
    hostname: str = ""
    cpu_model: str = "unknown"
    cpu_vendor: str = ""
    physical_cores: int = 1
    logical_cores: int = 1
    sockets: int = 1
    numa_nodes: dict = field(default_factory=dict)  # node -> its CPUs ({"0": [0, 1]})
    usable_cpus: int = 1
    topology: dict = field(default_factory=dict)  # Topology.to_dict(), with cgroup limits and notes
    isa: dict = field(default_factory=dict)  # flag -> present
    memory_gib: float | None = None
    allocators: dict = field(default_factory=dict)  # jemalloc / tcmalloc -> library path or None
    openmp: dict = field(default_factory=dict)  # gnu / intel -> library
    numactl: dict = field(default_factory=dict)  # present, works, reason
    versions: dict = field(default_factory=dict)  # python, torch, oneDNN, ...
    missing: dict = field(default_factory=dict)  # what is not installed -> how to install it
    bf16: dict = field(default_factory=lambda: {"accelerated": False, "path": None, "reason": "not read"})
    ipex_runtime: dict | None = None  # `cpuopt doctor` adds the IPEX runtime's probe
    vendor_extension: str | None = None
    peak: dict | None = None  # `cpuopt doctor` adds peak.peak_report: theoretical and measured GFLOP/s per dtype
    microarchitecture: str | None = None  # peak.identify's row (e.g. "AMD Zen 4"); None where no row covers the CPU
    virtual_machine: bool | None = None  # cpuinfo's "hypervisor" flag: its cores are the vCPUs its host gives it

    @classmethod
    def from_dict(cls, data: dict) -> "Facts":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "Facts":
        return dataclasses.replace(self, **changes)


def read_cpuinfo() -> str:
    """This machine's /proc/cpuinfo ("" where there is none)."""
    return _read("/proc/cpuinfo")


def collect_facts() -> Facts:
    """Everything `cpuopt doctor` reports about this machine (``Facts``; ``to_dict()`` is its JSON)."""
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
    isa = parse_isa_flags(cpuinfo)
    facts = Facts(
        hostname=platform.node(), cpu_model=parse_cpu_model(cpuinfo), cpu_vendor=parse_cpu_vendor(cpuinfo),
        physical_cores=topo.physical_cores, logical_cores=topo.logical_cores, sockets=topo.sockets,
        numa_nodes={str(k): v for k, v in topo.numa_nodes.items()}, usable_cpus=topo.logical_cores,
        topology={**topo.to_dict(), "cgroup": read_cgroup_limits(), "notes": topology_notes(topo)},
        isa=isa, memory_gib=parse_meminfo_gib(_read("/proc/meminfo")), allocators=allocators, openmp=openmp,
        numactl=numactl, versions=versions, missing=missing,
        bf16=bf16_gate(isa, versions["onednn_bf16_supported"], onednn_isa()),
        microarchitecture=getattr(peak.identify(cpuinfo)[0], "name", None), virtual_machine=is_virtual(cpuinfo))
    return facts.replace(fingerprint=fingerprint(facts.to_dict()))


def is_virtual(cpuinfo: str) -> bool:
    """Whether the kernel runs under a hypervisor (cpuinfo's flags carry "hypervisor")."""
    match = re.search(r"^(?:flags|Flags)\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    return bool(match) and "hypervisor" in match.group(1).split()


def numa_words(nodes: dict) -> str:
    """{'0': [0, 1], '1': [2, 3]} -> 'NUMA node 0: CPUs 0-1; node 1: CPUs 2-3'."""
    if not nodes:
        return "NUMA nodes unknown"
    return "NUMA " + "; ".join(f"node {n}: CPUs {format_cpu_list(cpus)}" for n, cpus in nodes.items())


def format_facts(facts: Facts) -> str:
    """The human-readable doctor report."""
    isa = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in facts.isa.items())
    v = facts.versions
    vm = "a virtual machine: its cores are the vCPUs its host gives it" if facts.virtual_machine else None
    about = ", ".join(filter(None, [facts.microarchitecture, vm]))
    lines = [
        f"CPU          {facts.cpu_model}" + (f" ({about})" if about else ""),
        f"cores        {facts.physical_cores} physical, {facts.logical_cores} logical, "
        f"{facts.sockets} socket(s), {numa_words(facts.numa_nodes)}",
        *[f"{n['fact']:<12} {n['value']}\n{'':<12} -> {n['threads']}"
          for n in facts.topology.get("notes", [])],
        f"ISA          {isa}",
        f"memory       {facts.memory_gib} GiB",
        f"software     python {v['python']}, torch {v['torch']}, oneDNN {v['onednn']}, MKL {v['mkl']}, "
        f"OpenMP {v['openmp_runtime']}, capability {v['cpu_capability']}",
        f"bf16         {'accelerated (' + facts.bf16['path'] + ')' if facts.bf16['accelerated'] else 'not accelerated'}:"
        f" {facts.bf16['reason']}",
    ]
    for kind, path in facts.allocators.items():
        lines.append(f"{kind:<12} {path or 'not found'}")
    lines.append(f"{'intel omp':<12} {facts.openmp['intel'] or 'not found'}")
    n = facts.numactl
    lines.append(f"{'numactl':<12} {'works' if n['works'] else ('present but refused: ' + n['reason'] if n['present'] else 'not found')}")
    ipex = facts.ipex_runtime
    if ipex:
        if ipex["available"]:
            isa = ipex.get("ipex_isa") or {}
            lines.append(f"{'ipex':<12} {ipex['path']}: torch {ipex['torch']}, IPEX {ipex['ipex']}, "
                         f"ISA {isa.get('current', '?')} (highest {isa.get('highest', '?')})")
        else:
            lines.append(f"{'ipex':<12} not available: {ipex['reason']}")
    if facts.vendor_extension:
        lines.append(f"{'extension':<12} {facts.vendor_extension}")
    if facts.peak:
        from cpuopt_helpers.peak import peak_lines

        lines += peak_lines(facts.peak)
    if facts.missing:
        lines.append("missing      install with:")
        lines += [f"  {kind:<10} {hint}" for kind, hint in facts.missing.items()]
    else:
        lines.append("missing      nothing")
    return "\n".join(lines)
