"""Findings in words: the one place a decision's record becomes a sentence.

``render(finding)`` looks up the finding's ``kind`` in ``TEMPLATES`` (kind -> function of the
finding's values and comparison). Notebooks, the ladder and the README print what this
module writes, so prose and numbers never diverge; tests check the records instead.
"""

from __future__ import annotations

import math
from typing import Callable

from cpuopt_helpers import compare


def _excluded(v: dict) -> str:
    """The settings left out of a choice because their loss drifted, as trailing sentences."""
    inc = v.get("incumbent", "the baseline")
    out = ""
    for setting, drift in v.get("excluded") or []:
        if drift is not None and math.isfinite(drift):
            why = (f"its loss drifted {drift:.0%} from {inc}'s (more than {v['tolerance']:.0%}, with the same "
                   "seed and data).")
        else:
            why = f"its loss was not finite (NaN or infinite) where {inc}'s was."
        out += f" {setting} is no candidate: {why}"
    return out


def _screened(v: dict) -> str:
    grew = v.get("rss_growth")
    return (f"{v['setting']} screened best at {v['ratio']:.2f}x {v.get('incumbent', 'the baseline')} over "
            f"{v['runs']} round(s)" + (f", with {grew:.0%} more peak memory" if grew is not None else ""))


def _confirmed(v: dict, c) -> str:
    inc = v.get("incumbent", "the baseline")
    head = f"{v['what']}: {_screened(v)}; confirmed in fresh rounds: {c.describe()}"
    return head + (": handed on." if c.faster else f"; {inc} is kept.") + _excluded(v)


def _where(v: dict) -> str:
    """The DDP layout of a multi-instance finding, with its memory where it grew."""
    where = f"DDP {v['ranks']} ranks x {v['threads']} threads"
    if v.get("rss_growth") is not None:
        where += f" (peak memory {v['total_rss_mb']:.0f} MB over its ranks, {v['rss_growth']:.0%} more than one rank's)"
    return where


def _kept(template: str) -> Callable[[dict, object], str]:
    def render(v: dict, c) -> str:
        inc = v.get("incumbent", "the baseline")
        screened = _screened(v) if "setting" in v else ""
        return template.format(what=v["what"], inc=inc, screened=screened) + _excluded(v)
    return render


TEMPLATES: dict[str, Callable[[dict, object], str]] = {
    # settings.choose: screening, then the winner confirmed against the incumbent
    "no result": lambda v, c: f"{v['what']}: no setting produced a result.",
    "no baseline": lambda v, c: f"{v['what']}: {v.get('incumbent', 'the baseline')} produced no result; "
                                "nothing is handed on.",
    "no other": _kept("{what}: no other setting produced a result; {inc} is kept."),
    "all drifted": _kept("{what}: {inc} is kept."),
    "not beaten": _kept("{what}: no setting beat {inc} in screening ({screened}); {inc} is kept."),
    "not confirmed": _kept("{what}: {screened}, not confirmed; {inc} is kept."),
    "confirmed": lambda v, c: _confirmed(v, c),
    # precision.choose: the gates before bf16 is a candidate
    "no bf16 fast path": lambda v, c: f"{v['what']}: fp32 kept: this CPU has no bf16 fast path ({v['reason']}).",
    "no accuracy check": lambda v, c: f"{v['what']}: fp32 kept: the digits accuracy check did not run.",
    "bf16 lost accuracy": lambda v, c: (f"{v['what']}: fp32 kept: bf16 lost {v['drop']:.1%} accuracy on the digits "
                                        f"(tolerance {v['tolerance']:.0%})."),
    # multi_instance.choose: the fastest DDP job against one rank on all cores
    "no layout": lambda v, c: f"{v['what']}: no layout produced a result.",
    "no ddp layout": lambda v, c: f"{v['what']}: no DDP layout fits here; one rank on all cores is kept.",
    "ddp not screened faster": lambda v, c: (
        f"{v['what']}: {_where(v)} screened at {v['ddp_sps']:.1f} samples/s against one rank's "
        f"{v['single_sps']:.1f}; one rank on all cores is kept."),
    "ddp confirmed": lambda v, c: (
        f"{v['what']}: {_where(v)} over one rank x {v['single_threads']} threads, in fresh rounds: {c.describe()}"
        + (": handed on." if c.faster else "; one rank on all cores is kept.")),
}


def render(finding) -> str:
    """The finding's sentence (``finding``: a ``decisions.Finding``)."""
    try:
        template = TEMPLATES[finding.kind]
    except KeyError:
        raise ValueError(f"no sentence for findings of kind {finding.kind!r}; add one to wording.TEMPLATES") from None
    return template(finding.values, finding.comparison)


def describe(comparison) -> str:
    """A comparison in the rule's words (a ``decisions.Comparison`` or the rule's dict)."""
    return compare.describe(comparison if isinstance(comparison, dict) or comparison is None else comparison.to_dict())
