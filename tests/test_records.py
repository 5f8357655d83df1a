"""The dated records of `make overhead`, `make parse-speed` and `make test`: the page's name, its
stamp, a rerun replacing that day's page and another day making another, the make-test record,
and a peer named by its own git (a repository made here with `git init`). Starts no worker and
runs no benchmark: the pages are written from made-up JSON."""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from cpuopt_helpers import records, wording

ROOT = Path(__file__).resolve().parents[1]
DAY1, DAY2 = datetime(2026, 12, 1, 9, 30, tzinfo=timezone.utc), datetime(2026, 12, 2, 9, 30, tzinfo=timezone.utc)
XEON = {"cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "isa": {"avx2": True, "avx512f": True, "amx_bf16": True},
        "physical_cores": 56, "logical_cores": 112, "versions": {"torch": "2.13.0+cpu"}}
needs_git = pytest.mark.skipif(not shutil.which("git"), reason="git is not installed")


def benchmark(name: str):
    """benchmarks/NAME.py as a module (the folder is no package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@example.org",
                           "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def checkout(tmp_path: Path, tag: str | None = "v3.7") -> Path:
    """A made-up oneDNN checkout: scripts/verbose_converter/verbose_converter.py committed (and tagged)."""
    repo = tmp_path / "oneDNN"
    converter = repo / "scripts" / "verbose_converter"
    converter.mkdir(parents=True)
    (converter / "verbose_converter.py").write_text("print('made up')\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    git(repo, "remote", "add", "origin", "https://user:secret@github.com/uxlfoundation/oneDNN.git")
    if tag:
        git(repo, "tag", tag)
    return converter


def write(folder, facts, name="overhead", rows=(records.Row("x", "1 s"),), when=DAY1, **kwargs):
    return records.write_record(folder, name, "A record", list(rows), f"make {name}", facts=facts, when=when,
                                commit="abc1234", **kwargs)


def test_the_page_is_named_by_day_cpu_isa_and_command(tmp_path, facts):
    page = write(tmp_path / "results", facts(**XEON))
    assert page == tmp_path / "results" / "2026-12-01-intel-xeon-platinum-8480-amx-overhead.md"
    assert records.page_path(tmp_path, facts(cpu_model="AMD EPYC 7B13", isa={"avx2": True}), "make-test",
                             "2026-12-01").name == "2026-12-01-amd-epyc-7b13-avx2-make-test.md"
    late = datetime(2026, 12, 2, 0, 30, tzinfo=timezone(timedelta(hours=2)))  # 22:30 UTC on the 1st
    assert write(tmp_path, facts(**XEON), when=late).name.startswith("2026-12-01-")  # the day in UTC, as the store's


def test_the_stamp_names_the_machine_day_commit_torch_and_command(tmp_path, facts):
    text = write(tmp_path, facts(**XEON), preset="quick").read_text()
    stamp = text.splitlines()[2]
    for needed in ("**Intel(R) Xeon(R) Platinum 8480+** (amx)", "56 physical / 112 logical cores", "2026-12-01",
                   "commit abc1234", "torch 2.13.0+cpu", "Regenerate with `make overhead`", "preset `quick`",
                   "measuring code "):
        assert needed in stamp, (needed, stamp)
    assert text.startswith("# A record: Intel(R) Xeon(R) Platinum 8480+ (amx), 2026-12-01\n")
    assert "| figure | value | interval | rounds |" in text and "| x | 1 s |  |  |" in text
    assert "What its words mean" not in stamp  # no docs beside this folder: no link to a page that is not there
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "measuring.md").write_text("## Words the pages use\n")
    stamp = write(tmp_path / "docs" / "results", facts(**XEON)).read_text().splitlines()[2]
    assert stamp.endswith("What its words mean: [how it measures](../measuring.md#words-the-pages-use). Every page "
                          "by day: [the index](index.md).")
    (tmp_path / "docs" / "case-study.md").write_text("### Targets\n")
    target = records.Row("target for AMX CPUs: 3.0x over PyTorch's defaults", "not checked here")
    stamps = [write(tmp_path / "docs" / "results", facts(**XEON), rows=rows).read_text().splitlines()[2]
              for rows in ([records.Row("x", "1 s")], [target])]
    link = "Its targets, and where they come from: [the case study](../case-study.md#targets)."
    assert [link in s for s in stamps] == [False, True]  # only a page that checks a target links them


def test_a_rerun_on_the_same_day_replaces_the_page_and_another_day_or_machine_is_another_file(tmp_path, facts):
    first = write(tmp_path, facts(**XEON), rows=[records.Row("launch", "1.50 s")])
    again = write(tmp_path, facts(**XEON), rows=[records.Row("launch", "1.70 s")], when=DAY1.replace(hour=17))
    assert again == first and "1.70 s" in first.read_text() and "1.50 s" not in first.read_text()
    other_day = write(tmp_path, facts(**XEON), when=DAY2)
    other_machine = write(tmp_path, facts(**{**XEON, "isa": {"avx2": True}}))
    assert len({first, other_day, other_machine}) == 3
    assert sorted(p.name for p in tmp_path.glob("*.md") if p.name != "index.md") == sorted(
        p.name for p in (first, other_day, other_machine))
    assert "1.70 s" in first.read_text()  # the other files left it alone


def test_a_new_page_links_its_days_earlier_ones_and_the_index_lists_every_page_by_day_and_machine(tmp_path, facts):
    from cpuopt_helpers import pages

    folder, epyc = tmp_path / "results", {"cpu_model": "AMD EPYC 9B14", "isa": {"avx2": True, "avx512f": True}}
    first = write(folder, facts(**XEON), name="make-test", when=DAY1)
    assert "other pages" not in first.read_text() and "[the index](index.md)" in first.read_text()  # alone that day
    second = write(folder, facts(**XEON), name="overhead", when=DAY1)
    write(folder, facts(**epyc), name="overhead", when=DAY1)  # another machine: not linked from the Xeon's pages
    write(folder, facts(**XEON), name="overhead", when=DAY2)  # another day: likewise
    stamp = second.read_text().splitlines()[2]
    assert stamp.endswith(f"This machine's earlier pages of 2026-12-01: [A record]({first.name}). Every page by "
                          "day: [the index](index.md).")
    index = (folder / "index.md").read_text()
    assert index == pages.results_index(folder)  # each writer rewrites it
    days = [line for line in index.splitlines() if line.startswith("## ")]
    assert days == ["## 2026-12-02", "## 2026-12-01"]  # newest first
    day1 = index.split("## 2026-12-01\n", 1)[1].strip().splitlines()
    assert day1 == ["- AMD EPYC 9B14 (avx512): [A record](2026-12-01-amd-epyc-9b14-avx512-overhead.md)",
                    f"- Intel(R) Xeon(R) Platinum 8480+ (amx): [A record]({first.name}) · [A record]({second.name})"]
    (folder / "notes.md").write_text("# not a dated page\n")
    assert "notes.md" not in pages.results_index(folder)
    for stem, preset in (("2026-12-02-amd-epyc-9b14-avx512-quick", "quick"), ("2026-12-02-amd-epyc-9b14-avx512",
                                                                             "standard")):
        (folder / f"{stem}.md").write_text(f"# Results: AMD EPYC 9B14 (avx512), 2026-12-02, preset {preset}\n")
    day2 = pages.results_index(folder).split("## 2026-12-02\n", 1)[1].split("##", 1)[0]
    assert day2.index("[make run, preset standard]") < day2.index("[make run, preset quick]") < day2.index(
        "[A record]")  # a run's standard page first, then its other presets', then the records


def test_the_index_is_written_only_into_a_folder_of_dated_pages(tmp_path, capsys):
    from cpuopt_helpers import pages

    assert records.main(["index", "--folder", str(tmp_path / "missing")]) == 2
    assert "is not a folder of dated pages" in capsys.readouterr().err
    assert "No dated page yet" in pages.write_index(tmp_path).read_text()  # an empty folder says so
    (tmp_path / "index.md").write_text("# Contents\n\nwritten by hand\n")  # docs/index.md, say
    assert records.main(["index", "--folder", str(tmp_path)]) == 2
    assert "is not the index of dated pages" in capsys.readouterr().err
    assert (tmp_path / "index.md").read_text() == "# Contents\n\nwritten by hand\n"


def test_the_committed_index_lists_every_committed_page():
    from cpuopt_helpers import pages

    folder = ROOT / "docs" / "results"
    assert (folder / "index.md").read_text() == pages.results_index(folder), \
        "run `python -m cpuopt_helpers.records index` (each page writer does)"


def test_a_cell_with_a_bar_does_not_break_the_table():
    assert records.table([records.Row("a | b", "1")])[-1] == "| a \\| b | 1 |  |  |"


@pytest.mark.parametrize("seconds, words", [(42, "42 s"), (60, "1 min 0 s"), (1865.4, "31 min 5 s"),
                                            (3725, "1 h 2 min 5 s"), (-1, "0 s")])
def test_durations_in_words(seconds, words):
    assert wording.duration_words(seconds) == words


def test_the_make_test_record_says_how_long_it_took_and_whether_it_passed(tmp_path, facts, monkeypatch, capsys):
    monkeypatch.setattr(records, "collect_facts", lambda: facts(**XEON))
    monkeypatch.setattr(records, "own_commit", lambda root=records.ROOT: "abc1234 with uncommitted changes")
    assert records.main(["make-test", "--seconds", "1865", "--status", "0", "--folder", str(tmp_path)]) == 0
    (page,) = tmp_path.glob("*-make-test.md")
    assert page.name.endswith("-intel-xeon-platinum-8480-amx-make-test.md") and str(page) in capsys.readouterr().out
    text = page.read_text()
    for needed in ("# make test: Intel(R) Xeon(R) Platinum 8480+ (amx)", "| 31 min 5 s |", "| outcome | passed |",
                   "commit abc1234 with uncommitted changes", "Regenerate with `make test`", "56 physical / 112"):
        assert needed in text, needed
    records.main(["make-test", "--seconds", "42", "--status", "2", "--folder", str(tmp_path)])
    text = page.read_text()  # the same day: replaced
    assert "failed (exit status 2)" in text and "42 s" in text and "31 min" not in text


@needs_git
def test_the_own_commit_comes_from_git_or_says_there_is_none(tmp_path):
    repo = checkout(tmp_path, tag=None).parents[1]
    short = git(repo, "rev-parse", "--short", "HEAD")
    assert records.own_commit(repo) == short
    (repo / "scripts" / "verbose_converter" / "verbose_converter.py").write_text("changed\n")
    assert records.own_commit(repo) == f"{short} with uncommitted changes"
    assert records.own_commit(repo / "scripts") == records.NOT_A_CHECKOUT  # inside someone else's tree
    (tmp_path / "plain").mkdir()
    assert records.own_commit(tmp_path / "plain") == records.NOT_A_CHECKOUT == "not a git checkout"


def test_a_copy_without_git_names_the_commit_it_was_given(tmp_path, monkeypatch):
    (tmp_path / "plain").mkdir()
    monkeypatch.setenv("CPUOPT_COMMIT", "abc1234")
    assert records.own_commit(tmp_path / "plain") == "abc1234 (CPUOPT_COMMIT; not a git checkout)"
    monkeypatch.setenv("CPUOPT_COMMIT", " ")
    assert records.own_commit(tmp_path / "plain") == records.NOT_A_CHECKOUT


@needs_git
def test_the_peer_is_named_by_the_commit_its_checkout_gives(tmp_path):
    parse_speed = benchmark("parse_speed")
    converter = checkout(tmp_path)
    peer = parse_speed.peer(converter)
    commit = git(converter, "rev-parse", "HEAD")
    assert peer["commit"] == commit and peer["describe"] == "v3.7" and peer["exact"] and not peer["dirty"]
    assert peer["origin"] == "https://github.com/uxlfoundation/oneDNN.git"  # no user, no token
    assert (f"the scripts/verbose_converter folder of a oneDNN checkout at commit {commit} (v3.7), cloned from "
            "https://github.com/uxlfoundation/oneDNN.git, given as VERBOSE_CONVERTER") == peer["obtained"]
    (converter / "verbose_converter.py").write_text("print('changed')\n")
    changed = parse_speed.peer(converter)
    assert changed["commit"] == commit and changed["dirty"] and not changed["exact"]
    assert "uncommitted changes" in changed["obtained"] and "no claim" in changed["obtained"]


@needs_git
def test_a_peer_outside_git_is_of_unknown_version(tmp_path):
    parse_speed = benchmark("parse_speed")
    plain = tmp_path / "copy"
    plain.mkdir()
    (plain / "verbose_converter.py").write_text("print('made up')\n")
    inside = checkout(tmp_path).parent / "untracked"  # a copy lying untracked in some other checkout
    inside.mkdir()
    (inside / "verbose_converter.py").write_text("print('made up')\n")
    for folder in (plain, inside):
        peer = parse_speed.peer(folder)
        assert peer["commit"] is None and not peer["exact"], folder
        assert "not a git checkout" in peer["obtained"] and "version is unknown" in peer["obtained"]


def parse_speed_json(peer: dict | None) -> dict:
    out = {"lines": 1_000_000, "rounds": 3, "exec_rows": 999_000,
           "seconds": {"cpuopt profile --json": [2.0, 2.1, 2.2], "parse_log alone": [1.0, 1.1, 1.2]},
           "median_s": {"cpuopt profile --json": 2.1, "parse_log alone": 1.1}, "lines_per_s": 909091,
           "ratio_over_cpuopt": {}}
    if peer:
        out["seconds"]["verbose_converter breakdown"] = [9.0, 9.5, 10.0]
        out["median_s"]["verbose_converter breakdown"] = 9.5
        out["ratio_over_cpuopt"]["verbose_converter breakdown"] = [4.5, 4.52, 4.55]
        out["peer"] = peer
    return out


@needs_git
def test_the_parse_speed_page_claims_a_ratio_only_against_a_named_peer(tmp_path, facts):
    parse_speed = benchmark("parse_speed")
    converter = checkout(tmp_path)
    commit = git(converter, "rev-parse", "HEAD")
    kwargs = {"facts": facts(**XEON), "when": DAY1, "commit": "abc1234"}
    known = parse_speed_json(parse_speed.peer(converter))
    text = parse_speed.write_page(known, tmp_path / "known", **kwargs).read_text()
    assert f"at commit {commit} (v3.7)" in text and "never copied" in text
    assert "Regenerate with `make parse-speed VERBOSE_CONVERTER=DIR`" in text
    assert "| `verbose_converter breakdown` over `cpuopt profile --json`, round by round | 4.52x (median) |" in text
    plain = tmp_path / "copy"
    plain.mkdir()
    (plain / "verbose_converter.py").write_text("")
    page = parse_speed.write_page(parse_speed_json(parse_speed.peer(plain)), tmp_path / "unknown", **kwargs)
    text = page.read_text()
    assert page.name == "2026-12-01-intel-xeon-platinum-8480-amx-parse-speed.md"
    assert "version is unknown" in text and "no ratio against it" in text and "over `cpuopt profile" not in text
    assert "| `verbose_converter breakdown` | 9.50 s (median) | range 9.00-10.00 s | 3 paired rounds |" in text
    alone = parse_speed.write_page(parse_speed_json(None), tmp_path / "alone", **kwargs).read_text()
    assert "Regenerate with `make parse-speed`." in alone and "peer" not in alone and "909,091 lines/s" in alone


def test_the_overhead_page_from_its_json(tmp_path, facts):
    overhead = benchmark("overhead")
    result = {"workload": "cnn quick", "startup_s": {"median": 3.21, "p10": 3.1, "p90": 3.5, "n": 5},
              "per_step": {"bare_step_ms": 12.3, "timed_step_ms": 12.4, "overhead_us_median": 55.0,
                           "timed_over_bare": {"ratio": 1.004, "ci_low": 1.001, "ci_high": 1.007, "n": 7,
                                               "label": "95% CI", "verdict": "faster"},
                           "rounds": 7, "steps_per_round": 30}}
    text = overhead.write_page(result, tmp_path, facts=facts(**XEON), when=DAY1, commit="abc1234").read_text()
    for needed in ("| launch to first step (median) | 3.21 s | p10-p90 3.10-3.50 s | 5 fresh workers |",
                   "| 55.0 µs |", "| 1.004x | 95% CI 1.001-1.007 | 7 paired blocks |", "7 blocks of 30 steps",
                   "Regenerate with `make overhead`", "preset `quick`"):
        assert needed in text, needed
    result["per_step"]["timed_over_bare"].update(ci_low=math.nan, ci_high=math.nan, n=3)
    assert "none (too few blocks)" in "\n".join(" | ".join(r) for r in overhead.rows(result))


def stub_make(tmp_path: Path, pytest_status: int, *flags: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`make test` in a copy of the Makefile, setup taken as done, every python a stub that logs its
    arguments and exits with ``pytest_status`` for pytest."""
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    work, venv = tmp_path / "repo", tmp_path / "env"
    (work / "scripts").mkdir(parents=True)
    (venv / "bin").mkdir(parents=True)
    shutil.copy2(ROOT / "Makefile", work / "Makefile")
    (work / "scripts" / "system-deps.sh").write_text("exit 0\n")
    shutil.copy2(ROOT / "scripts" / "low-priority.sh", work / "scripts" / "low-priority.sh")
    log = tmp_path / "calls.log"
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/bash\necho "$*" >> {log}\ncase "$*" in *pytest*) exit {pytest_status};; esac\n')
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    log.touch()
    done = subprocess.run(["make", *flags, "-o", "setup", "test", f"VENV={venv}"], cwd=work, capture_output=True,
                          text=True, timeout=60, env=env)
    return done, log.read_text().splitlines()


