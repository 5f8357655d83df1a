"""The bf16 hardware gate on other machines' flags, a bf16 worker run, the digits experiment."""

from pathlib import Path

import pytest

from cpuopt_helpers import accuracy, launch, system
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.decisions import Plan
from cpuopt_helpers.stages import choosing, precision

FIX = Path(__file__).parent / "fixtures"


def flags(name):
    return system.parse_isa_flags((FIX / name).read_text())


def test_gate_sapphire_rapids_uses_amx():
    gate = system.bf16_gate(flags("cpuinfo_sapphire_rapids.txt"), True, "Intel AVX-512 with Intel AMX")
    assert gate["accelerated"] and gate["path"] == "amx" and "AMX" in gate["reason"]


def test_gate_cooper_lake_uses_avx512_bf16():
    gate = system.bf16_gate(flags("cpuinfo_cooperlake.txt"), True, None)
    assert gate["accelerated"] and gate["path"] == "avx512_bf16"


def test_gate_amd_without_bf16_is_not_accelerated():
    gate = system.bf16_gate(flags("cpuinfo_epyc_avx2.txt"), False, "Intel AVX2")
    assert not gate["accelerated"] and gate["path"] is None
    assert "no AVX512-BF16, AMX or AVX-NE-CONVERT" in gate["reason"] and "Intel AVX2" in gate["reason"]


def test_gate_needs_onednn_to_agree_and_conversion_only_is_not_a_fast_path():
    assert not system.bf16_gate(flags("cpuinfo_cooperlake.txt"), False, None)["accelerated"]
    gate = system.bf16_gate({"avx2": True, "avx_ne_convert": True}, True, None)
    assert not gate["accelerated"] and "conversions" in gate["reason"]


@pytest.mark.slow
def test_doctor_reports_the_gate_for_this_machine():
    facts = system.collect_facts()
    gate = facts.bf16
    assert set(gate) == {"accelerated", "path", "reason"} and gate["reason"]
    native = facts.isa["avx512_bf16"] or (facts.isa["amx_bf16"] and facts.isa["amx_tile"])
    assert gate["accelerated"] == (native and facts.versions["onednn_bf16_supported"])


@pytest.mark.slow
def test_bf16_worker_run_uses_bf16():
    r = launch.run(RunConfig(dtype="bf16", steps=2, warmup=1))
    assert r["status"] == "ok", r["reason"]
    assert r["config"]["dtype"] == "bf16" and r["instances"][0]["output_dtype"] == "bfloat16"


@pytest.mark.slow
def test_digits_accuracy_experiment_on_a_tiny_setting():
    # fp32 over two epochs (it learns); the bf16 modes over one (on a CPU without a bf16 path, many times slower)
    runs = [accuracy.run_accuracy(mode, epochs=2 if mode == "fp32" else 1, batch_size=64, threads=1)
            for mode in accuracy.MODES]
    table = precision.accuracy_table(runs)
    assert list(table.index) == ["fp32", "bf16", "bf16_loss"]
    assert [len(r["history"]) for r in runs] == [2, 1, 1]
    assert all(r["train_samples"] + r["test_samples"] == 1797 for r in runs)
    assert table.loc["fp32", "final_accuracy"] > 0.5  # learns real digits in two epochs (chance: 0.1)
    assert runs[0]["history"][1]["loss"] < runs[0]["history"][0]["loss"]
    assert runs[1]["history"] != runs[2]["history"]  # the bf16 loss really is computed in bf16
    again = accuracy.run_accuracy("fp32", epochs=2, batch_size=64, threads=1)
    assert again["history"] == runs[0]["history"]  # seeded: reproducible


def test_precision_choice_needs_a_fast_path_accuracy_and_a_confirmed_win():
    import pandas as pd

    from cpuopt_helpers.config import RunConfig

    fp32, bf16 = RunConfig(threads=2), RunConfig(threads=2, dtype="bf16")
    table = pd.DataFrame([{"setting": "baseline", "ratio": 1.0, "runs": 2, "config": fp32.to_dict(),
                           "config_hash": fp32.config_hash(), "is_baseline": True},
                          {"setting": "dtype=bf16", "ratio": 1.5, "runs": 2, "config": bf16.to_dict(),
                           "config_hash": bf16.config_hash(), "is_baseline": False}])
    acc = pd.DataFrame({"final_accuracy": [0.95, 0.948]}, index=["fp32", "bf16"])
    fast = {"accelerated": True, "path": "amx", "reason": "x"}

    def confirm(verdict):
        return lambda a, b: {"ratio": 1.5, "ci_low": 1.3, "ci_high": 1.7, "n": 5, "verdict": verdict, "margin": 0.05,
                             "min_rounds": 5, "label": "95% CI"}
    plan = Plan.of([fp32, bf16])
    choice = precision.choose(table, plan, confirm("faster"), accuracy=acc, gate=fast)
    assert choice.config.dtype == "bf16" and choice.changed and choice.sentence.endswith("handed on.")
    slow = precision.choose(table, plan, confirm("faster"), accuracy=acc, gate=dict(fast, accelerated=False, reason="no AMX"))
    assert slow.config is None and (slow.finding.kind, slow.finding.values["reason"]) == ("no bf16 fast path", "no AMX")
    worse = pd.DataFrame({"final_accuracy": [0.95, 0.90]}, index=["fp32", "bf16"])
    lost = precision.choose(table, plan, confirm("faster"), accuracy=worse, gate=fast)
    assert lost.config is None and lost.finding.values["drop"] == pytest.approx(0.05)
    kept = precision.choose(table, plan, confirm("no different"), accuracy=acc, gate=fast)
    assert kept.config is None and kept.comparison.verdict == "no different"


