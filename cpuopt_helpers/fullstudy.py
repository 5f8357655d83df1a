"""RetinaNet at the full preset (800 px, ResNeXt-50 32x4d, FPN, batch 2; 264 classes, MLPerf's
OpenImages subset): PyTorch's defaults against the top, compared in fixed paired rounds, then
each profiled, written as this machine's dated page. ``make case-study PRESET=full`` runs it:

    python -m cpuopt_helpers.fullstudy [--rounds 5] [--classes 264] [--page docs/results]

The top is what this machine's standard-preset ladder of RetinaNet handed on (``make run`` or
``make case-study``), moved to the full preset; where no ladder is stored, the paper's recipe
adapted to this CPU (the fixes together, bf16 where the gate finds a fast path, else fp32, and
the page says which). Nothing is handed on: the study never touches a ladder.

Where the kernel takes ``TRY_KERNEL_SHARE`` of the top's CPU time or more (page faults: memory the C
library's allocator hands back to the OS and faults in again), the top is compared with itself
under an allocator that keeps freed memory, in as many fixed rounds; where that is confirmed faster,
it is profiled in the top's place (one profile fewer keeps the trial within the study's budget more
often), and the projection and the next fix read the fastest configuration confirmed.
After the comparisons each arm is traced (``profiledn.wholestep``: every operator of a timed step
with its work and ceiling) and the trace accounts for its step by phase (``profiledn.account``):
why the forward takes what it takes against the backward, and where the top's time goes by
cause; a profile that fails is said, and the comparison kept. The output ends with the next fix
the top's profile points at and, where that is a convolution's backward, the fix tried: that
convolution alone under each path this CPU offers (``kernels.conv_paths``: the other layout, the GEMM
form, bf16 where fast), each against the path the step ran (its dtype, and the layout its trace
recorded), and its rate alone against the rate in the step. The page states how long the study took.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from cpuopt_helpers import compare, records, targets, wording
from cpuopt_helpers.config import RunConfig, bench_line, setting_hash, setting_label
from cpuopt_helpers.decisions import RECIPE, Comparison, Finding
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.profiledn import account, wholestep
from cpuopt_helpers.results import loaded_sentence
from cpuopt_helpers.stages import case_study, climb
from cpuopt_helpers.stages.choosing import with_options

CLASSES = 264  # MLPerf Training's RetinaNet: the OpenImages subset
ROUNDS = 5  # fixed paired rounds: one look, the plain 95% interval
STEPS, WARMUP = 2, 1  # timed steps a run; warm-up goes on until steady (at most 2 more here)
TIMEOUT_S = 1800.0  # a run: a cold compile of the full model and its few long steps fit
# the top's kernel share from which the page says so and the study tries an allocator that keeps memory: lower
# than a notebook's launch.KERNEL_SHARE, since the trial is one more comparison in the study's budget. glibc maps
# every block above its largest mmap threshold (32 MiB on 64-bit, mallopt(3)) afresh and unmaps it when freed, so
# the full preset's activations (800 px) fault in again at every step, where most of the standard preset's fit below
TRY_KERNEL_SHARE = 0.05
KEEPS_MEMORY = ("jemalloc", "tcmalloc")  # allocators that keep freed memory for reuse (jemalloc: config.JEMALLOC_CONF)
MLPERF_PER_CORE = targets.MLPERF_PER_CORE
TAG = "case-study-full"
TRY_ROUNDS = compare.FIXED_ROUNDS  # the next fix's trial: interleaved rounds of its convolution alone (one look)
TRY_TIMEOUT_S = 1200.0  # the trial: a few minutes at the full preset's heaviest convolution
TRY_RESERVE_S = 300.0  # what the study's plan keeps for that trial
BUDGET_MIN = 60.0  # the study's minutes on 2 cores: the allocator trial starts only where it fits within them
LADDER_SOURCE = "the top of this machine's standard-preset ladder"  # where the top comes from, when stored
# a path of kernels.conv_paths -> how a run takes it
PATH_FLAGS = {"channels-last": "--channels-last", "bf16": "--dtype bf16",
              "bf16 channels-last": "--dtype bf16 --channels-last", "GEMM form": None,
              "NCHW": None, "bf16 NCHW": None}  # channels-last by Inductor's choice: no flag turns it off
UNFLAGGED = {"NCHW": "no --channels-last", "bf16 NCHW": "--dtype bf16, no --channels-last"}  # by --channels-last
# (a path, the dtype the step ran) -> the climb's rung that compares that flag over the whole step (every layer)
WHOLE_STEP_RUNGS = {("channels-last", "bf16"): "bf16: channels-last",
                    ("channels-last", "fp32"): "runtime: channels-last",
                    ("bf16", "fp32"): "bf16", ("bf16 channels-last", "fp32"): "bf16: channels-last"}


def arms(session, classes: int = CLASSES, preset: str = "full") -> tuple[RunConfig, RunConfig, str]:
    """PyTorch's defaults at the preset, the top, and where the top comes from (words)."""
    _, base = climb.start(preset, classes, STEPS, session.facts.physical_cores)
    base = base.replace(timeout_s=TIMEOUT_S)
    ladder = session.store.ladder(session.machine, "retinanet", "standard")
    if len(ladder) > 1:
        stored = RunConfig.from_dict(ladder[-1]["config"])
        top = same_model(stored.replace(preset=preset, steps=STEPS, warmup=WARMUP, timeout_s=TIMEOUT_S), base)
        if top.config_hash() != base.config_hash():  # a ladder still at the defaults: the recipe instead
            # the rung that set the top, not a later one that kept it
            made = next(r for r in ladder if setting_hash(r["config"]) == setting_hash(ladder[-1]["config"]))
            return base, top, f"{LADDER_SOURCE} ({made['step']}; {ladder_words(ladder)})"
    plan = case_study.configs(base, session.facts).named  # its arms drop the base's options: classes again
    top = plan.get(RECIPE, plan.get("all fixes"))
    if top is None:
        raise CpuoptError("retinanet declares none of the paper's fixes; nothing to compare with its defaults")
    return base, same_model(top, base), (f"{RECIPE} (no standard-preset ladder of RetinaNet above "
                                           "PyTorch's defaults was in this study's results store when it began: "
                                           "`make run` or `make case-study` writes one)")


