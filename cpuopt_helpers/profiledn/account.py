"""Where a traced step's time goes by phase, why its forward takes as long as it does against its
backward, and the next fix the profile points at: read from ``wholestep.whole_step``'s rows.

The worker's clocks time the forward with the loss in it (``forward``) and the backward with the
loss's backward in it; a trace splits the loss out (``cpuopt::loss``). Each phase's operators
(its top-level spans) and the time between them (put down to the phase they lead to) add up to
the phase's time; GEMM-like operators are those with a FLOP count (convolutions, matmuls).

Why the forward/backward ratio is what it is, from three figures of the trace:

- **the work**: the backward's GFLOP over the forward's. Where every layer trains, a GEMM's
  backward does twice its forward's work (the data's gradient and the weights'); frozen layers
  skip theirs, and layers below the lowest trainable one need no data gradient either;
- **the loss**: its share of the forward clock (memory-bound element-wise work, no GEMM);
- **the rates**: the GEMM-like operators' achieved GFLOP/s in each direction, and the share of
  each phase outside them (element-wise ops, copies, the time between operators).
"""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers.decisions import Finding
from cpuopt_helpers.profiledn.breakdown import STAGE
from cpuopt_helpers.profiledn.wholestep import Ceilings

FULL_BACKWARD = 2.0  # a GEMM's backward work over its forward's where it trains and its input needs a gradient
RATIO_GOAL = 0.7  # issue 35: the forward at most 0.7 of the backward, or GEMM-bound at half the ceiling or more
GEMM_BOUND_SHARE, GEMM_BOUND_RATE = 0.8, 0.5
# copies, gathers and fills: memory traffic that does no arithmetic (reorders among them)
COPY_OPS = {f"aten::{op}" for op in ("copy_", "to", "_to_copy", "contiguous", "clone", "cat", "index", "index_put_",
                                      "masked_select", "nonzero", "zeros", "zeros_like", "zero_", "fill_")}
LAYOUT_OPS = {"aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::to_mkldnn", "aten::to_dense"}


def phase_table(result: dict, ceilings: Ceilings, theoretical: dict | None = None) -> pd.DataFrame:
    """Per phase (forward, loss, backward, optimizer): ms a step (its operators and the time between
    them), share of the step, GFLOP, the GEMM-like operators' ms and share of the phase, their
    achieved GFLOP/s and its share of the measured GEMM ceiling (and of the theoretical peak where
    ``theoretical``, else the ceilings, give one per dtype), the time between operators."""
    rows, steps = result["rows"], result["steps"]
    waits = result.get("between_ops_by_phase_ms") or {}
    out = []
    for phase in ("forward", "loss", "backward", "optimizer"):
        mine = rows[rows["phase"] == phase]
        gemm = mine[mine["flops"] > 0]
        gemm_ms = float(gemm["time_us"].sum()) / 1e3 / steps
        ops_ms = float(mine["time_us"].sum()) / 1e3 / steps
        ms = ops_ms + waits.get(phase, 0.0)
        gflop = float(mine["flops"].sum()) / 1e9 / steps
        rate = float(gemm["flops"].sum()) / (gemm_ms * 1e-3 * steps) / 1e9 if gemm_ms > 0 else None
        dtype = gemm["dtype"].dropna().mode().iloc[0] if gemm["dtype"].notna().any() else "fp32"
        ceiling, peak = ceilings.gemm_for(dtype), (theoretical or ceilings.theoretical_gflops).get(dtype)
        out.append({"phase": phase, "ms": ms, "gflop": gflop, "gemm_ms": gemm_ms,
                    "gemm_share": gemm_ms / ms if ms else 0.0, "gemm_gflops": rate,
                    "of_ceiling": rate / ceiling if rate and ceiling else None,
                    "of_theoretical": rate / peak if rate and peak else None,
                    "copy_ms": float(mine[mine["op"].isin(COPY_OPS)]["time_us"].sum()) / 1e3 / steps,
                    "between_ms": waits.get(phase, 0.0)})
    table = pd.DataFrame(out).set_index("phase")
    table["share"] = table["ms"] / result["step_ms"] if result["step_ms"] else 0.0
    return table


