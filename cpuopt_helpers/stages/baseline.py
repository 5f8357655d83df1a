"""Stage 01, baseline: how fast does each workload train with PyTorch's defaults, and how
far is that from the machine's measured ceilings?
"""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.decisions import Choice, Finding, Plan
from cpuopt_helpers.launch import KERNEL_SHARE
from cpuopt_helpers.stages.choosing import PHASES, throughput_table
from cpuopt_helpers.system import Facts


def _known(value) -> bool:
    """A number the stored results gave (not None, not the table's NaN)."""
    return value is not None and value == value


def findings(table: pd.DataFrame, peak_gflops: float | None, theoretical_gflops: float | None = None) -> list[Finding]:
    """The baseline of each workload, how far each is from the GEMM ceiling, and where the kernel
    takes ``KERNEL_SHARE`` of its CPU time or more (page faults: notebook 04's allocators), from its table."""
    if table.empty:
        return [Finding("", "baseline", "no baseline result")]
    found = []
    for name, row in table.iterrows():
        dominant = max(PHASES, key=lambda p: row[f"{p}_share"])
        found.append(Finding(name, "baseline", "baseline throughput", {
            "samples_per_s": float(row["samples_per_s"]), "runs": int(row["runs"]), "low": float(row["low"]),
            "high": float(row["high"]), "phase": dominant, "phase_share": float(row[f"{dominant}_share"]),
            "step_ms": float(row["step_ms"]),
            "gflops": float(row["gflops"]) if row["gflops"] == row["gflops"] else None,  # None: FLOPs not counted
            "peak_gflops": float(peak_gflops) if peak_gflops else None,
            "theoretical_gflops": float(theoretical_gflops) if theoretical_gflops else None,
            **{k: int(row[k]) for k in ("batch", "timed_steps", "warmup_steps") if _known(row.get(k))}}))
    efficiency = (table["gflops"] / peak_gflops).dropna() if peak_gflops else table["gflops"].iloc[0:0]
    if len(efficiency) > 1:  # a comparison between workloads whose work was counted
        lo, hi = efficiency.idxmin(), efficiency.idxmax()
        found.append(Finding("", "baseline", "gemm gap", {"furthest": lo, "furthest_share": float(efficiency[lo]),
                                                          "closest": hi, "closest_share": float(efficiency[hi])}))
    if "system_share" in table:
        found += [Finding(name, "baseline", "kernel share", {"settings": [
            ["PyTorch's defaults", float(row["system_share"]), float(row["page_faults_per_step"])]]})
            for name, row in table.iterrows() if row["system_share"] >= KERNEL_SHARE]  # NaN: not read
    return found + [Finding(name, "baseline", "noisy runs", {"warning": warning})
                    for name, warning in table["warning"].dropna().items()]


FRESH_SLOWDOWN = 2.0  # writing fresh memory this many times slower than mapped memory: page faults are costly here


def system_findings(facts: Facts, roofline: dict) -> list[Finding]:
    """The machine and its ceilings, from the facts and measurements."""
    isa = facts.isa
    wide = "AVX-512" if isa.get("avx512f") else "AVX2" if isa.get("avx2") else "no AVX2"

    def note(kind: str, **values) -> Finding:
        return Finding("", "baseline", kind, values)

    found = [
        note("machine", cpu_model=facts.cpu_model, physical_cores=facts.physical_cores, logical_cores=facts.logical_cores,
             sockets=facts.sockets, numa_nodes=len(facts.numa_nodes), widest_isa=wide),
        note("ceilings", threads=int(roofline["threads"]), gemm_gflops=float(roofline["gemm_gflops_best"]),
             copy_gbs=float(roofline["copy_gbs_best"]),
             bf16_gflops=float(roofline["gemm_gflops_bf16_best"]) if roofline.get("gemm_gflops_bf16_best") else None),
        note("bf16 flags", flags=[f for f in ("amx_bf16", "avx512_bf16", "avx_ne_convert") if isa.get(f)],
             onednn_bf16=bool(facts.versions["onednn_bf16_supported"])),
        note("missing tools", missing=dict(facts.missing)),
    ]
    if roofline.get("fresh_write_gbs"):  # a roofline stored before it was measured has none
        found.append(note("fresh memory", fresh_gbs=float(roofline["fresh_write_gbs"]),
                          mapped_gbs=float(roofline["write_gbs"]), costly=FRESH_SLOWDOWN))
    if facts.numactl["present"] and not facts.numactl["works"]:
        found.append(note("numactl refused", reason=facts.numactl["reason"]))
    return found


