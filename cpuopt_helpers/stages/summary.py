"""Stage 09, summary: the ladder of every workload, from PyTorch's defaults to the last rung.
"""

from __future__ import annotations

import math

import pandas as pd

from cpuopt_helpers import compare, stats, targets
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.decisions import Comparison, Finding


def ladder_findings(table: pd.DataFrame, workload: str = "") -> list[Finding]:
    """Each fix alone and all together against the baseline (the paper: about 2x together)."""
    if table.empty:
        return [Finding(workload, "summary", "no case study result")]
    first = table.iloc[0]
    return [Finding(workload, "summary", "arm over first", {"name": r["name"], "first": first["name"]},
                    Comparison.from_dict(r["comparison"]))
            for _, r in table.iterrows()
            if r["config_hash"] != first["config_hash"] and isinstance(r.get("comparison"), dict)]


def ladder_table(store, machine: str, workload: str, preset: str, roofline: dict | None,
                 price_per_hour: float, physical_cores: int, theoretical: dict | None = None) -> pd.DataFrame:
    """The optimisation ladder of one workload from the store (``ladder.rungs``): each rung
    handed on, its confirmed ratio to the rung before and to the baseline (chained, with
    intervals), its measured throughput (median of the stored runs of that configuration),
    the share of the measured GEMM ceiling of the dtype it ran in, and the cost per 1000
    training samples at the given price per machine-hour."""
    from cpuopt_helpers import ladder
    from cpuopt_helpers.roofline import ceiling_gflops

    rungs = ladder.rungs(store, machine, workload, preset, physical_cores)
    if not rungs:
        return pd.DataFrame()
    runs: dict[str, list[dict]] = {}
    for r in store.results(machine=machine):  # a ladder's name may be more than its workload's ("retinanet, 601 classes")
        if r["status"] == "ok" and r["config"]["workload"] == rungs[0].config["workload"]:
            runs.setdefault(RunConfig.from_dict(r["config"]).config_hash(), []).append(r)  # today's hash
    rows = []
    for rung in rungs:
        config = RunConfig.from_dict(rung.config)
        measured = runs.get(config.config_hash(), [])
        sps = stats.summarize([r["samples_per_s"] for r in measured])["median"] if measured else None
        gflops = stats.summarize([r["achieved_gflops"] for r in measured if r.get("achieved_gflops")])["median"] \
            if any(r.get("achieved_gflops") for r in measured) else None
        evidence = rung.vs_previous.to_dict() if rung.vs_previous else {}
        chained = rung.vs_baseline
        if rung.one_block:  # no gain of its own: the headline (``ends``) says
            chained = {"ratio": math.nan, "ci_low": math.nan, "ci_high": math.nan}
        ceiling = ceiling_gflops(roofline or {}, config.dtype) if roofline else None
        speeds = [r["samples_per_s"] for r in measured]
        rows.append({"step": rung.step, "change": rung.change, "kept": rung.kept,
                     "samples_per_s": sps, "runs": len(measured), "achieved_gflops": gflops,
                     "samples_low": min(speeds, default=None), "samples_high": max(speeds, default=None),
                     "vs_previous": evidence.get("ratio"), "vs_previous_low": evidence.get("ci_low"),
                     "vs_previous_high": evidence.get("ci_high"), "verdict": evidence.get("verdict"),
                     "cumulative_speedup": chained["ratio"], "cumulative_low": chained["ci_low"],
                     "cumulative_high": chained["ci_high"],
                     "peak_share": gflops / ceiling if gflops and ceiling else None,
                     "theoretical_share": (gflops / (theoretical or {})[config.dtype]
                                           if gflops and (theoretical or {}).get(config.dtype) else None),
                     "ceiling": f"{config.dtype} GEMM", "config": rung.config, "comparison": evidence or None,
                     "confirmed": None if rung.one_block else rung.confirmed})  # a block: never compared alone
    table = pd.DataFrame(rows)
    table["usd_per_1000_samples"] = price_per_hour / 3600 * 1000 / table["samples_per_s"]
    return table


