"""Any training script as a measured run: reading its throughput, its launch options, the
tuner's search over them (a made-up runner), and real runs of scripts (slow)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cpuopt_helpers import cli, planning, scripts, throughput, tune
from cpuopt_helpers.errors import CpuoptError
from tests.conftest import make_facts

EXAMPLE = "examples/train_script.py"


def test_reading_takes_the_metric_then_the_helper_line_then_the_wall_time():
    out = "epoch 1 throughput: 10.0 samples/s\nepoch 2 throughput: 12.5 samples/s\n"
    assert scripts.Reading(r"throughput: ([0-9.]+)").read(out, 4.0) == (12.5, "--metric 'throughput: ([0-9.]+)' (last match)")
    value, how = scripts.Reading(r"step time ([0-9.]+) s", lower=True).read("step time 0.25 s\n", 4.0)
    assert value == 4.0 and how.startswith("1 / the time")
    line = throughput.MARKER + json.dumps({"samples_per_s": 321.0, "steps": 27, "warmup": 3})
    assert scripts.Reading().read(f"loss 1.0\n{line}\n", 4.0) == (321.0, "the script's throughput.step: 27 timed steps after 3 warm-up")
    assert scripts.Reading(r"throughput: ([0-9.]+)").read(out + line, 4.0)[0] == 12.5  # --metric wins when given
    for garbled in ("cpuopt-throughput: {samples_per_s: 3", "cpuopt-throughput: [1, 2]"):  # no traceback, a reason
        value, why = scripts.Reading().read(garbled + "\n", 4.0)
        assert value is None and "is not the JSON throughput.step writes" in why
    assert scripts.Reading().read("loss 1.0\n", 4.0) == (0.25, scripts.WALL_TIME)
    none, why = scripts.Reading(r"throughput: ([0-9.]+)").read("loss 1.0\n", 4.0)
    assert none is None and "matched nothing" in why
    too_few = throughput.MARKER + json.dumps({"samples_per_s": None, "steps": 2, "warmup": 3})
    none, why = scripts.Reading().read(too_few, 4.0)
    assert none is None and "only 2 time(s)" in why and "CPUOPT_WARMUP_STEPS" in why


@pytest.mark.parametrize("pattern, lower, message", [
    ("throughput: [0-9.]+", False, "exactly one group"),
    ("(a)(b)", False, "exactly one group"),
    ("([0-9", False, "not a regular expression"),
    (None, True, "--metric-lower needs --metric"),
])
def test_a_bad_metric_is_refused_in_one_line(pattern, lower, message):
    with pytest.raises(CpuoptError, match=message):
        scripts.Reading(pattern, lower)


def test_the_helper_times_the_steps_after_warm_up_and_prints_its_line_at_exit():
    code = textwrap.dedent("""
        import time
        from cpuopt_helpers import throughput
        for i in range(6):
            time.sleep(0.2 if i == 0 else 0.02)  # a slow first step: warm-up, not timed
            throughput.step(10)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"CPUOPT_WARMUP_STEPS": "2", "PATH": ""}).stdout
    value, how = scripts.Reading().read(out, 10.0)
    assert how == "the script's throughput.step: 4 timed steps after 2 warm-up"
    assert 200 < value < 520  # 40 samples in 4 steps of ~20 ms (not the 200 ms first step): ~500/s at most


