"""The case-study kernels: the closed-form focal loss against torchvision's formula, and Lamb.

The value matrices run the eager kernels (fast). The compiled kernels are checked in a few cases
(slow: Inductor compiles them), each of which must see Inductor-compiled graphs run, so an eager
fallback cannot pass for a compiled run.
"""

import contextlib
import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from cpuopt_helpers.kernels import focal_loss
from cpuopt_helpers.kernels.focal_loss import reference_sigmoid_focal_loss, sigmoid_focal_loss

COMPILED_GRAPH = "## Call CompiledFxGraph"  # the record_function around every call of Inductor's compiled code


def pair(shape=(64, 80), positive_share=0.1, scale=3.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * scale).to(dtype)
    t = (torch.rand(shape, generator=g) < positive_share).to(dtype)
    return x, t


def values_and_grads(fn, x, t, reduction="sum", **kw):
    x = x.detach().clone().requires_grad_()
    loss = fn(x, t, reduction=reduction, **kw)
    (loss if loss.dim() == 0 else loss.sum()).backward()
    return loss.detach(), x.grad


def compiled_graphs_run(fn):
    """Run ``fn`` under torch's profiler: (its result, how many Inductor-compiled graphs ran in it)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = fn()
    return result, sum(e.count for e in prof.key_averages() if e.key.startswith(COMPILED_GRAPH))


@pytest.fixture
def fresh_focal_status(monkeypatch):
    """focal_loss as in a new process: auto has not decided yet, nothing compiled (restored afterwards)."""
    monkeypatch.setitem(focal_loss.STATUS, "compiled", None)
    monkeypatch.setitem(focal_loss.STATUS, "reason", "")
    monkeypatch.setattr(focal_loss, "_compiled", {})


@pytest.fixture
def fresh_compile(fresh_focal_status):
    """As above, and Dynamo forgets every compiled graph: this test compiles its own (Inductor's disk
    cache may make it quick) and cannot meet the recompile limit, past which Dynamo runs eager."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def cpp_compiler():
    """The C++ compiler Inductor would use here, or None (then torch.compile cannot work on CPU)."""
    from torch._inductor import cpp_builder

    try:
        return cpp_builder.get_cpp_compiler()
    except Exception:
        return None


def check_extreme_logits(loss, grad):
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    # a confidently wrong logit costs alpha_t * |x|, with gradient -+alpha_t
    torch.testing.assert_close(loss[[0, 3]], torch.tensor([25.0, 75.0]))
    torch.testing.assert_close(grad[[0, 3]], torch.tensor([-0.25, 0.75]))
    assert loss[1] == 0 and loss[2] == 0  # confidently right


EXTREME = (torch.tensor([-100.0, 100.0, -100.0, 100.0, -88.0, 88.0, 0.0]),
           torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("positive_share", [0.0, 0.1, 1.0])  # all-negative, detection-like, all-positive
def test_values_and_gradients_match_the_reference(reduction, positive_share):
    x, t = pair(positive_share=positive_share)
    ref_loss, ref_grad = values_and_grads(reference_sigmoid_focal_loss, x, t, reduction)
    loss, grad = values_and_grads(sigmoid_focal_loss, x, t, reduction, impl="eager")
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("alpha, gamma", [(0.25, 2.0), (0.5, 1.0), (-1.0, 2.0), (0.25, 0.0), (0.75, 3.5)])
def test_other_alpha_and_gamma(alpha, gamma):
    x, t = pair(seed=1)
    ref = values_and_grads(reference_sigmoid_focal_loss, x, t, alpha=alpha, gamma=gamma)
    mine = values_and_grads(sigmoid_focal_loss, x, t, alpha=alpha, gamma=gamma, impl="eager")
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_extreme_logits_give_no_inf_or_nan():
    check_extreme_logits(*values_and_grads(sigmoid_focal_loss, *EXTREME, "none", impl="eager"))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["detection-like, alpha 0.75, gamma 3.5", "extreme logits"])
