"""RunConfig -> LaunchPlan -> worker processes -> RunResult.

``build_plan`` is pure: from a validated config, the machine's facts and the caller's
environment it decides the interpreter, argv, environment and cores of every instance.
``run_plan`` is the one place that spawns processes.

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

Pinning: ``numactl --physcpubind=CORES --membind=NODES`` when numactl works, else
``taskset -c CORES``, else the worker pins itself with ``os.sched_setaffinity``.
"""

from __future__ import annotations

import json
import logging
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

from cpuopt_helpers import runtimes, stats, system
from cpuopt_helpers.config import RunConfig, validate
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.worker import RESULT_KEY

log = logging.getLogger(__name__)

JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto"
KMP_AFFINITY = "granularity=fine,compact,1,0"
USER_WINS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MALLOC_CONF", "KMP_AFFINITY", "KMP_BLOCKTIME")
STDERR_TAIL = 2000


@dataclass(frozen=True)
class Machine:
    """What the planner needs to know about the machine (tests build fake ones)."""

    topology: system.Topology
    libraries: dict  # kind (jemalloc, tcmalloc, iomp) -> path or None
    numactl: bool
    taskset: bool

    @classmethod
    def this(cls) -> "Machine":
        return cls(system.topology(), {k: system.locate_library(k) for k in ("jemalloc", "tcmalloc", "iomp")},
                   system.numactl_status()["works"], shutil.which("taskset") is not None)


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


def assign_cores(topology: system.Topology, instances: int, threads: int,
                 affinity: str = "compact") -> list[tuple[int, ...]]:
    """Disjoint core sets, one thread per physical core first and SMT siblings after.

    compact: each instance takes consecutive cores (inside one socket where it fits);
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
    csv = ",".join(map(str, group))
    if pinning == "numactl":
        nodes = ",".join(str(n) for n in sorted({topo.node_of(c) for c in group}))
        return ["numactl", f"--physcpubind={csv}", f"--membind={nodes}"]
    if pinning == "taskset":
        return ["taskset", "-c", csv]
    return []


def run_cpu_argv(config: RunConfig, python: str) -> list[str]:
    """PyTorch's own launcher with its defaults, running the worker script (run_cpu wants a .py file)."""
    from cpuopt_helpers import worker

    return [python, "-m", "torch.backends.xeon.run_cpu", worker.__file__, "--config", config.to_json()]


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
    config = validate(config, topo.logical_cores, topo.physical_cores, check_workload=command is None)
    if config.kmp_blocktime is not None and config.omp_runtime != "intel":
        raise CpuoptError("KMP_BLOCKTIME only applies to Intel OpenMP; add --omp-runtime intel")
    python = python or runtimes.resolve_python(config.runtime)
    if config.ipex:
        probed = runtimes.probe(python)
        if not probed["ipex_usable"]:
            raise CpuoptError(f"--ipex cannot run under {python}: {probed['reason']}")
    if config.launcher == "run_cpu":  # measured as users run it: run_cpu decides everything itself
        env = {"PYTHONPATH": python_path(base_env)}
        if sys.prefix != sys.base_prefix:  # as in an activated venv, where run_cpu looks for libraries
            env["VIRTUAL_ENV"] = sys.prefix
        inst = InstancePlan(0, tuple(c.cpu for c in topo.cpus), tuple(run_cpu_argv(config, python)), env)
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
    config = validate(config.replace(instances=nproc), topo.logical_cores, topo.physical_cores, check_workload=False)
    groups = list(config.cores) if config.cores else assign_cores(topo, nproc, config.threads, config.affinity)
    env, warnings = plan_env(config, machine, base_env)
    pinning = "numactl" if machine.numactl else "sched_setaffinity"
    env.update(CPUOPT_RANK_CORES=";".join(",".join(map(str, g)) for g in groups), CPUOPT_PINNING=pinning,
               CPUOPT_RANK_NODES=";".join(",".join(str(n) for n in sorted({topo.node_of(c) for c in g}))
                                          for g in groups))
    argv = [python or sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", *torchrun_args,
            "-m", "cpuopt_helpers.rank_exec", *command]
    cores = tuple(c for g in groups for c in g)
    for w in warnings:
        log.warning(w)
    return LaunchPlan(config, (InstancePlan(0, cores, tuple(argv), env),), "torchrun+" + pinning, tuple(warnings))


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


