"""RetinaNet's loss in one pass (``loss=fused``) against the composite loss it replaces.

Eager runs check values and gradients (fast); the compiled loop is checked once (slow: Inductor
compiles it), and must be seen to run compiled so an eager fallback cannot pass for it.
"""

import functools

import pytest
import torch

from cpuopt_helpers.kernels import detection_loss as fused
from cpuopt_helpers.kernels.focal_loss import reference_sigmoid_focal_loss
from cpuopt_helpers.workloads import build_workload, retinanet
from tests.test_kernels import compiled_graphs_run, cpp_compiler


@pytest.fixture(scope="module")
def batch():
    """Outputs of the quick preset's model and its targets, a few anchors marked ignored (-2)."""
    w = build_workload("retinanet", "quick", {})
    images, targets = w.make_batch(2)
    targets[0, :5, 0] = -2.0
    with torch.no_grad():
        outputs = w.model(images) * 20  # logits far from the prior as well as near it
    assert {-2.0, -1.0} <= set(targets[..., 0].unique().tolist()) and (targets[..., 0] >= 0).any()
    return outputs, targets


@pytest.fixture
def fresh_status(monkeypatch):
    monkeypatch.setitem(fused.STATUS, "compiled", None)
    monkeypatch.setitem(fused.STATUS, "reason", "")
    monkeypatch.setattr(fused, "_compiled", {})


def loss_and_grad(fn, outputs, targets):
    x = outputs.detach().clone().requires_grad_()
    loss = fn(x, targets)
    loss.backward()
    return loss.detach(), x.grad


def composite(alpha=0.25, gamma=2.0):
    return retinanet.detection_loss(functools.partial(reference_sigmoid_focal_loss, alpha=alpha, gamma=gamma))


@pytest.mark.parametrize("alpha, gamma", [(0.25, 2.0), (0.75, 3.5), (-1.0, 0.0)])
def test_values_and_gradients_match_the_composite_loss(batch, alpha, gamma):
    mine = loss_and_grad(functools.partial(fused.detection_loss, alpha=alpha, gamma=gamma, impl="eager"), *batch)
    ref = loss_and_grad(composite(alpha, gamma), *batch)
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_ignored_anchors_get_no_loss_and_no_gradient(batch):
    outputs, targets = batch
    changed = outputs.clone()
    changed[0, :5] += 100.0  # the ignored anchors' logits and deltas, far off
    loss, grad = loss_and_grad(functools.partial(fused.detection_loss, impl="eager"), changed, targets)
    torch.testing.assert_close(loss, loss_and_grad(functools.partial(fused.detection_loss, impl="eager"),
                                                   *batch)[0])
    assert (grad[0, :5] == 0).all() and (grad != 0).any()


def test_gradcheck_in_float64(batch):
    outputs, targets = batch
    x = outputs[:, :10].double().clone().requires_grad_()  # 2 x 10 x 84 inputs: each perturbed twice
    t = targets[:, :10].double()
    t[0, 0, 0], t[1, 1, 0] = 3.0, 0.0  # two positives among the first anchors
    assert torch.autograd.gradcheck(lambda v: fused.detection_loss(v, t, impl="eager"), (x,))


def test_bf16_outputs_give_bf16_gradients_at_bf16_precision(batch):
    ref_loss, ref_grad = loss_and_grad(composite(), *batch)
    loss, grad = loss_and_grad(functools.partial(fused.detection_loss, impl="eager"), batch[0].bfloat16(), batch[1])
    assert loss.dtype == torch.bfloat16 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss.float(), ref_loss, rtol=2e-2, atol=1e-2)
    torch.testing.assert_close(grad.float(), ref_grad, rtol=2e-2, atol=1e-3)


def test_the_backward_scales_the_gradient_and_leaves_it_for_another(batch):
    x = batch[0].clone().requires_grad_()
    loss = fused.detection_loss(x, batch[1], impl="eager")
    (first,) = torch.autograd.grad(loss * 3, x, retain_graph=True)
    (second,) = torch.autograd.grad(loss, x)
    torch.testing.assert_close(first, 3 * second)


