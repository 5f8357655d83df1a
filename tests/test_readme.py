"""Your own model as docs/own-model.md shows it (the README links there), run as a new user would: its
module and its commands."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN_LINES = 3  # the section's first command lines, run as written (the rest are the workbook itself, which
# tests/test_notebooks.py runs with a user workload of its own)


def user_model_section() -> tuple[str, list[str]]:
    """The module and the shell lines of the "Your own model" section of docs/own-model.md."""
    text = (ROOT / "docs" / "own-model.md").read_text()
    section = text.split("## Your own model", 1)[1].split("\n## ", 1)[0]
    module = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shell = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return module, [line for line in shell.splitlines() if line.strip()]


def test_the_docs_name_the_module_and_the_commands_this_test_runs():
    module, lines = user_model_section()
    assert module.startswith("# mypkg/mymodel.py") and "def build(preset=" in module
    assert all(line.split()[0] == "cpuopt" for line in lines[:RUN_LINES])
    assert lines[RUN_LINES].startswith("papermill notebooks/08") and "--only 01,02,03,06,08" in lines[RUN_LINES + 1]
    assert lines[-1].startswith("make run WORKLOADS=mypkg.mymodel:build")


@pytest.mark.slow
def test_the_user_model_commands_run_as_written(tmp_path):
    """The bench lines as written; the tune line (the suite's one real budgeted search) with --json
    added: the same search, its recommendation read whole, and the text it prints without --json
    (tune.format_tune of that result) checked too."""
    from cpuopt_helpers import tune

    module, lines = user_model_section()
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "mymodel.py").write_text(module)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               CPUOPT_BUILD=str(tmp_path / "build"))
    env.pop("PYTHONPATH", None)
    outputs = []
    for line in lines[:RUN_LINES - 1] + [lines[RUN_LINES - 1] + " --json"]:
        proc = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{line}\n{proc.stderr[-3000:]}"
        outputs.append(json.loads(proc.stdout))
    plain, fixed, t = outputs
    assert plain["status"] == fixed["status"] == "ok" and plain["samples_per_s"] > 0
    assert dict(fixed["config"]["options"]) == {"frozen_bn": "folded", "focal": "fast"}
    assert tune.format_tune(t).startswith("recommended for mypkg.mymodel:build[quick]:")
    measured = t["speedup_vs_default"] or t["run_cpu_vs_default"]  # the winner confirmed, or run_cpu vs defaults
    assert measured["n"] == len(t["rounds"]) >= 5  # the final rounds kept their time: a verdict, not "too few"
    low, high = measured["ci_low"], measured["ci_high"]  # the verdict is the one its interval gives
    assert low <= measured["ratio"] <= high and measured["verdict"] in ("faster", "slower", "equivalent", "no different")
    assert (measured["verdict"] == "faster") == (low > 1) and (measured["verdict"] == "slower") == (high < 1)
    assert t["launch_command"].startswith("cpuopt launch") and "numactl" in t["shell_command"]
