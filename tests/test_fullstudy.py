"""RetinaNet at the full preset (cpuopt_helpers.fullstudy): which top it compares, and the page it
writes, from a made-up study whose profiles are the hand-made trace of test_wholestep. Starts no
worker: `make case-study PRESET=full` is the real run (its page is committed under docs/results)."""

import json
import subprocess
from types import SimpleNamespace

import pandas as pd
import pytest

from cpuopt_helpers import fullstudy, plots
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.decisions import RECIPE
from cpuopt_helpers.profiledn import account, wholestep
from cpuopt_helpers.results import ResultStore
from tests.test_wholestep import CEIL, TRACE


def session(tmp_path, facts, ladder=None):
    store = ResultStore(tmp_path / "results.sqlite")
    if ladder is not None:
        store.put_fact("m", "ladder/retinanet/standard", ladder)
    return SimpleNamespace(store=store, machine="m", facts=facts)


def test_the_top_is_the_standard_ladders_moved_to_the_full_preset(tmp_path, facts):
    stored = RunConfig.for_preset("retinanet", "standard", optimizer="lamb", optimizer_impl="fused", compile="default",
                                  options={"focal": "fast", "frozen_bn": "folded"})
    ladder = [{"step": "baseline", "config": RunConfig.for_preset("retinanet", "standard").to_dict()},
              {"step": "case-study fixes", "config": stored.to_dict()},
              {"step": "case-study fixes: IPEX", "config": stored.to_dict()}]  # kept: the rung below set the top
    base, top, source = fullstudy.arms(session(tmp_path, facts(), ladder), classes=264)
    assert (base.preset, top.preset) == ("full", "full")
    assert dict(base.options) == {"classes": "264"} and base.compile is None and base.optimizer == "lamb"
    assert dict(top.options) == {"focal": "fast", "frozen_bn": "folded", "classes": "264"}  # as --option gives them
    assert (top.compile, top.optimizer_impl, top.steps, top.timeout_s) == ("default", "fused", fullstudy.STEPS,
                                                                         fullstudy.TIMEOUT_S)
    assert "standard-preset ladder (case-study fixes; its rungs: case-study fixes: compile=default " in source
    assert source.endswith("; case-study fixes: IPEX: kept the rung below)") and "no case-study" not in source


def test_a_top_from_a_ladder_without_the_fixes_says_so(tmp_path, facts):
    base = RunConfig.for_preset("retinanet", "standard")
    ladder = [{"step": "baseline", "config": base.to_dict()},
              {"step": "allocator", "config": base.replace(allocator="jemalloc").to_dict()},
              {"step": "bf16", "config": base.replace(allocator="jemalloc", dtype="bf16").to_dict()}]
    _, _, source = fullstudy.arms(session(tmp_path, facts(), ladder), classes=80, preset="standard")
    assert source.endswith("(bf16; its rungs: allocator: allocator=jemalloc; bf16: dtype=bf16; no case-study fixes "
                           "rung (`make case-study` climbs them))")


@pytest.mark.parametrize("fast", [True, False])
def test_without_a_ladder_the_top_is_the_papers_recipe_in_bf16_only_where_fast(tmp_path, facts, fast):
    gate = {"accelerated": fast, "path": "amx" if fast else None, "reason": "AMX" if fast else "no bf16 in the ISA"}
    base, top, source = fullstudy.arms(session(tmp_path, facts(bf16=gate)))
    assert top.dtype == ("bf16" if fast else "fp32")
    assert dict(top.options)["focal"] == "fast" and top.optimizer_impl == "fused"
    assert dict(top.options)["classes"] == dict(base.options)["classes"] == "264"  # the same model on both sides
    assert RECIPE in source and "no standard-preset ladder" in source


def made_up_study(facts, bf16_fast: bool) -> dict:
    result = wholestep.whole_step(TRACE, CEIL)
    table = account.phase_table(result, CEIL, {"fp32": 400.0})
    prof = {"whole": result, "phases": table, "account": account.forward_backward(table),
            "next": account.next_fix(result)}
    base = RunConfig.for_preset("retinanet", "full", optimizer="lamb", options={"classes": 264})
    top = base.replace(optimizer_impl="fused", options={"classes": 264, "focal": "fast"})
    figures = {name: {"samples_per_s": s, "runs": 5, "step_s": 2 / s, "achieved_gflops": 80.0 * k, "forward_s": 1.0,
                      "backward_s": 2.0, "optimizer_s": 0.1, "per_core": s / 2}
               for name, s, k in (("defaults", 0.070, 1.0), ("top", 0.092, 1.3))}
    comparison = {"ratio": 1.3, "ci_low": 1.21, "ci_high": 1.39, "n": 5, "verdict": "faster", "label": "95% CI"}
    return {"base": base, "top": top, "source": "the paper's recipe", "comparison": comparison, "figures": figures,
            "profiles": {"defaults": prof, "top": prof}, "ceilings": CEIL, "theoretical": {"fp32": 400.0},
            "cores": 2, "seconds": 2400.0, "classes": 264, "preset": "full",
            "bf16": {"accelerated": bf16_fast, "path": "amx" if bf16_fast else None,
                     "reason": "no bf16 in the ISA" if not bf16_fast else "AMX"}}


