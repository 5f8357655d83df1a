"""The one line a training script adds so that `cpuopt compare --script` and `cpuopt tune
--script` read its throughput (standard library only: it imports nothing else).

Per step, with the samples the step trained on::

    from cpuopt_helpers import throughput
    for x, y in loader:
        ...                                  # forward, backward, optimizer step
        throughput.step(len(x))

The first ``CPUOPT_WARMUP_STEPS`` calls (default 3) are warm-up: the clock starts at the end
of the last of them, so first-call costs (oneDNN primitive creation, allocator growth) are
not timed. At exit the script prints one line, ``cpuopt-throughput: {...}``, with the
samples/s of the timed steps. Or, once, with a throughput the script computed itself::

    throughput.report(samples_per_s)

Without either, `cpuopt` reads a number from the script's output with ``--metric REGEX``, or
times the whole command.
"""

from __future__ import annotations

import atexit
import json
import os
import time

MARKER = "cpuopt-throughput: "
_state = {"steps": 0, "samples": 0, "start": None, "end": None, "registered": False, "reported": False}


def warmup_steps() -> int:
    """Calls before the clock starts: CPUOPT_WARMUP_STEPS (default 3), at least 1 (the first
    call can only start the clock)."""
    try:
        return max(1, int(os.environ.get("CPUOPT_WARMUP_STEPS", "3")))
    except ValueError:
        return 3


def step(samples: int) -> None:
    """One training step on ``samples`` samples has just ended."""
    now = time.perf_counter()
    _state["steps"] += 1
    if _state["steps"] == warmup_steps():
        _state["start"] = now
    elif _state["steps"] > warmup_steps():
        _state["samples"] += samples
        _state["end"] = now
    if not _state["registered"]:
        atexit.register(_at_exit)
        _state["registered"] = True


def report(samples_per_s: float, **extra) -> None:
    """Print the script's throughput in the line cpuopt reads (the last such line counts)."""
    _state["reported"] = True
    print(MARKER + json.dumps({"samples_per_s": float(samples_per_s), **extra}), flush=True)


def _at_exit() -> None:
    if _state["reported"]:
        return
    if _state["end"] is None or _state["end"] <= _state["start"]:
        print(f"{MARKER}{json.dumps({'samples_per_s': None, 'steps': _state['steps'], 'warmup': warmup_steps()})}",
              flush=True)  # too few steps to time: cpuopt says so
        return
    report(_state["samples"] / (_state["end"] - _state["start"]), steps=_state["steps"] - warmup_steps(),
           warmup=warmup_steps())
