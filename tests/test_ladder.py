"""The ladder as typed rungs: order, chained ratios to the baseline, the command, the CLI."""

import json
import math

import pytest

from cpuopt_helpers import cli, ladder, planning
from cpuopt_helpers.config import RunConfig, setting_label
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.results import ResultStore
from cpuopt_helpers.session import Session
from cpuopt_helpers.stages import choosing
from tests.conftest import make_facts


def comparison(ratio, low, high, n=6, verdict="faster"):
    return {"ratio": ratio, "ci_low": low, "ci_high": high, "n": n, "verdict": verdict, "label": "95% CI",
            "sweep": f"s{ratio}", "margin": 0.05, "min_rounds": 5}


def hand_on_rungs(session, workload="cnn"):
    base = RunConfig.for_preset(workload, "quick")
    threaded = base.replace(threads=1)
    session.hand_on(base, "baseline")
    session.hand_on(threaded, "allocator", comparison=comparison(1.0, 0.9, 1.1, verdict="no different"))  # kept
    session.hand_on(threaded, "threading", comparison=comparison(1.2, 1.1, 1.3))  # arrives late, sorts first
    session.hand_on(threaded.replace(allocator="jemalloc", options={"width": "2"}), "runtime",
                    comparison=comparison(1.1, 1.0, 1.21))
    return base


def test_rungs_in_stage_order_with_ratios_chained_to_the_baseline(tmp_path):
    session = Session(facts=make_facts(), store=ResultStore(tmp_path / "r.sqlite"))
    hand_on_rungs(session)
    rows = ladder.rungs(session.store, "m", "cnn", "quick", 2)
    assert [r.step for r in rows] == ["baseline", "threading", "allocator", "runtime"]
    assert [r.change for r in rows] == ["PyTorch's defaults", "threads=1", "kept", "allocator=jemalloc width=2"]
    assert [r.kept for r in rows] == [False, False, True, False] and rows[0].first
    assert rows[0].config["threads"] == 2  # as run: the thread count spelled out
    assert rows[2].vs_previous is None and rows[2].vs_baseline["median"] == pytest.approx(1.2)
    end = rows[-1].vs_baseline
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
    line = planning.command_lines(config)["bench"]
    assert line.startswith("cpuopt bench --workload retinanet --preset quick") and "'MALLOC_CONF=a b'" in line
    import shlex

    again = cli.bench_config(cli.build_parser().parse_args(shlex.split(line)[1:]))
    assert again.config_hash() == config.config_hash()


def test_the_compare_line_measures_the_two_configurations_it_names():
    import shlex

    from cpuopt_helpers.config import compare_line

    base = RunConfig.for_preset("retinanet", "quick").replace(optimizer="lamb")
    top = base.replace(dtype="bf16", env={"MALLOC_CONF": "a b"}, options={"focal": "fast"})
    line = compare_line(base, top)
    assert line.startswith("cpuopt compare --workload retinanet --preset quick --a ")
    args = cli.build_parser().parse_args(shlex.split(line)[1:])
    arms = [cli.bench_config(cli.build_parser().parse_args(
        ["bench", "--workload", args.workload, "--preset", args.preset, *shlex.split(arm)]))
        for arm in (args.a, args.b)]
    assert [a.config_hash() for a in arms] == [base.config_hash(), top.config_hash()]
    defaults = RunConfig.for_preset("cnn", "quick")
    assert "--a '' --b " in compare_line(RunConfig(workload="cnn", preset="quick"), defaults.replace(dtype="bf16"))


