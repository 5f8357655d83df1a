"""Sweep plans for notebooks 03/04 and the statistics that choose what is handed on."""

import dataclasses
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from cpuopt_helpers.system import Facts
from cpuopt_helpers.config import RunConfig, setting_label
from cpuopt_helpers.decisions import Choice, Finding, Plan, as_comparison
from cpuopt_helpers.stages import allocator, case_study, choosing, extensions, summary, threads
from tests.conftest import make_facts

FACTS = make_facts(physical_cores=4, logical_cores=8, sockets=2, openmp={"intel": "/x/libiomp5.so"},
                   allocators={"jemalloc": "/x/libjemalloc.so.2", "tcmalloc": None})


def test_thread_counts():
    assert threads.thread_counts(2, 2) == [1, 2]
    assert threads.thread_counts(6, 12) == [1, 2, 4, 6, 12]
    assert threads.thread_counts(1, 1) == [1]


def test_loader_workers_are_swept_for_image_models_only():
    configs = threads.configs(RunConfig.for_preset("rnn", "quick"), FACTS, image_like=False).configs
    assert {c.loader_workers for c in configs} == {0}


def test_threading_configs_cover_every_setting_once():
    configs = threads.configs(RunConfig.for_preset("cnn", "quick"), FACTS).configs
    labels = [c.label() for c in configs]
    assert len(set(c.config_hash() for c in configs)) == len(configs)
    assert configs[0].threads == 4  # the base, spelled out
    assert {c.threads for c in configs if not c.oversubscribe} == {1, 2, 4, 8}
    assert any("affinity=scatter" in x for x in labels) and any("affinity=none" in x for x in labels)
    assert {c.kmp_blocktime for c in configs if c.omp_runtime == "intel"} == {0, 1, 200}
    assert any(c.oversubscribe and c.threads == 16 for c in configs)
    assert {c.loader_workers for c in configs} == {0, 1, 4}
    one_socket = FACTS.replace(sockets=1, openmp={"intel": None})
    configs = threads.configs(RunConfig.for_preset("cnn", "quick"), one_socket).configs
    assert not any(c.affinity == "scatter" or c.omp_runtime == "intel" for c in configs)


def test_allocator_configs_and_missing_ones():
    base = RunConfig.for_preset("rnn", "quick", allocator="tcmalloc", omp_runtime="intel")
    plan = allocator.configs(base, FACTS)
    configs, missing = plan.configs, plan.left_out
    assert [c.allocator for c in configs] == ["default", "jemalloc", "jemalloc"]
    assert dict(configs[2].env)["MALLOC_CONF"] == "oversize_threshold:1,background_thread:true,metadata_thp:auto"
    assert "MALLOC_CONF" not in dict(configs[1].env) and all(c.omp_runtime == "intel" for c in configs)
    assert list(missing) == ["tcmalloc"] and "apt-get install libtcmalloc-minimal4" in missing["tcmalloc"]


def test_launcher_configs():
    best = RunConfig.for_preset("cnn", "quick", threads=4, allocator="jemalloc")
    default, run_cpu, chosen = allocator.launcher_configs(best, FACTS).configs
    assert default.allocator == "default" and default.threads == 4 and run_cpu.launcher == "run_cpu"
    assert chosen == best
    assert len(allocator.launcher_configs(default, FACTS).arms) == 2  # the best is the default: measured once


def result(config, round_, sps, rss=100.0, arm=None, sweep="s1", losses=None):
    return {"status": "ok", "config": config.to_dict(), "config_hash": config.config_hash(), "round": round_,
            "sweep": sweep, "arm": arm if arm is not None else hash(config.config_hash()) % 1000,
            "samples_per_s": sps, "peak_rss_mb": rss, "label": config.label(), "losses": losses}


def test_a_setting_whose_loss_drifts_is_no_candidate_and_memory_growth_is_said():
    base = RunConfig.for_preset("cnn", "quick", threads=2)
    drifting, steady, loader = base.replace(dtype="bf16"), base.replace(allocator="jemalloc"), base.replace(loader_workers=1)
    curve = [2.0, 1.5, 1.0, 0.6]
    results = []
    for i in range(3):
        results += [result(base, i, 10.0, arm=0, losses=curve),
                    result(drifting, i, 14.0, arm=1, losses=[2.0, 1.9, 1.8, 1.7, 1.6]),  # 45% above: drifted
                    result(steady, i, 12.0, rss=130.0, arm=2, losses=[2.0, 1.52, 1.01, 0.62, 0.1]),  # within 10%
                    result(loader, i, 13.0, arm=3, losses=[3.0, 2.9, 2.8, 2.7])]  # other batches: not judged
    table = choosing.compare_configs(results, base.to_dict(), "cnn")
    by = table.set_index("setting")
    assert by.loc["dtype=bf16", "loss_drift"] == pytest.approx((1.85 - 1.275) / 1.275)  # over the 4 steps all ran
    assert by.loc["allocator=jemalloc", "loss_drift"] < 0.10 and by.loc["allocator=jemalloc", "rss_ratio"] == 1.3
    assert math.isnan(by.loc["loader_workers=1", "loss_drift"])
    asked = []
    choice = choosing.choose(table, "cnn", lambda a, b: asked.append(b) or {"verdict": "faster", "ratio": 1.3, "n": 5,
                                                                             "ci_low": 1.1, "ci_high": 1.5})
    assert [c.loader_workers for c in asked] == [1]  # the fastest that kept the loss (or could not be judged)
    assert choice.finding.values["excluded"] == [["dtype=bf16", pytest.approx((1.85 - 1.275) / 1.275)]]
    assert "dtype=bf16 is no candidate: its loss drifted 45% from the baseline's (more than 10%" in choice.sentence
    results = [r for r in results if r["config"]["loader_workers"] == 0]
    choice = choosing.choose(choosing.compare_configs(results, base.to_dict(), "cnn"), "cnn",
                             lambda a, b: asked.append(b) or {"verdict": "faster", "ratio": 1.2, "n": 5,
                                                              "ci_low": 1.1, "ci_high": 1.3})
    assert choice.config.allocator == "jemalloc" and choice.finding.values["rss_growth"] == pytest.approx(0.3)
    assert "30% more peak memory" in choice.sentence


def test_a_setting_whose_loss_turns_nan_is_no_candidate():
    # measured: bf16 + channels-last made oneDNN's backward-weights of a 3x3 stride-2 conv on a 1x1 input
    # NaN in about one call of five (torch 2.13, Xeon with AMX); a NaN loss once escaped the guard
    base = RunConfig.for_preset("cnn", "quick", threads=2)
    nan = base.replace(dtype="bf16", channels_last=True)
    results = []
    for i in range(3):
        results += [result(base, i, 10.0, arm=0, losses=[2.0, 1.5, 1.0]),
                    result(nan, i, 20.0, arm=1, losses=[2.0, float("nan"), float("nan")])]
    table = choosing.compare_configs(results, base.to_dict(), "cnn")
    assert math.isinf(table.set_index("setting").loc["dtype=bf16 channels_last=True", "loss_drift"])
    choice = choosing.choose(table, "cnn", lambda a, b: pytest.fail("nothing to confirm"))
    assert choice.config.dtype == "fp32" and choice.comparison is None and choice.finding.kind == "all drifted"
    assert choice.finding.values["excluded"] == [["dtype=bf16 channels_last=True", None]]
    assert "dtype=bf16 channels_last=True is no candidate: its loss was not finite" in choice.sentence
    assert choosing.loss_drift(float("nan"), float("nan")) is None  # a NaN baseline judges nothing


def test_runs_without_recorded_losses_are_not_judged():
    base = RunConfig.for_preset("cnn", "quick", threads=2)
    results = [result(base, 0, 10.0, arm=0), result(base.replace(dtype="bf16"), 0, 12.0, arm=1)]
    table = choosing.compare_configs(results, base.to_dict(), "cnn")
    assert table["loss_drift"].isna().all()
    assert choosing.choose(table, "cnn").finding.values["excluded"] == []


def screened():
    base = RunConfig(threads=2)
    fast, noisy = base.replace(allocator="jemalloc"), base.replace(allocator="tcmalloc")
    results = []
    for i, drift in enumerate([1.0, 0.7, 1.3, 0.9, 1.1]):  # the machine drifts; ratios are paired per round
        results += [result(base, i, 100 * drift, arm=0), result(fast, i, 120 * drift * (1 + 0.01 * i), rss=130, arm=1),
                    result(noisy, i, 100 * drift * (1.3 if i % 2 else 0.8), arm=2)]
    return base, results


