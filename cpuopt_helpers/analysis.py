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
