"""RetinaNet's whole loss, the focal and the box loss, with its gradient, in one pass from class labels.

The composite loss (``retinanet.detection_loss``) builds one-hot targets as large as the
logits, copies the logits and the targets of every anchor not ignored (boolean indexing),
runs the focal loss, and in the backward scatters the gradient back through the copies and
the slices of the model's output: at RetinaNet's full preset (120,087 anchors, 264 classes,
batch 2: 63 million logits) most of the loss's time goes to those passes over memory, not
to the arithmetic. Here the targets stay what the workload built: per anchor, its class
(-1 background, -2 ignored) and its four box deltas. Each logit's target is "its class index
equals the anchor's label", computed where it is used. One compiled loop over the model's
output computes each anchor's loss and, because the loss is a sum, its gradient too (the
closed forms of ``kernels.focal_loss``; smooth-L1's is ``d / beta`` inside ``beta``,
``sign(d)`` outside); torch sums the anchors' losses, and the backward only scales the
gradient by the incoming one.

``impl="auto"`` runs the compiled loop where torch.compile works here and the same
expressions eagerly otherwise (slower; ``STATUS`` keeps the reason, and a worker reports it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

STATUS: dict = {"compiled": None, "reason": ""}  # whether the compiled loop works here, and why not
IGNORED = -1.5  # labels below this are ignored anchors (-2); -1 is background, 0.. a class


def anchor_losses_and_grad(outputs: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0,
                           beta: float = 1 / 9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For outputs [batch, anchors, classes + 4] and targets [batch, anchors, 5] (class, box
    deltas): each anchor's focal loss (0 where ignored) plus its smooth-L1 (0 unless positive), the
    number of positives (at least 1), and the gradient of the loss, their sum over that number."""
    classes = outputs.shape[-1] - 4
    wide = outputs if outputs.dtype in (torch.float32, torch.float64) else outputs.float()  # bf16: fp32 inside
    x, d = wide[..., :classes], wide[..., classes:] - targets[..., 1:]
    labels = targets[..., 0]
    valid, positive = (labels > IGNORED).unsqueeze(-1), (labels >= 0).unsqueeze(-1)
    num_pos = positive.sum().clamp(min=1)
    pos = labels.unsqueeze(-1) == torch.arange(classes, device=x.device, dtype=labels.dtype)
    z = torch.where(pos, x, -x)  # the logit of the true class: q = sigmoid(z)
    log_q, one_minus_q = F.logsigmoid(z), torch.sigmoid(-z)
    weight = one_minus_q.pow(gamma)
    alpha_t = torch.where(pos, alpha, 1.0 - alpha) if alpha >= 0 else 1.0  # alpha < 0: no class weights
    signed = torch.where(pos, alpha_t, -alpha_t) if alpha >= 0 else torch.where(pos, 1.0, -1.0)  # dz/dx times it
    focal = torch.where(valid, -alpha_t * weight * log_q, 0.0).sum(-1)
    d_focal = torch.where(valid, signed * weight * (gamma * (1.0 - one_minus_q) * log_q - one_minus_q), 0.0)
    inside = d.abs() < beta
    box = torch.where(positive, torch.where(inside, 0.5 * d * d / beta, d.abs() - 0.5 * beta), 0.0).sum(-1)
    d_box = torch.where(positive, torch.where(inside, d / beta, torch.sign(d)), 0.0)
    return focal + box, num_pos, (torch.cat([d_focal, d_box], -1) / num_pos).to(outputs.dtype)


def _loss_and_grad(kernel, outputs, targets, alpha, gamma, beta):
    """The kernel's per-anchor losses summed outside it: torch's own sum adds pairwise, where a
    compiled loop's running sums over 63 million logits drift (1e-4 of the loss already at the
    quick preset's 250 thousand)."""
    per_anchor, num_pos, grad = kernel(outputs, targets, alpha, gamma, beta)
    return per_anchor.sum() / num_pos, grad


_compiled: dict = {}


def _kernel(impl: str):
    if impl == "eager" or is_in_torch_dispatch_mode():  # a FLOP counter's step: dynamo cannot trace under it
        return anchor_losses_and_grad
    if "fn" not in _compiled:
        _compiled["fn"] = torch.compile(anchor_losses_and_grad, dynamic=False)
    return _compiled["fn"]


class _DetectionLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, outputs, targets, alpha, gamma, beta, impl):
        loss, grad = _loss_and_grad(_kernel(impl), outputs, targets, alpha, gamma, beta)
        ctx.save_for_backward(grad)
        return loss.to(outputs.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None, None


def _compiled_works() -> bool:
    """Try the compiled loop once on a tiny input; remember the answer (and why not)."""
    if STATUS["compiled"] is None:
        try:
            outputs = torch.randn(1, 6, 7, requires_grad=True)
            targets = torch.cat([torch.tensor([[-2.0], [-1.0], [0.0], [2.0], [-1.0], [1.0]]), torch.randn(6, 4)], 1)
            _DetectionLoss.apply(outputs, targets[None], 0.25, 2.0, 1 / 9, "compiled").backward()
            STATUS["compiled"] = True
        except Exception as exc:  # noqa: BLE001 - no compiler, an Inductor bug: the eager loop still works
            STATUS.update(compiled=False, reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return STATUS["compiled"]


def detection_loss(outputs: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0,
                   beta: float = 1 / 9, impl: str = "auto") -> torch.Tensor:
    """The same value and gradient as ``retinanet.detection_loss(focal)`` with a binary-target
    focal loss; ``impl``: auto | compiled | eager."""
    if impl not in ("auto", "compiled", "eager"):
        raise ValueError(f"impl must be auto, compiled or eager, got {impl!r}")
    if impl == "auto":  # inside a compiled region (the whole step compiled) its compiler fuses the eager expressions
        impl = "eager" if torch.compiler.is_compiling() else "compiled" if _compiled_works() else "eager"
    return _DetectionLoss.apply(outputs, targets, alpha, gamma, beta, impl)
