"""Findings in words: every kind a stage makes has its sentence in ``wording.TEMPLATES``, a
finding stored and loaded back says the same, and a notebook's findings are kept as notes."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from cpuopt_helpers import wording
from cpuopt_helpers.decisions import Comparison, Finding
from cpuopt_helpers.profiledn import capture
from cpuopt_helpers.stages import allocator, baseline, choosing, climb, threads
from tests.conftest import make_facts
from tests.test_stages import screened

STAGES = Path(choosing.__file__).parent
PROFILEDN = Path(capture.__file__).parent


def kinds_made(path: Path) -> set[str]:
    """The kinds a stage module gives its findings: the string constants passed as ``kind`` to
    ``Finding`` or to a helper of the module that takes a ``kind`` parameter (read with ast)."""
    tree = ast.parse(path.read_text())
    position = {"Finding": 2}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and "kind" in [a.arg for a in node.args.args]:
            position[node.name] = [a.arg for a in node.args.args].index("kind")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in position:
            at = position[node.func.id]
            args = node.args[at:at + 1] + [k.value for k in node.keywords if k.arg == "kind"]
            found |= {c.value for a in args for c in ast.walk(a)
                      if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return found


def test_every_kind_a_stage_makes_has_a_sentence():
    made = {kind: path.name for path in sorted(STAGES.glob("*.py")) for kind in kinds_made(path)}
    assert {"thread scaling", "peak memory", "baseline throughput", "climb top", "confirmed"} <= set(made)
    missing = sorted(f"{kind!r} ({where})" for kind, where in made.items() if kind not in wording.TEMPLATES)
    assert not missing, f"add these kinds to wording.TEMPLATES: {missing}"
    with pytest.raises(ValueError, match="no sentence for findings of kind 'made up'"):
        Finding("cnn", "threads", "made up").sentence


def stored_and_loaded(finding: Finding) -> Finding:
    return Finding.from_dict(json.loads(json.dumps(finding.to_dict())))


def test_a_finding_stored_and_loaded_back_says_the_same():
    base, results = screened()
    table = choosing.compare_configs(results, base.to_dict(), "cnn")
    few = choosing.compare_configs([r for r in results if r["round"] < 2], base.to_dict(), "cnn")  # NaN intervals
    facts = make_facts(versions={"onednn_bf16_supported": True}, numactl={"present": True, "works": False,
                                                                           "reason": "EPERM"})
    rung = Finding("retinanet", "climb", "compile pays", {"compile_s": 40.0, "compile_warm_s": None,
                                                           "pays_after": 812.4, "train_steps": 5000, "carried": True},
                   Comparison(1.5, 1.4, 1.6, 5, "faster"))
    too_few = Finding("cnn", "threads", "setting over baseline", {"setting": "x"}, Comparison(1.1, n=2))  # NaN interval
    found = (threads.settings_findings(table, "cnn") + threads.settings_findings(few, "cnn") + [too_few]
             + allocator.memory_findings(table, "cnn") + allocator.handed_on_findings({"cnn": base}, {"tcmalloc": "apt"})
             + baseline.system_findings(facts, {"threads": 2, "gemm_gflops_best": 120.0, "copy_gbs_best": 10.0,
                                                "write_gbs": 8.0, "fresh_write_gbs": 2.0})
             + climb.climb_findings({"ladder": "retinanet", "base": base, "top": base.replace(allocator="jemalloc"),
                                     "rungs": [{"rung": "runtime: torch.compile", "finding": rung}],
                                     "end_to_end": {"ratio": 2.1, "ci_low": 1.9, "ci_high": 2.3, "n": 10,
                                                    "verdict": "faster"}}))
    assert any(math.isnan(f.comparison.ci_low) for f in found if f.comparison)  # NaN survives the JSON
    for finding in found:
        again = stored_and_loaded(finding)
        assert json.dumps(again.to_dict()) == json.dumps(finding.to_dict()) and again.sentence == finding.sentence
    said = found[-2].sentence  # a climb's rung: the rung's own finding, after the ladder's name
    assert said == "retinanet: " + rung.sentence
    assert said.endswith("after 812 steps, within a training run of 5,000 steps: carried up the ladder (later runs "
                         "compile from a warm cache in their untimed warm-up).")


@pytest.mark.parametrize("fresh, said", [(2.0, "4.0x slower. A step whose allocator hands large freed blocks back"),
                                          (6.0, "1.3x slower; page faults cost little here.")])
def test_notebook_00_says_what_writing_fresh_memory_costs_against_mapped_memory(fresh, said):
    roofline = {"threads": 2, "gemm_gflops_best": 120.0, "copy_gbs_best": 10.0, "write_gbs": 8.0,
                "fresh_write_gbs": fresh}
    found = {f.kind: f.sentence for f in baseline.system_findings(make_facts(versions={"onednn_bf16_supported": True},
                                                                             numactl={"present": False}), roofline)}
    assert f"runs at {fresh:.1f} GB/s, against 8.0 GB/s into memory already mapped: {said}" in found["fresh memory"]
    del roofline["fresh_write_gbs"]  # a roofline stored before this was measured: nothing said, nothing made up
    assert "fresh memory" not in {f.kind for f in baseline.system_findings(make_facts(
        versions={"onednn_bf16_supported": True}, numactl={"present": False}), roofline)}


def test_every_kind_profiledn_makes_has_a_sentence_and_says_it_again_stored_and_loaded():
    """ProfileDNN's findings (profiledn/*, stages/profiling.py): the notebooks 02, 06 and 08 tell them."""
    from tests.test_profiledn import profiledn_findings

    made = {kind for path in sorted(PROFILEDN.glob("*.py")) for kind in kinds_made(path)} | kinds_made(
        STAGES / "profiling.py")
    assert {"log total", "logs one run only", "profile coverage", "projection efficiency", "trace spans",
            "whole step projection", "slowest kernels"} <= made
    missing = sorted(kind for kind in made if kind not in wording.TEMPLATES)
    assert not missing, f"add these kinds to wording.TEMPLATES: {missing}"
    found = profiledn_findings()
    assert {f.kind for f in found} == made  # every kind, made from the fixtures
    for finding in found:
        again = stored_and_loaded(finding)
        assert json.dumps(again.to_dict()) == json.dumps(finding.to_dict()) and again.sentence == finding.sentence
    said = {f.kind: f.sentence for f in found if f.workload == "fixture"}  # a sentence made in the template
    assert said["whole step projection"].endswith(": most of the room is in time between operators (Python, the "
                                                  "autograd engine, the loop).")


