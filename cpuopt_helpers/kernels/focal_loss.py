"""The sigmoid focal loss (RetinaNet), as torchvision writes it and as the paper rewrote it.

The paper's method: with binary targets y, write the loss in the logit of the true class,
z = x where y = 1 and -x where y = 0, with q = sigmoid(z) and alpha_t = alpha or 1 - alpha:

    loss  = -alpha_t * (1 - q)**gamma * log(q)
    dL/dx = s * alpha_t * (1 - q)**gamma * (gamma * q * log(q) - (1 - q)),   s = 2y - 1

(the terms in y(y-1) of the general derivative vanish for y in {0, 1}). log(q) is
``logsigmoid(z)`` and 1 - q is ``sigmoid(-z)``, so logits of +-100 give no inf or nan.
Forward and backward are an ``autograd.Function`` written with in-place tensor ops
(``impl="eager"``) and the same two functions compiled by Inductor into single fused
loops (``impl="compiled"``). ``impl="auto"`` uses the compiled one where torch.compile
works here and falls back to eager otherwise (the reason is kept in ``STATUS``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

REDUCTIONS = ("none", "mean", "sum")
STATUS: dict = {"compiled": None, "reason": ""}  # whether the compiled kernels work here, and why not


def reference_sigmoid_focal_loss(inputs: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25,
                                 gamma: float = 2.0, reduction: str = "none") -> torch.Tensor:
    """torchvision.ops.sigmoid_focal_loss, op for op (autograd derives the backward)."""
    p = torch.sigmoid(inputs)
    ce_loss = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce_loss * ((1 - p_t) ** gamma)
    if alpha >= 0:
        alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
        loss = alpha_t * loss
    return _reduce(loss, reduction)


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return loss
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")


def _forward(x: torch.Tensor, positive: torch.Tensor, alpha: float, gamma: float):
    """(loss, log q, 1 - q, alpha_t) in the true-class logit z; computed in fp32 at least."""
    z = torch.where(positive, x, -x)
    if z.dtype in (torch.bfloat16, torch.float16):
        z = z.float()
    log_q = F.logsigmoid(z)
    one_minus_q = torch.sigmoid(z.neg_())
    alpha_t = torch.where(positive, alpha, 1.0 - alpha) if alpha >= 0 else None
    weight = one_minus_q * one_minus_q if gamma == 2.0 else one_minus_q.pow(gamma)
    loss = weight.mul_(log_q).neg_()
    if alpha_t is not None:
        loss.mul_(alpha_t)
    return loss, log_q, one_minus_q


def _backward(grad: torch.Tensor, positive: torch.Tensor, log_q: torch.Tensor, one_minus_q: torch.Tensor,
              alpha: float, gamma: float) -> torch.Tensor:
    """dL/dx = s * alpha_t * (1-q)^gamma * (gamma * q * log q - (1 - q)) * grad, in place."""
    q = 1.0 - one_minus_q
    inner = q.mul_(log_q).mul_(gamma).sub_(one_minus_q)
    weight = one_minus_q * one_minus_q if gamma == 2.0 else one_minus_q.pow(gamma)
    out = inner.mul_(weight).mul_(grad)
    if alpha >= 0:
        out.mul_(torch.where(positive, alpha, alpha - 1.0))  # alpha_t times the sign s
    else:
        out.mul_(torch.where(positive, 1.0, -1.0))
    return out


_compiled: dict = {}


def _kernels(impl: str):
    """(forward, backward) for an implementation: eager, or compiled by Inductor."""
    if impl == "eager":
        return _forward, _backward
    if "fns" not in _compiled:
        _compiled["fns"] = (torch.compile(_forward, dynamic=False), torch.compile(_backward, dynamic=False))
    return _compiled["fns"]


class _FocalLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs, targets, alpha, gamma, impl):
        positive = targets > 0.5
        fwd, _ = _kernels(impl)
        loss, log_q, one_minus_q = fwd(inputs, positive, alpha, gamma)
        ctx.save_for_backward(positive, log_q, one_minus_q)
        ctx.alpha, ctx.gamma, ctx.impl, ctx.dtype = alpha, gamma, impl, inputs.dtype
        return loss.to(inputs.dtype)

    @staticmethod
    def backward(ctx, grad):
        positive, log_q, one_minus_q = ctx.saved_tensors
        _, bwd = _kernels(ctx.impl)
        grad_x = bwd(grad.float() if grad.dtype != log_q.dtype else grad, positive, log_q, one_minus_q,
                     ctx.alpha, ctx.gamma)
        return grad_x.to(ctx.dtype), None, None, None, None


def _compiled_works() -> bool:
    """Try the compiled kernels once on a tiny input; remember the answer (and why not)."""
    if STATUS["compiled"] is None:
        try:
            x = torch.randn(4, 3, requires_grad=True)
            _FocalLoss.apply(x, (torch.rand(4, 3) > 0.5).float(), 0.25, 2.0, "compiled").sum().backward()
            STATUS["compiled"] = True
        except Exception as exc:  # no compiler, an Inductor bug: the eager kernels still work
            STATUS.update(compiled=False, reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return STATUS["compiled"]


def sigmoid_focal_loss(inputs: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0,
                       reduction: str = "none", impl: str = "auto") -> torch.Tensor:
    """The focal loss with a closed-form backward: same signature and values as the reference.

    ``targets`` must be binary (0 or 1), as in detection. ``impl``: auto | compiled | eager.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if impl not in ("auto", "compiled", "eager"):
        raise ValueError(f"impl must be auto, compiled or eager, got {impl!r}")
    if impl == "auto":  # inside a compiled region (the whole step compiled) its compiler fuses the eager expressions
        impl = "eager" if torch.compiler.is_compiling() else "compiled" if _compiled_works() else "eager"
    return _reduce(_FocalLoss.apply(inputs, targets, alpha, gamma, impl), reduction)
