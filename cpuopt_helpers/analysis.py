"""Tables and worded findings computed from results (what the notebooks display)."""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers import stats

PHASES = ("forward", "backward", "optimizer")


def throughput_table(results: list[dict]) -> pd.DataFrame:
    """One row per configuration: median samples/s over repeats with a bootstrap CI,
    median step and phase times, achieved GFLOP/s, and the spread warning."""
    rows = {}
    for r in results:
        if r["status"] == "ok":
            rows.setdefault(r["config"]["workload"], []).append(r)
    out = []
    for workload, runs in rows.items():
        sps = [r["samples_per_s"] for r in runs]
        low, high = stats.bootstrap_ci(sps)
        step = stats.summarize([r["step_ms"]["median"] for r in runs])["median"]
        row = {"workload": workload, "samples_per_s": stats.summarize(sps)["median"], "ci_low": low,
               "ci_high": high, "runs": len(runs), "step_ms": step,
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
        lines.append(f"{name}: {row['samples_per_s']:.1f} samples/s (95% CI {row['ci_low']:.1f}-{row['ci_high']:.1f}, "
                     f"{row['runs']} runs); {dominant} takes {row[f'{dominant}_share']:.0%} of a "
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
    skip = {"timeout_s", "onednn_verbose", "trace"}
    parts = [f"{k}={v}" for k, v in config.items() if k not in skip and v != baseline.get(k)]
    return " ".join(parts).replace("env={", "env={") or "baseline"


def compare_configs(results: list[dict], baseline: dict, workload: str | None = None) -> pd.DataFrame:
    """One row per configuration: median samples/s with CI, peak RSS, and the interleaved
    ratio to the baseline (paired by repeat: each pair ran back to back)."""
    groups: dict[str, list[dict]] = {}
    for r in results:
        if r["status"] == "ok" and (workload is None or r["config"]["workload"] == workload):
            groups.setdefault(r["config_hash"], []).append(r)
    base_hash = next((h for h, rs in groups.items() if setting_label(rs[0]["config"], baseline) == "baseline"), None)
    base_by_repeat = {r["repeat"]: r["samples_per_s"] for r in groups.get(base_hash, [])}
    rows = []
    for config_hash, runs in groups.items():
        sps = [r["samples_per_s"] for r in runs]
        low, high = stats.bootstrap_ci(sps)
        row = {"setting": setting_label(runs[0]["config"], baseline), "samples_per_s": stats.summarize(sps)["median"],
               "ci_low": low, "ci_high": high, "runs": len(runs),
               "peak_rss_mb": stats.summarize([r["peak_rss_mb"] for r in runs])["median"],
               "config_hash": config_hash, "config": runs[0]["config"]}
        pairs = [(base_by_repeat[r["repeat"]], r["samples_per_s"]) for r in runs if r["repeat"] in base_by_repeat]
        if pairs:
            ratio = stats.interleaved_ratio([a for a, _ in pairs], [b for _, b in pairs])
            row.update(ratio=ratio["median"], ratio_low=ratio["ci_low"], ratio_high=ratio["ci_high"])
        rows.append(row)
    table = pd.DataFrame(rows)
    return table.sort_values("samples_per_s", ascending=False).reset_index(drop=True) if len(table) else table


def choose(table: pd.DataFrame, what: str) -> tuple[dict | None, str]:
    """The configuration to hand on, and the sentence that says why.

    The fastest setting wins only when its interleaved ratio to the baseline is above 1
    over the whole confidence interval; otherwise the baseline stays (a win inside the
    noise is not a win).
    """
    if table.empty:
        return None, f"{what}: no setting produced a result."
    base = table[table["setting"] == "baseline"]
    best = table.iloc[0]
    if base.empty:
        return best["config"], f"{what}: baseline missing; the fastest measured setting is {best['setting']}."
    base = base.iloc[0]
    if best["setting"] == "baseline":
        return base["config"], (f"{what}: the baseline ({base['samples_per_s']:.1f} samples/s) is the fastest; "
                                "no setting beat it.")
    verdict = f"{best['ratio']:.2f}x (95% CI {best['ratio_low']:.2f}-{best['ratio_high']:.2f})"
    if best["ratio_low"] > 1.0:
        return best["config"], (f"{what}: {best['setting']} is fastest at {best['samples_per_s']:.1f} samples/s, "
                                f"{verdict} the baseline: handed on.")
    return base["config"], (f"{what}: {best['setting']} measured fastest ({verdict} the baseline) but the interval "
                            "includes 1.0, so the baseline is kept.")


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
    """Which settings were faster or slower than the baseline over their whole interval."""
    if table.empty or "ratio" not in table:
        return [f"{workload}: no comparison with the baseline was possible."]
    others = table[table["setting"] != "baseline"].dropna(subset=["ratio"])
    faster = others[others["ratio_low"] > 1]
    slower = others[others["ratio_high"] < 1]
    same = others[(others["ratio_low"] <= 1) & (others["ratio_high"] >= 1)]
    lines = []
    if len(faster):
        lines.append(f"{workload}: faster than the baseline: "
                     + "; ".join(f"{r.setting} {r.ratio:.2f}x" for r in faster.itertuples()) + ".")
    if len(slower):
        lines.append(f"{workload}: slower: " + "; ".join(f"{r.setting} {r.ratio:.2f}x" for r in slower.itertuples())
                     + ".")
    if len(same):
        lines.append(f"{workload}: within the noise of the baseline: "
                     + ", ".join(r.setting for r in same.itertuples()) + ".")
    return lines


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
    for r in table.itertuples():
        if r.setting == "baseline" or not hasattr(r, "ratio") or r.ratio != r.ratio:
            continue
        who = "run_cpu's defaults" if "launcher=run_cpu" in r.setting else f"the best setting ({r.setting})"
        lines.append(f"{workload}: {who}: {r.ratio:.2f}x PyTorch's defaults "
                     f"(95% CI {r.ratio_low:.2f}-{r.ratio_high:.2f}).")
    if not lines:
        lines.append(f"{workload}: the best setting is PyTorch's defaults; compared with run_cpu only.")
    return lines


def allocator_summary(tables: dict, missing: dict) -> list[str]:
    """One sentence across workloads: which allocator wins where, and what was not measured."""
    wins = {}
    for w, t in tables.items():
        chosen, _ = choose(t, w)
        wins.setdefault(chosen["allocator"] if chosen else "none", []).append(w)
    lines = [f"{alloc} is handed on for {', '.join(ws)}." for alloc, ws in wins.items()]
    if missing:
        lines.append("Not measured (not installed): " + ", ".join(missing) + ".")
    return lines


def accuracy_table(runs: list[dict]) -> pd.DataFrame:
    """Final test accuracy and loss of each precision mode on the digits."""
    return pd.DataFrame([{"mode": r["mode"], "final_accuracy": r["final_accuracy"], "final_loss": r["final_loss"],
                          "best_accuracy": max(h["accuracy"] for h in r["history"]), "epochs": r["epochs"]}
                         for r in runs]).set_index("mode")


def precision_findings(tables: dict, accuracy: pd.DataFrame, gate: dict, tolerance: float = 0.01) -> list[str]:
    """bf16 against fp32: speed per workload and layout, accuracy, and the recommendation."""
    lines = [f"bf16 fast path on this CPU: {'yes, ' + gate['path'] if gate['accelerated'] else 'no'} "
             f"({gate['reason']})."]
    faster = []
    for w, t in tables.items():
        for r in t.itertuples():
            if "dtype=bf16" in r.setting and getattr(r, "ratio", None) == getattr(r, "ratio", None):
                lines.append(f"{w}: {r.setting}: {r.ratio:.2f}x fp32 (95% CI {r.ratio_low:.2f}-{r.ratio_high:.2f}).")
                if r.ratio_low > 1 and "channels_last" not in r.setting:
                    faster.append(w)
    if "fp32" in accuracy.index:
        base = accuracy.loc["fp32", "final_accuracy"]
        for mode, row in accuracy.iterrows():
            if mode != "fp32":
                lines.append(f"digits, {mode}: final test accuracy {row.final_accuracy:.1%} vs {base:.1%} in fp32 "
                             f"({(row.final_accuracy - base) * 100:+.1f} points); final loss {row.final_loss:.4f}.")
        ok = "bf16" in accuracy.index and accuracy.loc["bf16", "final_accuracy"] >= base - tolerance
    else:
        ok = False
    if faster and ok:
        lines.append(f"Recommendation: bf16 autocast with the loss in fp32 for {', '.join(faster)}: faster over the "
                     f"whole interval and within {tolerance:.0%} of fp32's accuracy on the digits.")
    else:
        why = "not faster than fp32 over its whole interval" if not faster else "it lost accuracy on the digits"
        lines.append(f"Recommendation: keep fp32 here: bf16 was {why}.")
    return lines


def slow_kernels(df: pd.DataFrame, top: int = 5) -> list[str]:
    """The implementations that take the most oneDNN time, with their ISA: names the slow kernels."""
    if df.empty:
        return ["No oneDNN primitive ran."]
    by_impl = df.groupby(["kind", "impl"])["time_ms"].agg(["sum", "count"]).sort_values("sum", ascending=False)
    total = by_impl["sum"].sum()
    return ["Slowest kernels: " + "; ".join(f"{kind} {impl} {row['sum'] / total:.0%} ({int(row['count'])} calls)"
                                            for (kind, impl), row in by_impl.head(top).iterrows()) + "."]


def choose_precision(table: pd.DataFrame, accuracy: pd.DataFrame, gate: dict, tolerance: float = 0.01) -> dict | None:
    """The bf16 configuration to hand on, or None to keep fp32.

    bf16 is handed on only with a fast path, faster than fp32 over the whole interval, and
    within `tolerance` of fp32's accuracy on the digits.
    """
    rows = table[table["setting"] == "dtype=bf16"] if len(table) else table
    if not gate["accelerated"] or rows.empty or not {"fp32", "bf16"} <= set(accuracy.index):
        return None
    keeps = accuracy.loc["bf16", "final_accuracy"] >= accuracy.loc["fp32", "final_accuracy"] - tolerance
    return rows.iloc[0]["config"] if rows.iloc[0]["ratio_low"] > 1 and keeps else None
