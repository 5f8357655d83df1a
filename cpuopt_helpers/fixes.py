"""The case study's fixes as transforms any model can take.

The paper sped up RetinaNet training by changing how frozen batch norm and the focal loss
run, not what they compute. Here each fix is a function over any ``nn.Module`` (or a loss
chosen by name), so a user's own model can take them:

- ``freeze_batch_norm(model)``: every ``nn.BatchNorm2d`` becomes a ``FrozenBatchNorm2d``
  holding its statistics and affine parameters as buffers (torchvision's detection models
  train this way). This changes training: the statistics no longer follow the batch;
- ``set_batch_norm_mode(model, "fused")``: frozen batch norm as one ``batch_norm`` call
  instead of torchvision's multiply + add (``"separate"``);
- ``fold_batch_norm(model, example_inputs)``: each frozen batch norm whose input is only a
  convolution's output is folded into that convolution, anew at every step (weight x scale,
  bias x scale + shift), so the convolution's gradients equal those of the separate ops;
- ``compile_regions(model)``: after folding, each block that holds folded convolutions
  (a ResNet bottleneck: conv + frozen BN + ReLU, three times, and the residual add) becomes one
  ``torch.compile`` region, so Inductor runs each convolution through oneDNN and fuses the
  folded bias, the ReLU and the add into one pass over the activations (the paper's fused
  conv + BN + ReLU, which stock PyTorch has no training kernel for);
- ``focal_loss("fast")``: the closed-form sigmoid focal loss in place of torchvision's;
- ``loss="fused"`` (RetinaNet's own option, not a transform: its targets' layout is the
  workload's): the focal and box losses and their gradient in one compiled pass from the
  class labels (``cpuopt_helpers.kernels.detection_loss``), the paper's custom-kernel fix
  carried to the whole loss.

A workload declares which fixes apply through its options (``OPTIONS``: a ``frozen_bn``,
``focal`` or ``loss`` keyword of its ``build``) and applies them with ``frozen_batch_norm`` and
``focal_loss``; notebook 08 measures every fix a workload declares and names those it does not.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from cpuopt_helpers.errors import CpuoptError

# option -> (its values, the fix the recipe takes among them); the first value of each is the unfixed one
OPTIONS = {
    "frozen_bn": (("none", "separate", "fused", "folded", "compiled"), "fused"),
    "focal": (("reference", "fast"), "fast"),
    "loss": (("composite", "fused"), "fused"),
}
BN_MODES = ("separate", "fused", "folded", "compiled")  # compiled: folded, each block one compiled region


class FrozenBatchNorm2d(nn.Module):
    """Batch norm with fixed statistics and affine parameters (buffers, never trained).

    ``separate`` computes it as torchvision does, ``x * scale + shift`` (two elementwise
    passes over the activations, forward and backward); ``fused`` makes it one batch-norm
    call in inference mode, which oneDNN runs as a single kernel; ``folded`` passes its input
    through, because the convolution before it applies it (``fold_batch_norm``).
    """

    def __init__(self, channels: int, mode: str = "separate", eps: float = 1e-5):
        super().__init__()
        self.mode, self.eps = mode, eps
        self.register_buffer("weight", torch.ones(channels))
        self.register_buffer("bias", torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    @classmethod
    def from_batch_norm(cls, bn: nn.BatchNorm2d, mode: str = "separate") -> "FrozenBatchNorm2d":
        frozen = cls(bn.num_features, mode, bn.eps)
        with torch.no_grad():
            if bn.affine:
                frozen.weight.copy_(bn.weight)
                frozen.bias.copy_(bn.bias)
            if bn.track_running_stats:
                frozen.running_mean.copy_(bn.running_mean)
                frozen.running_var.copy_(bn.running_var)
        return frozen

    def scale_shift(self) -> tuple[torch.Tensor, torch.Tensor]:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        return scale, self.bias - self.running_mean * scale

    def forward(self, x):
        if self.mode == "folded":
            return x
        if self.mode == "fused":
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        scale, shift = self.scale_shift()
        return x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, mode={self.mode}, eps={self.eps}"


class FoldedConv2d(nn.Conv2d):
    """A Conv2d that applies the frozen batch norm after it: weight x scale and bias x scale +
    shift, computed anew at every call (the parameters stay the conv's own, trained as before)."""

    folded_bn: FrozenBatchNorm2d  # set by fold_batch_norm; not a submodule (it stays where it was)

    def forward(self, x):
        scale, shift = self.folded_bn.scale_shift()
        weight = self.weight * scale.reshape(-1, 1, 1, 1)
        bias = shift if self.bias is None else self.bias * scale + shift
        return self._conv_forward(x, weight, bias)


def freeze_batch_norm(model: nn.Module, mode: str = "separate") -> int:
    """Replace every ``nn.BatchNorm2d`` in the model by a ``FrozenBatchNorm2d`` (in place);
    returns how many were replaced."""
    if mode not in ("separate", "fused"):
        raise CpuoptError(f"freeze_batch_norm: mode must be separate or fused, got {mode!r}")
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                setattr(parent, name, FrozenBatchNorm2d.from_batch_norm(child, mode))
                count += 1
    return count


def set_batch_norm_mode(model: nn.Module, mode: str) -> int:
    """Every FrozenBatchNorm2d not folded computes in ``mode`` (separate or fused); returns how many."""
    if mode not in ("separate", "fused"):
        raise CpuoptError(f"set_batch_norm_mode: mode must be separate or fused, got {mode!r}")
    frozen = [m for m in model.modules() if isinstance(m, FrozenBatchNorm2d) and m.mode != "folded"]
    for m in frozen:
        m.mode = mode
    return len(frozen)


class _Uses(TorchFunctionMode):
    """Counts, per tensor, the torch calls that take it and return a tensor (``x.shape`` and
    ``x.size()`` do not count). Calls made inside a counted call are not seen."""

    def __init__(self):
        super().__init__()
        self.uses: dict[int, int] = defaultdict(int)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(o, torch.Tensor) for o in tree_flatten(out)[0]):
            for t in {id(a) for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor)}:
                self.uses[t] += 1
        return out


