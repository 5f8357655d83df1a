"""Step-time statistics: medians and spread (comparisons and intervals live in compare.py)."""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Sequence

# Spread (p90 - p10) / median above which a measurement is flagged as untrustworthy.
WIDE_SPREAD = 0.5


def time_calls(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Seconds per call of `fn`, after untimed warm-up calls (first calls pay allocation and JIT)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile, q in [0, 1]."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict:
    """Median, p10, p90 and count of a list of timings."""
    values = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not values:
        return {"median": math.nan, "p10": math.nan, "p90": math.nan, "n": 0}
    return {"median": statistics.median(values), "p10": quantile(values, 0.1),
            "p90": quantile(values, 0.9), "n": len(values)}


def relative_spread(values: Sequence[float]) -> float:
    """(p90 - p10) / median: 0 for identical values."""
    s = summarize(values)
    return (s["p90"] - s["p10"]) / s["median"] if s["n"] and s["median"] else math.nan


def spread_warning(values: Sequence[float], label: str = "measurement", limit: float = WIDE_SPREAD) -> str | None:
    """A sentence when the spread is too wide to trust a comparison, else None (below 5 runs the
    spread said is the range: percentiles of so few values mean nothing)."""
    spread = relative_spread(values)
    if len(values) >= 2 and spread > limit:
        said = (f"spread p10-p90 is {spread:.0%} of the median over {len(values)} runs" if len(values) >= 5 else
                f"its {len(values)} runs range from {min(values):.3g} to {max(values):.3g}, "
                f"{(max(values) - min(values)) / statistics.median(values):.0%} of their median")
        return f"{label}: {said}; the machine is noisy, add repeats before trusting small differences"
    return None


def step_cv(step_ms: Sequence[float]) -> float | None:
    """The timed steps' coefficient of variation (sample sd over mean); None below two steps."""
    values = [float(v) for v in step_ms if v is not None and not math.isnan(v)]
    if len(values) < 2 or not statistics.fmean(values):
        return None
    return statistics.stdev(values) / statistics.fmean(values)


def steady_window(comparisons: list[list[tuple[dict, dict]]]) -> dict | None:
    """Whether runs time enough steps: the share of a paired comparison's noise that the steps'
    own noise explains. A run's mean over ``n`` steps of coefficient of variation ``cv`` varies by
    about ``cv**2 / n`` (in log terms) from its steps alone, so a round's log ratio log(b/a) varies
    by cv_a²/n_a + cv_b²/n_b from the steps, and by what differs between the two processes
    besides; the machine's drift, shared by a round's runs, cancels. ``comparisons``: the rounds
    of each comparison as (a, b) runs (``step_cv`` and ``step_ms["n"]`` recorded), those of 3
    rounds or more pooled. Steady when the steps explain under half: more steps a run would then
    narrow an interval less than more rounds would."""
    within, between, rounds = [], [], 0
    for pairs in comparisons:
        usable = [(a, b) for a, b in pairs if all(r.get("step_cv") is not None and r["step_ms"]["n"] >= 2
                                                  and r["samples_per_s"] for r in (a, b))]
        if len(usable) < 3:
            continue
        within.append(statistics.fmean(sum(r["step_cv"] ** 2 / r["step_ms"]["n"] for r in pair) for pair in usable))
        between.append(statistics.variance([math.log(b["samples_per_s"] / a["samples_per_s"]) for a, b in usable]))
        rounds += len(usable)
    if not between:
        return None
    w, b = statistics.fmean(within), statistics.fmean(between)
    share = min(1.0, w / b) if b > 0 else 1.0
    return {"share": share, "steady": share < 0.5, "comparisons": len(between), "rounds": rounds}