def test_compiled_kernels_run_compiled_and_match(case, fresh_compile):
    """Two compiled cases (Inductor compiles per shape, alpha and gamma): a gamma taking the pow
    path against the reference, and logits of +-100 against the exact values. Both must run the
    compiled forward and backward graphs: an eager fallback fails here."""
    if case == "extreme logits":
        (loss, grad), graphs = compiled_graphs_run(
            lambda: values_and_grads(sigmoid_focal_loss, *EXTREME, "none", impl="compiled"))
        check_extreme_logits(loss, grad)
    else:
        x, t = pair(seed=1)
        kw = dict(alpha=0.75, gamma=3.5)
        ref = values_and_grads(reference_sigmoid_focal_loss, x, t, "mean", **kw)
        mine, graphs = compiled_graphs_run(lambda: values_and_grads(sigmoid_focal_loss, x, t, "mean",
                                                                    impl="compiled", **kw))
        for a, b in zip(mine, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert graphs >= 2, f"{graphs} compiled graphs ran; the compiled forward and backward should have"


def test_gradcheck_in_float64():
    x, t = pair(shape=(6, 5), seed=2, dtype=torch.float64)
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda v: sigmoid_focal_loss(v, t, impl="eager"), (x,))
    assert torch.autograd.gradcheck(lambda v: sigmoid_focal_loss(v, t, reduction="mean", impl="eager"), (x,))


def test_bf16_inputs_match_the_reference_at_bf16_precision():
    x, t = pair(seed=3)
    ref_loss, ref_grad = values_and_grads(reference_sigmoid_focal_loss, x, t)  # fp32 truth
    loss, grad = values_and_grads(sigmoid_focal_loss, x.bfloat16(), t.bfloat16(), impl="eager")
    assert loss.dtype == torch.bfloat16 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss.float(), ref_loss, rtol=2e-2, atol=1e-2)
    torch.testing.assert_close(grad.float(), ref_grad, rtol=2e-2, atol=1e-2)