def _ratio_words(ratio, low, high) -> str:
    """A chained ratio: '1.23x (1.10-1.38)'; one without an interval says so."""
    if not _number(ratio):
        return "not measured"
    if not (_number(low) and _number(high)):
        return f"{ratio:.2f}x (no interval)"
    return f"{ratio:.2f}x ({low:.2f}-{high:.2f})"


def _rate(value: float) -> str:
    """Three significant digits, never in exponent form: 0.0123, 1.56, 75.4, 2803."""
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def _share_words(share) -> str:
    return f"{share:.0%}" if _number(share) else "unknown"


TO_DEFAULTS = "over PyTorch's defaults (product of the rungs, after selection: reads high)"


def ladder_view(table: pd.DataFrame) -> pd.DataFrame:
    """The ladder as a reader reads it (notebooks 08 and 09): no empty cells. Each rung's ratio
    to the rung below and to PyTorch's defaults worded with its interval and verdict; the first
    rung is the reference; a kept rung changed nothing; a rung tried as one block has no ratio of
    its own (the headline below is its verdict); shares of a ceiling unknown where it is."""
    rows = []
    for i, r in enumerate(table.itertuples(index=False)):
        if i == 0:
            below = from_defaults = "the reference"
        elif r.kept:
            below = "kept: nothing changed"
            from_defaults = _ratio_words(r.cumulative_speedup, r.cumulative_low, r.cumulative_high)
            if r.cumulative_low == r.cumulative_high == 1:  # no change below it yet
                from_defaults = "1.00x: nothing changed yet"
        elif r.confirmed is None:  # tried as one block
            below = from_defaults = "tried as one block: the headline below is its verdict"
        else:  # the confirmation that handed it on, worded as every comparison is
            below = compare.describe(r.comparison) if r.comparison else "no comparison stored"
            from_defaults = _ratio_words(r.cumulative_speedup, r.cumulative_low, r.cumulative_high)
        rate = _number(r.samples_per_s)
        rows.append({"step": r.step, "change": r.change,
                     "samples/s (median)": _rate(rate) if rate else "no run stored",
                     "runs (slowest-fastest)": (f"{r.runs} ({_rate(r.samples_low)}-{_rate(r.samples_high)})"
                                                if rate else "0"),
                     "over the rung below": below, TO_DEFAULTS: from_defaults,
                     "GFLOP/s": f"{r.achieved_gflops:.0f}" if _number(r.achieved_gflops) else "not counted",
                     "of the measured GEMM ceiling": f"{_share_words(r.peak_share)} ({r.ceiling})",
                     "of the theoretical peak": _share_words(r.theoretical_share),
                     "$ per 1000 samples": f"{r.usd_per_1000_samples:.4f}" if rate else "no run stored"})
    return pd.DataFrame(rows)


def ends(session, tables: dict, rounds: int, budget_min: float | None, resume: bool = True) -> dict:
    """Per workload, the headline: the ladder's top against its start (PyTorch's defaults) in
    ``rounds`` fresh paired rounds, a fixed number, so its interval is the plain 95% t interval
    (never a rung's own confirmation, which was selected: it reads high). Stored on the top rung
    as ``end_to_end`` (``cpuopt ladder --json``); a climb's own end-to-end comparison (notebook
    08, ``make case-study``) is kept, not measured again. None where nothing changed."""
    from cpuopt_helpers import ladder

    finals = {}
    for w, t in tables.items():
        if len(t) < 2 or t.iloc[-1]["config"] == t.iloc[0]["config"]:  # configurations as run (threads spelled out)
            continue
        rungs = ladder.rungs(session.store, session.machine, w, t.iloc[0]["config"]["preset"],
                             session.facts.physical_cores)
        kept = ladder.top_end_to_end(rungs)
        if kept is not None:
            finals[w] = kept.to_dict()
            continue
        finals[w] = session.confirm(RunConfig.from_dict(t.iloc[0]["config"]), RunConfig.from_dict(t.iloc[-1]["config"]),
                                    "09_summary/headline", rounds, rounds, budget_min, resume)
        session.headline(w, t.iloc[0]["config"]["preset"], finals[w])
    return finals