def test_compare_pairs_by_round_and_words_verdicts_from_compare():
    base, results = screened()
    table = choosing.compare_configs(results, base.to_dict())
    row = table.set_index("setting").loc["allocator=jemalloc"]
    assert row.ratio == pytest.approx(1.2 * math.exp(sum(math.log(1 + 0.01 * i) for i in range(5)) / 5))
    assert row.ratio_low > 1.15 and row.verdict == "faster"
    assert table.set_index("setting").loc["allocator=tcmalloc"].verdict == "no different"
    said = {f.values["setting"]: f for f in threads.settings_findings(table, "cnn")}
    assert said["allocator=jemalloc"].kind == "setting over baseline" and said["allocator=jemalloc"].comparison.faster
    assert said["allocator=jemalloc"].comparison.ratio == pytest.approx(row.ratio)
    assert said["allocator=jemalloc"].sentence.startswith("cnn: allocator=jemalloc: 1.22x (95% CI")
    memory, = allocator.memory_findings(table, "cnn")
    assert memory.values["baseline_mb"] == 100.0 and ["allocator=jemalloc", 130.0] in memory.values["settings"]
    assert "allocator=jemalloc 130 MB (+30%)" in memory.sentence
    few = choosing.compare_configs([r for r in results if r["round"] < 2], base.to_dict())
    assert few.set_index("setting").loc["allocator=jemalloc"].verdict == "screened, 2 rounds"  # ranks, no verdict
    only, = threads.settings_findings(few, "cnn")  # one record for every setting screened only
    assert (only.kind, only.values["settings"], only.values["rounds"]) == (
        "screened only", ["allocator=jemalloc", "allocator=tcmalloc"], 2)
    assert only.sentence.startswith("cnn: 2 settings screened only (2 rounds, fewer than the 5 a verdict needs), "
                                    "each against the baseline: allocator=jemalloc 1.2")
    assert only.sentence.endswith("x: the table ranks them, a confirmation decides.")
    ratios = dict(zip(only.values["settings"], only.values["ratios"]))
    assert only.sentence.index("allocator=jemalloc") < only.sentence.index("allocator=tcmalloc")  # fastest first
    assert ratios["allocator=jemalloc"] > ratios["allocator=tcmalloc"]
    assert math.isnan(few.set_index("setting").loc["allocator=jemalloc"].ratio_low)


@pytest.mark.parametrize("glibc_share, said", [(0.30, True), (0.05, False)])
def test_the_kernels_share_under_each_allocator_is_said_where_one_reaches_it(glibc_share, said):
    base, results = screened()
    shares = {"default": (glibc_share, 50000.0), "jemalloc": (0.01, 40.0), "tcmalloc": (0.02, 90.0)}
    for r in results:
        share, faults = shares[r["config"]["allocator"]]
        r |= {"system_share": share * (1 + 0.01 * r["round"]), "page_faults_per_step": faults}
    table = choosing.compare_configs(results, base.to_dict())
    by = table.set_index("setting")
    assert by.loc["baseline", "system_share"] == pytest.approx(glibc_share * 1.02)  # the median of 5 rounds
    assert by.loc["allocator=tcmalloc", "page_faults_per_step"] == 90.0
    found = allocator.kernel_findings(table, "cnn")
    assert bool(found) == said
    if said:
        assert found[0].sentence == ("cnn: the OS kernel's share of the timed steps' CPU time (system time; "
                                     "page faults a step): "
                                     "glibc malloc 31% (50,000); allocator=jemalloc 1% (40); allocator=tcmalloc 2% "
                                     "(90). Memory an allocator hands back to the OS is faulted in again, page by "
                                     "page, at its next use.")
    del results[0]["system_share"]  # a run of a worker that read no CPU time: no share for its arm, none made up
    table = choosing.compare_configs(results, base.to_dict())
    assert math.isnan(table.set_index("setting").loc["baseline", "system_share"])


def test_an_aa_sweep_keeps_its_two_arms_apart():
    base = RunConfig(threads=2)
    results = [result(base, i, 100.0 + i, arm=0) for i in range(5)] + [result(base, i, 101.0 + i, arm=1)
                                                                      for i in range(5)]
    table = choosing.compare_configs(results, base.to_dict())
    assert len(table) == 2 and set(table.setting) == {"baseline", "baseline (repeat arm)"}


def test_choose_confirms_the_screening_winner_in_fresh_rounds():
    base, results = screened()
    table = choosing.compare_configs([r for r in results if r["round"] < 2], base.to_dict())
    calls = []

    def confirm(verdict, ratio=1.2):
        def run(a, b):
            calls.append((a, b))
            return {"ratio": ratio, "ci_low": ratio - 0.1 if ratio > 1.1 else 1.001, "ci_high": ratio + 0.1, "n": 6,
                    "verdict": verdict, "margin": 0.05, "min_rounds": 5,
                    "label": "95% repeated-confidence interval (per-look 98.7%)"}
        return run
    choice = choosing.choose(table, "cnn", confirm("faster"))
    assert choice.config.allocator == "jemalloc" and choice.changed and choice.comparison.n == 6
    assert (choice.finding.kind, choice.finding.values["setting"]) == ("confirmed", "allocator=jemalloc")
    assert choice.sentence.endswith(": faster: handed on.")
    assert calls[0][0].allocator == "default" and calls[0][1].allocator == "jemalloc"
    tiny = choosing.choose(table, "cnn", confirm("faster", ratio=1.015))  # real, but below the 2% worth a change
    assert tiny.config.allocator == "default" and not tiny.changed and tiny.comparison.faster
    assert tiny.sentence.endswith(": faster, but by less than the 2% worth a change; the baseline is kept.")
    choice = choosing.choose(table, "cnn", confirm("no different"))
    assert choice.config.allocator == "default" and not choice.changed and choice.comparison.verdict == "no different"
    assert choice.sentence.endswith("; the baseline is kept.")
    choice = choosing.choose(table, "cnn")  # no confirmation: nothing is handed on
    assert choice.config.allocator == "default" and choice.comparison is None and choice.finding.kind == "not confirmed"
    slow_only = choosing.compare_configs([r for r in results if r["arm"] != 1], base.to_dict())
    calls.clear()
    slow_only.loc[~slow_only.is_baseline, "ratio"] = 0.9
    choice = choosing.choose(slow_only, "cnn", confirm("faster"))
    assert calls == [] and choice.config.allocator == "default" and choice.finding.kind == "not beaten"
    # the incumbent is found by its configuration, never by its label
    relabelled = table.assign(setting=["the incumbent"] + list(table.setting[1:]))
    assert choosing.choose(relabelled, "cnn", confirm("faster")).config.allocator == "jemalloc"
    assert choosing.choose(table, "cnn", confirm("faster"), incumbent=base.replace(allocator="tcmalloc")).finding.values[
        "setting"] == "allocator=jemalloc"


def test_scaling_table_and_findings():
    results = [result(RunConfig(threads=t), 0, 100 * t ** 0.8) for t in (1, 2, 4)]
    results.append(result(RunConfig(threads=4, allocator="jemalloc"), 0, 999))  # not part of the scaling line
    t = threads.scaling_table(results, "cnn")
    assert list(t.threads) == [1, 2, 4] and t.ideal.tolist() == [100, 200, 400]
    assert t.efficiency.iloc[-1] == pytest.approx(4 ** 0.8 / 4)
    scaling, = threads.scaling_findings(t, "cnn")
    assert scaling.kind == "thread scaling" and (scaling.values["threads"], scaling.values["fastest_threads"]) == (4, 4)
    assert scaling.values["efficiency"] == pytest.approx(4 ** 0.8 / 4)
    assert "(76% of ideal linear scaling)" in scaling.sentence
    assert threads.scaling_findings(t.iloc[:1], "cnn")[0].kind == "one thread count"


def test_case_study_baseline_drops_fixes_handed_on_earlier():
    fixed = choosing.with_options(RunConfig.for_preset("retinanet", "quick"), focal="fast").replace(
        optimizer="lamb", optimizer_impl="foreach")
    plan = case_study.configs(fixed, FACTS)
    configs = plan.named
    assert configs["baseline"].options == () and configs["baseline"].optimizer_impl == "default" and not plan.left_out
    assert configs["FrozenBatchNorm2d folded into the conv"].options == (("frozen_bn", "folded"),)
    assert configs["focal + box loss in one pass"].options == (("loss", "fused"),)
    assert dict(configs["all fixes"].options) == {"focal": "fast", "frozen_bn": "fused", "loss": "fused"}
    assert setting_label(configs["all fixes"].to_dict(), configs["baseline"].to_dict()) == \
        "optimizer_impl=fused focal=fast frozen_bn=fused loss=fused"


def test_case_study_screens_the_trainable_layers_arms_only_when_asked():
    plan = case_study.configs(RunConfig.for_preset("retinanet", "quick"), FACTS)
    every = case_study.measured({"retinanet": plan}, discrepancy=True)
    fewer = case_study.measured({"retinanet": plan}, discrepancy=False, trainable=False)
    assert {"trainable_layers 0", "trainable_layers 5", case_study.UNFIXED} <= set(every["retinanet"].named)
    assert set(fewer["retinanet"].named) == set(plan.named) | {case_study.UNFIXED}  # the paper's unfixed build stays
    assert "retinanet, 601 classes" in every and list(fewer) == ["retinanet"]


def test_case_study_takes_the_fixes_a_user_workload_declares_and_names_the_others():
    plan = case_study.configs(RunConfig.for_preset("tests.user_workloads:tagger", "quick"), FACTS)
    configs, missing = plan.named, list(plan.left_out.values())
    assert list(configs) == ["baseline", "frozen batch norm", "fused FrozenBatchNorm2d",
                             "FrozenBatchNorm2d folded into the conv", "closed-form focal loss", "all fixes",
                             case_study.RECIPE]  # FACTS has a bf16 fast path: the fixes in bf16 too
    assert configs[case_study.RECIPE] == configs["all fixes"].replace(dtype="bf16")
    assert configs["baseline"].optimizer == "sgd" and dict(configs["all fixes"].options) == {
        "frozen_bn": "fused", "focal": "fast"}
    assert len(missing) == 2 and "declares no loss option" in missing[0]
    assert "multi-tensor and fused Lamb (it trains with sgd" in missing[1]
    plan = case_study.configs(RunConfig.for_preset("tests.user_workloads:dict_model", "quick"), FACTS)
    configs, missing = plan.named, list(plan.left_out.values())
    assert list(configs) == ["baseline"] and len(missing) == 4
    assert "declares no frozen_bn option" in missing[0] and "declares no focal option" in missing[1]