@pytest.mark.slow
def test_auto_picks_a_working_kernel_and_says_which(fresh_compile):
    """What auto does on this machine: with a C++ compiler, torch.compile works and auto runs the
    compiled graphs; without one it says why and runs eager. The values are eager's either way."""
    x, t = pair()
    sigmoid_focal_loss(x, t)  # auto decides (and compiles for this shape where it can)
    (loss, grad), graphs = compiled_graphs_run(lambda: values_and_grads(sigmoid_focal_loss, x, t))
    eager = values_and_grads(sigmoid_focal_loss, x, t, impl="eager")
    if cpp_compiler():
        assert focal_loss.STATUS == {"compiled": True, "reason": ""}, focal_loss.STATUS
        assert graphs >= 2, f"auto says compiled, but {graphs} compiled graphs ran"
    else:
        assert focal_loss.STATUS["compiled"] is False and focal_loss.STATUS["reason"]
        assert graphs == 0
    torch.testing.assert_close(loss, eager[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, eager[1], rtol=1e-5, atol=1e-7)


def test_auto_falls_back_to_eager_and_says_why(fresh_focal_status, monkeypatch):
    """Where torch.compile fails (no compiler, an Inductor bug), auto keeps the reason and runs eager."""
    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler here\nsecond line")

    monkeypatch.setattr(torch, "compile", broken_compile)
    x, t = pair()
    loss, grad = values_and_grads(sigmoid_focal_loss, x, t)
    assert focal_loss.STATUS == {"compiled": False, "reason": "RuntimeError: no C++ compiler here"}
    eager = values_and_grads(sigmoid_focal_loss, x, t, impl="eager")
    torch.testing.assert_close(loss, eager[0], rtol=0, atol=0)
    torch.testing.assert_close(grad, eager[1], rtol=0, atol=0)


def test_bad_reduction_and_impl_are_refused():
    x, t = pair()
    with pytest.raises(ValueError, match="reduction must be one of none, mean, sum"):
        sigmoid_focal_loss(x, t, reduction="avg")
    with pytest.raises(ValueError, match="impl must be auto, compiled or eager"):
        sigmoid_focal_loss(x, t, impl="cuda")


def test_lamb_foreach_and_fused_equal_the_per_parameter_loop_and_the_formula():
    import copy

    from cpuopt_helpers.kernels.lamb import Lamb

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 6 * 6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = model.to(memory_format=torch.channels_last)
    with torch.no_grad():
        model[5].bias.zero_()  # a zero-norm parameter: trust ratio 1
    copies = [copy.deepcopy(model) for _ in range(3)]
    opts = [Lamb(m.parameters(), impl=impl) for m, impl in zip(copies, ("loop", "foreach", "fused"))]
    x = torch.randn(4, 3, 8, 8)
    for i in range(4):
        for m, opt in zip(copies, opts):
            opt.zero_grad(set_to_none=i % 2 == 0)  # fused: a new .grad goes back into its flat buffer
            m(x).pow(2).mean().backward()
            opt.step()
    for loop, foreach, fused in zip(*(m.parameters() for m in copies)):
        torch.testing.assert_close(loop, foreach)
        torch.testing.assert_close(loop, fused)
    conv = copies[2][0].weight  # a view into the flat buffer that kept its channels-last strides
    assert conv.is_contiguous(memory_format=torch.channels_last) and conv.stride() == copies[0][0].weight.stride()
    flat = opts[2]._flat[id(opts[2].param_groups[0])]
    assert conv.data_ptr() == flat["p"].data_ptr()
    # zero_grad(set_to_none=True) keeps each .grad a zeroed view into the flat buffer, and autograd
    # adds the next gradients there: no step copies gradients or allocates a model-sized update
    update = flat["u"].data_ptr()
    opts[2].zero_grad(set_to_none=True)
    assert conv.grad is not None and conv.grad.data_ptr() == flat["g"].data_ptr() and not flat["g"].any()
    copies[2](x).pow(2).mean().backward()
    assert conv.grad.data_ptr() == flat["g"].data_ptr() and flat["g"].any()
    opts[2].step()
    assert flat["u"].data_ptr() == update
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    x = torch.randn(4, 8)
    w0 = model[0].weight.detach().clone()
    # one step by hand, for the first weight
    m = copy.deepcopy(model)
    opt = Lamb(m.parameters(), impl="foreach", lr=0.1, weight_decay=0.0)
    m(x).pow(2).mean().backward()
    g = m[0].weight.grad.clone()
    opt.step()
    update = (0.1 * g / 0.1) / ((0.001 * g * g / 0.001).sqrt() + 1e-6)
    expected = w0 - 0.1 * (w0.norm() / update.norm()) * update
    torch.testing.assert_close(m[0].weight.detach(), expected)
    with pytest.raises(ValueError, match="loop, foreach, fused"):
        Lamb(model.parameters(), impl="cuda")


def test_a_deep_copied_lamb_keeps_its_implementation_and_trains_like_the_original():
    """ipex.optimize deep-copies the optimizer; torch's Optimizer copies only its defaults, state
    and groups, so the copy lost ``impl`` and failed at its first zero_grad."""
    import copy

    from cpuopt_helpers.kernels.lamb import Lamb

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    x = torch.randn(4, 8)
    for impl in ("loop", "fused"):
        m = copy.deepcopy(model)
        opt = Lamb(m.parameters(), impl=impl)
        twin = copy.deepcopy({"model": m, "opt": opt})  # one memo: the copy's groups hold the copied parameters
        assert twin["opt"].impl == impl and "_flat" not in twin["opt"].__dict__
        for mm, o in ((m, opt), (twin["model"], twin["opt"])):
            for _ in range(2):
                o.zero_grad(set_to_none=True)
                mm(x).pow(2).mean().backward()
                o.step()
        for a, b in zip(m.parameters(), twin["model"].parameters()):
            torch.testing.assert_close(a, b)


def test_the_kernel_benchmarks_say_when_a_compiled_kernel_fell_back(fresh_focal_status, monkeypatch):
    """Forced (torch.compile fails): the focal benchmark leaves its compiled row out and says why,
    the Lamb benchmark says its fused update ran eager, and notebook 08's findings name both."""
    from cpuopt_helpers.kernels import benchmark, lamb
    from cpuopt_helpers.stages import case_study

    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setattr(lamb, "STATUS", {"compiled": None, "reason": ""})  # as in a new process
    monkeypatch.setattr(lamb, "_compiled", None)
    focal = benchmark.focal(rounds=2, presets=("quick",), classes=(80,))
    assert {r["kernel"] for r in focal["rows"]} == {"reference", "closed-form eager"}
    assert focal["fallbacks"] == [{"what": "closed-form compiled", "fell_back_to": "eager",
                                   "reason": "RuntimeError: no C++ compiler here"}]
    fused = benchmark.lamb_here(["loop", "fused"], "quick", 2)
    assert fused["fallbacks"] == [{"what": "fused", "fell_back_to": "eager",
                                   "reason": "RuntimeError: no C++ compiler here"}]
    said = [f for f in case_study.focal_findings(focal, {}) + case_study.lamb_findings([fused])
            if f.kind == "kernel fell back"]
    assert [f.values["benchmark"] for f in said] == ["focal-loss", "Lamb"]
    assert said[0].sentence.startswith("focal-loss benchmark: closed-form compiled fell back to eager (RuntimeError")


def test_a_flop_counters_step_leaves_the_fused_lamb_update_compiled(monkeypatch):
    """The worker counts a step's FLOPs under a dispatch mode, where dynamo cannot trace: that step
    runs the update eager, and later steps still compile it (every run's fused Lamb fell back to
    eager for good before: 'found no compiled frames')."""
    from torch.utils.flop_counter import FlopCounterMode

    from cpuopt_helpers.kernels import lamb

    if cpp_compiler() is None:
        pytest.skip("no C++ compiler: torch.compile cannot work on CPU here")
    monkeypatch.setattr(lamb, "STATUS", {"compiled": None, "reason": ""})  # as in a new process
    monkeypatch.setattr(lamb, "_compiled", None)
    params = [torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.randn(4))]
    opt = lamb.Lamb(params, impl="fused")
    for counted in (True, False):
        for p in params:
            p.grad = torch.randn_like(p)
        with FlopCounterMode(display=False) if counted else contextlib.nullcontext():
            opt.step()
    assert lamb.STATUS == {"compiled": True, "reason": ""}