@pytest.mark.parametrize("status", [0, 1])
def test_make_test_records_its_duration_and_keeps_the_tests_status(tmp_path, status):
    done, calls = stub_make(tmp_path, status)
    assert len([c for c in calls if "pytest" in c]) == 2, calls  # both halves ran
    (record,) = [c for c in calls if "cpuopt_helpers.records" in c]
    assert record.startswith("-m cpuopt_helpers.records make-test --seconds ")
    assert record.endswith(f" --status {2 if status else 0} --folder docs/results"), record  # the sub-make's status
    assert int(record.split("--seconds ")[1].split()[0]) >= 0
    assert (done.returncode != 0) == bool(status), done.stdout + done.stderr


def test_make_n_test_writes_no_record(tmp_path):
    done, calls = stub_make(tmp_path, 0, "-n")
    assert done.returncode == 0 and calls == [] and "cpuopt_helpers.records" not in done.stdout, done.stdout


def test_the_measuring_targets_write_their_pages():
    makefile = (ROOT / "Makefile").read_text()
    assert "$(PY) benchmarks/overhead.py --page docs/results" in makefile
    assert "$(PY) benchmarks/parse_speed.py --page docs/results" in makefile


@pytest.mark.parametrize("model, slug", [("Intel(R) Xeon(R) Processor @ 2.80GHz", "intel-xeon-2-80ghz"),
                                         ("AMD EPYC 9B14 96-Core Processor", "amd-epyc-9b14-96-core"),
                                         ("Intel(R) Core(TM) i7-1185G7 CPU @ 3.00GHz", "intel-core-i7-1185g7-3-00ghz"),
                                         ("", "cpu")])
