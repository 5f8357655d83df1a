"""RunConfig -> LaunchPlan -> worker processes -> RunResult.

``build_plan`` is pure: from a validated config, the machine's facts and the caller's
environment it decides the interpreter, argv, environment and cores of every instance.
``run_plan`` spawns the training workers (and ``run_command_plan`` a user's command);
every other measured process (ceilings, replays, accuracy, kernel benchmarks, probes of
another runtime) starts through ``run_json_module``, under the same rule for the caller's
variables. What of the caller's environment reaches the processes (``measuring_env``:
OMP_*, KMP_*, GOMP_*, MKL_*, ONEDNN_*, DNNL_*, MALLOC_*, TORCHINDUCTOR_*, LD_PRELOAD) is
recorded with each result as ``caller_env`` and is part of a sweep's identity, so resume
never mixes runs made under different environments.

Environment variables the plan sets (values already in the caller's environment win,
with a warning, except LD_PRELOAD, to which ours are appended):

| variable            | value                                                   | when                |
|---------------------|---------------------------------------------------------|---------------------|
| OMP_NUM_THREADS     | threads per instance                                    | always              |
| MKL_NUM_THREADS     | threads per instance                                    | always              |
| LD_PRELOAD          | the allocator's library, then libiomp5.so               | jemalloc/tcmalloc, intel OpenMP |
| MALLOC_CONF         | oversize_threshold:1,background_thread:true,metadata_thp:auto (PyTorch's run_cpu) | jemalloc |
| KMP_AFFINITY        | granularity=fine,compact,1,0                            | intel OpenMP        |
| KMP_BLOCKTIME       | the config's value, else 1 (run_cpu's default)          | intel OpenMP        |
| CPUOPT_CORES        | the instance's logical CPUs                             | always              |
| CPUOPT_INSTANCE(S)  | index and count of instances                            | always              |
| CPUOPT_PINNING      | numactl, taskset or sched_setaffinity                   | always              |
| PYTHONPATH          | the current folder, then cpuopt_helpers' root           | always              |
| MASTER_ADDR/PORT, RANK, LOCAL_RANK, WORLD_SIZE | torch.distributed's env:// rendezvous | mode ddp   |

Not set by the plan: TORCHINDUCTOR_CACHE_DIR. A compiled run's worker makes a fresh,
empty one itself before importing torch (and removes it), so ``compile_s`` is always a
cold compile, also when a user pastes the plan's command again; a plan-time temporary
folder would be filled by the first run and make a rerun silently warm. A value in the
caller's environment (or the config's ``env``) wins, with a warning.

Placement (``assign_cores``, affinity compact): instances never straddle a NUMA node or a
socket. Each takes one thread per physical core (SMT siblings only when the layout needs
more threads than cores), inside one (socket, node) where it fits, several to a node; an
instance larger than a node takes whole nodes of one socket, then whole sockets. A layout
that does not fit that way is refused, saying which thread count fits; ``--affinity
scatter`` (spread across sockets on purpose) or explicit ``--cores`` are the ways to ask
for straddling. With no thread count given, each instance gets the most physical cores
that keep it inside its node (``default_threads``).

Pinning: ``numactl --physcpubind=CORES`` with the memory bound to the instance's node
(``--membind=NODE``; an instance spanning several nodes gets ``--localalloc``, since
``--membind`` to several nodes fills the lowest first) when numactl works, else
``taskset -c CORES`` (with a warning where numactl is present but refused: memory is then
not bound, and pages land on the node of the thread that first touches them), else the
worker pins itself with ``os.sched_setaffinity``.

What ``make_result`` adds to the instances' results:

- ``samples_per_s``: the samples of all instances' timed steps divided by the window from
  the first instance's start of timed steps to the last one's end (wall clock, recorded
  by each worker), not a sum of rates measured over different windows. Each instance's
  own rate stays in ``instances``.
- ``warmup_steps`` (the most any instance ran) and ``warmup_settled`` (all settled).
- ``compile_s`` (cold: first warm-up step with an empty Inductor cache) and
  ``compile_warm_s`` (the recompile after ``torch._dynamo.reset()`` with the cache filled).
- ``slow_steps`` (timed steps over 1.5 x the median) and ``mean_over_median`` (mean step /
  median step): how far slow steps moved the throughput, which stays total samples over
  total time.
- ``machine_state`` (``load1``, ``usable_cpus``, ``threads``, ``previous_threads``,
  ``steal_pct``, ``loaded``; see ``is_loaded``) and ``code_version`` (package version and
  a hash of the measuring code).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from cpuopt_helpers import rank_exec, runtimes, stats, system
from cpuopt_helpers.config import RunConfig, validate
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.worker import RESULT_KEY

log = logging.getLogger(__name__)

JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto"
KMP_AFFINITY = "granularity=fine,compact,1,0"
USER_WINS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MALLOC_CONF", "KMP_AFFINITY", "KMP_BLOCKTIME")
# What of the caller's environment reaches a measured process and changes what it does:
# recorded with each result and part of a sweep's identity (results.sweep_id).
MEASURING_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_", "ONEDNN_", "DNNL_", "MALLOC_", "TORCHINDUCTOR_", "LD_PRELOAD")


def measuring_env(base_env) -> dict:
    """The caller's variables that a measured process would see and act on."""
    return {k: v for k, v in sorted(base_env.items()) if k.startswith(MEASURING_PREFIXES)}
STDERR_TAIL = 2000


