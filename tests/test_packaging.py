"""The contract files stay in step: pins, the two commands, CI."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pins_from_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return dict(d.split("==") for d in deps)


def pins_from_environment_yml():
    return dict(re.findall(r"^\s+- ([A-Za-z0-9_.-]+)==(\S+)$", (ROOT / "environment.yml").read_text(), re.MULTILINE))


def test_every_dependency_is_pinned_exactly():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert all("==" in d for d in deps), [d for d in deps if "==" not in d]
    pins = pins_from_pyproject()
    assert pins["torch"] == "2.13.0"
    for needed in ("jupyterlab", "papermill", "nbval", "matplotlib", "seaborn", "pandas", "psutil", "tqdm",
                   "intel-openmp"):
        assert needed in pins


def test_environment_yml_matches_pyproject():
    assert pins_from_environment_yml() == pins_from_pyproject()
    assert "python=3.11" in (ROOT / "environment.yml").read_text()


def test_readme_opens_with_the_two_commands_and_ci_calls_the_test_one():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:sh|bash)?\n(.*?)```", readme, re.DOTALL).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["make run", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run:", "test:", "lab:", "setup:"):
        assert re.search(rf"^{target}", makefile, re.MULTILINE)


def test_notebooks_in_git_carry_no_outputs():
    import nbformat

    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert nb.metadata["kernelspec"]["name"] == "cpuopt", path.name
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1 and 'PRESET = "quick"' in params[0].source, path.name
        for cell in nb.cells:
            if cell.cell_type == "code" and "NBVAL_CHECK_OUTPUT" not in cell.source:
                assert not cell.outputs and cell.execution_count is None, f"{path.name} carries outputs"
