"""Running measured processes: a plan's workers (``run_plan``), a user's command plan
(``run_command_plan``), and the RunResult that a plan's workers make together.

``planning.build_plan`` decides argv, environment and cores (pure); this module is where they
are spawned, watched, stopped and read back. A failing or hanging worker gives a result with
status ``failed``, ``unsupported`` or ``timeout`` and the tail of its stderr; the caller's
sweep goes on. Other measured processes (ceilings, replays, kernel benchmarks, probes) start
through ``runtimes.run_json_module``. What of the caller's environment reaches the processes
(``provenance.measuring_env``) is recorded with each result as ``caller_env``.

What ``make_result`` adds to the instances' results:

- ``samples_per_s``: the samples of all instances' timed steps divided by the window from
  the first instance's start of timed steps to the last one's end (wall clock, recorded
  by each worker), not a sum of rates measured over different windows. Each instance's
  own rate stays in ``instances``.
- ``warmup_steps`` (the most any instance ran) and ``warmup_settled`` (all settled).
- ``compile_s`` (cold: first warm-up step with an empty Inductor cache) and
  ``compile_warm_s`` (the recompile after ``torch._dynamo.reset()`` with the cache filled).
  A run whose cache held an earlier compile (``inductor_cache``: "yours, filled: PATH", as in the
  climb's shared cache) compiled warm at its first step: that step is both.
- ``slow_steps`` (timed steps over 1.5 x the median) and ``mean_over_median`` (mean step /
  median step): how far slow steps moved the throughput, which stays total samples over
  total time.
- ``machine_state`` (``load1``, ``usable_cpus``, ``threads``, ``previous_threads``,
  ``steal_pct``, ``others_pct``, ``round_trip_ns``, ``round_trip_cpus``, ``loaded``; see
  ``is_loaded``) and ``code_version`` (package version and a hash of the measuring code).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib import metadata

from cpuopt_helpers import stats
from cpuopt_helpers.config import PLACEMENT_FIELDS, RunConfig
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.planning import LaunchPlan, Machine, build_plan
from cpuopt_helpers.provenance import (PREVIOUS_RUN_MEMORY_S, _load1, _read_text, code_version, machine_state,
                                       measuring_env, others_pct, run_threads, steal_pct, usable_cpus)
from cpuopt_helpers.system import Facts
from cpuopt_helpers.wording import BAD_INPUT, reason_line, refusal  # noqa: F401 (the CLI's and tests' names)
from cpuopt_helpers.worker import PROGRESS_KEY, REFUSAL, RESULT_KEY, UNSUPPORTED_EXIT

log = logging.getLogger(__name__)


STDERR_TAIL = 2000


# --- what a RunResult says about the machine and the code (pure functions, then readers) ---

_previous_run: dict = {}  # threads and end time of the last run this process launched


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


def reached(stdouts: list[str]) -> dict | None:
    """What the instances of a run that timed out had reached: every instance's last progress
    line (samples and seconds of timed steps), as a throughput; None where one had not timed any."""
    last = []
    for text in stdouts:
        lines = [line for line in text.splitlines() if line.startswith("{") and PROGRESS_KEY in line]
        try:
            last.append(json.loads(lines[-1])[PROGRESS_KEY] if lines else None)
        except (json.JSONDecodeError, KeyError):
            last.append(None)
    if not last or any(p is None or p["elapsed_s"] <= 0 for p in last):
        return None
    return {"samples_per_s": sum(p["samples"] for p in last) / max(p["elapsed_s"] for p in last),
            "steps": min(p["steps"] for p in last)}


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


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
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    key = json.dumps([fields, sys.executable, torch_version, code_version()["measuring_hash"]], sort_keys=True,
                     default=str)
    return str(build_dir() / "cache" / "flops" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json")


def run_plan(plan: LaunchPlan, facts: Facts | None = None) -> dict:
    """Start every instance together, wait up to the timeout, and build the RunResult."""
    config = plan.config
    workdir = tempfile.mkdtemp(prefix="cpuopt-run-")
    previous = _previous_run if time.monotonic() - _previous_run.get("end", -math.inf) < PREVIOUS_RUN_MEMORY_S else {}
    load1, stat_before = _load1(), _read_text("/proc/stat")
    procs, outs, errs = start_instances(plan, workdir)
    watch = Watch(procs, workdir, plan)
    try:
        status, reason = watch.wait(config.timeout_s)
    finally:
        _kill(procs)  # also stops the others when one failed, and on KeyboardInterrupt
    stat_after = _read_text("/proc/stat")
    threads = run_threads(config)
    _previous_run.update(end=time.monotonic(), threads=threads)
    cpus = sorted({c for inst in plan.instances for c in inst.cores}) if plan.pinning not in ("none", "run_cpu") \
        else None
    texts = [open(o, errors="replace").read() for o in outs]
    results = [_parse_instance(text) for text in texts]
    state = machine_state(load1, usable_cpus(len(os.sched_getaffinity(0)), _read_text("/sys/fs/cgroup/cpu.max")),
                          threads, steal_pct(stat_before, stat_after, cpus) if stat_before and stat_after else None,
                          previous.get("threads", 0), other_work(config, results), *round_trips(results))
    status, reason = watch.outcome(status, reason, results, errs)
    launcher_log = ""
    if plan.pinning == "run_cpu":  # what run_cpu decided, from its own log lines
        launcher_log = "\n".join(line for line in open(errs[0], errors="replace").read().splitlines()
                                 if " - INFO - " in line or " - WARNING - " in line)
    shutil.rmtree(workdir, ignore_errors=True)
    result = make_result(plan, status, reason, [r for r in results if r], facts, state)
    got = reached(texts) if status == "timeout" else None
    if got:  # scored at what it reached, so that its slowness counts against it
        result.update(reached_samples_per_s=got["samples_per_s"], reached_steps=got["steps"])
        head, sep, tail = result["reason"].partition("; stderr tail")
        result["reason"] = f"{head}; it reached {got['samples_per_s']:.2f} samples/s over {got['steps']} timed step(s)" \
                           + sep + tail
    if launcher_log:
        result["launcher_log"] = launcher_log
    return result


def round_trips(results: list[dict | None]) -> tuple[list[float] | None, list[list[int]] | None]:
    """The run's probe (``worker.round_trip_ns``): the longest of its instances' round trips before and
    after its timed steps, and the pairs of CPUs they timed; (None, None) where an instance has none
    (one CPU, or an older worker)."""
    trips = [r.get("round_trip_ns") for r in results if r]
    if not trips or None in trips:
        return None, None
    pairs = sorted(r.get("round_trip_cpus") or [] for r in results if r)
    return [max(t[0] for t in trips), max(t[1] for t in trips)], pairs


def other_work(config: RunConfig, results: list[dict | None]) -> float | None:
    """Other processes' share of the machine's CPU time during the timed steps, in percent
    (``provenance.others_pct``), from the worker's own readings. Only where one process is all
    the run's work: the instances of a multi-instance run time their steps in windows of their
    own, and DataLoader workers are processes of the run the worker does not count."""
    if config.instances != 1 or config.loader_workers or len(results) != 1 or not results[0]:
        return None
    jiffies, cpu = results[0].get("machine_jiffies"), results[0].get("cpu_s")
    if not jiffies or not cpu:
        return None
    return others_pct(jiffies["before"], jiffies["after"], cpu["user"] + cpu["system"], os.sysconf("SC_CLK_TCK"))


def keep_niceness(pid: int) -> None:
    """Give a process started in its own session this process's niceness where the scheduler weighs it.

    On Linux with autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``), a new
    session is a new scheduling group whose nice value is 0; the nice value of its processes only
    orders them within that group. Without this, a worker launched by ``nice -n 19 ...`` (make
    test's second half) competes as an equal with every other session's, and two trainings on the
    same cores slow each other many times over (OpenMP threads wait at each barrier for the one
    that lost its core). Where there is no autogroup, or the kernel refuses, nothing changes."""
    nice = os.nice(0)
    if nice <= 0:
        return
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass


def start_instances(plan: LaunchPlan, workdir: str) -> tuple[list[subprocess.Popen], list[str], list[str]]:
    """Every instance's process, its stdout and stderr files in ``workdir`` (also the peers' barrier)."""
    flops_file = flops_cache_file(plan.config)
    launch_wall = time.time()
    procs, outs, errs = [], [], []
    for inst in plan.instances:
        out, err = os.path.join(workdir, f"{inst.index}.out"), os.path.join(workdir, f"{inst.index}.err")
        env = dict(os.environ, **inst.env, CPUOPT_BARRIER=workdir, CPUOPT_LAUNCH_TIME=repr(launch_wall),
                   CPUOPT_LAUNCHER_PID=str(os.getpid()))  # the worker ends with it (worker.end_with_launcher)
        if flops_file:
            env["CPUOPT_FLOPS_CACHE"] = flops_file
        with open(out, "wb") as fo, open(err, "wb") as fe:
            procs.append(subprocess.Popen(list(inst.argv), env=env, stdout=fo, stderr=fe,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        keep_niceness(procs[-1].pid)
        outs.append(out)
        errs.append(err)
    return procs, outs, errs


FAILED_GRACE_S = 10.0  # how long a rank that failed first may take to exit (Watch.wait)


class Watch:
    """A plan's running instances: which failed first, and the run's status once they stopped."""

    def __init__(self, procs: list[subprocess.Popen], workdir: str, plan: LaunchPlan):
        self.procs, self.workdir, self.plan = procs, workdir, plan
        self.seen_exit: dict[int, float] = {}  # instance -> when this launcher first saw it exited

    def failed_at(self, i: int) -> float:
        """When instance i said it failed (worker.note_failure), else infinity."""
        try:
            return float(open(os.path.join(self.workdir, f"{self.plan.instances[i].index}.failed")).read())
        except (OSError, ValueError):
            return math.inf

    def failed_first(self) -> list[int]:
        """Instances that failed, the first to fail first: those that exited with a non-zero code,
        and those that said they failed (worker.note_failure) and are still exiting. A DDP rank
        whose peer crashed fails too, a moment later, and may exit first: the crashed peer's own
        exit can take longer (its teardown, or a loaded machine); the first to fail is the cause."""
        now = time.monotonic()
        for i, p in enumerate(self.procs):
            if p.returncode is not None:
                self.seen_exit.setdefault(i, now)
        failed = (i for i, p in enumerate(self.procs) if p.returncode not in (None, 0) or self.failed_at(i) < math.inf)
        return sorted(failed, key=lambda i: (self.failed_at(i), self.seen_exit.get(i, math.inf), i))

    def wait(self, timeout_s: float) -> tuple[str, str]:
        """Poll until every instance exited, one failed, or the timeout: (status, reason). Once
        one exited failing, an instance that said it failed before it is given up to
        ``FAILED_GRACE_S`` to exit, so that the reason names the cause with its exit code."""
        deadline, grace = time.monotonic() + timeout_s, None
        while any([p.poll() is None for p in self.procs]):  # a list: poll every process, not just the first
            failed = self.failed_first()
            if any(self.procs[i].returncode not in (None, 0) for i in failed):
                first = self.procs[failed[0]]
                grace = grace or time.monotonic() + FAILED_GRACE_S
                if first.returncode is not None or time.monotonic() > grace:
                    return "failed", f"instance {failed[0]} " + (f"exited with code {first.returncode}"
                                                                if first.returncode is not None else "failed")
            if time.monotonic() > deadline:
                return "timeout", f"no result within the {timeout_s:.0f} s timeout"
            time.sleep(0.02)
        return "ok", ""

    def outcome(self, status: str, reason: str, results: list, errs: list[str]) -> tuple[str, str]:
        """The run's status once every instance stopped: a non-zero exit, a missing result or a CPU
        without the kernel (``worker.UNSUPPORTED_EXIT``), with the first failure's stderr tail."""
        failed = self.failed_first()
        if status == "ok" and failed:
            status, reason = "failed", f"instance {failed[0]} exited with code {self.procs[failed[0]].returncode}"
        if status == "ok" and any(r is None for r in results):
            status, reason = "failed", "a worker exited without printing its result"
        if status == "ok":
            return status, reason
        order = self.failed_first()  # the first to fail, passing over those this launcher killed (-9)
        bad = next((i for i in order if self.procs[i].returncode != -9), order[0] if order else 0)
        if status == "failed" and self.procs[bad].returncode == UNSUPPORTED_EXIT:  # see worker.UNSUPPORTED_SIGNS
            status, reason = "unsupported", "this CPU has no kernel for it"
        tail = _tail(errs[bad])
        said = [line[len(REFUSAL):] for line in tail.splitlines() if line.startswith(REFUSAL)]
        if status == "failed" and self.procs[bad].returncode == 2 and said:  # the worker refused its input
            reason = f"{BAD_INPUT}{said[-1]} (instance {bad})"
        return status, f"{reason}; stderr tail of instance {bad}:\n{tail}"


