"""Stage 08, case study: RetinaNet as the paper trained it and the paper's fixes, and the
same fixes on any workload that declares them (``cpuopt_helpers.fixes``).
"""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers import compare, fixes
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.stages.settings import normalise, with_options
from cpuopt_helpers.workloads import declared_options


FIX_NAMES = {("frozen_bn", "separate"): "frozen batch norm", ("frozen_bn", "fused"): "fused FrozenBatchNorm2d",
             ("frozen_bn", "folded"): "FrozenBatchNorm2d folded into the conv", ("focal", "fast"): "closed-form focal loss"}
HOW_TO_DECLARE = {
    "frozen_bn": "frozen batch norm (fused, folded into the conv): the workload declares no frozen_bn option "
                 "(build(preset, frozen_bn=\"none\") applying cpuopt_helpers.fixes.frozen_batch_norm)",
    "focal": "the closed-form focal loss: the workload declares no focal option (build(preset, focal=\"reference\") "
             "taking its loss from cpuopt_helpers.fixes.focal_loss)",
}


def configs(base: RunConfig, facts: dict) -> tuple[dict[str, RunConfig], list[str]]:
    """Notebook 08's settings for the base's workload, and what does not apply to it.

    The baseline has none of the fixes (the workload's option defaults, even where a fix was
    handed on earlier); then every fix the workload declares among its options
    (``cpuopt_helpers.fixes.OPTIONS``), each value alone, then the paper's fixes together.
    RetinaNet trains with Lamb as in the paper, so multi-tensor and fused Lamb are fixes there
    (and for any workload whose handed-on optimizer is Lamb)."""
    base = normalise(base, facts["physical_cores"]).replace(options={})
    if base.workload == "retinanet":
        base = base.replace(optimizer="lamb")
    lamb = base.optimizer == "lamb"
    base = base.replace(optimizer_impl="default") if lamb else base
    declared = declared_options(base.workload)
    arms, together = {"baseline": base}, {}
    for name, (values, paper) in fixes.declared(declared).items():
        for value in values:
            if value not in (values[0], declared[name]):
                arms[FIX_NAMES[(name, value)]] = with_options(base, **{name: value})
        together[name] = paper
    if lamb:
        arms["multi-tensor Lamb"] = base.replace(optimizer_impl="foreach")
        arms["fused Lamb"] = base.replace(optimizer_impl="fused")
    if len(arms) > 2:
        arms["all fixes"] = with_options(base, **together).replace(optimizer_impl="fused" if lamb else
                                                                    base.optimizer_impl)
    missing = [f"{base.workload}: not measured: {HOW_TO_DECLARE[name]}." for name in fixes.OPTIONS if name not in declared]
    if not lamb:
        missing.append(f"{base.workload}: not measured: multi-tensor and fused Lamb (it trains with {base.optimizer}; notebook 05 "
                       "compares its optimizer's foreach and fused implementations).")
    return arms, missing


def conv_counts(exec_df: pd.DataFrame, steps: int) -> dict:
    """Convolutions per training step in a oneDNN log, by propagation kind."""
    convs = exec_df[exec_df["kind"] == "convolution"]
    counts = convs.groupby("prop").size() / steps
    ms = convs.groupby("prop")["time_ms"].sum() / steps
    return {f"{p}_convs": float(counts.get(p, 0)) for p in ("forward_training", "backward_data", "backward_weights")} | \
        {f"{p}_ms": float(ms.get(p, 0)) for p in ("backward_data", "backward_weights")}


def frozen_layers_findings(table: pd.DataFrame) -> list[str]:
    """What freezing backbone stages removes from the backward pass, from the logs."""
    if len(table) < 2:
        return ["frozen layers: fewer than two settings were logged."]
    lo, hi = table.iloc[0], table.iloc[-1]
    return [f"trainable_layers {int(hi.trainable_layers)} -> {int(lo.trainable_layers)}: backward-weights convolutions "
            f"per step {hi.backward_weights_convs:.0f} -> {lo.backward_weights_convs:.0f}, backward-data "
            f"{hi.backward_data_convs:.0f} -> {lo.backward_data_convs:.0f}; their oneDNN time "
            f"{hi.backward_weights_ms + hi.backward_data_ms:.1f} -> {lo.backward_weights_ms + lo.backward_data_ms:.1f} "
            "ms per step: stock PyTorch skips the weight gradients of frozen stages and the data gradients below the "
            "lowest trainable one (the paper's IPEX build did not, until fixed)."]


