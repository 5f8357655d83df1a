"""Bad input across every subcommand: one line on stderr, exit 2, no traceback, and the results
store exactly as it was (issue 34's table; tests/test_cli.py's BAD_INPUT holds the bench and
workbook-run cases it had before)."""

import io
import json
import sqlite3
from contextlib import redirect_stderr, redirect_stdout

import pytest

from cpuopt_helpers import cli, launch
from cpuopt_helpers.results import ResultStore


def files(tmp):
    (tmp / "afile").write_text("x")
    (tmp / "empty.json").write_text("")
    (tmp / "emptydir").mkdir()
    (tmp / "train.py").write_text("pass\n")
    (tmp / "notalog.log").write_text("garbage\n")
    (tmp / "bad.log").write_text("onednn_verbose,v1,primitive,exec,cpu,convolution\nnot,a,log\n")
    (tmp / "theirs" / "report").mkdir(parents=True)
    (tmp / "theirs" / "report.0").mkdir()
    (tmp / "theirs" / "report" / "notes.md").write_text("the user's own")
    (tmp / "trace.json").write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0,
                                                                "dur": 1}]}))
    (tmp / "meta.log").write_text("garbage\n")
    (tmp / "meta.log.meta.json").write_text(json.dumps({"steps": -4}))
    (tmp / "zero.json").write_text(json.dumps({"gemm_gflops_best": 0, "copy_gbs_best": 10}))
    exec_line = ("onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx512_core,forward_training,src:f32::blocked:"
                 "abcd::f0 wei:f32::blocked:abcd::f0 dst:f32::blocked:abcd::f0,,alg:convolution_direct,"
                 "mb2_ic16oc16_ih7oh7kh5sh1dh0ph2_iw7ow7kw5sw1dw0pw2,{}\n")
    (tmp / "quiet.log").write_text("onednn_verbose,v1,info,oneDNN v3.12.0\nthe program's own output\n")
    (tmp / "corrupt.log").write_text("onednn_verbose,v1,info,oneDNN v3.12.0\n" + exec_line.format("abc") * 2)


