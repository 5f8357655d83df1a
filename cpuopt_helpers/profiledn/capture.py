"""A workload's profile as data: what ran, what its oneDNN log says, its projection; the tables,
shares and findings (``decisions.Finding`` records) made from profiles. The runs themselves are
made by the profiling stage (``stages.profiling.profile_workload``)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import pandas as pd

from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.decisions import Finding
from cpuopt_helpers.profiledn.breakdown import STAGE, breakdown, compare, compare_findings, findings
from cpuopt_helpers.profiledn.parse import ParsedLog
from cpuopt_helpers.profiledn.replay import projection_findings
from cpuopt_helpers.profiledn.trace import trace_findings


LOGGED_FASTER = 0.05  # a logged step this much faster than the plain one is said: one run each, noise won


@dataclass
class Profile:
    """One workload's profile: what ran, what the log says, and the projection."""

    label: str
    config: RunConfig
    plain: dict  # the RunResult without verbose logging: the measured step time
    traced: dict  # the RunResult whose timed steps were logged
    log: str
    parsed: ParsedLog | None
    projection: dict | None
    trace: dict | None = None  # trace.summarize_trace of a third run, when asked

    @property
    def ok(self) -> bool:
        return self.parsed is not None

    @property
    def steps(self) -> int:
        return self.config.steps

    def coverage(self) -> float:
        """Share of the logged run's timed steps that its oneDNN primitives account for.

        Both come from the one traced run, so it is a true share (at most 1): against the plain
        run's step a traced run slowed by a busy machine once read 607%.
        """
        inst = self.traced["instances"][0]
        if inst.get("timed_end") and inst.get("timed_start"):
            window_ms = (inst["timed_end"] - inst["timed_start"]) * 1e3
        else:  # a result stored before the window was recorded
            window_ms = self.traced["step_ms"]["median"] * self.steps
        return self.parsed.exec["time_ms"].sum() / window_ms


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_")


def profile_table(profiles: list[Profile]) -> pd.DataFrame:
    """One row per profiled workload: step time, oneDNN coverage, kernel time, efficiency."""
    rows = []
    for p in profiles:
        if not p.ok:
            continue
        proj = p.projection or {}
        rows.append({
            "workload": p.label, "step_ms": p.plain["step_ms"]["median"],
            "logged_step_ms": p.traced["step_ms"]["median"],  # the oneDNN-logged run's (not a profiler trace)
            "onednn_calls_per_step": len(p.parsed.exec) / p.steps,
            "logged_onednn_ms_per_step": p.parsed.exec["time_ms"].sum() / p.steps,
            "coverage": p.coverage(),
            "kernel_ms_per_step": proj.get("kernel_ms_per_step"),
            "replay_over_logged": proj.get("agreement"),
            "efficiency": proj.get("efficiency"),
            "replayed": proj.get("replayed"), "not_replayed": proj.get("not_replayed"),
            **({"trace_outside_onednn": p.trace["outside_onednn_share"], "ops_per_step": p.trace["ops_per_step"],
                "median_span_us": p.trace["median_span_us"]} if p.trace else {}),
        })
    return pd.DataFrame(rows).set_index("workload") if rows else pd.DataFrame()


def kind_shares(profiles: list[Profile], by: str = "kind") -> dict[str, pd.Series]:
    """Share of logged oneDNN time per kind (or direction), for the donut charts."""
    return {p.label: breakdown(p.parsed.exec, by)["share"] for p in profiles if p.ok and not p.parsed.exec.empty}


def profiling_findings(profiles: list[Profile]) -> list[Finding]:
    """What the workloads' profiles say, from their numbers (each under its profile's label)."""
    table = profile_table(profiles)
    found = []
    for p in profiles:
        if not p.ok:
            reason = (p.plain if p.plain["status"] != "ok" else p.traced)["reason"].splitlines()[0]
            found.append(Finding(p.label, STAGE, "profile failed", {"reason": reason}))
    for name, row in table.iterrows():
        found.append(Finding(name, STAGE, "profile coverage", {
            "coverage": float(row.coverage), "calls_per_step": float(row.onednn_calls_per_step),
            "step_ms": float(row.step_ms), "efficiency": float(row.efficiency) if pd.notna(row.efficiency) else None,
            "logged_step_ms": float(row.logged_step_ms), "logged_ms": float(row.logged_onednn_ms_per_step)}))
        if row.logged_step_ms < row.step_ms * (1 - LOGGED_FASTER):  # logging costs time: noise is larger here
            found.append(Finding(name, STAGE, "profile logged faster", {
                "step_ms": float(row.step_ms), "traced_step_ms": float(row.logged_step_ms)}))
    if len(table) and (table["coverage"] < 0.3).any():
        found.append(Finding("", STAGE, "profile outside onednn",
                             {"profiles": list(table.index[table["coverage"] < 0.3])}))
    return found


@dataclass
class Comparison:
    """Two profiles of one workload in two settings, and what differs."""

    base: Profile
    other: Profile
    labels: tuple[str, str]
    note: str = ""  # why this pair is worth reading (e.g. the bf16 gate's reading of the ISA)

    @property
    def ok(self) -> bool:
        return self.base.ok and self.other.ok

    def table(self) -> pd.DataFrame:
        return compare(self.base.parsed.exec, self.other.parsed.exec, "kind_direction", self.labels,
                       (self.base.steps, self.other.steps))

    def findings(self) -> list[Finding]:
        """The measured steps, why the pair is worth reading, and how the two logs differ (under the
        base profile's label)."""
        b, o = self.base.plain["step_ms"]["median"], self.other.plain["step_ms"]["median"]
        who = self.base.label
        head = Finding(who, STAGE, "profile comparison", {"labels": list(self.labels), "step_ms": [float(b), float(o)]})
        return [head] + ([Finding(who, STAGE, "profile comparison note", {"note": self.note})] if self.note else []) \
            + compare_findings(self.base.parsed.exec, self.other.parsed.exec, self.labels,
                               (self.base.steps, self.other.steps), workload=who)


def answer(profiles: list[Profile], comparisons: list[Comparison], stage: str = STAGE) -> list[Finding]:
    """The notebook's answer: every finding computed from this run's profiles, each profile's own
    under its label (``stage``: the notebook's that tells them, where not 02's)."""
    found = profiling_findings(profiles + [c.other for c in comparisons  # each profile once (08's compare its own)
                                           if not any(c.other is p for p in profiles)])
    for p in profiles:
        if p.ok:
            found += findings(p.parsed.exec, p.steps, p.label)
            if p.projection:
                found += projection_findings(p.projection, p.label)
            if p.trace:
                found += trace_findings(p.trace, p.label)
    for c in comparisons:
        if c.ok:
            found += c.findings()
    return [f if f.stage == stage else dataclasses.replace(f, stage=stage) for f in found]


def profile_summary(profile: Profile) -> dict:
    """What later notebooks need of a profile, as plain JSON-able values."""
    row = profile_table([profile]).iloc[0].to_dict()
    return {k: (None if v != v else v) for k, v in row.items()}  # NaN -> None
