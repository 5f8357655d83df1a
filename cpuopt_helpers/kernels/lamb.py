"""The Lamb optimizer (You et al., 2019): per parameter, multi-tensor, and fused.

The paper found a fused Lamb update 5.5x faster than the unfused one. ``impl="loop"`` is
the textbook version, a handful of small ops for every parameter tensor; ``impl="foreach"``
does each op once for all parameters with torch's ``_foreach_*`` kernels (one dispatch per
op instead of one per op and parameter); ``impl="fused"`` keeps a group's parameters,
gradients and moments in one flat buffer each (every parameter and its ``.grad`` a view
into them, strides kept, so channels-last weights stay channels-last) and updates them in
one pass over the buffers: the moments and the update in one compiled loop where
torch.compile works (``STATUS`` says which ran), then the per-parameter norms and the
trust-scaled step over the flat buffers. Its gradients stay views into their flat buffer, so
``zero_grad`` zeroes that buffer in place whatever ``set_to_none`` says (autograd then adds
each new gradient into it), and the update is written into one buffer kept between steps:
no step allocates or copies a model-sized tensor. (Before, a training loop's
``zero_grad(set_to_none=True)`` made every step copy each fresh gradient back and allocate
the update anew: 2.5x the loop's optimizer time in RetinaNet's real step, though 1.4x faster
than the loop with gradients left in place.) All three compute the same update:

    m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
    u = (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p
    p -= lr * (|p| / |u| if both are non-zero else 1) * u
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

IMPLS = ("loop", "foreach", "fused")
STATUS: dict = {"compiled": None, "reason": ""}  # the fused update: compiled, or eager and why


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, impl: str = "foreach"):
        if impl not in IMPLS:
            raise ValueError(f"impl must be {', '.join(IMPLS)}, got {impl!r}")
        if lr <= 0 or eps <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid Lamb hyper-parameters lr={lr}, betas={betas}, eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.impl = impl

    def __getstate__(self) -> dict:
        """torch's Optimizer pickles (and deep-copies, as ``ipex.optimize`` does) its defaults, state and
        groups only: ``impl`` goes with them; the flat buffers do not (they belong to the old parameters)."""
        return {**super().__getstate__(), "impl": self.impl}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Fused: the flat gradient buffers are zeroed in place (their views stay each parameter's
        ``.grad``); a parameter outside them as torch's optimizers do."""
        flat = self.__dict__.get("_flat")
        if self.impl != "fused" or not flat:
            return super().zero_grad(set_to_none)
        inside = {id(p) for f in flat.values() for p in f["params"]}
        for group in self.param_groups:
            for p in group["params"]:
                if id(p) not in inside and p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.detach_().requires_grad_(False).zero_()
        with torch.no_grad():
            for f in flat.values():
                f["g"].zero_()

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        if self.impl == "fused":
            for group in self.param_groups:
                _fused(self, group)
            return loss
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


def _flat_views(flat: torch.Tensor, params) -> list[torch.Tensor]:
    """Each parameter's place in a flat buffer, with the parameter's own shape and strides."""
    views, offset = [], 0
    for p in params:
        views.append(flat.as_strided(p.shape, p.stride(), offset))
        offset += p.numel()
    return views


def _dense(t: torch.Tensor) -> bool:
    """Its elements fill exactly numel() places of memory (any order of dimensions)."""
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _flatten(group) -> dict:
    """Move a group's trainable parameters and their gradients into flat buffers (once)."""
    params = [p for p in group["params"] if p.requires_grad and p.grad is not None]  # as the loop: no grad, no update
    if any(not _dense(p) for p in params):
        raise ValueError("fused Lamb needs dense parameters (no overlapping or strided views)")
    n = sum(p.numel() for p in params)
    dtype, device = params[0].dtype, params[0].device
    flat_p, flat_g = torch.empty(n, dtype=dtype, device=device), torch.zeros(n, dtype=dtype, device=device)
    p_views, g_views = _flat_views(flat_p, params), _flat_views(flat_g, params)
    for p, view, grad in zip(params, p_views, g_views):
        view.copy_(p)
        if p.grad is not None:
            grad.copy_(p.grad)
        p.data, p.grad = view, grad
    sizes = [p.numel() for p in params]
    return {"params": params, "p": flat_p, "g": flat_g, "g_views": g_views, "step": 0,
            "m": torch.zeros_like(flat_p), "v": torch.zeros_like(flat_p), "u": torch.empty_like(flat_p),
            "p_segments": list(flat_p.split(sizes)), "sizes": sizes}


def _moments_and_update(p, g, m, v, u, b1, b2, eps, wd, bc1, bc2):
    """m, v and the unscaled update u = m_hat / (sqrt(v_hat) + eps) + wd * p, all in place and
    with no temporary (eager)."""
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    torch.div(v, bc2, out=u).sqrt_().add_(eps)
    torch.div(m, u, out=u).div_(bc1).addcmul_(p, wd)


def _moments_and_update_expr(p, g, m, v, u, b1, b2, eps, wd, bc1, bc2):
    """The same as one expression, for torch.compile: one loop that writes m, v and u."""
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    u.copy_((m / bc1) / ((v / bc2).sqrt() + eps) + wd * p)


_compiled = None


def _update_fn():
    """The moments and update as one compiled loop (scalars as 0-d tensors: one graph for
    every step), or eager where torch.compile fails; STATUS keeps which and why."""
    global _compiled
    if _compiled is None:
        try:
            _compiled = torch.compile(_moments_and_update_expr, dynamic=False, fullgraph=True)
            STATUS.update(compiled=True, reason="")
        except Exception as exc:  # noqa: BLE001 - no compiler, an unsupported torch: eager, said
            _compiled = _moments_and_update
            STATUS.update(compiled=False, reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return _compiled


def _fused(opt: Lamb, group) -> None:
    flat = opt.__dict__.setdefault("_flat", {})  # not in opt.state, which holds per-parameter state only
    if id(group) not in flat:
        flat[id(group)] = _flatten(group)
    f = flat[id(group)]
    for p, view in zip(f["params"], f["g_views"]):  # a .grad set or cleared from outside: back into the buffer
        if p.grad is None:
            view.zero_()
            p.grad = view
        elif p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)
            p.grad = view
    f["step"] += 1
    b1, b2 = group["betas"]
    t = f["step"]
    scalars = [torch.tensor(x, dtype=f["p"].dtype) for x in (b1, b2, group["eps"], group["weight_decay"],
                                                             1 - b1**t, 1 - b2**t)]
    update = _update_fn()
    if is_in_torch_dispatch_mode():  # a FLOP counter's step: dynamo cannot trace under it; eager, this step only
        update = _moments_and_update
    u = f["u"]
    try:
        update(f["p"], f["g"], f["m"], f["v"], u, *scalars)
    except Exception as exc:  # noqa: BLE001 - a compile that fails at its first call: eager from now on
        if update is _moments_and_update:
            raise
        global _compiled
        _compiled = _moments_and_update
        STATUS.update(compiled=False, reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        _moments_and_update(f["p"], f["g"], f["m"], f["v"], u, *scalars)
    u_segments = f.setdefault("u_segments", list(u.split(f["sizes"])))
    w, n = torch.stack(torch._foreach_norm(f["p_segments"])), torch.stack(torch._foreach_norm(u_segments))
    trust = torch.where((w > 0) & (n > 0), w / n, torch.ones_like(w)) * -group["lr"]
    torch._foreach_mul_(u_segments, list(trust.unbind()))
    f["p"].add_(u)