def test_the_page_holds_the_verdict_rates_phases_and_ends_with_the_next_fix(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=False)
    page = fullstudy.write_page(study, tmp_path, facts(cpu_model="AMD EPYC", isa={"avx2": True}))
    text = page.read_text()
    assert page.name.endswith("-retinanet-full.md")
    assert "Regenerate with `make case-study PRESET=full`" in text and "(preset `full`)" in text
    assert "| the top over PyTorch's defaults, images/s | 1.30x | 95% CI 1.21-1.39 | 5 paired rounds |" in text
    assert "| top: images/s per physical core | 0.046 |" in text  # 0.092 / 2 cores
    assert "(104% of the measured fp32 GEMM ceiling, 26% of the theoretical fp32 peak)" in text  # 104 GFLOP/s: 100, 400
    assert "| the study's wall time | 40 min 0 s |" in text
    assert "| forward | defaults |" in text and "| optimizer | top |" in text  # each arm's phases
    traced = study["profiles"]["top"]["whole"]["step_ms"] / 1e3  # its caption: each arm traced beside timed
    assert f"(defaults {traced:.2f} s traced, 28.57 s timed; top {traced:.2f} s traced, 21.74 s timed: " in text
    assert "23% of MLPerf Training v3.0 Intel's 0.20" in text  # 0.046 / 0.20
    assert "In fp32: this CPU has no bf16 fast path (no bf16 in the ISA)" in text
    notes = text.split("\n\n")
    assert "the next fix the profile points at" in notes[-2]  # the last note before the page's footer
    assert "During the comparison's runs" not in text  # a study that kept no machine state says nothing of it
    shown = f"![each arm's step by phase, traced and at every ceiling]({page.stem}/phases.png)"
    assert notes[3] == shown and (page.parent / page.stem / "phases.png").stat().st_size > 10_000  # below the table
    study["comparison"]["machine_sentence"] = "The machine was quiet: none of the 10 runs measured on a loaded machine."
    said = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert "\n\nDuring the comparison's runs: The machine was quiet: none of the 10 runs" in said


def test_the_figure_draws_each_arms_traced_phases_and_its_step_at_every_ceiling(facts):
    study = made_up_study(facts, bf16_fast=False)
    prof = study["profiles"]["top"]
    fig = plots.study_phases_figure({"defaults": prof, "top": prof}, "t")
    ax = fig.axes[0]
    widths = {}  # bar (its y) -> its phases' seconds, left to right
    for patch in ax.patches:
        widths.setdefault(round(patch.get_y() + patch.get_height() / 2), []).append(patch.get_width())
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["defaults, traced", "top, traced", "defaults, at every ceiling", "top, at every ceiling"]
    whole = prof["whole"]
    assert sum(widths[1]) == pytest.approx(prof["phases"]["ms"].sum() / 1e3)  # the phases: operators and waits
    assert sum(widths[1]) == pytest.approx(whole["step_ms"] / 1e3)  # the whole traced step, nothing lost
    assert sum(widths[3]) == pytest.approx(whole["projected_ms"] / 1e3)  # the projection, phase by phase
    assert len(widths[3]) == 4 and sum(widths[3]) < sum(widths[1])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["forward", "loss", "backward", "optimizer"]
    plots.plt.close(fig)


def test_a_study_without_a_trace_draws_no_figure(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=False)
    study["profiles"] = {name: {"error": "a traced run did not finish"} for name in study["profiles"]}
    page = fullstudy.write_page(study, tmp_path, facts())
    assert "![" not in page.read_text() and not (page.parent / page.stem).exists()


def test_the_page_bounds_the_ratio_by_the_fastests_step_at_every_ceiling(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=False)
    bound = study["profiles"]["top"]["whole"]["speedup_bound"]
    row = (f"| the most top could reach over PyTorch's defaults: its step with every operator at its ceiling (a bound) "
           f"| {0.092 / 0.070 * bound:.2f}x |  | its projection; the ratio of both arms' median steps, not paired |")
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert bound > 1 and row in text
    assert "traced steps are other runs than the timed medians above, and the profiler costs time" in text
    kept = study["figures"]["top"] | {"step_s": 10.0}  # the allocator trial's winner: its own step
    study["profiles"]["top under jemalloc"] = study["profiles"]["top"]
    study |= {"fastest": "top under jemalloc",
              "allocator": {"config": study["top"].replace(allocator="jemalloc"), "figures": {"top": {}, "kept": kept},
                            "comparison": {"ratio": 2.0, "ci_low": 1.9, "ci_high": 2.1, "n": 5, "verdict": "faster"}}}
    row = f"its step with every operator at its ceiling (a bound) | {2 / 0.07 / 10 * bound:.2f}x"
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert f"| the most top under jemalloc could reach over PyTorch's defaults: {row}" in text
    study["fastest"] = "top"
    study["profiles"]["top"] = {"error": "a traced run did not finish"}  # no projection: no bound
    assert "(a bound)" not in fullstudy.write_page(study, tmp_path, facts()).read_text()


def test_only_a_study_at_mlperfs_size_is_set_beside_mlperfs_rate(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=True) | {"preset": "standard", "classes": 80}
    said = " ".join(f.sentence for f in fullstudy.study_findings(study))
    assert "0.046 images/s per physical core (MLPerf's rate is at the full preset's size: not comparable)" in said
    assert "% of MLPerf" not in said
    # the stored ladder's top at RetinaNet's own class count: what notebook 09 compares, measured again
    same = study | {"base": study["base"].replace(options={}), "top": study["top"].replace(options={"focal": "fast"}),
                    "source": fullstudy.LADDER_SOURCE + " (case-study fixes)"}
    note = "what notebook 09 compares for the README's generated block"
    assert note in fullstudy.write_page(same, tmp_path, facts()).read_text()
    for other in (study, same | {"source": "the paper's recipe"}, same | {"preset": "full"}):  # another comparison
        assert note not in fullstudy.write_page(other, tmp_path, facts()).read_text()


def test_a_trials_short_times_keep_a_decimal():
    assert [fullstudy._ms_cell(ms) for ms in (1232.4, 100.0, 12.34, 6.04)] == ["1232", "100", "12.3", "6.0"]


def test_the_pages_command_names_what_differs_from_the_studys_defaults():
    assert fullstudy.page_command("full", 264, 5) == "make case-study PRESET=full"
    assert fullstudy.page_command("full", 264, 8) == "make case-study PRESET=full ROUNDS=8"
    assert fullstudy.page_command("standard", 80, 10) == ("python -m cpuopt_helpers.fullstudy --page docs/results "
                                                          "--preset standard --classes 80 --rounds 10")
    assert fullstudy.page_command("full", 601, 5).endswith("--preset full --classes 601")


