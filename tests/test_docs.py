"""The README and the hand-written pages under docs/: short where it must be, no measured figure
typed by hand, no broken link, no invented flag. Reads text only; starts nothing.

The figure rule (docs/contributing.md): outside a generated block (``<!-- NAME:start -->`` ...
``<!-- NAME:end -->``), a line may not hold a speedup (``2.17x``, ``1.5-1.8x``), a throughput
(samples/s, GFLOP/s, GB/s), a duration (``15 min``, ``5 s``, ``two hours``) or a percentage. Not
measured figures, and so allowed: a line that cites the paper ("the paper", "(paper)"); a value
written right after the backquoted name of the parameter or constant it sets (`` `MARGIN` (5%) ``);
a confidence or power level ("95% CI", "the 90% interval", "80% power"). Generated pages would live
under docs/results/ and are exempt.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GENERATED = ROOT / "docs" / "results"
MAX_LINES, FIRST_SCREEN = 200, 40

NUMBER = r"(?<![\w.])\d+(?:[.,]\d+)*"
WORDS = r"\b(?:an|one|two|three|four|five|six|seven|eight|nine|ten|twenty|thirty|forty|sixty|a few|several|half an?)"
FIGURES = {
    "speedup": re.compile(rf"{NUMBER}\s?[x×](?!\w)"),
    "throughput": re.compile(rf"{NUMBER}\s*(?:samples?/s|samples per second|[GMT]FLOP/s|[GMK]B/s|Gbit/s|it/s)"),
    "duration": re.compile(rf"{NUMBER}[\s-]*(?:ms|µs|us|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?)\b"
                           rf"|{WORDS}[\s-]+(?:seconds?|minutes?|hours?)\b"),
    "percentage": re.compile(rf"{NUMBER}\s*%"),
}
CITATION = re.compile(r"\bthe paper\b(?!'s)|\(paper\)", re.IGNORECASE)  # "the paper's ~2x reached" is our claim
SETTING = re.compile(rf"`[A-Z][A-Z0-9_]*`\s*(?:=|:|\()?\s*{NUMBER}\s*(?:%|x|s|min|minutes?)?")
LEVEL = re.compile(rf"{NUMBER}\s*%\s*(?:CI|confidence|(?:t |repeated-CI )?interval|power)\b")


def hand_written_pages() -> list[Path]:
    return [README] + sorted(p for p in (ROOT / "docs").rglob("*.md") if GENERATED not in p.parents)


def outside_generated_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line not inside a generated block, whose markers
    (``<!-- NAME:start -->``, ``<!-- NAME:end -->``) stand on lines of their own."""
    out, inside = [], None
    for number, line in enumerate(text.splitlines(), 1):
        marker = re.fullmatch(r"<!-- ([\w-]+):(start|end) -->", line.strip())
        start, end = (marker, None) if marker and marker.group(2) == "start" else (None, marker)
        if inside is None and start:
            inside = start.group(1)
        elif inside is not None and end and end.group(1) == inside:
            inside = None
        elif inside is None:
            out.append((number, line))
    assert inside is None, f"the generated block {inside!r} never ends"
    return out


def hand_typed_figures(line: str) -> list[str]:
    """The measured figures a line holds, as (kind: text); none on a line that cites the paper."""
    if CITATION.search(line):
        return []
    rest = LEVEL.sub(" ", SETTING.sub(" ", line))
    return [f"{kind}: {m.group(0).strip()}" for kind, pattern in FIGURES.items() for m in pattern.finditer(rest)]


def test_the_readme_is_one_screen_with_the_commands_and_the_answer_first():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; at most {MAX_LINES}: move the rest into docs/"
    first = "\n".join(lines[:FIRST_SCREEN])
    for needed in ("make run", "make test", "<!-- results:start -->"):
        assert needed in first, f"{needed!r} is not in the README's first {FIRST_SCREEN} lines"
    assert "(docs/own-model.md)" in first, f"the README links to running your own model in its first {FIRST_SCREEN} lines"


def test_no_measured_figure_is_typed_by_hand_in_the_readme_or_the_docs():
    found = []
    for page in hand_written_pages():
        for number, line in outside_generated_blocks(page.read_text()):
            found += [f"{page.relative_to(ROOT)}:{number}: {hit}" for hit in hand_typed_figures(line)]
    assert not found, "measured figures typed by hand (say which command measures them instead):\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    "**2.87x (95% CI 2.73-3.01)**: the paper's recipe reached",  # cites nothing: "the paper's" is no citation
    "the top against the defaults: 2.87x",
    "a ratio of 1.5-1.8x on two cores",
    "the CNN trains at 52.3 samples/s here",
    "fp32 GEMM 188 GFLOP/s, memory copy 31.6 GB/s",
    "`make test` took 15 min 5 s", "the case study takes about two hours", "a 122 s cold compile",
    "backward takes 62% of the step",
])
def test_the_figure_rule_finds_a_hand_typed_figure(line):
    assert hand_typed_figures(line), line