def test_ipex_is_confirmed_against_its_own_torch_in_fresh_rounds_and_said_so():
    """Notebook 05's question gets a verdict: IPEX against the torch 2.8 it runs in, confirmed by
    the comparison rule where both screened; the screen alone stays 'screened only'."""
    base = RunConfig(threads=2)
    configs = {"torch (stock)": base, extensions.IPEX_STOCK: base.replace(runtime="ipex"),
               extensions.IPEX: base.replace(runtime="ipex", ipex=True)}
    results = [result(c, 0, sps, arm=i) for i, (c, sps) in enumerate(zip(configs.values(), (100.0, 80.0, 90.0)))]
    for r in results:
        r.update(step_ms={"median": 10.0})
    plan, asked = Plan.of(configs), []
    confirmed = {"ratio": 1.12, "ci_low": 1.05, "ci_high": 1.2, "n": 8, "verdict": "faster", "label": "95% CI"}
    table = extensions.table(results, plan)
    session = SimpleNamespace(confirm=lambda *args: asked.append(args) or confirmed)
    got = extensions.confirm_ipex(session, table, plan, 8, 8, 4.0)
    assert got == confirmed
    assert asked == [(configs[extensions.IPEX_STOCK], configs[extensions.IPEX], "05_ipex/ipex", 8, 8, 4.0, True)]
    found = {f.kind: f for f in extensions.findings(table, plan, results, got)}
    assert found["ipex over its torch"].comparison.n == 8
    assert found["ipex over its torch"].sentence == ("cnn: IPEX over its own stock torch 2.8, in fresh paired rounds: "
                                                     "1.12x (95% CI: 1.05-1.20, 8 rounds): faster.")
    screened, = extensions.ipex_own_findings(results, plan)
    assert screened.sentence == "cnn: IPEX over its own stock torch 2.8: 1.12x (screened only, 1 round)."
    failed = [r for r in results if not r["config"]["ipex"]]  # IPEX's arm failed in screening: nothing to confirm
    assert extensions.confirm_ipex(session, extensions.table(failed, plan), plan, 8, 8) is None
    assert extensions.confirm_ipex(session, table, Plan.of({"torch (stock)": base}), 8, 8) is None  # no IPEX runtime
    assert len(asked) == 1
    # the other half: what notebook 05 hands on (here channels-last) against torch 2.8 + IPEX, in fresh rounds
    handed = Choice(base.replace(channels_last=True), as_comparison(confirmed), Finding("cnn", "runtime", "kept"))
    found, = extensions.handed_on_over_ipex(session, table, plan, handed, 8, 8, 4.0)
    assert asked[-1][:3] == (configs[extensions.IPEX], handed.config, "05_ipex/ipex")
    assert found.sentence == ("cnn: this torch as notebook 05 hands it on (channels_last=True) over torch 2.8 + IPEX, "
                              "in fresh paired rounds: 1.12x (95% CI: 1.05-1.20, 8 rounds): faster. So this torch "
                              "does without IPEX at no cost: the ladder goes on in it (IPEX is archived and needs "
                              "torch 2.8).")
    stock, = extensions.handed_on_over_ipex(session, table, plan, Choice(base, None, handed.finding), 8, 8)
    assert "hands it on (stock, nothing beat it) over torch 2.8 + IPEX" in stock.sentence
    assert extensions.handed_on_over_ipex(session, extensions.table(failed, plan), plan, handed, 8, 8) == []
    assert extensions.handed_on_over_ipex(session, table, plan, Choice(None, None, handed.finding), 8, 8) == []


def test_runtime_findings_when_stock_torch_beats_every_replacement():
    base = RunConfig(threads=2)
    configs = {"torch (stock)": base, "channels-last": base.replace(channels_last=True),
               "SGD foreach": base.replace(optimizer_impl="foreach")}
    results = []
    for i in range(2):
        results += [result(base, i, 100.0, arm=0), result(configs["channels-last"], i, 80.0, arm=1),
                    result(configs["SGD foreach"], i, 90.0, arm=2)]
    for r in results:
        r.update(step_ms={"median": 10.0})
    plan = Plan.of(configs)
    found = {f.kind: f for f in extensions.findings(extensions.table(results, plan), plan, results)}
    # the reference itself is no candidate: the fastest replacement is named, slower than stock
    fastest = found["fastest upstream"]
    assert fastest.values == {"name": "SGD foreach", "samples_per_s": 90.0}
    assert fastest.comparison.ratio == pytest.approx(0.9)
    assert fastest.sentence.startswith("cnn: with this torch no setting outran stock in screening; the closest, "
                                       "SGD foreach at 90.0 samples/s, 0.90x")
    faster = Finding("cnn", "ipex", "fastest upstream", fastest.values, dataclasses.replace(fastest.comparison,
                                                                                             ratio=1.1))
    assert faster.sentence.startswith("cnn: fastest with this torch in screening: SGD foreach at 90.0 samples/s, 1.10x")


def test_a_compile_too_short_to_have_generated_a_kernel_is_said_so():
    base = RunConfig(threads=2, workload="rnn")
    configs = {"torch (stock)": base, "torch.compile (default)": base.replace(compile="default", warmup=1)}
    results = []
    for i in range(2):
        results += [result(base, i, 100.0, arm=0), result(configs["torch.compile (default)"], i, 101.0, arm=1)]
    for r in results:
        r.update(step_ms={"median": 10.0}, compile_s=0.08 if r["config"]["compile"] else None, compile_warm_s=0.02)
    plan = Plan.of(configs)
    found = {f.kind: f for f in extensions.findings(extensions.table(results, plan), plan, results)}
    assert found["compiled nothing"].values == {"name": "torch.compile (default)", "compile_s": 0.08}
    assert "compile breakeven" not in found
    assert "took 0.08 s from a cold cache, too short for any kernel" in found["compiled nothing"].sentence
    for r in results:
        r.update(compile_s=30.0 if r["config"]["compile"] else None)
    found = {f.kind: f for f in extensions.findings(extensions.table(results, plan), plan, results)}
    assert found["compile breakeven"].values == {"name": "torch.compile (default)", "compile_s": 30.0,
                                                 "compile_warm_s": 0.02, "steps": None}  # its steps are no faster


def test_the_headline_is_the_top_against_the_defaults_in_fresh_rounds_and_is_kept_on_the_ladder(tmp_path):
    from cpuopt_helpers import ladder
    from cpuopt_helpers.results import ResultStore
    from cpuopt_helpers.session import Session

    session = Session(facts=make_facts(), store=ResultStore(tmp_path / "r.sqlite"))
    start = RunConfig.for_preset("cnn", "quick").replace(threads=2)
    threaded = start.replace(threads=1)
    comparison = {"ratio": 1.3, "ci_low": 1.1, "ci_high": 1.5, "n": 6, "verdict": "faster", "label": "95% CI",
                  "sweep": "s1", "margin": 0.05, "min_rounds": 5}
    asked = []

    def confirm(a, b, tag, min_rounds, max_rounds, budget_min, resume):
        asked.append((a.threads, b.threads, min_rounds, max_rounds))
        return dict(comparison, ratio=1.2, ci_low=1.05, ci_high=1.37, n=min_rounds, label="95% CI")

    session.confirm = confirm

    def tables():
        return {"cnn": summary.ladder_table(session.store, "m", "cnn", "quick", None, 1.0, 2)}

    session.hand_on(start, "baseline")
    assert summary.ends(session, tables(), 5, None) == {} and asked == []  # nothing changed: nothing to claim
    session.hand_on(threaded, "threading", comparison=comparison)
    session.hand_on(threaded, "allocator", comparison=dict(comparison, verdict="no different"))  # kept it
    finals = summary.ends(session, tables(), 5, None)
    # one rung made the whole change, yet its own (selected) confirmation is not reused: fresh, fixed rounds
    assert asked == [(2, 1, 5, 5)] and finals["cnn"]["ratio"] == 1.2
    rows = ladder.rungs(session.store, "m", "cnn", "quick", 2)
    assert rows[1].end_to_end.ratio == 1.2 and rows[2].end_to_end is None  # on the rung that changed it
    assert summary.ends(session, tables(), 5, None)["cnn"]["ratio"] == 1.2 and len(asked) == 1  # kept, not re-run
    headline, = summary.headline_findings(tables(), finals, 2.0)  # notebook 09's claim, from the fresh rounds
    assert (headline.kind, headline.comparison.ratio, headline.comparison.n) == ("ladder headline", 1.2, 5)
    assert headline.values["largest_step"] == {"step": "threading", "change": "threads=1", "ratio": 1.3}
    assert headline.values["peak_share"] is None and headline.values["usd_per_1000"] is None  # nothing measured
    assert headline.sentence.startswith("cnn: the ladder's top over PyTorch's defaults, in 5 fresh paired rounds: 1.20x")
    nothing, = summary.headline_findings(tables(), {}, 2.0)
    assert nothing.comparison is None and nothing.sentence.startswith("cnn: nothing was handed on beyond")
    for i, speed in enumerate((42.0, 50.0, 48.0)):  # the defaults' runs in three notebooks, the rate moving
        session.store.save_result({"config": start.to_dict(), "config_hash": start.config_hash(), "status": "ok",
                                   "samples_per_s": speed, "system": "m", "created_at": f"2026-12-01T10:0{i}:00+00:00"})
    _, spread = summary.headline_findings(tables(), finals, 2.0)
    assert spread.sentence.startswith("cnn: PyTorch's defaults ran at 42.0-50.0 samples/s over the 3 runs of them "
                                      "stored on this machine (median 48.0)")
    view = summary.ladder_view(tables()["cnn"])  # as notebook 09 shows it: every cell says something
    assert list(view["over the rung below"]) == ["the reference", "1.30x (95% CI: 1.10-1.50, 6 rounds): faster",
                                                 "kept: nothing changed"]
    assert list(view[summary.TO_DEFAULTS]) == ["the reference", "1.30x (1.10-1.50)", "1.30x (1.10-1.50)"]
    assert list(view["samples/s (median)"]) == ["48", "no run stored", "no run stored"]
    assert view["runs (slowest-fastest)"][0] == "3 (42-50)" and set(view["of the theoretical peak"]) == {"unknown"}
    assert summary._rate(2803.4) == "2803" and summary._rate(0.01234) == "0.0123"  # never 2.8e+03
    assert not view.isna().any().any()
    start_kept = tables()["cnn"].astype({"kept": object})  # a first stage that kept PyTorch's defaults
    start_kept.loc[1, ["kept", "cumulative_speedup", "cumulative_low", "cumulative_high"]] = [True, 1.0, 1.0, 1.0]
    assert summary.ladder_view(start_kept)[summary.TO_DEFAULTS][1] == "1.00x: nothing changed yet"


