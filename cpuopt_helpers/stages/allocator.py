"""Stage 04, allocator: glibc, jemalloc (with and without run_cpu's MALLOC_CONF) and
tcmalloc; then the best setting against PyTorch's and run_cpu's defaults.
"""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers import compare
from cpuopt_helpers.config import RunConfig, normalise
from cpuopt_helpers.stages.choosing import unique
from cpuopt_helpers.system import Facts

JEMALLOC_DEFAULT_CONF = (("MALLOC_CONF", ""),)  # jemalloc with its own defaults, not run_cpu's tuning


def configs(base: RunConfig, facts: Facts) -> tuple[list[RunConfig], dict]:
    """Notebook 04: glibc, jemalloc with run_cpu's MALLOC_CONF and without, tcmalloc.

    Returns the configurations that can run here and, for each missing allocator, the
    command that installs it.
    """
    from cpuopt_helpers.system import INSTALL_HINTS

    base = normalise(base, facts.physical_cores).replace(allocator="default")
    base = base.replace(env={k: v for k, v in base.env if k != "MALLOC_CONF"})
    configs, missing = [base], {}
    if facts.allocators.get("jemalloc"):
        configs += [base.replace(allocator="jemalloc"),
                    base.replace(allocator="jemalloc", env=dict(base.env) | dict(JEMALLOC_DEFAULT_CONF))]
    else:
        missing["jemalloc"] = INSTALL_HINTS["jemalloc"]
    if facts.allocators.get("tcmalloc"):
        configs.append(base.replace(allocator="tcmalloc"))
    else:
        missing["tcmalloc"] = INSTALL_HINTS["tcmalloc"]
    return configs, missing


def launcher_configs(best: RunConfig, facts: Facts) -> list[RunConfig]:
    """PyTorch's defaults, run_cpu's defaults and the best setting found, to be interleaved."""
    default = RunConfig.for_preset(best.workload, best.preset)
    default = normalise(default.replace(steps=best.steps, warmup=best.warmup), facts.physical_cores)
    return unique([default, default.replace(launcher="run_cpu"), best])


def memory_findings(table: pd.DataFrame, workload: str) -> list[str]:
    """Peak resident memory of each setting against the baseline's."""
    base = table[table["is_baseline"]] if "is_baseline" in table else table.iloc[0:0]
    if base.empty:
        return []
    rss = base.iloc[0]["peak_rss_mb"]
    parts = [f"{r.setting} {r.peak_rss_mb:.0f} MB ({r.peak_rss_mb / rss - 1:+.0%})"
             for r in table.itertuples() if not r.is_baseline]
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
        who = "run_cpu's defaults" if r["config"]["launcher"] == "run_cpu" else f"the best setting ({r['setting']})"
        lines.append(f"{workload}: {who} over PyTorch's defaults: {compare.describe(r['comparison'])}.")
    if not lines:
        lines.append(f"{workload}: the best setting is PyTorch's defaults; compared with run_cpu only.")
    return lines


def findings(chosen: dict[str, RunConfig | None], missing: dict) -> list[str]:
    """One sentence across workloads: which allocator is handed on where, and what was not measured."""
    wins = {}
    for w, config in chosen.items():
        wins.setdefault(config.allocator if config else "none", []).append(w)
    lines = [f"{alloc} is handed on for {', '.join(ws)}." for alloc, ws in wins.items()]
    if missing:
        lines.append("Not measured (not installed): " + ", ".join(missing) + ".")
    return lines
