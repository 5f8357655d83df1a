"""Figures in one style, saved under the figures folder."""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib.pyplot as plt
import seaborn as sns

from cpuopt_helpers.results import build_dir

log = logging.getLogger(__name__)
PHASE_COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "optimizer": "#55A868", "other": "#8C8C8C"}


def figures_dir() -> Path:
    path = build_dir() / "figures"
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_figure(fig, name: str) -> Path:
    """Save a figure as PNG under the figures folder and return its path."""
    path = figures_dir() / f"{name}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    log.info("figure saved to %s", path)
    return path


def baseline_figure(table):
    """Left: samples/s per workload with its CI; right: where a step's time goes."""
    sns.set_theme(style="whitegrid", context="notebook")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    names = list(table.index)
    ax1.barh(names, table["samples_per_s"], color="#4C72B0",
             xerr=[table["samples_per_s"] - table["ci_low"], table["ci_high"] - table["samples_per_s"]], capsize=4)
    ax1.set_xlabel("samples/s (median, 95% CI over runs)")
    ax1.set_title("Throughput with PyTorch defaults")
    left = None
    for phase in ("forward", "backward", "optimizer", "other"):
        share = table[f"{phase}_share"] * 100
        ax2.barh(names, share, left=left, color=PHASE_COLORS[phase], label=phase)
        left = share if left is None else left + share
    ax2.set_xlabel("% of step time")
    ax2.set_title("Step time by phase")
    ax2.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    return fig


def roofline_figure(roofline: dict):
    """The two measured ceilings as bars."""
    sns.set_theme(style="whitegrid", context="notebook")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 2.8))
    ax1.bar(["fp32 GEMM"], [roofline["gemm_gflops_best"]], color="#4C72B0")
    ax1.set_ylabel("GFLOP/s")
    ax2.bar(["memory copy"], [roofline["copy_gbs_best"]], color="#DD8452")
    ax2.set_ylabel("GB/s (read + write)")
    fig.suptitle(f"Measured ceilings on {roofline['threads']} threads")
    fig.tight_layout()
    return fig