def focal_findings(bench: dict, phase_backward_ms: dict) -> list[str]:
    """The kernel's speedups at each shape, and the reference loss's share of the measured backward."""
    rows = pd.DataFrame(bench["rows"])
    lines = []
    for shape, g in rows[rows["part"] == "both"].groupby("shape", sort=False):
        best = g[g["kernel"] != "reference"].sort_values("speedup", ascending=False).iloc[0]
        ratio = {"ratio": best.speedup, "ci_low": best.speedup_low, "ci_high": best.speedup_high,
                 "n": int(best.get("rounds", bench.get("rounds", 0))), "verdict": best.get("verdict", "no different"),
                 "margin": compare.MARGIN, "min_rounds": compare.MIN_ROUNDS, "label": "95% CI"}
        lines.append(f"focal loss at {shape} ({int(best.elements):,} logits): {best.kernel} forward + backward "
                     f"over the reference, paired calls: {compare.describe(ratio)}.")
    ref = rows[(rows["kernel"] == "reference") & (rows["part"] == "backward")]
    for shape, backward_ms in phase_backward_ms.items():
        hit = ref[ref["shape"] == shape]
        if len(hit) and backward_ms:
            lines.append(f"{shape}: the reference focal loss's backward alone takes {hit.iloc[0].median_ms:.1f} ms, "
                         f"{hit.iloc[0].median_ms / backward_ms:.1%} of the measured backward phase "
                         f"({backward_ms:.0f} ms).")
    return lines


FOCAL_BYTES_PER_LOGIT = 5  # element sizes at least: logits and targets read forward and backward, gradient written


def focal_limit_findings(bench: dict, copy_gbs: float) -> list[str]:
    """The fastest focal-loss kernel against its physical limit: the bytes forward + backward
    must move at the least, over the measured copy bandwidth (notebook 00's roofline)."""
    rows = pd.DataFrame(bench["rows"])
    size = 2 if bench.get("dtype") == "bf16" else 4
    lines = []
    for shape, g in rows[rows["part"] == "both"].groupby("shape", sort=False):
        best = g.sort_values("median_ms").iloc[0]
        limit_ms = FOCAL_BYTES_PER_LOGIT * size * best.elements / (copy_gbs * 1e9) * 1e3
        lines.append(f"focal loss at {shape}: the fastest kernel ({best.kernel}) takes {best.median_ms:.2f} ms forward "
                     f"+ backward; moving the least it must ({FOCAL_BYTES_PER_LOGIT} x {size} B a logit: logits and "
                     f"targets read twice, the gradient written) at the measured copy bandwidth of {copy_gbs:.1f} "
                     f"GB/s takes {limit_ms:.2f} ms: {best.median_ms / limit_ms:.1f}x the physical limit "
                     f"({'within' if best.median_ms <= 2 * limit_ms else 'beyond'} the 2x the case study aims for).")
    return lines


def lamb_findings(bench: list[dict]) -> list[str]:
    lines = []
    for r in bench:
        if "kernels" not in r:
            lines.append(f"IPEX's fused Lamb: {r.get('skipped') or r.get('error')}")
            continue
        for k, v in r["kernels"].items():
            if k != "loop":
                ratio = {"ratio": v["speedup_vs_loop"], "ci_low": v["ci"][0], "ci_high": v["ci"][1],
                         "n": v.get("rounds", 0), "verdict": v.get("verdict", "no different"), "margin": compare.MARGIN,
                         "min_rounds": compare.MIN_ROUNDS, "label": "95% CI"}
                lines.append(f"Lamb on RetinaNet[{r['preset']}]'s {r['elements']:,} trainable parameters, torch "
                             f"{r['torch']}: {k} {v['median_ms']:.1f} ms vs the loop's "
                             f"{r['kernels']['loop']['median_ms']:.1f} ms: {compare.describe(ratio)}.")
    return lines
