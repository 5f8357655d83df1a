"""The workbook's decisions as typed records: a comparison, an arm, a stage's plan, a finding, a
choice, a rung.

Stages return these instead of (config dict, sentence, comparison dict) tuples; the results
store keeps them as JSON (``to_dict``) and gives them back as such (``from_dict``); sentences
are rendered from findings in one place (``cpuopt_helpers.wording``), so a test checks a
record, never a substring of a sentence.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from cpuopt_helpers import compare
from cpuopt_helpers.config import RunConfig, setting_label


@dataclass(frozen=True)
class Comparison:
    """The comparison rule's result (``compare.paired_ratio`` and friends): b over a."""

    ratio: float
    ci_low: float = math.nan
    ci_high: float = math.nan
    n: int = 0
    verdict: str = "too few rounds"
    label: str = f"{compare.CONFIDENCE:.0%} CI"
    margin: float = compare.MARGIN
    min_rounds: int = compare.MIN_ROUNDS
    sweep: str | None = None
    sd: float | None = None  # of the paired log ratios: with ``level``, what ``compare.detectable_gain`` needs
    level: float | None = None  # the confidence its verdict used (a sequential design's per-look level)
    min_gain: float = compare.MIN_GAIN  # the smallest confirmed gain worth handing on
    screened: bool = False  # from a sweep's screening rounds (ranks settings), not a confirmation

    @classmethod
    def from_dict(cls, d: dict | None) -> "Comparison | None":
        """The fields this type keeps, from the rule's dict (None stays None)."""
        if not d:
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known and v is not None})

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @property
    def faster(self) -> bool:
        return self.verdict == "faster"

    @property
    def pays(self) -> bool:
        """Worth handing on: confirmed faster, by at least ``min_gain``."""
        return compare.pays(self.to_dict(), self.min_gain)

    def describe(self) -> str:
        return compare.describe(self.to_dict())


def as_comparison(value) -> Comparison | None:
    """A Comparison from a Comparison, the rule's dict, or None."""
    return value if isinstance(value, Comparison) or value is None else Comparison.from_dict(value)


@dataclass(frozen=True)
class Arm:
    """One configuration measured under a name (a screening candidate, an A/B's side)."""

    name: str
    config: RunConfig


RECIPE = "the paper's recipe"  # the arm, and the ladder's rung, of the paper's fixes together adapted to the CPU


@dataclass(frozen=True)
class Plan:
    """What a stage measures for one workload (its ``configs(base, facts, ...)``): the arms in
    order, the first being the base every ratio is taken against, and what the stage leaves out
    on this machine (name -> why, or the command that installs it)."""

    arms: tuple[Arm, ...]
    left_out: dict = field(default_factory=dict)

    @classmethod
    def of(cls, configs, left_out: dict | None = None) -> "Plan":
        """From named configurations (a dict), or a list whose arms are named by what each
        changes against the first ("baseline"); a configuration measured twice is kept once."""
        pairs = configs.items() if isinstance(configs, dict) else \
            ((setting_label(c.to_dict(), configs[0].to_dict()), c) for c in configs)
        arms, seen = [], set()
        for name, config in pairs:
            if config.config_hash() not in seen:
                seen.add(config.config_hash())
                arms.append(Arm(name, config))
        return cls(tuple(arms), dict(left_out or {}))

    @property
    def base(self) -> RunConfig:
        return self.arms[0].config

    @property
    def workload(self) -> str:
        return self.base.workload

    @property
    def configs(self) -> list[RunConfig]:
        return [a.config for a in self.arms]

    @property
    def named(self) -> dict[str, RunConfig]:
        return {a.name: a.config for a in self.arms}

    def row(self, table, name: str):
        """The rows of a stage's table (a ``config_hash`` column) measured for the arm ``name``:
        found by the arm's configuration hash, never by a label (empty: no such arm, or not measured)."""
        arm = self.named.get(name)
        if arm is None or not len(table) or "config_hash" not in table:
            return table.iloc[0:0]
        return table[table["config_hash"] == arm.config_hash()]


@dataclass(frozen=True)
class Finding:
    """What a stage found, as a record: ``kind`` names its sentence in ``wording.TEMPLATES``,
    ``values`` fill it in, ``comparison`` is the rule's result behind it (if any)."""

    workload: str
    stage: str
    kind: str
    values: dict = field(default_factory=dict)
    comparison: Comparison | None = None

    def to_dict(self) -> dict:
        return {"workload": self.workload, "stage": self.stage, "kind": self.kind, "values": self.values,
                "comparison": self.comparison.to_dict() if self.comparison else None}

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        return cls(d["workload"], d["stage"], d["kind"], dict(d.get("values") or {}),
                   Comparison.from_dict(d.get("comparison")))

    @property
    def sentence(self) -> str:
        from cpuopt_helpers.wording import render

        return render(self)


@dataclass(frozen=True)
class Choice:
    """A stage's decision: the configuration to hand on (the incumbent where nothing beat it;
    None where nothing can be handed on), the comparison that decided it, and why (a finding)."""

    config: RunConfig | None
    comparison: Comparison | None
    finding: Finding

    @property
    def sentence(self) -> str:
        return self.finding.sentence

    @property
    def changed(self) -> bool:
        """A new configuration was confirmed faster (not the incumbent kept)."""
        return self.config is not None and self.comparison is not None and self.comparison.pays


@dataclass(frozen=True)
class Rung:
    """One rung of a workload's ladder as ``ladder.rungs`` reads it back.

    ``change`` is what it changes against the rung below in words (the defaults' rung:
    PyTorch's defaults); ``kept`` says the stage kept the configuration below (no step);
    ``confirmed``: its comparison confirmed it faster between exactly the rung below and this
    one (None for the first rung and kept ones); ``vs_baseline`` is the chain of confirmed
    rungs (a dict of ``compare.chain``); ``end_to_end`` the climb's top against the defaults.
    """

    step: str
    change: str
    config: dict
    vs_previous: Comparison | None
    confirmed: bool | None
    vs_baseline: dict
    end_to_end: Comparison | None
    kept: bool = False
    first: bool = False

    @property
    def one_block(self) -> bool:
        """make run's RetinaNet recipe, tried as one block: no comparison of its own (the top's
        against PyTorch's defaults, notebook 09's headline, says what it gained)."""
        return self.step == RECIPE and not (self.kept or self.vs_previous)

    def to_dict(self) -> dict:
        return {"step": self.step, "change": self.change, "config": self.config, "kept": self.kept,
                "vs_previous": self.vs_previous.to_dict() if self.vs_previous else None,
                "confirmed": self.confirmed, "vs_baseline": self.vs_baseline,
                "end_to_end": self.end_to_end.to_dict() if self.end_to_end else None}
