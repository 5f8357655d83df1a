"""The hand-out report: it replaces only a folder it wrote itself."""

import pytest

from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.report import build_report
from cpuopt_helpers.results import ResultStore
from tests.conftest import make_facts


def test_the_report_replaces_its_own_folder_and_refuses_a_users(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    index = build_report(tmp_path, make_facts(), store)
    (index.parent / "stale.txt").write_text("from the report before")
    build_report(tmp_path, make_facts(), store)  # its own folder: replaced
    assert index.exists() and not (index.parent / "stale.txt").exists()
    theirs = tmp_path / "other"
    (theirs / "report").mkdir(parents=True)
    (theirs / "report" / "notes.md").write_text("mine")
    with pytest.raises(CpuoptError, match="was not written by cpuopt"):
        build_report(theirs, make_facts(), store)
    assert (theirs / "report" / "notes.md").read_text() == "mine"


def test_a_report_from_before_the_mark_is_still_cpuopts_own(tmp_path):
    old = tmp_path / "report"
    old.mkdir()
    (old / "index.html").write_text("<html><script>document.body.dataset.figuresLoaded = 1</script></html>")
    build_report(tmp_path, make_facts(), ResultStore(tmp_path / "r.sqlite"))  # replaced, not refused
    assert (old / ".cpuopt-report").exists()


def test_two_reports_at_once_on_one_folder_both_finish_and_a_half_written_notebook_is_named(tmp_path):
    """Two workbook runs on one --out each end with a report: one writer at a time (the CI failure of
    stop 43: one run's rmtree under the other's notebook pages). A notebook another run is still writing
    is listed by name, without a link, not a crash."""
    import nbformat
    from concurrent.futures import ThreadPoolExecutor

    books = tmp_path / "notebooks"
    books.mkdir()
    for name in ("01_baseline", "02_profile", "03_threads"):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# " + name + "\n" + "text " * 2000)])
        nbformat.write(nb, books / f"{name}.ipynb")
    (books / "04_allocator.ipynb").write_text('{"cells": [{"cell_type": "mark')  # cut off mid-write
    store = ResultStore(tmp_path / "r.sqlite")
    with ThreadPoolExecutor(2) as pool:
        indexes = list(pool.map(lambda _: build_report(tmp_path, make_facts(), store), range(6)))
    page = indexes[-1].read_text()
    assert all(i == indexes[0] for i in indexes) and (tmp_path / "report" / "notebooks" / "03_threads.html").exists()
    assert "<li>04_allocator (being written by another run; its report has it)</li>" in page
    assert "href='notebooks/01_baseline.html'" in page