def ladder_words(ladder: list[dict]) -> str:
    """What each rung of a stored ladder handed on ('bf16: dtype=bf16', 'bf16: channels-last: kept the
    rung below'), and where the ladder has no case-study fixes rung, that it has none: the reader
    sees which climb made the top."""
    said = []
    for below, rung in zip(ladder, ladder[1:]):
        change = setting_label(rung["config"], below["config"])
        said.append(f"{rung['step']}: {'kept the rung below' if change == 'baseline' else change}")
    if not any(r.get("stage", r["step"]) == "case-study fixes" for r in ladder):
        said.append("no case-study fixes rung (`make case-study` climbs them)")
    return "its rungs: " + "; ".join(said)


def same_model(config: RunConfig, base: RunConfig) -> RunConfig:
    """``config`` with the base's class count: set where the base sets it, else the workload's own
    (at 80 classes the defaults name none, and a top naming it would differ from them in name only)."""
    classes = dict(base.options).get("classes")
    if classes is not None:
        return with_options(config, classes=classes)
    return config.replace(options={k: v for k, v in dict(config.options).items() if k != "classes"})


def profile(config: RunConfig, trace: Path, ceilings: wholestep.Ceilings, reuse: bool = False) -> dict:
    """Two traced runs of the configuration (``wholestep.capture``: one with input shapes for the
    work, one without for the times, since recording shapes slows the step), the whole-step
    projection and its phase account. ``reuse``: read the traces an interrupted study left, where
    both are there."""
    if not (reuse and trace.exists() and wholestep.timing_path(trace).exists()):
        for run in wholestep.capture(config, trace, plain=False)[:2]:
            if run["status"] != "ok":
                raise CpuoptError(f"a traced run of {config.label()} did not finish: {run['status']}: "
                                  f"{(run.get('reason') or '').splitlines()[:1]}")
    result = wholestep.whole_step(trace, ceilings)
    table = account.phase_table(result, ceilings)
    return {"whole": result, "phases": table, "account": account.forward_backward(table),
            "next": account.next_fix(result), "trace": str(trace)}


def arm_figures(runs: list[dict], cores: int) -> dict:
    """Medians over an arm's runs: samples/s, per physical core, step and phase seconds, GFLOP/s."""
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        return {}
    med = lambda xs: statistics.median(xs)  # noqa: E731
    out = {"samples_per_s": med([r["samples_per_s"] for r in ok]), "runs": len(ok),
           "step_s": med([r["step_ms"]["median"] for r in ok]) / 1e3,
           "achieved_gflops": med([r["achieved_gflops"] for r in ok if r.get("achieved_gflops")] or [float("nan")])}
    out |= {f"{p}_s": med([r["phase_ms"][p] for r in ok]) / 1e3 for p in ("forward", "backward", "optimizer")}
    out["per_core"] = out["samples_per_s"] / cores
    if all(r.get("system_share") is not None for r in ok):  # runs of a worker that reads its CPU time
        out |= {k: med([r[k] for r in ok]) for k in ("system_share", "page_faults_per_step")}
    return out


def check(rounds: int, classes: int, budget_min: float = BUDGET_MIN) -> None:
    if rounds < compare.MIN_ROUNDS or classes < 1 or not budget_min > 0:
        raise CpuoptError(f"the study needs --rounds {compare.MIN_ROUNDS} or more (a verdict needs them), a "
                          f"positive --classes and a positive --budget-min; got {rounds}, {classes} and {budget_min:g}")


def compare_arms(session, arms: dict[str, RunConfig], rounds: int, tag: str, resume: bool) -> tuple[dict, dict]:
    """The fixed paired rounds of the second arm against the first (names -> configurations), and
    each arm's figures from this comparison's own runs (a rerun of the same sweep on unchanged code
    adds rows to the store: only the last rounds are this one's)."""
    first, second = arms.values()
    result = session.confirm(first, second, tag, rounds, rounds, None, resume)
    runs = session.store.results(sweep=result["sweep"])
    n = len(result["rounds"])
    arm_runs = {name: [r for r in runs if r["config_hash"] == c.config_hash()] for name, c in arms.items()}
    mine = {name: r[max(len(r) - n, 0):] for name, r in arm_runs.items()}  # [-0:] would keep them all
    said = loaded_sentence([r for runs_of in mine.values() for r in runs_of])
    return dict(result, machine_sentence=said), {name: arm_figures(r, session.facts.physical_cores)
                                                  for name, r in mine.items()}


