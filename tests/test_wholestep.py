"""Whole-step projection (profiledn.wholestep): the join, work counts, ceilings, coverage and the gap's causes.

The fixture (tests/fixtures/traces/wholestep_step.trace.json) is two identical steps of a
hand-made Chrome trace, 1000 µs apart; every expected number below is counted by hand from it.
"""

import dataclasses
import json
from pathlib import Path

import pytest

from cpuopt_helpers import cli
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.flops import conv_flops
from cpuopt_helpers.profiledn import wholestep

TRACE = Path(__file__).parent / "fixtures" / "traces" / "wholestep_step.trace.json"
CEIL = wholestep.Ceilings({"fp32": 100.0}, 10.0, 2, "test")  # 100 GFLOP/s = 1e5 FLOP/µs; 10 GB/s = 1e4 B/µs
FLOP_US, BYTE_US = 1e5, 1e4

# per step: (row, measured µs, FLOPs, bytes, bound)
ADDMM = (2 * 64 * 256 * 64, (64 + 64 * 256 + 256 * 64 + 64 * 64) * 4)  # out 64x64
MM = (2 * 64 * 64 * 256, (64 * 64 + 64 * 256 + 64 * 256) * 4)  # (64,64)x(64,256), out 64x256
CONV_FLOPS = 2 * 2 * 4 * 3 * 22 * 22  # 3x3, padding 1, 8x8: 22 taps on the input a row of 8, not 24 (benchdnn's count)
CONV_BYTES = (2 * 3 * 8 * 8 + 4 * 3 * 3 * 3 + 2 * 4 * 8 * 8) * 4
EXPECTED = {
    "aten::linear": (100, ADDMM[0], ADDMM[1], "compute"),  # aten::t (a view) + aten::addmm, not the linear again
    "aten::relu": (20, 0, 2 * 64 * 64 * 4, "memory"),  # own estimate = its clamp_min child's: counted once
    "aten::sum": (30, 0, 64 * 64 * 4, "memory"),  # a reduction: the input read
    "MmBackward0": (100, MM[0], MM[1], "compute"),  # found through two levels of autograd spans
    "aten::add_": (40, 0, 3 * 64 * 256 * 4, "memory"),  # in place: self read and written, other read
    "aten::cat": (10, 0, 0, "unknown"),  # a tensor list: shapes not recorded
    "aten::view": (5, 0, 0, "no work"),
    "aten::conv2d": (50, CONV_FLOPS, CONV_BYTES, "memory"),  # so small a conv that bytes bind it
    "aten::copy_": (1, 0, 2 * 1024 * 1024 * 4, "memory"),  # 8 MB in 1 µs: above the copy ceiling
}


def ideal_us(flops, moved):
    return max(flops / FLOP_US, moved / BYTE_US)


@pytest.fixture(scope="module")
def result():
    return wholestep.whole_step(TRACE, CEIL)


def test_rows_are_top_level_spans_each_counted_once(result):
    rows = result["rows"]
    assert result["steps"] == 2  # from the .ops.json beside the trace
    assert len(rows) == 2 * len(EXPECTED)  # nested spans (t, addmm, clamp_min, MmBackward0, mm, ...) are no rows
    per_op = rows[rows["ts_us"] < 1000].set_index("op")
    for op, (time_us, flops, moved, bound) in EXPECTED.items():
        row = per_op.loc[op]
        assert (row["time_us"], row["flops"], row["bytes"], row["bound"]) == (time_us, flops, moved, bound), op
    assert per_op.loc["aten::sum", "phase"] == "loss"
    assert per_op.loc["aten::add_", "phase"] == "optimizer"
    assert per_op.loc["MmBackward0", "phase"] == "backward"
    assert per_op.loc["aten::linear", "phase"] == "forward"


def test_ceiling_time_is_the_larger_of_compute_and_memory(result):
    per_op = result["rows"][result["rows"]["ts_us"] < 1000].set_index("op")
    for op, (_, flops, moved, bound) in EXPECTED.items():
        if bound in ("compute", "memory"):
            assert per_op.loc[op, "ideal_us"] == pytest.approx(ideal_us(flops, moved)), op
    assert ADDMM[0] / FLOP_US > ADDMM[1] / BYTE_US  # the fixture's GEMMs really are compute-bound
    assert CONV_FLOPS / FLOP_US < CONV_BYTES / BYTE_US
    # a row measured faster than its ceiling keeps its measured time in the projection
    assert per_op.loc["aten::copy_", "above_ceiling"]
    assert per_op.loc["aten::copy_", "projected_us"] == 1
    assert per_op.loc["aten::cat", "projected_us"] == 10  # unknown work keeps its time too


