"""Progress bars: shown where someone watches, none left in a notebook the workbook executes."""

from cpuopt_helpers import progress


def test_a_bar_is_disabled_in_a_notebook_the_workbook_executes(monkeypatch):
    monkeypatch.delenv(progress.HEADLESS, raising=False)
    assert not progress.bar(total=3, desc="sweep").disable
    monkeypatch.setenv(progress.HEADLESS, "1")  # as `cpuopt workbook run` sets it for its kernels
    assert progress.bar(total=3, desc="sweep").disable
    assert list(progress.bar(iterable=[1, 2], disable=False)) == [1, 2]  # the iterable still runs