@pytest.mark.slow
def test_a_bf16_setting_whose_loss_drifts_is_not_handed_on():
    """A workload built to drift (outputs near 1000, where bf16 rounds in steps of 4-8): measured
    in fp32 and in bf16 with the same seed and batch, bf16 is no candidate however fast it is."""
    fp32 = RunConfig(workload="tests.user_workloads:drift", steps=4, warmup=1, threads=1)
    runs = []
    for arm, config in enumerate((fp32, fp32.replace(dtype="bf16"))):
        r = launch.run(config)
        assert r["status"] == "ok", r["reason"]
        runs.append(dict(r, sweep="s", arm=arm, round=0))
    table = choosing.compare_configs(runs, fp32.to_dict(), fp32.workload)
    drift = table.set_index("setting").loc["dtype=bf16", "loss_drift"]
    assert drift > choosing.LOSS_TOLERANCE
    choice = choosing.choose(table, "drift", lambda a, b: {"verdict": "faster"})
    assert choice.config.dtype == "fp32" and choice.finding.values["excluded"] == [["dtype=bf16", pytest.approx(drift)]]


def test_the_bf16_stage_compares_against_the_layout_handed_on():
    facts = system.Facts(physical_cores=2, bf16={"accelerated": True})
    for handed_on in (False, True):
        base = RunConfig.for_preset("cnn", "standard", threads=2, channels_last=handed_on)
        configs = precision.configs(base, facts, channels_last=True).configs
        assert (configs[0].channels_last, configs[0].dtype) == (handed_on, "fp32")  # the reference: the rung before
        assert {(c.channels_last, c.dtype) for c in configs} == {(a, b) for a in (False, True) for b in ("fp32", "bf16")}


def test_the_accuracy_difference_is_said_in_test_images_of_one_seed():
    """98.61% against 98.06% of 360 images is two images, one seed each: said as such, not as +0.6 points."""
    import pandas as pd

    acc = pd.DataFrame({"final_accuracy": [353 / 360, 355 / 360, 353 / 360], "final_loss": [0.03, 0.04, 0.035],
                        "test_samples": [360] * 3}, index=["fp32", "bf16", "bf16_loss"])
    bf16, loss, which = (f.sentence for f in precision.accuracy_findings(acc))
    # two standard errors of a difference of two accuracies near 98% over 360 images: 2 x sqrt(2 x .983 x .017 / 360)
    assert bf16 == ("digits, bf16 (the loss in fp32): final test accuracy 98.6% vs 98.1% in fp32 (2 of 360 test "
                    "images more right, one seed each): within the test set's own noise (about 7 images), so on this "
                    "model bf16 (the loss in fp32) did not hurt accuracy that one seed can show; final loss 0.0400 "
                    "(fp32: 0.0300).")
    worse = acc.assign(final_accuracy=[353 / 360, 340 / 360, 353 / 360])
    assert "13 of 360 test images fewer right, one seed each): beyond the test set's own noise" in \
        precision.accuracy_findings(worse)[0].sentence
    assert "bf16 with the loss in bf16 too" in loss and "the same count of 360 test images right" in loss
    assert which == ("digits, the loss under bf16: 98.6% of the test images right with the loss in fp32, 98.1% with "
                     "it in bf16: within the test set's own noise (about 7 images), so this model cannot tell whether "
                     "the loss must stay in fp32; the workbook keeps it in fp32, as the paper advises (the loss's "
                     "speed is not measured apart).")
    apart = precision.accuracy_findings(acc.assign(final_accuracy=[353 / 360, 355 / 360, 340 / 360]))[2].sentence
    assert "15 images more right with the loss in fp32, beyond the test set's own noise" in apart
    assert "keep the loss in fp32, as the paper advises" in apart
    older = precision.accuracy_findings(acc.drop(columns="test_samples"))  # a stored table without the count
    assert "test images" not in older[0].sentence and "98.6% vs 98.1%" in older[0].sentence
