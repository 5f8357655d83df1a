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
    assert warning and warning.startswith("cnn:") and "noisy" in warning
    assert stats.spread_warning([100]) is None
    assert stats.relative_spread([1, 1, 1]) == 0
