"""Tables and worded findings computed from results (what the notebooks display)."""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers import compare, stats
from cpuopt_helpers.config import RunConfig

PHASES = ("forward", "backward", "optimizer")


def throughput_table(results: list[dict]) -> pd.DataFrame:
    """One row per workload: median samples/s over runs with their range (low-high; a few
    runs give no honest interval of their own), median step and phase times, achieved
    GFLOP/s, and the spread warning."""
    rows = {}
    for r in results:
        if r["status"] == "ok":
            rows.setdefault(r["config"]["workload"], []).append(r)
    out = []
    for workload, runs in rows.items():
        sps = [r["samples_per_s"] for r in runs]
        step = stats.summarize([r["step_ms"]["median"] for r in runs])["median"]
        row = {"workload": workload, "samples_per_s": stats.summarize(sps)["median"], "low": min(sps),
               "high": max(sps), "runs": len(runs), "step_ms": step,
               "gflops": stats.summarize([r["achieved_gflops"] or 0 for r in runs])["median"],
               "startup_s": stats.summarize([r["startup_s"] for r in runs])["median"],
               "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
               "warning": stats.spread_warning(sps, f"{workload} samples/s")}
        for phase in PHASES:
            row[f"{phase}_ms"] = stats.summarize([r["phase_ms"][phase] for r in runs])["median"]
        timed = sum(row[f"{p}_ms"] for p in PHASES)
        for phase in PHASES:
            row[f"{phase}_share"] = row[f"{phase}_ms"] / step
        row["other_share"] = max(0.0, 1 - timed / step)
        out.append(row)
    return pd.DataFrame(out).set_index("workload") if out else pd.DataFrame()


def failures(results: list[dict]) -> list[str]:
    return [f"{r['label']}: {r['status']}: {r['reason'].splitlines()[0] if r['reason'] else ''}"
            for r in results if r["status"] != "ok"]


def baseline_findings(table: pd.DataFrame, peak_gflops: float | None) -> list[str]:
    """Sentences about the baseline, computed from its table."""
    if table.empty:
        return ["No workload produced a result; see the failures above."]
    lines = []
    for name, row in table.iterrows():
        dominant = max(PHASES, key=lambda p: row[f"{p}_share"])
        share = f", {row['gflops'] / peak_gflops:.0%} of the measured fp32 GEMM peak" if peak_gflops else ""
        lines.append(f"{name}: {row['samples_per_s']:.1f} samples/s (median of {row['runs']} runs, range "
                     f"{row['low']:.1f}-{row['high']:.1f}); {dominant} takes {row[f'{dominant}_share']:.0%} of a "
                     f"{row['step_ms']:.1f} ms step; {row['gflops']:.1f} GFLOP/s achieved{share}.")
    if peak_gflops:
        efficiency = table["gflops"] / peak_gflops
        lo, hi = efficiency.idxmin(), efficiency.idxmax()
        lines.append(f"Furthest from the GEMM ceiling: {lo} ({efficiency[lo]:.0%}); closest: {hi} "
                     f"({efficiency[hi]:.0%}). The gap is the room that the next notebooks try to win.")
    lines += [w for w in table["warning"].dropna()]
    return lines


def system_findings(facts: dict, roofline: dict) -> list[str]:
    """Sentences about the machine and its ceilings, from the facts and measurements."""
    isa = facts["isa"]
    wide = "AVX-512" if isa.get("avx512f") else "AVX2" if isa.get("avx2") else "no AVX2"
    balance = roofline["gemm_gflops_best"] / roofline["copy_gbs_best"]
    lines = [
        f"{facts['cpu_model']}: {facts['physical_cores']} physical / {facts['logical_cores']} logical cores "
        f"on {facts['sockets']} socket(s) and {len(facts['numa_nodes'])} NUMA node(s); widest vector ISA: {wide}.",
        f"Measured ceilings on {roofline['threads']} threads: fp32 GEMM {roofline['gemm_gflops_best']:.0f} GFLOP/s, "
        f"memory copy {roofline['copy_gbs_best']:.1f} GB/s; a kernel needs about {balance:.0f} FLOP per byte "
        "moved to be compute-bound here.",
    ]
    bf16_isa = [f for f in ("amx_bf16", "avx512_bf16", "avx_ne_convert") if isa.get(f)]
    lines.append(f"bf16: CPU flags {', '.join(bf16_isa) if bf16_isa else 'none of amx_bf16/avx512_bf16/avx_ne_convert'}; "
                 f"oneDNN reports bf16 support: {'yes' if facts['versions']['onednn_bf16_supported'] else 'no'}.")
    missing = facts["missing"]
    lines.append("Missing: " + ("; ".join(f"{k} ({v})" for k, v in missing.items()) if missing
                                else "nothing; every allocator and OpenMP runtime can be measured."))
    if facts["numactl"]["present"] and not facts["numactl"]["works"]:
        lines.append(f"numactl is installed but refused here ({facts['numactl']['reason']}); "
                     "runs pin with taskset or sched_setaffinity instead.")
    return lines


