"""The Lamb optimizer (You et al., 2019), per parameter and as one multi-tensor update.

The paper found a fused Lamb update 5.5x faster than the unfused one. ``impl="loop"`` is
the textbook version, a handful of small ops for every parameter tensor; ``impl="foreach"``
does each op once for all parameters with torch's ``_foreach_*`` kernels (one dispatch per
op instead of one per op and parameter). Both compute the same update:

    m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
    u = (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p
    p -= lr * (|p| / |u| if both are non-zero else 1) * u
"""

from __future__ import annotations

import torch


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, impl: str = "foreach"):
        if impl not in ("loop", "foreach"):
            raise ValueError(f"impl must be loop or foreach, got {impl!r}")
        if lr <= 0 or eps <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid Lamb hyper-parameters lr={lr}, betas={betas}, eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.impl = impl

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if not self.state[p]:
                    self.state[p].update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                self.state[p]["step"] += 1
            (_loop if self.impl == "loop" else _foreach)(params, [self.state[p] for p in params], group)
        return loss


def _loop(params, states, group):
    b1, b2 = group["betas"]
    for p, s in zip(params, states):
        g, t = p.grad, s["step"]
        s["m"].mul_(b1).add_(g, alpha=1 - b1)
        s["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
        update = (s["m"] / (1 - b1**t)) / ((s["v"] / (1 - b2**t)).sqrt() + group["eps"])
        if group["weight_decay"]:
            update.add_(p, alpha=group["weight_decay"])
        w_norm, u_norm = p.norm(), update.norm()
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        p.sub_(update * (group["lr"] * trust))


def _foreach(params, states, group):
    b1, b2 = group["betas"]
    t = states[0]["step"]  # a group's parameters step together
    grads = [p.grad for p in params]
    ms, vs = [s["m"] for s in states], [s["v"] for s in states]
    torch._foreach_mul_(ms, b1)
    torch._foreach_add_(ms, grads, alpha=1 - b1)
    torch._foreach_mul_(vs, b2)
    torch._foreach_addcmul_(vs, grads, grads, value=1 - b2)
    denom = torch._foreach_div(vs, 1 - b2**t)
    torch._foreach_sqrt_(denom)
    torch._foreach_add_(denom, group["eps"])
    updates = torch._foreach_div(ms, 1 - b1**t)
    torch._foreach_div_(updates, denom)
    if group["weight_decay"]:
        torch._foreach_add_(updates, params, alpha=group["weight_decay"])
    w_norms, u_norms = torch._foreach_norm(params), torch._foreach_norm(updates)
    w, u = torch.stack(w_norms), torch.stack(u_norms)
    trust = torch.where((w > 0) & (u > 0), w / u, torch.ones_like(w)) * -group["lr"]
    torch._foreach_mul_(updates, list(trust.unbind()))
    torch._foreach_add_(params, updates)