def allocator_arm(top: RunConfig, kernel_share: float | None, facts) -> RunConfig | None:
    """Where the kernel took ``TRY_KERNEL_SHARE`` or more of the top's CPU time under the C library's
    allocator: the top under the first allocator found here that keeps freed memory for reuse
    (``KEEPS_MEMORY``); else None (a top whose allocator a ladder chose keeps it)."""
    if kernel_share is None or kernel_share < TRY_KERNEL_SHARE or top.allocator != "default":
        return None
    found = [name for name in KEEPS_MEMORY if facts.allocators.get(name)]
    return top.replace(allocator=found[0]) if found else None


def kept_name(allocator: dict) -> str:
    """The allocator trial's arm as the page names it: "top under jemalloc"."""
    return f"top under {allocator['config'].allocator}"


def trial_seconds(compare_s: float, figures: dict, defaults_profile_s: float = 0.0) -> float:
    """The allocator trial's seconds at most: as many runs as the comparison just made, each as long as
    the top's (the comparison's time split by its arms' steps; the allocator's arm counted as slow),
    and the profile that follows them (the defaults' profile, scaled the same way)."""
    d, t = figures["defaults"].get("step_s"), figures["top"].get("step_s")
    top_share = t / (d + t) if d and t else 0.5
    return 2 * compare_s * top_share + defaults_profile_s * (t / d if d and t else 1.0)


def compare_line(a: RunConfig, b: RunConfig, rounds: int) -> str:
    """The `cpuopt compare` line of b against a in ``rounds`` fixed rounds."""
    prefix = f"cpuopt bench --workload {a.workload} --preset {a.preset} "
    flags = [shlex.quote(bench_line(c).removeprefix(prefix)) for c in (a, b)]
    return (f"cpuopt compare --workload {a.workload} --preset {a.preset} --a {flags[0]} --b {flags[1]} "
            f"--min-rounds {rounds} --max-rounds {rounds}")


def try_allocator(session, top: RunConfig, figures: dict, rounds: int, tag: str, resume: bool, say=print,
                  need_s: float = 0.0, left_s: float = math.inf) -> dict | None:
    """The top against itself under an allocator that keeps freed memory (``allocator_arm``), in
    ``rounds`` fixed paired rounds: its configuration, the comparison and both arms' figures; None
    where the kernel's share does not call for it or no such allocator is installed. Where what it
    needs (``need_s``: its rounds, and the profile that follows them) is more than the study's
    budget leaves (``left_s``), it is not started: ``skipped`` says so, with the line that runs it."""
    kept = allocator_arm(top, figures.get("system_share"), session.facts)
    if kept is None:
        return None
    if need_s > left_s:
        say(f"not trying the top under {kept.allocator}: it needs about {need_s / 60:.0f} min, "
            f"{max(left_s, 0) / 60:.0f} min of the study's budget are left")
        return {"config": kept, "skipped": {"need_min": need_s / 60, "left_min": max(left_s, 0) / 60,
                                            "command": compare_line(top, kept, rounds)}}
    say(f"the OS kernel took {figures['system_share']:.0%} of the top's CPU time: the top under {kept.allocator}, "
        f"which keeps freed memory, against the top in {rounds} paired rounds")
    result, found = compare_arms(session, {"top": top, "kept": kept}, rounds, tag, resume)
    return {"config": kept, "comparison": result, "figures": found}


def profile_arms(session, arms: dict[str, RunConfig], trace_dir: Path, ceilings, resume: bool, say=print
                 ) -> tuple[dict, dict]:
    """``profile`` of each arm (a failure kept as its ``error``), and the seconds each took."""
    profiles, took = {}, {}
    for name, config in arms.items():
        say(f"profiling {name} (two traced runs: with input shapes for the work, without for the times)")
        began = time.time()
        try:
            profiles[name] = profile(config, trace_dir / f"{name.replace(' ', '-')}.json", ceilings, reuse=resume)
        except CpuoptError as exc:
            profiles[name] = {"error": str(exc)}
        took[name] = time.time() - began
    return profiles, took