def setting_label(config: dict, baseline: dict) -> str:
    """What a configuration changes against the baseline, e.g. 'omp_runtime=intel kmp_blocktime=0'."""
    skip = {"timeout_s", "onednn_verbose", "trace", "options"}
    parts = [f"{k}={v}" for k, v in config.items() if k not in skip and v != baseline.get(k)]
    mine, theirs = config.get("options") or {}, baseline.get("options") or {}  # a workload's options by name
    parts += [f"{k}={mine.get(k, 'default')}" for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    return " ".join(parts) or "baseline"


def compare_configs(results: list[dict], baseline: dict, workload: str | None = None) -> pd.DataFrame:
    """One row per arm of a sweep: median samples/s with the range over rounds, peak RSS,
    and the ratio to the baseline arm paired round by round (``compare.paired_ratio``:
    ``ratio_low``/``ratio_high`` are its interval, NaN below the minimum rounds)."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        if r["status"] == "ok" and (workload is None or r["config"]["workload"] == workload):
            groups.setdefault((r.get("sweep"), r.get("arm", 0)), []).append(r)
    base_key = next((k for k, rs in sorted(groups.items(), key=lambda kv: kv[0][1])
                     if setting_label(rs[0]["config"], baseline) == "baseline"), None)
    base_by_round = {(r.get("sweep"), r["round"]): r["samples_per_s"] for r in groups.get(base_key, [])}
    rows = []
    for key, runs in groups.items():
        sps = [r["samples_per_s"] for r in runs]
        row = {"setting": "baseline" if key == base_key else setting_label(runs[0]["config"], baseline),
               "samples_per_s": stats.summarize(sps)["median"], "low": min(sps), "high": max(sps), "runs": len(runs),
               "peak_rss_mb": stats.summarize([r["peak_rss_mb"] for r in runs])["median"],
               "config_hash": runs[0]["config_hash"], "arm": key[1], "config": runs[0]["config"]}
        pairs = [(base_by_round[(r.get("sweep"), r["round"])], r["samples_per_s"]) for r in runs
                 if (r.get("sweep"), r["round"]) in base_by_round]
        if pairs and key != base_key:
            ratio = compare.paired_ratio([a for a, _ in pairs], [b for _, b in pairs])
            row.update(ratio=ratio["ratio"], ratio_low=ratio["ci_low"], ratio_high=ratio["ci_high"],
                       verdict=ratio["verdict"], comparison=ratio)
        elif key == base_key:
            row.update(ratio=1.0)
        if row["setting"] == "baseline" and key != base_key:
            row["setting"] = "baseline (repeat arm)"
        rows.append(row)
    table = pd.DataFrame(rows)
    return table.sort_values("samples_per_s", ascending=False).reset_index(drop=True) if len(table) else table


def choose(table: pd.DataFrame, what: str, confirm=None, candidates: pd.DataFrame | None = None
           ) -> tuple[dict | None, str, dict | None]:
    """The configuration to hand on, the sentence that says why, and the comparison behind it.

    Screening ranks the settings (highest paired ratio to the baseline); picking the best
    of several is a selection, so the winner is confirmed against the baseline in fresh,
    adaptive rounds (``confirm(baseline_config, winner_config) -> compare result``, e.g.
    ``Session.confirm``) and handed on only on the verdict ``faster``.
    """
    if table.empty:
        return None, f"{what}: no setting produced a result.", None
    base = table[table["setting"] == "baseline"]
    pool = table if candidates is None else candidates
    others = pool[pool["setting"] != "baseline"].dropna(subset=["ratio"]) if "ratio" in pool else pool.iloc[0:0]
    if base.empty:
        return None, f"{what}: the baseline produced no result; nothing is handed on.", None
    base = base.iloc[0]
    if others.empty:
        return base["config"], f"{what}: no other setting produced a result; the baseline is kept.", None
    best = others.sort_values("ratio", ascending=False).iloc[0]
    screened = f"{best['setting']} screened best at {best['ratio']:.2f}x the baseline over {best['runs']} round(s)"
    if best["ratio"] <= 1.0:
        return base["config"], f"{what}: no setting beat the baseline in screening ({screened}); the baseline is kept.", None
    if confirm is None:
        return base["config"], f"{what}: {screened}, not confirmed; the baseline is kept.", None
    result = confirm(RunConfig.from_dict(base["config"]), RunConfig.from_dict(best["config"]))
    sentence = f"{what}: {screened}; confirmed in fresh rounds: {compare.describe(result)}"
    if result["verdict"] == "faster":
        return best["config"], sentence + ": handed on.", result
    return base["config"], sentence + "; the baseline is kept.", result


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


def scaling_findings(table: pd.DataFrame, workload: str) -> list[str]:
    """How throughput grows with threads, from the scaling table."""
    if len(table) < 2:
        return [f"{workload}: only one thread count measured."]
    best = table.loc[table["samples_per_s"].idxmax()]
    top = table.iloc[-1]
    return [f"{workload}: {int(top.threads)} threads give {top.samples_per_s:.1f} samples/s, "
            f"{top.samples_per_s / table.iloc[0].samples_per_s:.2f}x of {int(table.iloc[0].threads)} thread(s) "
            f"({top.efficiency:.0%} of ideal linear scaling); the fastest count is {int(best.threads)}."]


def settings_findings(table: pd.DataFrame, workload: str) -> list[str]:
    """Each setting against the baseline in the words of the comparison rule (screening
    rounds below the minimum give ratios to rank by, not verdicts)."""
    if table.empty or "ratio" not in table:
        return [f"{workload}: no comparison with the baseline was possible."]
    others = table[table["setting"] != "baseline"].dropna(subset=["ratio"])
    return [f"{workload}: {r['setting']}: {compare.describe(r['comparison'])}." for _, r in others.iterrows()
            if isinstance(r.get("comparison"), dict)]


def memory_findings(table: pd.DataFrame, workload: str) -> list[str]:
    """Peak resident memory of each setting against the baseline's."""
    base = table[table["setting"] == "baseline"]
    if base.empty:
        return []
    rss = base.iloc[0]["peak_rss_mb"]
    parts = [f"{r.setting} {r.peak_rss_mb:.0f} MB ({r.peak_rss_mb / rss - 1:+.0%})"
             for r in table.itertuples() if r.setting != "baseline"]
    return [f"{workload}: peak RSS {rss:.0f} MB with glibc; " + "; ".join(parts) + "."] if parts else []


def run_cpu_choices(results: list[dict]) -> str:
    """What run_cpu decided in its own words (allocator, OpenMP, binding), from its log."""
    logs = [r.get("launcher_log", "") for r in results if r.get("launcher_log")]
    if not logs:
        return "run_cpu did not run (or logged nothing)."
    lines = [line.split(" - ", 3)[-1] for line in logs[0].splitlines()]
    return "run_cpu's log of its choices:\n" + "\n".join(f"  {line[:200]}" for line in lines)


def launcher_findings(table: pd.DataFrame, workload: str) -> list[str]:
    """The measured ratio of run_cpu's defaults and of the best setting to PyTorch's defaults."""
    lines = []
    for _, r in table.iterrows():
        if not isinstance(r.get("comparison"), dict):
            continue
        who = "run_cpu's defaults" if "launcher=run_cpu" in r["setting"] else f"the best setting ({r['setting']})"
        lines.append(f"{workload}: {who} over PyTorch's defaults: {compare.describe(r['comparison'])}.")
    if not lines:
        lines.append(f"{workload}: the best setting is PyTorch's defaults; compared with run_cpu only.")
    return lines


def allocator_summary(chosen: dict, missing: dict) -> list[str]:
    """One sentence across workloads: which allocator is handed on where, and what was not measured."""
    wins = {}
    for w, config in chosen.items():
        wins.setdefault(config["allocator"] if config else "none", []).append(w)
    lines = [f"{alloc} is handed on for {', '.join(ws)}." for alloc, ws in wins.items()]
    if missing:
        lines.append("Not measured (not installed): " + ", ".join(missing) + ".")
    return lines


def accuracy_table(runs: list[dict]) -> pd.DataFrame:
    """Final test accuracy and loss of each precision mode on the digits."""
    return pd.DataFrame([{"mode": r["mode"], "final_accuracy": r["final_accuracy"], "final_loss": r["final_loss"],
                          "best_accuracy": max(h["accuracy"] for h in r["history"]), "epochs": r["epochs"]}
                         for r in runs]).set_index("mode")


def precision_findings(tables: dict, accuracy: pd.DataFrame, gate: dict) -> list[str]:
    """bf16 against fp32: the gate, the screening ratios per workload and layout, and accuracy."""
    lines = [f"bf16 fast path on this CPU: {'yes, ' + gate['path'] if gate['accelerated'] else 'no'} "
             f"({gate['reason']})."]
    for w, t in tables.items():
        for _, r in t.iterrows():
            if "dtype=bf16" in r["setting"] and isinstance(r.get("comparison"), dict):
                lines.append(f"{w}: {r['setting']} over fp32: {compare.describe(r['comparison'])}.")
    if "fp32" in accuracy.index:
        base = accuracy.loc["fp32", "final_accuracy"]
        for mode, row in accuracy.iterrows():
            if mode != "fp32":
                lines.append(f"digits, {mode}: final test accuracy {row.final_accuracy:.1%} vs {base:.1%} in fp32 "
                             f"({(row.final_accuracy - base) * 100:+.1f} points); final loss {row.final_loss:.4f}.")
    return lines


def slow_kernels(df: pd.DataFrame, top: int = 5) -> list[str]:
    """The implementations that take the most oneDNN time, with their ISA: names the slow kernels."""
    if df.empty:
        return ["No oneDNN primitive ran."]
    by_impl = df.groupby(["kind", "impl"])["time_ms"].agg(["sum", "count"]).sort_values("sum", ascending=False)
    total = by_impl["sum"].sum()
    return ["Slowest kernels: " + "; ".join(f"{kind} {impl} {row['sum'] / total:.0%} ({int(row['count'])} calls)"
                                            for (kind, impl), row in by_impl.head(top).iterrows()) + "."]


def choose_precision(table: pd.DataFrame, accuracy: pd.DataFrame, gate: dict, what: str, confirm=None,
                     tolerance: float = 0.01) -> tuple[dict | None, str, dict | None]:
    """The bf16 configuration to hand on (or None to keep fp32), why, and the comparison.

    bf16 is a candidate only with a fast path and within `tolerance` of fp32's accuracy on
    the digits; then the fastest bf16 setting screened (with or without channels-last) is
    confirmed against fp32 like every other choice.
    """
    if not gate["accelerated"]:
        return None, f"{what}: fp32 kept: this CPU has no bf16 fast path ({gate['reason']}).", None
    if not {"fp32", "bf16"} <= set(accuracy.index):
        return None, f"{what}: fp32 kept: the digits accuracy check did not run.", None
    drop = accuracy.loc["fp32", "final_accuracy"] - accuracy.loc["bf16", "final_accuracy"]
    if drop > tolerance:
        return None, f"{what}: fp32 kept: bf16 lost {drop:.1%} accuracy on the digits (tolerance {tolerance:.0%}).", None
    bf16 = table[table["setting"].str.contains("dtype=bf16")] if len(table) else table
    chosen, sentence, result = choose(table, what, confirm, candidates=bf16)
    return (chosen if chosen is not None and chosen.get("dtype") == "bf16" else None), sentence, result


def paired(results: list[dict], a: str, b: str) -> dict | None:
    """Throughput of config b over config a (hashes), paired by the rounds of their sweep."""
    by = {h: {(r.get("sweep"), r["round"]): r["samples_per_s"] for r in results
              if r["status"] == "ok" and r["config_hash"] == h} for h in (a, b)}
    rounds = sorted(set(by[a]) & set(by[b]), key=str)
    if not rounds:
        return None
    return compare.paired_ratio([by[a][k] for k in rounds], [by[b][k] for k in rounds])


def named_table(results: list[dict], configs: dict) -> pd.DataFrame:
    """compare_configs against the first named config, with a `name` column, in the given order."""
    names = {c.config_hash(): n for n, c in configs.items()}
    first = next(iter(configs.values()))
    table = compare_configs([r for r in results if r["config_hash"] in names], first.to_dict(), first.workload)
    if table.empty:
        return table
    table.insert(0, "name", table["config_hash"].map(names))
    for key in ("compile_s", "compile_warm_s"):  # cold (fresh Inductor cache) and warm compile times
        times: dict[str, list[float]] = {}
        for r in results:
            if r["status"] == "ok" and r.get(key) and r["config_hash"] in names:
                times.setdefault(r["config_hash"], []).append(r[key])
        table[key] = table["config_hash"].map(lambda h: stats.summarize(times[h])["median"] if h in times else None)
    table["step_ms"] = [None] * len(table)
    for i, h in enumerate(table["config_hash"]):
        steps = [r["step_ms"]["median"] for r in results if r["status"] == "ok" and r["config_hash"] == h]
        table.at[i, "step_ms"] = stats.summarize(steps)["median"] if steps else None
    order = {n: i for i, n in enumerate(configs)}
    return table.sort_values("name", key=lambda s: s.map(order)).reset_index(drop=True)


def breakeven_steps(compile_s: float, eager_step_ms: float, compiled_step_ms: float) -> float | None:
    """Training steps after which compiling has paid for its compile time (None: it never does)."""
    saving_s = (eager_step_ms - compiled_step_ms) / 1e3
    return compile_s / saving_s if saving_s > 0 else None


def runtime_findings(results: list[dict], configs: dict, table: pd.DataFrame, workload: str) -> list[str]:
    """Notebook 05's answer for one workload, worded from its measurements."""
    if table.empty:
        return [f"{workload}: no configuration produced a result."]
    h = {n: c.config_hash() for n, c in configs.items()}
    lines = []
    if "torch 2.8 + IPEX" in h:
        lines.append(f"{workload}: IPEX over its own stock torch 2.8: "
                     f"{compare.describe(paired(results, h['torch 2.8 (stock)'], h['torch 2.8 + IPEX']))}.")
        lines.append(f"{workload}: stock torch (this venv) over torch 2.8 + IPEX: "
                     f"{compare.describe(paired(results, h['torch 2.8 + IPEX'], h['torch (stock)']))}.")
    upstream = table[~table["name"].isin(["torch 2.8 (stock)", "torch 2.8 + IPEX", "AdamW (default)",
                                          "AdamW fused"]) & (table["setting"] != "baseline")].dropna(subset=["ratio"])
    best = upstream.sort_values("ratio", ascending=False).iloc[0] if len(upstream) else None
    if best is not None:
        lines.append(f"{workload}: fastest with this torch in screening: {best['name']} at "
                     f"{best['samples_per_s']:.1f} samples/s, {compare.describe(best['comparison'])} against stock.")
        if "torch 2.8 + IPEX" in h:
            lines.append(f"{workload}: {best['name']} over torch 2.8 + IPEX: "
                         f"{compare.describe(paired(results, h['torch 2.8 + IPEX'], best['config_hash']))}.")
    if "AdamW fused" in h:
        lines.append(f"{workload}: fused AdamW over the default AdamW: "
                     f"{compare.describe(paired(results, h['AdamW (default)'], h['AdamW fused']))}.")
    eager = table[table["name"] == "torch (stock)"]
    for row in table[table["compile_s"].notna()].itertuples():
        if eager.empty:
            break
        steps = breakeven_steps(row.compile_s, eager.iloc[0]["step_ms"], row.step_ms)
        warm = f", {row.compile_warm_s:.0f} s again with a warm cache" if row.compile_warm_s == row.compile_warm_s \
            and row.compile_warm_s is not None else ""
        lines.append(f"{workload}: {row.name} compiled in {row.compile_s:.0f} s from a cold cache{warm}; "
                     + (f"it pays for itself after {steps:,.0f} steps." if steps else
                        "its steps are not faster, so it never pays for itself."))
    return lines


def choose_upstream(table: pd.DataFrame, configs: dict, confirm=None) -> tuple[dict | None, str, dict | None]:
    """Notebook 05's hand-on: the fastest eager setting of this torch (no IPEX runtime, no compile).

    IPEX is archived and runs only in its own torch 2.8 runtime; torch.compile costs its
    compile time in every new process, and the later notebooks start many short ones.
    Both are reported, neither is handed on; the choice is made like every other (ratio
    above 1 over the whole interval).
    """
    eager = [n for n, c in configs.items() if c.runtime == "main" and not c.compile and c.optimizer == "sgd"]
    return choose(table, "runtime", confirm, candidates=table[table["name"].isin(eager)])


# The paper's Table 2 (normalised throughput; rows threads per rank, columns ranks).
PAPER_TABLE2 = pd.DataFrame(
    {1: [1.00, 1.86, 3.27, 5.11], 2: [2.00, 3.70, 6.51, 10.18], 4: [3.82, 6.80, 11.20, None],
     8: [7.04, 11.59, None, None], 16: [11.87, None, None, None]}, index=[7, 14, 28, 56])
PAPER_TABLE2.index.name, PAPER_TABLE2.columns.name = "threads/rank", "ranks"


def layout_table(results: list[dict], workload: str) -> pd.DataFrame:
    """One row per (mode, threads per rank, ranks): median total samples/s, normalised to
    one rank with the fewest threads (the paper's normalisation), and the ideal for it."""
    rows = {}
    for r in results:
        if r["status"] == "ok" and r["config"]["workload"] == workload:
            c = r["config"]
            rows.setdefault((c["mode"], c["threads"], c["instances"]), []).append(r)
    table = pd.DataFrame([{"mode": m, "threads": t, "ranks": n,
                           "samples_per_s": stats.summarize([r["samples_per_s"] for r in rs])["median"],
                           "in_sync": all(r.get("params_in_sync", True) for r in rs), "runs": len(rs),
                           "config": rs[0]["config"]} for (m, t, n), rs in rows.items()])
    if table.empty:
        return table
    ones = table[table["ranks"] == 1].sort_values("threads")
    base_threads, base = int(ones.iloc[0]["threads"]), ones.iloc[0]["samples_per_s"]
    table["normalised"] = table["samples_per_s"] / base
    table["ideal"] = table["threads"] * table["ranks"] / base_threads
    table["efficiency"] = table["normalised"] / table["ideal"]
    return table.sort_values(["mode", "threads", "ranks"]).reset_index(drop=True)


def layout_grid(table: pd.DataFrame, mode: str) -> pd.DataFrame:
    """The heat-map form: threads per rank x ranks, normalised throughput; one rank from independent."""
    rows = table[(table["mode"] == mode) | (table["ranks"] == 1)]
    grid = rows.pivot_table(index="threads", columns="ranks", values="normalised", aggfunc="max")
    grid.index.name, grid.columns.name = "threads/rank", "ranks"
    return grid


def layout_findings(table: pd.DataFrame, results: list[dict], workload: str) -> list[str]:
    """Best layout, DDP against independent instances, scaling efficiency and the sync check."""
    if table.empty:
        return [f"{workload}: no layout produced a result."]
    lines = []
    for mode in ("independent", "ddp"):
        rows = table[(table["mode"] == mode) & (table["ranks"] > 1)]
        if rows.empty:
            continue
        best = rows.sort_values("samples_per_s", ascending=False).iloc[0]
        lines.append(f"{workload}, {mode}: best multi-rank layout {int(best.ranks)} ranks x {int(best.threads)} "
                     f"threads at {best.samples_per_s:.1f} samples/s = {best.normalised:.2f}x the single-rank "
                     f"reference (ideal {best.ideal:.0f}x, efficiency {best.efficiency:.0%}).")
    hashes = {}
    for r in results:
        if r["status"] == "ok" and r["config"]["workload"] == workload:
            c = r["config"]
            hashes[(c["mode"], c["threads"], c["instances"])] = r["config_hash"]
    for (mode, threads, ranks), h in sorted(hashes.items()):
        twin = hashes.get(("independent", threads, ranks))
        if mode == "ddp" and twin:
            ratio = paired(results, twin, h)
            lines.append(f"{workload}: DDP over independent instances at {ranks} x {threads}: {compare.describe(ratio)} "
                         "(the difference is the gradient all-reduce).")
    ddp = table[table["mode"] == "ddp"]
    if len(ddp):
        lines.append(f"{workload}: parameters identical on every rank after training in "
                     f"{int(ddp['in_sync'].sum())} of {len(ddp)} DDP layouts.")
    return lines


def choose_layout(table: pd.DataFrame, confirm=None) -> tuple[dict | None, str, dict | None]:
    """The layout to hand on: the fastest DDP job (one model trained by several ranks) if a
    fresh comparison against one rank on all cores says faster, else one rank on all cores."""
    if table.empty:
        return None, "layout: no result.", None
    single = table[table["ranks"] == 1].sort_values("threads").iloc[-1]
    ddp = table[(table["mode"] == "ddp") & table["in_sync"]].sort_values("samples_per_s", ascending=False)
    if ddp.empty:
        return single["config"], "layout: no DDP layout fits here; one rank on all cores is kept.", None
    best = ddp.iloc[0]
    where = f"DDP {int(best.ranks)} ranks x {int(best.threads)} threads"
    if best["samples_per_s"] <= single["samples_per_s"] or confirm is None:
        return single["config"], (f"layout: {where} screened at {best.samples_per_s:.1f} samples/s against one rank's "
                                  f"{single.samples_per_s:.1f}; one rank on all cores is kept."), None
    result = confirm(RunConfig.from_dict(single["config"]), RunConfig.from_dict(best["config"]))
    sentence = f"layout: {where} over one rank x {int(single.threads)} threads, in fresh rounds: {compare.describe(result)}"
    if result["verdict"] == "faster":
        return best["config"], sentence + ": handed on.", result
    return single["config"], sentence + "; one rank on all cores is kept.", result


def epochs_to_target(history: list[dict], target: float) -> int | None:
    """First epoch (1-based) whose test accuracy reaches the target; None if none does."""
    return next((i + 1 for i, h in enumerate(history) if h["accuracy"] >= target), None)


def convergence_table(runs: list[dict], target: float) -> pd.DataFrame:
    return pd.DataFrame([{"global_batch": r["batch_size"], "lr": r["lr"], "steps_per_epoch":
                          -(-r["train_samples"] // r["batch_size"]), "epochs_to_target": epochs_to_target(
                              r["history"], target), "final_accuracy": r["final_accuracy"]} for r in runs])


def convergence_findings(table: pd.DataFrame, target: float) -> list[str]:
    reached = table.dropna(subset=["epochs_to_target"])
    lines = [f"global batch {int(r.global_batch)}: "
             + (f"{int(r.epochs_to_target)} epochs to {target:.0%} test accuracy"
                if r.epochs_to_target == r.epochs_to_target and r.epochs_to_target is not None
                else f"did not reach {target:.0%} (final {r.final_accuracy:.1%})")
             for r in table.itertuples()]
    if len(reached) >= 2:
        small, large = reached.iloc[0], reached.iloc[-1]
        trend = ("more" if large.epochs_to_target > small.epochs_to_target else
                 "fewer" if large.epochs_to_target < small.epochs_to_target else "as many")
        lines.append(f"a {int(large.global_batch / small.global_batch)}x larger global batch needed {trend} epochs "
                     f"({int(small.epochs_to_target)} -> {int(large.epochs_to_target)}): adding ranks at a fixed "
                     "per-rank batch grows the global batch, so "
                     + ("lower the per-rank batch as ranks are added." if trend == "more" else
                        "on this dataset that cost did not show."))
    return lines


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


def ladder_findings(table: pd.DataFrame) -> list[str]:
    """Each fix alone and all together against the baseline (the paper: about 2x together)."""
    if table.empty:
        return ["case study: no configuration produced a result."]
    base = table.iloc[0]["name"]
    return [f"{r['name']} over {base}: {compare.describe(r['comparison'])}." for _, r in table.iterrows()
            if r["name"] != base and isinstance(r.get("comparison"), dict)]


def ladder_table(store, machine: str, workload: str, preset: str, roofline: dict | None,
                 price_per_hour: float, physical_cores: int) -> pd.DataFrame:
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
    for r in store.results(machine=machine):
        if r["status"] == "ok" and r["config"]["workload"] == workload:
            runs.setdefault(RunConfig.from_dict(r["config"]).config_hash(), []).append(r)  # today's hash
    rows = []
    for rung in rungs:
        config = RunConfig.from_dict(rung["config"])
        measured = runs.get(config.config_hash(), [])
        sps = stats.summarize([r["samples_per_s"] for r in measured])["median"] if measured else None
        gflops = stats.summarize([r["achieved_gflops"] for r in measured if r.get("achieved_gflops")])["median"] \
            if any(r.get("achieved_gflops") for r in measured) else None
        evidence, chained = rung["vs_previous"] or {}, rung["vs_baseline"]
        ceiling = ceiling_gflops(roofline or {}, config.dtype) if roofline else None
        rows.append({"step": rung["step"], "change": rung["change"],
                     "samples_per_s": sps, "runs": len(measured), "achieved_gflops": gflops,
                     "vs_previous": evidence.get("ratio"), "vs_previous_low": evidence.get("ci_low"),
                     "vs_previous_high": evidence.get("ci_high"), "verdict": evidence.get("verdict"),
                     "cumulative_speedup": chained["ratio"], "cumulative_low": chained["ci_low"],
                     "cumulative_high": chained["ci_high"],
                     "peak_share": gflops / ceiling if gflops and ceiling else None,
                     "ceiling": f"{config.dtype} GEMM", "config": rung["config"], "comparison": rung["vs_previous"],
                     "confirmed": rung["confirmed"]})
    table = pd.DataFrame(rows)
    table["usd_per_1000_samples"] = price_per_hour / 3600 * 1000 / table["samples_per_s"]
    return table


def one_rung_final(table: pd.DataFrame) -> dict | None:
    """The ladder's end against its start where one rung made the whole change: that rung's
    own comparison, which paired exactly these two configurations in fresh rounds, so it is
    reused rather than run again (None where several rungs changed something)."""
    if len(table) < 2:
        return None
    changed = table.iloc[1:][table["change"].iloc[1:] != "kept"]
    if len(changed) != 1 or changed.iloc[0]["config"] != table.iloc[-1]["config"]:
        return None
    comparison = changed.iloc[0]["comparison"]
    if not changed.iloc[0]["confirmed"]:  # a change its comparison did not confirm between these two
        return None
    return dict(comparison, reused=changed.iloc[0]["step"]) if comparison and comparison.get("n") else None


def ladder_summary(tables: dict, finals: dict, price_per_hour: float) -> list[str]:
    """Per workload: the ladder's end against its start in fresh paired rounds (the one
    speedup claimed), the rung that paid most by its own confirmed comparison, and cost."""
    lines = []
    for w, t in tables.items():
        if t.empty:
            continue
        last = t.iloc[-1]
        final = finals.get(w)
        where = (f"in the paired rounds of its one rung ({final['reused']})" if final and final.get("reused")
                 else "in fresh paired rounds")
        head = (f"{w}: the ladder's end over PyTorch's defaults, {where}: {compare.describe(final)}"
                if final else f"{w}: nothing was handed on beyond PyTorch's defaults")
        confirmed = t[t["verdict"] == "faster"]
        if len(confirmed):
            top = confirmed.loc[confirmed["vs_previous"].idxmax()]
            head += f"; the largest confirmed step: {top.step} ({top.change}, {top.vs_previous:.2f}x the rung before)"
        if last.samples_per_s == last.samples_per_s and last.samples_per_s:
            head += f"; ${last.usd_per_1000_samples:.4f} per 1000 samples at ${price_per_hour:g}/hour"
        if last.peak_share is not None and last.peak_share == last.peak_share:
            head += f"; {last.peak_share:.0%} of the measured {last.ceiling} ceiling"
        lines.append(head + ".")
    return lines
