"""Stage 07, multi-instance: ranks x threads layouts, independent and DDP, and what a
larger global batch does to convergence.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from cpuopt_helpers import compare, planning, stats, system
from cpuopt_helpers.config import RunConfig, normalise
from cpuopt_helpers.decisions import Choice, Finding, Plan, as_comparison
from cpuopt_helpers.stages.choosing import MEMORY_WARNING, paired
from cpuopt_helpers.system import Facts


def rank_threads(node_cores: int, nodes: int, physical: int, cache_cores: int | None = None) -> list[int]:
    """Threads per rank that tile the machine: a NUMA node's physical cores halved while the
    result is whole (28, 14, 7 on a 2x28-core Xeon), whole nodes (x2, x4, ...) and all the
    cores; 1 as well where a node's count is odd, so that such machines still get several ranks;
    and an L3 cache's cores where a node holds several (``cache_cores``: 8 on a Zen 4 EPYC,
    a rank a core complex)."""
    counts = {physical, node_cores} | ({cache_cores} if cache_cores else set())
    t = node_cores
    while t % 2 == 0:
        t //= 2
        counts.add(t)
    if node_cores % 2:
        counts.add(1)
    m = 2
    while m <= nodes:
        counts.add(node_cores * m)
        m *= 2
    return sorted(c for c in counts if 1 <= c <= physical)


def layouts(machine: int | system.Topology | str | Path) -> list[tuple[int, int]]:
    """(threads per rank, ranks) pairs: on a 2x28-core Xeon the paper's Table 2 rows, 7, 14,
    28 and 56 threads per rank (``rank_threads``), each with 1, 2, 4, ... ranks and the count
    that fills the physical cores.

    A plain count is taken as one NUMA node of that many physical cores. A Topology (this
    machine's, ``system.topology()``), or the path of another machine's saved `cpuopt doctor
    --json` or `lscpu -p`, gives the node size (and an L3 cache's, where a node holds several),
    and keeps only the layouts whose ranks each stay inside a node or on whole nodes: the ones
    ``planning.assign_cores`` places.
    """
    if isinstance(machine, (str, Path)):
        machine = system.read_topology_file(str(machine))[0]
    if isinstance(machine, int):
        topo, physical, node_cores, nodes, cache_cores = None, machine, machine, 1, None
    else:
        topo, physical = machine, machine.physical_cores
        cores = {c.cpu: (c.socket, c.core) for c in machine.cpus}
        per_node = [len({cores[c] for c in cpus}) for cpus in machine.domains().values()]
        per_cache = [len({cores[c] for c in cpus}) for cpus in machine.caches().values()]
        node_cores, nodes = min(per_node), len(per_node)
        cache_cores = min(per_cache) if len(per_cache) > nodes else None
    out = []
    for threads in rank_threads(node_cores, nodes, physical, cache_cores):
        most = physical // threads
        for ranks in sorted({2**i for i in range(most.bit_length())} | {most}):
            if topo is None or planning.fits(topo, ranks, threads):
                out.append((threads, ranks))
    return out


def machine_of(facts: Facts) -> system.Topology | int:
    """What ``layouts`` takes from a machine's facts: the topology `cpuopt doctor` records, else
    (facts saved before it did) the physical core count."""
    return system.Topology.from_dict(facts.topology) if facts.topology else facts.physical_cores


def layout_plan(topology: system.Topology | str | Path) -> pd.DataFrame:
    """Every layout with the cores and NUMA nodes of each rank, as the launcher would place them:
    what notebook 07 runs on that machine (another's: the path of its doctor JSON or lscpu -p)."""
    if isinstance(topology, (str, Path)):
        topology = system.read_topology_file(str(topology))[0]
    rows = []
    for threads, ranks in layouts(topology):
        groups = planning.assign_cores(topology, ranks, threads)
        rows.append({"threads": threads, "ranks": ranks,
                     "cores": " | ".join(system.format_cpu_list(g) for g in groups),
                     "nodes": " | ".join(",".join(str(n) for n in sorted({topology.node_of(c) for c in g}))
                                         for g in groups)})
    return pd.DataFrame(rows)


def configs(base: RunConfig, facts: Facts, batch_policy: str = "per_rank") -> Plan:
    """Notebook 07: every layout as independent instances and, from two ranks, as one DDP job.

    One rank is the same process either way, so it runs once (independent)."""
    base = normalise(base, facts.physical_cores).replace(cores=None, batch_policy=batch_policy)
    configs = []
    for threads, ranks in layouts(machine_of(facts)):
        for mode in ("independent", "ddp") if ranks > 1 else ("independent",):
            configs.append(base.replace(threads=threads, instances=ranks, mode=mode))
    return Plan.of(configs)


# The paper's Table 2 (normalised throughput; rows threads per rank, columns ranks).
PAPER_TABLE2 = pd.DataFrame(
    {1: [1.00, 1.86, 3.27, 5.11], 2: [2.00, 3.70, 6.51, 10.18], 4: [3.82, 6.80, 11.20, None],
     8: [7.04, 11.59, None, None], 16: [11.87, None, None, None]}, index=[7, 14, 28, 56])
PAPER_TABLE2.index.name, PAPER_TABLE2.columns.name = "threads/rank", "ranks"


def layout_table(results: list[dict], workload: str) -> pd.DataFrame:
    """One row per (mode, threads per rank, ranks): median total samples/s, normalised to
    one rank with the fewest threads (the paper's normalisation), and the ideal for it. ``failed``
    counts a layout's runs that timed out or crashed (a layout with none finished: no numbers)."""
    rows, failed = {}, {}
    for r in results:
        if r["config"]["workload"] == workload:
            key = (r["config"]["mode"], r["config"]["threads"], r["config"]["instances"])
            (rows.setdefault(key, []) if r["status"] == "ok" else failed.setdefault(key, [])).append(r)
    table = pd.DataFrame([{"mode": m, "threads": t, "ranks": n,
                           "samples_per_s": stats.summarize([r["samples_per_s"] for r in rs])["median"],
                           "in_sync": bool(rs) and all(r.get("params_in_sync", True) for r in rs), "runs": len(rs),
                           "failed": len(failed.get((m, t, n), [])),
                           "peak_rss_mb": max((r["peak_rss_mb"] or 0 for r in rs), default=math.nan),  # largest rank
                           "config": (rs or failed[(m, t, n)])[0]["config"]}
                          for (m, t, n), rs in {**{k: [] for k in failed}, **rows}.items()])
    ones = table[(table["ranks"] == 1) & table["samples_per_s"].notna()].sort_values("threads") \
        if len(table) else table
    if ones.empty:  # nothing to normalise by: the layouts that failed, with no numbers
        return table.assign(normalised=math.nan, ideal=math.nan, efficiency=math.nan, total_rss_mb=math.nan) \
            if len(table) else table
    base_threads, base = int(ones.iloc[0]["threads"]), ones.iloc[0]["samples_per_s"]
    table["normalised"] = table["samples_per_s"] / base
    table["ideal"] = table["threads"] * table["ranks"] / base_threads
    table["efficiency"] = table["normalised"] / table["ideal"]
    table["total_rss_mb"] = table["peak_rss_mb"] * table["ranks"]  # every rank holds a copy of the model
    return table.sort_values(["mode", "threads", "ranks"]).reset_index(drop=True)


def layout_grid(table: pd.DataFrame, mode: str) -> pd.DataFrame:
    """The heat-map form: threads per rank x ranks, normalised throughput; one rank from independent."""
    rows = table[(table["mode"] == mode) | (table["ranks"] == 1)]
    grid = rows.pivot_table(index="threads", columns="ranks", values="normalised", aggfunc="max")
    grid.index.name, grid.columns.name = "threads/rank", "ranks"
    return grid


def layout_findings(table: pd.DataFrame, results: list[dict], workload: str) -> list[Finding]:
    """Best layout, DDP against independent instances, scaling efficiency and the sync check."""
    def note(kind: str, comparison=None, **values) -> Finding:
        return Finding(workload, "multi_instance", kind, values, as_comparison(comparison))

    table = table[table["runs"] > 0] if len(table) else table  # a layout that never finished: its failures say why
    if table.empty or table["normalised"].isna().all():
        return [note("no layout", what=workload)]
    found = []
    for mode in ("independent", "ddp"):
        rows = table[(table["mode"] == mode) & (table["ranks"] > 1)]
        if rows.empty:
            continue
        best = rows.sort_values("samples_per_s", ascending=False).iloc[0]
        # one process on the same cores: the layout a user would otherwise run
        alone = table[(table["ranks"] == 1) & (table["threads"] == best.threads * best.ranks)]
        found.append(note("best layout", mode=mode, ranks=int(best.ranks), threads=int(best.threads),
                          one_process_samples_per_s=float(alone["samples_per_s"].iloc[0]) if len(alone) else None,
                          samples_per_s=float(best.samples_per_s), normalised=float(best.normalised),
                          runs=int(best.runs),
                          ideal=float(best.ideal), efficiency=float(best.efficiency),
                          # the reference normalised by: one rank on the fewest threads measured
                          base_threads=round(best.threads * best.ranks / best.ideal),
                          base_samples_per_s=float(best.samples_per_s / best.normalised)))
    hashes = {}
    for r in results:
        if r["status"] == "ok" and r["config"]["workload"] == workload:
            c = r["config"]
            hashes[(c["mode"], c["threads"], c["instances"])] = r["config_hash"]
    for (mode, threads, ranks), h in sorted(hashes.items()):
        twin = hashes.get(("independent", threads, ranks))
        if mode == "ddp" and twin:
            found.append(note("ddp over independent", paired(results, twin, h), ranks=ranks, threads=threads))
    ddp = table[table["mode"] == "ddp"]
    if len(ddp):
        found.append(note("ddp in sync", in_sync=int(ddp["in_sync"].sum()), layouts=len(ddp)))
    return found


def table(results: list[dict], plan: Plan) -> pd.DataFrame:
    """``layout_table`` of the plan's workload."""
    return layout_table(results, plan.workload)


def findings(table: pd.DataFrame, plan: Plan, results: list[dict]) -> list[Finding]:
    """``layout_findings`` of the plan's workload."""
    return layout_findings(table, results, plan.workload)


def choose(table: pd.DataFrame, plan: Plan, confirm=None) -> Choice:
    """The layout to hand on: the fastest DDP job (one model trained by several ranks) if a
    fresh comparison against one rank on all cores says faster, else one rank on all cores.
    The finding gives the memory the DDP job holds where it exceeds one rank's by more than
    MEMORY_WARNING."""
    workload = plan.workload

    def decided(config, kind, comparison=None, **values) -> Choice:
        comparison = as_comparison(comparison)
        finding = Finding(workload, "multi-instance", kind, dict(values, what=workload), comparison)
        return Choice(RunConfig.from_dict(config) if config is not None else None, comparison, finding)

    table = table.dropna(subset=["samples_per_s"]) if len(table) else table  # a layout never finished: no candidate
    if table.empty or "normalised" not in table:
        return decided(None, "no layout")
    single = table[table["ranks"] == 1].sort_values("threads").iloc[-1]
    ddp = table[(table["mode"] == "ddp") & table["in_sync"]].sort_values("samples_per_s", ascending=False)
    if ddp.empty:
        return decided(single["config"], "no ddp layout")
    best = ddp.iloc[0]
    values = {"ranks": int(best.ranks), "threads": int(best.threads), "single_threads": int(single.threads),
              "ddp_sps": float(best.samples_per_s), "single_sps": float(single.samples_per_s),
              "total_rss_mb": None, "rss_growth": None}
    if single["total_rss_mb"] and best["total_rss_mb"] > MEMORY_WARNING * single["total_rss_mb"]:
        values.update(total_rss_mb=float(best.total_rss_mb), rss_growth=float(best.total_rss_mb / single.total_rss_mb - 1))
    if best["samples_per_s"] <= single["samples_per_s"] or confirm is None:
        return decided(single["config"], "ddp not screened faster", **values)
    result = confirm(RunConfig.from_dict(single["config"]), RunConfig.from_dict(best["config"]))
    return decided(best["config"] if compare.pays(result) else single["config"], "ddp confirmed", result,
                   **values)


def epochs_to_target(history: list[dict], target: float) -> int | None:
    """First epoch (1-based) whose test accuracy reaches the target; None if none does."""
    return next((i + 1 for i, h in enumerate(history) if h["accuracy"] >= target), None)


def convergence_table(runs: list[dict], target: float) -> pd.DataFrame:
    return pd.DataFrame([{"global_batch": r["batch_size"], "lr": r["lr"], "steps_per_epoch":
                          -(-r["train_samples"] // r["batch_size"]), "epochs_to_target": epochs_to_target(
                              r["history"], target), "final_accuracy": r["final_accuracy"]} for r in runs])


def convergence_findings(table: pd.DataFrame, target: float) -> list[Finding]:
    """Epochs to the target accuracy at each global batch (on the digits), and what a larger one cost."""
    def epochs(value) -> int | None:
        return int(value) if value is not None and value == value else None

    found = [Finding("", "multi_instance", "epochs to target", {
        "global_batch": int(r.global_batch), "epochs": epochs(r.epochs_to_target), "target": target,
        "final_accuracy": float(r.final_accuracy)}) for r in table.itertuples()]
    reached = table.dropna(subset=["epochs_to_target"])
    if len(reached) >= 2:
        small, large = reached.iloc[0], reached.iloc[-1]
        found.append(Finding("", "multi_instance", "larger global batch", {
            "factor": int(large.global_batch / small.global_batch), "small_epochs": int(small.epochs_to_target),
            "large_epochs": int(large.epochs_to_target),
            "unreached": [int(b) for b in table[table["epochs_to_target"].isna()]["global_batch"]]}))
    return found