@pytest.mark.parametrize("line", [
    "focal loss forward: the paper reports 2.6x, and 1.3x for its backward",
    "- overall: ~2x (paper)",
    "the 90% interval lies inside 1 +- `MARGIN` (5%)",
    "`LOSS_TOLERANCE` (10%, relative) and `BUDGET_MIN` = 3 minutes",
    "the plain 95% t interval, the 95% CI, with 80% power",
    "cpuopt tune --workload mypkg.mymodel:build --preset quick --budget-min 0.5",
    "papermill notebooks/08.ipynb out.ipynb -p WORKLOADS '[\"m:build\"]' -p BUDGET_MIN 0.2",
    "cpuopt bench --option classes=264 --threads 2   # torch 2.13.0, oneDNN 3.12",
    "a 3x3 stride-2 convolution on a 1x1 input; on a 2x28-core Xeon", "(2 ranks x 1 thread)",
])
def test_the_figure_rule_lets_settings_citations_and_commands_pass(line):
    assert not hand_typed_figures(line), hand_typed_figures(line)


def test_the_figure_rule_skips_generated_blocks_only():
    text = "2.87x\n<!-- results:start -->\n2.06x\n<!-- results:end -->\ndone\n"
    assert outside_generated_blocks(text) == [(1, "2.87x"), (5, "done")]
    with pytest.raises(AssertionError, match="never ends"):
        outside_generated_blocks("<!-- results:start -->\n2.06x\n")


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_every_relative_link_points_to_a_file_that_exists():
    broken = []
    for page in hand_written_pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links in code are code
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # https:, mailto:, an anchor on the same page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def shell_lines(text: str) -> list[str]:
    """The lines of the ```sh blocks, continuation lines joined, comments and blank lines dropped."""
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                lines.append(shlex.join(words))
    return lines


def test_every_cpuopt_line_in_the_docs_parses_as_written():
    """No invented flag: each `cpuopt ...` line of a shell block is read by the real parser (lines
    with placeholders, `[--json]` or `...`, are synopses and skipped)."""
    from cpuopt_helpers import cli

    parser, wrong = cli.build_parser(), []
    for page in hand_written_pages():
        for line in shell_lines(page.read_text()):
            words = shlex.split(line)
            if words[0] != "cpuopt" or any(w.startswith("[") or "..." in w or "|" in w for w in words):
                continue
            try:
                parser.parse_args(words[1:])
            except SystemExit:
                wrong.append(f"{page.relative_to(ROOT)}: {line}")
    assert not wrong, wrong


def test_the_readme_shows_only_lines_the_docs_explain():
    """The README's own-model lines are those of docs/own-model.md, where each is explained and
    the first ones are run as written (tests/test_readme.py)."""
    readme = shell_lines(README.read_text().split("## Your own model", 1)[1].split("\n## ", 1)[0])
    documented = set(shell_lines((ROOT / "docs" / "own-model.md").read_text()))
    assert readme and not [line for line in readme if line not in documented]


