"""nbval compares the committed outputs of `# NBVAL_CHECK_OUTPUT` cells: a changed output fails."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_checked_cell_has_a_committed_output_to_compare():
    checked = 0
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and "NBVAL_CHECK_OUTPUT" in cell.source:
                assert cell.outputs and cell.execution_count, f"{path.name}: an unrun NBVAL_CHECK_OUTPUT cell checks nothing"
                checked += 1
    assert checked >= 1


def nbval(tmp_path, stored: str) -> subprocess.CompletedProcess:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(sorted(['physical_cores', 'isa']))")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=stored)]
    cell.execution_count = 1  # nbval refuses an unrun cell with outputs
    nb.cells = [nbformat.v4.new_code_cell("x = 1"), cell]
    path = tmp_path / "check.ipynb"
    nbformat.write(nb, path)
    return subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-p", "no:cacheprovider", "-q", str(path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.mark.slow
def test_nbval_passes_the_committed_output_and_fails_a_changed_one(tmp_path):
    assert nbval(tmp_path, "['isa', 'physical_cores']\n").returncode == 0
    changed = nbval(tmp_path, "['isa', 'logical_cores']\n")
    assert changed.returncode != 0 and "logical_cores" in changed.stdout