def test_a_record_is_named_by_the_cpu_model_without_its_trademark_marks(model, slug):
    from types import SimpleNamespace

    from cpuopt_helpers.pages import cpu_slug

    assert cpu_slug(SimpleNamespace(cpu_model=model)) == slug


def test_the_results_page_gives_each_baseline_both_shares_of_peak(monkeypatch, facts):
    """Notebook 01's table and sentence on the dated page: GFLOP/s over the measured fp32 GEMM ceiling
    and over the theoretical fp32 peak, each "unknown" where it cannot be known."""
    import pandas as pd

    from cpuopt_helpers import pages, peak

    row = {"samples_per_s": 36.0, "low": 33.0, "high": 39.0, "runs": 2, "step_ms": 445.0, "forward_share": 0.36,
           "backward_share": 0.6, "optimizer_share": 0.03, "warning": None}
    table = pd.DataFrame([{"workload": "cnn", **row, "gflops": 103.0},
                          {"workload": "mine", **row, "gflops": math.nan}]).set_index("workload")
    roof, theory = {"threads": 2, "gemm_gflops_best": 332.0, "copy_gbs_best": 14.4}, {"fp32": 412.0}
    real = peak.peak_report

    def made_up(cpuinfo, cores, roofline):
        report = real(cpuinfo, cores, roofline)
        return {**report, "fp32": {**report["fp32"], "theoretical_gflops": theory["fp32"], "measured_share": None}}

    monkeypatch.setattr(peak, "peak_report", made_up)
    machine = facts(versions={"onednn_bf16_supported": False}, numactl={"present": True, "works": True})
    lines = pages._baseline_lines(table, machine, roof)
    assert lines[0].endswith("| GFLOP/s | of the measured fp32 GEMM ceiling | of the theoretical fp32 peak |")
    assert lines[2].endswith("| 103.0 | 31% | 25% |") and lines[3].endswith("| unknown | unknown | unknown |")
    assert any("31% of the measured fp32 GEMM ceiling and 25% of the theoretical fp32 peak" in line for line in lines)
    at = next(i for i, line in enumerate(lines) if line.startswith("- The peaks the shares divide by"))
    assert lines[at + 1].startswith("  - peak fp32: 412 GFLOP/s theoretical (")  # the peak itself, and what it rests on
    theory["fp32"] = None  # a CPU not in peak.CORES, or no clock
    assert pages._baseline_lines(table, machine, roof)[2].endswith("| 103.0 | 31% | unknown |")