def forward_backward(table: pd.DataFrame) -> dict:
    """The forward (the loss in it, as the worker's clock times it) over the backward, and what
    the trace says about why: the work ratio, the loss's share, the GEMM-like share and rates."""
    fwd = table.loc["forward", "ms"] + table.loc["loss", "ms"]
    bwd = table.loc["backward", "ms"]
    fwd_gflop = table.loc["forward", "gflop"] + table.loc["loss", "gflop"]
    fwd_gemm = table.loc["forward", "gemm_ms"] + table.loc["loss", "gemm_ms"]
    of_ceiling = table.loc["forward", "of_ceiling"]
    ratio = fwd / bwd if bwd else None
    gemm_bound = bool(fwd and fwd_gemm / fwd >= GEMM_BOUND_SHARE and (of_ceiling or 0) >= GEMM_BOUND_RATE)
    return {"forward_ms": float(fwd), "backward_ms": float(bwd), "ratio": None if ratio is None else float(ratio),
            "work_ratio": float(table.loc["backward", "gflop"] / fwd_gflop) if fwd_gflop else None,
            "full_backward": FULL_BACKWARD,
            # None where the trace marks no loss (its span compiled away, --compile-scope step)
            "loss_share": float(table.loc["loss", "ms"] / fwd) if fwd and table.loc["loss", "ms"] > 0 else None,
            "gemm_share_forward": float(fwd_gemm / fwd) if fwd else 0.0,
            "gemm_share_backward": float(table.loc["backward", "gemm_share"]),
            "forward_of_ceiling": None if pd.isna(of_ceiling) else float(of_ceiling),
            "backward_of_ceiling": None if pd.isna(table.loc["backward", "of_ceiling"])
            else float(table.loc["backward", "of_ceiling"]),
            "forward_gflops": _num(table.loc["forward", "gemm_gflops"]),
            "backward_gflops": _num(table.loc["backward", "gemm_gflops"]),
            "goal": RATIO_GOAL, "met": bool((ratio is not None and ratio <= RATIO_GOAL) or gemm_bound),
            "gemm_bound": gemm_bound, "bound_share": GEMM_BOUND_SHARE, "bound_rate": GEMM_BOUND_RATE}


def _num(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def next_fix(result: dict) -> dict:
    """The operator (by op, phase and bound, its shapes together) with the most time above its
    ceiling, or the time between operators where that is more, and the kind of fix the gap calls
    for (the paper's: a custom kernel, fusion or a compiled region, layout). ``share``: its time's
    share of the step."""
    table = result["table"].assign(gap_ms=lambda t: (t["ms"] - t["projected_ms"]).clip(lower=0))
    by_op = table.groupby(["op", "phase", "bound"], sort=False).agg(
        ms=("ms", "sum"), gap_ms=("gap_ms", "sum"), gflop=("gflop", "sum")).reset_index()
    between = result["between_ops_ms"]
    top = by_op.sort_values("gap_ms", ascending=False).iloc[0] if len(by_op) else None
    if top is None or between > top["gap_ms"]:
        phase = max(result["between_ops_by_phase_ms"] or {"forward": between},
                    key=(result["between_ops_by_phase_ms"] or {"forward": between}).get)
        return {"fix": "dispatch", "op": "between operators", "phase": phase, "gap_ms": float(between),
                "share": float(between / result["step_ms"]) if result["step_ms"] else 0.0}
    fix = ("layout" if top["op"] in LAYOUT_OPS else
           "gemm" if top["bound"] == "compute" else "kernel" if top["bound"] == "memory" else "dispatch")
    return {"fix": fix, "op": str(top["op"]), "phase": str(top["phase"]), "gap_ms": float(top["gap_ms"]),
            "ms": float(top["ms"]), "share": float(top["ms"] / result["step_ms"]) if result["step_ms"] else 0.0}


def findings(table: pd.DataFrame, result: dict, label: str = "") -> list[Finding]:
    """The forward/backward account and the next fix, as findings."""
    return [Finding(label, STAGE, "forward backward", forward_backward(table)),
            Finding(label, STAGE, "next fix", next_fix(result))]
