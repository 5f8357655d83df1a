"""Figures in one style, saved under the figures folder."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import matplotlib.pyplot as plt
import seaborn as sns

from cpuopt_helpers.results import build_dir

log = logging.getLogger(__name__)
PHASE_COLORS = {"forward": "#4C72B0", "loss": "#8172B3", "backward": "#DD8452", "optimizer": "#55A868",
                "other": "#8C8C8C"}


def figures_dir() -> Path:
    path = build_dir() / "figures"
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.lru_cache(maxsize=1)
def _machine() -> str:
    from cpuopt_helpers import system

    return f"{system.parse_cpu_model(system.read_cpuinfo())}, {system.topology().physical_cores} physical cores"


def stamp() -> str:
    """Where, when and with what code a figure was drawn: the CPU and its cores, the day (UTC),
    cpuopt's commit. A notebook draws its figures from the runs it has just measured (08 and 09 also
    from stored ones); saved into the figure, so that a figure copied away still says it."""
    from datetime import datetime, timezone

    from cpuopt_helpers.provenance import own_commit

    return f"{_machine()} · {datetime.now(timezone.utc):%Y-%m-%d} · cpuopt commit {own_commit()}"


def save_figure(fig, name: str, folder: Path | None = None, close: bool = False) -> Path:
    """Save a figure as PNG under the figures folder (or ``folder``), stamped (``stamp``), and return
    its path; ``close``: then free it (a page's figure; a notebook's stays to be shown)."""
    if folder is not None:
        Path(folder).mkdir(parents=True, exist_ok=True)
    path = (figures_dir() if folder is None else Path(folder)) / f"{name}.png"
    fig.text(0.995, 0.0, stamp(), ha="right", va="top", fontsize=7, color="#707070")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    if close:
        plt.close(fig)
    log.info("figure saved to %s", path)
    return path


def baseline_figure(table):
    """Left: samples/s per workload with its CI; right: where a step's time goes."""
    sns.set_theme(style="whitegrid", context="notebook")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    names = list(table.index)
    ax1.barh(names, table["samples_per_s"], color="#4C72B0",
             xerr=[table["samples_per_s"] - table["low"], table["high"] - table["samples_per_s"]], capsize=4)
    ax1.set_xlabel("samples/s (median; bars: range over runs)")
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
    """The measured ceilings as bars, and beside the copy the write rates into mapped and fresh memory
    (each page faulted in), where measured."""
    sns.set_theme(style="whitegrid", context="notebook")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 2.8))
    gemm = {"fp32 GEMM": roofline["gemm_gflops_best"], "bf16 GEMM": roofline.get("gemm_gflops_bf16_best")}
    gemm = {k: v for k, v in gemm.items() if v}
    ax1.bar(list(gemm), list(gemm.values()), color=["#4C72B0", "#8172B2"][:len(gemm)])
    ax1.set_ylabel("GFLOP/s (best)")
    bars = {"copy\n(read + write)": roofline["copy_gbs_best"], "write,\nmapped memory": roofline.get("write_gbs"),
            "write, fresh\n(page faults)": roofline.get("fresh_write_gbs")}
    bars = {k: v for k, v in bars.items() if v}
    ax2.bar(list(bars), list(bars.values()), color=["#DD8452", "#55A868", "#C44E52"][:len(bars)])
    ax2.set_ylabel("GB/s")
    fig.suptitle(f"Measured ceilings on {roofline['threads']} threads")
    fig.tight_layout()
    return fig


