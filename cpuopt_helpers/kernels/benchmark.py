"""Kernel benchmarks of the case study: the focal loss, the whole detection loss and the Lamb optimizer.

``python -m cpuopt_helpers.kernels.benchmark focal [--json]`` times torchvision's focal
loss against the closed-form kernels at RetinaNet's logit shapes (anchors x classes of
the quick and standard presets, 80 and 601 classes): forward, backward and both,
interleaved round by round in one process, each kernel's speedup over the reference with
a 95% CI. ``... loss`` does the same for RetinaNet's whole loss as the workload computes it
(the model's output and the workload's targets at the standard and full presets, 264
classes): the composite loss with torchvision's focal loss, with the closed-form one, and
the loss in one pass (``loss=fused``). ``... lamb [--json]`` times Lamb on RetinaNet's
trainable parameters, each round a training step's optimizer work (``zero_grad``, backward's
gradients landing, ``step``): the per-parameter loop against the multi-tensor (foreach) and
fused updates, and IPEX's fused Lamb in the IPEX runtime (a second process, beside that
runtime's own loop: every speedup is a ratio measured inside one process). ``... frozen-bn
[--preset standard] [--json]`` times RetinaNet's frozen batch norms at their shapes in a step,
torchvision's multiply + add against one batch-norm call, forward and backward.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

# preset -> (image size, images per batch), as the RetinaNet workload's presets
PRESETS = {"quick": (64, 4), "standard": (256, 2), "full": (800, 2)}
FOCAL_KERNELS = ("reference", "closed-form eager", "closed-form compiled")
LOSS_KERNELS = ("composite", "composite, closed-form focal", "fused")


def anchors(size: int) -> int:
    """RetinaNet's anchors for one image: 9 per cell of P3-P7 (strides 8-128)."""
    return 9 * sum((-(-size // 2**level)) ** 2 for level in range(3, 8))


def focal_shapes(presets=("quick", "standard"), classes=(80, 601)) -> dict:
    return {f"{p} {c} classes": (anchors(PRESETS[p][0]) * PRESETS[p][1], c) for p in presets for c in classes}


def _time_focal(fn, x, t) -> tuple[float, float]:
    """Seconds of one forward and one backward (the loss summed, as the detector does)."""
    return _time_loss(lambda x, t: fn(x, t, reduction="sum"), x, t)


def _time_loss(fn, x, t) -> tuple[float, float]:
    """Seconds of one forward and one backward of a loss ``fn(x, t)``."""
    x = x.detach().clone().requires_grad_()
    start = time.perf_counter()
    loss = fn(x, t)
    mid = time.perf_counter()
    loss.backward()
    return mid - start, time.perf_counter() - mid


def _interleaved(kinds: dict, x, t, rounds: int, name: str, elements: int, timer=_time_focal) -> list[dict]:
    """Each kernel warmed up (and compiled) outside the clock, then timed round by round in turn (the
    order reversed every other round): the rows of forward, backward and both, each against the
    first kernel paired by round."""
    from cpuopt_helpers import compare, stats

    for fn in kinds.values():
        timer(fn, x, t)
        timer(fn, x, t)
    times = {k: [] for k in kinds}
    for r in range(rounds):
        for k in list(kinds) if r % 2 == 0 else list(kinds)[::-1]:  # alternated: none always first in a round
            times[k].append(timer(kinds[k], x, t))
    first, rows = next(iter(kinds)), []
    for k in kinds:
        for part, pick in (("forward", lambda s: s[0]), ("backward", lambda s: s[1]), ("both", sum)):
            mine, ref = [pick(s) for s in times[k]], [pick(s) for s in times[first]]
            ratio = compare.paired_ratio(mine, ref)  # the first kernel's time / this kernel's, paired by round
            rows.append({"shape": name, "elements": elements, "part": part, "kernel": k,
                         "median_ms": stats.summarize([s * 1e3 for s in mine])["median"],
                         "speedup": ratio["ratio"], "speedup_low": ratio["ci_low"],
                         "speedup_high": ratio["ci_high"], "verdict": ratio["verdict"], "rounds": ratio["n"]})
    return rows


def focal(rounds: int = 15, dtype: str = "fp32", presets=("quick", "standard"), classes=(80, 601)) -> dict:
    from cpuopt_helpers.kernels import focal_loss

    kinds = {"reference": focal_loss.reference_sigmoid_focal_loss,
             "closed-form eager": lambda x, t, **kw: focal_loss.sigmoid_focal_loss(x, t, impl="eager", **kw),
             "closed-form compiled": lambda x, t, **kw: focal_loss.sigmoid_focal_loss(x, t, impl="compiled", **kw)}
    fallbacks = []
    if not focal_loss._compiled_works():  # torch.compile fails here: the workload's focal=fast runs eager, said so
        del kinds["closed-form compiled"]
        fallbacks.append({"what": "closed-form compiled", "fell_back_to": "eager",
                          "reason": focal_loss.STATUS["reason"]})
    kind = torch.float32 if dtype == "fp32" else torch.bfloat16
    rows = []
    for name, shape in focal_shapes(presets, classes).items():
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(shape, generator=g) * 3).to(kind)
        t = (torch.rand(shape, generator=g) < 0.01).to(kind)  # detection: few positive anchors
        rows += _interleaved(kinds, x, t, rounds, name, shape[0] * shape[1])
    return {"dtype": dtype, "threads": torch.get_num_threads(), "rounds": rounds, "rows": rows, "fallbacks": fallbacks}


def detection_loss(rounds: int = 10, presets=("standard", "full"), classes: int = 264) -> dict:
    """RetinaNet's loss as the workload computes it, forward and backward, at each preset's output
    shape with the workload's own targets: the composite loss (torchvision's focal loss, then the
    closed-form one) against the loss in one pass."""
    from cpuopt_helpers.kernels import detection_loss as fused
    from cpuopt_helpers.kernels import focal_loss
    from cpuopt_helpers.workloads import retinanet

    kinds = dict(zip(LOSS_KERNELS, (retinanet.detection_loss(focal_loss.reference_sigmoid_focal_loss),
                                    retinanet.detection_loss(focal_loss.sigmoid_focal_loss), fused.detection_loss)))
    fallbacks = [{"what": what, "fell_back_to": "eager", "reason": module.STATUS["reason"]}
                 for what, module in (("closed-form focal", focal_loss), ("fused", fused))
                 if not module._compiled_works()]  # auto runs eager there: measured, and said
    rows = []
    for preset in presets:
        size, batch = PRESETS[preset]
        g = torch.Generator().manual_seed(0)
        targets = retinanet.synthetic_targets(retinanet.anchors(size), size, classes, batch, g)
        outputs = torch.randn(batch, targets.shape[1], classes + 4, generator=g) * 3
        rows += _interleaved(kinds, outputs, targets, rounds, f"{preset} {classes} classes",
                             batch * targets.shape[1] * classes, _time_loss)
    return {"dtype": "fp32", "threads": torch.get_num_threads(), "rounds": rounds, "rows": rows,
            "fallbacks": fallbacks}


def lamb_parameters(preset: str) -> list[torch.nn.Parameter]:
    """RetinaNet's trainable parameters (torchvision's default: 3 backbone stages), with gradients."""
    from cpuopt_helpers.workloads.retinanet import RetinaNet

    params = [p for p in RetinaNet(preset, 80, 3, "separate").parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(0)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-3
    return params


def _lamb(kind: str, params):
    if kind == "ipex fused":
        from cpuopt_helpers.runtimes import import_ipex

        ipex = import_ipex()
        opt = ipex.optim._lamb.Lamb(params, lr=1e-3)
        _, opt = ipex.optimize(torch.nn.ParameterList(params), optimizer=opt, dtype=torch.float32,
                               weights_prepack=False, inplace=True)
        return opt
    from cpuopt_helpers.kernels.lamb import Lamb

    return Lamb(params, lr=1e-3, impl=kind)


def land_gradients(opt, grads: list[torch.Tensor]) -> None:
    """What a training step does to the gradients before ``opt.step()``: ``zero_grad`` as the
    worker calls it, then backward's new gradients land as autograd lands them (taken as the
    ``.grad`` where there is none, added into the ``.grad`` that is there)."""
    opt.zero_grad(set_to_none=True)
    params = [p for group in opt.param_groups for p in group["params"]]
    with torch.no_grad():
        for p, g in zip(params, grads):
            new = g.clone()  # backward's own output
            if p.grad is None:
                p.grad = new
            else:
                p.grad.add_(new)


def lamb_here(kinds: list[str], preset: str, rounds: int) -> dict:
    from cpuopt_helpers import compare, stats
    from cpuopt_helpers.kernels import lamb as lamb_kernels

    optimizers = {k: _lamb(k, lamb_parameters(preset)) for k in kinds}
    grads = [p.grad.clone() for p in lamb_parameters(preset)]
    for opt in optimizers.values():  # the first step allocates the state: outside the clock
        opt.step()
    times = {k: [] for k in kinds}
    for r in range(rounds):
        for k in kinds if r % 2 == 0 else kinds[::-1]:  # alternated: no kernel always runs first in a round
            opt = optimizers[k]
            start = time.perf_counter()
            land_gradients(opt, grads)
            opt.step()
            times[k].append(time.perf_counter() - start)
    params = optimizers[kinds[0]].param_groups[0]["params"]
    fell = "fused" in kinds and lamb_kernels.STATUS["compiled"] is False  # the fused update ran eager: said so
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "preset": preset,
           "tensors": len(params), "elements": sum(p.numel() for p in params), "kernels": {},
           "fallbacks": [{"what": "fused", "fell_back_to": "eager", "reason": lamb_kernels.STATUS["reason"]}]
           if fell else []}
    for k in kinds:
        ratio = compare.paired_ratio(times[k], times[kinds[0]])  # the loop's time / this kernel's, paired by round
        out["kernels"][k] = {"median_ms": stats.summarize([t * 1e3 for t in times[k]])["median"],
                             "speedup_vs_loop": ratio["ratio"], "ci": [ratio["ci_low"], ratio["ci_high"]],
                             "verdict": ratio["verdict"], "rounds": ratio["n"]}
    return out


def frozen_bn_layers(preset: str) -> list[dict]:
    """Every FrozenBatchNorm2d of RetinaNet at the preset as one training step's forward meets it:
    the module, its input's shape, and whether the backward passes through it (its input needs a
    gradient: not in the frozen stem and first stage, whose inputs need none)."""
    from cpuopt_helpers.fixes import FrozenBatchNorm2d
    from cpuopt_helpers.workloads import retinanet

    w = retinanet.build(preset)
    seen = []

    def hook(module, args, _):
        seen.append({"module": module, "shape": tuple(args[0].shape), "grad": args[0].requires_grad})

    hooks = [m.register_forward_hook(hook) for m in w.model.modules() if isinstance(m, FrozenBatchNorm2d)]
    w.model.train()
    w.model(w.make_batch(w.default_batch_size)[0])
    for h in hooks:
        h.remove()
    return seen


def _time_frozen_bn(mode: str, layers: list[dict], data) -> tuple[float, float]:
    """Seconds of every layer's forward in ``mode``, and of the backward through those with one."""
    forward = backward = 0.0
    for layer, x, g in zip(layers, *data):
        layer["module"].mode = mode
        x = x.detach().requires_grad_(layer["grad"])
        start = time.perf_counter()
        y = layer["module"](x)
        mid = time.perf_counter()
        if layer["grad"]:
            torch.autograd.grad(y, x, g)
        forward, backward = forward + mid - start, backward + time.perf_counter() - mid
    return forward, backward


def frozen_bn(preset: str = "standard", rounds: int = 10) -> dict:
    """RetinaNet's frozen batch norms at the preset, fp32, each at its input's shape in the step:
    torchvision's multiply + add (``separate``) against one batch-norm call (``fused``), every
    layer's forward (and backward where the step has one) a round, interleaved."""
    layers = frozen_bn_layers(preset)
    g = torch.Generator().manual_seed(0)
    data = ([torch.randn(layer["shape"], generator=g) for layer in layers],
            [torch.randn(layer["shape"], generator=g) for layer in layers])
    kinds = {mode: mode for mode in ("separate", "fused")}  # each "kernel" is the mode _time_frozen_bn sets
    rows = _interleaved(kinds, layers, data, rounds, f"{preset} RetinaNet's frozen batch norms",
                        sum(math.prod(layer["shape"]) for layer in layers), _time_frozen_bn)
    return {"dtype": "fp32", "threads": torch.get_num_threads(), "rounds": rounds, "preset": preset,
            "layers": len(layers), "with_backward": sum(layer["grad"] for layer in layers), "rows": rows}


def lamb(preset: str = "standard", rounds: int = 20) -> list[dict]:
    """This runtime's loop, foreach and fused; then the IPEX runtime's loop and fused Lamb (or why not)."""
    from cpuopt_helpers import runtimes

    results = [lamb_here(["loop", "foreach", "fused"], preset, rounds)]
    status = runtimes.ipex_status()
    if not status["available"]:
        return results + [{"skipped": status["reason"]}]
    from cpuopt_helpers.runtimes import run_json_module

    try:
        return results + [run_json_module("cpuopt_helpers.kernels.benchmark", ["lamb-ipex", "--preset", preset,
                                                                              "--rounds", str(rounds)],
                                          "IPEX's fused Lamb", python=status["python"], timeout_s=900)]
    except RuntimeError as exc:
        return results + [{"error": str(exc)[-500:]}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="focal-loss, detection-loss, Lamb and frozen batch-norm kernel "
                                     "benchmarks")
    parser.add_argument("what", choices=("focal", "loss", "lamb", "lamb-ipex", "frozen-bn"))
    parser.add_argument("--rounds", type=int, help="interleaved rounds (focal 15, loss 10, lamb 20)")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="focal: input dtype")
    parser.add_argument("--preset", default="standard", help="lamb, frozen-bn: the RetinaNet preset whose parameters "
                        "are updated, whose frozen batch norms are timed")
    parser.add_argument("--presets", help="focal, loss: presets whose shapes are timed (quick,standard; standard,full)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.what == "lamb-ipex":
        print(json.dumps(lamb_here(["loop", "ipex fused"], args.preset, args.rounds or 20)))
        return 0
    if args.what == "frozen-bn":
        out = frozen_bn(args.preset, args.rounds or 10)
        print(json.dumps(out) if args.json else "\n".join(
            f"{r['part']:<8} {r['kernel']:<9} {r['median_ms']:8.2f} ms a step  {r['speedup']:5.2f}x the separate ops "
            f"(95% CI {r['speedup_low']:.2f}-{r['speedup_high']:.2f}): {r['verdict']}" for r in out["rows"]))
        return 0
    if args.what in ("focal", "loss"):
        if args.what == "focal":
            out = focal(args.rounds or 15, args.dtype, tuple((args.presets or "quick,standard").split(",")))
        else:
            out = detection_loss(args.rounds or 10, tuple((args.presets or "standard,full").split(",")))
        if args.json:
            print(json.dumps(out))
            return 0
        print(f"{'focal loss' if args.what == 'focal' else 'RetinaNet loss'}, {out['dtype']}, {out['threads']} "
              f"threads, {out['rounds']} interleaved rounds")
        for f in out["fallbacks"]:
            print(f"{f['what']}: it fell back to {f['fell_back_to']} here ({f['reason']})")
        for r in out["rows"]:
            print(f"{r['shape']:<22} {r['part']:<8} {r['kernel']:<28} {r['median_ms']:9.3f} ms  "
                  f"{r['speedup']:5.2f}x the {FOCAL_KERNELS[0] if args.what == 'focal' else LOSS_KERNELS[0]} "
                  f"(95% CI {r['speedup_low']:.2f}-{r['speedup_high']:.2f}): {r['verdict']}")
        return 0
    out = lamb(args.preset, args.rounds or 20)
    if args.json:
        print(json.dumps(out))
        return 0
    for r in out:
        if "kernels" not in r:
            print(f"IPEX runtime: {r.get('skipped') or r.get('error')}")
            continue
        print(f"torch {r['torch']}, {r['threads']} threads, RetinaNet[{r['preset']}]: {r['tensors']} tensors, "
              f"{r['elements']:,} parameters")
        for k, v in r["kernels"].items():
            print(f"  {k:<12} {v['median_ms']:8.2f} ms/step  {v['speedup_vs_loop']:5.2f}x the loop "
                  f"(95% CI {v['ci'][0]:.2f}-{v['ci'][1]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