def _number(value) -> float | None:
    """A table's number as a float, None where it is missing or NaN."""
    return float(value) if value is not None and value == value else None


def headline_findings(tables: dict, finals: dict, price_per_hour: float) -> list[Finding]:
    """Per workload: the ladder's end against its start in fresh paired rounds (the one
    speedup claimed), the rung that paid most by its own confirmed comparison, and cost."""
    found = []
    for w, t in tables.items():
        if t.empty:
            continue
        last, confirmed = t.iloc[-1], t[t["verdict"] == "faster"]
        top = confirmed.loc[confirmed["vs_previous"].idxmax()] if len(confirmed) else None
        values = {"largest_step": None if top is None else {"step": top.step, "change": top.change,
                                                            "ratio": float(top.vs_previous)},
                  "usd_per_1000": _number(last.usd_per_1000_samples) if _number(last.samples_per_s) else None,
                  "price_per_hour": price_per_hour, "ceiling": last.ceiling, "peak_share": _number(last.peak_share),
                  "theoretical_share": _number(last.get("theoretical_share"))}
        found.append(Finding(w, "summary", "ladder headline", values, Comparison.from_dict(finals.get(w))))
        first = t.iloc[0]
        if first.runs >= 3 and first.samples_high > SPREAD * first.samples_low:  # rates that moved between notebooks
            found.append(Finding(w, "summary", "baseline spread", {
                "runs": int(first.runs), "median": float(first.samples_per_s), "low": float(first.samples_low),
                "high": float(first.samples_high)}))
    return found


SPREAD = 1.1  # the defaults' fastest run over their slowest beyond which notebook 09 says the rates moved


def target_findings(tables: dict, finals: dict, preset: str, bf16: dict) -> list[Finding]:
    """RetinaNet's targets at this preset and its ladder's class count (``targets``), checked on its
    headline: the top against PyTorch's defaults in fresh paired rounds. Notebook 09 has no
    projection; the study pages give each target's bound (``fullstudy``)."""
    t, c = tables.get("retinanet"), finals.get("retinanet")
    if t is None or not len(t) or not c:
        return []
    classes = int(dict(t.iloc[0]["config"].get("options") or {}).get("classes", targets.RETINANET_CLASSES))
    return targets.findings(preset, classes, targets.fast_path(bf16), targets.Measured(c), stage="summary")


def steady_findings(store, machine: str, workload: str, preset: str) -> list[Finding]:
    """Whether the preset's timed window is long enough for this workload, from the paired rounds
    of every comparison of it stored on this machine (``stats.steady_window``: each arm against the
    first, round by round; one-process runs only, none that logged or traced)."""
    rounds: dict[tuple, dict[int, dict]] = {}
    for r in store.results(machine=machine):
        c = r["config"]
        if (r["status"] == "ok" and c["workload"] == workload and c["preset"] == preset and c["instances"] == 1
                and not r.get("onednn_logs") and not r.get("traces")):
            rounds.setdefault((r["sweep"], r["round"]), {})[r["arm"]] = r
    pairs: dict[tuple, list[tuple[dict, dict]]] = {}
    for (sweep, _), arms in rounds.items():
        for arm, run in arms.items():
            if arm != 0 and 0 in arms:
                pairs.setdefault((sweep, arm), []).append((arms[0], run))
    check = stats.steady_window(list(pairs.values()))
    steps = sorted({int(r["config"]["steps"]) for arms in rounds.values() for r in arms.values()})
    if check is None:
        return [Finding(workload, "summary", "steadiness unknown", {"preset": preset})]
    return [Finding(workload, "summary", "steady window", dict(check, preset=preset, steps=steps))]