def test_a_stage_rerun_alone_starts_from_its_own_base_and_keeps_the_ladders_order(tmp_path):
    from cpuopt_helpers.errors import CpuoptError
    from cpuopt_helpers.results import ResultStore
    from cpuopt_helpers.session import Session

    session = Session(facts=make_facts(), store=ResultStore(tmp_path / "r.sqlite"))
    base = RunConfig.for_preset("cnn", "quick")
    threaded, allocated = base.replace(threads=1), base.replace(threads=1, allocator="jemalloc")
    session.hand_on(base, "baseline")
    session.hand_on(threaded, "threading")
    session.hand_on(allocated, "allocator")
    assert session.best_config("cnn", "quick") == allocated  # the whole ladder
    # notebook 03 re-run alone after a full run: it starts from the baseline, as it did then ...
    assert session.best_config("cnn", "quick", before="threading") == base
    assert session.best_config("cnn", "quick", before="runtime") == allocated
    session.hand_on(base.replace(threads=2), "threading")
    ladder = session.store.get_fact("m", "ladder/cnn/quick")
    # ... and replaces its own rung where it was, not at the end
    assert [s["step"] for s in ladder] == ["baseline", "threading", "allocator"]
    assert ladder[1]["config"]["threads"] == 2
    assert session.best_config("cnn", "quick") == allocated
    with pytest.raises(CpuoptError, match="unknown ladder stage 'thread'"):
        session.hand_on(base, "thread")
    assert session.best_config("rnn", "quick", before="threading") == RunConfig.for_preset("rnn", "quick")