def test_the_paper_tables_overall_row_is_the_ladders_confirmed_top_once_measured(tmp_path):
    """Notebook 08 screens the recipe once; notebook 09 confirms the ladder's top against the
    defaults in fresh rounds: the page's paper table then says the confirmed verdict, not the screen."""
    from cpuopt_helpers import pages
    from cpuopt_helpers.config import RunConfig
    from cpuopt_helpers.results import ResultStore
    from cpuopt_helpers.session import Session
    from tests.conftest import make_facts

    session = Session(facts=make_facts(), store=ResultStore(tmp_path / "r.sqlite"))
    screened = {"ratio": 1.9, "n": 1, "verdict": "too few rounds", "screened": True}
    rows = [{"fix": f, "paper": 2.0, "here": 1.9, "here, worded": "1.90x (screened only, 1 round)", "why": "step",
             "measured as": how}
            for f, how in (("fused Lamb", "the kernel alone"), ("overall", "the whole training step"))]
    session.store.put_fact("m", "case-study/paper/quick", rows)
    screened_row = "| overall | 2.00x | 1.90x (screened only, 1 round) | the whole training step | step |"
    assert pages._paper_lines(session.store, "m", "quick", 2)[-1] == screened_row
    retina = RunConfig.for_preset("retinanet", "quick").replace(threads=2)
    session.hand_on(retina, "baseline")
    top = {"ratio": 1.7, "ci_low": 1.5, "ci_high": 1.9, "n": 5, "verdict": "faster", "label": "95% CI"}
    session.hand_on(retina.replace(dtype="bf16"), "case-study fixes", comparison=screened, evidence={"end_to_end": top})
    lines = pages._paper_lines(session.store, "m", "quick", 2)
    assert lines[-2] == screened_row.replace("overall", "fused Lamb").replace(
        "the whole training step", "the kernel alone")  # the other rows as notebook 08 had them
    assert lines[-1].startswith("| overall | 2.00x | 1.70x (95% CI: 1.50-1.90, 5 rounds): faster | the whole "
                                "training step | the ladder's top "
                                "against PyTorch's defaults in fresh paired rounds")
    assert lines[-1].endswith("notebook 08: 1.90x (screened only, 1 round) |")


