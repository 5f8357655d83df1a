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
    store.save_result(fake_result(RunConfig(workload="rnn")), repeat=1, tag="t")
    df = store.load()
    assert len(df) == 1
    row = df.iloc[0]
    assert (row.workload, row.status, row.samples_per_s, row.step_ms, row.backward_ms, row["repeat"]) == \
        ("rnn", "ok", 100.0, 10.0, 5.0, 1)
    assert row["config.allocator"] == "default"
    import sqlite3
    assert sqlite3.connect(store.path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_facts_replace_older_values(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    assert store.get_fact("m", "roofline/quick") is None
    store.put_fact("m", "roofline/quick", {"gemm": 1})
    store.put_fact("m", "roofline/quick", {"gemm": 2})
    assert store.get_fact("m", "roofline/quick") == {"gemm": 2}
    assert store.get_fact("other", "roofline/quick") is None


def test_sweep_interleaves_repeats_and_resumes(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    a, b = RunConfig(workload="cnn"), RunConfig(workload="rnn")
    calls = []

    def runner(config):
        calls.append(config.workload)
        return fake_result(config)

    run_sweep([a, b], store, runner, repeats=2, tag="x", machine="m1", progress=False)
    assert calls == ["cnn", "rnn", "cnn", "rnn"]  # A B A B
    calls.clear()
    out = run_sweep([a, b], store, runner, repeats=3, tag="x", machine="m1", progress=False)
    assert calls == ["cnn", "rnn"]  # only the third repeat is new
    assert sum(r.get("resumed", False) for r in out) == 4
    calls.clear()
    run_sweep([a], store, runner, repeats=1, tag="x", machine="another-machine", progress=False)
    assert calls == ["cnn"]  # a different machine measures again


def test_failed_runs_are_stored_and_retried_on_resume(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    config = RunConfig()
    out = run_sweep([config], store, lambda c: fake_result(c, status="failed"), tag="f", machine="m1",
                    progress=False)
    assert out[0]["status"] == "failed" and len(store.results()) == 1
    out = run_sweep([config], store, lambda c: fake_result(c), tag="f", machine="m1", progress=False)
    assert out[0]["status"] == "ok" and len(store.results()) == 2


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
    done.clear()
    run_sweep(configs, store, lambda c: (done.append(c.seed), fake_result(c))[1], tag="k", machine="m1",
              progress=False)
    assert done == [3, 4]


def _writer(path, n, worker):
    store = ResultStore(path)
    for i in range(n):
        store.save_result(fake_result(RunConfig(seed=worker * 1000 + i)))


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

    from cpuopt_helpers.workbook import notebook_answer

    nb = nbformat.v4.new_notebook()
    first, last = nbformat.v4.new_code_cell("print('x')"), nbformat.v4.new_code_cell("for l in lines: print(l)")
    first.outputs = [nbformat.v4.new_output("stream", name="stdout", text="- not the answer\n")]
    last.outputs = [nbformat.v4.new_output("stream", name="stdout", text="- cnn: 1.19x\nprogress 50%\n- rnn: kept\n")]
    nb.cells = [first, nbformat.v4.new_markdown_cell("## Answer"), last]
    path = tmp_path / "05_ipex.ipynb"
    nbformat.write(nb, path)
    assert notebook_answer(path) == ["- cnn: 1.19x", "- rnn: kept"]
