"""The launch plan: RunConfig -> argv, environment and cores of every instance. Pure.

``build_plan`` decides, from a validated config, the machine (``Machine``: this one, or
another's saved facts) and the caller's environment, the interpreter, argv, environment and
cores of every instance; it spawns nothing (``launch.run_plan`` does). ``command_lines`` turns
a config into the lines that train with it: a `cpuopt bench` line, a `cpuopt launch` line
and plain shell.

Environment variables the plan sets (values already in the caller's environment win,
with a warning, except LD_PRELOAD, to which ours are appended):

{env_table}

Not set by the plan: TORCHINDUCTOR_CACHE_DIR. A compiled run's worker makes a fresh,
empty one itself before importing torch (and removes it), so ``compile_s`` is always a
cold compile, also when a user pastes the plan's command again; a plan-time temporary
folder would be filled by the first run and make a rerun silently warm. A value in the
caller's environment (or the config's ``env``) wins, with a warning.

Placement (``assign_cores``, affinity compact): instances never straddle a NUMA node or a
socket. Each takes one thread per physical core (SMT siblings only when the layout needs
more threads than cores), inside one (socket, node) where it fits, several to a node; an
instance larger than a node takes whole nodes of one socket, then whole sockets. Where a
node holds several L3 caches (AMD EPYC's core complexes: lscpu's L3 column), instances go
one cache each (the emptiest first), or several to a cache, whenever the whole layout fits
so: threads that share no L3 pass every shared cache line through the fabric. On 2026-12-05
a Zen 4 VM's host placed its two vCPUs now in one core complex and now in two, and
RetinaNet's steps ran slower while they were apart (data/vcpu_placement: an observation, not a
paired comparison; that guest is told one L3, so the placement itself is not measured there).
A layout that does not fit inside the caches, or would leave physical cores idle for SMT
siblings there, is placed by nodes, as before; one that does not fit that way is refused,
saying which thread count fits; ``--affinity scatter`` (spread across sockets on purpose) or
explicit ``--cores`` are the ways to ask for straddling. With no thread count given, each
instance gets the most physical cores that keep it inside its node (``default_threads``).

Pinning: ``numactl --physcpubind=CORES`` with the memory bound to the instance's node
(``--membind=NODE``; an instance spanning several nodes gets ``--localalloc``, since
``--membind`` to several nodes fills the lowest first) when numactl works, else
``taskset -c CORES`` (with a warning where numactl is present but refused: memory is then
not bound, and pages land on the node of the thread that first touches them), else the
worker pins itself with ``os.sched_setaffinity``.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field

from cpuopt_helpers import rank_exec, runtimes, system
from cpuopt_helpers.config import KNOBS, Knob, RunConfig, bench_line, knob_env, launch_line, validate
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.runtimes import python_path

log = logging.getLogger(__name__)


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
        topo, doctor = system.read_topology_file(path)
        if not doctor:
            return cls(topo, this_libraries(), True, True, source=path)
        numactl = doctor.get("numactl") or {}
        libraries = {**(doctor.get("allocators") or {}), "iomp": (doctor.get("openmp") or {}).get("intel")}
        return cls(topo, libraries, bool(numactl.get("works")), True,
                   numactl.get("reason", "") if numactl.get("present") and not numactl.get("works") else "",
                   source=path, facts=doctor)


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


def _fit(units: list[list[int]], instances: int, threads: int, spread: bool = False) -> list[list[int]] | None:
    """``instances`` groups of ``threads`` CPUs, each inside one unit (several to a unit): the first
    unit with room, or with ``spread`` the one with the most room left (instances share a unit only
    where they must); None when they do not all fit."""
    free = list(units)
    groups = []
    for _ in range(instances):
        room = [i for i, cpus in enumerate(free) if len(cpus) >= threads]
        if not room:
            return None
        i = max(room, key=lambda i: (len(free[i]), -i)) if spread else room[0]
        groups.append(free[i][:threads])
        free[i] = free[i][threads:]
    return groups


def _place(topology: system.Topology, instances: int, threads: int) -> list[list[int]] | None:
    """Core sets that keep every instance inside one L3 cache where they all fit so, else inside
    one NUMA node, or on whole nodes of one socket, or on whole sockets (see the module
    docstring); None when they do not fit so."""
    smt = instances * threads > topology.physical_cores
    first = set(topology.core_order()[:topology.physical_cores])  # one CPU per physical core
    nodes = [(socket, [c for c in cpus if smt or c in first]) for (socket, _), cpus in topology.domains().items()]
    caches = [[c for c in cpus if smt or c in first] for cpus in topology.caches().values()]
    if len(caches) > len(nodes):  # L3 caches smaller than a node (AMD's CCXs): inside one where all fit so,
        groups = _fit(caches, instances, threads, spread=True)  # and on as many physical cores as by node
        core = {c.cpu: (c.socket, c.core) for c in topology.cpus}
        if groups is not None and len({core[c] for g in groups for c in g}) >= min(topology.physical_cores,
                                                                                    instances * threads):
            return groups
    if threads <= max(len(cpus) for _, cpus in nodes):  # inside a node: first fit, several to a node
        return _fit([cpus for _, cpus in nodes], instances, threads)
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
        what = {"iomp": "Intel OpenMP (libiomp5.so) for --omp-runtime intel"}.get(kind, f"{kind} (--allocator {kind})")
        raise CpuoptError(f"{what} is not installed on this machine; install it: {system.INSTALL_HINTS[kind]} "
                          "(then `cpuopt doctor` shows it)")
    return path


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # thread counts (OpenMP's nested form: 4,2)


def plan_env(config: RunConfig, machine: Machine, base_env: dict,
             knobs: tuple[Knob, ...] = KNOBS) -> tuple[dict, list[str]]:
    """The variables a launch sets (the knobs' rows, see the table above), and warnings where
    the user's win."""
    env, kinds = knob_env(config, knobs)
    preload = [_library(machine, kind) for kind in kinds]
    env.update(dict(config.env))
    warnings = []
    wins = tuple(v for k in knobs for v, _, _ in k.env if v != "LD_PRELOAD")
    for where, given in (("your environment", base_env), ("--env", dict(config.env))):
        for key in THREAD_VARS:
            if key in given and not all(n.strip().isdecimal() and int(n) > 0 for n in given[key].split(",")):
                raise CpuoptError(f"{key}={given[key]!r} in {where} is not a thread count: unset it "
                                  "(cpuopt sets the threads; --threads N chooses them)")
    for key in wins:
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
    known = {c.cpu for c in topo.cpus}
    lacking = sorted({c for group in config.cores or () for c in group} - known)
    if lacking:  # said before the thread counts, which cores the machine lacks would make wrong
        raise CpuoptError(f"--cores names CPUs {system.format_cpu_list(lacking)} that this machine lacks; "
                          f"use CPUs from {system.format_cpu_list(known)} (see `cpuopt doctor`)")
    config = validate(config, topo.logical_cores, topo.physical_cores, check_workload=command is None)
    python = python or check_runtime(config, command)
    if config.launcher == "run_cpu":  # measured as users run it: run_cpu decides everything itself
        return run_cpu_plan(config, topo, base_env, python, command)
    cores = list(config.cores) if config.cores else assign_cores(  # oversubscribed: instances share cores
        topo, config.instances, min(config.threads, topo.logical_cores // config.instances), config.affinity)
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
    instances = [instance_plan(i, tuple(group), len(cores), env, pinning, topo, argv_tail, config.mode == "ddp")
                 for i, group in enumerate(cores)]
    for w in warnings:
        log.warning(w)
    return LaunchPlan(config, tuple(instances), pinning, tuple(warnings))


def check_runtime(config: RunConfig, command: list[str] | None) -> str:
    """The interpreter the worker runs under, once what the config asks of it is checked (zentorch
    installed for this torch, IPEX importable there): before any process starts."""
    if config.compile == "zentorch" and command is None:
        if config.runtime != "main":
            raise CpuoptError("--compile zentorch runs in this interpreter's torch (--runtime main) only")
        status = runtimes.zentorch_status()
        if not status["usable"]:
            raise CpuoptError(f"--compile zentorch: {status['reason']}")
    python = runtimes.resolve_python(config.runtime)
    if config.runtime not in ("main", "ipex"):
        probed = runtimes.probe(python)
        if probed["torch"] is None:
            why = probed["reason"] if probed["reason"].startswith("probing") else "torch is not installed there"
            raise CpuoptError(f"--runtime {config.runtime}: {why}; install torch in that interpreter "
                              "or give --runtime main")
    if config.ipex:
        probed = runtimes.probe(python)
        if not probed["ipex_usable"]:
            raise CpuoptError(f"--ipex cannot run under {python}: {probed['reason']}")
    return python


def run_cpu_plan(config: RunConfig, topo: system.Topology, base_env: dict, python: str,
                 command: list[str] | None) -> LaunchPlan:
    """PyTorch's own launcher on every CPU, deciding threads, pinning and libraries itself."""
    env = {"PYTHONPATH": python_path(base_env)}
    if sys.prefix != sys.base_prefix:  # as in an activated venv, where run_cpu looks for libraries
        env["VIRTUAL_ENV"] = sys.prefix
    argv = run_cpu_argv(config, python) if command is None else [command[0], "-m", RUN_CPU, *command[1:]]
    return LaunchPlan(config, (InstancePlan(0, tuple(c.cpu for c in topo.cpus), tuple(argv), env),), "run_cpu")


def instance_plan(index: int, group: tuple[int, ...], count: int, env: dict, pinning: str, topo: system.Topology,
                  argv_tail: list[str], ddp: bool) -> InstancePlan:
    """One instance: its cores, its pinning prefix and the variables that say which it is."""
    inst_env = dict(env, CPUOPT_INSTANCE=str(index), CPUOPT_INSTANCES=str(count), CPUOPT_PINNING=pinning)
    if ddp:
        inst_env.update(RANK=str(index), LOCAL_RANK=str(index))
    if pinning != "none":
        inst_env["CPUOPT_CORES"] = ",".join(map(str, group))
    prefix = pin_prefix(pinning, group, topo) if pinning != "none" else []
    return InstancePlan(index, group, tuple(prefix + list(argv_tail)), inst_env)


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


MAX_CPUS = 65536  # CPU numbers a core list may name (Linux's own limit is lower)


def parse_core_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cores = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            first, last = int(lo), int(hi or lo)
            if not 0 <= first <= last < MAX_CPUS:
                raise CpuoptError(f"core range {part.strip()!r} in {text!r} is not FIRST-LAST with 0 <= FIRST <= LAST "
                                  f"< {MAX_CPUS}; write the list like 0-3,8,10-11")
            cores += list(range(first, last + 1))
    except ValueError:
        raise CpuoptError(f"cannot read core list {text!r}; write it like 0-3,8,10-11") from None
    if len(set(cores)) != len(cores):
        raise CpuoptError(f"core list {text!r} names a core twice")
    return cores


def absolute_paths(command: list[str]) -> list[str]:
    """The command with every word that names an existing file or folder here made absolute, so
    that it runs the same from another working directory (``instance_dirs``)."""
    return [os.path.abspath(w) if not w.startswith("-") and os.path.exists(w) else w for w in command]


# What the plan sets besides the knobs' variables (config.KNOBS); both make the table above.
LAUNCH_ENV = (
    ("CPUOPT_CORES", "the instance's logical CPUs", "always"),
    ("CPUOPT_INSTANCE(S)", "index and count of instances", "always"),
    ("CPUOPT_PINNING", "numactl, taskset or sched_setaffinity", "always"),
    ("PYTHONPATH", "the current folder, then cpuopt_helpers' root", "always"),
    ("MASTER_ADDR/PORT, RANK, LOCAL_RANK, WORLD_SIZE", "torch.distributed's env:// rendezvous", "mode ddp"),
)


def env_table(knobs: tuple[Knob, ...] = KNOBS) -> str:
    """The table of every variable a launch sets: the knobs' rows, then the launcher's own."""
    rows = [("variable", "value", "when")] + [row for k in knobs for row in k.env] + list(LAUNCH_ENV)
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines[:1] + ["|" + "|".join("-" * (w + 2) for w in widths) + "|"] + lines[1:])


def command_lines(config: RunConfig, machine: Machine | None = None, command: list[str] | None = None) -> dict:
    """The lines that train with this configuration: ``bench`` (`cpuopt bench`, for a workload),
    ``launch`` (`cpuopt launch` running ``command``, a script, else python train.py) and ``shell``
    (the same as plain shell: variables and the pinning prefix, no cpuopt needed)."""
    words = command or ["python", "train.py"]
    lines = {"bench": bench_line(config) if config.workload != "script" else None,
             "launch": launch_line(config, shlex.join(words))}
    if machine is not None:
        single = config.replace(mode="independent", instances=1) if config.mode == "ddp" else config
        inst = build_plan(single, machine, command=words).instances[0]
        env = {k: v for k, v in inst.env.items() if not k.startswith("CPUOPT_") and k != "PYTHONPATH"}
        text = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())) + " " + shlex.join(inst.argv)
        if config.mode == "ddp" and config.instances > 1:
            text += f"   # one rank of {config.instances}: start each under torchrun on its own cores"
        elif config.instances > 1:
            text += (f"   # copy 1 of {config.instances}: start each on its own cores, in its own working "
                     "directory")
        lines["shell"] = text
    return lines


__doc__ = __doc__.replace("{env_table}", env_table())