def test_the_template_is_given_the_findings_workload():
    assert Finding("rnn", "threads", "one thread count").sentence == "rnn: only one thread count measured."


def test_tell_prints_the_findings_and_keeps_them_as_notes(tmp_path, capsys):
    from cpuopt_helpers.results import ResultStore
    from cpuopt_helpers.session import Session

    store = ResultStore(tmp_path / "r.sqlite")
    session = Session(facts=make_facts(), store=store)
    cnn, rnn = Finding("cnn", "threads", "one thread count"), Finding("rnn", "threads", "one thread count")
    gate = Finding("", "precision", "bf16 gate", {"accelerated": False, "path": None, "reason": "no flags"})
    with pytest.raises(TypeError, match="tell takes decisions.Finding records, not str"):
        session.tell([cnn, "a line, not a record"], "quick")
    assert capsys.readouterr().out == "" and session.notes("threads", "quick") == []  # nothing printed or kept
    session.tell([cnn, gate], "quick")
    session.tell([rnn], "quick")  # the next workload adds to the stage's notes
    session.tell([rnn], "quick")  # a cell run again replaces its own
    assert capsys.readouterr().out.splitlines() == [
        "- cnn: only one thread count measured.", "- bf16 fast path on this CPU: no (no flags).", "- rnn: only one thread count measured.",
        "- rnn: only one thread count measured."]
    assert session.notes("threads", "quick") == [cnn, rnn] and session.notes("precision", "quick") == [gate]
    assert session.notes("threads", "standard") == []
    kept = store.get_fact(session.machine, "notes/threads/quick")  # each record with the sentence as printed
    assert [d["said"] for d in kept] == ["cnn: only one thread count measured.", "rnn: only one thread count measured."]
    again = Session(facts=make_facts(), store=store)  # the next run of the notebook replaces the stage's notes
    again.tell([rnn], "quick")
    capsys.readouterr()
    assert again.notes("threads", "quick") == [rnn] and again.notes("precision", "quick") == [gate]


