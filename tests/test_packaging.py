"""The contract files stay in step: ranges in pyproject.toml, the exact versions of
constraints.txt, environment.yml and the Makefile installing those, the two commands, CI."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
EXTRAS = ("workbook", "test")
# Modules only the notebooks, the report and the accuracy runs use; the rest is what a plain
# `pip install cpuopt-helpers` must be able to import.
WORKBOOK_MODULES = {"plots", "report", "workbook", "pages", "accuracy"}
# Imported name -> distribution, where they differ; None: not a dependency (IPEX lives in its own runtime;
# zentorch is installed by `make setup` on an AMD CPU only, the release built for the torch installed).
DISTRIBUTIONS = {"sklearn": "scikit-learn", "intel_extension_for_pytorch": None, "zentorch": None}
NOT_IN_A_TRAINING_ENV = {"jupyterlab", "papermill", "nbval", "ipykernel", "nbconvert", "pytest", "matplotlib",
                         "seaborn", "scikit-learn", "intel-openmp"}


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements(extra: str | None = None) -> list[Requirement]:
    p = project()
    return [Requirement(d) for d in (p["dependencies"] if extra is None else p["optional-dependencies"][extra])]


def names(reqs) -> set[str]:
    return {canonicalize_name(r.name) for r in reqs}


def constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line)
            assert match, f"constraints.txt: {line!r} is not NAME==VERSION"
            name = canonicalize_name(match.group(1))
            assert name not in pins, f"constraints.txt pins {name} twice"
            pins[name] = match.group(2)
    return pins


def environment_yml() -> tuple[list[str], list[str]]:
    import yaml

    deps = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    pip = [d["pip"] for d in deps if isinstance(d, dict)]
    assert len(pip) == 1, "environment.yml has one pip section"
    return [d for d in deps if isinstance(d, str)], pip[0]


def test_pyproject_declares_ranges_a_training_environment_can_meet():
    p = project()
    every = [r for extra in (None, *EXTRAS) for r in requirements(extra)]
    assert not [str(r) for r in every if any(s.operator in ("==", "===") for s in r.specifier)], "ranges, not pins"
    assert not [str(r) for r in every if not any(s.operator == ">=" for s in r.specifier)], "each with a floor"
    core = names(requirements())
    assert {"torch", "numpy", "scipy", "pandas", "tqdm"} <= core
    assert not core & NOT_IN_A_TRAINING_ENV, "notebook and test tools belong in the extras"
    assert {"jupyterlab", "papermill", "ipykernel", "matplotlib", "seaborn"} <= names(requirements("workbook"))
    assert {"pytest", "nbval"} <= names(requirements("test"))
    torch = next(r for r in requirements() if r.name == "torch")
    ipex_torch = re.search(r"^torch==(\S+)", (ROOT / "requirements-ipex.txt").read_text(), re.MULTILINE).group(1)
    for version in ("2.4.0", ipex_torch, constraints()["torch"]):  # fused CPU optimizers; the IPEX runtime; ours
        assert torch.specifier.contains(version), version
    assert not torch.specifier.contains("2.3.1")
    python = SpecifierSet(p["requires-python"])
    assert [v for v in ("3.9", "3.10", "3.11", "3.13") if python.contains(v)] == ["3.10", "3.11", "3.13"]
    assert "<" not in p["requires-python"], "no upper cap on Python"


def test_every_third_party_import_is_declared():
    core, workbook = names(requirements()), names(requirements("workbook"))
    for path in sorted((ROOT / "cpuopt_helpers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module]
            else:
                continue
            for top in {m.split(".")[0] for m in modules}:
                if top in sys.stdlib_module_names or top == "cpuopt_helpers":
                    continue
                dist = DISTRIBUTIONS.get(top, top)
                allowed = core | workbook if path.stem in WORKBOOK_MODULES else core
                assert dist is None or canonicalize_name(dist) in allowed, \
                    f"{path.relative_to(ROOT)} imports {top}: declare {dist} in pyproject.toml"


def test_constraints_pin_every_dependency_within_its_range():
    pins = constraints()
    assert pins["torch"] == "2.13.0"
    assert not {n: v for n, v in pins.items() if "+" in v}, "no local versions (+cpu): macOS and aarch64 lack them"
    assert "cpuopt-helpers" not in pins
    for extra in (None, *EXTRAS):
        for req in requirements(extra):
            name = canonicalize_name(req.name)
            assert name in pins, f"constraints.txt does not pin {name}"
            assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {req}"


def test_constraints_cover_everything_the_requirements_pull_in():
    """Walks the dependencies of the pinned versions installed here (others' metadata says
    nothing about the pins): whatever pip would add unpinned is a gap."""
    pins, unpinned, seen = constraints(), set(), set()
    todo = [(r, "") for extra in (None, *EXTRAS) for r in requirements(extra)]
    while todo:
        req, parent_extra = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": parent_extra}):
            continue
        name = canonicalize_name(req.name)
        if name not in pins:
            unpinned.add(name)
            continue
        try:
            if Version(metadata.version(name)).public != Version(pins[name]).public:
                continue
        except metadata.PackageNotFoundError:  # not installed here: its dependencies unknown
            continue
        for extra in sorted(req.extras) or [""]:
            if (name, extra) not in seen:
                seen.add((name, extra))
                todo += [(Requirement(r), extra) for r in metadata.requires(name) or []]
    assert not unpinned, f"pulled in but not pinned in constraints.txt: {sorted(unpinned)}"


def test_environment_yml_installs_the_constraints_with_torch_from_the_cpu_index():
    conda, pip = environment_yml()
    assert pip == [f"--extra-index-url {CPU_INDEX}", "-c constraints.txt", f"-e .[{','.join(EXTRAS)}]"], \
        "the pip section installs the package with the pins of constraints.txt, nothing pinned twice"
    assert "pip" in conda
    python = [d.split("=", 1)[1] for d in conda if re.match(r"python\s*=", d)]
    assert python == ["3.11"], "the Python the constraints are tested with"
    assert SpecifierSet(project()["requires-python"]).contains(python[0])


STUB = """#!/bin/bash
echo "$0 $*" >> {log}
if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi
exit 0
"""


@pytest.fixture
def make_here(tmp_path):
    """`make` in a copy of the Makefile, pyproject.toml and constraints.txt; every python is a stub
    that logs its arguments (PYTHON, and the venv's bin/python it creates)."""
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy2(ROOT / name, work / name)
    log = tmp_path / "calls.log"
    log.touch()
    stub = tmp_path / "python3"
    stub.write_text(STUB.format(log=log))
    stub.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if k not in (
        "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VENV", "PYTHON", "CONSTRAINTS", "TORCH_INDEX", "CONDA_PREFIX",
        "VIRTUAL_ENV")}

    def make(*args, env=None):
        proc = subprocess.run(["make", *args, f"PYTHON={stub}"], cwd=work, capture_output=True, text=True,
                              timeout=60, env={**clean, **(env or {})})
        calls = log.read_text().splitlines()
        log.write_text("")
        return proc, calls

    make.work, make.stub, make.tmp = work, str(stub), tmp_path
    return make