def test_coverage_projection_and_gap_split(result):
    op_us = sum(v[0] for v in EXPECTED.values())
    wall = 1000 + 496  # first op at 0, last ends at 1000 + 495 + 1
    assert result["step_ms"] == pytest.approx(wall / 2 / 1e3)
    assert result["operator_ms"] == pytest.approx(op_us / 1e3)
    assert result["between_ops_ms"] == pytest.approx((wall / 2 - op_us) / 1e3)
    assert result["coverage"] == pytest.approx((op_us - 10) / op_us)  # the cat's 10 µs are unknown
    gap = result["gap_ms"]
    compute = sum(t - ideal_us(f, b) for t, f, b, bound in EXPECTED.values() if bound == "compute")
    memory = sum(t - min(t, ideal_us(f, b)) for t, f, b, bound in EXPECTED.values() if bound == "memory")
    assert gap["compute"] == pytest.approx(compute / 1e3)
    assert gap["memory"] == pytest.approx(memory / 1e3)
    assert gap["no work"] == pytest.approx(5 / 1e3)
    assert gap["between ops"] == pytest.approx(result["between_ops_ms"])
    # each stretch between operators belongs to the phase of the operator after it (by hand: forward 10, 40, 5,
    # 10, 5 a step and 504 µs once from one step to the next; loss 20, backward 30, optimizer 20 a step)
    assert result["between_ops_by_phase_ms"] == pytest.approx(
        {"forward": (70 + 504 / 2) / 1e3, "loss": 0.02, "backward": 0.03, "optimizer": 0.02})
    assert sum(result["between_ops_by_phase_ms"].values()) == pytest.approx(result["between_ops_ms"])
    # the step is the projection plus every cause of the gap, nothing lost or counted twice
    assert result["projected_ms"] + sum(gap.values()) == pytest.approx(result["step_ms"])
    assert result["speedup_bound"] == pytest.approx(result["step_ms"] / result["projected_ms"])


def test_times_come_from_the_light_trace_when_its_operators_match(tmp_path, caplog):
    data = json.loads(TRACE.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    halved = [{**e, "ts": e["ts"] / 2, "dur": e["dur"] / 2} if e.get("cat") == "cpu_op" else e for e in events]
    light = tmp_path / "light.json"
    light.write_text(json.dumps({"traceEvents": halved}))
    shaped = wholestep.whole_step(TRACE, CEIL, timing=None)
    timed = wholestep.whole_step(TRACE, CEIL, timing=light)
    assert (shaped["timing"], timed["timing"]) == ("shaped trace", "light trace")
    assert timed["operator_ms"] == pytest.approx(shaped["operator_ms"] / 2)
    assert timed["step_ms"] == pytest.approx(shaped["step_ms"] / 2)  # the light trace's clock, not the shaped one's
    assert list(timed["rows"]["phase"]) == list(shaped["rows"]["phase"])  # phases from the shaped trace's notes
    assert timed["shaped_step_ms"] == pytest.approx(shaped["step_ms"])
    assert list(timed["rows"]["flops"]) == list(shaped["rows"]["flops"])  # the work is the shaped trace's
    assert timed["rows"].loc[timed["rows"]["op"] == "aten::cat", "projected_us"].iloc[0] == 5  # unknown: light time
    # a light trace of other operators is not joined: the shaped trace's times stay, with a warning
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"traceEvents": [e for e in halved if e.get("name") != "aten::view"]}))
    with caplog.at_level("WARNING"):
        kept = wholestep.whole_step(TRACE, CEIL, timing=other)
    assert kept["timing"] == "shaped trace" and kept["operator_ms"] == pytest.approx(shaped["operator_ms"])
    assert "differ" in caplog.text
    # "auto" takes the light trace written beside the trace after it, never a stale one
    import os
    import shutil

    trace = tmp_path / "step.trace.json"
    shutil.copy(TRACE, trace)
    shutil.copy(light, wholestep.timing_path(trace))
    assert wholestep.whole_step(trace, CEIL, steps=2)["timing"] == "light trace"
    later = wholestep.timing_path(trace).stat().st_mtime + 10
    os.utime(trace, (later, later))  # the trace recorded again since
    assert wholestep.whole_step(trace, CEIL, steps=2)["timing"] == "shaped trace"