def run_study(session, rounds: int = ROUNDS, classes: int = CLASSES, folder: Path | None = None,
              resume: bool = False, say=print, preset: str = "full", budget_min: float = BUDGET_MIN) -> dict:
    """Compare both arms in ``rounds`` fixed paired rounds, then profile the defaults and the
    fastest configuration confirmed (the top, or the top under an allocator the trial found
    faster), and tell (and with ``folder``, write the page). Returns everything the page is
    made of. A profile that fails is said on the page; the comparison is kept. ``preset``: the
    full one is the study; the quick one runs the same in a minute or two (a smoke run, for
    tests). ``budget_min``: the allocator trial starts only where it fits within it."""
    check(rounds, classes, budget_min)
    started = time.time()
    base, top, source = arms(session, classes, preset)
    ceiling_preset = "quick" if preset == "quick" else "standard"  # notebook 00's roofline, as make run stores it
    ceilings = wholestep.Ceilings.from_roofline(session.roofline(ceiling_preset), f"roofline/{ceiling_preset}",
                                                session.theoretical_gflops(ceiling_preset))
    say(f"RetinaNet, {preset} preset, {classes} classes: PyTorch's defaults against {source}: "
        f"{setting_label(top.to_dict(), base.to_dict())}")
    say(f"comparing them in {rounds} paired rounds")
    began = time.time()
    result, figures = compare_arms(session, {"defaults": base, "top": top}, rounds, f"{TAG}/{preset}/end-to-end",
                                   resume)
    compare_s, trace_dir = time.time() - began, session.store.path.parent / "traces" / f"{TAG}-{preset}"
    trace_dir.mkdir(parents=True, exist_ok=True)
    profiles, took = profile_arms(session, {"defaults": base}, trace_dir, ceilings, resume, say)
    need = trial_seconds(compare_s, figures, took["defaults"]) + TRY_RESERVE_S  # its rounds and profile, the last trial
    allocator = try_allocator(session, top, figures["top"], rounds, f"{TAG}/{preset}/allocator", resume, say,
                              need, budget_min * 60 - (time.time() - started))
    kept = allocator and compare.pays(allocator.get("comparison"))  # the fastest configuration confirmed
    fastest, config = (kept_name(allocator), allocator["config"]) if kept else ("top", top)
    profiles |= profile_arms(session, {fastest: config}, trace_dir, ceilings, resume, say)[0]  # what the next fix reads
    tried = target = next_fix_target(profiles[fastest]) if "whole" in profiles[fastest] else None
    if target:
        say(f"trying the next fix: {target['op']} alone, under each path this CPU offers")
        tried = try_next_fix(target, config, session.facts) | {"whole_step": whole_step_rungs(session, target["dtype"])}
    study = {"base": base, "top": top, "source": source, "comparison": result, "figures": figures,
             "allocator": allocator, "profiles": profiles, "fastest": fastest, "tried": tried, "ceilings": ceilings,
             "theoretical": ceilings.theoretical_gflops,
             "cores": session.facts.physical_cores, "seconds": time.time() - started, "resumed": resume,
             "classes": classes, "rounds": rounds, "bf16": session.facts.bf16, "preset": preset}
    for finding in study_findings(study):
        say(f"- {finding.sentence}")
    if folder is not None:
        say(f"the page: {write_page(study, folder, session.facts)}")
    return study


def next_fix_target(prof: dict) -> dict | None:
    """Where the next fix is a convolution's backward (what ``kernels.conv_paths`` tries): its
    heaviest instance, the one with the most time above its ceiling, with its shapes, time a step,
    rate in the step and the layout it ran in (``wholestep.layout_of``: the trace's strides, since
    ``torch.compile`` may have turned it channels-last; None where they are not recorded); None for
    any other operator."""
    nxt = prof.get("next") or {}
    if "convolutionbackward" not in nxt.get("op", "").lower().replace("_", ""):
        return None
    table = prof["whole"]["table"]
    rows = table[(table["op"] == nxt["op"]) & (table["phase"] == nxt["phase"])]
    if rows.empty:
        return None
    row = rows.loc[(rows["ms"] - rows["projected_ms"]).idxmax()]
    layout = wholestep.layout_of(prof["trace"], row["shapes"]) if prof.get("trace") else None
    return {"op": nxt["op"], "shapes": row["shapes"], "dtype": row["dtype"] or "fp32", "step_ms": float(row["ms"]),
            "step_gflops": float(row["achieved_gflops"]), "layout": layout}


def try_next_fix(target: dict, config: RunConfig, facts, rounds: int = TRY_ROUNDS) -> dict:
    """The next fix's convolution (``next_fix_target``) alone under each path this CPU offers
    (``kernels.conv_paths``, in a process of its own at the top's threads): the target, and
    ``trial``, ``error``, or ``skipped`` where the step runs IPEX's convolutions (weights prepacked, in
    torch 2.8), which the benchmark, in this torch, would not time as the step ran them. The layout
    the trace did not record is assumed from the run's ``--channels-last`` (and said so: under
    ``torch.compile`` Inductor may have chosen another)."""
    target = target | {"layout": target.get("layout") or ("channels-last" if config.channels_last else "NCHW"),
                       "layout_assumed": not target.get("layout"), "channels_last_flag": config.channels_last}
    if config.ipex:
        return target | {"skipped": "the step runs IPEX's convolutions (weights prepacked, torch 2.8), and the "
                                    "benchmark alone runs this torch's: it would not time the kernel the step ran"}
    command = [sys.executable, "-m", "cpuopt_helpers.kernels.conv_paths", target["shapes"], "--dtype",
               target["dtype"], "--layout", target["layout"], "--threads", str(config.threads or facts.physical_cores),
               "--rounds", str(rounds), "--json"] + (["--bf16-fast"] if facts.bf16.get("accelerated") else [])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TRY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return target | {"error": f"the trial ran past {TRY_TIMEOUT_S:.0f} s"}
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return target | {"error": said.removeprefix("cpuopt: ")}
    return target | {"trial": json.loads(done.stdout)}