def run_plan(plan: LaunchPlan, facts: dict | None = None) -> dict:
    """Start every instance together, wait up to the timeout, and build the RunResult."""
    config = plan.config
    workdir = tempfile.mkdtemp(prefix="cpuopt-run-")
    procs, outs, errs = [], [], []
    launch_wall = time.time()
    for inst in plan.instances:
        out, err = os.path.join(workdir, f"{inst.index}.out"), os.path.join(workdir, f"{inst.index}.err")
        env = dict(os.environ, **inst.env, CPUOPT_BARRIER=workdir, CPUOPT_LAUNCH_TIME=repr(launch_wall))
        with open(out, "wb") as fo, open(err, "wb") as fe:
            procs.append(subprocess.Popen(list(inst.argv), env=env, stdout=fo, stderr=fe,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        outs.append(out)
        errs.append(err)
    deadline = time.monotonic() + config.timeout_s
    status, reason = "ok", ""
    try:
        while any([p.poll() is None for p in procs]):  # a list: poll every process, not just the first
            failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                status, reason = "failed", f"instance {failed[0]} exited with code {procs[failed[0]].returncode}"
                break
            if time.monotonic() > deadline:
                status, reason = "timeout", f"no result within the {config.timeout_s:.0f} s timeout"
                break
            time.sleep(0.02)
    finally:
        _kill(procs)  # also stops the others when one failed, and on KeyboardInterrupt
    if status == "ok":
        failed = [i for i, p in enumerate(procs) if p.returncode != 0]
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
        bad = next((i for i, p in enumerate(procs) if p.returncode not in (0, None, -9)), 0)
        reason = f"{reason}; stderr tail of instance {bad}:\n{_tail(errs[bad])}"
    shutil.rmtree(workdir, ignore_errors=True)
    result = make_result(plan, status, reason, [r for r in results if r], facts)
    if launcher_log:
        result["launcher_log"] = launcher_log
    return result


def make_result(plan: LaunchPlan, status: str, reason: str, instances: list[dict], facts: dict | None) -> dict:
    """Combine per-instance results into one RunResult (the DESIGN.md contract)."""
    config = plan.config
    result = {
        "config": config.to_dict(), "config_hash": config.config_hash(), "label": config.label(),
        "status": status, "reason": reason, "samples_per_s": None,
        "step_ms": stats.summarize([]), "phase_ms": {}, "peak_rss_mb": None,
        "loss_first": None, "loss_last": None, "flops_per_step": None, "achieved_gflops": None,
        "startup_s": None, "instances": [],
        "env": {k: v for k, v in plan.instances[0].env.items()} if plan.instances else {},
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
            "step_ms": stats.summarize([s * 1e3 for s in r["step_s"]]),
            "peak_rss_mb": r["peak_rss_mb"],
            "startup_s": r["first_step_wall"] - r["launch_wall"],
        })
    pooled = [s * 1e3 for r in instances for s in r["step_s"]]
    first = instances[0]
    flops = first["flops_per_step"]
    result.update({
        "samples_per_s": sum(i["samples_per_s"] for i in per_instance),
        "step_ms": stats.summarize(pooled),
        "phase_ms": {k: stats.summarize([s * 1e3 for r in instances for s in r["phase_s"][k]])["median"]
                     for k in first["phase_s"]},
        "peak_rss_mb": max(i["peak_rss_mb"] for i in per_instance),
        "loss_first": first["loss_first"], "loss_last": first["loss_last"],
        "flops_per_step": flops,
        "achieved_gflops": (sum(flops * len(r["step_s"]) / sum(r["step_s"]) for r in instances) / 1e9
                            if flops else None),
        "startup_s": max(i["startup_s"] for i in per_instance),
        "onednn_logs": [r["onednn_log"] for r in instances if r.get("onednn_log")],
        "onednn_log_steps": config.steps if config.onednn_verbose else None,
        "traces": [r["trace"] for r in instances if r.get("trace")],
        "instances": per_instance,
        "versions": first["versions"],
        "notes": first.get("notes", []),
        "compile_s": max(i["warmup_s"][0] for i in per_instance) if config.compile else None,
    })
    if config.mode == "ddp":
        result.update(backend=first["backend"], param_checksums=first["param_checksums"],
                      params_in_sync=all(r["params_in_sync"] for r in instances),
                      global_batch=sum(i["batch_size"] for i in per_instance))
    return result


def run(config: RunConfig, facts: dict | None = None) -> dict:
    """Plan and run one configuration on this machine."""
    return run_plan(build_plan(config, Machine.this()), facts)


def run_json_module(module: str, args: list[str], env: dict, timeout_s: float, what: str) -> object:
    """Run `python -m module args` in a fresh process with `env`; return its last stdout line as JSON.

    For measurements outside the training worker (ceilings, replays, accuracy): the
    process starts with its threads fixed, like every measured run.
    """
    proc = subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


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


def run_command_plan(plan: LaunchPlan, log_dir: str, echo=sys.stdout, grace_s: float = 5.0) -> dict:
    """Run a user command plan: each instance's output to its own log (and echoed with a prefix).

    When an instance fails, the others are stopped (SIGTERM, then SIGKILL after a grace
    period). Returns {"returncode", "instances": [{index, cores, returncode, log}], "failed"}.
    """
    import threading

    os.makedirs(log_dir, exist_ok=True)
    procs, pumps, files = [], [], []
    for inst in plan.instances:
        path = os.path.join(log_dir, f"instance_{inst.index}.log")
        f = open(path, "wb")
        files.append((f, path))
        proc = subprocess.Popen(list(inst.argv), env=dict(os.environ, **inst.env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        procs.append(proc)
        t = threading.Thread(target=_pump, args=(proc.stdout, f"[{inst.index}] ", f, echo), daemon=True)
        t.start()
        pumps.append(t)
    failed = None
    try:
        while any([p.poll() is None for p in procs]):  # a list: poll every process, not just the first
            bad = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if bad:
                failed = bad[0]
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
            "instances": instances}