def test_the_readme_block_is_one_answer_a_workload(tmp_path):
    """`cpuopt workbook readme` writes a short block: per workload the confirmed configuration, the
    headline over PyTorch's defaults (fresh rounds where measured, else the product, labelled) and the
    command; stamped with the machine and the day; the markers kept."""
    from cpuopt_helpers import pages
    from cpuopt_helpers.config import RunConfig
    from cpuopt_helpers.results import ResultStore
    from cpuopt_helpers.session import Session
    from tests.conftest import make_facts

    def confirmed(ratio, low, high):
        return {"ratio": ratio, "ci_low": low, "ci_high": high, "n": 5, "verdict": "faster", "label": "95% CI"}

    facts = make_facts(isa={"avx512f": True, "amx_bf16": True}, versions={"torch": "2.13.0+cpu"})
    session = Session(facts=facts, store=ResultStore(tmp_path / "r.sqlite"))
    base = RunConfig.for_preset("cnn", "quick").replace(threads=2)
    session.store.save_result({"config": base.to_dict(), "config_hash": base.config_hash(), "status": "ok",
                               "samples_per_s": 10.0, "system": "m", "created_at": "2026-12-01T10:00:00+00:00"})
    bf16 = base.replace(allocator="tcmalloc", dtype="bf16")
    session.hand_on(base, "baseline")
    session.hand_on(base.replace(allocator="tcmalloc"), "allocator", comparison=confirmed(1.1, 1.02, 1.2))
    session.hand_on(bf16, "bf16", comparison=confirmed(1.5, 1.2, 1.9), evidence={"end_to_end": confirmed(1.6, 1.4, 1.8)})
    rnn = RunConfig.for_preset("rnn", "quick").replace(threads=2)
    session.hand_on(rnn, "baseline")
    session.hand_on(rnn.replace(allocator="jemalloc"), "allocator", comparison=confirmed(1.1, 1.02, 1.2))
    retina = RunConfig.for_preset("retinanet", "quick").replace(threads=2, optimizer="lamb")  # as notebook 08 trains it
    session.hand_on(retina, "baseline")
    session.hand_on(retina, "case-study fixes")
    block = pages.results_markdown(session.store, facts, "quick")
    lines = block.splitlines()
    assert len(lines) <= 19  # three workloads: the stamp, the table, the venv, two check lines, their names, links
    checks = [line for line in lines if line.startswith("cpuopt compare ")]  # the answers to check, not the defaults
    assert [c.split()[3] for c in checks] == ["cnn", "rnn"]
    assert checks[0].endswith('--a "--threads 2" --b "--threads 2 --allocator tcmalloc --dtype bf16"'), checks[0]
    assert lines[lines.index(checks[0]) - 1] == "# cnn"  # each line under its ladder's name
    assert lines[lines.index("```sh") + 1] == ". .venv/bin/activate"  # where the cpuopt command is, first
    assert f"The thread counts (`--threads`) are this machine's ({facts.physical_cores} physical cores)" in block
    assert lines[0].startswith("Measured on 2026-12-01 (preset `quick`) on **made-up CPU** (AVX-512, AMX)")
    rows = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| ") and "---" not in line}
    assert "| allocator=tcmalloc dtype=bf16 | 1.60x (95% CI: 1.40-1.80, 5 rounds): faster, the top against the defaults " \
           "in fresh paired rounds | `cpuopt bench --workload cnn" in rows["cnn"]
    assert "1.10x (95% CI: 1.02-1.20, 5 rounds): faster, from the rungs' own confirmations" in rows["rnn"]  # not fresh
    assert "| PyTorch's defaults | nothing confirmed faster than the defaults; the defaults here train with " \
           "optimizer=lamb, as the top does |" in rows["retinanet"]
    assert "optimizer=" not in rows["cnn"]  # the defaults' own optimizer goes unsaid
    assert "commit" not in lines[0]  # no run kept its commit in this store
    from cpuopt_helpers.report import answer_rows

    answers = answer_rows(session.store, facts)
    assert len(answers) == 3
    for workload, preset, setting, over, command in answers:  # the run's report says the same
        assert preset == "quick" and f"| {setting} | {over} | `{command}` |" in rows[workload]
    session.store.put_fact("m", pages.RUN_FACT.format(preset="quick"), {"commit": "abc1234"})  # as `workbook run` does
    block = pages.results_markdown(session.store, facts, "quick")
    assert block.splitlines()[0].endswith(", commit abc1234.")
    assert pages.measured_days(session.store, "m", "quick") == "2026-12-01"
    session.store.save_result({"config": base.to_dict(), "config_hash": base.config_hash(), "status": "ok",
                               "samples_per_s": 10.0, "system": "m", "created_at": "2026-12-02T00:10:00+00:00"})
    assert pages.measured_days(session.store, "m", "quick") == "2026-12-01 to 2026-12-02"  # a run across midnight
    assert pages.results_markdown(session.store, facts, "quick").startswith("Measured on 2026-12-01 to 2026-12-02 ")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- results:start -->\nold\n<!-- results:end -->\nrest\n")
    pages.update_readme(readme, block)
    assert readme.read_text() == f"# x\n<!-- results:start -->\n{block}\n<!-- results:end -->\nrest\n"


def test_the_docs_site_builds_offline_with_no_warning(tmp_path):
    """`make docs`: README.md as the home page, every docs page, strict (a warning fails it)."""
    import subprocess
    import sys

    from cpuopt_helpers import site

    config = site.source(ROOT, tmp_path)
    proc = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "-f", str(config)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr
    home = (tmp_path / "site" / "index.html").read_text()
    assert "make run" in home and 'href="own-model.html"' in home and "figures.js" in home
    assert "https://" not in "".join(line for line in home.splitlines() if "<script" in line or "stylesheet" in line)
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert (tmp_path / "site" / ("contents.html" if page.stem == "index" else f"{page.stem}.html")).exists()
    linked = re.findall(r"\]\(docs/results/([^)]+\.md)\)", (ROOT / "README.md").read_text())
    assert all(f'href="results/{name.removesuffix(".md")}.html"' in home for name in linked)  # the block's page


def test_a_results_page_the_site_lacks_is_named_on_the_home_page_not_linked(tmp_path):
    from cpuopt_helpers import site

    (tmp_path / "results").mkdir()
    config = site.source(ROOT, tmp_path / "build", results=tmp_path / "results")
    home = (config.parent / "docs-src" / "index.md").read_text()
    assert "](docs/results/" not in home  # mkdocs --strict would fail on a link to a page it does not have


def test_the_measuring_pages_power_table_is_what_the_simulation_gives():
    from cpuopt_helpers import power

    text = (ROOT / "docs" / "measuring.md").read_text()
    inside = text.split("<!-- power:start -->\n", 1)[1].split("\n<!-- power:end -->", 1)[0]
    assert inside == power.block(), "run `python -m cpuopt_helpers.power --write docs/measuring.md` (make docs does)"


def test_the_case_study_pages_targets_are_the_codes():
    from cpuopt_helpers import targets

    text = (ROOT / "docs" / "case-study.md").read_text()
    inside = text.split("<!-- targets:start -->\n", 1)[1].split("\n<!-- targets:end -->", 1)[0]
    assert inside == targets.table(), "paste `python -c 'from cpuopt_helpers import targets; print(targets.table())'`"