def whole_step_rungs(session, dtype: str) -> dict[str, dict]:
    """Path -> the stored standard-preset ladder's rung that compared its flag over the whole step, where a
    climb (``make case-study``) stored one: its name, its own sentence and the climb's day."""
    rungs = session.store.ladder(session.machine, "retinanet", "standard")
    ladder = {r["step"]: r for r in rungs}
    kept = {r["step"]: setting_hash(r["config"]) != setting_hash(below["config"]) for below, r in zip(rungs, rungs[1:])}
    day = (session.store.get_fact(session.machine, case_study.climbed_fact("retinanet", "standard")) or {}).get("day")
    return {path: {"rung": rung, "sentence": (ladder[rung].get("evidence") or {}).get("sentence", ""), "day": day,
                   "kept": kept.get(rung)}
            for (path, ran), rung in WHOLE_STEP_RUNGS.items() if ran == dtype and rung in ladder}


def tried_finding(tried: dict, ceiling: float | None, who: str = "retinanet (top)") -> Finding:
    """The trial in words: each path against the one the step ran, and what that leaves."""
    values = {k: tried[k] for k in ("op", "shapes", "step_ms", "step_gflops")} | {"layout": layout_words(tried)}
    for why in ("error", "skipped"):
        if why in tried:
            return Finding(who, "case_study", "next fix tried", values | {why: tried[why]})
    both = [r for r in tried["trial"]["rows"] if r["part"] == "both"]
    flags = PATH_FLAGS | (UNFLAGGED if tried.get("channels_last_flag") else {})
    paths = [{"path": r["path"], "ratio": r["speedup"], "low": r["speedup_low"], "high": r["speedup_high"],
              "verdict": r["verdict"], "flags": flags.get(r["path"]),
              "whole_step": (tried.get("whole_step") or {}).get(r["path"])} for r in both if r["path"] != "as run"]
    won = [p for p in paths if compare.pays({"verdict": p["verdict"], "ratio": p["ratio"]})]
    best = max(won, key=lambda p: p["ratio"]) if won else None
    return Finding(who, "case_study", "next fix tried", values | {
        "rounds": tried["trial"]["rounds"], "alone_gflops": next(r["gflops"] for r in both if r["path"] == "as run"),
        "ceiling": ceiling, "paths": paths, "best": best,
        "saving_ms": tried["step_ms"] * (1 - 1 / best["ratio"]) if best else None})


def tried_lines(tried: dict | None, ceilings: wholestep.Ceilings) -> list[str]:
    """The trial's paths as a markdown table (nothing where no trial finished)."""
    if not tried or "trial" not in tried:
        return []
    ceiling = ceilings.gemm_for(tried["dtype"])
    rows = {(r["path"], r["part"]): r for r in tried["trial"]["rows"]}
    out = [f"The next fix, tried: {tried['op']} ({tried['shapes']}) alone, forward and backward, "
           f"{tried['trial']['rounds']} interleaved rounds (`python -m cpuopt_helpers.kernels.conv_paths`):", "",
           "| path | forward ms | backward ms | GFLOP/s alone | of measured GEMM ceiling | over as run | interval | "
           "verdict |", "|---|---|---|---|---|---|---|---|"]
    for path in dict.fromkeys(p for p, _ in rows):
        both = rows[(path, "both")]
        share = f"{both['gflops'] / ceiling:.0%}" if ceiling else ""
        over = "" if both["speedup"] is None else f"{both['speedup']:.2f}x"
        interval = "" if both["speedup"] is None else f"95% CI {both['speedup_low']:.2f}-{both['speedup_high']:.2f}"
        forward, backward = (_ms_cell(rows[(path, part)]["median_ms"]) for part in ("forward", "backward"))
        label = f"as run ({tried['dtype']}, {layout_words(tried)})" if path == "as run" else path
        out.append(f"| {label} | {forward} | {backward} | {both['gflops']:.0f} | {share} | {over} | {interval} "
                   f"| {both['verdict']} |")
    return ["\n".join(out)]


def layout_words(tried: dict) -> str:
    """The layout the trial's as-run path took, and whether the trace said it or it was assumed."""
    layout = tried.get("layout") or "NCHW"
    return f"{layout}, assumed: the trace recorded no strides" if tried.get("layout_assumed") else layout


def _ms_cell(ms: float) -> str:
    """Milliseconds to three significant figures or so: whole above 100, one decimal below."""
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}"


def study_findings(study: dict) -> list[Finding]:
    """What the study says: the comparison beside MLPerf's rate, each arm's forward/backward account,
    the top's projection, and last the next fix its profile points at."""
    fastest = study.get("fastest", "top")  # the fastest configuration confirmed, whose profile was read
    top, figures, c, who = study["profiles"][fastest], study["figures"], study["comparison"], f"retinanet ({fastest})"
    per_core = figures["top"].get("per_core")
    bf16 = study["bf16"]
    change = setting_label(study["top"].to_dict(), study["base"].to_dict())
    found = [Finding("retinanet", "case_study", "full preset top", {
        "preset": study["preset"], "classes": study["classes"], "change": change,
        "per_core": per_core, "mlperf_per_core": mlperf_rate(study), "dtype": study["top"].dtype,
        "bf16_fast": bool(bf16.get("accelerated")), "bf16_reason": bf16.get("reason", "")},
        Comparison.from_dict(c))]
    found += target_findings(study)
    for name, prof in study["profiles"].items():
        arm = f"retinanet ({name})"
        found.append(Finding(arm, "case_study", "forward backward", prof["account"]) if "account" in prof else
                     Finding(arm, "case_study", "profile failed", {"reason": prof["error"]}))
    found += kernel_findings(study)  # before the operators' projection: it slows all of them
    if "whole" in top:
        found += [f for f in wholestep.wholestep_findings(top["whole"], who)
                  if f.kind in ("whole step projection", "whole step gemm")]
        found.append(Finding(who, "case_study", "next fix", top["next"]))
    if study.get("tried"):
        found.append(tried_finding(study["tried"], study["ceilings"].gemm_for(study["tried"]["dtype"]), who))
    return found


