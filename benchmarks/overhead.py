"""The worker's own overhead: launch to first step, and per-step timing cost vs a bare loop.

Run with `make overhead`. Prints a JSON summary; with ``--page FOLDER`` (as `make overhead`
gives ``docs/results``) also writes it as this machine's dated page FOLDER/DAY-CPU-ISA-overhead.md.
"""

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from cpuopt_helpers import compare, launch, planning, records, stats, system
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


def rows(result: dict) -> list[records.Row]:
    """The page's table from the JSON: launch to first step, the two steps, their difference and ratio."""
    start, step = result["startup_s"], result["per_step"]
    blocks = f"{step['rounds']} blocks of {step['steps_per_round']} steps"
    ratio = step["timed_over_bare"]
    interval = (f"{ratio.get('label', '95% CI')} {ratio['ci_low']:.3f}-{ratio['ci_high']:.3f}"
                if not math.isnan(ratio["ci_low"]) else "none (too few blocks)")
    return [records.Row("launch to first step (median)", f"{start['median']:.2f} s",
                        f"p10-p90 {start['p10']:.2f}-{start['p90']:.2f} s", f"{start['n']} fresh workers"),
            records.Row("bare step (median)", f"{step['bare_step_ms']:.2f} ms", "", blocks),
            records.Row("timed step (median)", f"{step['timed_step_ms']:.2f} ms", "", blocks),
            records.Row("timing overhead per step (median of the blocks' differences)",
                        f"{step['overhead_us_median']:.1f} µs", "", blocks),
            records.Row("timed step's time over the bare step's", f"{ratio['ratio']:.3f}x", interval,
                        f"{ratio['n']} paired blocks")]


def write_page(result: dict, folder: Path, **kwargs) -> Path:
    """FOLDER/DAY-CPU-ISA-overhead.md from the JSON (``kwargs``: records.write_record's facts, when, commit)."""
    notes = [f"Workload {result['workload']}: launch to first step over fresh worker processes (paid once per "
             "run, never timed); the worker's instrumented step (three phase clocks and `loss.item()`) against the "
             "same work in a bare loop, in interleaved blocks in one process. See docs/measuring.md, "
             "\"The worker's own overhead\"."]
    return records.write_record(folder, "overhead", "The worker's own overhead", rows(result), "make overhead",
                                notes=notes, preset=RunConfig().preset, **kwargs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", metavar="FOLDER", type=Path,
                    help="also write the dated page FOLDER/DAY-CPU-ISA-overhead.md (make overhead: docs/results)")
    args = ap.parse_args()
    result = {"workload": f"cnn {RunConfig().preset}", "startup_s": startup(), "per_step": per_step_overhead()}
    json.dump(result, sys.stdout, indent=2)
    print()
    if args.page:
        print(f"overhead: wrote {write_page(result, args.page)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
