"""The ladder as typed rungs: order, chained ratios to the baseline, the command, the CLI."""

import json
import math

import pytest

from cpuopt_helpers import cli, ladder
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.results import ResultStore
from cpuopt_helpers.workbook import Session


def comparison(ratio, low, high, n=6, verdict="faster"):
    return {"ratio": ratio, "ci_low": low, "ci_high": high, "n": n, "verdict": verdict, "label": "95% CI",
            "sweep": f"s{ratio}", "margin": 0.05, "min_rounds": 5}


def climb(session, workload="cnn"):
    base = RunConfig.for_preset(workload, "quick")
    threaded = base.replace(threads=1)
    session.hand_on(base, "baseline")
    session.hand_on(threaded, "allocator", comparison=comparison(1.0, 0.9, 1.1, verdict="no different"))  # kept
    session.hand_on(threaded, "threading", comparison=comparison(1.2, 1.1, 1.3))  # arrives late, sorts first
    session.hand_on(threaded.replace(allocator="jemalloc", options={"width": "2"}), "runtime",
                    comparison=comparison(1.1, 1.0, 1.21))
    return base


def test_rungs_in_stage_order_with_ratios_chained_to_the_baseline(tmp_path):
    session = Session(facts={"fingerprint": "m", "physical_cores": 2}, store=ResultStore(tmp_path / "r.sqlite"))
    climb(session)
    rows = ladder.rungs(session.store, "m", "cnn", "quick", 2)
    assert [r["step"] for r in rows] == ["baseline", "threading", "allocator", "runtime"]
    assert [r["change"] for r in rows] == ["PyTorch's defaults", "threads=1", "kept", "allocator=jemalloc width=2"]
    assert rows[0]["config"]["threads"] == 2  # as run: the thread count spelled out
    assert rows[2]["vs_previous"] is None and rows[2]["vs_baseline"]["median"] == pytest.approx(1.2)
    end = rows[-1]["vs_baseline"]
    assert end["median"] == pytest.approx(1.32) and end["steps"] == 2 and end["n"] == 12
    # log half-widths in quadrature: sqrt(h1^2 + h2^2), centred on the two rungs' log centres
    h1, h2 = (math.log(1.3) - math.log(1.1)) / 2, (math.log(1.21) - math.log(1.0)) / 2
    centre = (math.log(1.3) + math.log(1.1)) / 2 + (math.log(1.21) + math.log(1.0)) / 2
    assert end["ci_low"] == pytest.approx(math.exp(centre - math.hypot(h1, h2)))
    assert ladder.workloads(session.store, "m", "quick") == ["cnn"] and ladder.workloads(session.store, "m", "full") == []


def test_the_command_trains_with_the_configuration_it_names():
    config = RunConfig.for_preset("retinanet", "quick").replace(
        threads=1, allocator="tcmalloc", channels_last=True, compile="default", optimizer="lamb",
        optimizer_impl="foreach", env={"MALLOC_CONF": "a b"}, options={"focal": "fast", "frozen_bn": "fused"})
    line = ladder.command(config.to_dict())
    assert line.startswith("cpuopt bench --workload retinanet --preset quick") and "'MALLOC_CONF=a b'" in line
    import shlex

    again = cli.bench_config(cli.build_parser().parse_args(shlex.split(line)[1:]))
    assert again.config_hash() == config.config_hash()


def test_cli_ladder_json_and_a_clear_error_without_one(tmp_path, monkeypatch, capsys):
    from cpuopt_helpers import system

    monkeypatch.setenv("CPUOPT_RESULTS", str(tmp_path / "r.sqlite"))
    assert cli.main(["ladder", "--preset", "quick"]) == 2
    assert "no ladder for any workload on the quick preset" in capsys.readouterr().err
    facts = system.collect_facts()
    climb(Session(facts=facts, store=ResultStore(tmp_path / "r.sqlite")))
    assert cli.main(["ladder", "--preset", "quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["cnn"] and [r["step"] for r in out["cnn"]][-1] == "runtime"
    assert out["cnn"][-1]["vs_baseline"]["median"] == pytest.approx(1.32)
    assert out["cnn"][-1]["command"].endswith("--allocator jemalloc --option width=2")
    assert cli.main(["ladder", "--preset", "quick", "--workload", "cnn"]) == 0
    text = capsys.readouterr().out
    assert "threading         threads=1; vs the rung before 1.20x (95% CI: 1.10-1.30, 6 rounds): faster" in text
    assert "vs the baseline 1.32x (chained 95% CI:" in text and "train with: cpuopt bench --workload cnn" in text


def test_a_change_its_comparison_did_not_confirm_gets_no_borrowed_interval(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    session = Session(facts={"fingerprint": "m", "physical_cores": 2}, store=store)
    base = RunConfig.for_preset("cnn", "quick").replace(threads=2)
    one, jem = base.replace(threads=1), base.replace(threads=1, allocator="jemalloc")
    session.hand_on(base, "baseline")
    session.hand_on(one, "threading", comparison=comparison(1.2, 1.1, 1.3))
    # the allocator's comparison was run against another base (03 re-run alone afterwards moved it)
    store.add_sweep("stale", "m", "04", "ab", [base.to_dict(), jem.to_dict()], {})
    session.hand_on(jem, "allocator", comparison=dict(comparison(1.1, 1.05, 1.15), sweep="stale"))
    rows = ladder.rungs(store, "m", "cnn", "quick", 2)
    assert rows[1]["confirmed"] is True and rows[2]["confirmed"] is False
    assert math.isnan(rows[2]["vs_baseline"]["ci_low"]) and rows[2]["vs_baseline"]["verdict"] == "too few rounds"
    session.hand_on(jem, "runtime", comparison=comparison(1.1, 1.0, 1.2, verdict="no different"))  # kept
    assert ladder.rungs(store, "m", "cnn", "quick", 2)[-1]["change"] == "kept"
