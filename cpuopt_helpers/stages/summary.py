"""Stage 09, summary: the ladder of every workload, from PyTorch's defaults to the last rung.
"""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers import compare, stats
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.decisions import Comparison, Finding


def ladder_findings(table: pd.DataFrame, workload: str = "") -> list[Finding]:
    """Each fix alone and all together against the baseline (the paper: about 2x together)."""
    if table.empty:
        return [Finding(workload, "summary", "no case study result")]
    first = table.iloc[0]["name"]
    return [Finding(workload, "summary", "arm over first", {"name": r["name"], "first": first},
                    Comparison.from_dict(r["comparison"]))
            for _, r in table.iterrows() if r["name"] != first and isinstance(r.get("comparison"), dict)]


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
        ceiling = ceiling_gflops(roofline or {}, config.dtype) if roofline else None
        rows.append({"step": rung.step, "change": rung.change, "kept": rung.kept,
                     "samples_per_s": sps, "runs": len(measured), "achieved_gflops": gflops,
                     "vs_previous": evidence.get("ratio"), "vs_previous_low": evidence.get("ci_low"),
                     "vs_previous_high": evidence.get("ci_high"), "verdict": evidence.get("verdict"),
                     "cumulative_speedup": chained["ratio"], "cumulative_low": chained["ci_low"],
                     "cumulative_high": chained["ci_high"],
                     "peak_share": gflops / ceiling if gflops and ceiling else None,
                     "theoretical_share": (gflops / (theoretical or {})[config.dtype]
                                           if gflops and (theoretical or {}).get(config.dtype) else None),
                     "ceiling": f"{config.dtype} GEMM", "config": rung.config, "comparison": evidence or None,
                     "confirmed": rung.confirmed})
    table = pd.DataFrame(rows)
    table["usd_per_1000_samples"] = price_per_hour / 3600 * 1000 / table["samples_per_s"]
    return table


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


def ladder_summary(tables: dict, finals: dict, price_per_hour: float) -> list[str]:
    """Per workload: the ladder's end against its start in fresh paired rounds (the one
    speedup claimed), the rung that paid most by its own confirmed comparison, and cost."""
    lines = []
    for w, t in tables.items():
        if t.empty:
            continue
        last = t.iloc[-1]
        final = finals.get(w)
        head = (f"{w}: the ladder's top over PyTorch's defaults, in {final['n']} fresh paired rounds: "
                f"{compare.describe(final)}"
                if final else f"{w}: nothing was handed on beyond PyTorch's defaults")
        confirmed = t[t["verdict"] == "faster"]
        if len(confirmed):
            top = confirmed.loc[confirmed["vs_previous"].idxmax()]
            head += f"; the largest confirmed step: {top.step} ({top.change}, {top.vs_previous:.2f}x the rung before)"
        if last.samples_per_s == last.samples_per_s and last.samples_per_s:
            head += f"; ${last.usd_per_1000_samples:.4f} per 1000 samples at ${price_per_hour:g}/hour"
        if last.peak_share is not None and last.peak_share == last.peak_share:
            head += f"; {last.peak_share:.0%} of the measured {last.ceiling} ceiling"
            share = last.get("theoretical_share")
            head += (f", {share:.0%} of the theoretical {last.ceiling.split()[0]} peak" if share is not None and share == share
                     else f", the theoretical {last.ceiling.split()[0]} peak unknown here (`cpuopt doctor`)")
        lines.append(head + ".")
    return lines