def test_a_top_whose_steps_wait_on_the_kernel_is_pointed_at_an_allocator_that_keeps_memory(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=False)
    study["figures"]["defaults"] |= {"system_share": 0.05, "page_faults_per_step": 1000.0}
    study["figures"]["top"] |= {"system_share": 0.40, "page_faults_per_step": 1234567.0}
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert "| top: the OS kernel's share of CPU time (system time; page faults a step) | 40% (1,234,567) |" in text
    assert "| defaults: the OS kernel's share of CPU time (system time; page faults a step) | 5% (1,000) |" in text
    notes = text.split("\n\n")
    kernel = next(i for i, n in enumerate(notes) if "the OS kernel took 40% of the timed steps' CPU time "
                  "(system time), 1,234,567 page faults a step" in n)
    assert "`--allocator tcmalloc`" in notes[kernel] and "the next fix the profile points at" in notes[-2]
    assert "at every ceiling" in notes[kernel + 1]  # said before the projection: it slows every operator
    study["figures"]["top"]["system_share"] = fullstudy.TRY_KERNEL_SHARE / 2  # below the threshold: not said
    assert "the OS kernel took" not in fullstudy.write_page(study, tmp_path, facts()).read_text()


@pytest.mark.parametrize("share, allocator, installed, tried", [
    (0.40, "default", ("jemalloc", "tcmalloc"), "jemalloc"),
    (0.40, "default", ("tcmalloc",), "tcmalloc"),  # the first of KEEPS_MEMORY found here
    (0.10, "default", ("jemalloc", "tcmalloc"), "jemalloc"),  # below a notebook's KERNEL_SHARE: the study tries it
    (0.40, "default", (), None),  # none installed: the page points at `make setup` instead
    (0.40, "tcmalloc", ("jemalloc", "tcmalloc"), None),  # a ladder's allocator: kept as chosen
    (fullstudy.TRY_KERNEL_SHARE / 2, "default", ("jemalloc", "tcmalloc"), None),  # the kernel is no issue
    (None, "default", ("jemalloc", "tcmalloc"), None)])  # a worker that did not read its CPU time
def test_the_allocator_is_tried_only_where_the_kernel_takes_its_share_under_glibc(facts, share, allocator, installed,
                                                                                  tried):
    made = facts(allocators={k: f"/lib/lib{k}.so" if k in installed else None for k in ("jemalloc", "tcmalloc")})
    top = RunConfig.for_preset("retinanet", "full", allocator=allocator)
    arm = fullstudy.allocator_arm(top, share, made)
    assert (arm.allocator if arm else None) == tried
    if arm:
        assert arm.replace(allocator=allocator).config_hash() == top.config_hash()  # the top, its allocator changed


def test_the_allocator_trial_compares_the_top_with_itself_under_the_allocator(tmp_path, facts):
    sess = session(tmp_path, facts())
    top = RunConfig.for_preset("retinanet", "quick", optimizer="lamb", optimizer_impl="fused")
    compared = []

    def confirm(a, b, tag, *rest):
        compared.append((a, b, tag))
        for i in range(5):
            for arm, (config, speed, share) in enumerate(((a, 1.0, 0.4), (b, 1.5, 0.01))):
                sess.store.save_result({"status": "ok", "config": config.to_dict(), "config_hash": config.config_hash(),
                                        "samples_per_s": speed, "created_at": "2026-12-02T00:00:00",
                                        "step_ms": {"median": 1e3 / speed}, "achieved_gflops": 10.0,
                                        "phase_ms": {"forward": 1.0, "backward": 2.0, "optimizer": 0.5},
                                        "system_share": share, "page_faults_per_step": 1e6 * share},
                                       sweep="s", arm=arm, round=i)
        return {"sweep": "s", "rounds": [[1.0, 1.5]] * 5, "n": 5, "ratio": 1.5, "verdict": "faster"}

    sess.confirm = confirm
    said = []
    assert fullstudy.try_allocator(sess, top, {"system_share": 0.02}, 5, "t", False, said.append) is None
    kept = fullstudy.try_allocator(sess, top, {"system_share": 0.4}, 5, "t", False, said.append)
    assert compared == [(top, top.replace(allocator="jemalloc"), "t")] and kept["config"].allocator == "jemalloc"
    assert kept["figures"]["kept"]["system_share"] == 0.01 and kept["figures"]["top"]["samples_per_s"] == 1.0
    assert said == ["the OS kernel took 40% of the top's CPU time: the top under jemalloc, which keeps freed memory, "
                    "against the top in 5 paired rounds"]


def test_an_allocator_trial_past_the_budget_is_not_started_and_its_line_given(tmp_path, facts):
    sess = session(tmp_path, facts())
    sess.confirm = lambda *a: pytest.fail("a trial past the budget ran")
    top = RunConfig.for_preset("retinanet", "full", optimizer="lamb", optimizer_impl="fused", steps=2, warmup=1,
                               options={"classes": "264"})
    said = []
    kept = fullstudy.try_allocator(sess, top, {"system_share": 0.4}, 5, "t", False, said.append, need_s=1500.0,
                                   left_s=600.0)
    assert kept["skipped"]["need_min"] == 25.0 and kept["skipped"]["left_min"] == 10.0
    assert kept["skipped"]["command"] == (
        "cpuopt compare --workload retinanet --preset full --a '--steps 2 --warmup 1 --optimizer lamb --optimizer-impl "
        "fused --option classes=264' --b '--steps 2 --warmup 1 --allocator jemalloc --optimizer lamb --optimizer-impl "
        "fused --option classes=264' --min-rounds 5 --max-rounds 5")
    assert said == ["not trying the top under jemalloc: it needs about 25 min, 10 min of the study's budget are left"]
    study = made_up_study(facts, bf16_fast=False)
    study["figures"]["top"] |= {"system_share": 0.40, "page_faults_per_step": 2584936.0}
    study["allocator"] = kept
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert "| top under jemalloc over the top, images/s | not tried |  | past the study's budget (25 min needed, 10 " \
           "left) |" in text
    assert "may pay" in text  # the kernel's finding still points at the allocator
    assert f"was not tried: its paired rounds and profile need about 25 min, and 10 min of the study's budget were " \
           f"left (`make case-study PRESET=full BUDGET_MIN=N`). That comparison alone: `{kept['skipped']['command']}`." \
           in text


