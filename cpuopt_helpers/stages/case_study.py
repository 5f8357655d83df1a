"""Stage 08, case study: RetinaNet as the paper trained it and the paper's fixes.
"""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers import compare
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.stages.settings import normalise, with_options


def configs(base: RunConfig, facts: dict) -> dict[str, RunConfig]:
    """Notebook 08: RetinaNet as the paper trained it (Lamb, torchvision's FrozenBatchNorm2d
    and focal loss), each of the paper's fixes alone, then all of them together."""
    base = normalise(base, facts["physical_cores"]).replace(  # the baseline has none of the fixes,
        workload="retinanet", optimizer="lamb", optimizer_impl="default", options={})  # even when handed on
    return {
        "baseline": base,
        "fused FrozenBatchNorm2d": with_options(base, frozen_bn="fused"),
        "closed-form focal loss": with_options(base, focal="fast"),
        "multi-tensor Lamb": base.replace(optimizer_impl="foreach"),
        "all fixes": with_options(base, frozen_bn="fused", focal="fast").replace(optimizer_impl="foreach"),
    }


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
