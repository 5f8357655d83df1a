"""What a workbook run executes headless leaves behind: no progress bars, no kernel sockets beside the notebooks."""

from cpuopt_helpers import progress


def test_a_bar_is_disabled_in_a_notebook_the_workbook_executes(monkeypatch):
    monkeypatch.delenv(progress.HEADLESS, raising=False)
    assert not progress.bar(total=3, desc="sweep").disable
    monkeypatch.setenv(progress.HEADLESS, "1")  # as `cpuopt workbook run` sets it for its kernels
    assert progress.bar(total=3, desc="sweep").disable
    assert list(progress.bar(iterable=[1, 2], disable=False)) == [1, 2]  # the iterable still runs



def test_the_workbooks_kernels_keep_their_sockets_in_the_runs_own_folder(tmp_path):
    """ipc sockets named in the notebooks' folder ("kernel-ipc-1") would be taken over by another run's
    kernel starting there at the same time: each kernel's lie in the run's folder, under its own name."""
    from cpuopt_helpers.workbook import local_kernels

    manager = local_kernels(str(tmp_path))
    first, second = manager(), manager()
    assert (first.transport, second.transport) == ("ipc", "ipc")
    assert first.ip.startswith(str(tmp_path)) and second.ip.startswith(str(tmp_path)) and first.ip != second.ip
