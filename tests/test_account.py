"""A traced step by phase (profiledn.account): the phase table, the forward/backward account and the
next fix, on the hand-made trace of test_wholestep (two identical steps; numbers counted by hand
there: per step linear 100 µs, relu 20, cat 10, view 5, conv2d 50, copy_ 1 in the forward; sum 30
in the loss; MmBackward0 100 in the backward; add_ 40 in the optimizer; between operators forward
322, loss 20, backward 30, optimizer 20)."""

import pandas as pd
import pytest

from cpuopt_helpers.decisions import Finding
from cpuopt_helpers.profiledn import account, wholestep
from tests.test_wholestep import ADDMM, CEIL, CONV_FLOPS, MM, TRACE


@pytest.fixture(scope="module")
def result():
    return wholestep.whole_step(TRACE, CEIL)


@pytest.fixture(scope="module")
def table(result):
    return account.phase_table(result, CEIL, {"fp32": 400.0})


def test_each_phase_is_its_operators_and_the_time_between_them(result, table):
    assert table.loc["forward", "ms"] == pytest.approx((100 + 20 + 10 + 5 + 50 + 1 + 322) / 1e3)
    assert table.loc["loss", "ms"] == pytest.approx((30 + 20) / 1e3)
    assert table.loc["backward", "ms"] == pytest.approx((100 + 30) / 1e3)
    assert table.loc["optimizer", "ms"] == pytest.approx((40 + 20) / 1e3)
    assert table["ms"].sum() == pytest.approx(result["step_ms"])  # nothing lost, nothing counted twice
    assert table["share"].sum() == pytest.approx(1.0)
    assert table.loc["forward", "copy_ms"] == pytest.approx((10 + 1) / 1e3)  # the cat and the copy_


def test_gemm_rates_against_both_peaks(table):
    # the forward's GEMM-like ops: the linear (100 µs) and the conv (50 µs), both with FLOPs
    rate = (ADDMM[0] + CONV_FLOPS) / 150e-6 / 1e9
    assert table.loc["forward", "gemm_ms"] == pytest.approx(0.150)
    assert table.loc["forward", "gemm_gflops"] == pytest.approx(rate)
    assert table.loc["forward", "of_ceiling"] == pytest.approx(rate / 100.0)
    assert table.loc["forward", "of_theoretical"] == pytest.approx(rate / 400.0)
    assert table.loc["backward", "gemm_gflops"] == pytest.approx(MM[0] / 100e-6 / 1e9)
    assert pd.isna(table.loc["loss", "gemm_gflops"])  # no GEMM in the loss: no rate, not zero


def test_forward_backward_counts_the_loss_in_the_forward_as_the_worker_does(table):
    fb = account.forward_backward(table)
    assert fb["forward_ms"] == pytest.approx(0.508 + 0.050)
    assert fb["backward_ms"] == pytest.approx(0.130)
    assert fb["ratio"] == pytest.approx(0.558 / 0.130)
    assert fb["work_ratio"] == pytest.approx(MM[0] / (ADDMM[0] + CONV_FLOPS))
    assert fb["loss_share"] == pytest.approx(0.050 / 0.558)
    assert not fb["met"] and not fb["gemm_bound"]


@pytest.mark.parametrize("fwd, bwd, gemm_share, of_ceiling, met, said", [
    (0.7, 1.0, 0.1, 0.1, True, ": met"),  # the ratio goal
    (0.71, 1.0, 0.1, 0.1, False, ": not met (GEMM-like operators 10% of its time, at 10% of the ceiling)"),
    (1.0, 1.0, 0.8, 0.5, True, ": met, GEMM-bound"),  # GEMM-bound at half the ceiling: a long forward is explained
    (1.0, 1.0, 0.79, 0.9, False, ": not met (GEMM-like operators 79% of its time)"),
    (1.0, 1.0, 0.9, 0.49, False, ": not met (at 49% of the ceiling)"),
])
def test_the_goal_is_the_ratio_or_a_gemm_bound_forward(fwd, bwd, gemm_share, of_ceiling, met, said):
    table = pd.DataFrame({"ms": [fwd, 0.0, bwd, 0.1], "gflop": [1.0, 0.0, 1.5, 0.0],
                          "gemm_ms": [fwd * gemm_share, 0.0, bwd / 2, 0.0], "gemm_share": [gemm_share, 0, 0.5, 0],
                          "gemm_gflops": [100.0, None, 80.0, None], "of_ceiling": [of_ceiling, None, 0.4, None]},
                         index=["forward", "loss", "backward", "optimizer"])
    values = account.forward_backward(table)
    assert values["met"] is met
    sentence = Finding("toy", "profiledn", "forward backward", values).sentence
    assert ("The goal: 0.7x at most, or a GEMM-bound forward (GEMM-like operators 80% or more of its time, at 50% or "
            "more of the measured GEMM ceiling)" + said + ".") in sentence  # which way it meets the goal, or why not


def test_the_next_fix_is_where_most_time_lies_above_its_ceiling(result):
    # between operators (0.392 ms a step) outweighs any operator's gap in the fixture
    fix = account.next_fix(result)
    assert (fix["fix"], fix["op"], fix["phase"]) == ("dispatch", "between operators", "forward")
    assert fix["gap_ms"] == pytest.approx(result["between_ops_ms"])
    # without the time between operators, the operator with the largest gap (the linear and its backward tie)
    quiet = dict(result, between_ops_ms=0.0)
    fix = account.next_fix(quiet)
    table = result["table"]
    gaps = (table["ms"] - table["projected_ms"]).clip(lower=0).groupby(table["op"]).sum()
    assert gaps[fix["op"]] == pytest.approx(gaps.max()) and fix["gap_ms"] == pytest.approx(gaps.max())
    assert fix["fix"] == {"compute": "gemm", "memory": "kernel"}[table.set_index("op").loc[fix["op"], "bound"]]
    assert "fused kernel" in Finding("", "profiledn", "next fix", dict(fix, fix="kernel")).sentence


def test_the_sentences_say_why_from_the_numbers(table, result):
    said = account.findings(table, result, "toy")
    assert [f.kind for f in said] == ["forward backward", "next fix"]
    text = said[0].sentence
    assert "4.29x the backward's time. The goal: " in text  # the ratio as counted above
    assert "not met" in text
    assert said[1].sentence.startswith("toy: the next fix the profile points at: the time between operators")
