"""Statistics over step times and repeats."""

import math

import pytest

from cpuopt_helpers import stats


def test_summarize_and_quantiles():
    s = stats.summarize([5, 1, 3, 2, 4])
    assert s == {"median": 3, "p10": pytest.approx(1.4), "p90": pytest.approx(4.6), "n": 5}
    assert stats.summarize([])["n"] == 0 and math.isnan(stats.summarize([])["median"])
    assert stats.summarize([2.0, float("nan"), None])["n"] == 1


def test_bootstrap_ci_brackets_the_median_and_narrows_with_data():
    few = [10, 12, 9, 11, 30]
    low, high = stats.bootstrap_ci(few)
    assert low <= 11 <= high
    many = few * 20
    low2, high2 = stats.bootstrap_ci(many)
    assert (high2 - low2) <= (high - low)
    assert stats.bootstrap_ci([7.0]) == (7.0, 7.0)
    assert stats.bootstrap_ci(few) == stats.bootstrap_ci(few)  # seeded: reproducible


def test_interleaved_ratio_cancels_shared_drift():
    # the machine slows down over time; B is always 20% faster than A in the same round
    a = [100, 150, 200, 250, 300]
    b = [x / 1.2 for x in a]
    r = stats.interleaved_ratio(a, b)
    assert r["median"] == pytest.approx(1 / 1.2)
    assert r["ci_low"] == pytest.approx(1 / 1.2) and r["ci_high"] == pytest.approx(1 / 1.2)
    assert r["warning"] is None
    with pytest.raises(ValueError):
        stats.interleaved_ratio([1, 2], [1])


def test_spread_warning_only_when_wide():
    assert stats.spread_warning([100, 101, 99, 100]) is None
    warning = stats.spread_warning([100, 200, 50, 100], "cnn")
    assert warning and warning.startswith("cnn:") and "noisy" in warning
    assert stats.spread_warning([100]) is None
    assert stats.relative_spread([1, 1, 1]) == 0