def donuts(shares: dict, title: str):
    """One donut per run: share of logged oneDNN time by primitive kind (or direction)."""
    sns.set_theme(style="white", context="notebook")
    n = max(1, len(shares))
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.6), squeeze=False)
    labels = sorted({k for s in shares.values() for k in s.index})
    palette = dict(zip(labels, sns.color_palette("tab10", len(labels))))
    for ax, (name, series) in zip(axes[0], shares.items()):
        series = series[series > 0]
        ax.pie(series.values, labels=[f"{k} {v:.0%}" if v >= 0.04 else "" for k, v in series.items()],
               colors=[palette[k] for k in series.index], wedgeprops={"width": 0.42}, startangle=90,
               textprops={"fontsize": 8})
        ax.set_title(name, fontsize=10)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def comparison_bars(table, labels: tuple[str, str], value: str = "time_ms", title: str = ""):
    """Side-by-side bars of two runs per group (kind x direction) from profiledn.compare."""
    sns.set_theme(style="whitegrid", context="notebook")
    names = [" ".join(str(x) for x in (i if isinstance(i, tuple) else (i,)) if x != "none") for i in table.index]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.5))
    y = range(len(names))
    ax.barh([i - 0.2 for i in y], table[f"{value}_{labels[0]}"], height=0.4, label=labels[0], color="#4C72B0")
    ax.barh([i + 0.2 for i in y], table[f"{value}_{labels[1]}"], height=0.4, label=labels[1], color="#DD8452")
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xlabel(value.replace("_", " "))
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    return fig


def efficiency_bars(table):
    """Measured step vs the oneDNN kernel-only projection, per workload."""
    sns.set_theme(style="whitegrid", context="notebook")
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(table) + 1.5))
    names = list(table.index)
    y = range(len(names))
    ax.barh([i - 0.2 for i in y], table["step_ms"], height=0.4, label="measured step", color="#8C8C8C")
    ax.barh([i + 0.2 for i in y], table["kernel_ms_per_step"], height=0.4, label="oneDNN kernels only (replayed)",
            color="#4C72B0")
    for i, eff in zip(y, table["efficiency"]):
        if eff == eff:  # not NaN
            ax.text(table["step_ms"].iloc[i], i - 0.2, f"  {eff:.0%}", va="center", fontsize=9)
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step")
    ax.set_title("Projection: efficiency ratio = kernel-only time / measured step")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def top_ops_bars(tops: dict, title: str = "Top operators by self CPU time (torch.profiler)"):
    """One panel per workload: the operators with the largest share of self CPU time."""
    sns.set_theme(style="whitegrid", context="notebook")
    n = max(1, len(tops))
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, 3.4), squeeze=False)
    for ax, (name, table) in zip(axes[0], tops.items()):
        table = table.head(8)
        ax.barh([s.replace("aten::", "")[:28] for s in table["name"]], table["share"] * 100, color="#4C72B0")
        ax.invert_yaxis()
        ax.set_xlabel("% of self CPU time")
        ax.set_title(name, fontsize=10)
        ax.tick_params(axis="y", labelsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def scaling_figure(tables: dict):
    """Samples/s against threads per workload, with the ideal linear-scaling line."""
    sns.set_theme(style="whitegrid", context="notebook")
    n = max(1, len(tables))
    fig, axes = plt.subplots(1, n, figsize=(4 * n, 3.4), squeeze=False)
    for ax, (name, t) in zip(axes[0], tables.items()):
        if len(t):
            ax.plot(t["threads"], t["samples_per_s"], "o-", label="measured", color="#4C72B0")
            ax.plot(t["threads"], t["ideal"], "--", label="ideal", color="#8C8C8C")
            ax.set_xticks(list(t["threads"]))
        ax.set_xlabel("threads")
        ax.set_ylabel("samples/s")
        ax.set_title(name, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle("Thread scaling (one instance, compact pinning)")
    fig.tight_layout()
    return fig


def settings_figure(tables: dict, title: str, value: str = "ratio"):
    """Per workload: each setting's throughput relative to the baseline, coloured by its verdict."""
    sns.set_theme(style="whitegrid", context="notebook")
    n = max(1, len(tables))
    lines = max((sum(bar_label(str(x)).count("\n") + 1.3 for x in t.get("setting", [])) for t in tables.values()),
                default=5)  # a label's lines and the gap between bars
    height = max(2.8, 0.3 * lines + 1.2)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, height), squeeze=False)
    for ax, (name, t) in zip(axes[0], tables.items()):
        t = t.dropna(subset=[value]) if value in t else t.iloc[0:0]
        if len(t):
            labels = [bar_label(s) for s in t["setting"]]
            low = t[f"{value}_low"] if f"{value}_low" in t else t[value] * float("nan")
            high = t[f"{value}_high"] if f"{value}_high" in t else t[value] * float("nan")
            verdicts = list(t["verdict"]) if "verdict" in t else [None] * len(t)
            colors = [VERDICT_COLORS.get(v, "#8C8C8C") for v in verdicts]
            ax.barh(labels, t[value], color=colors)
            known = (low.notna() & high.notna()).to_numpy()  # no interval below the minimum rounds: no caps
            if known.any():
                ax.errorbar(t[value][known], [y for y, k in zip(range(len(t)), known) if k], fmt="none",
                            xerr=[(t[value] - low)[known], (high - t[value])[known]], ecolor="black", capsize=3, lw=1)
            ax.axvline(1.0, color="black", lw=0.8)
            ax.invert_yaxis()
            ax.tick_params(axis="y", labelsize=8)
        ax.set_xlabel(f"throughput / baseline, paired rounds\n({settings_key(t)})")
        ax.set_title(name, fontsize=10)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