def configs(base: RunConfig, facts: Facts) -> Plan:
    """The workload as PyTorch runs it by default (``base``: ``RunConfig.for_preset``, at the
    preset's sizes, steps and warm-up), alone: a baseline compares nothing."""
    return Plan.of({"PyTorch's defaults": base})


def table(results: list[dict], plan: Plan | None = None) -> pd.DataFrame:
    """``choosing.throughput_table``: one row per workload (the plan's alone where given)."""
    if plan is not None:
        results = [r for r in results if r["config"]["workload"] == plan.workload]
    return throughput_table(results)


def choose(table: pd.DataFrame, plan: Plan, confirm=None) -> Choice:
    """The first rung of the workload's ladder: PyTorch's defaults, where they produced a
    result (nothing to confirm: the baseline is what every later rung is compared with)."""
    if plan.workload not in table.index:
        return Choice(None, None, Finding(plan.workload, "baseline", "no baseline result"))
    return Choice(plan.base, None, Finding(plan.workload, "baseline", "ladder starts",
                                           {"samples_per_s": float(table.loc[plan.workload, "samples_per_s"])}))


def view(table: pd.DataFrame, peak_gflops: float | None, theoretical_gflops: float | None = None) -> pd.DataFrame:
    """Notebook 01's table as a reader takes it: a row a workload, each rate with its runs' range, the step's
    phases in one cell, and GFLOP/s as a share of both peaks (the measured fp32 GEMM ceiling and the
    theoretical one); a cell the runs did not give says why instead of NaN."""
    def pct(value, of):
        return f"{value / of:.0%}" if _known(value) and of else None

    def rate(r) -> str:
        runs = int(r["runs"])
        spread = f" (range {r['low']:,.1f}-{r['high']:,.1f}, {runs} runs)" if runs > 1 else " (1 run)"
        return f"{r['samples_per_s']:,.1f}{spread}"

    def timed(r) -> str:
        known = {k: int(r[k]) for k in ("batch", "timed_steps", "warmup_steps") if _known(r.get(k))}
        if len(known) < 3:
            return "not recorded"
        return f"batch {known['batch']}, {known['timed_steps']} steps after {known['warmup_steps']} warm-up"

    rows = []
    for name, r in table.iterrows():
        kernel = (f"{r['system_share']:.0%} ({r['page_faults_per_step']:,.0f})" if _known(r.get("system_share"))
                  else "not read")
        rows.append({
            "workload": name, "a run timed": timed(r), "samples/s": rate(r), "step ms": round(float(r["step_ms"]), 2),
            "forward / backward / optimizer / other": " / ".join(f"{r[f'{p}_share']:.0%}" for p in (*PHASES, "other")),
            "GFLOP/s": round(float(r["gflops"]), 1) if _known(r["gflops"]) else "FLOPs not counted",
            "of the measured fp32 GEMM ceiling": pct(r["gflops"], peak_gflops) or (
                "FLOPs not counted" if not _known(r["gflops"]) else "no ceiling measured"),
            "of the theoretical fp32 peak": pct(r["gflops"], theoretical_gflops) or (
                "FLOPs not counted" if not _known(r["gflops"]) else "unknown (this CPU is not in the peak table)"),
            "kernel's share of CPU time (page faults a step)": kernel,
            "start-up s": round(float(r["startup_s"]), 1), "peak RSS MB": round(float(r["peak_rss_mb"])),
            "failed runs": int(r["failed"])})
    return pd.DataFrame(rows).set_index("workload") if rows else pd.DataFrame()