def mlperf_rate(study: dict) -> float | None:
    """MLPerf's images/s per core where the study ran at its size (the full preset, its 264 classes), else None."""
    return MLPERF_PER_CORE if study["preset"] == "full" and study["classes"] == CLASSES else None


def kernel_findings(study: dict) -> list[Finding]:
    """Where the kernel took ``TRY_KERNEL_SHARE`` or more of the top's CPU time: that, and the top
    under an allocator that keeps freed memory against the top, where the study tried it."""
    top, kept = study["figures"]["top"], study.get("allocator")
    if top.get("system_share") is None or top["system_share"] < TRY_KERNEL_SHARE:
        return []
    ran = kept if kept and "comparison" in kept else None
    found = [Finding("retinanet (top)", "case_study", "kernel time", {
        "share": top["system_share"], "page_faults": top["page_faults_per_step"], "allocator": study["top"].allocator,
        "tried": ran["config"].allocator if ran else None})]
    if kept and not ran:
        found.append(Finding("retinanet (top)", "case_study", "allocator not tried", {
            "allocator": kept["config"].allocator, **kept["skipped"]}))
    if ran:
        (before, after), c = (kept["figures"][k] for k in ("top", "kept")), kept["comparison"]  # the trial's runs
        found.append(Finding("retinanet (top)", "case_study", "allocator tried", {
            "allocator": kept["config"].allocator, "faster": compare.pays(c),
            "before": {k: before.get(k) for k in ("system_share", "page_faults_per_step")},
            "after": {k: after.get(k) for k in ("system_share", "page_faults_per_step")},
            "per_core": after.get("per_core"), "mlperf_per_core": mlperf_rate(study)}, Comparison.from_dict(c)))
    return found


def timed_steps(study: dict) -> dict[str, float]:
    """Each arm's timed median step in seconds, by the name its profile has (the allocator trial's
    arm by ``kept_name``), where the study timed it."""
    figures = dict(study["figures"])
    kept = study.get("allocator") or {}
    if (kept.get("figures") or {}).get("kept"):
        figures[kept_name(kept)] = kept["figures"]["kept"]
    return {n: f["step_s"] for n, f in figures.items() if f and f.get("step_s")}


