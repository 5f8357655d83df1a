"""Stage 06, precision: bf16 autocast (loss in fp32) against fp32, gated by the ISA, and
whether bf16 training still converges.
"""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers.config import RunConfig, normalise
from cpuopt_helpers.decisions import Choice, Comparison, Finding, Plan
from cpuopt_helpers.stages import choosing
from cpuopt_helpers.system import Facts


def configs(base: RunConfig, facts: Facts, channels_last: bool = False) -> Plan:
    """Notebook 06: fp32 and bf16 (autocast, loss in fp32), with channels-last off and on.

    Without a bf16 fast path the comparison runs on the quick preset with few steps, so
    that a 10-20x slower bf16 still finishes: it is measured, not skipped.
    """
    base = normalise(base, facts.physical_cores).replace(dtype="fp32", bf16_loss=False)
    if not facts.bf16["accelerated"]:
        base = base.replace(preset="quick", steps=5, warmup=1)
    # the layout handed on first: the first config (fp32 in it) is the reference every ratio and
    # the hand-on's confirmation is taken against, so that the ladder's rung before is exactly it
    layouts = [base.channels_last, not base.channels_last] if channels_last else [base.channels_last]
    return Plan.of([base.replace(channels_last=cl, dtype=dt) for cl in layouts for dt in ("fp32", "bf16")])


table = choosing.settings_table


def accuracy_table(runs: list[dict]) -> pd.DataFrame:
    """Final test accuracy and loss of each precision mode on the digits."""
    return pd.DataFrame([{"mode": r["mode"], "final_accuracy": r["final_accuracy"], "final_loss": r["final_loss"],
                          "best_accuracy": max(h["accuracy"] for h in r["history"]), "epochs": r["epochs"],
                          "test_samples": r.get("test_samples")} for r in runs]).set_index("mode")


def gate_findings(gate: dict) -> list[Finding]:
    """Whether this CPU has a bf16 fast path, and which (``Facts.bf16``)."""
    return [Finding("", "precision", "bf16 gate", {"accelerated": bool(gate["accelerated"]),
                                                   "path": gate.get("path"), "reason": gate["reason"]})]


def findings(table: pd.DataFrame, plan: Plan) -> list[Finding]:
    """bf16 against fp32 for the plan's workload, in each layout it measured; every setting screened
    only (fp32 in the other layout too) in one record."""
    w = plan.workload
    rows = [r for _, r in table.iterrows() if isinstance(r.get("comparison"), dict)]
    return [Finding(w, "precision", "bf16 over fp32", {"setting": r["setting"]}, Comparison.from_dict(r["comparison"]))
            for r in rows if r["config"]["dtype"] == "bf16" and not choosing.is_screened(r)] + \
        choosing.screened_only(w, "precision", [r for r in rows if choosing.is_screened(r)])


def accuracy_findings(accuracy: pd.DataFrame) -> list[Finding]:
    """Each precision mode's final accuracy on the digits against fp32's (one seed each), with the
    test images it is a share of where the run says how many; then the loss in fp32 against the
    loss in bf16 too, where both ran."""
    if "fp32" not in accuracy.index:
        return []
    base, base_loss = (float(accuracy.loc["fp32", k]) for k in ("final_accuracy", "final_loss"))
    images = accuracy["test_samples"].iloc[0] if "test_samples" in accuracy else None
    images = int(images) if images == images and images is not None else None  # NaN: not said
    found = [Finding("", "precision", "digits accuracy", {"mode": mode, "accuracy": float(row.final_accuracy),
                                                          "fp32_accuracy": base, "loss": float(row.final_loss),
                                                          "fp32_loss": base_loss, "test_samples": images})
             for mode, row in accuracy.iterrows() if mode != "fp32"]
    if {"bf16", "bf16_loss"} <= set(accuracy.index):
        found.append(Finding("", "precision", "loss precision", {
            "fp32_loss_accuracy": float(accuracy.loc["bf16", "final_accuracy"]),
            "bf16_loss_accuracy": float(accuracy.loc["bf16_loss", "final_accuracy"]), "test_samples": images}))
    return found


def choose(table: pd.DataFrame, plan: Plan, confirm=None, *, accuracy: pd.DataFrame, gate: dict,
           tolerance: float = 0.01) -> Choice:
    """The bf16 configuration to hand on (``config`` None keeps fp32), why, and the comparison.

    bf16 is a candidate only with a fast path and within `tolerance` of fp32's accuracy on
    the digits; then the fastest bf16 setting screened (with or without channels-last) is
    confirmed against fp32 like every other choice. ``gate``: the machine's bf16 facts.
    """
    what = plan.workload

    def kept(kind: str, **values) -> Choice:
        return Choice(None, None, Finding(what, "bf16", kind, dict(values, what=what)))

    if not gate["accelerated"]:
        return kept("no bf16 fast path", reason=gate["reason"])
    if not {"fp32", "bf16"} <= set(accuracy.index):
        return kept("no accuracy check")
    drop = accuracy.loc["fp32", "final_accuracy"] - accuracy.loc["bf16", "final_accuracy"]
    if drop > tolerance:
        return kept("bf16 lost accuracy", drop=float(drop), tolerance=tolerance)
    bf16 = table[table["config"].map(lambda c: c["dtype"] == "bf16")] if len(table) else table
    choice = choosing.choose(table, what, confirm, candidates=bf16, stage="bf16")
    if choice.config is not None and choice.config.dtype == "bf16":
        return choice
    return Choice(None, choice.comparison, choice.finding)