def test_the_arms_of_a_script_comparison_take_launch_options():
    command = scripts.parse_command(f"python {EXAMPLE} --steps 5")
    assert command[0] == sys.executable and command[1:] == [EXAMPLE, "--steps", "5"]
    a = cli.script_launch_config("--a", "", command, 2)
    b = cli.script_launch_config("--b", "--allocator tcmalloc --threads 1", command, 2)
    assert (a.threads, a.allocator, b.threads, b.allocator) == (2, "default", 1, "tcmalloc")
    assert scripts.label(b) == "script threads=1 allocator=tcmalloc" and scripts.label(a) == "script threads=2"
    assert a.config_hash() != scripts.script_config(scripts.parse_command(f"python {EXAMPLE} --steps 6"), 2).config_hash()
    pinned = cli.script_launch_config("--b", "--cores 1", command, 2)
    assert pinned.cores == ((1,),) and pinned.threads == 1
    with pytest.raises(CpuoptError, match="with --script the arms take launch options"):
        cli.script_launch_config("--b", "--channels-last", command, 2)
    with pytest.raises(CpuoptError, match="needs a command"):
        scripts.parse_command("  ")
    copies = cli.script_launch_config("--b", "--ninstances 2", command, 2)
    assert (copies.instances, copies.threads) == (2, 1) and scripts.label(copies).startswith("script threads=1 instances=2")
    split = cli.script_launch_config("--b", "--ninstances 2 --cores 0,1", command, 2)
    assert split.cores == ((0,), (1,))


