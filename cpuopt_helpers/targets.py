"""The case study's targets for RetinaNet, by the CPU's bf16 path, and a study's verdict on each.

What the method should reach on a CPU of each kind: the paper's ~2x, and more where the hardware
has the room, and MLPerf Training's rate per core. ``TARGETS`` holds them; ``table()`` writes them
as docs/case-study.md shows them ("Targets").

A target is checked on a CPU of its path only; on any other the page says so, with what this CPU
reached, and checks nothing. A CPU with no bf16 fast path has no target: its study runs in fp32.

Beside each verdict, what the run's projection allows: the top's step were every operator of its
traced step at its ceiling (``profiledn.wholestep``). A target above that bound is beyond faster
kernels for the top's operators on this machine: it needs less work, or another CPU. And the rate
the target asks for over the whole step, as a share of the theoretical peak (``peak``).
"""

from __future__ import annotations

from dataclasses import dataclass

from cpuopt_helpers.decisions import Comparison, Finding

MLPERF_PER_CORE = 0.20  # images/s per physical core: MLPerf Training v3.0, Intel, 2x Xeon 8480+ (AMX) a node
RETINANET_CLASSES = 80  # RetinaNet's own class count (workloads.retinanet), where a configuration names none
PATHS = {"amx": "AMX", "avx512_bf16": "AVX512-BF16", None: "no bf16 fast path"}


@dataclass(frozen=True)
class Target:
    path: str  # the bf16 path of the CPUs it is for (system.bf16_gate)
    preset: str
    classes: int
    figure: str  # "ratio": the top over PyTorch's defaults; "per_core": the top's images/s per physical core
    value: float
    lower: float | None = None  # the interval's lower end at least this (ratio targets)
    rounds: int = 0  # paired rounds its comparison needs at least (ratio targets)
    source: str = ""


TARGETS = (
    Target("amx", "standard", RETINANET_CLASSES, "ratio", 3.0, lower=2.7, rounds=10),
    Target("avx512_bf16", "standard", RETINANET_CLASSES, "ratio", 2.5, rounds=10),
    Target("amx", "full", 264, "per_core", MLPERF_PER_CORE,
           source="MLPerf Training v3.0 Intel's rate, 2x Xeon 8480+ a node, communication included"),
)


@dataclass(frozen=True)
class Measured:
    """What a study measured that the targets read: the top against the defaults (a comparison
    dict), the fastest confirmed configuration's images/s per physical core, its projection's
    bound (its traced step over the same step at every ceiling), and the rates the shares of peak
    need: the top's achieved GFLOP/s and both arms' median steps."""

    comparison: dict
    per_core: float | None = None
    speedup_bound: float | None = None
    top_gflops: float | None = None
    top_step_s: float | None = None
    base_step_s: float | None = None
    peak_gflops: float | None = None  # the theoretical peak of the top's dtype (None: unknown)
    fastest: str = "top"  # the configuration the rate, bound and peak share are of, as the page names it


def table() -> str:
    """The targets as a markdown table (docs/case-study.md's ``targets`` block)."""
    rows = ["| CPUs | preset, classes | figure | target |", "|---|---|---|---|"]
    for t in TARGETS:
        if t.figure == "per_core":
            figure, want = "the top's images/s per physical core", f"{t.value:.2f}" + (f": {t.source}" * bool(t.source))
        else:
            figure = "the top over PyTorch's defaults, images/s"
            want = f"{t.value:.1f}x in {t.rounds} paired rounds" + (f", the lower end {t.lower:.1f} or more" if t.lower
                                                                    else "")
        rows.append(f"| {PATHS[t.path]} | {t.preset}, {t.classes} | {figure} | {want} |")
    return "\n".join(rows)


def applying(preset: str, classes: int) -> list[Target]:
    """The targets of a study at this preset and class count, whatever the CPU."""
    return [t for t in TARGETS if (t.preset, t.classes) == (preset, classes)]


def bound(target: Target, m: Measured) -> float | None:
    """The most the projection allows for the target's figure: the ratio or the rate per core at
    every ceiling (None where the run has no projection or no figure to scale)."""
    if not m.speedup_bound:
        return None
    if target.figure == "per_core":
        return m.per_core * m.speedup_bound if m.per_core else None
    return ratio_bound(m)


def ratio_bound(m: Measured) -> float | None:
    """The top over PyTorch's defaults were every operator of its traced step at its ceiling: the
    defaults' median step over the top's, times its projection's bound."""
    if m.speedup_bound and m.top_step_s and m.base_step_s:
        return m.base_step_s / m.top_step_s * m.speedup_bound
    return None


def needed_share(target: Target, m: Measured) -> float | None:
    """The share of the theoretical peak the whole step must run at to reach the target, at the
    top's work a step (None where the peak or a figure is unknown)."""
    if not (m.peak_gflops and m.top_gflops):
        return None
    if target.figure == "per_core":
        return m.top_gflops * target.value / m.per_core / m.peak_gflops if m.per_core else None
    if m.top_step_s and m.base_step_s:
        return m.top_gflops * m.top_step_s * target.value / m.base_step_s / m.peak_gflops
    return None


def status(target: Target, path: str | None, m: Measured) -> str:
    """'met', 'not met', 'too few rounds' (a ratio compared in fewer rounds than it needs), 'no result',
    or 'other path' (a target for another kind of CPU: not checked here). A ratio whose interval lies
    wholly below the target is 'not met' in any number of rounds: more rounds narrow it, around a
    ratio it already places below."""
    if path != target.path:
        return "other path"
    if target.figure == "per_core":
        return "no result" if m.per_core is None else ("met" if m.per_core >= target.value else "not met")
    c = m.comparison or {}
    if c.get("ratio") is None:
        return "no result"
    if (c.get("n") or 0) < target.rounds:
        high = c.get("ci_high")
        return "not met" if high is not None and high == high and high < target.value else "too few rounds"
    low = c.get("ci_low")
    met = (c["ratio"] >= target.value and c.get("verdict") == "faster"
           and (target.lower is None or (low is not None and low >= target.lower)))
    return "met" if met else "not met"


def fast_path(bf16: dict) -> str | None:
    """The bf16 path a target reads from the gate (``system.bf16_gate``): None where it is not accelerated."""
    return bf16.get("path") if bf16.get("accelerated") else None


def findings(preset: str, classes: int, path: str | None, m: Measured, who: str = "retinanet",
             stage: str = "case_study") -> list[Finding]:
    """One finding for each target of this preset and class count: its verdict on this CPU, the
    figure measured, the bound and the share of peak the target needs (where ``m`` has them)."""
    out = []
    for t in applying(preset, classes):
        figure = m.per_core if t.figure == "per_core" else (m.comparison or {}).get("ratio")
        share = needed_share(t, m)
        out.append(Finding(who, stage, "target", {
            "path": t.path, "path_name": PATHS[t.path], "here": PATHS.get(path, str(path)), "preset": t.preset,
            "classes": t.classes, "figure": t.figure, "value": t.value, "lower": t.lower, "rounds": t.rounds,
            "source": t.source, "status": status(t, path, m), "measured": figure, "bound": bound(t, m),
            "fastest": m.fastest,
            "needed_share": share, "top_share": (m.top_gflops / m.peak_gflops if m.peak_gflops and m.top_gflops
                                                 else None)},
            Comparison.from_dict(m.comparison) if t.figure == "ratio" and m.comparison else None))
    return out