def test_the_trial_is_planned_from_the_comparisons_own_time():
    figures = {"defaults": {"step_s": 30.0}, "top": {"step_s": 20.0}}
    assert fullstudy.trial_seconds(1000.0, figures) == 800.0  # 10 runs took 1000 s: 10 of the top's take 2 x 400
    assert fullstudy.trial_seconds(1000.0, {"defaults": {}, "top": {}}) == 1000.0  # no steps: as long as it
    assert fullstudy.trial_seconds(1000.0, figures, 300.0) == 1000.0  # and the profile: the defaults' 300 s x 20 / 30
    assert fullstudy.trial_seconds(1000.0, {"defaults": {}, "top": {}}, 300.0) == 1300.0


@pytest.mark.parametrize("verdict, ratio", [("faster", 1.53), ("no different", 1.01)])
def test_the_page_gives_the_allocator_trial_after_the_kernels_share(tmp_path, facts, verdict, ratio):
    study = made_up_study(facts, bf16_fast=False)
    study["figures"]["top"] |= {"system_share": 0.40, "page_faults_per_step": 2584936.0}
    kept = study["figures"]["top"] | {"system_share": 0.004, "page_faults_per_step": 8.0, "per_core": 0.07}
    study["allocator"] = {"config": study["top"].replace(allocator="jemalloc"),
                          "figures": {"top": study["figures"]["top"] | {"system_share": 0.42}, "kept": kept},
                          "comparison": {"ratio": ratio, "ci_low": ratio - 0.09, "ci_high": ratio + 0.09, "n": 5,
                                         "verdict": verdict, "label": "95% CI"}}
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert f"| top under jemalloc over the top, images/s | {ratio:.2f}x | 95% CI {ratio - 0.09:.2f}-" in text
    assert f"| top under jemalloc: verdict | {verdict} |  | 5 paired rounds |" in text
    assert ("| top under jemalloc: the OS kernel's share of CPU time (system time; page faults a step) | 0% (8) |"
            in text)
    assert "| top under jemalloc: step (forward with its loss / backward / optimizer) | 21.7 s (1.0 / 2.0 / 0.10 s) |" \
        in text  # the trial's runs: its forward against its backward
    notes = text.split("\n\n")
    kernel = next(i for i, n in enumerate(notes) if "the study tried the top under jemalloc" in n)
    assert "may pay" not in notes[kernel]
    trial = notes[kernel + 1]
    assert trial.startswith("retinanet (top): an allocator that keeps freed memory, tried: the top under jemalloc")
    assert "from 42% to 0%, its page faults from 2,584,936 a step to 8" in trial  # the trial's own rounds
    assert ("With it the top trains 0.070 images/s per physical core, 35% of MLPerf's 0.20" in trial) == \
        (verdict == "faster")  # a rate with the allocator is claimed only where it is confirmed faster
    assert "the next fix the profile points at" in notes[-2]
    if verdict == "faster":  # the per-core target reads the fastest confirmed, and names it
        profiles = study["profiles"] | {"top under jemalloc": study["profiles"]["top"]}
        text = fullstudy.write_page(study | {"fastest": "top under jemalloc", "profiles": profiles}, tmp_path,
                                    facts()).read_text()
        assert "; the top under jemalloc trains 0.070." in text and "; the top trains" not in text


def test_a_cpu_with_a_bf16_fast_path_is_not_told_it_has_none(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=True)
    said = " ".join(f.sentence for f in fullstudy.study_findings(study))
    assert "no bf16 fast path" not in said
    assert said.count("the forward with its loss takes") == 2  # both arms accounted for


@pytest.mark.parametrize("argv", [["--rounds", "2"], ["--classes", "0"], ["--budget-min", "0"]])
def test_bad_arguments_are_one_line_and_exit_2(argv, capsys):
    assert fullstudy.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cpuopt: ") and "\n" not in err


