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