def assert_installs(calls, python):
    pip = [c for c in calls if c.startswith(f"{python} -m pip install")]
    assert len(pip) == 2, calls
    torch = next(iter(Requirement(t.strip('"')) for t in pip[0].split() if t.strip('"').startswith("torch")))
    project_torch = next(r for r in requirements() if r.name == "torch")
    assert torch.specifier == project_torch.specifier, "the Makefile's TORCH_RANGE is pyproject.toml's"
    assert f"--extra-index-url {CPU_INDEX}" in pip[0] and "--no-deps" in pip[0]
    assert "-e .[workbook,test]" in pip[1] and "--extra-index-url" not in pip[1]
    assert all("-c constraints.txt" in c for c in pip)
    assert any(c.startswith(f"{python} -m ipykernel install --sys-prefix --name cpuopt") for c in calls)


def test_make_creates_dot_venv_by_default_and_installs_the_constraints(make_here):
    proc, calls = make_here(".venv/.cpuopt-setup")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls[0] == f"{make_here.stub} -m venv .venv"
    assert_installs(calls[1:], ".venv/bin/python")
    assert (make_here.work / ".venv" / ".cpuopt-setup").exists()
    proc, calls = make_here(".venv/.cpuopt-setup")
    assert "up to date" in proc.stdout and calls == []
    now = time.time()  # a changed pin installs again, pyproject.toml unchanged
    for name, age in (("pyproject.toml", 100), (".venv/.cpuopt-setup", 50), ("constraints.txt", 0)):
        os.utime(make_here.work / name, (now - age, now - age))
    proc, calls = make_here(".venv/.cpuopt-setup")
    assert proc.returncode == 0 and len([c for c in calls if "-m pip install" in c]) == 2, calls