def test_operator_table_rates_intensity_and_ceilings(result):
    table = result["table"]
    assert table["ms"].sum() == pytest.approx(result["operator_ms"])
    linear = table[table["op"] == "aten::linear"].iloc[0]
    assert linear["calls"] == 1 and linear["ceiling"] == 100.0 and linear["ceiling_unit"] == "GFLOP/s"
    assert linear["achieved_gflops"] == pytest.approx(ADDMM[0] / 100e-6 / 1e9)
    assert linear["intensity"] == pytest.approx(ADDMM[0] / ADDMM[1])
    assert linear["of_ceiling"] == pytest.approx(linear["achieved_gflops"] / 100.0)
    add = table[table["op"] == "aten::add_"].iloc[0]
    assert add["ceiling"] == 10.0 and add["achieved_gbs"] == pytest.approx(3 * 64 * 256 * 4 / 40e-6 / 1e9)
    found = {f.kind: f for f in wholestep.wholestep_findings(result, "fixture")}
    assert list(found) == ["whole step coverage", "whole step projection", "whole step between ops", "whole step gemm"]
    assert {f.workload for f in found.values()} == {"fixture"} and {f.stage for f in found.values()} == {"profiling"}
    assert found["whole step coverage"].values["coverage"] == result["coverage"]
    assert found["whole step projection"].values["gap_ms"] == result["gap_ms"]
    assert found["whole step projection"].sentence.startswith(  # which step is projected: the traced one, named
        f"fixture: at every ceiling its traced step ({result['step_ms']:.2f} ms) would take")
    gemm = found["whole step gemm"].values
    assert gemm["heaviest"] == "aten::linear" and gemm["heaviest_of_ceiling"] == pytest.approx(linear["of_ceiling"])
    # the average's basis: the GEMM-like operators' time at the ceiling over their time, both said
    compute = table[table["bound"] == "compute"]
    assert gemm["ms"] == pytest.approx(compute["ms"].sum())
    assert gemm["at_ceiling_ms"] == pytest.approx((compute["gflop"] / 100.0).sum() * 1e3)  # GFLOP / (GFLOP/s): s
    assert gemm["of_ceiling"] == pytest.approx(gemm["at_ceiling_ms"] / gemm["ms"])
    said = found["whole step gemm"].sentence
    assert "would take" in said and "time-weighted" not in said
    between = found["whole step between ops"]
    assert between.values["between_ops_ms"] == result["between_ops_by_phase_ms"]
    assert ("fixture: of the 0.39 ms a step between operators, forward 82%, backward 8%, loss 5%, optimizer 5%: most "
            "of it leads to forward") in between.sentence


def test_an_op_is_its_own_estimate_or_its_childrens_sum_whichever_is_larger():
    x = {"Input Dims": [[64, 64]], "Input type": ["float"]}
    size = 64 * 64 * 4
    children = [wholestep.Node("aten::bernoulli_", 1, 3, {"Input Dims": [[64, 64], []], "Input type": ["float", "Scalar"]}),
                wholestep.Node("aten::div_", 4, 2, {"Input Dims": [[64, 64], []], "Input type": ["float", "Scalar"]}),
                wholestep.Node("aten::mul", 6, 2, {"Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"]})]
    dropout = wholestep.Node("aten::dropout", 0, 10, x, children)
    assert wholestep.node_work(dropout, CEIL).bytes == size * (1 + 2 + 3)  # mask written; mask in place; x*mask
    relu = wholestep.Node("aten::relu", 0, 10, x, [wholestep.Node("aten::empty", 1, 1, {})])
    assert wholestep.node_work(relu, CEIL).bytes == 2 * size  # its own read + write, not the allocation's 0


def test_gemm_formulas_by_dtype_and_conv_backward():
    bf16 = {"Input Dims": [[8, 16], [16, 4]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}
    flops, moved, dtype = wholestep.kernel_work("aten::mm", bf16)
    assert (flops, moved, dtype) == (2 * 8 * 16 * 4, (8 * 16 + 16 * 4 + 8 * 4) * 2, "c10::BFloat16")
    node = wholestep.Node("aten::mm", 0.0, 10.0, bf16)
    assert wholestep.node_work(node, CEIL).unknown_us == 10.0  # no bf16 ceiling measured: no ceiling, not fp32's
    with_bf16 = wholestep.Ceilings({"fp32": 100.0, "bf16": 400.0}, 10.0)
    assert wholestep.node_work(node, with_bf16).unknown_us == 0
    back = {"Input Dims": [[2, 4, 8, 8], [2, 3, 8, 8], [4, 3, 3, 3]] + [[]] * 8,
            "Input type": ["float"] * 3 + ["ScalarList"] * 4 + ["Scalar", "ScalarList", "Scalar", "ScalarList"],
            "Concrete Inputs": ["", "", "", "[4]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1",
                                "[False, True, True]"]}
    flops, moved, _ = wholestep.kernel_work("aten::convolution_backward", back)
    assert flops == CONV_FLOPS  # the weight gradient only: output_mask says no input gradient
    assert moved == (512 + 384 + 108) * 4 + 108 * 4 + 4 * 4  # reads + grad weight + grad bias
    strided = {"Input Dims": [[1, 1, 7, 7], [2, 1, 3, 3]] + [[]] * 7, "Input type": ["float", "float"] + ["x"] * 7,
               "Concrete Inputs": ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]}
    flops, _, _ = wholestep.kernel_work("aten::convolution", strided)
    assert flops == conv_flops([1, 1, 7, 7], [2, 1, 3, 3], [1, 2, 3, 3]) == 2 * 2 * 9 * 9  # (7 - 3) // 2 + 1 = 3
    unrecorded = {"Input Dims": back["Input Dims"], "Input type": back["Input type"]}  # no Concrete Inputs
    node = wholestep.Node("aten::convolution_backward", 0.0, 10.0, unrecorded)
    work = wholestep.node_work(node, CEIL)  # padding unknown: the work is not guessed, nor called memory-bound
    assert (work.flops, work.unknown_us, work.compute_s, work.memory_s) == (0.0, 10.0, 0.0, 0.0)