def conv_bn_pairs(model: nn.Module, example_inputs) -> list[tuple[str, str]]:
    """(conv, frozen batch norm) module names where, in a forward pass on the example inputs,
    every call of the conv fed only that batch norm and every call of the batch norm took that
    conv's output: the pairs that folding leaves exact. The model's buffers are left as they were."""
    from cpuopt_helpers.worker import call_model

    names = {m: n for n, m in model.named_modules()}
    produced, keep = {}, []  # output tensor id -> (conv, its call); the outputs, so no id is reused
    fed: dict[str, list] = defaultdict(list)  # conv -> per call: (batch norm, tensor id) or None
    took: dict[str, list] = defaultdict(list)  # batch norm -> per call: the conv whose output it took

    def conv_hook(module, _inputs, output):
        produced[id(output)] = (names[module], len(fed[names[module]]))
        fed[names[module]].append(None)
        keep.append(output)
        counter.uses[id(output)] = 0  # a tensor freed earlier may have had this id


    def bn_hook(module, inputs):
        conv, call = produced.get(id(inputs[0]), (None, None))
        if conv is not None:
            fed[conv][call] = (names[module], id(inputs[0]))
        took[names[module]].append(conv)

    counter = _Uses()
    handles = [m.register_forward_hook(conv_hook) for m in model.modules() if type(m) is nn.Conv2d]
    handles += [m.register_forward_pre_hook(bn_hook) for m in model.modules()
                if isinstance(m, FrozenBatchNorm2d) and m.mode != "folded"]
    saved = {n: b.detach().clone() for n, b in model.named_buffers()}
    try:
        with torch.no_grad(), counter:
            call_model(model, example_inputs)
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved[n])
    pairs = []
    for conv, calls in fed.items():
        bns = {c[0] if c else None for c in calls}
        if len(bns) == 1 and None not in bns:
            bn = bns.pop()
            if all(counter.uses[tensor] == 1 for _, tensor in calls) and set(took[bn]) == {conv}:
                pairs.append((conv, bn))
    return pairs


