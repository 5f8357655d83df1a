"""Profile a workload end to end: a plain run, a traced run, the breakdown and the projection."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.profiledn.breakdown import breakdown, compare, compare_findings, findings
from cpuopt_helpers.profiledn.parse import ParsedLog, parse_log
from cpuopt_helpers.profiledn.replay import project_log, projection_findings
from cpuopt_helpers.profiledn import wholestep
from cpuopt_helpers.profiledn.trace import summarize_trace, trace_findings


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


def profile_workload(session, config: RunConfig, log_dir: Path, label: str | None = None,
                     repeats: int = 10, tag: str = "02_profiling", trace: bool = False,
                     plain: dict | None = None) -> Profile:
    """Measure the plain step, log the timed steps of a second run, parse and project.

    ``plain``: a run of this configuration already measured (notebook 01's baseline), reused
    for the step time instead of measuring it again. The replay runs on the plain run's
    cores with its thread count. With ``trace=True`` a third run records its timed steps
    with torch.profiler, and a fourth again without shapes (``wholestep.timing_path``). A
    failed run gives a Profile with ``parsed=None``; its RunResult says why.
    """
    label = label or config.workload
    log_dir.mkdir(parents=True, exist_ok=True)
    log = str(log_dir / f"{safe_name(label)}_{config.preset}.log")
    if plain is None:
        plain = session.run(config)
        session.store.save_result(plain, tag=tag)
    traced = session.run(config.replace(onednn_verbose=log))
    session.store.save_result(traced, tag=tag)
    if plain["status"] != "ok" or traced["status"] != "ok":
        return Profile(label, config, plain, traced, log, None, None)
    parsed = parse_log(log)
    inst = plain["instances"][0]
    projection = None
    if not parsed.exec.empty:
        projection = project_log(log, config.steps, plain["step_ms"]["median"], inst["torch_threads"],
                                 inst["cores"], repeats)
    summary = None
    if trace:
        path = str(log_dir / f"{safe_name(label)}_{config.preset}.trace.json")
        traced_run = session.run(config.replace(trace=path))
        session.store.save_result(traced_run, tag=tag)
        if traced_run["status"] == "ok":
            summary = summarize_trace(path)
            # the same steps traced without shapes: the times whole-step projection uses
            session.store.save_result(session.run(wholestep.timing_config(config, path)), tag=tag)
    return Profile(label, config, plain, traced, log, parsed, projection, summary)


def profile_table(profiles: list[Profile]) -> pd.DataFrame:
    """One row per profiled workload: step time, oneDNN coverage, kernel time, efficiency."""
    rows = []
    for p in profiles:
        if not p.ok:
            continue
        proj = p.projection or {}
        rows.append({
            "workload": p.label, "step_ms": p.plain["step_ms"]["median"],
            "traced_step_ms": p.traced["step_ms"]["median"],
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


def profiling_findings(profiles: list[Profile]) -> list[str]:
    """Sentences comparing the workloads' profiles, from their numbers."""
    table = profile_table(profiles)
    lines = []
    for p in profiles:
        if not p.ok:
            reason = (p.plain if p.plain["status"] != "ok" else p.traced)["reason"].splitlines()[0]
            lines.append(f"{p.label}: not profiled ({reason}).")
    for name, row in table.iterrows():
        eff = f"; efficiency ratio {row.efficiency:.0%}" if pd.notna(row.efficiency) else ""
        lines.append(f"{name}: oneDNN primitives account for {row.coverage:.0%} of the logged run's steps "
                     f"({row.onednn_calls_per_step:.0f} calls per {row.step_ms:.1f} ms step){eff}.")
    if len(table) and (table["coverage"] < 0.3).any():
        low = ", ".join(table.index[table["coverage"] < 0.3])
        lines.append(f"For {low} most of the step runs outside oneDNN (GEMMs through MKL, PyTorch's own kernels): "
                     "the oneDNN log alone does not explain it; the framework profiler trace does.")
    return lines


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

    def findings(self) -> list[str]:
        b, o = self.base.plain["step_ms"]["median"], self.other.plain["step_ms"]["median"]
        head = (f"{self.base.label}, {self.labels[0]} vs {self.labels[1]}: measured step {b:.2f} ms vs {o:.2f} ms "
                f"({b / o:.2f}x in one run each; the optimisation notebooks measure it with repeats).")
        return [head] + ([self.note] if self.note else []) + compare_findings(
            self.base.parsed.exec, self.other.parsed.exec, self.labels, (self.base.steps, self.other.steps))


VARIANTS = ("channels-last", "IPEX", "bf16")


def variant_pairs(profiles: list[Profile], workloads: dict[str, list[str]], ipex: dict, bf16: dict) -> list[dict]:
    """The paper's comparisons, planned: for each variant (``VARIANTS``) and each workload named
    in ``workloads[variant]``, the reference and the variant's config, or why it is left out.

    - channels-last: the profile above against the same config in NHWC;
    - IPEX: torch 2.8 stock against torch 2.8 + ``ipex.optimize``, both in the IPEX runtime
      (one oneDNN build, so what differs is IPEX's); where the runtime is built (``ipex``:
      ``runtimes.ipex_facts()``);
    - bf16: the profile above (fp32) against bf16 autocast; where the CPU has no bf16 fast
      path (``bf16``: the gate) it still runs, and the log shows the kernels that serve it.
    """
    unknown = set(workloads) - set(VARIANTS)
    if unknown:
        raise CpuoptError(f"unknown comparison(s) {', '.join(sorted(unknown))}; use some of {', '.join(VARIANTS)}")
    done = {p.label: p for p in profiles}
    pairs = []
    for variant in VARIANTS:
        for w in workloads.get(variant, []):
            base = done.get(w)
            if base is None or not base.ok:
                pairs.append({"workload": w, "variant": variant,
                              "skip": f"{w}: not compared ({variant}): it was not profiled above"})
                continue
            config = base.config
            if variant == "channels-last":
                pairs.append({"workload": w, "variant": variant, "base": base, "labels": ("default", "channels_last"),
                              "other": config.replace(channels_last=True), "note": ""})
            elif variant == "IPEX":
                if not ipex.get("available"):
                    pairs.append({"workload": w, "variant": variant, "skip": f"{w}: not compared with IPEX: "
                                  f"{ipex.get('reason') or 'the IPEX runtime is not built'}"})
                    continue
                pairs.append({"workload": w, "variant": variant, "base": config.replace(runtime="ipex"),
                              "labels": ("torch_2.8", "torch_2.8_IPEX"),
                              "other": config.replace(runtime="ipex", ipex=True),
                              "note": f"Both in the IPEX runtime (torch {ipex.get('torch')}, IPEX {ipex.get('ipex')}): "
                                      "one oneDNN build, so what differs is ipex.optimize's doing."})
            else:
                state = ("bf16 has a fast path here" if bf16.get("accelerated") else
                         "bf16 has no fast path here, so expect reference or emulated kernels")
                pairs.append({"workload": w, "variant": variant, "base": base, "labels": ("fp32", "bf16"),
                              "other": config.replace(dtype="bf16"), "note": f"{state}: {bf16.get('reason', '')}"})
    return pairs


def compare_variants(session, pairs: list[dict], log_dir: Path, repeats: int = 10) -> tuple[list[Comparison], list[str]]:
    """Profile what ``variant_pairs`` planned; the comparisons, and a line for each pair left out or failed."""
    comparisons, notes = [], []
    for pair in pairs:
        if "skip" in pair:
            notes.append(pair["skip"])
            continue
        w, (la, lb) = pair["workload"], pair["labels"]
        base = pair["base"] if isinstance(pair["base"], Profile) else profile_workload(
            session, pair["base"], log_dir, label=f"{w} {la}", repeats=repeats)
        other = profile_workload(session, pair["other"], log_dir, label=f"{w} {lb}", repeats=repeats)
        comparison = Comparison(base, other, (la, lb), pair["note"])
        if comparison.ok:
            comparisons.append(comparison)
        else:
            failed = next(p for p in (base, other) if not p.ok)
            why = (failed.traced.get("reason") or failed.plain.get("reason") or "no log").strip().splitlines()
            notes.append(f"{w}: {la} vs {lb} not compared: {failed.label} failed: {why[-1][:200] if why else ''}")
    return comparisons, notes


def answer(profiles: list[Profile], comparisons: list[Comparison]) -> list[str]:
    """The notebook's answer: every sentence computed from this run's profiles."""
    lines = profiling_findings(profiles + [c.other for c in comparisons])
    for p in profiles:
        if p.ok:
            details = findings(p.parsed.exec, p.steps)
            if p.projection:
                details += projection_findings(p.projection)
            if p.trace:
                details += trace_findings(p.trace)
            lines += [f"{p.label}: {line}" for line in details]
    for c in comparisons:
        if c.ok:
            lines += c.findings()
    return lines


def profile_summary(profile: Profile) -> dict:
    """What later notebooks need of a profile, as plain JSON-able values."""
    row = profile_table([profile]).iloc[0].to_dict()
    return {k: (None if v != v else v) for k, v in row.items()}  # NaN -> None