@dataclass(frozen=True)
class Machine:
    """What the planner needs to know about the machine (tests build fake ones)."""

    topology: system.Topology
    libraries: dict  # kind (jemalloc, tcmalloc, iomp) -> path or None
    numactl: bool
    taskset: bool
    numactl_refused: str = ""  # why numactl, though installed, cannot bind here ("" when it can or is absent)
    source: str = ""  # the --topology file this machine was read from ("" for this machine)
    facts: dict = field(default_factory=dict)  # the facts of that file's `cpuopt doctor --json` ({} otherwise)

    @classmethod
    def this(cls) -> "Machine":
        status = system.numactl_status()
        return cls(system.topology(), this_libraries(), status["works"], shutil.which("taskset") is not None,
                   status["reason"] if status["present"] and not status["works"] else "")

    @classmethod
    def from_file(cls, path: str) -> "Machine":
        """Another machine, for plans only (--topology): its saved `cpuopt doctor --json` or `lscpu -p`.

        A doctor JSON also says which libraries that machine has and whether numactl works
        there; for lscpu text the libraries are this machine's, and numactl is taken to work
        (a server's usual case; where it does not, the launch there falls back to taskset).
        """
        topo, facts = system.read_topology_file(path)
        if not facts:
            return cls(topo, this_libraries(), True, True, source=path)
        numactl = facts.get("numactl") or {}
        libraries = {**(facts.get("allocators") or {}), "iomp": (facts.get("openmp") or {}).get("intel")}
        return cls(topo, libraries, bool(numactl.get("works")), True,
                   numactl.get("reason", "") if numactl.get("present") and not numactl.get("works") else "",
                   source=path, facts=facts)


def this_libraries() -> dict:
    """The allocator and OpenMP libraries found on this machine (kind -> path or None)."""
    return {k: system.locate_library(k) for k in ("jemalloc", "tcmalloc", "iomp")}


@dataclass(frozen=True)
class InstancePlan:
    index: int
    cores: tuple[int, ...]
    argv: tuple[str, ...]
    env: dict  # only the variables the plan sets or changes


@dataclass(frozen=True)
class LaunchPlan:
    config: RunConfig
    instances: tuple[InstancePlan, ...]
    pinning: str
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def shell_command(self) -> str:
        """The plan as a shell script a user can paste (instances run in parallel)."""
        lines = []
        for inst in self.instances:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(inst.env.items()))
            cmd = " ".join(shlex.quote(a) for a in inst.argv)
            lines.append(f"env {env} {cmd}" + (" &" if len(self.instances) > 1 else ""))
        if len(self.instances) > 1:
            lines.append("wait")
        return "\n".join(lines)


def _place(topology: system.Topology, instances: int, threads: int) -> list[list[int]] | None:
    """Core sets that keep every instance inside one NUMA node, or on whole nodes of one
    socket, or on whole sockets (see the module docstring); None when they do not fit so."""
    smt = instances * threads > topology.physical_cores
    first = set(topology.core_order()[:topology.physical_cores])  # one CPU per physical core
    nodes = [(socket, [c for c in cpus if smt or c in first]) for (socket, _), cpus in topology.domains().items()]
    if threads <= max(len(cpus) for _, cpus in nodes):  # inside a node: first fit, several to a node
        free = [cpus for _, cpus in nodes]
        groups = []
        for _ in range(instances):
            i = next((i for i, cpus in enumerate(free) if len(cpus) >= threads), None)
            if i is None:
                return None
            groups.append(free[i][:threads])
            free[i] = free[i][threads:]
        return groups
    sockets: dict[int, list[int]] = {}
    for socket, cpus in nodes:
        sockets.setdefault(socket, []).extend(cpus)
    for units in (list(sockets.values()), [[c for _, cpus in nodes for c in cpus]]):  # one socket, then all of them
        if threads <= max(len(u) for u in units):
            fitting = [u for u in units if len(u) >= threads]
            return [u[:threads] for u in fitting[:instances]] if len(fitting) >= instances else None
    return None


def fits(topology: system.Topology, instances: int, threads: int) -> bool:
    """Whether compact placement keeps each of these instances inside its node (``assign_cores`` accepts it)."""
    return instances * threads <= topology.logical_cores and _place(topology, instances, threads) is not None