def fold_batch_norm(model: nn.Module, example_inputs) -> list[tuple[str, str]]:
    """Fold each frozen batch norm that only a convolution feeds into that convolution (in
    place; see ``conv_bn_pairs``). The others keep their mode. Returns the folded pairs."""
    modules = dict(model.named_modules())
    pairs = conv_bn_pairs(model, example_inputs)
    for conv, bn in pairs:
        modules[conv].__class__ = FoldedConv2d
        object.__setattr__(modules[conv], "folded_bn", modules[bn])  # not registered: no new state keys
        modules[bn].mode = "folded"
    return pairs


def compile_regions(model: nn.Module) -> list[str]:
    """Compile each block that holds folded convolutions (in place: ``nn.Module.compile``), so
    conv + frozen BN + ReLU and what else the block does become one compiled region. A block is
    the module whose forward calls the convolution (a container such as a downsample
    ``nn.Sequential`` counts as part of its parent); of nested blocks only the innermost are
    compiled (a ResNet's stem stays eager, its bottlenecks compile). Returns their names."""
    modules = dict(model.named_modules())

    def block(name: str) -> str:
        while name and isinstance(modules[name], (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
            name = name.rpartition(".")[0]
        return name

    blocks = {block(name.rpartition(".")[0]) for name, m in modules.items() if isinstance(m, FoldedConv2d)}
    inner = sorted(b for b in blocks if not any(o != b and (not b or o.startswith(f"{b}.")) for o in blocks))
    for name in inner:
        modules[name].compile()
    return inner


def frozen_batch_norm(model: nn.Module, mode: str, example_inputs=None) -> nn.Module:
    """What a workload's ``frozen_bn`` option does to its model: ``none`` leaves it as written;
    ``separate``/``fused`` freeze every ``nn.BatchNorm2d`` and compute frozen batch norm that
    way; ``folded`` also folds each one a convolution alone feeds into it (needs example inputs),
    the rest fused; ``compiled`` folds and then compiles each block of folded convolutions
    (``compile_regions``)."""
    values = OPTIONS["frozen_bn"][0]
    if mode not in values:
        raise CpuoptError(f"frozen_bn must be one of {', '.join(values)}, got {mode!r}")
    if mode == "none":
        return model
    freeze_batch_norm(model, "separate")
    set_batch_norm_mode(model, "fused" if mode in ("folded", "compiled") else mode)
    if mode in ("folded", "compiled"):
        if example_inputs is None:
            raise CpuoptError(f"frozen_bn={mode} needs example inputs to find which convolution feeds each batch norm")
        fold_batch_norm(model, example_inputs)
    if mode == "compiled":
        compile_regions(model)
    return model


def focal_loss(kind: str):
    """The sigmoid focal loss: ``reference`` (torchvision's composite formula) or ``fast`` (the
    closed-form kernel of ``cpuopt_helpers.kernels.focal_loss``); same signature as torchvision's."""
    from cpuopt_helpers.kernels import focal_loss as kernels

    values = OPTIONS["focal"][0]
    if kind not in values:
        raise CpuoptError(f"focal must be one of {', '.join(values)}, got {kind!r}")
    return kernels.sigmoid_focal_loss if kind == "fast" else kernels.reference_sigmoid_focal_loss


def declared(options: dict) -> dict[str, tuple]:
    """The fixes a workload declares among its options (name -> its values, the paper's fix)."""
    return {name: OPTIONS[name] for name in OPTIONS if name in options}