CMD = ["--", "python3", "-c", "pass"]
BAD = [  # (arguments, with {tmp} for the test's folder; words of the one line expected)
    (["doctor", "--bogus"], "unrecognized arguments: --bogus"),
    (["launch", "--log-dir", "/proc/nope", *CMD], "cannot use /proc/nope"),
    (["launch", "--instance-dirs", "{tmp}/afile", *CMD], "Not a directory"),
    (["launch", "--ninstances", "0", *CMD], "instances must be at least 1"),
    (["launch", "--", "no-such-program-here"], "cannot run no-such-program-here: no such program on PATH"),
    (["launch", "--", "{tmp}/nope.sh"], "no such program at that path"),
    (["launch", "--", "{tmp}/train.py"], "no such program at that path"),  # there, but not executable
    (["compare", "--script", "no-such-program-here", "--a", "--threads 1", "--b", "--threads 2"],
     "cannot run no-such-program-here"),
    (["launch", "--ninstances", "4096", *CMD], "4096 instances need at least 4096 cores"),
    (["launch", "--ninstances", "4096", *CMD], "use --ninstances"),  # launch's flags, not bench's --instances
    (["launch", "--ninstances", "2", "--ncores-per-instance", "2", *CMD],
     "lower --ncores-per-instance or --ninstances"),
    (["launch", "--nproc-per-node", "4096", "--", "python3", "{tmp}/train.py"], "use --nproc-per-node"),
    (["launch", "--"], "no command given"),
    (["launch", "--nproc-per-node", "1", "--nnodes", "abc", *CMD], "--nnodes 'abc' is not a machine count"),
    (["launch", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "5", *CMD],
     "--node-rank '5' is not a rank of 2 machine(s): give 0 to 1"),
    (["launch", "--allocator", "hoard", *CMD], "unknown allocator 'hoard'"),
    (["launch", "--affinity", "sideways", *CMD], "unknown affinity 'sideways'"),
    (["launch", "--cores", "0-99999999", "--dry-run", *CMD], "core range '0-99999999' in '0-99999999' is not"),
    (["launch", "--cores", "1-0", "--dry-run", *CMD], "0 <= FIRST <= LAST"),
    (["bench", "--workload", "retinanet", "--option", "focal=reference", "--option", "focal=fast", "--dry-run"],
     "--option focal= is given twice ('reference' and 'fast'): give it once"),
    (["workbook", "report", "--out", "{tmp}/afile"], "Not a directory"),
    (["workbook", "report", "--out", "{tmp}/theirs"], "was not written by cpuopt"),
    (["workbook", "readme", "--write", "{tmp}/missing.md"], "run `make run` first"),
    (["workbook", "run", "--out", "/proc/nope"], "cannot use /proc/nope"),
    (["workbook", "run", "--only", "01", "-p", "ROUNDS"], "expected 2 arguments"),
    (["profile", "{tmp}/nosuch.log"], "does not exist"),
    (["profile", "{tmp}/notalog.log"], "is not a verbose log"),
    (["profile", "{tmp}/bad.log"], "1 of its 2 lines is an executed primitive that cannot be read"),  # cut short
    (["profile", "--whole-step", "--workload", "cnn", "{tmp}/trace.json"], "not both"),
    (["profile", "{tmp}/meta.log"], "meta.log.meta.json is not what `cpuopt bench --onednn-verbose` writes"),
    (["profile", "{tmp}/bad.log", "--project", "--steps", "1", "--step-ms", "-5"], "--step-ms must be a positive"),
    (["profile", "{tmp}/bad.log", "--project", "--steps", "1", "--threads", "0"], "--threads must be 1 to"),
    (["profile", "--whole-step", "{tmp}/trace.json", "--roofline", "{tmp}/zero.json"], "positive rates"),
    (["compare", "--min-rounds", "1"], "the following arguments are required: --a, --b"),
    (["compare", "--a", "--workload cnn", "--b", ""], "give --workload and --preset once"),
    (["compare", "--a", "", "--b", "--save"], "--save is not an arm's option"),
    (["profile", "--whole-step", "{tmp}/bad.log"], "is a oneDNN verbose log, not a trace"),
    (["profile", "--whole-step", "{tmp}/empty.json"], "empty.json is empty"),
    (["workbook", "report", "--out", "{tmp}/emptydir"], "holds no workbook run"),
    (["compare", "--a", "--threads 0", "--b", ""], "threads must be at least 1"),
    (["compare", "--a", "", "--b", "--threads 4096"], "--b '--threads 4096': --threads 4096 is more than"),
    (["ladder", "--preset", "bogus"], "unknown preset 'bogus'"),
    (["compare", "--a", "'unbalanced", "--b", ""], "No closing quotation"),
    (["compare", "--a", "", "--b", "", "--min-rounds", "9", "--max-rounds", "5"], "need 2 <= --min-rounds"),
    (["compare", "--script", "python3 {tmp}/train.py", "--metric", "(", "--a", "", "--b", "--allocator tcmalloc"],
     "is not a regular expression"),
    (["compare", "--script", "", "--a", "", "--b", "--allocator tcmalloc"], "--script needs a command"),
    (["compare", "--script", "python3 {tmp}/train.py", "--a", "--ninstances 4096", "--b", ""],
     "--a '--ninstances 4096': 4096 instances need at least 4096 cores"),  # its arm, in its own words:
    (["compare", "--script", "python3 {tmp}/train.py", "--a", "--ninstances 4096", "--b", ""], "use --ninstances"),
    (["tune", "--script", "", "--dry-run"], "--script needs a command"),
    (["workbook", "run", "--only", ","], "--only names no notebook"),
    (["workbook", "run", "--workloads", ","], "--workloads ',' names no workload"),
    (["workbook", "run", "--only", "01", "-p", "ROUNDS", "abc"], "-p ROUNDS 'abc': ROUNDS takes a whole number (its "
                                                                 "default: 3)"),
    (["workbook", "run", "--only", "01", "-p", "ROUNDS", "-3"], "-p ROUNDS -3: ROUNDS takes 0 or more"),
    (["workbook", "run", "--only", "08", "-p", "DISCREPANCY", "yes"], "DISCREPANCY takes True or False"),
    (["workbook", "run", "--only", "03", "-p", "BUDGET_MIN", "soon"], "BUDGET_MIN takes a number"),
    (["profile", "--whole-step", "{tmp}/trace.json", "--csv", "{tmp}/x.csv"], "does not combine with --compare"),
    (["ladder", "--workload", "nosuch"], "unknown workload 'nosuch'"),
    (["tune", "--workload", "nosuch"], "unknown workload 'nosuch'"),
    (["tune", "--budget-min", "-1"], "argument --budget-min: must be a positive number of minutes, got '-1'"),
    (["tune", "--budget-min", "nan", "--dry-run"], "must be a positive number of minutes, got 'nan'"),
    (["compare", "--a", "", "--b", "", "--budget-min", "0"], "must be a positive number of minutes, got '0'"),
    (["bench", "--option", "novalue"], "is not KEY=VALUE"),
    (["bench", "--env", "=x"], "is not KEY=VALUE"),
    (["bench", "--preset", "huge"], "unknown preset 'huge'"),
    (["bench", "--compile", "nosuch"], "unknown compile mode 'nosuch'"),
    (["bench", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["bench", "--cores", "0-1"], "unrecognized arguments: --cores"),
    (["bench", "--trace", "{tmp}/theirs"], "--trace {tmp}/theirs: {tmp}/theirs is a folder: name a file"),
    (["bench", "--trace", "{tmp}/nosuch/t.json"], "cannot write {tmp}/nosuch/t.json (its folder is missing"),
    (["bench", "--instances", "2", "--threads", "1", "--onednn-verbose", "{tmp}/theirs/report"],
     "{tmp}/theirs/report.0 is a folder"),  # instance N writes FILE.N
    (["compare", "--a", "", "--b", "--trace {tmp}/nosuch/t.json"], "--b '--trace {tmp}/nosuch/t.json': --trace"),
    (["bench", "--timeout", "nan"], "--timeout must be a positive number of seconds, got nan"),
    # found by a newcomer's review of the command line (2026-12-06)
    (["launch", "--cores", "0-4095", "--dry-run", *CMD], "--cores names CPUs"),  # not a thread count it never gave
    (["launch", "--cores", "0-4095", "--dry-run", *CMD], "that this machine lacks; use CPUs from 0-"),
    (["launch", "--ncores-per-instance", "4096", "--dry-run", *CMD], "--ncores-per-instance 4096 is more than"),
    (["launch", "--ncores-per-instance", "-2", "--dry-run", *CMD], "--ncores-per-instance must be at least 1"),
    (["launch", "--cores", "", "--dry-run", *CMD], "cannot read core list ''"),  # not all cores
    (["launch", "--nnodes", "2", "--rdzv-endpoint", "h:1", "--dry-run", *CMD],
     "--nnodes, --rdzv-endpoint are torchrun's: add --nproc-per-node N"),
    (["compare", "--workload", "rnn", "--script", "python3 {tmp}/train.py", "--a", "", "--b", ""],
     "give --workload or --script, not both"),
    (["tune", "--workload", "rnn", "--script", "python3 {tmp}/train.py", "--dry-run"], "not both"),
    (["tune", "--script", "python3 {tmp}/train.py", "--metric", "(", "--dry-run"], "is not a regular expression"),
    (["tune", "--metric", "x", "--dry-run"], "--metric reads a --script's output"),
    (["compare", "--script", "python3 {tmp}/train.py", "--a", "", "--b", "--bogus"],
     "--b '--bogus': unrecognized arguments: --bogus; with --script the arms take launch options"),
    (["bench", "--bogus"], "unrecognized arguments: --bogus (see `cpuopt bench --help`)"),
    (["workbook", "run", "--bogus"], "(see `cpuopt workbook run --help`)"),
    (["workbook", "readme", "--preset", "huge"], "unknown preset 'huge'"),
    (["workbook", "report", "--out", "{tmp}/nosuch"], "--out {tmp}/nosuch: no such folder"),
    (["profile", "{tmp}/bad.log", "--step-ms", "40"], "--step-ms is for --project"),
    (["profile", "{tmp}/bad.log", "--top", "3"], "--top is for --whole-step"),
    (["profile", "--whole-step", "{tmp}/trace.json", "--top", "0"], "give a positive count of operator rows"),
    (["profile", "{tmp}/quiet.log"], "none of its 2 lines is an executed primitive; usually no op reached oneDNN"),
    (["profile", "{tmp}/corrupt.log"], "2 of its 3 lines are executed primitives that cannot be read"),
]


def dump(path) -> list:
    with sqlite3.connect(path) as db:
        return [db.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in ("results", "facts", "sweeps")]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a)[:60] for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_and_leaves_the_store_as_it_was(args, needle, tmp_path, monkeypatch):
    files(tmp_path)
    store = tmp_path / "results.sqlite"
    monkeypatch.setenv("CPUOPT_RESULTS", str(store))
    monkeypatch.setenv("CPUOPT_BUILD", str(tmp_path / "build"))
    ResultStore(store).put_fact("m", "ladder/cnn/standard", [{"step": "baseline"}])
    before = dump(store)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main([a.format(tmp=tmp_path) for a in args])
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("cpuopt: error:"), err.getvalue()
    assert needle.format(tmp=tmp_path) in lines[0] and "Traceback" not in err.getvalue()
    assert dump(store) == before
    assert (tmp_path / "theirs" / "report" / "notes.md").read_text() == "the user's own"


