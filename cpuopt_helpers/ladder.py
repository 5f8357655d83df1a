"""The optimisation ladder as typed rungs: what each stage handed on, and by how much.

The notebooks hand rungs on through ``session.Session.hand_on`` (kept in the method's
order, ``stages.LADDER_STAGES``); this module reads them back for notebook 09, the
README, the report and ``cpuopt ladder``. Each rung carries its configuration, its
comparison with the rung before (the confirmation that handed it on: ratio, interval,
verdict, the sweep it came from) and its ratio to the baseline, chained through the rungs
that changed something (``compare.chain``; ``median`` is that chained ratio: each rung's
ratio is the geometric mean of its paired ratios, the estimate of their median).
"""

from __future__ import annotations

from cpuopt_helpers import compare
from cpuopt_helpers.config import RunConfig, normalise, setting_hash, setting_label
from cpuopt_helpers.decisions import RECIPE, Comparison, Rung
from cpuopt_helpers.planning import command_lines

DEFAULTS_LABEL = "PyTorch's defaults"


def as_run(config: dict, physical_cores: int) -> RunConfig:
    """The configuration as it ran: the thread count spelled out."""
    return normalise(RunConfig.from_dict(config), physical_cores)


def rungs(store, machine: str, workload: str, preset: str, physical_cores: int) -> list[Rung]:
    """The ordered rungs of one workload's ladder (empty when nothing was handed on).

    A rung that sets what the rung below set is ``kept`` (the stage kept the configuration:
    what it tried and rejected is no step). A rung's change counts towards ``vs_baseline``
    through its comparison only where that comparison confirmed it (``faster``) between
    exactly the rung before and this one, as run (checked through the comparison's stored
    sweep when the store has it); a change without such a comparison (``confirmed`` False:
    say, a later rung left from before its stage was re-run) leaves the chain without an
    interval rather than borrowing one.
    """
    ladder = store.ladder(machine, workload, preset)
    arms = {s["id"]: s["arms"] for s in store.sweeps(kind="ab", machine=machine)}
    out, changed, previous = [], [], None
    for rung in ladder:
        config = as_run(rung["config"], physical_cores).to_dict()
        evidence = rung.get("evidence") or {}
        comparison = Comparison.from_dict(evidence.get("comparison"))
        kept = previous is not None and setting_hash(config) == setting_hash(previous)
        confirmed = None
        if kept:
            comparison = None
        elif previous is not None:
            pair = arms.get(comparison.sweep if comparison else None)
            same = pair is None or [as_run(a, physical_cores).config_hash() for a in pair] == [
                RunConfig.from_dict(previous).config_hash(), RunConfig.from_dict(config).config_hash()]
            confirmed = bool(comparison and comparison.faster and same)
            changed.append(comparison.to_dict() if confirmed else {"ratio": 1.0, "n": 0, "ci_low": None, "ci_high": None})
        chained = compare.chain(list(changed))
        change = DEFAULTS_LABEL if previous is None else "kept" if kept else setting_label(config, previous)
        out.append(Rung(step=rung["step"], change=change, config=config, vs_previous=comparison, confirmed=confirmed,
                        vs_baseline=dict(chained, median=chained["ratio"]), kept=kept, first=previous is None,
                        end_to_end=Comparison.from_dict(evidence.get("end_to_end"))))
        previous = config
    return out


def workloads(store, machine: str, preset: str, workload: str | None = None) -> list[str]:
    """The ladders for this machine and preset: one per workload, and RetinaNet's 601-class
    one beside it ("retinanet, 601 classes"); with ``workload``, that workload's."""
    names = [n.split("/")[1] for n in store.fact_names(machine, "ladder/") if n.endswith(f"/{preset}") and n.count("/") == 2]
    if workload is None:
        return names
    return sorted((n for n in names if n == workload or n.startswith(f"{workload}, ")), key=len)


def top_end_to_end(rows: list[Rung]) -> Comparison | None:
    """The climb's end-to-end comparison, kept on its last changing rung (rungs after it kept it)."""
    return next((r.end_to_end for r in reversed(rows) if r.end_to_end), None)


def format_rungs(workload: str, rows: list[Rung]) -> list[str]:
    """The ladder as lines of text: each rung, its change, and its ratios."""
    lines = [f"{workload}:"]
    for r in rows:
        head = f"  {r.step:<17} {r.change}"
        if r.vs_previous:
            head += f"; vs the rung before {r.vs_previous.describe()}"
        if r.one_block:  # make run's RetinaNet recipe: its gain is the top's below
            head += "; tried as one block, with no comparison of its own"
        elif not (r.kept or r.first):
            head += f"; vs the baseline {compare.describe(r.vs_baseline)}"
        lines.append(head)
    end = top_end_to_end(rows)
    if end:
        lines.append(f"  the top against PyTorch's defaults, in fresh paired rounds: {end.describe()}")
    elif rows and rows[-1].step == RECIPE:
        lines.append("  the top against PyTorch's defaults: not compared yet (notebook 09 compares it)")
    if rows:
        lines.append(f"  measure it again: {command_lines(RunConfig.from_dict(rows[-1].config))['bench']}")
    return lines
