"""data/device/run.py, the many-core record's script: it runs on another machine, from the source
tree, so what it imports from the package is checked here (its measurements are not tests)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "data" / "device" / "run.py"


def load():
    spec = importlib.util.spec_from_file_location("device_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_starts_from_the_source_tree_and_names_its_parts():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--out" in done.stdout and "--quick" in done.stdout
    names = [name for name, *_ in load().PARTS]
    assert names == ["RetinaNet standard on two cores", "RetinaNet full rate", "threads", "layouts"]


def test_a_parts_lines_become_a_list_with_its_tables_and_blocks_kept():
    lines = ["a sentence", "| figure | value |", "```", "   mode  threads", "```", "another"]
    assert load().markdown(lines) == ["- a sentence", "| figure | value |", "```", "   mode  threads", "```",
                                      "- another"]
