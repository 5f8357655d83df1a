"""The SQLite results store: round trip, resume, a killed sweep, concurrent writers."""

import multiprocessing

import pytest

from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.results import ResultStore, run_sweep


def fake_result(config, status="ok", sps=100.0, machine="m1"):
    return {"config": config.to_dict(), "config_hash": config.config_hash(), "label": config.label(),
            "status": status, "reason": "" if status == "ok" else "boom", "samples_per_s": sps,
            "step_ms": {"median": 10.0, "p10": 9.0, "p90": 11.0, "n": 5},
            "phase_ms": {"forward": 4.0, "backward": 5.0, "optimizer": 1.0}, "peak_rss_mb": 50.0,
            "loss_first": 2.0, "loss_last": 1.0, "achieved_gflops": 3.0, "flops_per_step": 1e9, "startup_s": 1.0,
            "system": machine, "created_at": "2026-11-30T00:00:00+00:00"}


def test_round_trip_to_dataframe(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    store.save_result(dict(fake_result(RunConfig(workload="rnn")), machine_state={"loaded": True}),
                      sweep="s1", arm=2, round=1, position=0, tag="t")
    df = store.load()
    assert len(df) == 1
    row = df.iloc[0]
    assert (row.workload, row.status, row.samples_per_s, row.step_ms, row.backward_ms, row["round"], row.arm,
            row.sweep, bool(row.loaded)) == ("rnn", "ok", 100.0, 10.0, 5.0, 1, 2, "s1", True)
    assert row["config.allocator"] == "default"
    import sqlite3
    assert sqlite3.connect(store.path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_the_machine_state_of_a_run_is_said_in_one_sentence():
    from cpuopt_helpers.results import loaded_sentence

    def run(loaded, steal):
        return {"machine_state": {"loaded": loaded, "steal_pct": steal}}

    assert loaded_sentence([{"status": "failed"}]) is None  # no run recorded its machine state
    quiet = loaded_sentence([run(False, 0.5), run(False, 1.5), run(False, None)])
    assert quiet.startswith("The machine was quiet: none of the 3 runs") and "median 1.0%" in quiet
    busy = loaded_sentence([run(True, 12.0), run(False, 1.0), run(True, 31.0), run(True, None)])
    assert busy.startswith("The machine was busy with other work: 3 of 4 runs")
    assert "slower and their ratios noisier" in busy
    assert "by the hypervisor: it took a median 12.0% of a run's CPU time, at most 31.0%)" in busy
    assert "at most 0.4%" in loaded_sentence([run(True, 0.3), run(True, 0.4)])  # never a largest below the median
    mostly = loaded_sentence([run(True, 0.2)] + [run(False, 0.1)] * 10)  # 1 of 11: not "busy"
    assert mostly.startswith("The machine was mostly quiet: 1 of 11 runs measured on a loaded machine (")
    assert "took" not in loaded_sentence([run(True, None)])  # no steal column: no steal figure


def test_runs_whose_cores_the_host_moved_apart_are_said():
    from cpuopt_helpers.results import loaded_sentence

    def run(trips, loaded=False, cpus=((0, 1),)):
        return {"machine_state": {"loaded": loaded, "steal_pct": 0.0, "round_trip_ns": trips,
                                  "round_trip_cpus": [list(p) for p in cpus]}}

    steady = loaded_sentence([run([220.0, 340.0]), run([260.0, 250.0]), run(None)])  # one core complex, noisy
    assert steady.endswith("the hypervisor took a median 0.0% of a run's CPU time, at most 0.0%.")
    moved = loaded_sentence([run([230.0, 250.0]), run([240.0, 470.0]), run([500.0, 520.0]), run(None)])
    assert "CPUs apart: in 2 of 3 runs probed, two of the run's CPUs sat far apart (a VM's host" in moved
    assert moved.startswith("The machine had no other load, yet its CPUs moved: none of the 4 runs measured on a "
                            "loaded machine")  # not "quiet"
    assert steady.startswith("The machine was quiet: ")
    assert ("a cache line's round trip between them took 1.6x the shortest timed between the same two CPUs or more "
            "(the shortest of all: 230 ns), up to 520 ns.") in moved
    assert moved.endswith("Such steps can run slower.")
    # bare metal: an unpinned arm times CPUs 0 and 1 on two sockets, a pinned one two cores of one: no claim
    pairs = loaded_sentence([run([250.0, 260.0], cpus=((0, 2),)), run([600.0, 610.0], cpus=((0, 1),))])
    assert "round trip" not in pairs
    busy = loaded_sentence([run([230.0, 250.0], True), run([600.0, 610.0], True)])  # a busy CPU lengthens it too
    assert busy.startswith("The machine was busy") and "round trip" not in busy


def test_pairs_of_runs_whose_two_runs_sat_apart_and_together_are_counted_from_the_store(tmp_path):
    from cpuopt_helpers.results import apart, loaded_sentence, mixed_pairs

    store = ResultStore(tmp_path / "r.sqlite")
    near, far = [230.0, 250.0], [240.0, 470.0]

    def save(sweep, round_, arm, trips, status="ok"):
        state = {"loaded": False, "steal_pct": 0.0, "round_trip_ns": trips, "round_trip_cpus": [0, 1]}
        store.save_result(dict(fake_result(RunConfig(threads=arm + 1), status), machine_state=state),
                          sweep=sweep, arm=arm, round=round_)

    for arm, trips in ((0, near), (1, far)):  # round 0 measured, then measured again: its latest runs pair
        save("ab", 0, arm, trips)
    save("ab", 0, 0, far)  # now both apart
    save("ab", 1, 0, far), save("ab", 1, 1, near)  # mixed: the earlier arm apart
    save("ab", 2, 0, near), save("ab", 2, 1, far)  # mixed: the later arm apart
    save("ab", 3, 0, near), save("ab", 3, 1, None)  # one run unprobed: no pair
    save("ab", 4, 0, near), save("ab", 4, 1, far, status="failed")  # a failed run pairs with nothing
    save("cli", 0, 0, near), save("cli", 0, 0, far)  # bench --save: alone, whatever was stored before
    save("", 0, 0, far)  # a profile's run
    save("abc", 0, 0, near), save("abc", 0, 1, far), save("abc", 0, 2, far)  # a screen: each arm vs arm 0
    save("abc", 1, 1, near), save("abc", 1, 2, far)  # arm 0 failed to store: no baseline, no pair
    runs = store.results()
    assert apart([r["machine_state"] for r in runs[:2]]) == [False, True]
    assert apart([{"round_trip_ns": far, "loaded": True, "round_trip_cpus": [0, 1]}]) == [None]
    assert mixed_pairs(runs) == (4, 5, 3)  # ab: rounds 0-2 (0 both apart); abc: 0-1 and 0-2 (not 1-2)
    said = loaded_sentence(runs)
    assert said.endswith("Such steps can run slower. In 4 of 5 paired runs (an arm and its baseline in one round, "
                         "both quiet) only one of the two sat apart (the arm in 3, the baseline in 1): their ratios "
                         "are noisier. The probe runs before and after the timed steps, so these counts are lower "
                         "bounds.")
    alone = [r for r in runs if r["sweep"] in ("cli", "")]
    assert mixed_pairs(alone) == (0, 0, 0) and "paired runs" not in loaded_sentence(alone)


def test_facts_replace_older_values(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    assert store.get_fact("m", "roofline/quick") is None
    store.put_fact("m", "roofline/quick", {"gemm": 1})
    store.put_fact("m", "roofline/quick", {"gemm": 2})
    assert store.get_fact("m", "roofline/quick") == {"gemm": 2}
    assert store.get_fact("other", "roofline/quick") is None


def test_sweep_rounds_shuffle_order_record_it_and_resume(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    configs = [RunConfig(workload=w) for w in ("cnn", "rnn", "transformer")]
    calls = []

    def runner(config):
        calls.append(config.workload)
        return fake_result(config)

    out = run_sweep(configs, store, runner, rounds=8, tag="x", machine="m1", progress=False)
    rounds = [calls[i:i + 3] for i in range(0, 24, 3)]
    assert all(sorted(r) == ["cnn", "rnn", "transformer"] for r in rounds)  # every arm once per round
    # the order inside a round is not fixed: seeded by the sweep (its code and environment) and the round, 8 rounds
    # in one order would happen by chance once in 6^7 sweeps (4 rounds did, once in 216, under one environment)
    assert len({tuple(r) for r in rounds}) > 1
    first = {(r["round"], r["position"]): r["config"]["workload"] for r in out}
    assert [first[(0, p)] for p in range(3)] == rounds[0]  # and it is recorded
    calls.clear()
    out = run_sweep(configs, store, runner, rounds=9, tag="x", machine="m1", progress=False)
    assert sorted(calls) == ["cnn", "rnn", "transformer"]  # only the ninth round is new
    assert sum(r.get("resumed", False) for r in out) == 24
    calls.clear()
    run_sweep(configs[:1], store, runner, rounds=1, tag="x", machine="another-machine", progress=False)
    assert calls == ["cnn"]  # a different machine measures again


def test_sweeps_never_pair_across_each_other_or_code_versions(tmp_path, monkeypatch):
    from cpuopt_helpers import results

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # set below, whatever the caller exported

    store = ResultStore(tmp_path / "r.sqlite")
    a = RunConfig(workload="cnn")
    calls = []
    runner = lambda c: (calls.append(c), fake_result(c))[1]  # noqa: E731
    aa = run_sweep([a, a], store, runner, rounds=2, tag="aa", machine="m1", progress=False)
    assert len(calls) == 4 and {r["arm"] for r in aa} == {0, 1}  # an A/A test: two arms, four runs
    calls.clear()
    run_sweep([a], store, runner, rounds=2, tag="other", machine="m1", progress=False)
    assert len(calls) == 2  # another sweep does not borrow the A/A sweep's rows
    calls.clear()
    monkeypatch.setattr(results, "code_version", lambda: {"measuring_hash": "changed"})
    run_sweep([a, a], store, runner, rounds=2, tag="aa", machine="m1", progress=False)
    assert len(calls) == 4  # the measuring code changed: a new sweep
    calls.clear()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # exported by the user: it reaches the workers and wins
    run_sweep([a, a], store, runner, rounds=2, tag="aa", machine="m1", progress=False)
    assert len(calls) == 4  # a sweep run under another environment is a new sweep, never resumed into
    calls.clear()
    monkeypatch.setenv("CPUOPT_BUILD", str(tmp_path))  # where outputs go changes no measurement
    run_sweep([a, a], store, runner, rounds=2, tag="aa", machine="m1", progress=False)
    assert len(calls) == 0


def test_resume_finds_runs_whose_stored_hash_is_of_the_validated_config(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    unvalidated = RunConfig(workload="cnn")  # threads=None, as notebook 01 plans it
    calls = []

    def runner(config):  # the real launcher stores the hash of the config it ran (threads spelled out)
        calls.append(config)
        return fake_result(config.replace(threads=2))

    run_sweep([unvalidated], store, runner, rounds=2, tag="b", machine="m1", progress=False)
    run_sweep([unvalidated], store, runner, rounds=2, tag="b", machine="m1", progress=False)
    assert len(calls) == 2


def test_failed_runs_are_stored_and_retried_on_resume(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    config = RunConfig()
    out = run_sweep([config], store, lambda c: fake_result(c, status="failed"), tag="f", machine="m1",
                    progress=False)
    assert out[0]["status"] == "failed" and len(store.results()) == 1
    out = run_sweep([config], store, lambda c: fake_result(c), tag="f", machine="m1", progress=False)
    assert out[0]["status"] == "ok" and len(store.results()) == 2


def test_a_failed_run_is_warned_of_in_one_line_ending_with_its_exception(tmp_path, caplog):
    crashed = "instance 0 exited with code 1; stderr tail of instance 0:\nTraceback (most recent call last):\n" \
              "  File \"w.py\", line 3\nRuntimeError: my model broke"
    run_sweep([RunConfig()], ResultStore(tmp_path / "r.sqlite"),
              lambda c: dict(fake_result(c, "failed"), reason=crashed), tag="f", machine="m1", progress=False)
    [warned] = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert warned.endswith("failed: instance 0 exited with code 1; stderr tail of instance 0: | "
                           "RuntimeError: my model broke") and "\n" not in warned


def test_sweep_killed_half_way_keeps_finished_rows(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    configs = [RunConfig(seed=i) for i in range(5)]
    done = []

    def runner(config):
        if len(done) == 3:
            raise KeyboardInterrupt  # the user stops the sweep
        done.append(config.seed)
        return fake_result(config)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(configs, store, runner, tag="k", machine="m1", progress=False)
    assert len(store.results(tag="k")) == 3
    first = list(done)
    done.clear()
    run_sweep(configs, store, lambda c: (done.append(c.seed), fake_result(c))[1], tag="k", machine="m1",
              progress=False)
    assert sorted(done + first) == [0, 1, 2, 3, 4]


def test_an_older_store_is_moved_aside_not_mixed(tmp_path):
    import sqlite3

    path = tmp_path / "r.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE results (id INTEGER PRIMARY KEY, config_hash TEXT, repeat INTEGER, result TEXT)")
        db.execute("INSERT INTO results VALUES (1, 'h', 0, '{}')")
    store = ResultStore(path)
    assert store.moved_aside is not None and store.moved_aside.exists()
    assert store.results() == []
    assert ResultStore(path).moved_aside is None  # the new store is kept on the next open


def test_a_corrupt_store_is_moved_aside_with_a_message_and_a_fresh_one_started(tmp_path, caplog):
    path = tmp_path / "results.sqlite"
    path.write_bytes(b"this is not a database, it was truncated" * 100)
    store = ResultStore(path)
    assert store.moved_aside.name.startswith("results.corrupt-") and store.moved_aside.read_bytes().startswith(b"this")
    assert "is not a readable results store" in caplog.text
    store.put_fact("m", "x", 1)
    assert ResultStore(path).get_fact("m", "x") == 1 and ResultStore(path).moved_aside is None


def test_comparison_stores_rounds_and_resumes_them(tmp_path, capsys):
    from cpuopt_helpers.cli import report_comparison
    from cpuopt_helpers.results import run_comparison

    store = ResultStore(tmp_path / "r.sqlite")
    a, b = RunConfig(workload="cnn"), RunConfig(workload="cnn", channels_last=True)
    calls = []

    def runner(config):
        calls.append(config)
        far = config.channels_last and len(calls) > 6  # the host put b's last two runs' cores apart
        return dict(fake_result(config, sps=120.0 + len(calls) % 2 if config.channels_last else 100.0),
                    machine_state={"loaded": False, "steal_pct": 0.0, "round_trip_ns": [480.0 if far else 250.0] * 2})

    out = run_comparison(a, b, store, runner, tag="c", machine="m1", progress=False)
    assert out["verdict"] == "faster" and out["n"] == 5 and len(calls) == 10
    assert "CPUs apart: in 2 of 10 runs probed" in out["machine_sentence"]
    report_comparison(out, "b over a", False)
    said = capsys.readouterr().out
    assert "\n  machine: The machine had no other load, yet its CPUs moved: none of the 10 runs" in said
    assert len({r["sweep"] for r in store.results(tag="c")}) == 1
    orders = out["order"]
    assert set(orders) == {"AB", "BA"}
    calls.clear()
    again = run_comparison(a, b, store, runner, tag="c", machine="m1", progress=False)
    assert calls == [] and again["ratio"] == pytest.approx(out["ratio"])


def test_a_resumed_comparison_never_pairs_a_stored_run_with_a_fresh_one(tmp_path):
    """Interrupted after arm a of round 2: resumed, round 2 stays stored but unpaired and the rounds
    go on from 3; every pair that counts ran back to back."""
    from cpuopt_helpers.results import run_comparison

    store = ResultStore(tmp_path / "r.sqlite")
    a, b = RunConfig(workload="cnn"), RunConfig(workload="cnn", channels_last=True)
    calls = []

    class Interrupted(Exception):
        pass

    def runner(config):
        calls.append(config)
        if len(calls) == 6:  # round 2's second run: the kernel dies before it
            raise Interrupted()
        return fake_result(config, sps=(120.0 if config.channels_last else 100.0) * (1 + 0.01 * len(calls)))

    with pytest.raises(Interrupted):
        run_comparison(a, b, store, runner, tag="k", machine="m1", progress=False)
    kept = sorted((r["round"], r["arm"]) for r in store.results(tag="k"))
    assert kept[:4] == [(0, 0), (0, 1), (1, 0), (1, 1)] and [r for r, _ in kept[4:]] == [2]  # round 2: one run only
    calls.clear()
    again = run_comparison(a, b, store, lambda c: (calls.append(c), fake_result(c, sps=120.0 if c.channels_last
                                                                                     else 100.0))[1],
                           tag="k", machine="m1", progress=False)
    assert None in again["rounds"][2] and again["n"] == len(again["rounds"]) - 1  # round 2 unpaired, not counted
    assert len(calls) == 2 * (len(again["rounds"]) - 3)  # every new round ran both arms fresh


def test_comparison_stops_when_an_arm_always_fails(tmp_path):
    from cpuopt_helpers.results import run_comparison

    store = ResultStore(tmp_path / "r.sqlite")
    a, b = RunConfig(workload="cnn"), RunConfig(workload="cnn", allocator="tcmalloc")
    out = run_comparison(a, b, store, lambda c: fake_result(c, status="failed" if c.allocator == "tcmalloc" else "ok"),
                         tag="f", machine="m1", progress=False)
    assert out["stopped"] == "failed" and out["verdict"] == "too few rounds" and out["failures"]


def _writer(path, n, worker):
    store = ResultStore(path)
    for i in range(n):
        store.save_result(fake_result(RunConfig(seed=worker * 1000 + i)))


@pytest.mark.slow
def test_concurrent_writers_never_corrupt(tmp_path):
    path = tmp_path / "r.sqlite"
    ResultStore(path)
    procs = [multiprocessing.get_context("spawn").Process(target=_writer, args=(path, 25, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = ResultStore(path).results()
    assert len(rows) == 100 and len({r["config"]["seed"] for r in rows}) == 100


def test_readme_quotes_a_notebooks_answer_from_its_last_cell(tmp_path):
    import nbformat

    from cpuopt_helpers.pages import notebook_answer

    nb = nbformat.v4.new_notebook()
    first, last = nbformat.v4.new_code_cell("print('x')"), nbformat.v4.new_code_cell("for l in lines: print(l)")
    first.outputs = [nbformat.v4.new_output("stream", name="stdout", text="- not the answer\n")]
    last.outputs = [nbformat.v4.new_output("stream", name="stdout", text="- cnn: 1.19x\nprogress 50%\n- rnn: kept\n")]
    nb.cells = [first, nbformat.v4.new_markdown_cell("## Answer"), last]
    path = tmp_path / "05_ipex.ipynb"
    nbformat.write(nb, path)
    assert notebook_answer(path) == ["- cnn: 1.19x", "- rnn: kept"]


def test_a_quoted_answer_keeps_its_headings_and_leaves_out_what_a_table_shows(tmp_path):
    import nbformat

    from cpuopt_helpers.pages import notebook_answer

    nb = nbformat.v4.new_notebook()
    last = nbformat.v4.new_code_cell("print(answer)")
    last.outputs = [nbformat.v4.new_output("stream", name="stdout", text=(
        " The fixes:\nwarning: a worker printed this\n- a: 1.10x\n- b: 2.00x\nThe kernels:\n- c: shown above\n"
        "What it hands_on:\n- d\nThe end:\n"))]
    nb.cells = [last]
    path = tmp_path / "08_case_study_retinanet.ipynb"
    nbformat.write(nb, path)
    # a print between a heading and its findings does not lose it; "The kernels:" lost its one finding, so it goes
    # too, and so does a heading nothing follows; markdown's marks in a heading are escaped
    assert notebook_answer(path, {"c: shown above"}) == [
        "*The fixes:*", "", "- a: 1.10x", "- b: 2.00x", "", "*What it hands\\_on:*", "", "- d"]
    assert "*The kernels:*" in notebook_answer(path)


def test_the_findings_a_pages_table_shows_are_the_ones_its_quotes_leave_out(tmp_path):
    from cpuopt_helpers.decisions import Comparison, Finding
    from cpuopt_helpers.pages import tabulated
    from cpuopt_helpers.stages.case_study import UNFIXED

    store = ResultStore(tmp_path / "r.sqlite")
    cnn = RunConfig(workload="cnn", preset="quick", dtype="bf16")
    store.add_sweep("s6", "m", "06_bf16", "sweep", [cnn.to_dict()], None)  # the bf16 table's sweep: cnn only
    store.save_result({"config": cnn.to_dict(), "config_hash": cnn.config_hash(), "status": "ok", "system": "m",
                       "created_at": "2026-12-01T10:00:00+00:00"}, sweep="s6", tag="06_bf16")
    screened = Comparison.from_dict({"ratio": 0.9, "n": 1, "verdict": "too few rounds", "label": "95% CI"})
    fixes = [Finding("retinanet", "case_study", "arm over first", {"name": name, "first": "baseline"}, screened)
             for name in ("fused FrozenBatchNorm2d", "closed-form focal loss")]
    fixes.append(Finding("retinanet", "case_study", "frozen backward skipped", {}, screened))
    faster = Comparison.from_dict({"ratio": 1.8, "ci_low": 1.6, "ci_high": 2.0, "n": 8, "verdict": "faster",
                                   "label": "95% CI"})
    bf16 = [Finding("cnn", "precision", "screened only", {"settings": ["dtype=bf16"], "rounds": 1, "ratios": [1.7],
                                                          "min_rounds": 5}),
            Finding("", "precision", "bf16 gate", {"accelerated": True, "path": "avx512_bf16", "reason": "x"}),
            Finding("cnn", "precision", "bf16 over fp32", {"setting": "dtype=bf16"}, faster),
            Finding("rnn", "precision", "bf16 over fp32", {"setting": "dtype=bf16"}, faster)]  # not in the table
    broken = Finding("cnn", "precision", "bf16 over fp32", {}, faster).to_dict()  # an older schema: no sentence
    store.put_fact("m", "notes/case_study/quick", [f.to_dict() for f in fixes])
    store.put_fact("m", "notes/precision/quick", [f.to_dict() for f in bf16] + [broken])
    assert tabulated(store, "m", "quick") == {bf16[0].sentence, bf16[2].sentence}  # no paper table: fixes quoted
    store.put_fact("m", "case-study/paper/quick", [{"fix": "fused FrozenBatchNorm2d", "arm": "fused FrozenBatchNorm2d"},
                                                    {"fix": "focal loss forward", "arm": None},
                                                    {"fix": "fused Lamb", "arm": float("nan")},
                                                    {"fix": "frozen layers (backward skipped)", "arm": UNFIXED}])
    assert tabulated(store, "m", "quick") == {bf16[0].sentence, bf16[2].sentence, fixes[0].sentence, fixes[2].sentence}
    assert tabulated(store, "m", "full") == set()
    rows = [{"fix": "fused FrozenBatchNorm2d", "arm": "fused FrozenBatchNorm2d", "workload": "retinanet"},
            {"fix": "frozen layers (backward skipped)", "arm": UNFIXED, "workload": "other"}]
    store.put_fact("m", "case-study/paper/quick", rows)  # the paper table's arms are of one workload
    assert tabulated(store, "m", "quick") == {bf16[0].sentence, bf16[2].sentence, fixes[0].sentence}
    printed = [f.to_dict() | {"said": f"printed {i}"} for i, f in enumerate(fixes)]  # Session.tell keeps it
    store.put_fact("m", "notes/case_study/quick", printed)  # a template changed since: matched as printed
    assert tabulated(store, "m", "quick") == {bf16[0].sentence, bf16[2].sentence, "printed 0"}


def test_readme_lists_every_confirmation_with_its_rounds(tmp_path):
    from cpuopt_helpers.results import run_comparison
    from cpuopt_helpers.pages import _confirmation_lines

    store = ResultStore(tmp_path / "r.sqlite")
    a, b = RunConfig(workload="cnn", threads=2), RunConfig(workload="cnn", threads=2, allocator="jemalloc")
    sps = iter([100.0, 110.0, 101.0, 112.0, 99.0, 109.0, 100.0, 111.0, 102.0, 110.0] * 3)
    out = run_comparison(a, b, store, lambda c: fake_result(c, sps=next(sps)), tag="04_allocator/confirm",
                         machine="m1", progress=False)
    assert [s["kind"] for s in store.sweeps()] == ["ab"] and store.sweeps(kind="sweep") == []
    lines = _confirmation_lines(store, "m1", a.preset, "2026-11-30")
    assert lines[-1].startswith("| 04_allocator | cnn | the incumbent | allocator=jemalloc | ")  # no ladder stored
    assert f"{out['n']} rounds): {out['verdict']}" in lines[-1]
    store.put_fact("m1", f"ladder/cnn/{a.preset}", [{"step": "baseline", "config": a.replace(threads=None).to_dict()}])
    said = _confirmation_lines(store, "m1", a.preset, "2026-11-30")[-1]
    assert said.startswith("| 04_allocator | cnn | threads=2 | allocator=jemalloc | ")  # against, from the defaults
    store.put_fact("m1", f"ladder/cnn/{a.preset}", [{"step": "baseline", "config": a.to_dict()}])
    assert _confirmation_lines(store, "m1", a.preset, "2026-11-30") == lines[:-1] + [
        lines[-1].replace("| the incumbent |", "| PyTorch's defaults |")]
    store.put_fact("m1", f"ladder/cnn/{a.preset}", [])
    lines = _confirmation_lines(store, "m1", a.preset, "2026-11-30")
    # this run's only: not the command line's, not another preset's, not one measured before the run
    run_comparison(a, b.replace(allocator="tcmalloc"), store, lambda c: fake_result(c, sps=101.0), tag="cli-compare",
                   machine="m1", progress=False)
    other = a.replace(preset="full" if a.preset != "full" else "quick")
    run_comparison(other, other.replace(allocator="tcmalloc"), store, lambda c: fake_result(c, sps=101.0),
                   tag="04_allocator/confirm", machine="m1", progress=False)
    assert _confirmation_lines(store, "m1", a.preset, "2026-11-30") == lines
    assert _confirmation_lines(store, "m1", a.preset, "2026-12-01") == []


def test_the_readme_words_a_comparison_with_the_design_it_ran_under(tmp_path):
    """Five fixed rounds (one look) give the plain interval; read back with the adaptive design's
    wider per-look interval it would say something else than the notebook did."""
    from cpuopt_helpers import compare
    from cpuopt_helpers.results import run_comparison
    from cpuopt_helpers.pages import _confirmation_lines

    store = ResultStore(tmp_path / "r.sqlite")
    a, b = RunConfig(workload="cnn", threads=2), RunConfig(workload="cnn", threads=2, allocator="jemalloc")
    sps = iter([100.0, 104.0, 101.0, 109.0, 99.0, 102.0, 100.0, 108.0, 102.0, 105.0])
    fixed = run_comparison(a, b, store, lambda c: fake_result(c, sps=next(sps)), tag="04_allocator/confirm",
                           machine="m1", min_rounds=5, max_rounds=5, progress=False)
    assert fixed["n"] == 5 and fixed["label"] == "95% CI"
    line = _confirmation_lines(store, "m1", a.preset, "2026-11-30")[-1]
    assert compare.describe(fixed) in line
    again = run_comparison(a, b, store, lambda c: fake_result(c, sps=100.0), tag="04_allocator/confirm",
                           machine="m1", progress=False)  # the adaptive design: another comparison, not a resume
    assert again["sweep"] != fixed["sweep"] and len(store.sweeps(kind="ab")) == 2


def test_a_round_line_gives_both_throughputs_and_the_running_ratio():
    from cpuopt_helpers.results import round_line

    line = round_line(2, ("b", "a"), (40.0, 44.0), [(40.0, 40.0), (None, 41.0), (40.0, 44.0)])
    assert line == "round 3 (BA): a 40.00, b 44.00 samples/s; running ratio 1.05x over 2 rounds"
    assert round_line(0, ("a", "b"), (None, 3.0), [(None, 3.0)]).endswith("a failed, b 3.00 samples/s; "
                                                                          "no complete round yet")


def test_a_timeout_is_scored_at_the_throughput_it_reached_and_a_crash_is_not(tmp_path):
    from cpuopt_helpers.launch import reached
    from cpuopt_helpers.results import run_comparison

    progress = '{"cpuopt_progress": {"steps": %d, "samples": %d, "elapsed_s": %s}}'
    two = ["noise\n" + progress % (1, 8, 1.0) + "\n" + progress % (3, 24, 4.0), progress % (2, 16, 2.0)]
    assert reached(two) == {"samples_per_s": 40 / 4.0, "steps": 2}  # both instances' samples over the longest
    assert reached(["no timed step yet"]) is None and reached([]) is None
    a, b = RunConfig(workload="cnn", threads=2), RunConfig(workload="cnn", threads=2, allocator="jemalloc")

    def runner(config):
        if config.allocator == "jemalloc":  # always times out, having reached half the speed
            return dict(fake_result(config, status="timeout", sps=None), reached_samples_per_s=50.0)
        return fake_result(config, sps=100.0)
    out = run_comparison(a, b, ResultStore(tmp_path / "r.sqlite"), runner, tag="t", machine="m1", min_rounds=5, max_rounds=5, progress=False)
    assert out["n"] == 5 and out["verdict"] == "slower" and out["ratio"] == pytest.approx(0.5)
    crash = run_comparison(a, b, ResultStore(tmp_path / "r.sqlite"), lambda c: fake_result(c, status="failed" if c is b else "ok"),
                           tag="t2", machine="m1", min_rounds=5, max_rounds=5, progress=False)
    assert crash["n"] == 0 and crash["stopped"] == "failed"