def test_make_uses_an_existing_environment_and_creates_none(make_here):
    env = make_here.tmp / "conda-env"
    (env / "bin").mkdir(parents=True)
    shutil.copy2(make_here.stub, env / "bin" / "python")
    proc, calls = make_here(f"{env}/.cpuopt-setup", f"VENV={env}", env={"CONDA_PREFIX": str(env)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [c for c in calls if c.startswith(make_here.stub)], "no venv created"
    assert_installs(calls, f"{env}/bin/python")
    assert not (make_here.work / ".venv").exists() and (env / ".cpuopt-setup").exists()
    assert "creating .venv" not in proc.stdout


def test_make_refuses_a_folder_that_is_no_python_environment(make_here):
    folder = make_here.tmp / "not-an-env"
    folder.mkdir()
    proc, calls = make_here(f"{folder}/.cpuopt-setup", f"VENV={folder}")
    assert proc.returncode != 0 and "has no bin/python" in proc.stdout
    assert calls == [] and not (folder / "bin").exists()


def test_make_points_an_active_conda_env_out(make_here):
    proc, calls = make_here(".venv/.cpuopt-setup", env={"CONDA_PREFIX": "/opt/conda/envs/mine"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "VENV=/opt/conda/envs/mine" in proc.stdout and calls[0] == f"{make_here.stub} -m venv .venv"


def recipe(makefile: str, target: str) -> str:
    return re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)


def test_readme_opens_with_the_two_commands_and_ci_calls_the_test_one():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:sh|bash)?\n(.*?)```", readme, re.DOTALL).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["make run", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run:", "test:", "test-fast:", "lab:", "setup:"):
        assert re.search(rf"^{target}", makefile, re.MULTILINE)
    assert '-m "not slow" tests' in recipe(makefile, "test-fast"), "make test-fast: no workers, no notebooks"
    assert "test-notebooks test-others" in recipe(makefile, "test"), "make test runs both halves"
    notebooks, others = recipe(makefile, "test-notebooks"), recipe(makefile, "test-others")
    moved = ("tests/test_faults.py", "tests/test_fullstudy.py")  # after the notebooks: the other half's tail shorter
    assert "notebooks/00_system_check.ipynb tests/test_notebooks.py " in notebooks
    assert all(f" {t} " in notebooks and f"--ignore={t} " in others for t in moved)
    assert "pytest tests --ignore=tests/test_notebooks.py " in others, "the other half: everything else"
    for half in (notebooks, others):
        assert " -m " not in half.replace("-m pytest", ""), "make test deselects nothing"


def test_notebooks_in_git_carry_no_outputs():
    import nbformat

    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        ids = [c.get("id") for c in json.loads(path.read_text())["cells"]]  # as stored: nbformat fills missing ids
        assert None not in ids and len(set(ids)) == len(ids), f"{path.name}: a cell without a unique id"
        nb = nbformat.read(path, as_version=4)
        assert nb.metadata["kernelspec"]["name"] == "cpuopt", path.name
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1 and 'PRESET = "quick"' in params[0].source, path.name
        for cell in nb.cells:
            if cell.cell_type == "code" and "NBVAL_CHECK_OUTPUT" not in cell.source:
                assert not cell.outputs and cell.execution_count is None, f"{path.name} carries outputs"


def test_make_says_the_pins_need_python_3_11_before_pip_fails(make_here):
    """constraints.txt pins numpy and pandas releases that need Python 3.11: an older Python is
    refused in one line that says what to do, before pip fails on them in pages of output."""
    env = make_here.tmp / "py310"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text('#!/bin/bash\ncase "$*" in *version_info*) exit 1;; *python_version*) '
                                        'echo 3.10.12;; esac\nexit 0\n')
    (env / "bin" / "python").chmod(0o755)
    proc, calls = make_here(f"{env}/.cpuopt-setup", f"VENV={env}")
    assert proc.returncode != 0 and not (env / ".cpuopt-setup").exists()
    assert f"cpuopt: {env} has Python 3.10.12; the pinned versions of constraints.txt need 3.11 or newer" in proc.stdout
    proc, calls = make_here(f"{env}/.cpuopt-setup", f"VENV={env}", "CONSTRAINTS=")  # within pyproject's ranges
    assert proc.returncode == 0, proc.stdout + proc.stderr