VERDICT_COLORS = {"faster": "#55A868", "slower": "#C44E52"}


def bar_label(setting: str, width: int = 40) -> str:
    """A setting on two lines at most, cut at a word with an ellipsis where longer (not mid-word)."""
    import textwrap

    lines = textwrap.wrap(setting, width) or [""]
    return "\n".join(lines[:2]) + ("…" if len(lines) > 2 else "")


def settings_key(table) -> str:
    """The caption's key: the colours only where some bar has a verdict that colours it, then
    what the bars' intervals rest on."""
    verdicts = set(table["verdict"]) if "verdict" in table else set()
    key = "green faster, red slower, grey undecided or screened; " if verdicts & set(VERDICT_COLORS) else ""
    return key + rounds_note(table)


def rounds_note(table, value: str = "ratio") -> str:
    """What the bars' intervals rest on, read from the table: 'intervals from 5 rounds' (or 5-8), or none."""
    low = table[f"{value}_low"] if f"{value}_low" in table else None
    if low is None or low.isna().all():
        return "no interval: screened only"
    n = [c.get("n") for c, lo in zip(table.get("comparison", [None] * len(table)), low)
         if isinstance(c, dict) and lo == lo and c.get("n")]
    if not n:
        return "intervals from paired rounds"
    return f"intervals from {min(n)} rounds" if min(n) == max(n) else f"intervals from {min(n)}-{max(n)} rounds"


def accuracy_figure(runs: list[dict]):
    """Training loss and test accuracy per epoch, one line per precision mode."""
    sns.set_theme(style="whitegrid", context="notebook")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    for r in runs:
        epochs = range(1, len(r["history"]) + 1)
        ax1.plot(epochs, [h["loss"] for h in r["history"]], "o-", ms=3, label=r["mode"])
        ax2.plot(epochs, [h["accuracy"] * 100 for h in r["history"]], "o-", ms=3, label=r["mode"])
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("training loss")
    ax1.set_yscale("log")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("test accuracy (%)")
    ax2.legend(fontsize=8)
    fig.suptitle("UCI digits: fp32 vs bf16 (loss in fp32) vs bf16 (loss in bf16)")
    fig.tight_layout()
    return fig


