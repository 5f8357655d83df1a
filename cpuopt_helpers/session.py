"""The session a notebook works in: this machine's facts, the results store and a runner.

The notebook kernel never measures itself: every run goes through the launcher. A session
sweeps configurations in rounds, confirms a winner in fresh rounds, settles a stage's
decision (``settle``: its finding stored, its configuration handed on) and keeps each
workload's optimisation ladder in the store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from cpuopt_helpers import compare, launch, system
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.decisions import Choice, Comparison, Finding, Plan
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.results import ResultStore, run_comparison, run_sweep
from cpuopt_helpers.stages import LADDER_STAGES, stage_index


@dataclass
class Session:
    """What a notebook needs: the machine's facts, the results store and a runner.

    The notebook kernel never measures itself: every run goes through the launcher.
    """

    facts: system.Facts = field(default_factory=system.collect_facts)
    store: ResultStore = field(default_factory=ResultStore)
    _told: set = field(default_factory=set, init=False, repr=False)  # the notes this session has replaced

    @property
    def machine(self) -> str:
        return self.facts.fingerprint

    def run(self, config: RunConfig) -> dict:
        return launch.run(config, self.facts)

    def __post_init__(self):
        if self.store.moved_aside:
            print(f"note: the results store was of an older schema or unreadable; it was moved aside to "
                  f"{self.store.moved_aside}, and a new one started")

    def sweep(self, configs, rounds: int = 1, tag: str | None = None, resume: bool = True) -> list[dict]:
        """Rounds of several configs (the order shuffled inside each), each result stored as it lands."""
        return run_sweep(configs, self.store, self.run, rounds=rounds, resume=resume, tag=tag,
                         machine=self.machine)

    def stored_run(self, config: RunConfig, tag: str) -> dict | None:
        """The latest ok run of exactly this configuration that a notebook stored under ``tag``
        on this machine, with this measuring code and caller environment; else None."""
        from cpuopt_helpers.config import validate
        from cpuopt_helpers.provenance import code_version, measuring_env

        code, env = code_version().get("measuring_hash"), measuring_env(os.environ)
        wanted = validate(config, self.facts.logical_cores, self.facts.physical_cores, check_workload=False)
        runs = [r for r in self.store.results(tag=tag, machine=self.machine)  # results hold the validated config
                if r["status"] == "ok" and r["config_hash"] == wanted.config_hash()
                and (r.get("code_version") or {}).get("measuring_hash") == code and r.get("caller_env") == env]
        return runs[-1] if runs else None

    def confirm(self, a: RunConfig, b: RunConfig, tag: str, min_rounds: int = compare.MIN_ROUNDS,
                max_rounds: int = compare.MAX_ROUNDS, budget_min: float | None = None, resume: bool = True) -> dict:
        """The adaptive A/B of b against a (``results.run_comparison``), in fresh rounds."""
        return run_comparison(a, b, self.store, self.run, tag=tag, machine=self.machine, min_rounds=min_rounds,
                              max_rounds=max_rounds, budget_s=budget_min * 60 if budget_min else None, resume=resume)

    def confirmer(self, tag: str, min_rounds: int = compare.MIN_ROUNDS, max_rounds: int = compare.MAX_ROUNDS,
                  budget_min: float | None = None, resume: bool = True):
        """``confirm`` with the notebook's parameters filled in, for ``choosing.choose``."""
        return lambda a, b: self.confirm(a, b, tag, min_rounds, max_rounds, budget_min, resume)

    def roofline(self, preset: str, remeasure: bool = False) -> dict:
        """The measured GEMM and copy ceilings, from the store or measured now."""
        from cpuopt_helpers import roofline

        name = f"roofline/{preset}"
        value = None if remeasure else self.store.get_fact(self.machine, name)
        if value is None:
            value = roofline.measure(preset)
            self.store.put_fact(self.machine, name, value)
        return value

    def peak(self, preset: str) -> dict:
        """``peak.peak_report``: the theoretical peak per dtype beside the stored measured ceilings."""
        from cpuopt_helpers import peak

        return peak.peak_report(system.read_cpuinfo(), self.facts.physical_cores,
                                self.store.get_fact(self.machine, f"roofline/{preset}"))

    def theoretical_gflops(self, preset: str) -> dict:
        """The theoretical peak per dtype (None where unknown), for ``wholestep.Ceilings``."""
        report = self.peak(preset)
        return {d: report[d]["theoretical_gflops"] for d in ("fp32", "bf16")}

    def hand_on(self, config: RunConfig, step: str, evidence: dict | None = None,
                comparison: Comparison | dict | None = None, ladder: str | None = None, stage: str | None = None) -> None:
        """Record the best configuration so far for a workload (the optimisation ladder),
        with the comparison that handed it on (ratio to the rung before, interval, verdict).

        ``step`` names the rung; ``stage`` the ladder stage it belongs to (default: the step
        itself; notebook 08's climb has several rungs a stage, e.g. "runtime: torch.compile" of
        stage "runtime"). Rungs are kept in the order of LADDER_STAGES, then of arrival: a rung
        handed on again (a notebook re-run alone, the climb's top given its end-to-end verdict)
        replaces itself in its place and leaves the others where they were.
        ``ladder`` names the ladder (default: the workload; notebook 08 keeps RetinaNet's
        601-class ladder apart).
        """
        stage = stage or step
        if stage not in LADDER_STAGES:
            raise CpuoptError(f"unknown ladder stage {stage!r}; use one of {', '.join(LADDER_STAGES)}")
        name = f"ladder/{ladder or config.workload}/{config.preset}"
        kept = comparison.to_dict() if isinstance(comparison, Comparison) else \
            Comparison.from_dict(comparison).to_dict() if comparison else None
        new = {"step": step, "stage": stage, "config": config.to_dict(),
               "evidence": dict(evidence or {}, comparison=kept)}
        rungs = self.store.ladder(self.machine, ladder or config.workload, config.preset)
        at = next((i for i, s in enumerate(rungs) if s["step"] == step), len(rungs))  # a rung again keeps its place
        rungs = rungs[:at] + [new] + rungs[at + 1:]
        rungs.sort(key=lambda s: stage_index(s.get("stage", s["step"])))
        self.store.put_fact(self.machine, name, rungs)

    def settle(self, stage: str, table, plan: Plan, min_rounds: int = compare.MIN_ROUNDS,
               max_rounds: int = compare.MAX_ROUNDS, budget_min: float | None = None, resume: bool = True,
               **context) -> Choice:
        """How a measuring notebook ends, for one workload: the stage's ``choose(table, plan,
        confirm, **context)`` with the notebook's confirmation rounds, its finding stored, and
        the configuration it chose handed on as the stage's rung."""
        from cpuopt_helpers.stages import stage as find_stage

        s = find_stage(stage)
        confirm = self.confirmer(f"{s.tag}/confirm", min_rounds, max_rounds, budget_min, resume)
        choice = s.module.choose(table, plan, confirm, **context)
        self.record(choice.finding, choice.config.preset if choice.config is not None else "")
        if choice.config is not None:
            self.hand_on(choice.config, s.rung, {"workload": choice.finding.workload, "sentence": choice.sentence,
                                                 "finding": choice.finding.to_dict()}, choice.comparison)
        return choice

    def record(self, finding: Finding, preset: str) -> None:
        """Store a stage's finding for its workload (the latest replaces the one before)."""
        self.store.put_fact(self.machine, f"findings/{finding.stage}/{finding.workload}/{preset}", finding.to_dict())

    def findings(self, prefix: str = "") -> list[Finding]:
        """The stored findings whose stage starts with ``prefix``, as records."""
        names = self.store.fact_names(self.machine, f"findings/{prefix}")
        return [Finding.from_dict(self.store.get_fact(self.machine, n)) for n in names]

    def tell(self, findings: list[Finding], preset: str) -> None:
        """Print a notebook's findings, one ``- sentence`` a line, and keep them as records: the
        fact ``notes/{stage}/{preset}`` holds a stage's findings (``notes`` reads them back).

        A session's first ``tell`` of a stage replaces what an earlier run kept; a later one (the
        next workload, the next cell) adds to it, replacing the findings of the same workload and
        kind, so a cell run twice keeps its findings once. Each record keeps the sentence printed
        (``said``): a page quoting the notebook matches it, whatever the templates say later."""
        findings = list(findings)
        stray = next((f for f in findings if not isinstance(f, Finding)), None)
        if stray is not None:
            raise TypeError(f"tell takes decisions.Finding records, not {type(stray).__name__}: {stray!r:.80}")
        told: dict[str, list[dict]] = {}
        for finding in findings:
            said = finding.sentence
            print("-", said)
            told.setdefault(finding.stage, []).append(finding.to_dict() | {"said": said})  # as printed: see pages
        for stage, new in told.items():
            name = f"notes/{stage}/{preset}"
            fresh = {(d["workload"], d["kind"]) for d in new}
            kept = [d for d in self.store.get_fact(self.machine, name, []) if (d["workload"], d["kind"]) not in fresh] \
                if name in self._told else []
            self.store.put_fact(self.machine, name, kept + new)
            self._told.add(name)

    def notes(self, stage: str, preset: str) -> list[Finding]:
        """A stage's findings that its notebook told (``tell``), as records, in the order told."""
        return [Finding.from_dict(d) for d in self.store.get_fact(self.machine, f"notes/{stage}/{preset}", [])]

    def headline(self, ladder: str, preset: str, comparison: Comparison | dict) -> None:
        """Keep the ladder's headline (its top against PyTorch's defaults in fresh rounds) on its
        last rung that changed the configuration, as ``end_to_end``."""
        from cpuopt_helpers.ladder import rungs as read_rungs

        name = f"ladder/{ladder}/{preset}"
        rungs = self.store.ladder(self.machine, ladder, preset)
        changed = [i for i, r in enumerate(read_rungs(self.store, self.machine, ladder, preset,
                                                      self.facts.physical_cores)) if not (r.kept or r.first)]
        if not changed:
            return
        top = rungs[changed[-1]]
        top["evidence"] = dict(top.get("evidence") or {}, end_to_end=Comparison.from_dict(dict(comparison)).to_dict())
        self.store.put_fact(self.machine, name, rungs)

    def reset_ladder(self, ladder: str, preset: str) -> None:
        """Forget a ladder's rungs (a climb that starts again from PyTorch's defaults)."""
        self.store.put_fact(self.machine, f"ladder/{ladder}/{preset}", [])

    def best_config(self, workload: str, preset: str, before: str | None = None) -> RunConfig:
        """The last configuration handed on for this workload, else the preset's default.

        ``before`` names the stage asking: it starts from the rungs ahead of its own, so a
        notebook re-run after a full run measures from the same base as in that run.
        """
        ladder = self.store.ladder(self.machine, workload, preset)
        if before is not None:
            ladder = [s for s in ladder if stage_index(s.get("stage", s["step"])) < stage_index(before)]
        return RunConfig.from_dict(ladder[-1]["config"]) if ladder else RunConfig.for_preset(workload, preset)


def parameter_list(value, item: type = str) -> list:
    """A notebook's list parameter as a list, however it came: a list, or the string papermill's
    ``-p`` hands over (a JSON list, '["a", "b"]', or comma-separated, 'a,b').

    >>> parameter_list('["cnn", "mypkg.model:build"]'), parameter_list("16, 64", int)
    (['cnn', 'mypkg.model:build'], [16, 64])
    """
    import json

    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise CpuoptError(f"cannot read {value!r} as a JSON list ({exc}); write it as "
                                  "'[\"a\", \"b\"]' or as a,b") from None
        else:
            value = [v.strip() for v in text.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        value = [value]
    try:
        return [item(v) for v in value]
    except (TypeError, ValueError):
        raise CpuoptError(f"{value!r}: every item must be of type {item.__name__}") from None