@pytest.mark.parametrize("ran_at, said", [("quick", True), ("standard", False)])
def test_the_pages_bf16_table_says_the_quick_preset_only_where_notebook_06_moved_to_it(monkeypatch, ran_at, said):
    from cpuopt_helpers import pages
    from cpuopt_helpers.config import RunConfig

    fp32 = RunConfig.for_preset("cnn", ran_at, threads=2)
    runs = [{"status": "ok", "config": c.to_dict(), "config_hash": c.config_hash(), "round": 0, "sweep": "s", "arm": a,
             "peak_rss_mb": 100.0, "samples_per_s": s}
            for a, (c, s) in enumerate(((fp32, 10.0), (fp32.replace(dtype="bf16"), 17.0)))]
    monkeypatch.setattr(pages, "last_sweep_runs", lambda store, tag, machine, preset=None: runs)
    lines = pages._precision_lines(None, "m", "standard")
    assert ("at the quick preset, since this CPU has no bf16 fast path" in lines[1]) == said
    assert lines[-1] == "| cnn | dtype=bf16 | 1.70x (screened only, 1 round) |"


def test_the_results_page_gives_the_wall_time_of_the_run_that_measured_it(tmp_path):
    """`make run`'s page: each notebook's wall time and the total, from the kept run whose span holds
    the baseline's first run; nothing where none does (another run's times are never borrowed)."""
    from cpuopt_helpers import pages
    from cpuopt_helpers.results import ResultStore

    store = ResultStore(tmp_path / "r.sqlite")
    books = [{"notebook": "00_system_check.ipynb", "status": "ok", "seconds": 65.2},
             {"notebook": "01_baseline.ipynb", "status": "failed", "seconds": 1800.0}]
    runs = [{"started_at": "2026-12-06T23:50:00+00:00", "finished_at": "2026-12-07T00:22:00+00:00", "notebooks": books},
            {"started_at": "2026-12-07T09:00:00+00:00", "finished_at": "2026-12-07T09:10:00+00:00",
             "notebooks": books[1:]}]  # a later `--only 01`
    store.put_fact("m", pages.TIMES_FACT.format(preset="standard"), runs)
    lines = pages.wall_time_lines(store, "m", "standard", "2026-12-06T23:51:10+00:00")
    assert lines[1] == ("Wall time: the run that measured this page took 31 min 5 s for 2 notebook(s), from "
                        "2026-12-06 23:50 UTC (setup and this page not included).")
    assert lines[-3:] == ["| 00_system_check | ok | 1 min 5 s |", "| 01_baseline | failed | 30 min 0 s |",
                          "| all | | 31 min 5 s |"]
    assert pages.wall_time_lines(store, "m", "standard", "2026-12-07T09:05:00+00:00")[1].startswith(
        "Wall time: the run that measured this page took 30 min 0 s for 1 notebook(s)")
    assert pages.wall_time_lines(store, "m", "standard", "2026-12-07T08:00:00+00:00") == []  # measured apart
    assert pages.wall_time_lines(store, "m", "quick", "2026-12-06T23:51:10+00:00") == []  # no run kept