def test_the_ceilings_give_the_bf16_gemm_ceiling_where_it_was_measured():
    facts = make_facts(versions={"onednn_bf16_supported": True}, numactl={"present": False})
    roofline = {"threads": 2, "gemm_gflops_best": 120.0, "copy_gbs_best": 10.0}
    said = {f.kind: f.sentence for f in baseline.system_findings(facts, roofline)}["ceilings"]
    assert said.startswith("Measured ceilings on 2 threads: fp32 GEMM 120 GFLOP/s, memory copy 10.0 GB/s")
    said = {f.kind: f.sentence for f in baseline.system_findings(facts, roofline | {"gemm_gflops_bf16_best": 410.0})}
    assert said["ceilings"].startswith("Measured ceilings on 2 threads: fp32 GEMM 120 GFLOP/s, bf16 GEMM 410 GFLOP/s, "
                                       "memory copy 10.0 GB/s")


def test_a_larger_batch_is_counted_in_epochs_and_optimizer_steps_not_advised():
    import pandas as pd

    from cpuopt_helpers.stages import multi_instance

    table = pd.DataFrame({"global_batch": [16, 64], "epochs_to_target": [3, 6], "final_accuracy": [0.944, 0.983]})
    *_, larger = multi_instance.convergence_findings(table, 0.95)
    assert larger.sentence.startswith("a 4x larger global batch needed more epochs to the target (3 -> 6; one seed "
                                      "each, the same learning rate) and fewer optimizer steps")
    assert "lower the per-rank batch" not in larger.sentence
    same = multi_instance.convergence_findings(table.assign(epochs_to_target=[3, 12]), 0.95)[-1]
    assert "needed more epochs" in same.sentence and "as many optimizer steps" in same.sentence
    assert "did not reach the target at all" not in same.sentence
    unreached = pd.DataFrame({"global_batch": [256], "epochs_to_target": [None], "final_accuracy": [0.9]})
    more = pd.concat([table, unreached])
    first, *_, larger = multi_instance.convergence_findings(more, 0.95)
    assert first.sentence.startswith("digits model, global batch 16: 3 epochs to 95% test accuracy")
    assert "; at global batch 256 it did not reach the target at all: adding ranks" in larger.sentence


def test_the_allocator_handed_on_is_named_in_words():
    from cpuopt_helpers.config import RunConfig

    base = RunConfig.for_preset("cnn", "quick")
    kept, won = allocator.handed_on_findings({"cnn": base, "rnn": base.replace(allocator="tcmalloc")}, {})
    assert kept.sentence.startswith("cnn: the C library's allocator (glibc's malloc, nothing preloaded) stays")
    assert won.sentence == ("rnn: tcmalloc is handed on, confirmed faster than the allocator before it in fresh "
                            "paired rounds.")


def test_a_fix_over_its_baseline_names_its_workload_where_notebook_08_measures_several():
    c = Comparison(1.2, n=1, verdict="too few rounds", screened=True)
    assert Finding("retinanet", "case_study", "arm over first", {"name": "fused Lamb", "first": "baseline"}, c).sentence \
        == "retinanet: fused Lamb over baseline: 1.20x (screened only, 1 round)."
    assert Finding("", "case_study", "arm over first", {"name": "fused Lamb", "first": "baseline"}, c).sentence \
        .startswith("fused Lamb over baseline")