def test_a_span_runs_in_the_dtype_of_its_gemm_not_of_the_cast_before_it():
    """Under autocast, aten::conv2d records its fp32 inputs; inside it, a cast, then the bf16 convolution."""
    fp32 = {"Input Dims": [[2, 3, 8, 8], [4, 3, 3, 3]], "Input type": ["float", "float"]}
    bf16 = {"Input Dims": [[2, 3, 8, 8], [4, 3, 3, 3]] + [[]] * 7,
            "Input type": ["c10::BFloat16"] * 2 + ["x"] * 7,
            "Concrete Inputs": ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]}
    cast = wholestep.Node("aten::_to_copy", 1, 2, {"Input Dims": [[2, 3, 8, 8]], "Input type": ["float"]})
    conv2d = wholestep.Node("aten::conv2d", 0, 10, fp32, [cast, wholestep.Node("aten::convolution", 4, 5, bf16)])
    with_bf16 = wholestep.Ceilings({"fp32": 100.0, "bf16": 400.0}, 10.0)
    work = wholestep.node_work(conv2d, with_bf16)
    assert work.dtype == "bf16" and work.flops == wholestep.kernel_work("aten::convolution", bf16)[0]
    copy_after = wholestep.Node("aten::relu", 0, 20, fp32, [conv2d, cast])  # a copy after the GEMM changes nothing
    assert wholestep.node_work(copy_after, with_bf16).dtype == "bf16"


def test_an_autograd_node_is_named_by_the_gemms_shapes_below_it():
    """ConvolutionBackward0 records only the gradient it takes; the convolution's shapes say which layer
    it is (what the full study's trial needs to rebuild it)."""
    grad = {"Input Dims": [[2, 4, 8, 8]], "Input type": ["float"]}
    back = {"Input Dims": [[2, 4, 8, 8], [2, 3, 8, 8], [4, 3, 3, 3]], "Input type": ["float"] * 3,
            "Concrete Inputs": ["", "", "", "[4]", "[1, 1]", "[1, 1]", "[1, 1]"]}  # stride, padding, dilation
    kernel = wholestep.Node("aten::convolution_backward", 1, 8, back)
    node = wholestep.Node(f"{wholestep.BACKWARD_PREFIX}ConvolutionBackward0", 0, 10, grad,
                          [wholestep.Node("ConvolutionBackward0", 0.5, 9, grad, [kernel])])
    assert wholestep.node_work(node, CEIL).shapes == "2x4x8x8; 2x3x8x8; 4x3x3x3"
    linear = wholestep.Node("aten::linear", 0, 10, {"Input Dims": [[8, 16], [4, 16], [4]], "Input type": ["float"] * 3},
                            [wholestep.Node("aten::addmm", 1, 8, {"Input Dims": [[4], [8, 16], [16, 4]],
                                                                  "Input type": ["float"] * 3})])
    assert wholestep.node_work(linear, CEIL).shapes == "8x16; 4x16; 4"  # a forward op keeps its own


def test_ceilings_from_notebook_00s_roofline():
    c = wholestep.Ceilings.from_roofline({"gemm_gflops_best": 120.0, "copy_gbs_best": 15.0,
                                          "gemm_gflops_bf16_best": 300.0, "threads": 4})
    assert (c.gemm_for("fp32"), c.gemm_for("bf16"), c.copy_gbs, c.threads) == (120.0, 300.0, 15.0, 4)
    with pytest.raises(CpuoptError, match="gemm_gflops_best"):
        wholestep.Ceilings.from_roofline({"copy_gbs": 1})