@pytest.mark.slow
def test_the_study_profiles_real_workers_at_the_quick_preset(tmp_path, this_facts):
    """The same study as `make case-study PRESET=full`, at the quick preset: both arms traced twice by
    real workers, their phase accounts, the page written. The comparison's rounds are made up here
    (session.confirm with real workers is tested with the comparison rule, tests/test_scripts.py and
    the notebooks): this test keeps `make test` short. Only the results' shape is asserted."""
    from cpuopt_helpers.session import Session

    said, store = [], ResultStore(tmp_path / "r.sqlite")
    # made-up ceilings (notebook 00 measures them): this test checks the study's shape, not its numbers
    store.put_fact(this_facts.fingerprint, "roofline/quick", {"gemm_gflops_best": 100.0, "copy_gbs_best": 10.0,
                                                             "threads": this_facts.physical_cores})
    sess = Session(facts=this_facts, store=store)

    def confirm(base, top, tag, *_):  # the top's kernel share made up high: the allocator trial follows
        for i in range(5):
            for arm, config in enumerate((base, top)):
                store.save_result({"status": "ok", "config": config.to_dict(), "config_hash": config.config_hash(),
                                   "samples_per_s": 1.0 + arm, "step_ms": {"median": 1e3}, "achieved_gflops": 1.0,
                                   "created_at": "2026-12-02T00:00:00", "phase_ms": {
                                       "forward": 1.0, "backward": 2.0, "optimizer": 0.5},
                                   "system_share": 0.5 if config.allocator == "default" else 0.01,
                                   "page_faults_per_step": 1e5,
                                   "machine_state": {"loaded": False, "steal_pct": 0.0, "round_trip_ns": None}},
                                  sweep=tag, arm=arm, round=i)
        return {"sweep": tag, "rounds": [[1.0, 2.0]] * 5, "n": 5, "ratio": 2.0, "ci_low": 1.9, "ci_high": 2.1,
                "verdict": "faster", "label": "95% CI"}

    sess.confirm = confirm
    study = fullstudy.run_study(sess, rounds=5, folder=tmp_path / "results", say=said.append, preset="quick")
    kept = next((k for k in fullstudy.KEEPS_MEMORY if this_facts.allocators.get(k)), None)  # `make test` installs both
    assert study["fastest"] == (f"top under {kept}" if kept else "top")  # confirmed faster: profiled, and read
    for name in study["profiles"]:
        prof = study["profiles"][name]
        assert "error" not in prof, prof.get("error")
        assert prof["whole"]["timing"] == "light trace"  # times from the run without shapes
        assert prof["phases"]["ms"].sum() == pytest.approx(prof["whole"]["step_ms"])
        assert prof["account"]["work_ratio"] > 0 and prof["account"]["loss_share"] > 0
    assert dict(study["top"].options)["focal"] == "fast"  # no ladder in this store: the paper's recipe
    assert said[-1].startswith("the page: ") and "the next fix the profile points at" in " ".join(said[-3:])
    page = next((tmp_path / "results").glob("*-retinanet-quick.md")).read_text()
    assert "python -m cpuopt_helpers.fullstudy --page docs/results --preset quick" in page
    assert "| forward | defaults |" in page
    assert "\n\nDuring the comparison's runs: The machine was quiet: none of the 10 runs" in page  # its runs' state
    assert set(study["profiles"]) == {"defaults", study["fastest"]}  # the top is traced only where it stays fastest
    assert ("| forward | top |" in page) == (not kept)
    if kept:  # the trial's arm ran with the allocator preloaded, traced in the top's place
        assert f"| top under {kept} over the top, images/s | 2.00x |" in page
        assert f"| forward | top under {kept} |" in page
        assert f"retinanet (top under {kept}): the next fix the profile points at" in page


def test_each_arm_is_set_against_its_own_dtypes_peaks(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=True)
    study["top"] = study["top"].replace(dtype="bf16")
    study["ceilings"] = wholestep.Ceilings({"fp32": 100.0, "bf16": 400.0}, 10.0, 2, "t")
    study["theoretical"] = {"fp32": 400.0, "bf16": 1600.0}
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert "| defaults: GFLOP/s achieved | 80 (80% of the measured fp32 GEMM ceiling, 20% of the theoretical fp32 " \
           "peak) |" in text
    assert "| top: GFLOP/s achieved | 104 (26% of the measured bf16 GEMM ceiling, 6% of the theoretical bf16 " \
           "peak) |" in text


def test_a_profile_that_failed_is_said_and_the_comparison_kept(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=False)
    study["profiles"]["top"] = {"error": "a traced run of retinanet did not finish: timeout"}
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert "| the top over PyTorch's defaults, images/s | 1.30x |" in text
    assert "retinanet (top): not profiled (a traced run of retinanet did not finish: timeout)." in text
    assert "projection" not in text and "the next fix" not in text  # nothing made up in its place
    assert "| forward | defaults |" in text and "| forward | top |" not in text


def test_a_rerun_of_the_same_comparison_reads_only_its_own_rounds(tmp_path, facts):
    made = facts()
    sess = session(tmp_path, made)
    base = RunConfig.for_preset("retinanet", "quick", optimizer="lamb")
    top = base.replace(optimizer_impl="fused")

    def run(config, speed):
        return {"status": "ok", "config": config.to_dict(), "config_hash": config.config_hash(), "samples_per_s": speed,
                "created_at": "2026-12-02T00:00:00",
                "step_ms": {"median": 1e3 / speed}, "achieved_gflops": 10.0,
                "phase_ms": {"forward": 1.0, "backward": 2.0, "optimizer": 0.5}}

    for i, speed in enumerate([1.0] * 5 + [2.0] * 5):  # an earlier invocation's 5 rounds, then this one's
        sess.store.save_result(run(base, speed), sweep="s", arm=0, round=i % 5)
        sess.store.save_result(run(top, speed * 1.5), sweep="s", arm=1, round=i % 5)
    sess.confirm = lambda *a: {"sweep": "s", "rounds": [[2.0, 3.0]] * 5, "n": 5}
    _, figures = fullstudy.compare_arms(sess, {"defaults": base, "top": top}, 5, "t", False)
    assert figures["defaults"]["runs"] == 5 and figures["defaults"]["samples_per_s"] == 2.0
    assert figures["top"]["samples_per_s"] == 3.0


def test_a_ladder_still_at_the_defaults_gives_way_to_the_recipe(tmp_path, facts):
    from cpuopt_helpers.stages import climb

    made = facts()
    _, stored = climb.start("standard", 80, 3, made.physical_cores)  # the ladder's top: PyTorch's defaults
    ladder = [{"step": "baseline", "config": stored.to_dict()}, {"step": "allocator", "config": stored.to_dict()}]
    base, top, source = fullstudy.arms(session(tmp_path, made, ladder))
    assert top.config_hash() != base.config_hash() and RECIPE in source  # never an A/A comparison
    base, top, source = fullstudy.arms(session(tmp_path, made, ladder), classes=80, preset="standard")
    assert top.config_hash() != base.config_hash() and RECIPE in source  # at 80 classes too