def test_the_workload_option_trains_on_the_fused_loss(batch, monkeypatch):
    monkeypatch.setitem(fused.STATUS, "compiled", False)  # auto's verdict: eager
    w = build_workload("retinanet", "quick", {"loss": "fused", "focal": "reference"})
    torch.testing.assert_close(w.loss_fn(*batch), composite()(*batch), rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="impl must be auto, compiled or eager"):
        fused.detection_loss(*batch, impl="fast")


def test_auto_falls_back_to_eager_and_says_why(batch, fresh_status, monkeypatch):
    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler here\nsecond line")

    monkeypatch.setattr(torch, "compile", broken_compile)
    loss, grad = loss_and_grad(fused.detection_loss, *batch)
    assert fused.STATUS == {"compiled": False, "reason": "RuntimeError: no C++ compiler here"}
    eager = loss_and_grad(functools.partial(fused.detection_loss, impl="eager"), *batch)
    torch.testing.assert_close(loss, eager[0], rtol=0, atol=0)
    torch.testing.assert_close(grad, eager[1], rtol=0, atol=0)


@pytest.mark.slow
def test_the_compiled_loop_runs_compiled_and_matches(batch, fresh_status):
    """auto on this machine: with a C++ compiler it runs Inductor's graph, equal to the composite
    loss (the anchors' losses summed by torch, not by the loop's running sums); without one it says
    why and runs eager."""
    import torch._dynamo

    torch._dynamo.reset()
    fused.detection_loss(*batch)  # auto decides, and compiles for this shape where it can
    (loss, grad), graphs = compiled_graphs_run(lambda: loss_and_grad(fused.detection_loss, *batch))
    if cpp_compiler():
        assert fused.STATUS == {"compiled": True, "reason": ""} and graphs >= 1, (fused.STATUS, graphs)
    else:
        assert fused.STATUS["compiled"] is False and fused.STATUS["reason"] and graphs == 0
    ref = loss_and_grad(composite(), *batch)
    torch.testing.assert_close(loss, ref[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, ref[1], rtol=1e-5, atol=1e-7)
    torch._dynamo.reset()


def test_the_loss_benchmark_times_every_kernel_in_paired_rounds_and_says_what_fell_back(fresh_status, monkeypatch):
    """Forced (torch.compile fails): the benchmark still times the three losses, eager, and says so."""
    from cpuopt_helpers.kernels import benchmark, focal_loss

    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setitem(focal_loss.STATUS, "compiled", None)
    monkeypatch.setitem(focal_loss.STATUS, "reason", "")
    out = benchmark.detection_loss(rounds=3, presets=("quick",), classes=80)
    assert [f["what"] for f in out["fallbacks"]] == ["closed-form focal", "fused"]
    rows = {(r["kernel"], r["part"]): r for r in out["rows"]}
    assert set(rows) == {(k, p) for k in benchmark.LOSS_KERNELS for p in ("forward", "backward", "both")}
    assert rows[("composite", "both")]["speedup"] == 1.0 and rows[("fused", "both")]["rounds"] == 3
    assert rows[("fused", "both")]["elements"] == 4 * len(retinanet.anchors(64)) * 80


def test_inside_a_compiled_region_auto_traces_its_expressions_into_that_graph(batch, fresh_status):
    """The whole step compiled (``--compile-scope step``): auto must neither probe (its probe makes a
    tensor that requires grad, which Dynamo cannot trace: the region broke in two) nor call its own
    compiled loop, but leave the expressions to the region's compiler, with the same value and gradient."""
    import torch._dynamo

    torch._dynamo.reset()
    outputs, targets = batch
    region = torch.compile(lambda x, t: fused.detection_loss(x, t), fullgraph=True, backend="aot_eager")
    for a, b in zip(loss_and_grad(region, outputs, targets), loss_and_grad(composite(), outputs, targets)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert fused.STATUS["compiled"] is None and not fused._compiled  # no probe, no compiled loop of its own