@pytest.mark.slow
def test_the_whole_step_compiled_trains_as_eager_and_runs_compiled_graphs(fresh_compile):
    """`--compile-scope step` (the climb's rung), with the paper's Lamb as a per-parameter loop (its
    step counts are Python ints): the losses follow eager's, the optimizer's step runs a compiled
    graph of its own, and nothing recompiles once warm."""
    if cpp_compiler() is None:
        pytest.skip("no C++ compiler here: torch.compile cannot run on CPU")
    from torch._dynamo.utils import counters

    from cpuopt_helpers.config import RunConfig
    from cpuopt_helpers.worker import prepare

    # the user's tiny MLP: the same graphs per step as any model, a fraction of the cold compile
    base = RunConfig(workload="tests.user_workloads:build", preset="quick", threads=2, optimizer="lamb")
    eager = prepare(base)
    expected = [eager.step()[0] for _ in range(5)]
    whole = prepare(base.replace(compile="default", compile_scope="step"))
    # warm-up: the optimizer's step compiles for an empty state, again for step count 1, then once with
    # the count dynamic (the worker's warm-up runs until steady, so these stay out of the timed steps)
    losses = [whole.step()[0] for _ in range(3)]
    graphs_warm = counters["stats"]["unique_graphs"]
    (fourth, fifth), graphs = compiled_graphs_run(lambda: [whole.step()[0] for _ in range(2)])
    assert losses + [fourth, fifth] == pytest.approx(expected, rel=1e-3)
    assert counters["stats"]["unique_graphs"] == graphs_warm  # no recompile once warm
    assert graphs >= 3 * 2  # per step at least: the forward with its loss, its backward, the optimizer's step
    _, optimizer_graphs = compiled_graphs_run(whole.optimizer.step)
    assert optimizer_graphs >= 1  # the optimizer's step alone runs compiled code