def test_at_80_classes_neither_arm_names_the_classes(tmp_path, facts):
    base, top, _ = fullstudy.arms(session(tmp_path, facts()), classes=80, preset="standard")
    assert "classes" not in dict(base.options) and "classes" not in dict(top.options)  # the workload's own 80
    assert "classes" not in fullstudy.setting_label(top.to_dict(), base.to_dict())


def made_up_trial(best_ratio: float | None, alone_gflops: float = 90.0) -> dict:
    """A trial as kernels.conv_paths prints it: as run, channels-last slower, and bf16 channels-last
    confirmed ``best_ratio`` faster (or no different where None)."""
    def row(path, part, ms, ratio=None, low=None, high=None, verdict=""):
        return {"path": path, "part": part, "median_ms": ms, "gflops": alone_gflops * 1000 / ms, "speedup": ratio,
                "speedup_low": low, "speedup_high": high, "verdict": verdict, "rounds": 8}
    rows = [row("as run", part, 1000.0) for part in ("forward", "backward", "both")]
    rows += [row("channels-last", part, 1600.0, 0.62, 0.58, 0.66, "slower") for part in ("forward", "backward", "both")]
    fast = (best_ratio, best_ratio - 0.1, best_ratio + 0.1, "faster") if best_ratio else (1.01, 0.95, 1.07,
                                                                                          "no different")
    rows += [row("bf16 channels-last", part, 1000.0 / fast[0], *fast) for part in ("forward", "backward", "both")]
    return {"op": "ConvolutionBackward0", "shapes": "2x2376x100x100; 2x256x100x100; 2376x256x3x3", "dtype": "fp32",
            "step_ms": 4000.0, "step_gflops": 60.0, "trial": {"rounds": 8, "threads": 2, "calls": 1, "rows": rows}}


def test_the_page_ends_with_the_next_fix_tried_and_its_paths(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=True)
    study["tried"] = made_up_trial(1.8)
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert "| channels-last | 1600 | 1600 | 56 | 56% | 0.62x | 95% CI 0.58-0.66 | slower |" in text  # ceiling 100
    assert "| as run (fp32, NCHW) | 1000 | 1000 | 90 | 90% |  |  |  |" in text  # what the step ran, named
    last = text.split("\n\n")[-2]
    assert last.startswith("retinanet (top): the next fix, tried: ConvolutionBackward0 (2x2376x100x100;")
    assert "bf16 channels-last is the fastest confirmed path: about 1.78 s a step less at this shape " \
           "(`--dtype bf16 --channels-last`)" in last  # 4 s x (1 - 1/1.8)
    assert last.endswith("`--dtype bf16 --channels-last` changes every layer, not this shape alone: only the whole "
                         "step compared tells whether it pays (`make case-study` climbs a rung for it).")


def test_the_fastest_path_alone_is_set_beside_the_climbs_rung_over_the_whole_step(tmp_path, facts):
    from cpuopt_helpers.stages import case_study

    made = facts()
    base = RunConfig.for_preset("retinanet", "standard").to_dict()
    said = "bf16: channels-last: 1.00x (95% CI 0.94-1.06, 5 paired rounds): no different; the rung below kept."
    ladder = [{"step": "baseline", "config": base}, {"step": "bf16", "config": base},
              {"step": "bf16: channels-last", "config": base, "evidence": {"sentence": said}}]
    sess = session(tmp_path, made, ladder)
    assert fullstudy.whole_step_rungs(sess, "bf16") == {  # a ladder not climbed: no day
        "channels-last": {"rung": "bf16: channels-last", "sentence": said, "day": None, "kept": False}}
    sess.store.put_fact("m", case_study.climbed_fact("retinanet", "standard"), {"day": "2026-12-04"})
    rungs = fullstudy.whole_step_rungs(sess, "fp32")  # channels-last alone: its fp32 rung is not in this ladder
    assert rungs == {"bf16": {"rung": "bf16", "sentence": "", "day": "2026-12-04", "kept": False},
                     "bf16 channels-last": {"rung": "bf16: channels-last", "sentence": said, "day": "2026-12-04",
                                            "kept": False}}
    study = made_up_study(facts, bf16_fast=True)
    study["tried"] = made_up_trial(1.8) | {"whole_step": rungs}
    last = fullstudy.write_page(study, tmp_path, made).read_text().split("\n\n")[-2]
    assert last.endswith("`--dtype bf16 --channels-last` changes every layer, not this shape alone: the "
                         "standard-preset ladder's rung \"bf16: channels-last\" compared it over the whole step, "
                         f"climbed on 2026-12-04: {said.removeprefix('bf16: channels-last: ')} So: this shape's gain "
                         "alone did not carry over the whole step; leave `--dtype bf16 --channels-last` out, as the "
                         "ladder does.")  # the rung's name said once, and one piece of advice at the end
    rungs["bf16 channels-last"]["kept"] = True
    last = fullstudy.write_page(study, tmp_path, made).read_text().split("\n\n")[-2]
    assert last.endswith("So: the ladder kept `--dtype bf16 --channels-last`, and the top already trains with it.")


@pytest.mark.parametrize("alone, kernel", [(90.0, "17%"), (40.0, "100%"), (50.0, "100%")])
def test_a_trial_that_finds_no_faster_path_splits_the_loss_between_the_kernel_and_the_step(facts, alone, kernel):
    study = made_up_study(facts, bf16_fast=False)  # the ceiling: 100 GFLOP/s; the step ran the shape at 60
    study["tried"] = made_up_trial(None, alone_gflops=alone)
    sentence = fullstudy.study_findings(study)[-1].sentence
    assert "No path is confirmed faster by 2% or more" in sentence
    assert f"{alone:.0f} GFLOP/s alone ({alone:.0f}% of the measured GEMM ceiling), 60 GFLOP/s in the step" in sentence
    # per GFLOP: 1/100 at the ceiling, 1/90 alone, 1/60 in the step: (1/90 - 1/100) / (1/60 - 1/100) = 1/6
    assert f"{kernel} is its kernel's own" in sentence


