"""What a RunResult says about where it ran: the caller's environment, the machine's state
around the run, and the version of the measuring code.

Pure functions first (parsers and rules, tested with canned text), then the readers of this
machine. ``results`` keys sweeps by ``code_version`` and ``measuring_env``; the launcher
records ``machine_state`` with every run.
"""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cpuopt_helpers.config import RunConfig

# What of the caller's environment reaches a measured process and changes what it does:
# recorded with each result and part of a sweep's identity (results.sweep_id).
MEASURING_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_", "ONEDNN_", "DNNL_", "MALLOC_", "TORCHINDUCTOR_", "LD_PRELOAD")


def measuring_env(base_env) -> dict:
    """The caller's variables that a measured process would see and act on."""
    return {k: v for k, v in sorted(base_env.items()) if k.startswith(MEASURING_PREFIXES)}


STEAL_LOADED_PCT = 5.0  # more of the run's CPU time than this stolen by the hypervisor: loaded
OTHERS_LOADED_PCT = 5.0  # more of the run's CPUs' time than this spent on other work during the timed steps: loaded
BUSY_FIELDS = (0, 1, 2, 5, 6)  # /proc/stat's busy time: user, nice, system, irq, softirq (guest time is in user)


PREVIOUS_RUN_MEMORY_S = 300.0  # the 1-minute load average forgets a run within ~5 minutes (e^-5)


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


def others_pct(before: list[int], after: list[int], own_s: float, hz: int) -> float | None:
    """Percent of the CPU time of the run's CPUs during the timed steps that went to other work: the
    busy time /proc/stat counts over them (``BUSY_FIELDS``; the worker sums the CPUs it may run on)
    less the run's own CPU time (``own_s``, its threads' user and system seconds), over all the CPU
    time that passed (idle and steal included). Any other runnable process can slow a run whose threads fill every core.
    The run's own helper processes count as other work: Inductor's compile workers after a cold
    compile take CPU time from the timed steps all the same. None where the readings do not say."""
    if len(before) < 8 or len(after) < 8 or hz <= 0:
        return None
    total = sum(after[:8]) - sum(before[:8])
    if total <= 0:
        return None
    busy = sum(after[i] - before[i] for i in BUSY_FIELDS)
    return max(0.0, 100.0 * (busy - own_s * hz) / total)


def usable_cpus(affinity: int, cpu_max: str | None = None) -> int:
    """CPUs this process may use: its affinity, lowered by a cgroup v2 quota ("QUOTA PERIOD" or "max PERIOD")."""
    if cpu_max:
        quota, _, period = cpu_max.strip().partition(" ")
        if quota != "max" and quota.isdecimal() and period.strip().isdecimal() and int(period) > 0:
            return max(1, min(affinity, math.ceil(int(quota) / int(period))))
    return affinity


def load_margin(usable: int) -> float:
    """Load beyond our own threads that still counts as quiet: the launcher and daemons (1), or 10% of the CPUs."""
    return max(1.0, 0.1 * usable)


def is_loaded(load1: float | None, usable: int, steal: float | None, previous_threads: int = 0,
              others: float | None = None) -> bool:
    """Was the machine busy with other work around this run? The rule:

    loaded when the hypervisor stole more than 5% of the CPU time on the run's cores, or when
    other processes took more than ``OTHERS_LOADED_PCT`` of the machine's CPU time during the
    timed steps (``others_pct``: the one reading of the timed window itself), or when the
    1-minute load average before launch exceeds what our own work can explain plus a margin.
    Runs go back to back, so the load includes our previous run: it can keep up to one
    runnable thread per usable CPU, or its own thread count when it oversubscribed
    (``previous_threads``, known when this process launched it within the last 5 minutes).
    Margin: ``load_margin``. So: load1 > max(usable, previous_threads) + margin. The load
    average lags a minute behind: a short burst of other work during a run passes it unseen.
    """
    if steal is not None and steal > STEAL_LOADED_PCT:
        return True
    if others is not None and others > OTHERS_LOADED_PCT:
        return True
    return load1 is not None and load1 > max(usable, previous_threads) + load_margin(usable)


def run_threads(config: RunConfig) -> int:
    """Threads this run keeps busy: per instance, its compute threads and its DataLoader processes."""
    return config.instances * ((config.threads or 1) + config.loader_workers)


def machine_state(load1: float | None, usable: int, threads: int, steal: float | None,
                  previous_threads: int = 0, others: float | None = None,
                  round_trip_ns: list[float] | None = None, round_trip_cpus: list[list[int]] | None = None) -> dict:
    """The RunResult's ``machine_state``: what the machine was doing around the run, and the verdict;
    ``round_trip_ns``: the longest of its instances' round trips between two of their CPUs before and
    after its timed steps (the worker's probe: where a VM's host had put them), ``round_trip_cpus``
    the pairs timed."""
    return {"load1": load1, "usable_cpus": usable, "threads": threads, "previous_threads": previous_threads,
            "steal_pct": None if steal is None else round(steal, 3),
            "others_pct": None if others is None else round(others, 3),
            "round_trip_ns": round_trip_ns, "round_trip_cpus": round_trip_cpus,
            "loaded": is_loaded(load1, usable, steal, previous_threads, others)}


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


# The code that decides what a measurement is: a change here can change any number (planning.py: the
# plan's pinning and environment; rank_exec.py: a DDP rank's pinning, in the measured process).
MEASURING_SOURCES = ("worker.py", "launch.py", "planning.py", "rank_exec.py", "config.py", "flops.py", "fixes.py",
                     "workloads/*.py", "kernels/*.py")


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


# ------------------------------------------------------------------ this code's commit

ROOT = Path(__file__).resolve().parents[1]
NOT_A_CHECKOUT = "not a git checkout"


def _git(folder: Path, *args: str) -> str | None:
    """``git -C FOLDER ARGS``'s output, stripped; None where git or the checkout is missing."""
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def own_commit(root: Path = ROOT) -> str:
    """This code's commit: ``abc1234``, ``abc1234 with uncommitted changes``, or ``not a git
    checkout`` (also where the package lies inside some other repository's tree). A copy without
    git (a tree sent to another machine) names the commit it was copied from in ``CPUOPT_COMMIT``:
    ``abc1234 (CPUOPT_COMMIT; not a git checkout)``."""
    top = _git(root, "rev-parse", "--show-toplevel")
    short = _git(root, "rev-parse", "--short", "HEAD")
    if not top or not short or Path(top).resolve() != Path(root).resolve():
        given = os.environ.get("CPUOPT_COMMIT", "").strip()
        return f"{given} (CPUOPT_COMMIT; {NOT_A_CHECKOUT})" if given else NOT_A_CHECKOUT
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    return f"{short} with uncommitted changes" if dirty else short