def test_primitive_roofline_from_a_log():
    import pandas as pd

    df = pd.DataFrame({"kind": ["convolution", "matmul", "eltwise"], "prop": ["forward_training"] * 3,
                       "data_type": ["f32"] * 3, "time_ms": [0.01, 0.02, 0.001],
                       "problem": ["mb2_ic3oc4_ih8oh8kh3sh1ph1_iw8ow8kw3sw1pw1", "4x16:16x8", "2x4x8x8"]})
    t = wholestep.primitive_roofline(df, CEIL).set_index("kind")
    # benchdnn's count: a 3x3 kernel with padding 1 on 8 positions takes 2 + 6 x 3 + 2 = 22 input taps a row, not 24:
    # the same count as the whole-step rows' for the trace's conv of this shape
    assert t.loc["convolution", "gflop"] * 1e9 == pytest.approx(CONV_FLOPS)
    assert t.loc["convolution", "mb"] * 1e6 == pytest.approx(CONV_BYTES)
    assert t.loc["matmul", "achieved_gflops"] == pytest.approx(2 * 4 * 16 * 8 / 0.02e-3 / 1e9)
    assert t.loc["eltwise", "achieved_gbs"] == pytest.approx(2 * 512 * 4 / 1e-6 / 1e9)
    assert pd.isna(t.loc["eltwise", "gflop"])
    assert t.loc["matmul", "of_gemm_ceiling"] == pytest.approx(t.loc["matmul", "achieved_gflops"] / 100.0)
    assert pd.isna(t.loc["matmul", "of_theoretical"])  # CEIL names no theoretical peak
    theory = wholestep.primitive_roofline(df, wholestep.Ceilings({"fp32": 100.0}, 10.0, 2, "t", {"fp32": 250.0}))
    assert theory.set_index("kind").loc["matmul", "of_theoretical"] == pytest.approx(
        t.loc["matmul", "achieved_gflops"] / 250.0)


def test_a_convolutions_taps_on_padding_are_not_work_as_benchdnn_counts():
    from cpuopt_helpers.profiledn.parse import conv_taps, parse_conv

    small = parse_conv("mb16_ic512oc512_ih4oh4kh3ph1")  # 4x4 out, 3x3 kernel, padding 1: 10 taps a row, not 12
    assert conv_taps(small) == 10 * 10
    assert conv_taps(parse_conv("mb1_ic8oc8_ih8oh8kh1")) == 64  # 1x1, no padding: every tap
    strided = parse_conv("mb1_ic3oc8_ih7oh4kh3sh2ph1")  # out 0..3 reads 2o-1+k of 0..6: the first and last lose one
    assert conv_taps(strided) == (2 + 3 + 3 + 2) ** 2
    dilated = parse_conv("mb1_ic3oc8_ih5oh5kh3dh1ph2")  # taps 2 apart, padding 2
    assert conv_taps(dilated) == sum(0 <= o - 2 + 2 * k < 5 for o in range(5) for k in range(3)) ** 2
    wider = {**parse_conv("mb1_ic8oc4_ih6oh6kh3ph1"), "oh": 8, "ow": 8}  # a deconvolution: its output is the loop's
    assert conv_taps(wider, deconvolution=True) == (2 + 5 * 3) ** 2 and conv_taps(wider) == sum(
        0 <= o - 1 + k < 6 for o in range(8) for k in range(3)) ** 2


def test_a_primitive_called_many_times_over_several_steps_runs_at_its_calls_work_over_their_time():
    """Three calls a step over two steps, 0.01 ms each: the work of six calls in 0.06 ms, not one call's."""
    import pandas as pd

    df = pd.DataFrame({"kind": ["matmul"] * 6, "prop": ["forward_training"] * 6, "data_type": ["f32"] * 6,
                       "time_ms": [0.01] * 6, "problem": ["4x16:16x8"] * 6})
    row = wholestep.primitive_roofline(df, CEIL, steps=2).iloc[0]
    call = 2 * 4 * 16 * 8
    assert row["achieved_gflops"] == pytest.approx(call / 0.01e-3 / 1e9)  # as one call alone runs
    assert (row["calls"], row["ms"], row["gflop"]) == (3, pytest.approx(0.03), pytest.approx(3 * call / 1e9))