def test_a_trial_that_did_not_finish_is_said_and_no_table_made_up(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=False)
    study["tried"] = {k: v for k, v in made_up_trial(1.8).items() if k != "trial"} | {"error": "killed"}
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert "the trial did not finish (killed); nothing is said of its paths." in text
    assert "| as run" not in text


def test_no_trial_runs_where_the_step_runs_ipexs_convolutions(tmp_path, facts, monkeypatch):
    """The benchmark runs this torch's convolutions: for a top in IPEX (the climb's IPEX rung carried up)
    it would not time the kernel the step ran, so it is not run, and the page says why."""
    monkeypatch.setattr(fullstudy.subprocess, "run", lambda *a, **k: pytest.fail("the trial ran"))
    target = {k: v for k, v in made_up_trial(1.8).items() if k != "trial"}
    top = RunConfig.for_preset("retinanet", "full", runtime="ipex", ipex=True)
    study = made_up_study(facts, bf16_fast=False)
    study["tried"] = fullstudy.try_next_fix(target, top, facts())
    monkeypatch.undo()  # the page's stamp runs git
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert "alone, forward and backward: not run: the step runs IPEX's convolutions (weights prepacked" in text
    assert "| as run" not in text


def test_only_a_convolutions_backward_is_tried_at_its_heaviest_shape():
    table = pd.DataFrame([
        {"op": "ConvolutionBackward0", "phase": "backward", "shapes": "a", "dtype": "fp32", "ms": 100.0,
         "projected_ms": 90.0, "achieved_gflops": 50.0},
        {"op": "ConvolutionBackward0", "phase": "backward", "shapes": "b", "dtype": "", "ms": 80.0,
         "projected_ms": 20.0, "achieved_gflops": 30.0},
        {"op": "ConvolutionBackward0", "phase": "forward", "shapes": "c", "dtype": "fp32", "ms": 900.0,
         "projected_ms": 0.0, "achieved_gflops": 1.0}])
    prof = {"next": {"op": "ConvolutionBackward0", "phase": "backward"}, "whole": {"table": table}}
    assert fullstudy.next_fix_target(prof) == {"op": "ConvolutionBackward0", "shapes": "b", "dtype": "fp32",
                                               "step_ms": 80.0, "step_gflops": 30.0,  # the most time above its ceiling
                                               "layout": None}  # no trace to read it from
    assert fullstudy.next_fix_target({**prof, "next": {"op": "aten::copy_", "phase": "backward"}}) is None


def conv_event(strides: list[int], dims=(2, 8, 4, 4), grad_strides: list[int] | None = None) -> dict:
    """A convolution's backward as torch.profiler records it with shapes: grad, input, weight."""
    return {"ph": "X", "cat": "cpu_op", "name": "aten::convolution_backward", "ts": 0, "dur": 1, "args": {
        "Input type": ["float", "float", "float", ""], "Input Dims": [list(dims), list(dims), [8, 8, 1, 1], []],
        "Input Strides": [grad_strides or strides, strides, [8, 1, 1, 1], []]}}


def test_the_trial_runs_the_convolution_in_the_layout_the_trace_recorded(tmp_path, facts, monkeypatch):
    """Under torch.compile Inductor may run a model's convolutions channels-last: the trace's strides
    say so, and the trial's as-run path takes that layout, not the model's own."""
    trace = tmp_path / "top.json"
    channels_last, contiguous = [128, 1, 32, 8], [128, 16, 4, 1]
    trace.write_text(json.dumps({"traceEvents": [conv_event(channels_last), conv_event(channels_last),
                                                 conv_event(contiguous)]}))
    table = pd.DataFrame([{"op": "aten::convolution_backward", "phase": "backward", "dtype": "bf16", "ms": 10.0,
                           "shapes": "2x8x4x4; 2x8x4x4; 8x8x1x1", "projected_ms": 5.0, "achieved_gflops": 3.0}])
    prof = {"next": {"op": "aten::convolution_backward", "phase": "backward"}, "whole": {"table": table},
            "trace": str(trace)}
    target = fullstudy.next_fix_target(prof)
    assert target["layout"] == "channels-last"  # most calls
    assert wholestep.input_layout({"Input Dims": [[2, 8, 4, 4]]}) is None  # no strides recorded
    assert wholestep.input_layout(conv_event([128, 16, 1, 4])["args"]) is None  # neither layout
    event = conv_event(channels_last, grad_strides=contiguous)  # PyTorch picks the layout from input and weight
    assert wholestep.input_layout(event["args"], event["name"]) == "channels-last"
    assert wholestep.input_layout(event["args"]) == "NCHW"  # any other op: its first readable tensor
    assert wholestep.tensor_layout([2, 1, 4, 4], [16, 16, 4, 1]) is None  # one channel: both layouts fit
    assert wholestep.tensor_layout([2, 8, 4, 4], [999, 1, 32, 8]) == "channels-last"  # a batch slice's stride
    commands = []
    monkeypatch.setattr(fullstudy.subprocess, "run", lambda command, **_: commands.append(command) or
                        subprocess.CompletedProcess(command, 2, "", "cpuopt: stop here"))
    top = RunConfig.for_preset("retinanet", "standard", dtype="bf16")
    tried = fullstudy.try_next_fix(target, top, facts())
    assert commands[-1][commands[-1].index("--layout") + 1] == "channels-last" and tried["error"] == "stop here"
    assert not tried["layout_assumed"]
    tried = fullstudy.try_next_fix(target | {"layout": None}, top.replace(channels_last=True), facts())
    assert commands[-1][commands[-1].index("--layout") + 1] == "channels-last"  # not recorded: the run's own
    assert tried["layout_assumed"] and tried["channels_last_flag"]
    fullstudy.try_next_fix(target | {"layout": None}, top, facts())
    assert commands[-1][commands[-1].index("--layout") + 1] == "NCHW"


