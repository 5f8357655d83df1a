"""Stage 04, allocator: glibc, jemalloc (keeping freed memory, and with run_cpu's MALLOC_CONF as
it is) and tcmalloc; then the best setting against PyTorch's and run_cpu's defaults.
"""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers.config import RUN_CPU_JEMALLOC_CONF, RunConfig, normalise
from cpuopt_helpers.decisions import Choice, Comparison, Finding, Plan
from cpuopt_helpers.launch import KERNEL_SHARE
from cpuopt_helpers.stages import choosing
from cpuopt_helpers.system import Facts

JEMALLOC_RUN_CPU = (("MALLOC_CONF", RUN_CPU_JEMALLOC_CONF),)  # as run_cpu sets it: freed large blocks go back to the OS


def configs(base: RunConfig, facts: Facts) -> Plan:
    """Notebook 04: glibc, jemalloc keeping freed memory and with run_cpu's MALLOC_CONF as it is
    (``config.JEMALLOC_CONF``), tcmalloc: the
    configurations that can run here, and (``left_out``) the command that installs each
    missing allocator.
    """
    from cpuopt_helpers.system import INSTALL_HINTS

    base = normalise(base, facts.physical_cores).replace(allocator="default")
    base = base.replace(env={k: v for k, v in base.env if k != "MALLOC_CONF"})
    configs, missing = [base], {}
    if facts.allocators.get("jemalloc"):
        configs += [base.replace(allocator="jemalloc"),
                    base.replace(allocator="jemalloc", env=dict(base.env) | dict(JEMALLOC_RUN_CPU))]
    else:
        missing["jemalloc"] = INSTALL_HINTS["jemalloc"]
    if facts.allocators.get("tcmalloc"):
        configs.append(base.replace(allocator="tcmalloc"))
    else:
        missing["tcmalloc"] = INSTALL_HINTS["tcmalloc"]
    return Plan.of(configs, missing)


table = choosing.settings_table


def choose(table: pd.DataFrame, plan: Plan, confirm=None) -> Choice:
    """The screening winner confirmed against glibc malloc (``choosing.choose``)."""
    return choosing.choose(table, plan.workload, confirm, stage="allocator")


def findings(table: pd.DataFrame, plan: Plan) -> list[Finding]:
    """Peak resident memory of each allocator against glibc's, and the kernel's share of CPU time
    under each where one of them reaches ``launch.KERNEL_SHARE``."""
    return memory_findings(table, plan.workload) + kernel_findings(table, plan.workload)


def kernel_findings(table: pd.DataFrame, workload: str) -> list[Finding]:
    """The kernel's share of the timed steps' CPU time and the page faults a step under each
    allocator, where any reaches ``KERNEL_SHARE``: the cost an allocator that hands freed memory back
    to the OS pays, faulting it in again."""
    if "system_share" not in table or not len(table):
        return []
    rows = table[table["runs"] > 0].dropna(subset=["system_share"])
    if rows.empty or rows["system_share"].max() < KERNEL_SHARE:
        return []
    rows = rows.sort_values("is_baseline", ascending=False, kind="stable")  # glibc's first
    return [Finding(workload, "allocator", "kernel share", {"settings": [
        ["glibc malloc" if r.is_baseline else r.setting, float(r.system_share), float(r.page_faults_per_step)]
        for r in rows.itertuples()]})]


def launcher_configs(best: RunConfig, facts: Facts) -> Plan:
    """PyTorch's defaults (the base), run_cpu's defaults and the best setting found, to be interleaved."""
    default = RunConfig.for_preset(best.workload, best.preset)
    default = normalise(default.replace(steps=best.steps, warmup=best.warmup), facts.physical_cores)
    return Plan.of([default, default.replace(launcher="run_cpu"), best])


def memory_findings(table: pd.DataFrame, workload: str) -> list[Finding]:
    """Peak resident memory of each setting against the baseline's."""
    base = table[table["is_baseline"]] if "is_baseline" in table else table.iloc[0:0]
    if base.empty:
        return []
    settings = [[r.setting, float(r.peak_rss_mb)] for r in table.itertuples() if not r.is_baseline and r.runs]
    return [Finding(workload, "allocator", "peak memory", {"baseline_mb": float(base.iloc[0]["peak_rss_mb"]),
                                                           "settings": settings})] if settings else []


def run_cpu_choices(results: list[dict]) -> str:
    """What run_cpu decided in its own words (allocator, OpenMP, binding), from its log."""
    logs = [r.get("launcher_log", "") for r in results if r.get("launcher_log")]
    if not logs:
        return "run_cpu did not run (or logged nothing)."
    lines = [line.split(" - ", 3)[-1] for line in logs[0].splitlines()]
    return "run_cpu's log of its choices:\n" + "\n".join(f"  {line[:200]}" for line in lines)


def launcher_findings(table: pd.DataFrame, workload: str) -> list[Finding]:
    """The measured ratio of run_cpu's defaults and of the best setting to PyTorch's defaults."""
    found = []
    for _, r in table.iterrows():
        if not isinstance(r.get("comparison"), dict):
            continue
        run_cpu = r["config"]["launcher"] == "run_cpu"
        found.append(Finding(workload, "allocator", "run_cpu over defaults" if run_cpu else "best over defaults",
                             {} if run_cpu else {"setting": r["setting"]}, Comparison.from_dict(r["comparison"])))
    return found or [Finding(workload, "allocator", "defaults best")]


def handed_on_findings(chosen: dict[str, RunConfig | None], missing: dict) -> list[Finding]:
    """Across workloads: which allocator is handed on where, and what was not measured."""
    wins = {}
    for w, config in chosen.items():
        wins.setdefault(config.allocator if config else "none", []).append(w)
    found = [Finding("", "allocator", "allocator handed on", {"allocator": alloc, "workloads": ws})
             for alloc, ws in wins.items()]
    if missing:
        found.append(Finding("", "allocator", "allocators missing", {"missing": list(missing)}))
    return found