def test_cli_whole_step_on_a_trace(tmp_path, capsys):
    roof = tmp_path / "roofline.json"
    roof.write_text(json.dumps({"gemm_gflops_best": 100.0, "copy_gbs_best": 10.0}))
    assert cli.main(["profile", str(TRACE), "--whole-step", "--roofline", str(roof), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["coverage"] == pytest.approx((356 - 10) / 356)
    assert set(out["gap_ms"]) == set(wholestep.CAUSES) and out["operators"]
    assert out["findings"][0].endswith("of the whole step is projected.")  # the findings' sentences
    assert cli.main(["profile", str(TRACE), "--whole-step", "--roofline", str(roof)]) == 0
    text = capsys.readouterr().out
    assert "coverage 97.2%" in text and "between ops" in text
    log = Path(__file__).parent / "fixtures" / "onednn" / "onednn_312_cnn_two_steps.log"
    assert cli.main(["profile", str(log), "--trace", str(TRACE), "--whole-step", "--roofline", str(roof),
                     "--json"]) == 0
    prims = json.loads(capsys.readouterr().out)["primitives"]
    conv = [p for p in prims if p["kind"] == "convolution"]
    assert conv and all(p["achieved_gflops"] > 0 and p["intensity"] > 0 for p in conv)
    assert cli.main(["profile", "--whole-step", "--workload", "cnn", str(TRACE)]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    (None, "cannot read trace"),
    ("not json", "cannot read trace"),
    ({"traceEvents": [{"ph": "M", "name": "process_name"}]}, "holds no operator spans"),
    ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 1, "args": {}}]},
     "has no input shapes"),
    ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 1}]}, "without its name, ts or dur"),
    ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": "soon", "dur": 1}]},
     "without its name, ts or dur"),
])
def test_bad_traces_are_one_line_and_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    roof = tmp_path / "roofline.json"
    roof.write_text(json.dumps({"gemm_gflops_best": 100.0, "copy_gbs_best": 10.0}))
    assert cli.main(["profile", str(path), "--whole-step", "--roofline", str(roof)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert cli.main(["profile", str(tmp_path), "--whole-step", "--roofline", str(roof)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert cli.main(["profile", "--whole-step", "--roofline", str(roof)]) == 2
    assert "needs a trace" in capsys.readouterr().err
    assert cli.main(["profile"]) == 2
    assert "name a oneDNN verbose log" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["cnn", "transformer", "rnn", "retinanet"])
def test_a_real_quick_step_is_covered(tmp_path, workload):
    """A real traced step of each built-in workload: at least 95% of its operators' time projected."""
    from cpuopt_helpers.config import RunConfig

    trace = tmp_path / f"{workload}.trace.json"
    traced, timed, _ = wholestep.capture(RunConfig(workload=workload, preset="quick", steps=5), trace, plain=False)
    assert traced["status"] == "ok", traced.get("reason")
    assert timed["status"] == "ok", timed.get("reason")
    light = wholestep.load_events(wholestep.timing_path(trace))
    assert not any("Input Dims" in (e.get("args") or {}) for e in light)  # the light trace records no shapes
    result = wholestep.whole_step(trace, CEIL)
    assert result["timing"] == "light trace"  # its operators matched the shaped trace's one to one
    assert result["steps"] == 5
    assert result["coverage"] >= 0.95, result["table"][result["table"]["bound"] == "unknown"].head()
    # the FLOPs read off the trace's shapes (padding included) agree with the worker's FLOP count (flops.py's formulas)
    assert result["gflop_per_step"] * 1e9 == pytest.approx(traced["flops_per_step"], rel=0.01)
    assert result["gb_per_step"] > 0
    assert result["projected_ms"] + sum(result["gap_ms"].values()) == pytest.approx(result["step_ms"])


def test_a_row_that_moves_no_data_but_holds_unknown_work_is_counted_once():
    """The unknown part keeps its time in the projection; only the rest is the 'no work' gap."""
    lists = {"Input Dims": [[]], "Input type": ["TensorList"]}
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::cat", "ts": 0, "dur": 10, "tid": 1, "args": lists},
              {"ph": "X", "cat": "cpu_op", "name": "aten::view", "ts": 1, "dur": 1, "tid": 1, "args": {}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::stack", "ts": 3, "dur": 4, "tid": 1, "args": lists}]
    light = [{**e, "dur": e["dur"] / 2, "ts": e["ts"] / 2} for e in events]
    for timing in (None, light):
        rows = wholestep.operator_rows(events, CEIL, timing)
        scale = 0.5 if timing else 1.0
        assert rows.loc[0, "bound"] == "no work" and rows.loc[0, "unknown_us"] == 4 * scale
        result = wholestep.project(rows, 1, CEIL, 10 * scale)
        assert result["gap_ms"]["no work"] * 1e3 == 6 * scale
        assert result["projected_ms"] + sum(result["gap_ms"].values()) == pytest.approx(result["step_ms"])


def test_the_step_composition_figure_fills_each_bar_with_the_step(result):
    from cpuopt_helpers import plots

    fig = plots.step_composition_figure({"fixture": result, "again": result})
    bars = [p for p in fig.axes[0].patches]
    per_bar = {}
    for bar in bars:
        per_bar[round(bar.get_y(), 3)] = per_bar.get(round(bar.get_y(), 3), 0.0) + bar.get_width()
    assert len(per_bar) == 2 and all(v == pytest.approx(1.0) for v in per_bar.values())  # 100% of the step each
    assert len(bars) == 2 * (4 + len(result["between_ops_by_phase_ms"]))
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels[0] == "at every ceiling" and "between ops: optimizer" in labels and len(labels) == len(set(labels))


def test_a_trace_that_names_no_step_count_says_its_times_are_for_the_whole_trace(tmp_path):
    trace = tmp_path / "t.json"
    events = json.loads(TRACE.read_text())  # without its .ops.json and without the Optimizer.step annotations
    events["traceEvents"] = [e for e in events["traceEvents"] if not str(e.get("name", "")).startswith("Optimizer.step")]
    trace.write_text(json.dumps(events))
    out = wholestep.whole_step(trace, CEIL)
    assert out["steps_known"] is False and wholestep.wholestep_findings(out)[0].kind == "whole step count unknown"
    assert "not per step" in wholestep.wholestep_findings(out)[0].sentence
    known = wholestep.whole_step(TRACE, CEIL)
    assert known["steps_known"] is True
    assert "whole step count unknown" not in {f.kind for f in wholestep.wholestep_findings(known)}


def test_gemm_rows_give_the_theoretical_peak_beside_the_measured_ceiling():
    ceil = wholestep.Ceilings({"fp32": 100.0}, 10.0, 2, "test", {"fp32": 400.0, "bf16": None})
    result = wholestep.whole_step(TRACE, ceil)
    table = result["table"]
    gemm = table[table["bound"] == "compute"]
    assert len(gemm) and (gemm["of_theoretical"] * 4).tolist() == pytest.approx(gemm["of_ceiling"].tolist())
    assert table.loc[table["bound"] != "compute", "of_theoretical"].isna().all()  # a share of FLOP/s only
    said = next(f for f in wholestep.wholestep_findings(result) if f.kind == "whole step gemm")
    assert said.values["of_theoretical"] == pytest.approx(said.values["of_ceiling"] / 4)
    assert f"and {said.values['of_theoretical']:.0%} of the theoretical peak" in said.sentence
    v = said.values  # the heaviest operator's two shares, each named
    assert (f"at {v['heaviest_of_ceiling']:.0%} of that ceiling and {v['heaviest_of_theoretical']:.0%} of the "
            "theoretical peak.") in said.sentence
    unknown = next(f for f in wholestep.wholestep_findings(wholestep.whole_step(TRACE, CEIL)) if f.kind == "whole step gemm")
    assert unknown.values["of_theoretical"] is None and "the theoretical peak is unknown here" in unknown.sentence
    from cpuopt_helpers.decisions import Finding

    mixed = Finding("x", "profiling", "whole step gemm", {**said.values, "no_ceiling_ms": 12.5})
    assert "(another 12.5 ms a step of them ran in a dtype with no ceiling measured)" in mixed.sentence
    old = {k: v for k, v in said.values.items() if k not in ("ms", "at_ceiling_ms", "no_ceiling_ms")}
    assert "on average (time-weighted)" in Finding("x", "profiling", "whole step gemm", old).sentence  # older records
    blind = wholestep.whole_step(TRACE, wholestep.Ceilings({}, 10.0, 2, "test", {"fp32": 400.0}))  # no GEMM ceiling
    assert "whole step gemm" not in [f.kind for f in wholestep.wholestep_findings(blind)]  # no share, no "nan%"
    low = wholestep.Ceilings({"fp32": 100.0}, 10.0, 2, "test", {"fp32": 1.0})  # a peak taken at far too low a clock
    above = next(f for f in wholestep.wholestep_findings(wholestep.whole_step(TRACE, low)) if f.kind == "whole step gemm")
    assert "of the theoretical peak (above it: the cores ran faster than the clock the peak was taken at)" in \
        above.sentence


def compiled_step_events(scale: float = 1.0) -> list[dict]:
    """One step compiled whole (--compile-scope step): Dynamo's forward region and AOTAutograd's
    backward, each a convolution (an extern call of the generated code) amid Inductor's own kernels,
    which the profiler does not see; the backward's graph span is a cpu_op here, as in some traces."""
    conv = {"Input Dims": [[2, 3, 8, 8], [4, 3, 3, 3]] + [[]] * 7, "Input type": ["float"] * 2 + ["x"] * 7,
            "Concrete Inputs": ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]}
    back = {"Input Dims": [[2, 4, 8, 8], [2, 3, 8, 8], [4, 3, 3, 3]] + [[]] * 8,
            "Input type": ["float"] * 3 + ["x"] * 8,
            "Concrete Inputs": ["", "", "", "[4]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1",
                                "[True, True, False]"]}
    spans = [("Torch-Compiled Region: 0/0", 0, 100, {}), ("CompiledFunction", 1, 98, {}),
             ("aten::convolution", 10, 50, conv),
             (f"{wholestep.BACKWARD_PREFIX}CompiledFunctionBackward", 200, 100, {}),
             ("CompiledFunctionBackward", 201, 98, {}), ("## Call CompiledFxGraph abc ##", 202, 96, {}),
             ("aten::convolution_backward", 210, 60, back)]
    return [{"ph": "X", "cat": "cpu_op", "name": n, "ts": ts * scale, "dur": dur * scale, "tid": 1, "args": a}
            for n, ts, dur, a in spans]


@pytest.mark.parametrize("light", [False, True])
def test_a_compiled_region_is_its_calls_and_its_own_code_not_one_gemm(light):
    """Counted as one row, a compiled region's time would all be GEMM time and its gap 'compute';
    split, its convolutions are rated on their own and Inductor's kernels keep their time as
    unknown work, in the region's phase, with no time between the parts."""
    scale = 0.5 if light else 1.0
    rows = wholestep.operator_rows(compiled_step_events(), CEIL, compiled_step_events(scale) if light else None)
    got = [(r.phase, r.op, r.time_us, r.bound) for r in rows.itertuples()]
    assert got == [("forward", "aten::convolution", 50 * scale, "memory"),
                   ("forward", wholestep.COMPILED_CODE, 50 * scale, "unknown"),
                   ("backward", "aten::convolution_backward", 60 * scale, "memory"),
                   ("backward", wholestep.COMPILED_CODE, 40 * scale, "unknown")]
    assert rows.loc[2, "flops"] == 2 * CONV_FLOPS
    result = wholestep.project(rows, 1, CEIL, 300 * scale)
    assert result["between_ops_ms"] * 1e3 == 100 * scale  # the wait between the regions alone
    assert result["between_ops_by_phase_ms"] == {"forward": 0.0, "backward": pytest.approx(0.1 * scale)}
    assert result["coverage"] == pytest.approx(110 / 200)
    assert result["projected_ms"] * 1e3 == pytest.approx(90 * scale + rows["ideal_us"].sum())
    assert result["gap_ms"]["unknown"] == 0  # Inductor's kernels: no gap claimed for them


def test_a_compiled_regions_parts_take_the_light_traces_times_scaled_where_their_calls_differ():
    light = compiled_step_events(0.5)
    light = [e for e in light if e["name"] != "aten::convolution"]  # its forward region records no call
    rows = wholestep.operator_rows(compiled_step_events(), CEIL, light)
    assert list(rows["time_us"]) == [25, 25, 30, 20]  # the shaped trace's parts, scaled to the light region
    assert list(rows["ts_us"])[:2] == [5, 0]


def test_operators_above_their_ceiling_are_said_by_bound():
    """A convolution beating the measured GEMM ceiling is no cache effect; a finding stored before
    the split (the share alone) reads as before."""
    from cpuopt_helpers.decisions import Finding
    from cpuopt_helpers.wording import render

    def said(values):
        return render(Finding("w", "profile", "whole step above ceiling", values))

    gemm = said({"share": 0.16, "compute": 0.15, "memory": 0.01})
    assert "15% in GEMM-like operators measured above the measured GEMM ceiling" in gemm and "DRAM" not in gemm
    old = said({"share": 0.05})
    assert "5% in operators measured above the DRAM copy rate" in old and "GEMM" not in old
    both = said({"share": 0.3, "compute": 0.1, "memory": 0.2})
    assert "10% in GEMM-like" in both and "and 20% in operators measured above the DRAM" in both


def test_the_shaped_traces_cost_is_said_only_where_it_was_slower():
    from cpuopt_helpers.decisions import Finding

    values = {"coverage": 0.9, "top_level_per_step": 40, "between_ops_share": 0.02, "step_ms": 339.0,
              "step_coverage": 0.88, "plain_step_ms": 314.0}
    slower = Finding("cnn", "profiling", "whole step coverage", dict(values, shaped_step_ms=360.0)).sentence
    assert "recording shapes stretched the step to 360 ms" in slower
    faster = Finding("cnn", "profiling", "whole step coverage", dict(values, shaped_step_ms=330.0)).sentence
    assert "stretched" not in faster and "the trace with shapes took 330 ms, not longer in this run" in faster


def test_the_operator_view_says_what_each_share_divides_by_and_leaves_no_cell_blank(result):
    view = wholestep.operator_view(result["table"])
    assert len(view) == len(result["table"]) and not view.isna().any().any()
    rows = {r["operator"]: r for r in view.to_dict(orient="records")}
    assert rows["aten::linear"]["of its measured ceiling"] == "21% of the fp32 GEMM ceiling"
    assert rows["aten::linear"]["of the theoretical peak"] == "peak unknown"  # CEIL states none
    assert rows["aten::add_"]["of its measured ceiling"] == "49% of the copy rate"
    assert rows["aten::add_"]["of the theoretical peak"] == "not compute-bound"
    assert rows["aten::cat"]["of its measured ceiling"] == "work unknown"
    assert rows["aten::view"]["of the theoretical peak"] == "no work (views, allocations)"
    assert rows["aten::add_"]["GFLOP/s"] == "not counted (not GEMM-like)" and rows["aten::add_"]["GB/s"] == 4.92
    assert rows["aten::cat"]["GFLOP/s"] == rows["aten::cat"]["GB/s"] == "work unknown"  # never a measured 0
    peak = dataclasses.replace(CEIL, theoretical_gflops={"fp32": 200.0})
    linear = wholestep.operator_view(wholestep.whole_step(TRACE, peak)["table"], rows=1).iloc[0]
    assert linear["of the theoretical peak"] == "10%"  # 21 GFLOP/s of 200