def channels_last_trial(best: str, **changes) -> dict:
    """``made_up_trial`` of a step that ran channels-last: its paths NCHW (slower) and ``best`` (faster)."""
    tried = made_up_trial(1.8) | {"layout": "channels-last"} | changes
    names = {"channels-last": "NCHW", "bf16 channels-last": best}
    for row in tried["trial"]["rows"]:
        row["path"] = names.get(row["path"], row["path"])
    return tried


def test_the_page_names_the_layout_the_step_ran(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=True)
    study["tried"] = channels_last_trial("bf16")
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert "| as run (fp32, channels-last) | 1000 | 1000 | 90 | 90% |  |  |  |" in text
    assert "| NCHW | 1600 | 1600 | 56 | 56% | 0.62x | 95% CI 0.58-0.66 | slower |" in text
    last = text.split("\n\n")[-2]
    assert "interleaved rounds: in the step's dtype and layout (channels-last), 90 GFLOP/s alone" in last
    assert "bf16 is the fastest confirmed path: about 1.78 s a step less at this shape (`--dtype bf16`)" in last
    assumed = channels_last_trial("bf16", layout="NCHW", layout_assumed=True)
    study["tried"] = assumed
    assert "| as run (fp32, NCHW, assumed: the trace recorded no strides) |" in \
        fullstudy.write_page(study, tmp_path, facts()).read_text()


@pytest.mark.parametrize("flag, how", [(False, "no option applies it yet"), (True, "`no --channels-last`")])
def test_nchw_is_applied_by_dropping_channels_last_only_where_the_run_asked_for_it(facts, flag, how):
    study = made_up_study(facts, bf16_fast=False)
    study["tried"] = channels_last_trial("NCHW", channels_last_flag=flag)
    for row in study["tried"]["trial"]["rows"]:  # NCHW the one faster path
        if row["path"] == "NCHW" and row["verdict"] == "slower":
            row.update(path="bf16", verdict="slower")
    sentence = fullstudy.study_findings(study)[-1].sentence
    assert f"NCHW is the fastest confirmed path: about 1.78 s a step less at this shape ({how})" in sentence


def test_an_allocator_trial_that_finished_no_run_claims_nothing(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=False)
    study["figures"]["top"] |= {"system_share": 0.40, "page_faults_per_step": 2584936.0}
    study["allocator"] = {"config": study["top"].replace(allocator="tcmalloc"), "figures": {"top": {}, "kept": {}},
                          "comparison": {"ratio": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"),
                                         "n": 0, "verdict": "failed", "failed_rounds": 5}}
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    assert "| top under tcmalloc over the top, images/s | none | none | 0 paired rounds |" in text
    assert "top under tcmalloc: images/s per physical core" not in text
    trial = next(n for n in text.split("\n\n") if "an allocator that keeps freed memory, tried" in n)
    assert trial.endswith("the top under tcmalloc over the top as compared above, in fresh paired rounds: not "
                          "measured.")  # no share, no rate made up


def test_the_page_gives_each_target_of_its_size_with_its_verdict_and_bound(tmp_path, facts):
    study = made_up_study(facts, bf16_fast=True) | {"preset": "standard", "classes": 80}
    study["bf16"] |= {"path": "avx512_bf16"}
    text = fullstudy.write_page(study, tmp_path, facts()).read_text()
    bound = 0.092 / 0.070 * study["profiles"]["top"]["whole"]["speedup_bound"]
    assert (f"| target for AVX512-BF16 CPUs: 2.5x over PyTorch's defaults | not met; at every ceiling "
            f"{bound:.2f}x |") in text  # 5 rounds, the target needs 10, but the interval (1.21-1.39) is wholly below
    assert "fewer than the 10 it needs, but the interval's upper end is already below 2.5x" in text
    wide = fullstudy.write_page(study | {"comparison": study["comparison"] | {"ci_high": 2.6}}, tmp_path, facts())
    assert (f"| target for AVX512-BF16 CPUs: 2.5x over PyTorch's defaults | too few rounds; at every ceiling "
            f"{bound:.2f}x |") in wide.read_text().replace("not checked: ", "")  # an interval reaching it: more rounds
    assert "| target for AMX CPUs: 3.0x over PyTorch's defaults, lower end 2.7 | not checked here (this CPU: " \
           "AVX512-BF16)" in text
    assert "Target for AVX512-BF16 CPUs at the standard preset (80 classes)" in text
    study["comparison"] |= {"n": 10}
    assert "| target for AVX512-BF16 CPUs: 2.5x over PyTorch's defaults | not met;" in \
        fullstudy.write_page(study, tmp_path, facts()).read_text()
    for other in (study | {"classes": 601}, study | {"preset": "quick"}):  # no target at another size
        assert "arget for" not in fullstudy.write_page(other, tmp_path, facts()).read_text()
    full = made_up_study(facts, bf16_fast=False)  # no bf16 fast path: the study runs in fp32, no target is checked
    assert "Not checked here (this CPU: no bf16 fast path); the top trains 0.046." in \
        fullstudy.write_page(full, tmp_path, facts()).read_text()


def test_a_path_no_option_applies_is_said_to_save_alone_only(facts):
    study = made_up_study(facts, bf16_fast=False)
    study["tried"] = made_up_trial(1.8)
    for row in study["tried"]["trial"]["rows"]:
        row["path"] = "GEMM form" if row["path"] == "bf16 channels-last" else row["path"]
    sentence = fullstudy.study_findings(study)[-1].sentence
    assert "GEMM form is the fastest confirmed path: about 1.78 s a step less at this shape (no option applies it " \
           "yet). A saving alone, not yet over the whole step:" in sentence