def test_the_registry_has_a_module_and_a_notebook_per_stage_in_order():
    from pathlib import Path

    from cpuopt_helpers.errors import CpuoptError
    from cpuopt_helpers.stages import LADDER_STAGES, STAGES, stage, stage_index

    notebooks = sorted(p.name for p in (Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert [s.notebook for s in STAGES] == [n[:2] for n in notebooks if n[:2] != "00"]
    for s in STAGES:
        module = s.module
        assert module.__doc__ and module.__name__.endswith(f"stages.{s.name}")
        if s.rung and s.name != "baseline":  # every stage that hands a rung on says what it measures
            assert callable(module.configs), s.name
    assert LADDER_STAGES == ("baseline", "threading", "allocator", "runtime", "bf16", "multi-instance",
                             "case-study fixes")
    assert stage("06") is stage("bf16") is stage("precision")
    assert stage_index("runtime") < stage_index("bf16") < stage_index("an old name") == len(LADDER_STAGES)
    with pytest.raises(CpuoptError, match="unknown stage 'quantization'"):
        stage("quantization")


def test_layout_choice_confirms_ddp_and_says_what_memory_it_holds():
    from cpuopt_helpers.stages import multi_instance

    base = RunConfig.for_preset("cnn", "quick")
    plan = multi_instance.configs(base, Facts(physical_cores=2))
    configs = plan.configs
    assert [(c.threads, c.instances, c.mode) for c in configs] == [
        (1, 1, "independent"), (1, 2, "independent"), (1, 2, "ddp"), (2, 1, "independent")]
    speeds = {(1, 1, "independent"): 10.0, (1, 2, "independent"): 19.0, (1, 2, "ddp"): 18.0, (2, 1, "independent"): 15.0}
    results = [dict(result(c, i, speeds[(c.threads, c.instances, c.mode)], rss=200.0), params_in_sync=True)
               for i in range(2) for c in configs]
    table = multi_instance.layout_table(results, "cnn")
    assert table.set_index(["mode", "ranks"]).loc[("ddp", 2), "total_rss_mb"] == 400.0
    best = next(f for f in multi_instance.layout_findings(table, results, "cnn") if f.kind == "best layout")
    assert "2 ranks x 1 thread at 19.0 samples/s = 1.90x one rank on 1 thread (10.0 samples/s)" in best.sentence
    assert best.sentence.endswith("; 1.27x one process on all 2 threads (15.0 samples/s; independent copies train "
                                  "separate models: more trials at once, not one training run sooner) (screened "
                                  "only, 2 runs of each layout: no verdict).")
    stored = {k: v for k, v in best.values.items() if not k.startswith("base_") and k != "runs"} | {"threads": 2,
                                                                                                  "ideal": 2.0}
    old = Finding("cnn", "multi_instance", "best layout", stored)  # stored before the reference was kept
    assert "= 1.90x one rank on 2 threads (ideal 2x" in old.sentence  # its threads from the ideal: 2 x 2 / 2
    assert old.sentence.endswith("sooner).")  # nor its runs
    seen = []

    def confirm(a, b):
        seen.append((a.instances, b.instances, b.mode))
        return {"ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3, "n": 5, "verdict": "faster", "margin": 0.02,
                "min_rounds": 5, "label": "95% CI"}

    choice = multi_instance.choose(table, plan, confirm)
    assert seen == [(1, 2, "ddp")] and choice.config.mode == "ddp" and choice.config.instances == 2
    assert choice.finding.values["rss_growth"] == 1.0 and choice.changed
    assert choice.sentence.startswith("cnn: DDP 2 ranks x 1 threads (peak memory 400 MB over its ranks, 100% more")
    assert choice.sentence.endswith("handed on.")
    slower = {**speeds, (1, 2, "ddp"): 14.0}
    results = [dict(r, samples_per_s=slower[(r["config"]["threads"], r["config"]["instances"], r["config"]["mode"])])
               for r in results]
    choice = multi_instance.choose(multi_instance.table(results, plan), plan, confirm)
    assert (choice.config.instances, choice.config.threads, choice.comparison) == (1, 2, None)
    assert choice.finding.kind == "ddp not screened faster" and "no DDP layout screened faster" in choice.sentence
    assert choice.sentence.endswith("(independent copies train separate models: no candidate for one training run).")


def test_focal_kernel_against_its_physical_limit():
    rows = [{"shape": "quick 80 classes", "elements": 1_000_000, "part": "both", "kernel": k, "median_ms": ms}
            for k, ms in (("reference", 9.0), ("closed-form eager", 3.0))]
    rows.append({"shape": "quick 80 classes", "elements": 1_000_000, "part": "forward", "kernel": "x", "median_ms": 0.1})
    limit, = case_study.focal_limit_findings({"rows": rows, "dtype": "fp32"}, copy_gbs=10.0)
    # 5 x 4 B x 1e6 logits = 20 MB at 10 GB/s: 2 ms; the fastest kernel (3 ms) is 1.5x that
    assert (limit.values["kernel"], limit.values["median_ms"], limit.values["within"]) == ("closed-form eager", 3.0, True)
    assert limit.values["limit_ms"] == pytest.approx(2.0) and limit.values["element_bytes"] == 4
    assert ("takes 2.00 ms, the physical limit; the kernel takes 1.5x it. The case study aims for a kernel within 2x "
            "of the limit: reached.") in limit.sentence
    limit, = case_study.focal_limit_findings({"rows": rows, "dtype": "bf16"}, copy_gbs=10.0)
    assert limit.values["limit_ms"] == pytest.approx(1.0) and not limit.values["within"]


def test_frozen_layers_and_the_paper_table_are_worded_from_the_runs():
    base = RunConfig.for_preset("retinanet", "quick", optimizer="lamb", threads=4)
    arms = {"baseline": base, "fused FrozenBatchNorm2d": choosing.with_options(base, frozen_bn="fused")}
    arms |= case_study.frozen_layer_configs(base)
    assert list(arms)[2:] == [case_study.UNFIXED, "trainable_layers 0", "trainable_layers 5"]
    speeds = {"baseline": 10.0, "fused FrozenBatchNorm2d": 12.0, case_study.UNFIXED: 8.0, "trainable_layers 0": 11.0,
              "trainable_layers 5": 9.0}
    results = []
    for i in range(5):
        for arm, (name, config) in enumerate(arms.items()):
            r = result(config, i, speeds[name] * (1 + 0.01 * (i % 2)), arm=arm)
            results.append(dict(r, step_ms={"median": 1000 / speeds[name]}))
    found = case_study.frozen_time_findings(results, base, {n: c for n, c in arms.items() if n not in
                                                            ("baseline", "fused FrozenBatchNorm2d")})
    assert [f.kind for f in found] == ["frozen backward skipped", "trainable layers", "trainable layers"]
    assert found[0].workload == "retinanet" and found[0].comparison.ratio == pytest.approx(1.25, rel=0.01)
    assert found[1].values == {"name": "trainable_layers 0", "default": 3}
    assert found[1].comparison.ratio == pytest.approx(1.1, rel=0.01)
    assert found[1].sentence.startswith("retinanet: trainable_layers 0 over the default 3: 1.10x")
    focal = {"rounds": 5, "rows": [
        {"shape": "quick 80 classes", "kernel": k, "part": part, "speedup": s, "speedup_low": s * 0.9,
         "speedup_high": s * 1.1, "median_ms": 10 / s, "elements": 1000, "verdict": "faster" if s > 1 else "equivalent"}
        for part in ("forward", "backward") for k, s in (("reference", 1.0), ("closed-form eager", 2.0))]}
    lamb = [{"elements": 1_000_000, "kernels": {"loop": {"median_ms": 20.0}, "fused": {
        "median_ms": 10.0, "speedup_vs_loop": 2.0, "ci": [1.8, 2.2], "rounds": 5, "verdict": "faster"}}}]
    table = case_study.paper_table(results, arms, focal, lamb, None, 20.0, "quick").set_index("fix")
    assert table.loc["focal loss forward", "paper"] == 2.6 and table.loc["focal loss forward", "here"] == 2.0
    assert table.loc["fused FrozenBatchNorm2d", "here"] == pytest.approx(1.2, rel=0.01)
    assert table.loc["frozen layers (backward skipped)", "here"] == pytest.approx(1.25, rel=0.01)
    assert "`make case-study` measures it" in table.loc["conv + frozen BN + ReLU fused", "why"]
    assert "0.03 GB move, 2.8 GB/s of the 20.0 GB/s copy bandwidth" in table.loc["fused Lamb", "why"]
    assert table.loc["overall", "here, worded"] == "not measured" and "make case-study" in table.loc["overall", "why"]
    # the arm each whole-step row screened (the run's page leaves those findings out of its quotes): none unmeasured
    assert {k: v for k, v in table["arm"].items() if isinstance(v, str)} == {
        "fused FrozenBatchNorm2d": "fused FrozenBatchNorm2d", "frozen layers (backward skipped)": case_study.UNFIXED}
    shown = case_study.paper_view(table.reset_index()).set_index("fix")  # as notebook 08 displays it: no NaN
    assert "arm" not in shown.columns and "workload" not in shown.columns and set(table["workload"]) == {"retinanet"}
    assert shown.loc["conv + frozen BN + ReLU fused", "here"] == "not measured"
    assert shown.loc["FrozenBatchNorm2d folded into the conv", "paper"] == "no number in the paper"
    assert shown.loc["focal loss forward", "here"] == 2.0 and not shown.isna().any().any()
    recipe = base.replace(dtype="bf16")  # with the recipe (the fixes in bf16), the overall row is the recipe's
    results += [dict(result(recipe, i, 15.0, arm=len(arms)), step_ms={"median": 1000 / 15.0}) for i in range(5)]
    table = case_study.paper_table(results, arms | {case_study.RECIPE: recipe}, focal, lamb, None, 20.0, "quick")
    table = table.set_index("fix")
    assert table.loc["overall", "here"] == pytest.approx(1.5, rel=0.01)
    assert table.loc["overall", "arm"] == case_study.RECIPE
    assert "notebook 09 confirms it" in table.loc["overall", "why"]
    assert table.loc["fused FrozenBatchNorm2d", "why"] == "no step time"  # results without their instances
    frozen = pd.DataFrame({"trainable_layers": [0, 5], "backward_weights_ms": [200.0, 400.0],
                           "backward_data_ms": [228.0, 257.0]})  # the logs of notebook 08's frozen-layers runs
    why = case_study.paper_table(results, arms, focal, lamb, None, 20.0, "quick", frozen).set_index("fix").loc[
        "frozen layers (backward skipped)", "why"]
    assert why.endswith("; the logs: backward convolutions' oneDNN time 657 ms a step with 5 stages trainable, "
                        "428 ms with 0")


def bn_bench(separate: float, fused: float) -> dict:
    """kernels.benchmark frozen-bn's JSON: the parts' medians of both ways, the fused one's ratio."""
    rows = [{"part": "both", "kernel": "separate", "median_ms": separate, "speedup": 1.0, "speedup_low": 1.0,
             "speedup_high": 1.0, "verdict": "equivalent", "rounds": 10},
            {"part": "both", "kernel": "fused", "median_ms": fused, "speedup": separate / fused,
             "speedup_low": separate / fused * 0.9, "speedup_high": separate / fused * 1.1,
             "verdict": "faster" if fused < separate * 0.9 else "no different", "rounds": 10}]
    return {"dtype": "fp32", "rounds": 10, "layers": 53, "with_backward": 40, "rows": rows}


def test_the_paper_tables_batch_norm_rows_give_the_most_their_kernels_save_of_the_step():
    base = RunConfig.for_preset("retinanet", "quick", optimizer="lamb", threads=4)
    arms = {"baseline": base, "fused FrozenBatchNorm2d": choosing.with_options(base, frozen_bn="fused"),
            "FrozenBatchNorm2d folded into the conv": choosing.with_options(base, frozen_bn="folded")}
    runs = [dict(result(config, 0, 2 / s, arm=i), step_ms={"median": s * 1e3}, instances=[{"batch_size": 2}])
            for i, (config, s) in enumerate(zip(arms.values(), (1.5, 1.3, 1.4)))]  # one round: 1.15x, 1.07x
    table = case_study.paper_table(runs, arms, None, None, None, None, "quick", bn_bench=bn_bench(44.0, 36.0))
    fused, folded = table.set_index("fix").loc[["fused FrozenBatchNorm2d", "FrozenBatchNorm2d folded into the conv"],
                                               "why"]
    assert fused == ("mean step 1500 ms -> 1300 ms; the 53 frozen batch norms alone (fp32, 10 interleaved rounds): "
                     "44.0 ms a step as multiply + add, 36.0 ms as one call (medians); paired round by round: 1.22x "
                     "(95% CI: 1.10-1.34, 10 rounds): "
                     "faster; at most 8 ms of the 1500 ms step: 1.01x at most")  # 1500 / 1492
    assert folded.endswith("44.0 ms a step as multiply + add, which folding removes (it scales the weights instead); "
                           "at most 44 ms of the 1500 ms step: 1.03x at most")  # 1500 / 1456
    slower = case_study.paper_table(runs, arms, None, None, None, None, "quick", bn_bench=bn_bench(36.0, 44.0))
    assert slower.set_index("fix").loc["fused FrozenBatchNorm2d", "why"].endswith("; fusing them saves nothing of "
                                                                                  "the step")
    plain = case_study.paper_table(runs, arms, None, None, None, None, "quick")  # no benchmark: the steps alone
    assert plain.set_index("fix").loc["fused FrozenBatchNorm2d", "why"] == "mean step 1500 ms -> 1300 ms"


def test_the_paper_tables_step_times_are_those_its_ratio_is_made_of():
    base = RunConfig.for_preset("retinanet", "quick", optimizer="lamb", threads=4)
    arms = {"baseline": base, "fused FrozenBatchNorm2d": choosing.with_options(base, frozen_bn="fused")}
    # one round each; the fused arm's median step (1239 ms) hides a slow step: its mean is 1270 ms
    runs = [dict(result(base, 0, 2 / 1.309, arm=0), step_ms={"median": 1309.0}, instances=[{"batch_size": 2}]),
            dict(result(arms["fused FrozenBatchNorm2d"], 0, 2 / 1.270, arm=1), step_ms={"median": 1239.0},
                 instances=[{"batch_size": 2}])]
    row = case_study.paper_table(runs, arms, None, None, None, None, "quick").set_index("fix").loc[
        "fused FrozenBatchNorm2d"]
    assert row["here"] == pytest.approx(1309 / 1270) and row["why"] == "mean step 1309 ms -> 1270 ms"
    assert "screened only, 1 round" in row["here, worded"]
    two = [dict(r, samples_per_s=2 * r["samples_per_s"], instances=[{"batch_size": 2}] * 2) for r in runs]
    assert choosing.paired_steps(two, *(c.config_hash() for c in arms.values())) == pytest.approx((1309, 1270))
    unpaired = runs[:1] + [dict(runs[1], round=1)]  # no round in common: no step times
    assert choosing.paired_steps(unpaired, *(c.config_hash() for c in arms.values())) is None


def test_baseline_findings_compare_workloads_with_the_ceiling_only_when_there_are_several():
    import pandas as pd

    from cpuopt_helpers.stages import baseline

    row = {"samples_per_s": 10.0, "runs": 2, "low": 9.0, "high": 11.0, "step_ms": 100.0, "warning": None,
           "forward_share": 0.3, "backward_share": 0.6, "optimizer_share": 0.1}
    two = pd.DataFrame([dict(row, gflops=50.0), dict(row, gflops=150.0)], index=["rnn", "cnn"])
    found = baseline.findings(two, 200.0)
    assert [(f.workload, f.kind) for f in found] == [("rnn", "baseline throughput"), ("cnn", "baseline throughput"),
                                                     ("", "gemm gap")]
    assert (found[0].values["phase"], found[0].values["phase_share"], found[0].values["runs"]) == ("backward", 0.6, 2)
    assert found[-1].values == {"furthest": "rnn", "furthest_share": 0.25, "closest": "cnn", "closest_share": 0.75}
    assert found[0].sentence.startswith("rnn: 10.0 samples/s (median of 2 runs, range 9.0-11.0); backward takes 60%")
    with_theory, = baseline.findings(two.loc[["cnn"]], 200.0, 600.0)  # both shares of peak, where the peak is known
    assert with_theory.sentence.endswith("75% of the measured fp32 GEMM ceiling and 25% of the theoretical fp32 peak.")
    one = baseline.findings(two.loc[["cnn"]], 200.0)
    assert len(one) == 1 and one[0].values["gflops"] / one[0].values["peak_gflops"] == 0.75
    assert one[0].sentence.endswith("75% of the measured fp32 GEMM ceiling (the theoretical fp32 peak is unknown here: "
                                    "`cpuopt doctor`).")


def test_the_baseline_says_what_one_run_timed():
    from cpuopt_helpers.stages import baseline, choosing

    ok = {"status": "ok", "samples_per_s": 10.0, "step_ms": {"median": 100.0}, "achieved_gflops": 20.0,
          "startup_s": 1.0, "peak_rss_mb": 100.0, "phase_ms": {"forward": 30.0, "backward": 60.0, "optimizer": 10.0},
          "config": {"workload": "cnn", "steps": 6}, "instances": [{"batch_size": 32}]}  # as launch.measured has them
    table = choosing.throughput_table([dict(ok, warmup_steps=2), dict(ok, warmup_steps=4)])
    assert table.loc["cnn", ["batch", "timed_steps", "warmup_steps"]].tolist() == [32, 6, 4]  # warm-up: the most
    found, = baseline.findings(table, 200.0)
    assert ("(median of 2 runs, each 6 timed steps of batch 32 after up to 4 warm-up steps (until step times "
            "settled), range 10.0-10.0)") in found.sentence
    bare = {k: v for k, v in ok.items() if k != "instances"} | {"config": {"workload": "cnn"}}
    found, = baseline.findings(choosing.throughput_table([bare]), 200.0)  # results stored without them: not said
    assert "(median of 1 run, range" in found.sentence


def test_the_baseline_view_gives_both_peaks_shares_and_no_blank_cell():
    from cpuopt_helpers.stages import baseline, choosing

    ok = {"status": "ok", "samples_per_s": 10.0, "step_ms": {"median": 100.0}, "achieved_gflops": 20.0,
          "startup_s": 1.0, "peak_rss_mb": 100.0, "phase_ms": {"forward": 30.0, "backward": 60.0, "optimizer": 10.0},
          "config": {"workload": "cnn", "steps": 6}, "instances": [{"batch_size": 32}], "warmup_steps": 3,
          "system_share": 0.05, "page_faults_per_step": 1200}
    uncounted = {k: v for k, v in ok.items() if k not in ("instances", "system_share")} | {
        "config": {"workload": "mine"}, "achieved_gflops": None}
    table = choosing.throughput_table([ok, dict(ok, samples_per_s=12.0), uncounted])
    view = baseline.view(table, 200.0, 400.0)
    assert not view.isna().any().any()
    cnn, mine = view.loc["cnn"], view.loc["mine"]
    assert cnn["a run timed"] == "batch 32, 6 steps after 3 warm-up" and mine["a run timed"] == "not recorded"
    assert cnn["samples/s"] == "11.0 (range 10.0-12.0, 2 runs)" and mine["samples/s"] == "10.0 (1 run)"
    assert cnn["forward / backward / optimizer / other"] == "30% / 60% / 10% / 0%"
    assert (cnn["of the measured fp32 GEMM ceiling"], cnn["of the theoretical fp32 peak"]) == ("10%", "5%")
    assert mine["GFLOP/s"] == mine["of the theoretical fp32 peak"] == "FLOPs not counted"
    assert cnn["kernel's share of CPU time (page faults a step)"] == "5% (1,200)"
    assert mine["kernel's share of CPU time (page faults a step)"] == "not read"
    unknown = baseline.view(table, 200.0, None).loc["cnn", "of the theoretical fp32 peak"]
    assert unknown == "unknown (this CPU is not in the peak table)"


def test_uncounted_work_is_unknown_never_zero_gflops():
    import math

    import pandas as pd

    from cpuopt_helpers.stages import baseline, choosing

    ok = {"status": "ok", "config": {"workload": "mine"}, "samples_per_s": 10.0, "step_ms": {"median": 100.0},
          "startup_s": 1.0, "peak_rss_mb": 100.0, "phase_ms": {"forward": 30.0, "backward": 60.0, "optimizer": 10.0}}
    table = choosing.throughput_table([dict(ok, achieved_gflops=None), dict(ok, achieved_gflops=None)])
    assert math.isnan(table.loc["mine", "gflops"])
    found = baseline.findings(pd.concat([table, table.rename(index={"mine": "other"})]), 200.0)
    assert found[0].values["gflops"] is None and "GFLOP/s unknown (its FLOPs could not be counted)" in found[0].sentence
    assert "gemm gap" not in [f.kind for f in found]  # no comparison of shares it does not know


def test_the_baseline_says_where_the_kernel_takes_a_large_share_of_cpu_time():
    from cpuopt_helpers.launch import KERNEL_SHARE
    from cpuopt_helpers.stages import baseline, choosing

    ok = {"status": "ok", "samples_per_s": 10.0, "step_ms": {"median": 100.0}, "achieved_gflops": 20.0,
          "startup_s": 1.0, "peak_rss_mb": 100.0, "phase_ms": {"forward": 30.0, "backward": 60.0, "optimizer": 10.0}}
    runs = [dict(ok, config={"workload": w}, system_share=share, page_faults_per_step=faults)
            for w, share, faults in (("cnn", 0.30, 4000), ("cnn", 0.20, 2000), ("cnn", 0.40, 6000),
                                     ("rnn", KERNEL_SHARE / 2, 10), ("rnn", KERNEL_SHARE / 2, 10))]
    unread = [dict(ok, config={"workload": "mine"}, system_share=None, page_faults_per_step=None)]
    table = choosing.throughput_table(runs + unread)
    assert (table.loc["cnn", "system_share"], table.loc["cnn", "page_faults_per_step"]) == (0.30, 4000)
    shares = [f for f in baseline.findings(table, 200.0) if f.kind == "kernel share"]
    assert [(f.workload, f.values["settings"]) for f in shares] == [("cnn", [["PyTorch's defaults", 0.30, 4000.0]])]
    assert shares[0].sentence.startswith("cnn: the OS kernel's share of the timed steps' CPU time (system time; "
                                         "page faults a step): "
                                         "PyTorch's defaults 30% (4,000).")


def test_a_run_that_fell_back_says_so_in_its_name_and_is_never_a_candidate():
    base, results = screened()
    fell = [dict(r, fallbacks=[{"what": "fused Lamb", "fell_back_to": "eager", "reason": "CalledProcessError: cc"}])
            if r["config"]["allocator"] == "jemalloc" else r for r in results]
    table = choosing.compare_configs(fell, base.to_dict())
    row = table[table.setting.str.startswith("allocator=jemalloc")].iloc[0]
    assert row["setting"] == "allocator=jemalloc (fused Lamb fell back to eager: CalledProcessError: cc)" and row.fell_back
    confirmed = []
    choice = choosing.choose(table, "cnn", lambda a, b: confirmed.append(b) or {"verdict": "faster", "ratio": 1.5})
    assert all(c.allocator != "jemalloc" for c in confirmed) and choice.config.allocator != "jemalloc"
    assert "(fused Lamb fell back to eager: CalledProcessError: cc) is no candidate: it did not run what it was asked" \
        in choice.sentence


def test_every_stage_that_hands_on_follows_one_protocol():
    """configs(base, facts) -> Plan, table(results, plan), choose(table, plan, confirm) -> Choice and
    findings(table, ...): the notebooks and Session.settle call every stage alike."""
    import inspect

    import pandas as pd

    from cpuopt_helpers.decisions import Choice
    from cpuopt_helpers.stages import STAGES

    heads = {"configs": ["base", "facts"], "table": ["results", "plan"], "choose": ["table", "plan", "confirm"],
             "findings": ["table"]}
    context = {"bf16": {"accuracy": pd.DataFrame({"final_accuracy": [0.9, 0.9]}, index=["fp32", "bf16"]),
                        "gate": {"accelerated": True, "reason": "made up"}}}
    handing_on = [s for s in STAGES if s.rung]
    assert [s.name for s in handing_on] == ["baseline", "threads", "allocator", "extensions", "precision",
                                            "multi_instance", "case_study"]
    for s in handing_on:
        for name, head in heads.items():
            params = list(inspect.signature(getattr(s.module, name)).parameters)
            assert params[:len(head)] == head, (s.name, name, params)
        base = RunConfig.for_preset("retinanet" if s.name == "case_study" else "cnn", "quick")
        plan = s.module.configs(base, FACTS)
        assert isinstance(plan, Plan) and plan.workload == base.workload and plan.arms[0].config == plan.base
        choice = s.module.choose(s.module.table([], plan), plan, None, **context.get(s.rung, {}))
        assert isinstance(choice, Choice) and choice.finding.workload == base.workload, s.name


def test_every_table_shows_the_runs_that_timed_out_or_crashed():
    base = RunConfig.for_preset("cnn", "quick", threads=2)
    slow, broken = base.replace(allocator="jemalloc"), base.replace(dtype="bf16")
    results = []
    for i in range(3):
        results += [result(base, i, 10.0, arm=0), result(slow, i, 11.0, arm=1),
                    dict(result(broken, i, None, arm=2), status="failed", reason="RuntimeError")]
    results[1] = dict(results[1], status="timeout", samples_per_s=None)  # one of the slow arm's runs timed out
    table = choosing.compare_configs(results, base.to_dict(), "cnn").set_index("setting")
    assert table.loc["allocator=jemalloc", "failed"] == 1 and table.loc["allocator=jemalloc", "runs"] == 2
    assert table.loc["baseline", "failed"] == 0
    assert (table.loc["dtype=bf16", "runs"], table.loc["dtype=bf16", "failed"]) == (0, 3)
    assert table.loc["dtype=bf16", "verdict"] == "no result: crashed" and math.isnan(table.loc["dtype=bf16", "samples_per_s"])
    choice = choosing.choose(table.reset_index(), "cnn", lambda a, b: {"verdict": "faster", "ratio": 1.1, "n": 5})
    assert choice.config.allocator == "jemalloc"  # the arm that never finished is no candidate
    for r in results:
        r.update(step_ms={"median": 100.0}, achieved_gflops=None, startup_s=1.0,
                 phase_ms={"forward": 30.0, "backward": 50.0, "optimizer": 10.0})
    assert choosing.throughput_table(results).loc["cnn", "failed"] == 4  # notebook 01's table counts them too


def test_the_layout_table_shows_a_layout_that_never_finished():
    from cpuopt_helpers.stages import multi_instance

    plan = multi_instance.configs(RunConfig.for_preset("cnn", "quick"), Facts(physical_cores=2))
    speeds = {(1, 1): 10.0, (1, 2): 19.0, (2, 1): 15.0}
    results = [dict(result(c, i, speeds.get((c.threads, c.instances)), rss=200.0), params_in_sync=True)
               if c.mode == "independent" else dict(result(c, i, None), status="timeout")
               for i in range(2) for c in plan.configs]
    table = multi_instance.table(results, plan).set_index(["mode", "ranks"])
    assert table.loc[("ddp", 2), "failed"] == 2 and table.loc[("ddp", 2), "runs"] == 0
    assert math.isnan(table.loc[("ddp", 2), "samples_per_s"]) and table.loc[("independent", 2), "failed"] == 0
    choice = multi_instance.choose(table.reset_index(), plan, lambda a, b: pytest.fail("nothing to confirm"))
    assert choice.finding.kind == "no ddp layout" and choice.config.threads == 2


def test_the_summary_says_whether_a_workloads_runs_time_enough_steps(tmp_path):
    import random

    from cpuopt_helpers.results import ResultStore
    from tests.test_stats import _rounds

    store, rng = ResultStore(tmp_path / "r.sqlite"), random.Random(3)
    a, b = (RunConfig.for_preset("retinanet", "standard", steps=3, threads=t) for t in (1, 2))
    for i, pair in enumerate(_rounds(rng, 0.3, 0.01, 3)):  # a comparison of 8 paired rounds, three noisy steps a run
        for arm, (config, r) in enumerate(zip((a, b), pair)):
            store.save_result(dict(r, status="ok", config=config.to_dict(), config_hash=config.config_hash(),
                                   system="m", created_at="2026-12-02"), sweep="ab", arm=arm, round=i)
    logged = RunConfig.for_preset("retinanet", "standard", onednn_verbose="x.log")
    store.save_result({"status": "ok", "config": logged.to_dict(), "config_hash": logged.config_hash(), "system": "m",
                       "created_at": "2026-12-02",
                       "onednn_logs": ["x.log"], "samples_per_s": 1.0, "step_cv": 9.0, "step_ms": {"n": 3}})
    found, = summary.steady_findings(store, "m", "retinanet", "standard")
    assert (found.kind, found.values["steady"], found.values["rounds"], found.values["steps"]) == (
        "steady window", False, 8, [3])
    assert "not steady: more timed steps a run would narrow every interval" in found.sentence
    assert summary.steady_findings(store, "m", "cnn", "standard")[0].kind == "steadiness unknown"


def test_a_run_without_a_climb_never_overwrites_the_ladder_a_climb_stored(tmp_path):
    from cpuopt_helpers.results import ResultStore
    from cpuopt_helpers.session import Session

    session = Session(facts=make_facts(), store=ResultStore(tmp_path / "r.sqlite"))
    base = RunConfig.for_preset("retinanet", "standard", threads=2)
    plans = {"retinanet": case_study.configs(base, session.facts)}
    line, = case_study.settle_fixes(session, plans, {}, {}, "standard", 5, 5, None)  # nothing measured: no fix table
    assert line == "retinanet: it declares none of the fixes; nothing to hand on."  # its ladder starts here
    assert [s["step"] for s in session.store.get_fact("m", "ladder/retinanet/standard")] == ["baseline"]
    climbed = [{"step": "baseline", "stage": "baseline", "config": base.to_dict()},
               {"step": "bf16", "stage": "bf16", "config": base.replace(dtype="bf16").to_dict()}]
    session.store.put_fact("m", "ladder/retinanet/standard", climbed)  # as `make case-study` leaves it
    session.store.put_fact("m", case_study.climbed_fact("retinanet", "standard"), {"day": "2026-12-01"})
    line, = case_study.settle_fixes(session, plans, {}, {}, "standard", 5, 5, None)
    assert line.startswith("retinanet: its ladder is the climb `make case-study` stored on 2026-12-01")
    assert session.store.get_fact("m", "ladder/retinanet/standard") == climbed


def test_make_runs_retinanet_ladder_is_the_papers_recipe_named_and_confirmed_once_by_the_headline(tmp_path):
    from cpuopt_helpers import ladder, pages
    from cpuopt_helpers.results import ResultStore
    from cpuopt_helpers.session import Session

    for fast in (False, True):
        facts = make_facts(bf16={"accelerated": fast, "path": "AMX" if fast else None, "reason": "made up"})
        session = Session(facts=facts, store=ResultStore(tmp_path / f"r{fast}.sqlite"))
        plan = case_study.configs(RunConfig.for_preset("retinanet", "standard", threads=2), facts)
        session.confirm = lambda *a, **k: pytest.fail("the recipe is confirmed once, by notebook 09, not here")
        name = case_study.recipe(plan)
        assert name == (case_study.RECIPE if fast else "all fixes")
        swept = pd.DataFrame([{"name": name, "config_hash": plan.named[name].config_hash(), "runs": 1,
                               "fell_back": False, "loss_drift": 0.5}])  # its loss drifted
        line, = case_study.settle_fixes(session, {"retinanet": plan}, {"retinanet": swept}, {}, "standard", 8, 8,
                                        None, recipe=True)
        assert "is not handed on: its loss drifted 50% from the baseline's" in line
        line, = case_study.settle_fixes(session, {"retinanet": plan}, {"retinanet": swept.assign(loss_drift=0.01)},
                                        {}, "standard", 8, 8, None, recipe=True)
        assert line.startswith("retinanet: the paper's recipe adapted to this CPU (")
        rows = ladder.rungs(session.store, "m", "retinanet", "standard", 2)
        assert [r.step for r in rows] == ["baseline", case_study.RECIPE] and rows[1].vs_previous is None
        assert pages.answer(rows)[1].startswith("not compared with the defaults yet (notebook 09 compares it); the "
                                                "recipe is one block here (`make case-study` confirms its parts")
        top = RunConfig.from_dict(rows[1].config)
        assert dict(top.options) == dict(plan.named["all fixes"].options) and top.dtype == ("bf16" if fast else "fp32")
        assert top.compile is None  # torch.compile: make case-study's climb weighs its compile time
        table = summary.ladder_table(session.store, "m", "retinanet", "standard", None, 1.0, 2)
        assert table["cumulative_speedup"].iloc[0] == 1.0  # the recipe has no gain of its own: its headline says
        assert table["cumulative_speedup"].iloc[1] != table["cumulative_speedup"].iloc[1]  # NaN, not a kept 1.0
        assert summary.ladder_view(table)[summary.TO_DEFAULTS].iloc[1] == (
            "tried as one block: the headline below is its verdict")


def test_notebook_09_checks_retinanets_targets_on_its_headline_at_its_class_count():
    def table(options):
        return pd.DataFrame([{"config": RunConfig.for_preset("retinanet", "standard", options=options).to_dict()}])

    c = {"ratio": 2.6, "ci_low": 2.4, "ci_high": 2.8, "n": 10, "verdict": "faster", "label": "95% CI"}
    avx512 = {"accelerated": True, "path": "avx512_bf16"}
    found = summary.target_findings({"retinanet": table({})}, {"retinanet": c}, "standard", avx512)
    assert [(f.stage, f.values["path"], f.values["status"]) for f in found] == [
        ("summary", "amx", "other path"), ("summary", "avx512_bf16", "met")]  # its own notes, not notebook 08's
    assert found[1].sentence.startswith("Target for AVX512-BF16 CPUs at the standard preset (80 classes)")
    assert "At every ceiling" not in found[1].sentence  # no projection in notebook 09
    amx = summary.target_findings({"retinanet": table({})}, {"retinanet": c}, "standard", {"accelerated": True,
                                                                                           "path": "amx"})
    assert amx[0].values["status"] == "not met"  # 2.6x, and the lower end 2.4: short of 3.0x and 2.7
    for tables, finals, preset in (({"retinanet": table({"classes": 601})}, {"retinanet": c}, "standard"),
                                   ({"retinanet": table({})}, {}, "standard"),  # nothing handed on: no headline
                                   ({"retinanet": table({})}, {"retinanet": c}, "quick"),
                                   ({"cnn": table({})}, {"cnn": c}, "standard")):
        assert summary.target_findings(tables, finals, preset, avx512) == []


def test_notebook_06_counts_every_setting_it_screened_only():
    """bf16 in each layout and fp32 in the other layout: three settings screened, one record for all three; a
    bf16 setting with a verdict is its own finding."""
    from cpuopt_helpers.stages import precision

    facts = make_facts(bf16={"accelerated": True, "path": "avx512_bf16", "reason": "AVX512-BF16"})
    plan = precision.configs(RunConfig.for_preset("cnn", "quick", threads=2), facts, channels_last=True)
    speeds = dict(zip((c.config_hash() for c in plan.configs), (10.0, 16.0, 9.0, 17.0)))
    one = [result(c, 0, speeds[c.config_hash()], arm=i) for i, c in enumerate(plan.configs)]
    only, = precision.findings(precision.table(one, plan), plan)
    assert only.kind == "screened only" and len(only.values["settings"]) == 3
    assert only.sentence.startswith("cnn: 3 settings screened only (1 round")
    many = [result(c, i, speeds[c.config_hash()] * (1 + 0.01 * (i % 2)), arm=a)
            for i in range(6) for a, c in enumerate(plan.configs)]
    found = precision.findings(precision.table(many, plan), plan)
    assert [f.kind for f in found] == ["bf16 over fp32", "bf16 over fp32"]  # fp32 in the other layout: no bf16 finding


def test_ipexs_lamb_is_set_beside_this_torchs_loop_and_fastest_kernel():
    def kernel(ms, loop_ms):
        return {"median_ms": ms, "speedup_vs_loop": loop_ms / ms, "ci": [loop_ms / ms * 0.9, loop_ms / ms * 1.1],
                "rounds": 10, "verdict": "faster"}

    here = {"preset": "standard", "elements": 1000, "torch": "2.13.0+cpu",
            "kernels": {"loop": {"median_ms": 90.8}, "foreach": kernel(70.0, 90.8), "fused": kernel(62.9, 90.8)}}
    ipex = {"preset": "standard", "elements": 1000, "torch": "2.8.0",
            "kernels": {"loop": {"median_ms": 314.1}, "ipex fused": kernel(95.8, 314.1)}}
    found = case_study.lamb_findings([here, ipex])
    assert [f.values["kernel"] for f in found] == ["foreach", "fused", "ipex fused"]
    assert "here" not in found[1].values and found[1].sentence.endswith("faster.")
    assert found[2].sentence.startswith("Lamb on RetinaNet[standard]'s 1,000 trainable parameters, torch 2.8.0: ipex "
                                        "fused 95.8 ms vs the loop's 314.1 ms (medians); paired round by round: 3.28x")
    assert found[2].sentence.endswith("; each runtime's ratio is over its own loop: beside it, torch 2.13.0+cpu's "
                                      "loop takes 90.8 ms and its fastest, fused, 62.9 ms.")
    assert "disagree" not in found[2].sentence  # the medians' ratio lies inside the interval


def test_a_kernel_whose_medians_tell_another_story_than_its_paired_rounds_says_so():
    """Medians 117.8 vs 121.0 ms (1.03x) beside a paired 2.05x (1.14-3.69): the rounds disagree."""
    odd = {"median_ms": 117.8, "speedup_vs_loop": 2.05, "ci": [1.14, 3.69], "rounds": 5, "verdict": "faster"}
    ipex = {"preset": "standard", "elements": 1000, "torch": "2.8.0",
            "kernels": {"loop": {"median_ms": 121.0}, "ipex fused": odd}}
    [found] = case_study.lamb_findings([ipex])
    assert "faster; but the medians' ratio, 1.03x, lies outside that interval: the rounds disagree" in found.sentence


@pytest.mark.parametrize("share, said", [(1.65, True), (0.62, False)])
def test_a_headline_above_the_measured_ceiling_says_why_that_can_be(share, said):
    values = {"workload": "cnn", "largest_step": None, "usd_per_1000": None, "peak_share": share,
              "ceiling": "bf16 GEMM", "theoretical_share": 0.5, "price_per_hour": 1.0}
    headline = Finding("cnn", "summary", "ladder headline", values, as_comparison(
        {"ratio": 1.9, "ci_low": 1.8, "ci_high": 2.0, "n": 5, "verdict": "faster", "label": "95% CI"}))
    assert f"; {share:.0%} of the measured bf16 GEMM ceiling, 50% of the theoretical bf16 peak" in headline.sentence
    assert ("(above the measured ceiling: its kernels beat a plain GEMM at the sizes measured, or the ceiling was "
            "measured while something else ran" in headline.sentence) == said


def test_notebook_08_says_how_much_of_the_recipe_is_bf16s():
    """The recipe is the fixes in bf16: the recipe over all the fixes in fp32 is bf16's part, paired by round."""
    fast = make_facts(bf16={"accelerated": True, "path": "AMX", "reason": "made up"})
    plan = case_study.configs(RunConfig.for_preset("retinanet", "quick", optimizer="lamb", threads=2), fast)
    speeds = {"baseline": 1.0, "all fixes": 1.04, case_study.RECIPE: 2.05}
    results = [dict(result(plan.named[n], 0, s, arm=i), step_ms={"median": 1000 / s}) for i, (n, s) in
               enumerate(speeds.items())]
    table = case_study.table(results, plan)
    said = next(f for f in case_study.findings(table, plan, results) if f.kind == "bf16 in the recipe")
    assert said.comparison.ratio == pytest.approx(2.05 / 1.04)
    assert said.sentence.startswith("retinanet: bf16 on top of the fixes (the paper's recipe over all the fixes in "
                                    "fp32): 1.97x (screened only, 1 round); set beside the fixes' own ratio above")
    slow = make_facts(bf16={"accelerated": False, "path": None, "reason": "made up"})  # no recipe in bf16 there
    plain = case_study.configs(RunConfig.for_preset("retinanet", "quick", optimizer="lamb", threads=2), slow)
    assert not any(f.kind == "bf16 in the recipe" for f in case_study.findings(table, plain, results))


def test_notebook_08_says_each_frozen_layers_arm_once():
    """A frozen-layers arm is worded against the workload's default once (``frozen_time_findings``),
    not again as one more fix over the baseline."""
    fixes = case_study.configs(RunConfig.for_preset("retinanet", "quick", optimizer="lamb", threads=2), make_facts())
    plan = case_study.measured({"retinanet": fixes}, discrepancy=False)["retinanet"]  # as notebook 08 sweeps it
    frozen = case_study.frozen_layer_configs(plan.base)
    assert set(frozen) <= set(plan.named) and len(frozen) == 3
    names = ["baseline", "all fixes", *frozen]
    results = [dict(result(plan.named[n], 0, 1.0 + i / 10, arm=i), step_ms={"median": 100.0}) for i, n in
               enumerate(names)]
    found = case_study.findings(case_study.table(results, plan), plan, results)
    over_first = [f.values["name"] for f in found if f.kind == "arm over first"]
    assert over_first == ["all fixes"]
    assert [f.kind for f in found if f.kind not in ("arm over first", "bf16 in the recipe")] == [
        "frozen backward skipped", "trainable layers", "trainable layers"]  # each frozen-layers arm, once


def test_a_screened_setting_without_a_ratio_is_counted_not_listed():
    rows = [{"setting": "a", "comparison": {"ratio": None, "n": 1, "verdict": "too few rounds"}},
            {"setting": "b", "comparison": {"ratio": 1.05, "n": 1, "verdict": "too few rounds"}}]
    only, = choosing.screened_only("cnn", "threads", rows)
    assert only.sentence == ("cnn: 2 settings screened only (1 round, fewer than the 5 a verdict needs), each against "
                             "the baseline: b 1.05x: the table ranks them, a confirmation decides.")
    none, = choosing.screened_only("cnn", "threads", rows[:1])
    assert none.sentence.endswith("a verdict needs): the table ranks them, a confirmation decides.")


def test_notebook_08s_answer_puts_the_fixes_first_the_profiles_why_next_and_their_details_last():
    def said(who, kind):
        return Finding(who, "case_study", kind, {})

    fixes, kernels = [said("retinanet", "arm over first")], [said("retinanet", "focal kernel")]
    profile = [said("before", "profile coverage"), said("before", "projection kernels"), said("before", "log reorders"),
               said("before", "trace spans"), said("before", "profile comparison"),
               said("before", "logs distinct primitives"), said("before", "logs onednn time")]
    sections = case_study.answer_sections(fixes, kernels, profile)
    assert [h for h, _ in sections] == ["The fixes, each alone and all together:",
                                        "The kernels alone, at RetinaNet's shapes:",
                                        "Why, from ProfileDNN (the logs and traces of the profiled runs):",
                                        "ProfileDNN's details (notebook 02 explains each):"]
    assert [f.kind for f in sections[2][1]] == ["profile comparison", "logs onednn time", "profile coverage",
                                                "log reorders"]  # the before-and-after pair first
    assert [f.kind for f in sections[3][1]] == ["projection kernels", "trace spans", "logs distinct primitives"]
    assert sum(len(found) for _, found in sections) == len(fixes + kernels + profile)  # every finding told once
    assert [h for h, _ in case_study.answer_sections(fixes, [], [])] == ["The fixes, each alone and all together:"]


def test_a_table_shown_in_words_says_what_a_missing_cell_means_and_keeps_the_numbers():
    table = pd.DataFrame({"name": ["eager", "compiled"], "compile_s": [None, 31.23456], "ratio": [1.0, float("nan")]})
    shown = choosing.in_words(table, {"compile_s": "not compiled", "absent": "never used"})
    assert list(shown["compile_s"]) == ["not compiled", 31.235]  # rounded, the gap in words
    assert shown["ratio"].isna().tolist() == [False, True]  # a column not named keeps its NaN
    assert table["compile_s"].dtype == float and pd.isna(table["compile_s"].iloc[0])  # the table is untouched