def default_threads(topology: system.Topology, instances: int = 1) -> int:
    """Threads per instance when none are asked: the most physical cores each instance can
    have inside its node (all usable physical cores for one instance). Never os.cpu_count():
    the topology holds only the CPUs the affinity mask, the cpuset and the quota leave."""
    for threads in range(max(1, topology.physical_cores // instances), 0, -1):
        if _place(topology, instances, threads) is not None:
            return threads
    return 1


def assign_cores(topology: system.Topology, instances: int, threads: int,
                 affinity: str = "compact") -> list[tuple[int, ...]]:
    """Disjoint core sets, one thread per physical core first and SMT siblings after.

    compact: instances packed node by node, never straddling a NUMA node or socket (see the
    module docstring); a layout that cannot be placed so is refused with what fits.
    scatter: cores are dealt round-robin across sockets, so each instance spreads out.
    """
    order = topology.core_order()
    if instances * threads > len(order):
        raise CpuoptError(f"{instances} x {threads} threads need {instances * threads} cores; "
                          f"{len(order)} are available")
    if affinity == "scatter":
        sockets = sorted({c.socket for c in topology.cpus})
        by_socket = [[c for c in order if next(x.socket for x in topology.cpus if x.cpu == c) == s] for s in sockets]
        dealt = [c for group in zip(*by_socket) for c in group] or order
        order = dealt + [c for c in order if c not in dealt]  # sockets alternate: s0, s1, s0, s1, ...
        return [tuple(sorted(order[i * threads:(i + 1) * threads])) for i in range(instances)]
    groups = _place(topology, instances, threads)
    if groups is None:
        core = {c.cpu: (c.socket, c.core) for c in topology.cpus}
        sizes = ", ".join(str(len({core[c] for c in cpus})) for cpus in topology.domains().values())
        raise CpuoptError(f"{instances} instances x {threads} threads do not fit in the NUMA nodes here ({sizes} "
                          f"physical cores) without one straddling two; use {default_threads(topology, instances)} "
                          "threads per instance or fewer, or ask for straddling: --affinity scatter, or --cores")
    return [tuple(sorted(g)) for g in groups]


def _library(machine: Machine, kind: str) -> str:
    path = machine.libraries.get(kind)
    if not path:
        raise CpuoptError(f"{kind} library not found on this machine; install it: {system.INSTALL_HINTS[kind]} "
                          "(then `cpuopt doctor` shows it)")
    return path


def plan_env(config: RunConfig, machine: Machine, base_env: dict) -> tuple[dict, list[str]]:
    """The variables a launch sets (see the table above), and warnings where the user's win."""
    env: dict[str, str] = {"OMP_NUM_THREADS": str(config.threads), "MKL_NUM_THREADS": str(config.threads)}
    preload = []
    if config.allocator != "default":
        preload.append(_library(machine, config.allocator))
        if config.allocator == "jemalloc":
            env["MALLOC_CONF"] = JEMALLOC_CONF
    if config.omp_runtime == "intel":
        preload.append(_library(machine, "iomp"))
        if config.affinity != "none":
            env["KMP_AFFINITY"] = KMP_AFFINITY
        env["KMP_BLOCKTIME"] = str(config.kmp_blocktime if config.kmp_blocktime is not None else 1)
    env.update(dict(config.env))
    warnings = []
    for key in USER_WINS:
        if key in base_env and key in env and base_env[key] != env[key]:
            warnings.append(f"{key}={base_env[key]} from your environment overrides the planned "
                            f"{env[key]}; unset it to let cpuopt choose")
            env[key] = base_env[key]
    if config.compile:
        cache = dict(config.env).get("TORCHINDUCTOR_CACHE_DIR") or base_env.get("TORCHINDUCTOR_CACHE_DIR")
        if cache:
            warnings.append(f"TORCHINDUCTOR_CACHE_DIR={cache} is set, so the compile time is measured with that "
                            "Inductor cache, which may be warm; unset it for a cold compile in a fresh cache")
    user_preload = base_env.get("LD_PRELOAD", "")
    if preload or user_preload:
        env["LD_PRELOAD"] = ":".join([p for p in user_preload.split(":") if p] + preload)
    env["PYTHONPATH"] = python_path(base_env)
    return env, warnings


def python_path(base_env: dict) -> str:
    """The current folder (user workloads), then cpuopt_helpers' own root (other runtimes), then the user's."""
    paths = [os.getcwd(), str(runtimes.PROJECT_ROOT)] + base_env.get("PYTHONPATH", "").split(os.pathsep)
    return os.pathsep.join(dict.fromkeys(p for p in paths if p))


def pin_prefix(pinning: str, group: tuple[int, ...], topo: system.Topology) -> list[str]:
    """The command prefix that binds a process to its cores (and their NUMA nodes)."""
    if pinning == "numactl":
        return rank_exec.numactl_argv(group, sorted({topo.node_of(c) for c in group}))
    if pinning == "taskset":
        return ["taskset", "-c", ",".join(map(str, group))]
    return []


def numactl_fallback(reason: str, pinning: str) -> str:
    """The warning when numactl is installed but refuses to bind here (a container without CAP_SYS_NICE,
    a cpuset.mems that excludes the node): what pins instead, and that memory is not bound."""
    return (f"numactl is installed but refused here ({reason}); pinning with {pinning} instead: CPUs are bound, "
            "memory is not, so pages land on the node of the thread that first touches them")


def run_cpu_argv(config: RunConfig, python: str) -> list[str]:
    """PyTorch's own launcher with its defaults, running the worker script (run_cpu wants a .py file)."""
    from cpuopt_helpers import worker

    return [python, "-m", RUN_CPU, worker.__file__, "--config", config.to_json()]


RUN_CPU = "torch.backends.xeon.run_cpu"  # a command plan under run_cpu: PYTHON -m RUN_CPU SCRIPT.py ARGS


def free_port() -> int:
    """A TCP port nobody listens on now (for the DDP rendezvous)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_plan(config: RunConfig, machine: Machine, base_env: dict | None = None, python: str | None = None,
               command: list[str] | None = None) -> LaunchPlan:
    """Decide argv, environment and cores of every instance. Pure: spawns nothing.

    ``command`` replaces the worker (``cpuopt launch -- COMMAND``); the config's workload
    is then not used.
    """
    base_env = dict(os.environ if base_env is None else base_env)
    topo = machine.topology
    if config.threads is None and not config.cores and config.launcher == "cpuopt":
        config = config.replace(threads=default_threads(topo, max(1, config.instances)))
    config = validate(config, topo.logical_cores, topo.physical_cores, check_workload=command is None)
    if config.kmp_blocktime is not None and config.omp_runtime != "intel":
        raise CpuoptError("KMP_BLOCKTIME only applies to Intel OpenMP; add --omp-runtime intel")
    if config.compile == "zentorch" and command is None:  # before any process starts: installed, and for this torch
        if config.runtime != "main":
            raise CpuoptError("--compile zentorch runs in this interpreter's torch (--runtime main) only")
        status = runtimes.zentorch_status()
        if not status["usable"]:
            raise CpuoptError(f"--compile zentorch: {status['reason']}")
    python = python or runtimes.resolve_python(config.runtime)
    if config.ipex:
        probed = runtimes.probe(python)
        if not probed["ipex_usable"]:
            raise CpuoptError(f"--ipex cannot run under {python}: {probed['reason']}")
    if config.launcher == "run_cpu":  # measured as users run it: run_cpu decides everything itself
        env = {"PYTHONPATH": python_path(base_env)}
        if sys.prefix != sys.base_prefix:  # as in an activated venv, where run_cpu looks for libraries
            env["VIRTUAL_ENV"] = sys.prefix
        argv = run_cpu_argv(config, python) if command is None else [command[0], "-m", RUN_CPU, *command[1:]]
        inst = InstancePlan(0, tuple(c.cpu for c in topo.cpus), tuple(argv), env)
        return LaunchPlan(config, (inst,), "run_cpu")
    if config.cores:
        cores = list(config.cores)
    else:
        per_instance = min(config.threads, topo.logical_cores // config.instances)  # oversubscribed: share
        cores = assign_cores(topo, config.instances, per_instance, config.affinity)
    known = {c.cpu for c in topo.cpus}
    for group in cores:
        if not set(group) <= known:
            raise CpuoptError(f"cores {sorted(set(group) - known)} are not available here; "
                              f"use cores from {sorted(known)}")
    env, warnings = plan_env(config, machine, base_env)
    if config.affinity == "none":
        pinning = "none"
    else:
        pinning = "numactl" if machine.numactl else "taskset" if machine.taskset else "sched_setaffinity"
        if machine.numactl_refused:
            warnings.append(numactl_fallback(machine.numactl_refused, pinning))
    argv_tail = command or [python, "-m", "cpuopt_helpers.worker", "--config", config.to_json()]
    if config.mode == "ddp":  # torch.distributed's env:// rendezvous, as torchrun sets it
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(len(cores)))
    instances = []
    for i, group in enumerate(cores):
        inst_env = dict(env, CPUOPT_INSTANCE=str(i), CPUOPT_INSTANCES=str(len(cores)), CPUOPT_PINNING=pinning)
        if config.mode == "ddp":
            inst_env.update(RANK=str(i), LOCAL_RANK=str(i))
        if pinning != "none":
            inst_env["CPUOPT_CORES"] = ",".join(map(str, group))
        prefix = pin_prefix(pinning, group, topo) if pinning != "none" else []
        instances.append(InstancePlan(i, tuple(group), tuple(prefix + list(argv_tail)), inst_env))
    for w in warnings:
        log.warning(w)
    return LaunchPlan(config, tuple(instances), pinning, tuple(warnings))


def build_torchrun_plan(config: RunConfig, machine: Machine, command: list[str], nproc: int,
                        torchrun_args: list[str] = (), base_env: dict | None = None,
                        python: str | None = None) -> LaunchPlan:
    """``torch.distributed.run`` with every local rank pinned to its own cores.

    torchrun starts the ranks itself; each runs ``cpuopt_helpers.rank_exec``, which pins
    it to its group of CPUOPT_RANK_CORES (numactl where it works) and then runs the script.
    OMP_NUM_THREADS is the cores per rank (a stock torchrun sets 1).
    """
    base_env = dict(os.environ if base_env is None else base_env)
    if command and os.path.basename(command[0]).startswith("python"):
        command = command[1:]
    if not command or not command[0].endswith(".py"):
        raise CpuoptError("--nproc-per-node runs a training script: write it as -- python train.py [ARGS]")
    if not os.path.isfile(command[0]):
        raise CpuoptError(f"no such script {command[0]!r}")
    topo = machine.topology
    if config.threads is None and not config.cores:
        config = config.replace(threads=default_threads(topo, nproc))
    config = validate(config.replace(instances=nproc), topo.logical_cores, topo.physical_cores, check_workload=False)
    groups = list(config.cores) if config.cores else assign_cores(topo, nproc, config.threads, config.affinity)
    env, warnings = plan_env(config, machine, base_env)
    pinning = "numactl" if machine.numactl else "sched_setaffinity"
    if machine.numactl_refused:
        warnings.append(numactl_fallback(machine.numactl_refused, pinning))
    env.update(CPUOPT_RANK_CORES=";".join(",".join(map(str, g)) for g in groups), CPUOPT_PINNING=pinning,
               CPUOPT_RANK_NODES=";".join(",".join(str(n) for n in sorted({topo.node_of(c) for c in g}))
                                          for g in groups))
    argv = [python or sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", *torchrun_args,
            "-m", "cpuopt_helpers.rank_exec", *command]
    cores = tuple(c for g in groups for c in g)
    for w in warnings:
        log.warning(w)
    return LaunchPlan(config, (InstancePlan(0, cores, tuple(argv), env),), "torchrun+" + pinning, tuple(warnings))


# --- what a RunResult says about the machine and the code (pure functions, then readers) ---

STEAL_LOADED_PCT = 5.0  # more of the run's CPU time than this stolen by the hypervisor: loaded
PREVIOUS_RUN_MEMORY_S = 300.0  # the 1-minute load average forgets a run within ~5 minutes (e^-5)
_previous_run: dict = {}  # threads and end time of the last run this process launched


def parse_proc_stat(text: str) -> dict[str, list[int]]:
    """/proc/stat's cpu lines: {"cpu": [user, nice, system, idle, iowait, irq, softirq, steal, ...], "cpu0": ...}."""
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("cpu"):
            rows[parts[0]] = [int(x) for x in parts[1:]]
    return rows


def steal_pct(before: str, after: str, cpus: list[int] | None = None) -> float | None:
    """Percent of the CPU time between two /proc/stat readings that the hypervisor stole.

    Over the given CPUs (the run's cores) when /proc/stat lists them, else over all. The
    total is user..steal (the first 8 fields; guest time is already inside user). None
    when the readings do not say (no steal column, no time passed, not Linux).
    """
    a, b = parse_proc_stat(before), parse_proc_stat(after)
    names = [f"cpu{c}" for c in cpus or []]
    if not names or not all(n in a and n in b for n in names):
        names = ["cpu"]
    if not all(n in a and n in b and len(a[n]) >= 8 and len(b[n]) >= 8 for n in names):
        return None
    steal = sum(b[n][7] - a[n][7] for n in names)
    total = sum(sum(b[n][:8]) - sum(a[n][:8]) for n in names)
    return 100.0 * steal / total if total > 0 else None


def usable_cpus(affinity: int, cpu_max: str | None = None) -> int:
    """CPUs this process may use: its affinity, lowered by a cgroup v2 quota ("QUOTA PERIOD" or "max PERIOD")."""
    if cpu_max:
        quota, _, period = cpu_max.strip().partition(" ")
        if quota != "max" and quota.isdigit() and period.strip().isdigit() and int(period) > 0:
            return max(1, min(affinity, math.ceil(int(quota) / int(period))))
    return affinity


def load_margin(usable: int) -> float:
    """Load beyond our own threads that still counts as quiet: the launcher and daemons (1), or 10% of the CPUs."""
    return max(1.0, 0.1 * usable)


def is_loaded(load1: float | None, usable: int, steal: float | None, previous_threads: int = 0) -> bool:
    """Was the machine busy with other work around this run? The rule:

    loaded when the hypervisor stole more than 5% of the CPU time on the run's cores, or
    when the 1-minute load average before launch exceeds what our own work can explain
    plus a margin. Runs go back to back, so the load includes our previous run: it can
    keep up to one runnable thread per usable CPU, or its own thread count when it
    oversubscribed (``previous_threads``, known when this process launched it within the
    last 5 minutes). Margin: ``load_margin``. So: load1 > max(usable, previous_threads) + margin.
    """
    if steal is not None and steal > STEAL_LOADED_PCT:
        return True
    return load1 is not None and load1 > max(usable, previous_threads) + load_margin(usable)


def run_threads(config: RunConfig) -> int:
    """Threads this run keeps busy: per instance, its compute threads and its DataLoader processes."""
    return config.instances * ((config.threads or 1) + config.loader_workers)


def machine_state(load1: float | None, usable: int, threads: int, steal: float | None,
                  previous_threads: int = 0) -> dict:
    """The RunResult's ``machine_state``: what the machine was doing around the run, and the verdict."""
    return {"load1": load1, "usable_cpus": usable, "threads": threads, "previous_threads": previous_threads,
            "steal_pct": None if steal is None else round(steal, 3),
            "loaded": is_loaded(load1, usable, steal, previous_threads)}


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _load1() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


PACKAGE_DIR = Path(__file__).resolve().parent
# The code that decides what a measurement is: a change here can change any number.
MEASURING_SOURCES = ("worker.py", "launch.py", "config.py", "flops.py", "fixes.py", "workloads/*.py", "kernels/*.py")
_code_versions: dict = {}


def measuring_files(root: Path = PACKAGE_DIR) -> list[Path]:
    """The measuring code's files under the package folder (flops.py only where it exists)."""
    return sorted({f for pattern in MEASURING_SOURCES for f in root.glob(pattern) if f.is_file()})


def measuring_hash(sources: dict[str, str]) -> str:
    """Short sha256 over the files' names and texts, in name order."""
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + sources[name].encode() + b"\0")
    return digest.hexdigest()[:12]


def package_version() -> str:
    """cpuopt_helpers' version from its installed metadata, else from the package itself."""
    try:
        return metadata.version("cpuopt-helpers")
    except metadata.PackageNotFoundError:
        from cpuopt_helpers import __version__

        return __version__


def code_version(root: Path | None = None) -> dict:
    """{"package": version, "measuring_hash": hash of MEASURING_SOURCES' texts}.

    Cached per file state (path, mtime, size), so an edit between two runs of one
    notebook kernel gives a new hash while an unchanged tree is hashed once.
    """
    root = root or PACKAGE_DIR
    files = measuring_files(root)
    key = (str(root),) + tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    if key not in _code_versions:
        sources = {f.relative_to(root).as_posix(): f.read_text(errors="replace") for f in files}
        _code_versions[key] = {"package": package_version(), "measuring_hash": measuring_hash(sources)}
    return dict(_code_versions[key])


def aggregate_samples_per_s(instances: list[dict]) -> tuple[float, float]:
    """(samples/s, window s) of all instances together: total samples of their timed steps
    over the union window, from the earliest ``timed_start`` to the latest ``timed_end``.

    Instances that do not report their window (an older worker) fall back to the longest
    instance's summed step time, which assumes the timed steps overlapped.
    """
    samples = sum(r["batch_size"] * len(r["step_s"]) for r in instances)
    if all(r.get("timed_start") is not None and r.get("timed_end") is not None for r in instances):
        window = max(r["timed_end"] for r in instances) - min(r["timed_start"] for r in instances)
    else:
        window = 0.0
    if window <= 0:
        window = max(sum(r["step_s"]) for r in instances)
    return samples / window, window


def slow_step_summary(step_ms: list[float], factor: float = 1.5) -> dict:
    """How much slow steps weigh in a run: {"slow_steps": count over factor x median, "mean_over_median"}."""
    if not step_ms:
        return {"slow_steps": None, "mean_over_median": None}
    median = stats.summarize(step_ms)["median"]
    return {"slow_steps": sum(s > factor * median for s in step_ms),
            "mean_over_median": (sum(step_ms) / len(step_ms)) / median if median > 0 else None}


def _tail(path: str, limit: int = STDERR_TAIL) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - limit))
        return f.read().decode(errors="replace").strip()


