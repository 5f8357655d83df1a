"""The worker's own overhead: launch to first step, and per-step timing cost vs a bare loop.

Run with `make overhead`. Prints a JSON summary; the README quotes it.
"""

import json
import statistics
import sys
import time

from cpuopt_helpers import compare, launch, planning, stats, system
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.worker import prepare

ROUNDS, STEPS = 7, 30


def startup(repeats: int = 5) -> dict:
    """Seconds from Popen to the first training step, over fresh worker processes."""
    runs = [launch.run(RunConfig(steps=2, warmup=1)) for _ in range(repeats)]
    return stats.summarize([r["startup_s"] for r in runs if r["status"] == "ok"])


def per_step_overhead() -> dict:
    """Instrumented step (3 phase clocks + loss.item()) vs the same work with no clocks.

    Blocks of each are interleaved (A B A B ...) in one process so drift hits both.
    """
    config = RunConfig(threads=planning.default_threads(system.topology()))  # the usable physical cores
    prepared = prepare(config)
    for _ in range(5):
        prepared.step()
    bare, timed = [], []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        for _ in range(STEPS):
            prepared.bare_step()
        bare.append((time.perf_counter() - t) / STEPS)
        t = time.perf_counter()
        for _ in range(STEPS):
            prepared.step()
        timed.append((time.perf_counter() - t) / STEPS)
    diffs_us = [(b - a) * 1e6 for a, b in zip(bare, timed)]
    return {"bare_step_ms": statistics.median(bare) * 1e3, "timed_step_ms": statistics.median(timed) * 1e3,
            "overhead_us_median": statistics.median(diffs_us), "timed_over_bare": compare.paired_ratio(bare, timed),
            "rounds": ROUNDS, "steps_per_round": STEPS}


if __name__ == "__main__":
    result = {"workload": "cnn quick", "startup_s": startup(), "per_step": per_step_overhead()}
    json.dump(result, sys.stdout, indent=2)
    print()