def make_result(plan: LaunchPlan, status: str, reason: str, instances: list[dict], facts: Facts | None,
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
        "slow_steps": None, "mean_over_median": None, "system_share": None, "page_faults_per_step": None,
        "machine_state": machine, "code_version": code_version(),
        "env": {k: v for k, v in plan.instances[0].env.items()} if plan.instances else {},
        "caller_env": measuring_env(os.environ),
        "argv": [list(i.argv) for i in plan.instances], "pinning": plan.pinning,
        "warnings": list(plan.warnings), "versions": {},
        "system": facts.fingerprint if facts else None,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if status != "ok" or not instances:
        return result
    instances = sorted(instances, key=lambda r: r["index"])
    result.update(measured(config, instances))
    return result


def instance_row(r: dict) -> dict:
    """One instance's part of a RunResult, from its worker's result."""
    total = sum(r["step_s"])
    return {
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
    }


KERNEL_SHARE = 0.15  # the kernel's share of the timed steps' CPU time from which a page or notebook says so


def kernel_time(instances: list[dict]) -> dict:
    """The kernel's part of the timed steps' CPU time (``system_share``) and the page faults a step,
    over all instances; None where a worker did not say (an older one)."""
    cpu = [r.get("cpu_s") for r in instances]
    if not all(cpu):
        return {"system_share": None, "page_faults_per_step": None}
    used = sum(c["user"] + c["system"] for c in cpu)
    return {"system_share": sum(c["system"] for c in cpu) / used if used > 0 else None,
            "page_faults_per_step": sum(c["page_faults"] / max(1, len(r["step_s"])) for c, r in zip(cpu, instances))}


def measured(config: RunConfig, instances: list[dict]) -> dict:
    """What the instances measured together (see the module docstring)."""
    per_instance = [instance_row(r) for r in instances]
    pooled = [s * 1e3 for r in instances for s in r["step_s"]]
    first = instances[0]
    flops = first["flops_per_step"]
    samples_per_s, window = aggregate_samples_per_s(instances)
    compiled = bool(config.compile)
    out = {
        "samples_per_s": samples_per_s,
        "timed_window_s": window,
        "warmup_steps": max(i["warmup_steps"] for i in per_instance),
        "warmup_settled": all(bool(i["warmup_settled"]) for i in per_instance),
        **slow_step_summary(pooled),
        "step_ms": stats.summarize(pooled),
        "step_cv": stats.step_cv(pooled),
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
        "fallbacks": list({f["what"]: f for r in instances for f in r.get("fallbacks", [])}.values()),
        **kernel_time(instances),
        "compile_s": max(i["warmup_s"][0] for i in per_instance) if compiled else None,
        "compile_warm_s": (max(i["compile_warm_s"] for i in per_instance)
                           if compiled and all(i["compile_warm_s"] is not None for i in per_instance) else None),
    }
    if config.mode == "ddp":
        out.update(backend=first["backend"], param_checksums=first["param_checksums"],
                   params_in_sync=all(r["params_in_sync"] for r in instances),
                   global_batch=sum(i["batch_size"] for i in per_instance))
    return out


def run(config: RunConfig, facts: Facts | None = None) -> dict:
    """Plan and run one configuration on this machine."""
    return run_plan(build_plan(config, Machine.this()), facts)


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


# Run before a user's program (`cpuopt launch`, a compare --script arm): it asks Linux to send it SIGTERM
# when cpuopt dies (PR_SET_PDEATHSIG, kept across exec), then becomes the program. A cpuopt killed outright
# (`kill -9`, the OOM killer) cannot stop what it started, which runs in a session of its own.
GUARD = """import ctypes, os, sys
ctypes.CDLL(None).prctl(1, 15)
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    print(f"cpuopt: cannot run {sys.argv[2]}: {exc.strerror}", file=sys.stderr)
    os._exit(127)
"""


def findable(program: str, env: dict, cwd: str | None = None) -> None:
    """Refuse (one line, exit 2) a ``program`` that ``env``'s PATH (or, with a slash, ``cwd``) does not
    give, before anything starts: behind GUARD, or numactl, it would fail in each instance instead."""
    where = (os.path.join(cwd or os.getcwd(), program) if os.sep in program
             else shutil.which(program, path=env.get("PATH", os.defpath)))
    if not (where and os.path.isfile(where) and os.access(where, os.X_OK)):
        raise CpuoptError(f"cannot run {program}: no such program "
                          f"{'at that path' if os.sep in program else 'on PATH'}; give its path, or install it")


def _all_findable(plan: LaunchPlan, cwds: list[str] | None) -> None:
    """``findable`` for what each instance starts (numactl, taskset or the program), before any starts."""
    for inst in plan.instances:
        findable(inst.argv[0], dict(os.environ, **inst.env), cwds[inst.index] if cwds else None)


def ending_with_this(argv: list[str]) -> list[str]:
    """``argv`` run through GUARD, so it ends (SIGTERM) if this process dies; as it is off Linux."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", GUARD, str(os.getpid()), *argv]


def run_command_plan(plan: LaunchPlan, log_dir: str, echo=sys.stdout, grace_s: float = 5.0, node: str = "",
                     timeout_s: float | None = None, cwds: list[str] | None = None) -> dict:
    """Run a user command plan: each instance's output to its own log (and echoed with a prefix);
    ``node`` goes into the log names of a multi-node job (``log_name``). After ``timeout_s``
    every instance still running is stopped and the outcome says ``timed_out``. ``cwds``: each
    instance's working directory (``instance_dirs``), else this one's.

    When an instance fails, the others are stopped (SIGTERM, then SIGKILL after a grace
    period); when this process dies, each instance's program gets SIGTERM (``ending_with_this``; what
    it started itself ends only where it stops it, as torchrun does its ranks).
    Returns {"returncode", "instances": [{index, cores, returncode, log}], "failed"}.
    """
    import threading

    os.makedirs(log_dir, exist_ok=True)
    _all_findable(plan, cwds)
    procs, pumps, files = [], [], []
    for inst in plan.instances:
        path = os.path.join(log_dir, log_name(inst.index, node))
        f = open(path, "wb")
        files.append((f, path))
        proc = subprocess.Popen(ending_with_this(inst.argv), env=dict(os.environ, **inst.env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=cwds[inst.index] if cwds else None)
        keep_niceness(proc.pid)
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
