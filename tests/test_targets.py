"""The case study's targets (cpuopt_helpers.targets): which apply, each verdict, what the run allows."""

import pytest

from cpuopt_helpers import targets
from cpuopt_helpers.targets import Measured

AMX_RATIO, AVX512_RATIO, AMX_PER_CORE = targets.TARGETS


def comparison(ratio, low, n=10, verdict="faster"):
    return {"ratio": ratio, "ci_low": low, "ci_high": ratio * 1.1, "n": n, "verdict": verdict, "label": "95% CI"}


def test_each_study_has_the_targets_of_its_preset_and_class_count_only():
    assert targets.applying("standard", 80) == [AMX_RATIO, AVX512_RATIO]
    assert targets.applying("full", 264) == [AMX_PER_CORE]
    assert targets.applying("standard", 601) == [] and targets.applying("quick", 80) == []


@pytest.mark.parametrize("ratio, low, n, verdict, expected", [
    (3.1, 2.8, 10, "faster", "met"),
    (3.1, 2.6, 10, "faster", "not met"),  # the interval's lower end below 2.7
    (2.9, 2.8, 10, "faster", "not met"),
    (3.1, float("nan"), 10, "faster", "not met"),  # no interval: no lower end to check
    (3.1, 2.8, 5, "faster", "too few rounds"),  # the target needs 10 paired rounds
    (2.0, 1.85, 5, "faster", "not met"),  # its interval (1.85-2.2) wholly below 3.0: in any number of rounds
    (3.1, 2.8, 10, "no different", "not met"),
])
def test_the_amx_ratio_is_met_only_with_its_lower_end_in_enough_rounds_and_a_faster_verdict(ratio, low, n, verdict,
                                                                                            expected):
    assert targets.status(AMX_RATIO, "amx", Measured(comparison(ratio, low, n, verdict))) == expected


def test_a_target_is_checked_on_a_cpu_of_its_own_path_only():
    m = Measured(comparison(2.6, 2.1), per_core=0.3)
    assert targets.status(AVX512_RATIO, "avx512_bf16", m) == "met"  # no lower end asked
    assert targets.status(AMX_RATIO, "avx512_bf16", m) == "other path"
    assert targets.status(AVX512_RATIO, "amx", m) == "other path"
    assert targets.status(AMX_PER_CORE, None, m) == "other path"  # no bf16 fast path: no target
    assert targets.status(AMX_PER_CORE, "amx", m) == "met"
    assert targets.status(AMX_PER_CORE, "amx", Measured(comparison(2.6, 2.1), per_core=0.19)) == "not met"
    assert targets.status(AMX_PER_CORE, "amx", Measured({})) == "no result"
    assert targets.status(AMX_RATIO, "amx", Measured({})) == "no result"


def test_the_bound_scales_the_measured_figure_by_the_projection():
    m = Measured(comparison(1.8, 1.6), per_core=0.15, speedup_bound=1.25, top_step_s=0.7, base_step_s=1.3)
    assert targets.bound(AVX512_RATIO, m) == pytest.approx(1.3 / 0.7 * 1.25)  # the defaults' step over the top's at its
    assert targets.bound(AMX_PER_CORE, m) == pytest.approx(0.15 * 1.25)  # every ceiling
    assert targets.bound(AVX512_RATIO, Measured(comparison(1.8, 1.6))) is None  # no projection: no bound


def test_the_share_of_peak_a_target_asks_for_is_the_tops_work_in_the_targets_time():
    # the top does 250 GFLOP/s x 0.7 s = 175 GFLOP a step; 2.5x over a 1.3 s step: 0.52 s, 336.5 GFLOP/s
    m = Measured(comparison(1.8, 1.6), per_core=0.15, top_gflops=250.0, top_step_s=0.7, base_step_s=1.3,
                 peak_gflops=470.0)
    assert targets.needed_share(AVX512_RATIO, m) == pytest.approx(175 / (1.3 / 2.5) / 470)
    assert targets.needed_share(AMX_PER_CORE, m) == pytest.approx(250 * 0.20 / 0.15 / 470)
    assert targets.needed_share(AVX512_RATIO, Measured(comparison(1.8, 1.6), top_gflops=250.0)) is None  # peak unknown


def said(path, m, preset="standard", classes=80):
    return [f.sentence for f in targets.findings(preset, classes, path, m)]


def test_a_target_above_the_bound_is_said_to_be_beyond_faster_kernels():
    m = Measured(comparison(1.83, 1.55), speedup_bound=1.32, top_step_s=0.69, base_step_s=1.29, top_gflops=254.0,
                 peak_gflops=470.0)
    amx, avx512 = said("avx512_bf16", m)
    assert amx.startswith("Target for AMX CPUs at the standard preset (80 classes): the top over PyTorch's defaults "
                          "3.0x in 10 paired rounds, the interval's lower end at 2.7 or more. Not checked here (this "
                          "CPU: AVX512-BF16); measured 1.83x (95% CI: 1.55-")
    assert avx512.startswith("Target for AVX512-BF16 CPUs at the standard preset (80 classes): the top over PyTorch's "
                             "defaults 2.5x in 10 paired rounds. Not met: measured 1.83x")
    assert "10 rounds): faster than the defaults, yet short of the target. At every ceiling" in avx512
    assert f"the top would reach {1.29 / 0.69 * 1.32:.2f}x here: below the target, so no faster kernel" in avx512
    assert "of the theoretical peak over the whole step; the top runs at 54%." in avx512
    m = Measured(comparison(1.83, 1.55), speedup_bound=1.5, top_step_s=0.69, base_step_s=1.29)
    assert "the target is within that bound." in said("avx512_bf16", m)[1]
    assert "theoretical peak" not in said("avx512_bf16", m)[1]  # the peak unknown: no share said


def test_the_per_core_target_names_its_source_and_says_where_it_is_not_checked():
    m = Measured(comparison(3.17, 3.07, n=5), per_core=0.153, speedup_bound=1.16)
    (line,) = said("avx512_bf16", m, "full", 264)
    assert line.startswith("Target for AMX CPUs at the full preset (264 classes): 0.20 images/s per physical core, "
                           "MLPerf Training v3.0 Intel's rate")
    assert "Not checked here (this CPU: AVX512-BF16); the top trains 0.153." in line
    assert line.endswith(f"For reference only: on this CPU, at every ceiling (this run's projection), the top would "
                         f"reach {0.153 * 1.16:.2f}.")  # another CPU's target: no "below the target", no peak share
    (line,) = said(None, m, "full", 264)
    assert "Not checked here (this CPU: no bf16 fast path)" in line
    assert said("amx", m, "full", 264)[0].count("Not met: the top trains 0.153.") == 1


def test_a_target_beyond_the_theoretical_peak_says_no_core_of_this_cpu_can_reach_it():
    m = Measured(comparison(1.2, 1.1), top_gflops=90.0, top_step_s=1.0, base_step_s=1.2, peak_gflops=100.0)
    avx512 = said("avx512_bf16", m)[1]  # 2.5x over a 1.2 s step: 0.48 s for 90 GFLOP, 188 GFLOP/s of a 100 peak
    assert "The target asks for 188% of the theoretical peak over the whole step (more than this CPU's cores" in avx512
    within = Measured(comparison(1.2, 1.1), top_gflops=90.0, top_step_s=1.0, base_step_s=3.0, peak_gflops=100.0)
    assert "asks for 75% of the theoretical peak over the whole step; the top" in said("avx512_bf16", within)[1]
