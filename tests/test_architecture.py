"""The package's structure: imports go down the layers and never in a circle; functions fit on a
screen; a new launch knob is one row of config.KNOBS. Reads the source with ast; starts nothing."""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

import pytest

from cpuopt_helpers import cli, config, planning
from cpuopt_helpers.config import KNOBS, Knob, RunConfig

PACKAGE = Path(config.__file__).resolve().parent

# Bottom to top. A module imports only modules of its own layer or below (and none in a circle):
# a new module is placed here, where what it imports and what imports it allow.
LAYERS = (
    # foundations: no import of the package beyond these
    {"cpuopt_helpers", "errors", "compare", "stats", "throughput", "flops", "rank_exec", "kernels", "kernels.focal_loss",
     "kernels.detection_loss", "kernels.lamb", "kernels.conv_paths", "workloads", "profiledn.parse",
     "profiledn.benchdnn", "peak", "power", "progress"},
    {"config", "system"},  # what a run is; what the machine is
    # records and their words; where a run ran; interpreters; a oneDNN log's and a trace's findings (records)
    {"decisions", "wording", "provenance", "runtimes", "profiledn.breakdown", "profiledn.trace"},
    {"targets"},  # the case study's targets, as records
    {"worker"},  # the measured process
    {"fixes", "workloads.cnn", "workloads.retinanet", "workloads.rnn", "workloads.transformer", "roofline",
     "accuracy", "profiledn.replay", "kernels.benchmark"},  # what the worker trains; other measured processes
    {"planning", "results"},  # the pure plan; the store
    {"launch"},  # the process runners
    {"profiledn", "profiledn.wholestep", "profiledn.account", "profiledn.capture", "plots", "ladder"},  # on top of runs and the store
    {"stages", "stages.baseline", "stages.profiling", "stages.choosing", "stages.threads", "stages.allocator",
     "stages.extensions", "stages.precision", "stages.multi_instance", "stages.case_study", "stages.climb",
     "stages.summary"},  # the deciding layer
    {"scripts", "tune", "session", "report", "pages", "records", "workbook", "fullstudy"},  # what notebooks and commands drive
    {"site"},  # the docs site, over the report
    {"cli"},
    {"__main__"},
)
LONGEST_FUNCTION = 60  # lines, docstring included


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        out["cpuopt_helpers" if name == "__init__" else name.removesuffix(".__init__")] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports anywhere: at the top, inside functions, under TYPE_CHECKING."""
    found = set()
    package = name.rpartition(".")[0] if path.name != "__init__.py" else name
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(["cpuopt_helpers", *parts, *([node.module] if node.module else [])]).replace(
                    "cpuopt_helpers.cpuopt_helpers", "cpuopt_helpers")
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}".removeprefix("cpuopt_helpers.") in known else base
                      for a in node.names}
    names = {m.removeprefix("cpuopt_helpers.") if m != "cpuopt_helpers" else m for m in found}
    return {m for m in names if m in known and m != name}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def layer_of(name: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if name in layer)


def test_every_module_has_a_layer_and_imports_only_at_or_below_it():
    deps = graph()
    unplaced = sorted(set(deps) - set().union(*LAYERS))
    assert not unplaced, f"place these modules in a layer of LAYERS: {unplaced}"
    upward = [f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})"
              for m, ds in deps.items() for d in sorted(ds) if layer_of(d) > layer_of(m)]
    assert not upward, upward


def test_the_import_graph_has_no_circle():
    deps, state, circles = graph(), {}, []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(deps[node]):
            if state.get(dep) == "open":
                circles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for name in sorted(deps):
        if name not in state:
            visit(name, [name])
    assert not circles, circles


def test_the_checks_catch_an_upward_import_and_a_circle(tmp_path, monkeypatch):
    """The two tests above can fail: a made-up package where config imports cli."""
    fake = tmp_path / "cpuopt_helpers"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "config.py").write_text("def f():\n    from cpuopt_helpers import cli\n")
    (fake / "cli.py").write_text("from cpuopt_helpers.config import f\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    deps = graph()
    assert deps["config"] == {"cli"} and deps["cli"] == {"config"}
    with pytest.raises(AssertionError, match="config .layer 1. imports cli"):
        test_every_module_has_a_layer_and_imports_only_at_or_below_it()
    with pytest.raises(AssertionError, match="config"):
        test_the_import_graph_has_no_circle()


def test_no_function_is_longer_than_a_screen():
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, f"split these (at most {LONGEST_FUNCTION} lines a function): {long}"


def test_tables_are_module_level_data():
    assert isinstance(KNOBS, tuple) and all(isinstance(k, Knob) for k in KNOBS)
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert {k.field for k in KNOBS} == fields - {"workload", "preset", "env", "options"}  # every field a user sets
    assert len({k.flag for k in KNOBS if k.flag}) == len([k for k in KNOBS if k.flag])


def test_the_plans_variable_table_is_generated_from_the_knobs_and_says_what_a_plan_sets(machine):
    assert planning.env_table() in planning.__doc__
    everything = RunConfig(allocator="jemalloc", omp_runtime="intel", kmp_blocktime=0, threads=2)
    env, _ = planning.plan_env(everything, machine(), {})
    listed = planning.env_table()
    assert all(f"| {name} " in listed for name in env if name != "PYTHONPATH")
    assert "PYTHONPATH" in listed and config.USER_WINS == ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MALLOC_CONF",
                                                           "KMP_AFFINITY", "KMP_BLOCKTIME")


# A knob added as one row: an Intel OpenMP variable a stage could sweep, on a RunConfig with its field.
WaitConfig = dataclasses.make_dataclass("WaitConfig", [("omp_wait_policy", "str | None", None)], bases=(RunConfig,),
                                        frozen=True)
WAIT = Knob("omp_wait_policy", "--omp-wait-policy", "active | passive: how idle OpenMP threads wait",
            choices=("active", "passive"), name="OpenMP wait policy", launch=True, placement=True,
            env=(("OMP_WAIT_POLICY", "the config's value", "when given"),),
            env_of=lambda c: {"OMP_WAIT_POLICY": c.omp_wait_policy.upper()} if c.omp_wait_policy else {})


def test_a_knob_row_reaches_the_cli_the_plans_environment_and_the_launch_line(machine, capsys):
    knobs = KNOBS + (WAIT,)
    parser = cli.build_parser(knobs)
    for command in ("bench", "launch"):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        assert "--omp-wait-policy" in capsys.readouterr().out
    assert parser.parse_args(["bench", "--omp-wait-policy", "passive"]).omp_wait_policy == "passive"
    run = WaitConfig(omp_wait_policy="passive", threads=2)
    env, warnings = planning.plan_env(run, machine(), {}, knobs)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and not warnings
    env, warnings = planning.plan_env(run, machine(), {"OMP_WAIT_POLICY": "ACTIVE"}, knobs)  # the user's value wins
    assert env["OMP_WAIT_POLICY"] == "ACTIVE" and "OMP_WAIT_POLICY=ACTIVE from your environment" in warnings[0]
    assert "--omp-wait-policy passive" in config.launch_line(run, "python train.py", knobs)
    assert "| OMP_WAIT_POLICY " in planning.env_table(knobs)
    with pytest.raises(config.CpuoptError, match="unknown OpenMP wait policy 'lazy'"):
        config.check_knobs(WaitConfig(omp_wait_policy="lazy"), knobs)
    # without its row, nothing knows the field: the table is the one place a knob is declared
    assert "OMP_WAIT_POLICY" not in planning.plan_env(run, machine(), {})[0]
    assert "--omp-wait-policy" not in config.launch_line(run, "python train.py")


DECIDING = ("stages", "ladder.py", "tune.py", "workbook.py", "session.py", "pages.py")
LABEL_MATCHES = (  # a decision made by matching a label or a sentence, the shapes it took before typed records
    r"""\[["'](setting|change|label)["']\]\s*(==|!=)""", r"""\.(setting|change)\s*(==|!=)""",
    r"""\bin\s+\w+\[["'](setting|change|label)["']\]""", r"""\.replace\(["']the """, r"""split\(["']:["']\)""",
    r"""\.str\.contains\(""", r"""(==|!=)\s*["']baseline["']""")


def test_no_decision_matches_a_label_or_a_sentence():
    import re

    found = []
    for part in DECIDING:
        for path in sorted((PACKAGE / part).rglob("*.py")) if (PACKAGE / part).is_dir() else [PACKAGE / part]:
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if any(re.search(pattern, line) for pattern in LABEL_MATCHES):
                    found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not found, found
    assert re.search(LABEL_MATCHES[0], 'base = table[table["setting"] == "baseline"]')  # the shapes are caught
    assert re.search(LABEL_MATCHES[2], 'if "launcher=run_cpu" in row["setting"]')


def test_notebook_cells_are_short_and_hold_no_decision():
    """Logic in the package, narrative in the notebook: a code cell fits on a screen (20 lines), and a
    stage's decision is made by its module (``Session.settle`` or a stage function), never in a cell."""
    import json

    decisions = ("hand_on(", "reset_ladder(", ".confirm(", "confirmer(")
    found = []
    for book in sorted((PACKAGE.parent / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for i, cell in enumerate(json.loads(book.read_text())["cells"]):
            source = "".join(cell["source"])
            if cell["cell_type"] != "code":
                continue
            if len(source.splitlines()) > 20 and "parameters" not in cell["metadata"].get("tags", []):
                found.append(f"{book.name} cell {i}: {len(source.splitlines())} lines")
            found += [f"{book.name} cell {i}: {call}" for call in decisions if call in source]
    assert not found, found