def test_inside_a_compiled_region_auto_traces_the_focal_expressions_into_that_graph(fresh_compile):
    """As the fused detection loss: within the whole step compiled, auto leaves the closed forms to
    the region's compiler (one graph, no probe), with the reference's values and gradients."""
    x, t = pair(seed=2)
    region = torch.compile(lambda x, t, reduction: sigmoid_focal_loss(x, t, reduction=reduction), fullgraph=True,
                           backend="aot_eager")
    ref = values_and_grads(reference_sigmoid_focal_loss, x, t, "mean")
    for a, b in zip(values_and_grads(region, x, t, "mean"), ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert focal_loss.STATUS["compiled"] is None and not focal_loss._compiled


@pytest.mark.parametrize("impl, compiled", [("fused", False), ("foreach", True)])
def test_the_whole_step_compiled_leaves_a_fused_optimizer_step_as_it_is(impl, compiled):
    """A fused step is one loop already (the package's Lamb) or closed to the compiler (torch's):
    compiled again, the fused Lamb went far slower. Any other step is compiled with the region."""
    from cpuopt_helpers.config import RunConfig
    from cpuopt_helpers.worker import prepare

    base = RunConfig(workload="tests.user_workloads:build", preset="quick", threads=2, optimizer="lamb",
                     optimizer_impl=impl, compile="default", compile_scope="step")
    step = prepare(base).optimizer.step
    assert hasattr(step, "_torchdynamo_orig_callable") is compiled


def test_the_frozen_batch_norm_benchmark_times_each_layer_as_the_step_meets_it():
    """Every FrozenBatchNorm2d of RetinaNet once, at its input's shape in a forward pass, with a backward only
    where the step has one (the frozen stem and first stage have none); both ways give the same values."""
    from cpuopt_helpers.fixes import FrozenBatchNorm2d
    from cpuopt_helpers.kernels import benchmark
    from cpuopt_helpers.workloads import retinanet

    layers = benchmark.frozen_bn_layers("quick")
    model = retinanet.build("quick").model
    assert len(layers) == sum(isinstance(m, FrozenBatchNorm2d) for m in model.modules())
    assert 0 < sum(layer["grad"] for layer in layers) < len(layers)
    assert all(not layer["grad"] for layer in layers[:2])  # the stem's, then layer1's first: frozen, no gradient
    x = torch.randn(layers[-1]["shape"])
    bn = layers[-1]["module"]
    ways = {}
    for mode in ("separate", "fused"):
        bn.mode = mode
        ways[mode] = bn(x)
    torch.testing.assert_close(ways["separate"], ways["fused"])
    out = benchmark.frozen_bn("quick", rounds=2)
    assert (out["layers"], out["with_backward"], out["rounds"]) == (len(layers), sum(lay["grad"] for lay in layers), 2)
    rows = {(r["kernel"], r["part"]): r for r in out["rows"]}
    assert set(rows) == {(k, p) for k in ("separate", "fused") for p in ("forward", "backward", "both")}
    assert rows[("separate", "both")]["speedup"] == 1.0 and rows[("fused", "both")]["median_ms"] > 0
    assert rows[("fused", "both")]["elements"] == sum(math.prod(layer["shape"]) for layer in layers)
