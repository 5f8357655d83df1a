"""Statistics over step times and repeats."""

import math

import pytest

from cpuopt_helpers import stats


def test_summarize_and_quantiles():
    s = stats.summarize([5, 1, 3, 2, 4])
    assert s == {"median": 3, "p10": pytest.approx(1.4), "p90": pytest.approx(4.6), "n": 5}
    assert stats.summarize([])["n"] == 0 and math.isnan(stats.summarize([])["median"])
    assert stats.summarize([2.0, float("nan"), None])["n"] == 1


def test_spread_warning_only_when_wide():
    assert stats.spread_warning([100, 101, 99, 100]) is None
    warning = stats.spread_warning([100, 200, 50, 100], "cnn")
    assert warning == ("cnn: its 4 runs range from 50 to 200, 150% of their median; the machine is noisy, add "
                       "repeats before trusting small differences")  # too few runs for percentiles: the range
    many = stats.spread_warning([100, 200, 50, 100, 100, 90], "cnn")
    assert many.startswith("cnn: spread p10-p90 is ") and "of the median over 6 runs; the machine is noisy" in many
    assert stats.spread_warning([100]) is None
    assert stats.relative_spread([1, 1, 1]) == 0


def _run(rng, drift: float, step_cv: float, process_sd: float, steps: int) -> dict:
    """One run: the machine's speed this round (``drift``), its process's own (log-normal,
    ``process_sd``), each step around it with noise ``step_cv``."""
    level = math.exp(drift + rng.gauss(0, process_sd))
    step = [10.0 / level * math.exp(rng.gauss(0, step_cv)) for _ in range(steps)]
    return {"step_cv": stats.step_cv(step), "step_ms": {"n": steps}, "samples_per_s": steps / sum(step) * 1e3}


def _rounds(rng, step_cv: float, process_sd: float, steps: int, n: int = 8) -> list[tuple[dict, dict]]:
    """A comparison's paired rounds on a machine that drifts from round to round (30%)."""
    return [(_run(rng, d, step_cv, process_sd, steps), _run(rng, d, step_cv, process_sd, steps))
            for d in (rng.gauss(0, 0.3) for _ in range(n))]


def test_a_window_of_few_noisy_steps_is_not_steady_and_a_long_one_is():
    import random

    rng = random.Random(5)
    few = stats.steady_window([_rounds(rng, 0.3, 0.01, 3) for _ in range(3)])  # RetinaNet-like: 3 steps, noisy
    assert not few["steady"] and few["share"] > 0.8 and (few["comparisons"], few["rounds"]) == (3, 24)
    # the processes differ, the steps barely: steady, however much the machine drifts between rounds
    long = stats.steady_window([_rounds(rng, 0.05, 0.05, 20) for _ in range(3)])
    assert long["steady"] and long["share"] < 0.2
    assert stats.steady_window([_rounds(rng, 0.1, 0.1, 5, n=2)]) is None  # two rounds: no estimate
    assert stats.step_cv([10.0]) is None and stats.step_cv([10.0, 10.0]) == 0.0
