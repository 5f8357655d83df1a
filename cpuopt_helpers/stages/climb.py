"""The whole method on one workload, rung by rung (notebook 08's climb, `make case-study`).

Each rung of ``CLIMB`` is a row: its name in the ladder, the stage it belongs to, and the
function that builds its candidates from the configuration the rungs below handed on. The
candidates are screened (one round: it ranks several and checks their loss and memory), and
the best is confirmed against that configuration with the comparison rule, whatever its one
screening round said; a rung whose winner is not confirmed faster leaves the configuration as
it was.

torch.compile is carried up only where it is confirmed faster and pays for its cold compile
within a training run of ``train_steps`` steps; from its rung on, every compiled run of the
climb shares one Inductor cache (TORCHINDUCTOR_CACHE_DIR in the configuration's env), as a
user's repeated launches would: the rung's first run compiles cold (its compile time), later
runs compile warm, in their untimed warm-up. The top is then compared with PyTorch's defaults
in fresh paired rounds: the end-to-end verdict.
"""

from __future__ import annotations

import datetime
import shutil
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from cpuopt_helpers import runtimes
from cpuopt_helpers.config import RunConfig, normalise, setting_label
from cpuopt_helpers.decisions import Arm, Comparison, Finding
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.stages import case_study, choosing
from cpuopt_helpers.stages.choosing import with_options
from cpuopt_helpers.system import Facts

PINNED = {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}
TRAIN_STEPS = 5000  # the training run torch.compile must pay for its cold compile within (notebook 08's TRAIN_STEPS)


@dataclass(frozen=True)
class Climbing:
    """Where a climb stands when a rung builds its candidates."""

    current: RunConfig  # what the rungs below handed on
    base: RunConfig  # PyTorch's defaults, where the climb started
    facts: Facts
    image_like: bool
    compile_cache: str | None = None  # the Inductor cache compiled candidates share (None: each run its own)


Candidates = tuple[tuple[Arm, ...], str]  # the rung's named candidates, or none and why


def pinned(c: Climbing) -> Candidates:
    return (Arm("threads pinned to cores (OMP_PROC_BIND=close, OMP_PLACES=cores)",
                c.current.replace(env=dict(c.current.env) | PINNED)),), ""


def intel_openmp(c: Climbing) -> Candidates:
    if not c.facts.openmp.get("intel"):
        return (), "no Intel OpenMP runtime (libiomp5.so) was found; `pip install intel-openmp` provides one"
    return (Arm("Intel OpenMP", c.current.replace(omp_runtime="intel")),), ""


def allocators(c: Climbing) -> Candidates:
    found = tuple(Arm(name, c.current.replace(allocator=name)) for name, path in c.facts.allocators.items() if path)
    return found, "" if found else "neither jemalloc nor tcmalloc was found (`make setup` installs both)"


def channels_last(c: Climbing) -> Candidates:
    if not c.image_like:
        return (), "the workload is no image model"
    return (Arm("channels-last", c.current.replace(channels_last=True)),), ""


def compiling(c: Climbing, name: str, **changes) -> Candidates:
    """One compiled candidate: the changes on top of the current configuration, with a warm-up step
    for the compile and the climb's shared Inductor cache."""
    cache = {"TORCHINDUCTOR_CACHE_DIR": c.compile_cache} if c.compile_cache else {}
    return (Arm(name, c.current.replace(**changes, warmup=max(c.current.warmup, 1),
                                        env=dict(c.current.env) | cache)),), ""


def compiled(c: Climbing) -> Candidates:
    return compiling(c, "torch.compile", compile="default")


def max_autotune(c: Climbing) -> Candidates:
    """Inductor's max-autotune (its CPU GEMM templates, AMX micro-kernels where the CPU has them),
    against what the rung below handed on: compiled in the default mode, or eager."""
    return compiling(c, "torch.compile max-autotune", compile="max-autotune")


def whole_step(c: Climbing) -> Candidates:
    """The whole training step compiled (the forward with its loss as one region, its backward with
    it, and the optimizer's step), in the mode the rungs below carried up (default where none)."""
    mode = c.current.compile if c.current.compile in ("default", "max-autotune") else "default"
    return compiling(c, "the whole step compiled", compile=mode, compile_scope="step")