def _parse_instance(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{") and RESULT_KEY in line:
            try:
                return json.loads(line)[RESULT_KEY]
            except json.JSONDecodeError:
                continue
    return None


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


UNSUPPORTED_EXIT = 3  # the worker's exit code when this CPU has no kernel for the run (worker.UNSUPPORTED_EXIT)


# What changes where or how a run executes, not the work of one step: runs that differ only
# in these share one FLOP count, counted by the first of them (see flops_cache_file).
PLACEMENT_FIELDS = ("threads", "cores", "affinity", "allocator", "omp_runtime", "kmp_blocktime", "launcher",
                    "oversubscribe", "loader_workers", "onednn_verbose", "trace", "timeout_s", "steps", "warmup")


def flops_cache_file(config: RunConfig) -> str | None:
    """Where the workers of this run find (or leave) the FLOP count of one step.

    The worker counts FLOPs with one extra step under torch's FLOP counter (a second or two
    on a standard model); the count depends only on the model, batch, precision and code, so
    it is kept in BUILD/cache/flops, keyed by the configuration without its PLACEMENT_FIELDS
    (its ``runtime`` names the interpreter), this interpreter and its torch version, and the
    measuring code's hash. None for DDP: its ranks must all run the counted step, or their
    collectives would not match.
    """
    if config.mode == "ddp":
        return None
    from cpuopt_helpers.results import build_dir

    fields = {k: v for k, v in config.to_dict().items() if k not in PLACEMENT_FIELDS}
    fields["env"] = {k: v for k, v in fields["env"].items() if k != "CPUOPT_TRACE_SHAPES"}  # how a trace records
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    key = json.dumps([fields, sys.executable, torch_version, code_version()["measuring_hash"]], sort_keys=True,
                     default=str)
    return str(build_dir() / "cache" / "flops" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json")


def run_plan(plan: LaunchPlan, facts: dict | None = None) -> dict:
    """Start every instance together, wait up to the timeout, and build the RunResult."""
    config = plan.config
    workdir = tempfile.mkdtemp(prefix="cpuopt-run-")
    procs, outs, errs = [], [], []
    previous = _previous_run if time.monotonic() - _previous_run.get("end", -math.inf) < PREVIOUS_RUN_MEMORY_S else {}
    load1, stat_before = _load1(), _read_text("/proc/stat")
    flops_file = flops_cache_file(config)
    launch_wall = time.time()
    for inst in plan.instances:
        out, err = os.path.join(workdir, f"{inst.index}.out"), os.path.join(workdir, f"{inst.index}.err")
        env = dict(os.environ, **inst.env, CPUOPT_BARRIER=workdir, CPUOPT_LAUNCH_TIME=repr(launch_wall))
        if flops_file:
            env["CPUOPT_FLOPS_CACHE"] = flops_file
        with open(out, "wb") as fo, open(err, "wb") as fe:
            procs.append(subprocess.Popen(list(inst.argv), env=env, stdout=fo, stderr=fe,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        outs.append(out)
        errs.append(err)
    deadline = time.monotonic() + config.timeout_s
    status, reason = "ok", ""
    seen_exit: dict[int, float] = {}  # instance -> when this loop first saw it exited

    def failed_at(i: int) -> float:
        """When instance i said it failed (worker.note_failure), else infinity."""
        try:
            return float(open(os.path.join(workdir, f"{plan.instances[i].index}.failed")).read())
        except (OSError, ValueError):
            return math.inf

    def failed_first() -> list[int]:
        """Instances that failed, the first to fail first: a DDP rank whose peer crashed fails
        too, a moment later, and the launcher may see both exits at once; the first is the cause."""
        now = time.monotonic()
        for i, p in enumerate(procs):
            if p.returncode is not None:
                seen_exit.setdefault(i, now)
        return sorted((i for i, p in enumerate(procs) if p.returncode not in (None, 0)),
                      key=lambda i: (failed_at(i), seen_exit.get(i, math.inf), i))

    try:
        while any([p.poll() is None for p in procs]):  # a list: poll every process, not just the first
            failed = failed_first()
            if failed:
                status, reason = "failed", f"instance {failed[0]} exited with code {procs[failed[0]].returncode}"
                break
            if time.monotonic() > deadline:
                status, reason = "timeout", f"no result within the {config.timeout_s:.0f} s timeout"
                break
            time.sleep(0.02)
    finally:
        _kill(procs)  # also stops the others when one failed, and on KeyboardInterrupt
    stat_after = _read_text("/proc/stat")
    threads = run_threads(config)
    _previous_run.update(end=time.monotonic(), threads=threads)
    cpus = sorted({c for inst in plan.instances for c in inst.cores}) if plan.pinning not in ("none", "run_cpu") \
        else None
    state = machine_state(load1, usable_cpus(len(os.sched_getaffinity(0)), _read_text("/sys/fs/cgroup/cpu.max")),
                          threads, steal_pct(stat_before, stat_after, cpus) if stat_before and stat_after else None,
                          previous.get("threads", 0))
    if status == "ok":
        failed = failed_first()
        if failed:
            status, reason = "failed", f"instance {failed[0]} exited with code {procs[failed[0]].returncode}"
    results = [_parse_instance(open(o, errors="replace").read()) for o in outs]
    launcher_log = ""
    if plan.pinning == "run_cpu":  # what run_cpu decided, from its own log lines
        launcher_log = "\n".join(line for line in open(errs[0], errors="replace").read().splitlines()
                                 if " - INFO - " in line or " - WARNING - " in line)
    if status == "ok" and any(r is None for r in results):
        status, reason = "failed", "a worker exited without printing its result"
    if status != "ok":
        order = failed_first()  # the first to fail, passing over those this launcher killed (-9)
        bad = next((i for i in order if procs[i].returncode != -9), order[0] if order else 0)
        if status == "failed" and procs[bad].returncode == UNSUPPORTED_EXIT:  # see worker.UNSUPPORTED_SIGNS
            status, reason = "unsupported", "this CPU has no kernel for it"
        reason = f"{reason}; stderr tail of instance {bad}:\n{_tail(errs[bad])}"
    shutil.rmtree(workdir, ignore_errors=True)
    result = make_result(plan, status, reason, [r for r in results if r], facts, state)
    if launcher_log:
        result["launcher_log"] = launcher_log
    return result


def make_result(plan: LaunchPlan, status: str, reason: str, instances: list[dict], facts: dict | None,
                machine: dict | None = None) -> dict:
    """Combine per-instance results into one RunResult (the DESIGN.md contract; see the module docstring).

    ``machine`` is the ``machine_state`` that ``run_plan`` observed around the run.
    """
    config = plan.config
    result = {
        "config": config.to_dict(), "config_hash": config.config_hash(), "label": config.label(),
        "status": status, "reason": reason, "samples_per_s": None,
        "step_ms": stats.summarize([]), "phase_ms": {}, "peak_rss_mb": None,
        "loss_first": None, "loss_last": None, "losses": None, "flops_per_step": None, "achieved_gflops": None,
        "startup_s": None, "instances": [], "timed_window_s": None,
        "warmup_steps": None, "warmup_settled": None, "compile_s": None, "compile_warm_s": None,
        "slow_steps": None, "mean_over_median": None,
        "machine_state": machine, "code_version": code_version(),
        "env": {k: v for k, v in plan.instances[0].env.items()} if plan.instances else {},
        "caller_env": measuring_env(os.environ),
        "argv": [list(i.argv) for i in plan.instances], "pinning": plan.pinning,
        "warnings": list(plan.warnings), "versions": {},
        "system": (facts or {}).get("fingerprint"),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if status != "ok" or not instances:
        return result
    instances = sorted(instances, key=lambda r: r["index"])
    per_instance = []
    for r in instances:
        total = sum(r["step_s"])
        per_instance.append({
            "index": r["index"], "pid": r["pid"], "cores": r["cores"], "affinity": r["affinity"],
            "pinned_by": r["pinned_by"], "ld_preload": r["ld_preload"], "omp_num_threads": r["omp_num_threads"],
            "torch_threads": r["torch_threads"], "batch_size": r["batch_size"], "output_dtype": r.get("output_dtype"),
            "samples_per_s": r["batch_size"] * len(r["step_s"]) / total,
            "warmup_s": r.get("warmup_s", []), "python": r.get("python_executable"),
            "warmup_steps": r.get("warmup_steps", len(r.get("warmup_s", []))),
            "warmup_settled": r.get("warmup_settled"),
            "timed_start": r.get("timed_start"), "timed_end": r.get("timed_end"),
            "compile_warm_s": r.get("compile_warm_s"), "inductor_cache": r.get("inductor_cache"),
            "step_ms": stats.summarize([s * 1e3 for s in r["step_s"]]),
            "peak_rss_mb": r["peak_rss_mb"],
            "startup_s": r["first_step_wall"] - r["launch_wall"],
        })
    pooled = [s * 1e3 for r in instances for s in r["step_s"]]
    first = instances[0]
    flops = first["flops_per_step"]
    samples_per_s, window = aggregate_samples_per_s(instances)
    compiled = bool(config.compile)
    result.update({
        "samples_per_s": samples_per_s,
        "timed_window_s": window,
        "warmup_steps": max(i["warmup_steps"] for i in per_instance),
        "warmup_settled": all(bool(i["warmup_settled"]) for i in per_instance),
        **slow_step_summary(pooled),
        "step_ms": stats.summarize(pooled),
        "phase_ms": {k: stats.summarize([s * 1e3 for r in instances for s in r["phase_s"][k]])["median"]
                     for k in first["phase_s"]},
        "peak_rss_mb": max(i["peak_rss_mb"] for i in per_instance),
        "loss_first": first["loss_first"], "loss_last": first["loss_last"], "losses": first.get("losses"),
        "flops_per_step": flops,
        "achieved_gflops": (sum(r["flops_per_step"] * len(r["step_s"]) for r in instances) / window / 1e9
                            if all(r["flops_per_step"] for r in instances) else None),
        "startup_s": max(i["startup_s"] for i in per_instance),
        "onednn_logs": [r["onednn_log"] for r in instances if r.get("onednn_log")],
        "onednn_log_steps": config.steps if config.onednn_verbose else None,
        "traces": [r["trace"] for r in instances if r.get("trace")],
        "instances": per_instance,
        "versions": first["versions"],
        "notes": first.get("notes", []),
        "compile_s": max(i["warmup_s"][0] for i in per_instance) if compiled else None,
        "compile_warm_s": (max(i["compile_warm_s"] for i in per_instance)
                           if compiled and all(i["compile_warm_s"] is not None for i in per_instance) else None),
    })
    if config.mode == "ddp":
        result.update(backend=first["backend"], param_checksums=first["param_checksums"],
                      params_in_sync=all(r["params_in_sync"] for r in instances),
                      global_batch=sum(i["batch_size"] for i in per_instance))
    return result


def run(config: RunConfig, facts: dict | None = None) -> dict:
    """Plan and run one configuration on this machine."""
    return run_plan(build_plan(config, Machine.this()), facts)


def run_json_module(module: str, args: list[str], what: str, *, threads: int | None = None,
                    cores: list[int] | None = None, python: str | None = None, timeout_s: float = 600,
                    error: type[Exception] = RuntimeError) -> object:
    """Run `python -m module args` in a fresh process; return its last stdout line as JSON.

    The one way a process other than the training worker starts (ceilings, replays,
    accuracy, kernel benchmarks, probes of another runtime): ``threads`` fixes its OpenMP
    and MKL threads before it starts, ``cores`` hands it the cores to pin itself to
    (CPUOPT_CORES), ``python`` runs another interpreter with this project importable. As
    for workers, a value of yours among USER_WINS wins over the plan, with a warning.
    """
    planned = {}
    if threads:
        planned.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if cores:
        planned["CPUOPT_CORES"] = ",".join(map(str, cores))
    env = dict(os.environ, PYTHONPATH=python_path(os.environ))
    for key, value in planned.items():
        if key in USER_WINS and env.get(key, value) != value:
            log.warning("%s=%s from your environment overrides the planned %s for the %s; unset it to let cpuopt "
                        "choose", key, env[key], value, what)
        else:
            env[key] = value
    try:
        proc = subprocess.run([python or sys.executable, "-m", module, *args], env=env, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise error(f"{what} did not finish in {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise error(f"{what} failed (exit code {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-1500:]}")
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise error(f"{what} printed no result: {(proc.stderr or proc.stdout).strip()[-1500:]}") from None


def parse_core_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cores = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cores += list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise CpuoptError(f"cannot read core list {text!r}; write it like 0-3,8,10-11") from None
    if len(set(cores)) != len(cores):
        raise CpuoptError(f"core list {text!r} names a core twice")
    return cores


def _pump(stream, prefix: str, log_file, echo) -> None:
    for raw in iter(stream.readline, b""):
        log_file.write(raw)
        log_file.flush()
        if echo is not None:
            echo.write(f"{prefix}{raw.decode(errors='replace')}")
            echo.flush()


def log_name(index: int, node: str = "") -> str:
    """An instance's log file name; ``node`` names the machine in a multi-node job (``node1``),
    so that nodes sharing a log folder (one machine, or a shared file system) never collide.

    >>> log_name(0), log_name(0, "node1")
    ('instance_0.log', 'node1_instance_0.log')
    """
    return f"{node}_instance_{index}.log" if node else f"instance_{index}.log"


def instance_dirs(root: str, count: int) -> list[str]:
    """A working directory per instance, ROOT/instance_N (created): copies of one script that
    write files (checkpoints, logs, caches) then never collide."""
    dirs = [os.path.abspath(os.path.join(root, f"instance_{i}")) for i in range(count)]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    return dirs


def absolute_paths(command: list[str]) -> list[str]:
    """The command with every word that names an existing file or folder here made absolute, so
    that it runs the same from another working directory (``instance_dirs``)."""
    return [os.path.abspath(w) if not w.startswith("-") and os.path.exists(w) else w for w in command]


def run_command_plan(plan: LaunchPlan, log_dir: str, echo=sys.stdout, grace_s: float = 5.0, node: str = "",
                     timeout_s: float | None = None, cwds: list[str] | None = None) -> dict:
    """Run a user command plan: each instance's output to its own log (and echoed with a prefix);
    ``node`` goes into the log names of a multi-node job (``log_name``). After ``timeout_s``
    every instance still running is stopped and the outcome says ``timed_out``. ``cwds``: each
    instance's working directory (``instance_dirs``), else this one's.

    When an instance fails, the others are stopped (SIGTERM, then SIGKILL after a grace
    period). Returns {"returncode", "instances": [{index, cores, returncode, log}], "failed"}.
    """
    import threading

    os.makedirs(log_dir, exist_ok=True)
    procs, pumps, files = [], [], []
    for inst in plan.instances:
        path = os.path.join(log_dir, log_name(inst.index, node))
        f = open(path, "wb")
        files.append((f, path))
        proc = subprocess.Popen(list(inst.argv), env=dict(os.environ, **inst.env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=cwds[inst.index] if cwds else None)
        procs.append(proc)
        t = threading.Thread(target=_pump, args=(proc.stdout, f"[{inst.index}] ", f, echo), daemon=True)
        t.start()
        pumps.append(t)
    failed, timed_out = None, False
    deadline = time.monotonic() + timeout_s if timeout_s else None
    try:
        while any([p.poll() is None for p in procs]):  # a list: poll every process, not just the first
            bad = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if bad:
                failed = bad[0]
                break
            if deadline is not None and time.monotonic() > deadline:
                failed, timed_out = next(i for i, p in enumerate(procs) if p.poll() is None), True
                break
            time.sleep(0.05)
    finally:
        if failed is not None or any(p.poll() is None for p in procs):
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.05)
            _kill(procs)
        for t in pumps:
            t.join(5)
        for f, _ in files:
            f.close()
    if failed is None:
        failed = next((i for i, p in enumerate(procs) if p.returncode != 0), None)
    instances = [{"index": inst.index, "cores": list(inst.cores), "returncode": p.returncode, "log": path}
                 for inst, p, (_, path) in zip(plan.instances, procs, files)]
    return {"returncode": procs[failed].returncode if failed is not None else 0, "failed": failed,
            "instances": instances, "timed_out": timed_out}
