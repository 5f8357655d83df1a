"""Stage 03, threading: thread count, affinity, OpenMP runtime and its settings,
oversubscription and DataLoader workers, each against the base configuration.
"""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers import stats
from cpuopt_helpers.config import RunConfig, normalise
from cpuopt_helpers.decisions import Choice, Comparison, Finding, Plan
from cpuopt_helpers.stages import choosing
from cpuopt_helpers.system import Facts


def thread_counts(physical: int, logical: int) -> list[int]:
    """1, 2, 4, ... up to the physical cores, the physical count itself, and the logical one with SMT."""
    counts = [t for t in (2**i for i in range(16)) if t < physical] + [physical]
    if logical > physical:
        counts.append(logical)
    return counts


def configs(base: RunConfig, facts: Facts, image_like: bool = True) -> Plan:
    """Notebook 03: thread scaling, affinity, OpenMP runtime and KMP_BLOCKTIME, OMP_PROC_BIND,
    oversubscription and DataLoader workers, each against the base configuration."""
    physical, logical = facts.physical_cores, facts.logical_cores
    base = normalise(base, physical)
    configs = [base] + [base.replace(threads=t) for t in thread_counts(physical, logical)]
    if facts.sockets > 1:  # on one socket scatter hands out the same cores as compact
        configs.append(base.replace(affinity="scatter"))
    configs.append(base.replace(affinity="none"))
    if facts.openmp.get("intel"):
        configs += [base.replace(omp_runtime="intel", kmp_blocktime=b) for b in (0, 1, 200)]
    configs.append(base.replace(env={"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}))
    configs.append(base.replace(threads=2 * logical, oversubscribe=True))
    if image_like:  # an input pipeline worth feeding from worker processes: decoded, augmented images
        configs += [base.replace(loader_workers=w) for w in sorted({1, physical})]
    return Plan.of(configs)


table = choosing.settings_table


def choose(table: pd.DataFrame, plan: Plan, confirm=None) -> Choice:
    """The screening winner confirmed against the base (``choosing.choose``)."""
    return choosing.choose(table, plan.workload, confirm, stage="threading")


def findings(table: pd.DataFrame, plan: Plan, scaling: pd.DataFrame) -> list[Finding]:
    """How throughput scales with threads, and each setting against the base."""
    return scaling_findings(scaling, plan.workload) + settings_findings(table, plan.workload)


def scaling_table(results: list[dict], workload: str) -> pd.DataFrame:
    """Samples/s by thread count (one instance), with ideal linear scaling from 1 thread."""
    rows = {}
    for r in results:
        c = r["config"]
        if (r["status"] == "ok" and c["workload"] == workload and c["instances"] == 1 and not c["env"]
                and c["affinity"] == "compact" and c["omp_runtime"] == "gnu" and not c["oversubscribe"]
                and not c["loader_workers"] and c["allocator"] == "default"):
            rows.setdefault(c["threads"], []).append(r["samples_per_s"])
    table = pd.DataFrame([{"threads": t, "samples_per_s": stats.summarize(v)["median"], "runs": len(v)}
                          for t, v in sorted(rows.items())])
    if len(table):
        one = table.loc[table["threads"] == table["threads"].min(), "samples_per_s"].iloc[0] / table["threads"].min()
        table["ideal"] = one * table["threads"]
        table["efficiency"] = table["samples_per_s"] / table["ideal"]
    return table


def scaling_findings(table: pd.DataFrame, workload: str) -> list[Finding]:
    """How throughput grows with threads, from the scaling table."""
    if len(table) < 2:
        return [Finding(workload, "threads", "one thread count")]
    best = table.loc[table["samples_per_s"].idxmax()]
    top, first = table.iloc[-1], table.iloc[0]
    return [Finding(workload, "threads", "thread scaling", {
        "threads": int(top.threads), "samples_per_s": float(top.samples_per_s), "efficiency": float(top.efficiency),
        "first_threads": int(first.threads), "first_samples_per_s": float(first.samples_per_s),
        "fastest_threads": int(best.threads)})]


def settings_findings(table: pd.DataFrame, workload: str) -> list[Finding]:
    """Each setting against the baseline in the words of the comparison rule (screening
    rounds below the minimum give ratios to rank by, not verdicts)."""
    if table.empty or "ratio" not in table:
        return [Finding(workload, "threads", "no baseline comparison")]
    others = [r for _, r in table[~table["is_baseline"]].dropna(subset=["ratio"]).iterrows()
              if isinstance(r.get("comparison"), dict)]
    return [Finding(workload, "threads", "setting over baseline", {"setting": r["setting"]},
                    Comparison.from_dict(r["comparison"])) for r in others if not choosing.is_screened(r)] + \
        choosing.screened_only(workload, "threads", [r for r in others if choosing.is_screened(r)])