def test_cli_ladder_json_and_a_clear_error_without_one(tmp_path, monkeypatch, capsys):
    from cpuopt_helpers import system

    monkeypatch.setenv("CPUOPT_RESULTS", str(tmp_path / "r.sqlite"))
    assert cli.main(["ladder", "--preset", "quick"]) == 2
    assert "no ladder for any workload on the quick preset" in capsys.readouterr().err
    facts = system.collect_facts()
    hand_on_rungs(Session(facts=facts, store=ResultStore(tmp_path / "r.sqlite")))
    assert cli.main(["ladder", "--preset", "quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["cnn"] and [r["step"] for r in out["cnn"]][-1] == "runtime"
    assert out["cnn"][-1]["vs_baseline"]["median"] == pytest.approx(1.32)
    assert out["cnn"][-1]["command"].endswith("--allocator jemalloc --option width=2")
    assert cli.main(["ladder", "--preset", "quick", "--workload", "cnn"]) == 0
    text = capsys.readouterr().out
    assert "threading         threads=1; vs the rung before 1.20x (95% CI: 1.10-1.30, 6 rounds): faster" in text
    assert "vs the baseline 1.32x (product of the rungs (after selection), 95% CI:" in text
    assert "measure it again: cpuopt bench --workload cnn" in text


def test_a_change_its_comparison_did_not_confirm_gets_no_borrowed_interval(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    session = Session(facts=make_facts(), store=store)
    base = RunConfig.for_preset("cnn", "quick").replace(threads=2)
    one, jem = base.replace(threads=1), base.replace(threads=1, allocator="jemalloc")
    session.hand_on(base, "baseline")
    session.hand_on(one, "threading", comparison=comparison(1.2, 1.1, 1.3))
    # the allocator's comparison was run against another base (03 re-run alone afterwards moved it)
    store.add_sweep("stale", "m", "04", "ab", [base.to_dict(), jem.to_dict()], {})
    session.hand_on(jem, "allocator", comparison=dict(comparison(1.1, 1.05, 1.15), sweep="stale"))
    rows = ladder.rungs(store, "m", "cnn", "quick", 2)
    assert rows[1].confirmed is True and rows[2].confirmed is False
    assert math.isnan(rows[2].vs_baseline["ci_low"]) and rows[2].vs_baseline["verdict"] == "too few rounds"
    session.hand_on(jem, "runtime", comparison=comparison(1.1, 1.0, 1.2, verdict="no different"))  # kept
    assert ladder.rungs(store, "m", "cnn", "quick", 2)[-1].kept


class FakeClimb:
    """A session whose runs are made up: each change multiplies samples/s by a known factor,
    so the climb's choices and its ladder can be checked exactly."""

    FACTORS = {"omp_runtime": 1.3, "allocator": 1.0, "channels_last": 1.2, "compile": 1.5, "dtype": 1.5,
               "optimizer_impl": 1.1, "ipex": 1.055}

    def __init__(self, session):
        self.session, self.sweeps, self.confirmed = session, 0, []

    def speed(self, c: RunConfig) -> float:
        s = 10.0
        for field, factor in self.FACTORS.items():
            if getattr(c, field) != getattr(RunConfig(), field):
                s *= factor
        return s * (1.1 if dict(c.options).get("frozen_bn") == "folded" else 1.0)

    def sweep(self, configs, rounds=1, tag=None, resume=True):
        self.sweeps += 1
        return [{"status": "ok", "config": c.to_dict(), "config_hash": c.config_hash(), "round": 0,
                 "sweep": f"s{self.sweeps}", "arm": i, "samples_per_s": self.speed(c), "peak_rss_mb": 100.0,
                 "label": c.label(), "losses": [1.0], "step_ms": {"median": 1000 / self.speed(c)},
                 **({"compile_s": 40.0, "compile_warm_s": 5.0} if c.compile else {})} for i, c in enumerate(configs)]

    def compare(self, a, b, n):
        ratio = self.speed(b) / self.speed(a)
        self.confirmed.append((a, b, n))
        return {"ratio": ratio, "ci_low": ratio * 0.97, "ci_high": ratio * 1.03, "n": n, "label": "95% CI",
                "verdict": "faster" if ratio > 1.05 else "no different", "margin": 0.05, "min_rounds": 5}

    def confirmer(self, tag, min_rounds, max_rounds, budget_min, resume):
        return lambda a, b: self.compare(a, b, min_rounds)

    def confirm(self, a, b, tag, min_rounds, max_rounds, budget_min, resume):
        return self.compare(a, b, min_rounds)


def test_the_case_study_climb_hands_on_each_confirmed_rung_and_claims_only_the_end_to_end_rounds(tmp_path, monkeypatch):
    from cpuopt_helpers import runtimes
    from cpuopt_helpers.stages import climb

    monkeypatch.setattr(runtimes, "ipex_facts", lambda: {"available": True, "reason": ""})

    facts = make_facts(allocators={"jemalloc": "/x/libjemalloc.so.2", "tcmalloc": None})
    session = Session(facts=facts, store=ResultStore(tmp_path / "r.sqlite"))
    fake = FakeClimb(session)
    for name in ("sweep", "confirmer", "confirm"):
        setattr(session, name, getattr(fake, name))
    base = RunConfig.for_preset("retinanet", "quick", optimizer="lamb", threads=2, steps=3, warmup=1)
    session.hand_on(base.replace(allocator="jemalloc"), "allocator", ladder="retinanet")  # left from an earlier climb
    result = climb.climb(session, base, "retinanet", True, "t", 5, 5, None, 10, progress=lambda line: None)
    by_rung = {r["rung"]: r for r in result["rungs"]}
    assert [r["rung"] for r in result["rungs"]] == list(climb.CLIMB_RUNGS)
    assert by_rung["threading"]["handed_on"] is False  # pinning: no faster, not handed on
    assert by_rung["threading: OpenMP runtime"]["handed_on"] and by_rung["allocator"]["handed_on"] is False
    compiled = by_rung["runtime: torch.compile"]
    assert compiled["handed_on"] and compiled["finding"].kind == "compile pays"
    assert {k: compiled["finding"].values[k] for k in ("compile_s", "compile_warm_s", "train_steps", "carried")} == {
        "compile_s": 40.0, "compile_warm_s": 5.0, "train_steps": 5000, "carried": True}
    assert compiled["sentence"] == compiled["finding"].sentence and \
        "compiled in 40 s (5 s with a warm cache)" in compiled["sentence"]  # the ladder keeps the sentence
    top = result["top"]
    assert (top.omp_runtime, top.channels_last, top.compile, top.dtype, top.optimizer_impl) == (
        "intel", True, "default", "bf16", "fused")
    assert dict(top.env)["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path / "inductor"))  # one warm cache
    assert "TORCHINDUCTOR" not in setting_label(top.to_dict(), base.to_dict())
    fixes = by_rung["case-study fixes"]["table"]  # the paper's fused FrozenBatchNorm2d and folding it, screened
    assert sorted(fixes["name"]) == ["baseline", "the paper's fixes together",
                                     "the paper's fixes, FrozenBatchNorm2d folded into the conv"]
    assert dict(top.options) == {"focal": "fast", "frozen_bn": "folded", "loss": "fused"}  # the faster of the two, confirmed
    autotune = by_rung["runtime: max-autotune"]  # as fast as the default mode in this made-up session
    assert not autotune["handed_on"] and autotune["finding"].kind == "compile not faster"
    assert autotune["sentence"].startswith("runtime: max-autotune: compiled in 40 s") and \
        "against torch.compile (default mode) in fresh rounds" in autotune["sentence"]
    assert by_rung["bf16: channels-last"]["finding"].values["reason"] == "channels-last is on already"
    assert by_rung["case-study fixes: IPEX"]["finding"].values["reason"].startswith(  # not on a compiled ladder
        "the ladder carries torch.compile") and top.runtime == "main"
    step = by_rung["runtime: the whole step compiled"]  # no faster here either: the model stays the compiled part
    assert not step["handed_on"] and step["finding"].values["against"] == "torch.compile (default mode)"
    end = result["end_to_end"]
    on_top = by_rung["case-study fixes: allocator"]  # glibc's kept below: jemalloc again on the top, no faster here
    assert sorted(on_top["table"]["name"]) == ["baseline", "jemalloc"] and not on_top["handed_on"]
    assert len(fake.confirmed) == 11  # every rung with a candidate confirmed, whatever one screening said; the end
    assert fake.confirmed[-1] == (base, top, 10) and end["ratio"] == pytest.approx(1.3 * 1.2 * 1.5 * 1.5 * 1.1 * 1.1)
    rows = ladder.rungs(session.store, "m", "retinanet", "quick", 2)
    assert [r.step for r in rows] == ["baseline", *climb.CLIMB_RUNGS]  # the stale rung replaced
    assert [r.change for r in rows][1:3] == ["kept", "omp_runtime=intel"] and rows[1].kept
    assert rows[-1].kept and rows[-2].kept and rows[-3].end_to_end.n == 10
    assert ladder.top_end_to_end(rows) is rows[-3].end_to_end
    assert rows[-1].vs_baseline["ratio"] == pytest.approx(end["ratio"])
    found = climb.climb_findings(result)
    assert [f.kind for f in found] == ["climb rung"] * len(climb.CLIMB_RUNGS) + ["climb top"]
    assert found[4].values["said"] == {"kind": "compile pays", "values": compiled["finding"].values}
    assert found[-1].values["met"] and found[-1].comparison.ratio == pytest.approx(end["ratio"])
    assert found[-1].values["change"] == setting_label(top.to_dict(), base.to_dict())
    # no bf16 fast path: the rung is skipped with the gate's reason, and the 601-class ladder stays apart
    session.facts = facts.replace(bf16={"accelerated": False, "reason": "no AVX512-BF16 or AMX"})
    fp32 = climb.climb(session, choosing.with_options(base, classes=601), "retinanet, 601 classes", True, "t",
                            5, 5, None, 10, train_steps=1000, progress=lambda line: None)
    compiled = fp32["rungs"][4]["finding"]
    assert compiled.values["train_steps"] == 1000 and not compiled.values["carried"]
    assert fp32["top"].compile is None and not fp32["rungs"][4]["handed_on"]  # faster, but it would not pay
    autotune = fp32["rungs"][5]["finding"]  # against eager where the default mode was not carried up
    assert autotune.values["against"] == "eager" and not autotune.values["carried"]
    skipped = fp32["rungs"][7]["finding"]
    assert (skipped.kind, skipped.values["rung"]) == ("rung skipped", "bf16")
    assert skipped.values["reason"].startswith("no bf16 fast path on this CPU (no AVX512-BF16 or AMX)")
    assert fp32["rungs"][8]["finding"].values["reason"].startswith("the ladder is not in bf16 here")
    assert fp32["top"].dtype == "fp32" and dict(fp32["top"].options)["classes"] == "601"
    assert (fp32["top"].runtime, fp32["top"].ipex) == ("ipex", True) and fp32["rungs"][-1]["handed_on"]  # eager: tried
    assert not climb.climb_findings(fp32)[-1].values["met"]
    assert ladder.workloads(session.store, "m", "quick", "retinanet") == ["retinanet", "retinanet, 601 classes"]
    with pytest.raises(CpuoptError, match="unknown rung"):
        climb.climb(session, base, "retinanet", True, "t", 5, 5, None, 10, rungs=("quantization",))


def test_the_ipex_rung_says_why_it_was_not_tried(monkeypatch):
    from cpuopt_helpers import runtimes
    from cpuopt_helpers.stages import climb

    base = RunConfig.for_preset("retinanet", "quick", optimizer="lamb", threads=2)
    where = climb.Climbing(base.replace(dtype="bf16"), base, make_facts(), True)
    monkeypatch.setattr(runtimes, "ipex_facts", lambda: {"available": False, "reason": "IPEX=0 was set"})
    assert climb.ipex(where) == ((), "no usable IPEX runtime: IPEX=0 was set")
    monkeypatch.setattr(runtimes, "ipex_facts", lambda: {"available": True, "reason": ""})
    (arm,), why = climb.ipex(where)
    assert why == "" and (arm.config.runtime, arm.config.ipex, arm.config.dtype) == ("ipex", True, "bf16")
    assert climb.ipex(where.__class__(arm.config, base, make_facts(), True))[1].startswith("the ladder runs in another")


def test_the_allocators_are_tried_again_on_the_top_only_where_the_ladder_kept_glibcs():
    from cpuopt_helpers.stages import climb

    base = RunConfig.for_preset("retinanet", "quick", optimizer="lamb", threads=2)
    facts = make_facts(allocators={"jemalloc": "/x/libjemalloc.so.2", "tcmalloc": "/x/libtcmalloc.so.4"})
    top = base.replace(dtype="bf16", compile="default")
    arms, why = climb.allocators_on_top(climb.Climbing(top, base, facts, True))
    assert why == "" and [(a.name, a.config) for a in arms] == [
        ("jemalloc", top.replace(allocator="jemalloc")), ("tcmalloc", top.replace(allocator="tcmalloc"))]
    carried = top.replace(allocator="tcmalloc")
    assert climb.allocators_on_top(climb.Climbing(carried, base, facts, True)) == (
        (), "the ladder carries tcmalloc already")
    none = make_facts(allocators={"jemalloc": None, "tcmalloc": None})
    assert climb.allocators_on_top(climb.Climbing(top, base, none, True))[1].startswith("neither jemalloc")


def test_the_end_to_end_verdict_is_found_below_rungs_that_kept_the_configuration():
    from cpuopt_helpers.decisions import Comparison, Rung

    end = Comparison(ratio=1.5, ci_low=1.4, ci_high=1.7, n=10, verdict="faster")
    rows = [Rung(step, step, {}, None, None, {}, e) for step, e in (("runtime", None), ("bf16", end), ("fixes", None))]
    assert ladder.top_end_to_end(rows) is end and ladder.top_end_to_end(rows[:1]) is None  # bf16 confirmed, the fixes kept


def test_the_ladder_figure_draws_no_interval_for_a_rung_its_comparison_did_not_confirm():
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from cpuopt_helpers import plots

    # as make run on the AMD EPYC left it: bf16 confirmed 1.63x against another reference than the
    # rung before, so the chain stays at 1.08x and the figure once raised on a negative error bar
    table = pd.DataFrame({"step": ["baseline", "runtime", "bf16"], "cumulative_speedup": [1.0, 1.08, 1.08],
                          "vs_previous_low": [None, 1.03, 1.56], "vs_previous_high": [None, 1.14, 1.70],
                          "confirmed": [None, True, False]})
    fig = plots.waterfall({"cnn": table})
    from matplotlib.container import ErrorbarContainer

    assert sum(isinstance(c, ErrorbarContainer) for c in fig.axes[0].containers) == 1  # the runtime rung's only


def test_notebook_08_climbs_every_rung_by_default():
    """`make case-study` climbs the notebook's default CLIMB_RUNGS: every rung of climb.CLIMB, in order."""
    import ast
    from pathlib import Path

    from cpuopt_helpers.stages import climb

    nb = json.loads((Path(__file__).parents[1] / "notebooks" / "08_case_study_retinanet.ipynb").read_text())
    params = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    assigned = {node.targets[0].id: node.value for node in ast.parse("".join(params["source"])).body
                if isinstance(node, ast.Assign)}
    assert ast.literal_eval(assigned["CLIMB_RUNGS"]) == list(climb.CLIMB_RUNGS)


def test_the_ladder_figure_labels_only_the_rungs_that_moved_the_ladder():
    """A climb of many rungs, most of them kept the rung below: their levels would repeat the label
    beside them (13 rungs ran labels into each other on 2026-12-05), so they get a tick and no label."""
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from cpuopt_helpers import plots

    levels = [1.0, 1.0, 1.03, 1.17, 1.17, 1.17, 1.17, 1.17, 1.83, 1.83, 2.06, 2.06, 2.06]
    ratios = [b / a for a, b in zip(levels, levels[1:])]
    table = pd.DataFrame({"step": [f"rung {i}" for i in range(len(levels))], "cumulative_speedup": levels,
                          "vs_previous_low": [None] + [r * 0.95 for r in ratios],
                          "vs_previous_high": [None] + [r * 1.05 for r in ratios],
                          "confirmed": [None] + [True] * len(ratios)})
    final = {"ratio": 1.85, "ci_low": 1.77, "ci_high": 1.92, "n": 10}
    fig = plots.waterfall({"retinanet": table, "cnn": table.head(3)}, {"retinanet": final})
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["1.00x", "1.03x", "1.17x", "1.83x", "2.06x", "1.85x"]  # the start, four moves, the end
    assert len(fig.axes[0].collections) >= len(levels) - 5  # a tick for each rung that kept the level
    assert fig.axes[0].get_position().width > fig.axes[1].get_position().width  # more rungs, a wider panel
    block = pd.DataFrame({"step": ["baseline", "the paper's recipe"], "cumulative_speedup": [1.0, float("nan")],
                          "vs_previous_low": [None, None], "vs_previous_high": [None, None], "confirmed": [None, False]})
    texts = [t.get_text() for t in plots.waterfall({"retinanet": block}, {"retinanet": final}).axes[0].texts]
    assert texts == ["1.00x", "one block:\nsee end\nvs start", "1.85x"]  # not a flat tick that reads "kept"