def phase_lines(profiles: dict, timed: dict | None = None) -> list[str]:
    """Each arm's traced step by phase, as a markdown table, captioned with each arm's traced step
    beside its timed median (``timed``: seconds by arm, where the page gives one): the profiler's
    steps are other runs, and it costs time of its own."""
    traced = {n: p["whole"]["step_ms"] / 1e3 for n, p in profiles.items() if "phases" in p}  # as the page's others
    beside = "; ".join(f"{n} {s:.2f} s traced" + (f", {timed[n]:.2f} s timed" if (timed or {}).get(n) else "")
                       for n, s in traced.items())
    head = [f"Each arm's step under the profiler, by phase ({beside}: traced steps are other runs than the timed "
            "medians above, and the profiler costs time of its own; the shares and rates are what to read here):", "",
            "| phase | arm | s a step | share | GFLOP | GEMM-like share | GEMM GFLOP/s | of measured ceiling | "
            "of theoretical peak | between ops s |", "|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for phase in ("forward", "loss", "backward", "optimizer"):
        for name, p in profiles.items():
            if "phases" not in p:
                continue
            r = p["phases"].loc[phase]
            pct = lambda x: "" if x is None or pd.isna(x) else f"{x:.0%}"  # noqa: E731
            rate = "" if r["gemm_gflops"] is None or pd.isna(r["gemm_gflops"]) else f"{r['gemm_gflops']:.0f}"
            rows.append(f"| {phase} | {name} | {r['ms'] / 1e3:.2f} | {r['share']:.0%} | {r['gflop']:.0f} | "
                        f"{r['gemm_share']:.0%} | {rate} | {pct(r['of_ceiling'])} | {pct(r['of_theoretical'])} | "
                        f"{r['between_ms'] / 1e3:.2f} |")
    return head + rows if rows else []


def page_rows(study: dict) -> list[records.Row]:
    """The page's figures: the comparison, each arm's rates and phases, the top's projection."""
    c, rounds = study["comparison"], f"{study['comparison'].get('n', 0)} paired rounds"
    out = [records.Row("the top over PyTorch's defaults, images/s", f"{c['ratio']:.2f}x", interval(c), rounds),
           records.Row("verdict", c["verdict"], "", rounds)]
    for name, f in study["figures"].items():
        runs = f"{f.get('runs', 0)} runs (median)"
        if not f:
            out.append(records.Row(f"{name}: images/s", "no run finished", "", "0 runs"))
            continue
        dtype = study["base" if name == "defaults" else "top"].dtype  # each arm against its own dtype's peaks
        ceiling, peak = study["ceilings"].gemm_for(dtype), study["theoretical"].get(dtype)
        gflops = f["achieved_gflops"]
        share = "" if not ceiling or gflops != gflops else (
            f" ({gflops / ceiling:.0%} of the measured {dtype} GEMM ceiling"
            + (f", {gflops / peak:.0%} of the theoretical {dtype} peak)" if peak else "; theoretical peak unknown)"))
        out += [records.Row(f"{name}: images/s", f"{f['samples_per_s']:.3f}", "", runs),
                records.Row(f"{name}: images/s per physical core", f"{f['per_core']:.3f}", "", runs),
                step_row(name, f),
                records.Row(f"{name}: GFLOP/s achieved", f"{f['achieved_gflops']:.0f}{share}", "", runs)]
        out += kernel_rows(name, f)
    out += allocator_rows(study.get("allocator"))
    fastest = study.get("fastest", "top")
    whole = study["profiles"][fastest].get("whole")
    if whole:
        out.append(records.Row(f"{fastest} at every ceiling (projection of its traced step)",
                               f"{whole['projected_ms'] / 1e3:.1f} s of its {whole['step_ms'] / 1e3:.1f} s traced step",
                               "", "2 traced runs"))
        out += [records.Row(f"{fastest}: gap, {cause}", f"{ms / 1e3:.2f} s ({whole['gap_share'].get(cause, 0):.0%} "
                            "of the traced step)", "", "2 traced runs")
                for cause, ms in whole["gap_ms"].items() if ms > 0]
    out += bound_rows(study) + target_rows(target_findings(study))
    took = wording.duration_words(study["seconds"]) + (" (this invocation, resumed)" if study.get("resumed") else "")
    out.append(records.Row("the study's wall time", took, "", "1 run"))
    return out


def bound_rows(study: dict) -> list[records.Row]:
    """The most the fastest configuration allows here: its median step were every operator of its
    traced step at its ceiling (the projection's share of the traced step), against PyTorch's
    defaults' median step. A bound, not a measurement: a goal above it needs other work, not tuning."""
    most = targets.ratio_bound(measured(study))
    if most is None:
        return []
    return [records.Row(f"the most {study.get('fastest', 'top')} could reach over PyTorch's defaults: its step with "
                        "every operator at its ceiling (a bound)", f"{most:.2f}x", "",
                        "its projection; the ratio of both arms' median steps, not paired")]


def measured(study: dict) -> targets.Measured:
    """What the targets read: the comparison, and the fastest configuration confirmed (the top, or
    the top under the allocator the trial kept): its rate per core, step, GFLOP/s and projection."""
    fastest = study.get("fastest", "top")
    whole = study["profiles"].get(fastest, {}).get("whole") or {}
    kept = (study.get("allocator") or {}).get("figures", {}).get("kept")
    mine, base = (kept if fastest != "top" else study["figures"].get("top")) or {}, study["figures"].get("defaults", {})
    return targets.Measured(study["comparison"], mine.get("per_core"), whole.get("speedup_bound"),
                            mine.get("achieved_gflops"), mine.get("step_s"), base.get("step_s"),
                            study["theoretical"].get(study["top"].dtype), fastest)


def target_findings(study: dict) -> list[Finding]:
    """The case study's targets at this preset and class count, each with its verdict on this CPU."""
    return targets.findings(study["preset"], study["classes"], targets.fast_path(study["bf16"]), measured(study))


def target_rows(found: list[Finding]) -> list[records.Row]:
    """Each target's verdict on this CPU, as a row."""
    words = {"met": "met", "not met": "not met", "no result": "not checked: no result",
             "too few rounds": "not checked: too few rounds"}
    rows = []
    for f in (f for f in found if f.kind == "target"):
        v = f.values
        want = (f"{v['value']:.2f} images/s per physical core" if v["figure"] == "per_core" else
                f"{v['value']:.1f}x over PyTorch's defaults" + (f", lower end {v['lower']:.1f}" if v["lower"] else ""))
        said, basis = words.get(v["status"], f"not checked here (this CPU: {v['here']})"), "the comparison"
        if v["bound"] is not None and v["status"] != "other path":  # another CPU's target: no bound said for it
            said += f"; at every ceiling {v['bound']:.2f}" + ("x" if v["figure"] == "ratio" else "")
            basis += " and its projection"
        rows.append(records.Row(f"target for {v['path_name']} CPUs: {want}", said, "", basis))
    return rows


def interval(c: dict) -> str:
    """A comparison's interval as the page gives it ("none" where it has none)."""
    return (f"{c.get('label', '95% CI')} {compare.interval_ends(c['ci_low'], c['ci_high'])}"
            if c.get("ci_low") is not None and c["ci_low"] == c["ci_low"] else "none")


def step_row(name: str, f: dict) -> records.Row:
    """An arm's median step and its phases."""
    return records.Row(f"{name}: step (forward with its loss / backward / optimizer)",
                       f"{f['step_s']:.1f} s ({f['forward_s']:.1f} / {f['backward_s']:.1f} / {f['optimizer_s']:.2f} s)",
                       "", f"{f.get('runs', 0)} runs (median)")


def kernel_rows(name: str, f: dict) -> list[records.Row]:
    """An arm's kernel share and page faults, where its worker read them."""
    if "system_share" not in f:
        return []
    return [records.Row(f"{name}: the OS kernel's share of CPU time (system time; page faults a step)",
                        f"{f['system_share']:.0%} ({f['page_faults_per_step']:,.0f})", "",
                        f"{f['runs']} runs (median)")]


def allocator_rows(kept: dict | None) -> list[records.Row]:
    """The allocator trial's figures: its ratio over the top, and the top's rates under it."""
    if not kept:
        return []
    if "skipped" in kept:
        return [records.Row(f"{kept_name(kept)} over the top, images/s", "not tried", "",
                            f"past the study's budget ({kept['skipped']['need_min']:.0f} min needed, "
                            f"{kept['skipped']['left_min']:.0f} left)")]
    c, name = kept["comparison"], kept_name(kept)
    rounds, f = f"{c.get('n', 0)} paired rounds", kept["figures"]["kept"]
    ratio = f"{c['ratio']:.2f}x" if c.get("ratio") is not None and c["ratio"] == c["ratio"] else "none"  # NaN: none
    out = [records.Row(f"{name} over the top, images/s", ratio, interval(c), rounds),
           records.Row(f"{name}: verdict", c["verdict"], "", rounds)]
    if f:
        out += [records.Row(f"{name}: images/s per physical core", f"{f['per_core']:.3f}", "",
                            f"{f['runs']} runs (median)"), step_row(name, f)]
    return out + kernel_rows(name, f)


def write_page(study: dict, folder: Path, facts) -> Path:
    """FOLDER/DAY-CPU-ISA-retinanet-full.md: the figures, each arm's phases, the findings in words."""
    found = study_findings(study)
    said, phases = study["comparison"].get("machine_sentence"), phase_lines(study["profiles"], timed_steps(study))
    notes = [f"PyTorch's defaults: {study['base'].label()}. The top: {study['source']}: {study['top'].label()}.",
             *([f"During the comparison's runs: {said}"] if said else []),
             *(["\n".join(phases)] if phases else []),
             *tried_lines(study.get("tried"), study["ceilings"]),
             *[f.sentence for f in found]]
    preset = study["preset"]
    if same_as_notebook_09(study):
        notes.append("The study measures again, in its own paired rounds and with its own steps, this store's "
                     "standard-preset ladder top against PyTorch's defaults: what notebook 09 compares for the "
                     "README's generated block where `make run` wrote both into one store. Two separate "
                     "measurements, each with its own interval; where the README's block names another top, it "
                     "came from another run's ladder (another store, or a later climb).")
    return records.write_record(folder, f"retinanet-{preset}", f"RetinaNet at the {preset} preset, {study['classes']} "
                                "classes", page_rows(study), page_command(preset, study["classes"],
                                                                         study.get("rounds", ROUNDS)),
                                notes=notes, facts=facts, preset=preset, figures=page_figures(study))


def page_figures(study: dict) -> list[tuple]:
    """The page's figure, where an arm was traced: each arm's step by phase, traced and at every ceiling."""
    if not any("phases" in p for p in study["profiles"].values()):
        return []
    from cpuopt_helpers import plots

    title = f"RetinaNet, {study['preset']} preset, {study['classes']} classes: where a step's time goes"
    return [("phases", "each arm's step by phase, traced and at every ceiling",
             plots.study_phases_figure(study["profiles"], title))]


def same_as_notebook_09(study: dict) -> bool:
    """The study compares what notebook 09 does: the stored ladder's top at the standard preset, at
    RetinaNet's own class count (the defaults name none)."""
    return (study["preset"] == "standard" and "classes" not in dict(study["base"].options)
            and study["source"].startswith(LADDER_SOURCE))


def page_command(preset: str, classes: int, rounds: int) -> str:
    """The line that writes the page again, naming what differs from the study's defaults."""
    if preset == "full" and classes == CLASSES:
        return "make case-study PRESET=full" + (f" ROUNDS={rounds}" if rounds != ROUNDS else "")
    args = [f"--preset {preset}"] + [f"--{k} {v}" for k, v, default in (("classes", classes, CLASSES),
                                                                         ("rounds", rounds, ROUNDS)) if v != default]
    return f"python -m cpuopt_helpers.fullstudy --page docs/results {' '.join(args)}"


def main(argv: list[str] | None = None) -> int:
    what = __doc__.split(" ``make")[0]  # the docstring's first sentences, without the make line
    ap = argparse.ArgumentParser(prog="python -m cpuopt_helpers.fullstudy", description=what)
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"paired rounds of the comparison (default {ROUNDS})")
    ap.add_argument("--classes", type=int, default=CLASSES, help=f"RetinaNet's classes (default {CLASSES})")
    ap.add_argument("--page", type=Path, default=None, help="write this machine's dated page into this folder")
    ap.add_argument("--resume", action="store_true", help="keep the rounds of an interrupted comparison")
    ap.add_argument("--budget-min", type=float, default=BUDGET_MIN, help="minutes the study may take: the allocator "
                    f"trial starts only where it fits (default {BUDGET_MIN:.0f})")
    ap.add_argument("--preset", default="full", choices=("quick", "standard", "full"),
                    help="full: the study (default); quick: the same in a minute or two, to try it")
    args = ap.parse_args(argv)
    from cpuopt_helpers.session import Session

    try:
        check(args.rounds, args.classes, args.budget_min)  # before the store is opened
        run_study(Session(), args.rounds, args.classes, args.page, args.resume, preset=args.preset,
                  budget_min=args.budget_min)
    except CpuoptError as exc:
        print(f"cpuopt: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
