"""Stage 01, baseline: how fast does each workload train with PyTorch's defaults, and how
far is that from the machine's measured ceilings?
"""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.stages.choosing import PHASES
from cpuopt_helpers.system import Facts


def findings(table: pd.DataFrame, peak_gflops: float | None) -> list[str]:
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
    if peak_gflops and len(table) > 1:  # a comparison between workloads
        efficiency = table["gflops"] / peak_gflops
        lo, hi = efficiency.idxmin(), efficiency.idxmax()
        lines.append(f"Furthest from the GEMM ceiling: {lo} ({efficiency[lo]:.0%}); closest: {hi} "
                     f"({efficiency[hi]:.0%}). The gap is the room that the next notebooks try to win.")
    lines += [w for w in table["warning"].dropna()]
    return lines


def system_findings(facts: Facts, roofline: dict) -> list[str]:
    """Sentences about the machine and its ceilings, from the facts and measurements."""
    isa = facts.isa
    wide = "AVX-512" if isa.get("avx512f") else "AVX2" if isa.get("avx2") else "no AVX2"
    balance = roofline["gemm_gflops_best"] / roofline["copy_gbs_best"]
    lines = [
        f"{facts.cpu_model}: {facts.physical_cores} physical / {facts.logical_cores} logical cores "
        f"on {facts.sockets} socket(s) and {len(facts.numa_nodes)} NUMA node(s); widest vector ISA: {wide}.",
        f"Measured ceilings on {roofline['threads']} threads: fp32 GEMM {roofline['gemm_gflops_best']:.0f} GFLOP/s, "
        f"memory copy {roofline['copy_gbs_best']:.1f} GB/s; a kernel needs about {balance:.0f} FLOP per byte "
        "moved to be compute-bound here.",
    ]
    bf16_isa = [f for f in ("amx_bf16", "avx512_bf16", "avx_ne_convert") if isa.get(f)]
    lines.append(f"bf16: CPU flags {', '.join(bf16_isa) if bf16_isa else 'none of amx_bf16/avx512_bf16/avx_ne_convert'}; "
                 f"oneDNN reports bf16 support: {'yes' if facts.versions['onednn_bf16_supported'] else 'no'}.")
    missing = facts.missing
    lines.append("Missing: " + ("; ".join(f"{k} ({v})" for k, v in missing.items()) if missing
                                else "nothing; every allocator and OpenMP runtime can be measured."))
    if facts.numactl["present"] and not facts.numactl["works"]:
        lines.append(f"numactl is installed but refused here ({facts.numactl['reason']}); "
                     "runs pin with taskset or sched_setaffinity instead.")
    return lines


def configs(workloads: list[str], preset: str) -> list[RunConfig]:
    """Each workload as PyTorch runs it by default, at the preset's sizes, steps and warm-up."""
    return [RunConfig.for_preset(w, preset) for w in workloads]


def start_ladders(session, configs: list[RunConfig], table) -> None:
    """Each workload that produced a result starts its ladder here: PyTorch's defaults, with the
    samples/s it measured (the first rung of every ladder)."""
    for config in configs:
        if config.workload in table.index:
            session.hand_on(config, "baseline", {"samples_per_s": float(table.loc[config.workload, "samples_per_s"])})