def test_copies_of_a_script_are_searched_only_when_allowed_and_each_runs_in_its_own_folder(capsys):
    command = scripts.parse_command(f"python {EXAMPLE}")
    default = scripts.script_config(command, 2)
    assert all(c.instances == 1 for c in scripts.search_space(default, FACTS))
    copies = [c for c in scripts.search_space(default, FACTS, instances=True) if c.instances > 1]
    assert [(c.instances, c.threads) for c in copies] == [(2, 1)]
    assert planning.command_lines(copies[0], command=["python", EXAMPLE])["launch"] == (
        f"cpuopt launch --ninstances 2 --ncores-per-instance 1 --instance-dirs runs -- python {EXAMPLE}")
    assert cli.main(["tune", "--script", f"python {EXAMPLE}", "--dry-run", "--allow-instances", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["label"] == "script threads=2" and all(r["config"]["workload"] == "script" for r in rows)
    two = [r for r in rows if r["config"]["instances"] == 2]
    assert len(two) == 1 and sorted(sum(two[0]["cores"], [])) == [0, 1] and all(len(c) == 1 for c in two[0]["cores"])
    assert all(r["argv"][0][-1] == EXAMPLE for r in rows)  # the script itself, not the worker
    assert cli.main(["tune", "--script", f"python {EXAMPLE}", "--dry-run"]) == 0
    assert "instances=2" not in capsys.readouterr().out  # not without --allow-instances


@pytest.mark.parametrize("argv, message", [
    (["compare", "--script", f"python {EXAMPLE}", "--a", "", "--b", "--bf16"], "take launch options"),
    (["compare", "--script", f"python {EXAMPLE}", "--a", "", "--b", "", "--metric", "x"], "exactly one group"),
    (["compare", "--a", "", "--b", "", "--metric", "t: (.*)"], "--metric reads a --script's output"),
    (["tune", "--script", "bash train.sh", "--budget-min", "1"], "runs Python scripts only"),
    (["tune", "--script", "python missing.py", "--budget-min", "1"], "no such script"),
    (["tune", "--script", "python missing.py", "--dry-run"], "no such script 'missing.py'"),
    (["compare", "--script", "python missing.py", "--a", "", "--b", "--threads 1"], "no such script 'missing.py'"),
    (["tune", "--workload", "tests.user_workloads:crash", "--dry-run"],
     "failed to build at preset 'quick': RuntimeError: deliberate crash in a user workload"),
    (["tune", "--workload", "tests.user_workloads:nothing_here", "--dry-run"], "has no function 'nothing_here'"),
    (["tune", "--workload", "no_such_package.mod:build", "--dry-run"], "cannot import 'no_such_package.mod'"),
    (["tune", "--allow-instances", "--budget-min", "1"], "--allow-instances is for --script"),
    (["compare", "--script", f"python {EXAMPLE}", "--a", "", "--b", "--ninstances 2 --cores 0-2"], "split evenly"),
])
def test_bad_script_input_is_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert message in err and len(err.strip().splitlines()) == 1 and out == ""


FACTS = make_facts(allocators={"jemalloc": "/x/libjemalloc.so.2", "tcmalloc": None}, bf16={"accelerated": False})


def test_tuning_a_script_searches_launch_options_and_leaves_failed_runs_out_with_their_reason():
    command = scripts.parse_command(f"python {EXAMPLE}")
    seen = []

    def runner(config):  # made up: jemalloc is faster, one thread fails, run_cpu is slower
        seen.append(config)
        base = {"config": config.to_dict(), "config_hash": config.config_hash(), "metric": scripts.WALL_TIME}
        if config.threads == 1 and config.launcher != "run_cpu":
            return dict(base, status="failed", samples_per_s=None, reason="exit code 3\nRuntimeError: needs 2 threads")
        speed = 100.0 * (1.3 if config.allocator == "jemalloc" else 1.0) * (0.9 if config.launcher == "run_cpu" else 1.0)
        return dict(base, status="ok", samples_per_s=speed, reason="")

    t = tune.tune(scripts.SCRIPT, 0.05, facts=FACTS, runner=runner, progress=False, script=command)
    assert {c.workload for c in seen} == {"script"} and not any(c.channels_last or c.compile or c.dtype != "fp32"
                                                               for c in seen)  # launch options only
    assert t["recommended_label"] == "script threads=2 allocator=jemalloc" and t["speedup_vs_default"]["verdict"] == "faster"
    assert t["failed"] == [{"label": "script threads=1", "reason": "exit code 3\nRuntimeError: needs 2 threads"}]
    assert t["launch_command"] == f"cpuopt launch --ncores-per-instance 2 --allocator jemalloc -- {' '.join(command)}"
    assert "LD_PRELOAD=/x/libjemalloc.so.2" in t["shell_command"] or "jemalloc" in t["shell_command"]
    assert t["metric"] == [scripts.WALL_TIME] and "torch.compile" in t["in_the_script"]
    text = tune.format_tune(t)
    assert "left out, its run failed: script threads=1: exit code 3" in text and "still to try in the script" in text


def script_not_importing_the_package(tmp_path, fail_on_one_thread=False):
    """A script in its own words that imports neither cpuopt nor torch: its runs take a fraction of a
    second, so a tune of it measures every candidate and its final rounds well within its budget
    (one importing torch took ~5 s a run here, and on a loaded machine its budget ended the search
    before the failing candidate ran)."""
    path = tmp_path / "own_words.py"
    path.write_text(textwrap.dedent(f"""
        import os, sys, time
        if {fail_on_one_thread} and os.environ.get("OMP_NUM_THREADS") == "1":
            sys.exit("this script refuses to run on one thread")
        start, total = time.perf_counter(), 0
        for i in range(40):
            total += sum(j * j for j in range(20000))
        print(f"it ran {{40 / (time.perf_counter() - start):.1f}} iterations per second")
    """))
    return f"python {path}"


def script_reporting_its_steps(tmp_path):
    """A script that reports each step through the helper line, as examples/train_script.py does,
    without torch: ten runs of it take seconds, not the minute ten runs of the example took here."""
    path = tmp_path / "reports_steps.py"
    path.write_text(textwrap.dedent("""
        import sys
        from cpuopt_helpers import throughput
        for step in range(int(sys.argv[1])):
            sum(j * j for j in range(50000))
            throughput.step(32)
    """))
    return f"python {path}"


@pytest.mark.slow
def test_the_example_script_trains_and_reports_its_steps_through_the_helper_line(tmp_path):
    run = [sys.executable, str(Path(EXAMPLE).resolve()), "--steps", "4"]
    launched = subprocess.run([sys.executable, "-m", "cpuopt_helpers.cli", "launch", "--log-dir", str(tmp_path), "--",
                               *run], capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr
    reports = [line for line in launched.stdout.splitlines() if throughput.MARKER in line]  # the helper line
    assert len(reports) == 1 and json.loads(reports[0].split(throughput.MARKER, 1)[1])["samples_per_s"] > 0, reports


@pytest.mark.slow
def test_compare_script_gives_a_verdict_with_its_interval_and_rounds(tmp_path):
    script = script_reporting_its_steps(tmp_path) + " 8"
    proc = subprocess.run([sys.executable, "-m", "cpuopt_helpers.cli", "compare", "--script", script, "--a", "",
                           "--b", "--allocator tcmalloc", "--min-rounds", "5", "--max-rounds", "5", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["n"] == 5 and r["verdict"] in ("faster", "slower", "equivalent", "no different")
    assert r["ci_low"] <= r["ratio"] <= r["ci_high"] and len(r["rounds"]) == 5 and r["script"].endswith(" 8")
    per_round = [line for line in proc.stderr.splitlines() if line.startswith("round ")]  # --json: rounds on stderr
    assert len(per_round) == 5 and per_round[-1].endswith("over 5 rounds") and "running ratio" in per_round[0]


@pytest.mark.slow
def test_tune_script_reads_a_metric_in_the_scripts_own_words_and_leaves_a_failing_configuration_out(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cpuopt_helpers.cli", "tune", "--script",
                           script_not_importing_the_package(tmp_path, fail_on_one_thread=True),
                           "--metric", r"ran ([0-9.]+) iterations per second", "--budget-min", "1.5", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    t = json.loads(proc.stdout)
    assert t["metric"] == ["--metric 'ran ([0-9.]+) iterations per second' (last match)"]
    assert {"label": "script threads=1"} == {k: v for k, v in t["failed"][0].items() if k == "label"}
    assert "refuses to run on one thread" in t["failed"][0]["reason"]
    assert t["launch_command"].startswith("cpuopt launch ") and "own_words.py" in t["launch_command"]
    assert t["run_cpu_vs_default"] or t["speedup_vs_run_cpu"]  # measured against run_cpu's defaults as well
    assert t["speedup_vs_default"] is None or t["speedup_vs_default"]["n"] >= 5


def test_script_runs_are_stored_and_read_back_like_worker_runs(tmp_path):
    from cpuopt_helpers.results import ResultStore

    command = scripts.parse_command(f"python {EXAMPLE}")
    config = scripts.script_config(command, 2, allocator="jemalloc")
    store = ResultStore(tmp_path / "r.sqlite")
    result = {"config": config.to_dict(), "config_hash": config.config_hash(), "status": "ok", "reason": "",
              "label": f"{scripts.label(config)}: python {EXAMPLE}", "samples_per_s": 50.0, "command": " ".join(command),
              "metric": scripts.WALL_TIME, "created_at": "2026-12-01T10:00:00+00:00", "system": "m"}
    store.save_result(result, sweep="s", tag="cli-tune-script")
    df = store.load()
    assert df.loc[0, "workload"] == "script" and df.loc[0, "metric"] == scripts.WALL_TIME and df.loc[0, "samples_per_s"] == 50
    assert df.loc[0, "step_ms"] is None and df.loc[0, "label"].endswith(EXAMPLE)
    from cpuopt_helpers import report

    rows = report.results_rows(store)  # the report's results table shows it beside worker runs
    assert len(rows) == 1 and rows[0]["step_ms"] != rows[0]["step_ms"]  # NaN: a script has no step time
    assert {k: v for k, v in rows[0].items() if k != "step_ms"} == {
        "notebook": "cli-tune-script", "configuration": result["label"], "runs": 1, "ok": 1, "samples_per_s": 50.0,
        "min": 50.0, "max": 50.0}


def test_a_searchs_runs_are_stored_as_they_end_so_an_interrupted_search_keeps_them(tmp_path):
    from cpuopt_helpers.config import RunConfig
    from cpuopt_helpers.results import ResultStore
    from tests.test_results import fake_result

    store = ResultStore(tmp_path / "r.sqlite")
    seen = []

    def run(config):
        if len(seen) == 2:
            raise KeyboardInterrupt  # Ctrl-C during the third run
        seen.append(config)
        return fake_result(config)

    stored = scripts.storing(run, store, "cli-tune-cnn", "cli-tune")
    with pytest.raises(KeyboardInterrupt):
        for threads in (1, 2, 1):
            stored(RunConfig(threads=threads))
    rows = store.results()
    assert [(r["tag"], r["arm"], r["round"], r["config"]["threads"]) for r in rows] == [
        ("cli-tune", 0, 0, 1), ("cli-tune", 0, 1, 2)]  # one sweep, a round each: no pair
    assert rows[0]["sweep"] == rows[1]["sweep"] and rows[0]["sweep"].startswith("cli-tune-cnn-")


def script_writing_a_file(tmp_path):
    """A script that refuses to run where another copy already wrote its output (a checkpoint)."""
    path = tmp_path / "writes_a_file.py"
    path.write_text(textwrap.dedent("""
        import os, time
        with open("checkpoint.pt", "x") as f:  # "x": fails where the file exists, as two copies in one folder would
            f.write(os.environ["CPUOPT_INSTANCE"])
        time.sleep(0.5)
        print(f"rate: {10 + int(os.environ['CPUOPT_INSTANCE'])}")
    """))
    return path


@pytest.mark.slow
def test_copies_of_a_script_run_in_their_own_folders_and_their_throughputs_add_up(tmp_path, monkeypatch):
    command = scripts.parse_command(f"python {script_writing_a_file(tmp_path)}")
    reading = scripts.Reading(r"rate: ([0-9]+)")
    two = scripts.script_config(command, 2, instances=2, threads=1)
    r = scripts.run_script(two, command, reading)
    assert r["status"] == "ok", r["reason"]
    assert r["samples_per_s"] == 21 and [i["samples_per_s"] for i in r["copies"]] == [10, 11]
    assert r["metric"].endswith("summed over 2 copies")
    (tmp_path / "runs").mkdir()
    assert cli.main(["launch", "--ninstances", "2", "--ncores-per-instance", "1", "--instance-dirs",
                     str(tmp_path / "runs"), "--log-dir", str(tmp_path / "logs"), "--", *command]) == 0
    assert [(tmp_path / "runs" / f"instance_{i}" / "checkpoint.pt").read_text() for i in (0, 1)] == ["0", "1"]
    monkeypatch.chdir(tmp_path / "runs")
    assert cli.main(["launch", "--ninstances", "2", "--ncores-per-instance", "1", "--log-dir", str(tmp_path / "logs"),
                     "--", *command]) == 1  # the same copies in one folder collide: the harm the opt-in avoids


@pytest.mark.slow
def test_an_interrupted_compare_says_the_rounds_it_completed_then_exits_as_interrupted(tmp_path):
    """Ctrl-C (or SIGTERM) during a comparison: the rounds completed so far are reported, at that look and
    said to be interrupted, and the command exits 128 + the signal, its workers stopped."""
    import signal
    import time

    err = tmp_path / "err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "cpuopt_helpers.cli", "compare", "--script",
                                 script_reporting_its_steps(tmp_path) + " 8", "--a", "", "--b", "--allocator tcmalloc",
                                 "--min-rounds", "5", "--max-rounds", "40", "--json"], stdout=subprocess.PIPE,
                                stderr=stderr, text=True)
        deadline = time.monotonic() + 300
        while err.read_text().count("\nround ") + err.read_text().startswith("round ") < 2:
            assert time.monotonic() < deadline and proc.poll() is None, err.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    r = json.loads(out)
    assert proc.returncode == 130 and "interrupted; its workers are stopped" in err.read_text()
    assert r["stopped"] == "interrupted" and r["n"] >= 2 and len(r["rounds"]) == len(r["order"]) >= 2
    assert r["verdict"] == "too few rounds" or r["n"] >= 5  # at that look: fewer than min_rounds claim nothing
    assert r["cut_run"]["arm"] in ("a", "b") and r["cut_run"]["ran_s"] >= 0  # the run under way, said, left out