def bf16_channels_last(c: Climbing) -> Candidates:
    """Channels-last again once the ladder is in bf16: oneDNN's bf16 kernels prefer it where fp32's may not."""
    if c.current.dtype != "bf16":
        return (), "the ladder is not in bf16 here (channels-last in fp32 has its own rung)"
    if c.current.channels_last:
        return (), "channels-last is on already"
    return channels_last(c)


def bf16(c: Climbing) -> Candidates:
    gate = c.facts.bf16
    if not gate["accelerated"]:
        return (), f"no bf16 fast path on this CPU ({gate['reason']}): the ladder stays in fp32"
    return (Arm("bf16 autocast, loss in fp32", c.current.replace(dtype="bf16", bf16_loss=False)),), ""


def fixes(c: Climbing) -> Candidates:
    """The paper's fixes together on top of the current configuration; and, where the workload
    declares it, the same with FrozenBatchNorm2d folded into the conv (the other fix for that cost)."""
    arms = case_study.configs(c.base, c.facts).named
    fixed = arms.get("all fixes")
    if fixed is None:
        return (), "the workload declares none of the fixes"

    def on_top(fix: RunConfig) -> RunConfig:
        return c.current.replace(options=dict(c.current.options) | dict(fix.options), optimizer_impl=fix.optimizer_impl)

    found = (Arm("the paper's fixes together", on_top(fixed)),)
    if case_study.FIX_NAMES[("frozen_bn", "folded")] in arms and dict(fixed.options).get("frozen_bn") != "folded":
        found += (Arm("the paper's fixes, FrozenBatchNorm2d folded into the conv",
                      on_top(with_options(fixed, frozen_bn="folded"))),)
    return found, ""


def allocators_on_top(c: Climbing) -> Candidates:
    """The allocators again on the top, where the allocator rung below kept glibc's: it measured them on
    PyTorch's defaults, and a bf16, compiled top with the fixes allocates and frees otherwise (on
    2026-12-05, Zen 4, the full study found the top under jemalloc 1.16x faster, its page faults gone,
    where that rung had found jemalloc no faster)."""
    if c.current.allocator != "default":
        return (), f"the ladder carries {c.current.allocator} already"
    return allocators(c)


def ipex(c: Climbing) -> Candidates:
    """IPEX, the paper's runtime, on the top so far: ``ipex.optimize`` (its weight prepacking, in the
    dtype the ladder carries) in the IPEX runtime (torch 2.8 + IPEX 2.8, built by `make ipex`)."""
    if c.current.compile:
        return (), "the ladder carries torch.compile; IPEX and torch.compile are measured one at a time"
    if c.current.runtime != "main":
        return (), f"the ladder runs in another runtime already ({c.current.runtime})"
    runtime = runtimes.ipex_facts()
    if not runtime["available"]:
        return (), f"no usable IPEX runtime: {runtime['reason']}"
    return (Arm("ipex.optimize, weights prepacked (torch 2.8 + IPEX 2.8)",
                c.current.replace(runtime="ipex", ipex=True)),), ""


@dataclass(frozen=True)
class ClimbRung:
    """One rung of the climb: its name in the ladder, its stage, its candidates."""

    name: str
    stage: str  # the ladder stage it is stored under (stages.LADDER_STAGES)
    candidates: Callable[[Climbing], Candidates]
    compiles: bool = False  # its candidates compile: cold cache first, carried up only where it pays


CLIMB = (
    ClimbRung("threading", "threading", pinned),
    ClimbRung("threading: OpenMP runtime", "threading", intel_openmp),
    ClimbRung("allocator", "allocator", allocators),
    ClimbRung("runtime: channels-last", "runtime", channels_last),
    ClimbRung("runtime: torch.compile", "runtime", compiled, compiles=True),
    ClimbRung("runtime: max-autotune", "runtime", max_autotune, compiles=True),
    ClimbRung("runtime: the whole step compiled", "runtime", whole_step, compiles=True),
    ClimbRung("bf16", "bf16", bf16),
    ClimbRung("bf16: channels-last", "bf16", bf16_channels_last),
    ClimbRung("case-study fixes", "case-study fixes", fixes),
    ClimbRung("case-study fixes: allocator", "case-study fixes", allocators_on_top),  # kept at the top: its stage
    ClimbRung("case-study fixes: IPEX", "case-study fixes", ipex),
)
CLIMB_RUNGS = tuple(r.name for r in CLIMB)