def test_a_bug_prints_its_traceback_and_asks_for_a_report(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_doctor", lambda args: {}["no such key"])
    assert cli.main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError" in err and "this is a bug in cpuopt" in err.strip().splitlines()[-1]


@pytest.mark.parametrize("where", ["folder", "/proc/nope/results.sqlite"])
def test_a_results_store_that_cannot_be_opened_is_one_line_and_nothing_is_moved(where, tmp_path, monkeypatch,
                                                                                capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.md").write_text("the user's own")
    monkeypatch.setenv("CPUOPT_RESULTS", str(folder) if where == "folder" else where)
    monkeypatch.setattr(launch, "run_plan", lambda *a, **k: pytest.fail("a run started before the store was checked"))
    assert cli.main(["bench", "--steps", "1", "--warmup", "0", "--save"]) == 2  # refused before anything runs
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpuopt: error:") and "CPUOPT_RESULTS" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    assert (folder / "notes.md").read_text() == "the user's own"


def test_another_programs_database_is_moved_aside_not_read(tmp_path, caplog):
    path = tmp_path / "results.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE results (id INTEGER, score REAL)")
        db.execute("INSERT INTO results VALUES (1, 0.5)")
        db.execute("PRAGMA user_version = 99")
    store = ResultStore(path)
    assert store.moved_aside.name.startswith("results.foreign-") and store.results() == []
    with sqlite3.connect(store.moved_aside) as db:
        assert db.execute("SELECT * FROM results").fetchall() == [(1, 0.5)]  # kept as it was
    assert "is not a cpuopt results store" in caplog.text


def test_bench_saves_its_result_even_where_the_output_is_gone(tmp_path, monkeypatch):
    """`cpuopt bench --save --json | head -1`: the result is printed before it is saved, and saved
    though printing it failed."""
    from tests.test_results import fake_result
    from cpuopt_helpers.config import RunConfig

    monkeypatch.setenv("CPUOPT_RESULTS", str(tmp_path / "r.sqlite"))
    monkeypatch.setattr(launch, "run_plan", lambda plan, facts: fake_result(RunConfig()))

    class Gone(io.StringIO):
        def write(self, text):
            raise BrokenPipeError

    with redirect_stdout(Gone()):
        assert cli.main(["bench", "--steps", "1", "--warmup", "0", "--save", "--json"]) == 0
    assert [r["status"] for r in ResultStore(tmp_path / "r.sqlite").results()] == ["ok"]


def test_a_worker_that_refuses_its_input_is_one_line_exit_2_and_its_run_is_kept(tmp_path, monkeypatch):
    """A real worker whose workload is not one (it returns None) exits 2 saying why: `cpuopt bench`
    says that line alone and exits 2, not "failed" with a stderr tail; the failed run is stored."""
    import os
    import subprocess
    import sys

    (tmp_path / "notaworkload.py").write_text("def build(preset):\n    return None\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{os.getcwd()}",
               CPUOPT_RESULTS=str(tmp_path / "r.sqlite"))
    proc = subprocess.run([sys.executable, "-m", "cpuopt_helpers", "bench", "--workload", "notaworkload:build",
                           "--steps", "1", "--warmup", "0", "--save"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and proc.stdout == "", proc.stderr
    assert lines[0].startswith("cpuopt: error: notaworkload:build returned NoneType, not a Workload")
    [run] = ResultStore(tmp_path / "r.sqlite").results()
    assert run["status"] == "failed" and launch.refusal(run["reason"]) in lines[0]


def test_a_comparison_without_a_round_because_its_input_was_refused_exits_2(capsys):
    reason = f"{launch.BAD_INPUT}mywl:build returned NoneType (instance 0); stderr tail of instance 0:\nmore"
    result = {"n": 0, "order": ["AB", "BA"], "stopped": "failed", "failures": [reason] * 4, "ratio": None}
    with pytest.raises(cli.CpuoptError, match=r"^mywl:build returned NoneType \(instance 0\)$"):
        cli.report_comparison(result, "b over a", as_json=False)
    assert capsys.readouterr().out.count("failed run: mywl:build returned NoneType") == 1  # said once, not 4 times
    crashed = dict(result, failures=["instance 0 exited with code 1; stderr tail of instance 0:\nSegfault"])
    assert cli.report_comparison(crashed, "b over a", as_json=False) == 1  # a crash is a failed run, not bad input


@pytest.mark.parametrize("value, why", [({"x": 1}, "not a list of rungs"), ([{"step": "baseline"}], "rung 0 is not"),
                                        ([{"step": "b", "config": {"bogus": 1}}], "unknown RunConfig field")])
def test_a_corrupt_stored_ladder_is_one_line_naming_it(value, why, tmp_path, monkeypatch):
    from cpuopt_helpers import system

    store = tmp_path / "r.sqlite"
    monkeypatch.setenv("CPUOPT_RESULTS", str(store))
    ResultStore(store).put_fact(system.collect_facts().fingerprint, "ladder/cnn/standard", value)
    before = dump(store)
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        assert cli.main(["ladder"]) == 2
    [line] = err.getvalue().strip().splitlines()
    assert line.startswith("cpuopt: error: the ladder ladder/cnn/standard in ") and why in line, line
    assert dump(store) == before
