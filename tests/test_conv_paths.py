"""The next fix, tried (cpuopt_helpers.kernels.conv_paths): a convolution read back from a trace's
shapes, the GEMM form equal to the convolution in outputs and gradients, the paths each CPU gets,
and a real trial's shape on a tiny convolution (its timings are not asserted)."""

import pytest
import torch
import torch.nn.functional as F

from cpuopt_helpers import compare
from cpuopt_helpers.kernels import conv_paths


@pytest.mark.parametrize("shapes, stride, padding, groups", [
    ("2x2376x100x100; 2x256x100x100; 2376x256x3x3", 1, 1, 1),  # RetinaNet's P3 class head
    ("2x256x25x25; 2x256x50x50; 256x256x3x3", 2, 1, 1),         # P6 from P5: a stride-2 3x3
    ("2x1024x25x25; 2x512x50x50; 1024x512x1x1", 2, 0, 1),       # a bottleneck's downsample
    ("2x128x100x100; 2x128x100x100; 128x4x3x3", 1, 1, 32),      # ResNeXt's grouped 3x3
    ("2x64x400x400; 2x3x800x800; 64x3x7x7", 2, 3, 1),           # the stem
])
def test_a_convolution_is_read_back_from_its_backwards_shapes(shapes, stride, padding, groups):
    conv = conv_paths.from_shapes(shapes)
    assert (conv.stride, conv.padding, conv.groups) == (stride, padding, groups)
    x, w = (torch.empty(s) for s in (conv.input, conv.weight))
    assert F.conv2d(x[:1, :, :9, :9], w, stride=stride, padding=padding, groups=groups).shape[:2] == (1, conv.output[1])


def test_a_convolutions_work_leaves_out_the_taps_on_padding():
    conv = conv_paths.from_shapes("2x8x4x4; 2x4x4x4; 8x4x3x3")  # 3x3, padding 1, 4x4: 10 taps a row, not 12
    assert conv.padding == 1 and conv.gflop * 1e9 == 2 * 2 * 8 * 4 * 10 * 10
    strided = conv_paths.from_shapes("2x8x2x2; 2x4x4x4; 8x4x1x1")  # 1x1, stride 2: every tap on the input
    assert strided.gflop * 1e9 == 2 * 2 * 8 * 4 * 2 * 2


@pytest.mark.parametrize("shapes", ["2x256x50x50; 2x256x50x50", "2x256x50; 2x256x50x50; 256x256x3x3",
                                    "2x255x50x50; 2x256x50x50; 256x256x3x3", "2x256x7x7; 2x256x50x50; 256x256x3x3",
                                    "2x256x50x50; 2x256x50x50; 256x3x3x3"])
def test_shapes_that_are_no_convolutions_backward_are_refused(shapes):
    with pytest.raises(ValueError):
        conv_paths.from_shapes(shapes)


def test_the_command_line_refuses_bad_shapes_and_too_few_rounds_in_one_line(capsys):
    assert conv_paths.main(["2x256x50x50; 2x256x50x50"]) == 2
    assert conv_paths.main(["2x8x6x6; 2x4x6x6; 8x4x3x3", "--rounds", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("cpuopt: ") for line in err)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shapes", ["2x8x6x6; 2x4x6x6; 8x4x3x3", "2x8x3x3; 2x4x6x6; 8x4x3x3",
                                    "2x8x4x4; 2x4x7x7; 8x4x1x1", "2x8x6x6; 2x4x6x6; 8x4x1x1"])
def test_the_gemm_form_equals_the_convolution_in_outputs_and_gradients(shapes, channels_last):
    conv = conv_paths.from_shapes(shapes)
    t = conv_paths.tensors(conv, "fp32", channels_last=channels_last)
    x2, w2 = (t[k].detach().clone().requires_grad_() for k in ("x", "w"))
    y = conv_paths.gemm_form(t["x"], t["w"], conv)
    y.backward(t["grad"])
    ref = F.conv2d(x2, w2, stride=conv.stride, padding=conv.padding)
    ref.backward(t["grad"])
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(t["x"].grad, x2.grad)
    torch.testing.assert_close(t["w"].grad, w2.grad)
    if conv.weight[2:] == (1, 1):  # one multiply in the input's layout: its output in that layout too
        assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def test_bf16_is_tried_only_from_fp32_where_fast_and_the_gemm_form_only_ungrouped():
    plain = conv_paths.from_shapes("2x8x6x6; 2x4x6x6; 8x4x3x3")
    grouped = conv_paths.from_shapes("2x8x6x6; 2x8x6x6; 8x2x3x3")
    assert list(conv_paths.paths(plain, "fp32", bf16_fast=False)) == ["as run", "channels-last", "GEMM form"]
    assert "bf16 channels-last" in conv_paths.paths(plain, "fp32", bf16_fast=True)
    assert "bf16" not in conv_paths.paths(plain, "bf16", bf16_fast=True)  # the step ran bf16 already
    assert "GEMM form" not in conv_paths.paths(grouped, "fp32", bf16_fast=False)


def test_a_step_that_ran_channels_last_is_tried_as_run_in_it_and_against_nchw():
    plain = conv_paths.from_shapes("2x8x6x6; 2x4x6x6; 8x4x3x3")
    chosen = conv_paths.paths(plain, "fp32", bf16_fast=True, layout="channels-last")
    assert list(chosen) == ["as run", "NCHW", "GEMM form", "bf16", "bf16 NCHW"]
    assert chosen["as run"] == ("fp32", True, "kernel") and chosen["NCHW"] == ("fp32", False, "kernel")
    assert chosen["GEMM form"] == ("fp32", True, "gemm") and chosen["bf16 NCHW"] == ("bf16", False, "kernel")


def test_a_trial_times_every_path_against_the_one_the_step_ran():
    conv = conv_paths.from_shapes("2x16x8x8; 2x8x8x8; 16x8x3x3")
    said = []
    result = conv_paths.trial(conv, rounds=5, say=said.append, min_measure_s=0.005)
    assert len(said) == 5 and result["calls"] >= 1
    rows = {(r["path"], r["part"]): r for r in result["rows"]}
    assert set(rows) == {(p, part) for p in ("as run", "channels-last", "GEMM form")
                         for part in ("forward", "backward", "both")}
    assert rows[("as run", "both")]["speedup"] is None  # no ratio of a path against itself
    for (path, _), r in rows.items():
        assert r["median_ms"] > 0 and r["gflops"] > 0 and r["rounds"] == 5
        if path != "as run":
            assert r["verdict"] in compare.VERDICTS and r["speedup_low"] <= r["speedup"] <= r["speedup_high"]