def compile_finding(table: pd.DataFrame, comparison: Comparison | None, train_steps: int, base: RunConfig,
                    workload: str = "", rung: str = "runtime: torch.compile",
                    against: str = "eager") -> tuple[Finding, bool]:
    """A compiling rung (its one candidate against ``base``, the rung below, named ``against``): its
    compile times, when it pays, and whether it is carried up (confirmed faster and paying for its
    cold compile within ``train_steps`` steps)."""
    from cpuopt_helpers.stages.extensions import breakeven_steps

    def said(kind: str, **values) -> Finding:
        return Finding(workload, "climb", kind, {"rung": rung, "against": against, **values}, comparison)

    rows = table[table["runs"] > 0] if len(table) else table  # arms that produced a result
    below = rows["config_hash"] == base.config_hash() if len(rows) else []
    if not len(rows) or rows[below].empty or rows[~below].empty:
        return said("compile no result"), False
    c, b = rows[~below].iloc[0], rows[below].iloc[0]
    if pd.isna(c.get("compile_s")):
        return said("compile no time"), False
    times = {"compile_s": float(c.compile_s),
             "compile_warm_s": float(c.compile_warm_s) if pd.notna(c.get("compile_warm_s")) else None}
    if comparison is None:
        return said("compile unconfirmed", **times), False
    if not comparison.pays:
        return said("compile not faster", **times), False
    # against a compiled base, the candidate's compile replaces the base's: only the difference is its cost
    cost = max(c.compile_s - (b.compile_s if pd.notna(b.get("compile_s")) else 0.0), 0.0)
    pays = breakeven_steps(cost, b.step_ms, b.step_ms / comparison.ratio)
    carried = bool(pays is not None and pays <= train_steps)
    return said("compile pays", **times, pays_after=float(pays), train_steps=train_steps, carried=carried), carried


def climb_rung(session, rung: ClimbRung, where: Climbing, tag: str, confirm, screen_rounds: int, resume: bool,
               train_steps: int) -> dict:
    """Screen one rung's candidates against the current configuration and confirm the best; the
    rung's finding says what became of it."""
    candidates, why = rung.candidates(where)
    workload = where.base.workload
    if not candidates:
        finding = Finding(workload, "climb", "rung skipped", {"rung": rung.name, "reason": why})
        return {"rung": rung.name, "sentence": finding.sentence, "finding": finding, "config": where.current,
                "comparison": None, "handed_on": False, "table": pd.DataFrame()}
    arms = {"baseline": where.current} | {arm.name: arm.config for arm in candidates}
    results = session.sweep(list(arms.values()), rounds=screen_rounds, tag=f"{tag}/screen", resume=resume)
    table = choosing.named_table(results, arms)
    choice = choosing.choose(table.assign(setting=table["name"]), rung.name, confirm, screen_gate=False,
                             incumbent_name="the rung below", stage=rung.stage)
    finding, faster = choice.finding, choice.changed
    if rung.compiles:
        now = where.current
        against = (f"torch.compile ({now.compile} mode{', the whole step' * (now.compile_scope == 'step')})"
                   if now.compile else "eager")
        finding, faster = compile_finding(table, choice.comparison, train_steps, where.current, workload, rung.name,
                                          against)
    return {"rung": rung.name, "sentence": finding.sentence, "finding": finding,
            "config": choice.config if faster else where.current, "comparison": choice.comparison,
            "handed_on": faster, "table": table}


def start(preset: str, classes: int, steps: int, physical_cores: int) -> tuple[str, RunConfig]:
    """Where RetinaNet's climb at ``classes`` classes starts: its ladder's name and PyTorch's defaults
    (Lamb, as MLPerf trains it; one warm-up step)."""
    config = RunConfig.for_preset("retinanet", preset, optimizer="lamb", steps=steps, warmup=1)
    config = normalise(config if classes == 80 else with_options(config, classes=classes), physical_cores)
    return ("retinanet" if classes == 80 else f"retinanet, {classes} classes"), config