def layout_heatmaps(grids: dict, paper=None):
    """Normalised throughput as heat maps (threads per rank x ranks), the paper's beside them."""
    sns.set_theme(style="white", context="notebook")
    panels = dict(grids)
    if paper is not None:
        panels["paper (Table 2, 2x28-core Xeon)"] = paper
    measured = [g.astype(float).stack() for g in grids.values() if len(g)]  # one colour scale for this machine's
    low, high = (min(v.min() for v in measured), max(v.max() for v in measured)) if measured else (None, None)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.4), squeeze=False)
    for ax, (name, grid) in zip(axes[0], panels.items()):
        mine = name in grids
        sns.heatmap(grid.astype(float), annot=True, fmt=".2f", cmap="viridis", ax=ax, annot_kws={"fontsize": 9},
                    vmin=low if mine else None, vmax=high if mine else None, cbar_kws={"shrink": 0.8})
        # a DDP job of one rank is one process: its column is the independent run's
        ax.set_title(name + ("\n(1 rank: the single process, as independent)" if "ddp" in name else ""), fontsize=10)
    fig.suptitle("Normalised throughput by threads per rank and ranks")
    fig.tight_layout()
    return fig


def convergence_figure(runs: list[dict], target: float):
    """Test accuracy per epoch for each global batch, with the target line."""
    sns.set_theme(style="whitegrid", context="notebook")
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for r in runs:
        ax.plot(range(1, len(r["history"]) + 1), [h["accuracy"] * 100 for h in r["history"]], "o-", ms=3,
                label=f"global batch {r['batch_size']}")
    ax.axhline(target * 100, color="black", lw=0.8, ls="--", label=f"target {target:.0%}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.legend(fontsize=8)
    ax.set_title("UCI digits: convergence against the global batch")
    fig.tight_layout()
    return fig


def frozen_layers_figure(table):
    """Backward convolutions per step and the measured step time, by trainable backbone stages."""
    sns.set_theme(style="whitegrid", context="notebook")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    x = range(len(table))
    ax1.bar([i - 0.2 for i in x], table["backward_data_convs"], width=0.4, label="backward data")
    ax1.bar([i + 0.2 for i in x], table["backward_weights_convs"], width=0.4, label="backward weights")
    ax1.set_xticks(list(x), table["trainable_layers"])
    ax1.set_xlabel("trainable backbone stages")
    ax1.set_ylabel("convolutions per step")
    ax1.legend(fontsize=8)
    ax2.bar(list(x), table["step_ms"], color="#55A868")
    ax2.set_xticks(list(x), table["trainable_layers"])
    ax2.set_xlabel("trainable backbone stages")
    ax2.set_ylabel("step time (ms, logged run)")
    fig.suptitle("Frozen layers: what the backward pass skips")
    fig.tight_layout()
    return fig


def waterfall(tables: dict, finals: dict | None = None):
    """Per workload: each rung's confirmed gain on the previous one (its interval as an error
    bar), chained; then the ladder's end measured against its start in fresh paired rounds.
    A rung that left the ladder where it was gets a grey tick at its level and no label (its
    neighbours' labels would otherwise run into each other); a rung tried as one block, with no
    gain of its own (NaN), points to the end vs start; panels widen with their rungs."""
    sns.set_theme(style="whitegrid", context="notebook")
    tables = {w: t for w, t in tables.items() if len(t)}
    widths = [max(4.6, 0.4 * (len(t) + 1)) for t in tables.values()] or [4.6]
    fig, axes = plt.subplots(1, len(widths), figsize=(sum(widths), 3.8), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    for ax, (name, t) in zip(axes[0], tables.items()):
        level, labels = 1.0, []
        for i, row in enumerate(t.itertuples()):
            new = top = row.cumulative_speedup  # top: where its label goes, above its error bar
            if i == 0:
                ax.bar(i, new, color="#4C72B0")
            elif new != new:  # tried as one block (make run's RetinaNet recipe): its gain is the end vs start
                said = "one block:\nsee end\nvs start" if (finals or {}).get(name) else "one block:\nnot compared\nyet"
                ax.text(i, level, said, ha="center", va="bottom", fontsize=7)
                labels.append(row.step)
                continue
            elif new == level:  # kept the rung below: nothing to draw but where it stands
                ax.hlines(new, i - 0.4, i + 0.4, color="#999999", lw=1.5)
            else:
                ax.bar(i, new - level, bottom=level, color="#55A868" if new >= level else "#C44E52")
                if getattr(row, "confirmed", True) and row.vs_previous_low is not None \
                        and row.vs_previous_low == row.vs_previous_low:  # an unconfirmed rung adds nothing
                    top = level * row.vs_previous_high
                    ax.errorbar(i, new, yerr=[[new - level * row.vs_previous_low], [top - new]], color="black",
                                capsize=3, lw=1)
            if i == 0 or new != level:
                ax.text(i, top, f"{new:.2f}x", ha="center", va="bottom", fontsize=8)
            level = new
            labels.append(row.step)
        final = (finals or {}).get(name)
        if final and final.get("n"):
            i = len(t)
            ax.bar(i, final["ratio"], color="#8172B2")
            top = final["ratio"]
            if final["ci_low"] == final["ci_low"]:
                top = final["ci_high"]
                ax.errorbar(i, final["ratio"], yerr=[[final["ratio"] - final["ci_low"]], [top - final["ratio"]]],
                            color="black", capsize=3, lw=1)
            ax.text(i, top, f"{final['ratio']:.2f}x", ha="center", va="bottom", fontsize=8)
            labels.append("end vs start\n(paired rounds)")
        ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_title(name, fontsize=10)
    axes[0][0].set_ylabel("speedup over PyTorch's defaults")
    fig.suptitle("The optimisation ladder")
    fig.tight_layout()
    return fig


def kernel_roofline_figure(tables: dict, ceilings, title: str = "Per-operator roofline of the training step"):
    """Each workload's operators against the machine's ceilings (profiledn.wholestep).

    Left: operators with FLOPs (GEMM-like) at their arithmetic intensity and achieved GFLOP/s,
    under the roof min(GEMM peak, intensity x copy bandwidth). Right: operators without FLOPs
    at their bytes moved and achieved GB/s, under the copy bandwidth. Marker area ~ time per step.
    """
    import numpy as np

    sns.set_theme(style="whitegrid", context="notebook")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = sns.color_palette("deep", max(len(tables), 1))
    peak = max(ceilings.gemm_gflops.values())
    bw = ceilings.copy_gbs
    xs, gbs_max = [], [bw]
    for color, (name, table) in zip(colors, tables.items()):
        flop_rows = table[(table["gflop"] > 0) & (table["intensity"] > 0)]
        size = 20 + 400 * table["share"]
        ax1.scatter(flop_rows["intensity"], flop_rows["achieved_gflops"], s=size[flop_rows.index], color=color,
                    alpha=0.6, edgecolor="k", linewidth=0.4, label=name)
        xs += list(flop_rows["intensity"])
        mem = table[(table["gflop"] <= 0) & (table["mb"] > 0)]
        ax2.scatter(mem["mb"], mem["achieved_gbs"], s=size[mem.index], color=color, alpha=0.6, edgecolor="k",
                    linewidth=0.4, label=name)
        gbs_max += list(mem["achieved_gbs"])
    lo, hi = (min(xs) / 2, max(xs) * 2) if xs else (0.1, 100.0)
    grid = np.logspace(np.log10(min(lo, peak / bw / 10)), np.log10(max(hi, peak / bw * 10)), 200)
    for dtype, gflops in ceilings.gemm_gflops.items():
        ax1.plot(grid, np.minimum(gflops, grid * bw), color="#333333", linestyle="-" if dtype == "fp32" else "--",
                 linewidth=1.2, label=f"roof: {dtype} GEMM {gflops:.0f} GFLOP/s, copy {bw:.1f} GB/s")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax1.set_ylabel("achieved GFLOP/s")
    ax1.set_title("GEMM-like operators")
    ax1.legend(fontsize=7, loc="lower right")
    ax2.axhline(bw, color="#333333", linewidth=1.2, label=f"copy bandwidth {bw:.1f} GB/s")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("MB moved per step")
    ax2.set_ylabel("achieved GB/s")
    ax2.set_title("Operators without FLOPs (memory-bound)")
    ax2.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{title} (marker area: share of the step's operator time)")
    fig.tight_layout()
    return fig


STEP_PARTS = [("at every ceiling", "#4c9a5b"), ("compute gap", "#d1495b"), ("memory gap", "#edae49"),
              ("no work", "#8d8d8d")]
BETWEEN_COLORS = {"forward": "#00798c", "loss": "#66a5ad", "backward": "#30638e", "optimizer": "#a3c4dc"}


def step_composition_figure(results: dict, title: str = "Where the step goes (whole-step projection)"):
    """One bar per workload, 100% of its traced step: the time at every ceiling, the gap by cause,
    and the time between operators by the phase it leads to (profiledn.wholestep results)."""
    sns.set_theme(style="whitegrid", context="notebook")
    fig, ax = plt.subplots(figsize=(10, max(2.6, 1.0 + 0.55 * len(results))))
    labels = list(results)
    seen = set()
    for y, name in enumerate(labels):
        r = results[name]
        parts = [r["projected_ms"], r["gap_ms"]["compute"], r["gap_ms"]["memory"], r["gap_ms"]["no work"]]
        segments = [(label, color, ms) for (label, color), ms in zip(STEP_PARTS, parts)]
        segments += [(f"between ops: {p}", BETWEEN_COLORS[p], ms) for p, ms in r["between_ops_by_phase_ms"].items()]
        left = 0.0
        for label, color, ms in segments:
            share = ms / r["step_ms"] if r["step_ms"] else 0.0
            ax.barh(y, share, left=left, color=color, edgecolor="white", label=None if label in seen else label)
            seen.add(label)
            left += share
        ax.text(1.01, y, f"{r['step_ms']:.2f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:.0%}"))
    ax.set_xlabel("share of the traced step")
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.1, 1.0))
    ax.set_title(title)
    fig.tight_layout()
    return fig