def test_the_page_says_notebook_04s_allocator_stage_ran_where_its_launcher_comparison_did_not(tmp_path):
    from cpuopt_helpers import pages
    from cpuopt_helpers.config import RunConfig
    from cpuopt_helpers.results import ResultStore, run_sweep

    store = ResultStore(tmp_path / "r.sqlite")
    [line] = pages._launcher_lines(store, "m", "standard")[1:]
    assert line.startswith("Launchers (notebook 04): its comparison of the best setting") and "full preset" in line
    config = RunConfig.for_preset("cnn", "standard")
    run_sweep([config], store, lambda c: {"config": c.to_dict(), "config_hash": c.config_hash(), "status": "ok",
                                          "samples_per_s": 1.0, "system": "m", "reason": "",
                                          "created_at": "2026-12-07T00:00:00+00:00"},
              tag="04_allocator", machine="m", progress=False)
    [line] = pages._launcher_lines(store, "m", "standard")[1:]
    assert line.startswith("Launchers (notebook 04): its allocator stage ran (its verdict: the ladder and the "
                           "confirmations below)")  # the launcher lines come before both


def test_the_stamps_name_the_core_and_a_virtual_machines_vcpus(facts):
    from cpuopt_helpers import pages, system

    vm = facts(microarchitecture="AMD Zen 4", virtual_machine=True, cpu_model="AMD EPYC", physical_cores=2,
               logical_cores=2)
    assert pages.core_words(vm, "; ") == "AMD Zen 4 in a virtual machine; "
    assert pages.cores_words(vm) == "2 physical / 2 logical cores (a VM's vCPUs)"
    assert "on **AMD EPYC** (AMD Zen 4 in a virtual machine, " in records.stamp(vm, "2026-12-07", "make x", "abc")
    bare = facts(microarchitecture=None, virtual_machine=False)
    assert pages.core_words(bare, "; ") == "" and "vCPU" not in pages.cores_words(bare)
    assert pages.core_words(facts(microarchitecture=None, virtual_machine=True)) == "in a virtual machine"
    assert system.is_virtual("flags\t: fpu avx2 hypervisor lahf_lm") and not system.is_virtual("flags\t: fpu avx2")
    here = system.collect_facts()  # doctor's report of this machine, named as made up above
    vm = here.replace(microarchitecture="AMD Zen 4", virtual_machine=True, cpu_model="AMD EPYC")
    assert system.format_facts(vm).splitlines()[0] == ("CPU          AMD EPYC (AMD Zen 4, a virtual machine: its cores "
                                                       "are the vCPUs its host gives it)")