def climb(session, base: RunConfig, ladder: str, image_like: bool, tag: str, min_rounds: int, max_rounds: int,
          budget_min: float | None, final_rounds: int, resume: bool = True, screen_rounds: int = 1,
          rungs: tuple[str, ...] = CLIMB_RUNGS, train_steps: int = TRAIN_STEPS, progress=print) -> dict:
    """Climb the ladder from ``base`` (PyTorch's defaults), handing each rung on under ``ladder``;
    then the top against the base in ``final_rounds`` fresh paired rounds (the end-to-end
    verdict). ``rungs`` climbs some of CLIMB_RUNGS only, in their order; ``train_steps`` is the
    training run torch.compile must pay for its compile time within. Returns the rungs
    (name, finding and its sentence, config, comparison, screening table) and that comparison."""
    unknown = set(rungs) - set(CLIMB_RUNGS)
    if unknown:
        raise CpuoptError(f"unknown rung(s) {', '.join(sorted(unknown))}; use some of {', '.join(CLIMB_RUNGS)}")
    session.reset_ladder(ladder, base.preset)
    session.hand_on(base, "baseline", {"workload": base.workload, "sentence": "PyTorch's defaults"}, ladder=ladder)
    current, climbed = base, []
    confirm = session.confirmer(f"{tag}/confirm", min_rounds, max_rounds, budget_min, resume)
    cache = session.store.path.parent / "inductor" / "".join(ch if ch.isalnum() else "-" for ch in f"{tag}-{ladder}")
    for rung in [r for r in CLIMB if r.name in rungs]:
        if rung.compiles:
            shutil.rmtree(cache, ignore_errors=True)  # the rung's first run compiles cold: its compile time
        where = Climbing(current, base, session.facts, image_like, str(cache))
        step = climb_rung(session, rung, where, tag, confirm, screen_rounds, resume, train_steps)
        current = step["config"]
        session.hand_on(current, rung.name, {"workload": base.workload, "sentence": step["sentence"]},
                        step["comparison"] if step["handed_on"] else None, ladder=ladder, stage=rung.stage)
        climbed.append(step)
        progress(f"{ladder}: {step['sentence']}")
    end = None
    if current.config_hash() != base.config_hash():
        end = session.confirm(base, current, f"{tag}/end-to-end", final_rounds, final_rounds, None, resume)
        last = next(r for r in reversed(climbed) if r["handed_on"])  # the top rung keeps the end-to-end verdict
        session.hand_on(current, last["rung"], {"workload": base.workload, "sentence": last["sentence"],
                                                "end_to_end": Comparison.from_dict(end).to_dict()},
                        last["comparison"], ladder=ladder, stage=next(r.stage for r in CLIMB if r.name == last["rung"]))
    # a finished climb: later runs keep its ladder (one cut short is replaced by the next run's)
    session.store.put_fact(session.machine, case_study.climbed_fact(ladder, base.preset),
                           {"day": f"{datetime.date.today()}"})
    return {"ladder": ladder, "base": base, "top": current, "rungs": climbed, "end_to_end": end}


PAPER_TARGET, PAPER_TARGET_LOW = 2.0, 1.8  # the paper's ~2x; an interval whose lower end clears 1.8


def climb_findings(result: dict) -> list[Finding]:
    """The climb's rungs (each rung's own finding after the ladder's name), and its top against
    PyTorch's defaults beside the paper's 2x."""
    name, end, workload = result["ladder"], result["end_to_end"], result["base"].workload
    found = [Finding(workload, "climb", "climb rung", {"ladder": name, "rung": r["rung"], "said": {
        "kind": r["finding"].kind, "values": r["finding"].values}}, r["finding"].comparison) for r in result["rungs"]]
    if end is None:
        return found + [Finding(workload, "climb", "climb kept defaults", {"ladder": name})]
    change = setting_label(result["top"].to_dict(), result["base"].to_dict())
    met = end["ratio"] >= PAPER_TARGET and (end.get("ci_low") or 0) > PAPER_TARGET_LOW
    return found + [Finding(workload, "climb", "climb top", {"ladder": name, "change": change, "met": bool(met),
                                                             "target": PAPER_TARGET, "target_low": PAPER_TARGET_LOW},
                            Comparison.from_dict(end))]