STUDY_PHASES = ("forward", "loss", "backward", "optimizer")


def phase_seconds(profile: dict) -> tuple[dict, dict]:
    """A traced arm's step by phase in seconds (``account.phase_table``: its operators and the time
    between them), and the same phases at every ceiling (the projection: each operator at its
    ceiling, none of the time between them)."""
    whole, table = profile["whole"], profile["phases"]
    rows = whole["rows"]
    projected = rows.groupby("phase")["projected_us"].sum() / 1e6 / whole["steps"]
    return ({p: float(table.loc[p, "ms"]) / 1e3 for p in STUDY_PHASES},
            {p: float(projected.get(p, 0.0)) for p in STUDY_PHASES})


def study_phases_figure(profiles: dict, title: str):
    """Each traced arm's step by phase in seconds, and beneath it the same step at every ceiling:
    how much faster the top is, whether the forward or the backward holds it, and the room left."""
    sns.set_theme(style="whitegrid", context="notebook")
    traced = {name: phase_seconds(p) for name, p in profiles.items() if "phases" in p and "whole" in p}
    bars = [(f"{name}, traced", measured, False) for name, (measured, _) in traced.items()]
    bars += [(f"{name}, at every ceiling", ceiling, True) for name, (_, ceiling) in traced.items()]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(bars)))
    for y, (label, seconds, projected) in enumerate(bars):
        left = 0.0
        for phase in STUDY_PHASES:
            ax.barh(y, seconds[phase], left=left, color=PHASE_COLORS[phase], alpha=0.55 if projected else 1.0,
                    hatch="//" if projected else None, edgecolor="white", label=None if y else phase)
            left += seconds[phase]
        ax.text(left, y, f"  {left:.2f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)), [label for label, _, _ in bars])
    ax.set_xlabel("seconds a step (traced; hatched: every operator at its ceiling, no time between them)")
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="lower right", ncols=4)
    ax.set_title(title)
    fig.tight_layout()
    return fig
