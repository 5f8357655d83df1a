"""Stage 08, case study: RetinaNet as the paper trained it and the paper's fixes, and the
same fixes on any workload that declares them (``cpuopt_helpers.fixes``).
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from cpuopt_helpers import compare, fixes
from cpuopt_helpers.config import RunConfig, normalise, setting_label
from cpuopt_helpers.decisions import RECIPE, Choice, Finding, Plan, as_comparison
from cpuopt_helpers.stages import choosing
from cpuopt_helpers.stages.choosing import with_options
from cpuopt_helpers.system import Facts
from cpuopt_helpers.wording import medians_disagree
from cpuopt_helpers.workloads import declared_options

FIX_NAMES = {("frozen_bn", "separate"): "frozen batch norm", ("frozen_bn", "fused"): "fused FrozenBatchNorm2d",
             ("frozen_bn", "folded"): "FrozenBatchNorm2d folded into the conv",
             ("frozen_bn", "compiled"): "conv + frozen BN + ReLU compiled", ("focal", "fast"): "closed-form focal loss",
             ("loss", "fused"): "focal + box loss in one pass"}
COMPILED_REGION = ("frozen_bn", "compiled")  # measured only when asked: each run compiles (make case-study)
HOW_TO_DECLARE = {
    "frozen_bn": "frozen batch norm (fused, folded into the conv): the workload declares no frozen_bn option "
                 "(build(preset, frozen_bn=\"none\") applying cpuopt_helpers.fixes.frozen_batch_norm)",
    "focal": "the closed-form focal loss: the workload declares no focal option (build(preset, focal=\"reference\") "
             "taking its loss from cpuopt_helpers.fixes.focal_loss)",
    "loss": "the detection loss in one pass: the workload declares no loss option (RetinaNet's focal + smooth-L1 "
            "loss and their gradient from class labels, cpuopt_helpers.kernels.detection_loss)",
}


def configs(base: RunConfig, facts: Facts, compiled_region: bool = False) -> Plan:
    """Notebook 08's settings for the base's workload, and (``left_out``) what does not apply to it.

    The baseline has none of the fixes (the workload's option defaults, even where a fix was
    handed on earlier); then every fix the workload declares among its options
    (``cpuopt_helpers.fixes.OPTIONS``), each value alone, then the paper's fixes together.
    RetinaNet trains with Lamb as in the paper, so multi-tensor and fused Lamb are fixes there
    (and for any workload whose handed-on optimizer is Lamb). ``compiled_region`` adds conv +
    frozen BN + ReLU as compiled regions (``frozen_bn=compiled``), whose runs each compile."""
    base = normalise(base, facts.physical_cores).replace(options={})
    if base.workload == "retinanet":
        base = base.replace(optimizer="lamb")
    lamb = base.optimizer == "lamb"
    base = base.replace(optimizer_impl="default") if lamb else base
    declared = declared_options(base.workload)
    arms, together = {"baseline": base}, {}
    for name, (values, paper) in fixes.declared(declared).items():
        for value in values:
            if value not in (values[0], declared[name]) and (compiled_region or (name, value) != COMPILED_REGION):
                arms[FIX_NAMES[(name, value)]] = with_options(base, **{name: value})
        together[name] = paper
    if lamb:
        arms["multi-tensor Lamb"] = base.replace(optimizer_impl="foreach")
        arms["fused Lamb"] = base.replace(optimizer_impl="fused")
    if len(arms) > 2:
        arms["all fixes"] = with_options(base, **together).replace(optimizer_impl="fused" if lamb else
                                                                    base.optimizer_impl)
        if facts.bf16.get("accelerated"):  # the paper's recipe adapted to this CPU: the fixes in bf16 (make run's top)
            arms[RECIPE] = arms["all fixes"].replace(dtype="bf16", bf16_loss=False)
    missing = {name: f"{base.workload}: not measured: {HOW_TO_DECLARE[name]}." for name in fixes.OPTIONS
               if name not in declared}
    if not lamb:
        missing["lamb"] = (f"{base.workload}: not measured: multi-tensor and fused Lamb (it trains with {base.optimizer}; "
                           "notebook 05 compares its optimizer's foreach and fused implementations).")
    return Plan.of(arms, missing)


def measured(plans: dict[str, Plan], discrepancy: bool, trainable: bool = True) -> dict[str, Plan]:
    """What notebook 08 sweeps and shows, by name: each workload that declares a fix, its fixes
    beside its frozen-layers arms (measured, never candidates: ``choose`` takes its candidates
    from the workload's own plan; ``trainable=False`` leaves out the trainable_layers arms), and
    RetinaNet at 601 classes where ``discrepancy`` asks."""
    out = {w: Plan.of(p.named | frozen_layer_configs(p.base, trainable)) for w, p in plans.items() if len(p.arms) > 1}
    if "retinanet" in out and discrepancy:
        retina = plans["retinanet"].base
        out["retinanet, 601 classes"] = Plan.of({"baseline": retina,
                                                 "baseline, 601 classes": with_options(retina, classes=601)})
    return out


def table(results: list[dict], plan: Plan) -> pd.DataFrame:
    """``choosing.named_table``: every arm against the baseline, with its step time and loss drift."""
    return choosing.named_table(results, plan.named)


def choose(table: pd.DataFrame, plan: Plan, confirm=None) -> Choice:
    """The fastest of the fixes the plan holds (not the frozen-layers arms that ``measured`` adds
    beside them), confirmed against the baseline."""
    table = table.assign(setting=table["name"]) if len(table) else table
    return choosing.choose(table, f"{plan.workload} case study", confirm, stage="case-study fixes",
                           workload=plan.workload,
                           candidates=table[table["config_hash"].isin({c.config_hash() for c in plan.configs})]
                           if len(table) else None)


def findings(table: pd.DataFrame, plan: Plan, results: list[dict], name: str = "") -> list[Finding]:
    """A measured ladder's fixes against its baseline (``name``: the ladder's), and the step-time
    effects of its frozen-layers arms (each said once, as ``frozen_time_findings`` words it)."""
    from cpuopt_helpers.stages import summary

    frozen = {n: c for n, c in plan.named.items() if n in frozen_layer_configs(plan.base)}
    arms = [dataclasses.replace(f, stage="case_study")  # notebook 08's notes: 09's own do not replace them
            for f in summary.ladder_findings(table, name or plan.workload) if f.values.get("name") not in frozen]
    if {RECIPE, "all fixes"} <= set(plan.named):  # where the recipe's gain comes from: bf16 over the fixes in fp32
        fixes_fp32, recipe = plan.named["all fixes"], plan.named[RECIPE]
        if fixes_fp32.dtype != recipe.dtype:
            arms.append(_note(plan.workload, "bf16 in the recipe", choosing.paired(
                results, fixes_fp32.config_hash(), recipe.config_hash()), dtype=recipe.dtype))
    return arms + frozen_time_findings(results, plan.base, frozen)


def conv_counts(exec_df: pd.DataFrame, steps: int) -> dict:
    """Convolutions per training step in a oneDNN log, by propagation kind."""
    convs = exec_df[exec_df["kind"] == "convolution"]
    counts = convs.groupby("prop").size() / steps
    ms = convs.groupby("prop")["time_ms"].sum() / steps
    return {f"{p}_convs": float(counts.get(p, 0)) for p in ("forward_training", "backward_data", "backward_weights")} | \
        {f"{p}_ms": float(ms.get(p, 0)) for p in ("backward_data", "backward_weights")}


def _note(workload: str, kind: str, comparison=None, **values) -> Finding:
    return Finding(workload, "case_study", kind, values, as_comparison(comparison))


def _kernel_comparison(ratio, low, high, n, verdict) -> dict:
    """A benchmark's paired calls as the comparison rule's result."""
    def number(x) -> float | None:
        return float(x) if x is not None else None

    return {"ratio": number(ratio), "ci_low": number(low), "ci_high": number(high), "n": int(n or 0),
            "verdict": verdict, "margin": compare.MARGIN, "min_rounds": compare.MIN_ROUNDS, "label": "95% CI"}


def frozen_layers_findings(table: pd.DataFrame, workload: str = "") -> list[Finding]:
    """What freezing backbone stages removes from the backward pass, from the logs."""
    if len(table) < 2:
        return [_note(workload, "frozen layers unlogged")]
    lo, hi = table.iloc[0], table.iloc[-1]
    return [_note(workload, "frozen layers convolutions",
                  trainable_layers=[int(hi.trainable_layers), int(lo.trainable_layers)],
                  backward_weights_convs=[float(hi.backward_weights_convs), float(lo.backward_weights_convs)],
                  backward_data_convs=[float(hi.backward_data_convs), float(lo.backward_data_convs)],
                  onednn_ms=[float(hi.backward_weights_ms + hi.backward_data_ms),
                             float(lo.backward_weights_ms + lo.backward_data_ms)])]


def focal_findings(bench: dict, phase_backward_ms: dict) -> list[Finding]:
    """The kernel's speedups at each shape, and the reference loss's share of the measured backward."""
    rows = pd.DataFrame(bench["rows"])
    found = []
    for shape, g in rows[rows["part"] == "both"].groupby("shape", sort=False):
        best = g[g["kernel"] != "reference"].sort_values("speedup", ascending=False).iloc[0]
        ratio = _kernel_comparison(best.speedup, best.speedup_low, best.speedup_high,
                                   best.get("rounds", bench.get("rounds", 0)), best.get("verdict", "no different"))
        found.append(_note("retinanet", "focal kernel", ratio, shape=shape, elements=int(best.elements),
                           kernel=best.kernel))
    found += [_note("retinanet", "kernel fell back", benchmark="focal-loss", **f) for f in bench.get("fallbacks", [])]
    ref = rows[(rows["kernel"] == "reference") & (rows["part"] == "backward")]
    for shape, backward_ms in phase_backward_ms.items():
        hit = ref[ref["shape"] == shape]
        if len(hit) and backward_ms:
            found.append(_note("retinanet", "focal backward share", shape=shape,
                               reference_ms=float(hit.iloc[0].median_ms), backward_ms=float(backward_ms)))
    return found


FOCAL_BYTES_PER_LOGIT = 5  # element sizes at least: logits and targets read forward and backward, gradient written


def focal_limit_findings(bench: dict, copy_gbs: float) -> list[Finding]:
    """The fastest focal-loss kernel against its physical limit: the bytes forward + backward
    must move at the least, over the measured copy bandwidth (notebook 00's roofline)."""
    rows = pd.DataFrame(bench["rows"])
    size = 2 if bench.get("dtype") == "bf16" else 4
    found = []
    for shape, g in rows[rows["part"] == "both"].groupby("shape", sort=False):
        best = g.sort_values("median_ms").iloc[0]
        limit_ms = FOCAL_BYTES_PER_LOGIT * size * best.elements / (copy_gbs * 1e9) * 1e3
        found.append(_note("retinanet", "focal limit", shape=shape, kernel=best.kernel,
                           median_ms=float(best.median_ms), bytes_per_logit=FOCAL_BYTES_PER_LOGIT, element_bytes=size,
                           copy_gbs=float(copy_gbs), limit_ms=float(limit_ms),
                           within=bool(best.median_ms <= 2 * limit_ms)))
    return found


def lamb_findings(bench: list[dict]) -> list[Finding]:
    """Each Lamb kernel against the per-tensor loop on RetinaNet's trainable parameters (or why it did not run);
    another runtime's (IPEX's, against its own loop) with this runtime's loop and fastest kernel beside it."""
    found, here = [], None
    for r in bench:
        if "kernels" not in r:
            found.append(_note("retinanet", "lamb not run", reason=r.get("skipped") or r.get("error")))
            continue
        found += [_note("retinanet", "kernel fell back", benchmark="Lamb", **f) for f in r.get("fallbacks", [])]
        beside = {}
        if here is None:  # the first: this runtime's
            here = r
        else:
            fastest = min(here["kernels"].items(), key=lambda kv: kv[1]["median_ms"])
            beside = {"here": {"torch": here["torch"], "loop_ms": here["kernels"]["loop"]["median_ms"],
                               "kernel": fastest[0], "median_ms": fastest[1]["median_ms"]}}
        for k, v in r["kernels"].items():
            if k != "loop":
                ratio = _kernel_comparison(v["speedup_vs_loop"], v["ci"][0], v["ci"][1], v.get("rounds", 0),
                                           v.get("verdict", "no different"))
                found.append(_note("retinanet", "lamb kernel", ratio, preset=r["preset"], elements=r["elements"],
                                   torch=r["torch"], kernel=k, median_ms=v["median_ms"],
                                   loop_ms=r["kernels"]["loop"]["median_ms"], **beside))
    return found


UNFIXED = "frozen stages' backward computed (the paper's unfixed build)"


def frozen_layer_configs(base: RunConfig, trainable: bool = True) -> dict[str, RunConfig]:
    """The frozen-layers fix as the paper measured it, for a workload that declares the options:
    the backward of frozen stages computed (emulated unfixed build) and, with ``trainable``, other
    trainable_layers. Measured beside the fixes, never candidates for the hand-on (they change what
    trains)."""
    declared, out = declared_options(base.workload), {}
    if "frozen_backward" in declared:
        out[UNFIXED] = with_options(base, frozen_backward="compute")
    if trainable and "trainable_layers" in declared:
        out |= {f"trainable_layers {n}": with_options(base, trainable_layers=n) for n in (0, 5)
                if n != declared["trainable_layers"]}
    return out


def frozen_time_findings(results: list[dict], base: RunConfig, arms: dict[str, RunConfig]) -> list[Finding]:
    """Step-time effects of the frozen layers: the fix (skip over compute) and trainable_layers."""
    found = []
    if UNFIXED in arms:
        found.append(_note(base.workload, "frozen backward skipped",
                           choosing.paired(results, arms[UNFIXED].config_hash(), base.config_hash())))
    for name, config in arms.items():
        if "trainable_layers" in dict(config.options):
            found.append(_note(base.workload, "trainable layers",
                               choosing.paired(results, base.config_hash(), config.config_hash()), name=name,
                               default=declared_options(base.workload)["trainable_layers"]))
    return found


def frozen_layers(session, plans: dict[str, Plan], layers: list[int], log_dir, preset: str) -> tuple[dict, list[str]]:
    """For every workload that declares ``trainable_layers``: a 2-step run logged at each count of
    trainable backbone stages, its step time and its convolutions by direction (the paper: the
    frozen stages' backward); the tables, and a line for each run that failed."""
    import pandas as pd

    from cpuopt_helpers.profiledn import parse_log

    tables, failed = {}, []
    for workload in [w for w in plans if "trainable_layers" in declared_options(w)]:
        rows = []
        for count in layers:
            path = str(log_dir / f"08_{workload.replace(':', '_')}_{preset}_tl{count}.log")
            config = with_options(plans[workload].base, trainable_layers=count).replace(steps=2, onednn_verbose=path)
            r = session.run(config)
            if r["status"] != "ok":
                failed.append(f"FAILED {r['label']} {r['reason'][:300]}")
                continue
            rows.append({"trainable_layers": count, "step_ms": r["step_ms"]["median"],
                         **conv_counts(parse_log(path).exec, config.steps)})
        tables[workload] = pd.DataFrame(rows)
    return tables, failed


def profile_specs(ladders: dict[str, Plan], climbs: dict) -> dict[str, RunConfig]:
    """What notebook 08 profiles: RetinaNet before, after (the climb's top, else all fixes, named so: the
    recipe that may be handed on adds bf16) and at 601 classes where that ladder was measured."""
    retina = ladders["retinanet"].named
    climbed = "retinanet" in climbs
    after = climbs["retinanet"]["top"] if climbed else retina["all fixes"]
    specs = {"retinanet before": retina["baseline"],
             "retinanet after (the climb's top)" if climbed else f"retinanet after (all fixes, {after.dtype})": after}
    if "retinanet, 601 classes" in ladders:
        specs["retinanet 601 classes"] = ladders["retinanet, 601 classes"].named["baseline, 601 classes"]
    return specs


def profile_case_study(session, configs: dict[str, RunConfig], log_dir, repeats: int, tags: tuple[str, ...]):
    """ProfileDNN on the case study: each configuration's oneDNN log, breakdown and projection, and a
    torch.profiler trace of its real step (the loss's share of backward: trace.loss_backward)
    (its plain step time reused from a stored run under one of ``tags`` where there is one),
    and the comparisons of the first with each other one."""
    from cpuopt_helpers.profiledn import capture
    from cpuopt_helpers.stages import profiling

    profiles = []
    for label, config in configs.items():
        plain = next((r for r in (session.stored_run(config, t) for t in tags) if r), None)
        profiles.append(profiling.profile_workload(session, config, log_dir, label=label, repeats=repeats,
                                                 tag="08_case_study/profile", plain=plain, trace=True))
    first, labels = profiles[0], list(configs)
    comparisons = [capture.Comparison(first, p, (labels[0], label)) for label, p in zip(labels[1:], profiles[1:])]
    return profiles, [c for c in comparisons if c.ok]


# ProfileDNN's findings that say why the fixes paid or not; the rest (the replay, the spans, the directions, the
# distinct primitives) follow them as details, worded as in notebook 02, which explains each
PROFILE_WHY = frozenset({"profile failed", "profile coverage", "profile logged faster", "profile outside onednn",
                         "log total", "log reorders", "trace top operators", "trace loss", "profile comparison",
                         "profile comparison note", "logs onednn time", "logs share moved",
                         "logs heaviest implementation"})


def answer_sections(fixes: list[Finding], kernels: list[Finding], profile: list[Finding]) -> list[tuple[str, list]]:
    """Notebook 08's answer in the order its question asks: the fixes, the kernels alone, why from
    the profiles (the before-and-after comparison first), then the profiles' details. Empty
    sections are left out; every finding is in one section."""
    pair = lambda f: f.kind.startswith(("profile comparison", "logs "))  # noqa: E731  (the two logs compared)
    why = [f for f in profile if f.kind in PROFILE_WHY and pair(f)] + [
        f for f in profile if f.kind in PROFILE_WHY and not pair(f)]
    details = [f for f in profile if f.kind not in PROFILE_WHY]
    sections = [("The fixes, each alone and all together:", fixes),
                ("The kernels alone, at RetinaNet's shapes:", kernels),
                ("Why, from ProfileDNN (the logs and traces of the profiled runs):", why),
                ("ProfileDNN's details (notebook 02 explains each):", details)]
    return [(heading, found) for heading, found in sections if found]


# The paper's numbers (arXiv 2206.10034, RetinaNet-ResNeXt50 on Xeon with IPEX), as ratios.
PAPER = {"focal loss forward": 2.6, "focal loss backward": 1.3, "fused FrozenBatchNorm2d": 1.298,
         "FrozenBatchNorm2d folded into the conv": None, "frozen layers (backward skipped)": 1.16,
         "conv + frozen BN + ReLU fused": 1.30, "fused Lamb": 5.5, "overall": 2.0}


def _kernel_row(bench: dict | None, part: str, shape: str) -> tuple[dict | None, str]:
    if not bench:
        return None, "the kernel benchmark did not run (RetinaNet not among the workloads)"
    rows = pd.DataFrame(bench["rows"])
    g = rows[(rows["part"] == part) & (rows["shape"] == shape) & (rows["kernel"] != "reference")]
    if g.empty:
        return None, f"no {part} timing at {shape}"
    best = g.sort_values("speedup", ascending=False).iloc[0]
    ref = rows[(rows["part"] == part) & (rows["shape"] == shape) & (rows["kernel"] == "reference")].iloc[0]
    c = _kernel_comparison(best.speedup, best.speedup_low, best.speedup_high,
                           best.get("rounds", bench.get("rounds", 0)), best.get("verdict", "no different"))
    return c, (f"{best.kernel}: {best.median_ms:.2f} ms against the reference's {ref.median_ms:.2f} ms at "
               f"{int(best.elements):,} logits (medians){medians_disagree(ref.median_ms / best.median_ms, c)}")


def frozen_logged(frozen: pd.DataFrame | None) -> str:
    """'; the logs: ...': what freezing the backbone removes from the backward, read from ``frozen_layers``' logs
    (whatever one screened round's step times say); '' without two of them."""
    if frozen is None or len(frozen) < 2:
        return ""
    lo, hi = frozen.iloc[0], frozen.iloc[-1]
    ms = [float(r.backward_weights_ms + r.backward_data_ms) for r in (hi, lo)]
    return (f"; the logs: backward convolutions' oneDNN time {ms[0]:.0f} ms a step with {int(hi.trainable_layers)} "
            f"stages trainable, {ms[1]:.0f} ms with {int(lo.trainable_layers)}")


def frozen_bn_alone(bench: dict | None, fix: str, step_ms: float | None) -> str:
    """'; the N frozen batch norms alone ...': what ``kernels.benchmark frozen-bn`` timed, and the
    most the fix can save of the baseline's mean step: ``fused`` the multiply + add's time less one
    batch-norm call's, ``folded`` all of the multiply + add's (it adds the weights' scaling); ''
    where the benchmark did not run."""
    if not bench or not bench.get("rows"):
        return ""
    rows = {r["kernel"]: r for r in bench["rows"] if r["part"] == "both"}
    separate, fused = rows["separate"]["median_ms"], rows["fused"]["median_ms"]
    alone = (f"; the {bench['layers']} frozen batch norms alone ({bench['dtype']}, {bench['rounds']} interleaved "
             "rounds): ")
    saves = separate - fused if fix == "fused" else separate
    if fix == "fused":
        r = rows["fused"]
        c = _kernel_comparison(r["speedup"], r["speedup_low"], r["speedup_high"], r["rounds"], r["verdict"])
        alone += (f"{separate:.1f} ms a step as multiply + add, {fused:.1f} ms as one call (medians); paired round "
                  f"by round: {compare.describe(c)}{medians_disagree(separate / fused, c)}")
    else:
        alone += f"{separate:.1f} ms a step as multiply + add, which folding removes (it scales the weights instead)"
    if saves <= 0:
        return alone + "; fusing them saves nothing of the step"
    if not step_ms or saves >= step_ms:
        return alone
    return alone + f"; at most {saves:.0f} ms of the {step_ms:.0f} ms step: {step_ms / (step_ms - saves):.2f}x at most"


# The ladder's arm each whole-step row of the paper table screened against the baseline (the overall row's
# depends on the run: see paper_table)
PAPER_ARMS = {"fused FrozenBatchNorm2d": "fused FrozenBatchNorm2d",
              "FrozenBatchNorm2d folded into the conv": "FrozenBatchNorm2d folded into the conv",
              "frozen layers (backward skipped)": UNFIXED,
              "conv + frozen BN + ReLU fused": "conv + frozen BN + ReLU compiled"}


def _lamb_row(lamb_bench: list | None, copy_gbs: float | None) -> tuple[dict | None, str]:
    """The paper table's fused Lamb row: the first runtime's fused kernel against its per-tensor loop."""
    lamb = next((r for r in (lamb_bench or []) if "kernels" in r and "fused" in r["kernels"]), None)
    if not lamb:
        return None, "the Lamb benchmark did not run"
    k = lamb["kernels"]["fused"]
    moved_gb = 7 * 4 * lamb["elements"] / 1e9  # p, g, m, v read; p, m, v written, fp32
    return (_kernel_comparison(k["speedup_vs_loop"], k["ci"][0], k["ci"][1], k.get("rounds", 0),
                               k.get("verdict", "no different")),
            f"{k['median_ms']:.0f} ms against the loop's {lamb['kernels']['loop']['median_ms']:.0f} ms; "
            f"at least {moved_gb:.2f} GB move, {moved_gb / k['median_ms'] * 1e3:.1f} GB/s"
            + (f" of the {copy_gbs:.1f} GB/s copy bandwidth" if copy_gbs else ""))


def paper_table(results: list[dict], arms: dict[str, RunConfig], focal_bench: dict | None, lamb_bench: list | None,
                climb: dict | None, copy_gbs: float | None, preset: str, frozen: pd.DataFrame | None = None,
                bn_bench: dict | None = None) -> pd.DataFrame:
    """Each of the paper's numbers beside this machine's, with the interval and a reason from the data,
    and the ladder's arm each whole-step row screened (``arm``; None for a kernel timed alone) of which
    workload (``workload``).
    ``frozen``: ``frozen_layers``' table, whose logs give the frozen stages' backward directly (the
    screened step times alone are one round's); ``bn_bench``: the frozen batch norms timed alone
    (``kernels.benchmark frozen-bn``), the most their fixes can save of the step."""
    base = arms["baseline"]

    def arm(name: str, inverse: bool = False, fix: str = "") -> tuple[dict | None, str]:
        if name not in arms:
            return None, "not measured for this workload"
        a, b = (arms[name], base) if inverse else (base, arms[name])
        c = choosing.paired(results, a.config_hash(), b.config_hash())
        steps = choosing.paired_steps(results, a.config_hash(), b.config_hash())
        why = f"mean step {steps[0]:.0f} ms -> {steps[1]:.0f} ms" if steps else "no step time"
        return c, why + (frozen_bn_alone(bn_bench, fix, steps[0] if steps else None) if fix else "")

    rows = {}
    shape = f"{preset} 80 classes"
    rows["focal loss forward"] = _kernel_row(focal_bench, "forward", shape)
    rows["focal loss backward"] = _kernel_row(focal_bench, "backward", shape)
    rows["fused FrozenBatchNorm2d"] = arm("fused FrozenBatchNorm2d", fix="fused")
    rows["FrozenBatchNorm2d folded into the conv"] = arm("FrozenBatchNorm2d folded into the conv", fix="folded")
    c, why = arm(UNFIXED, inverse=True)
    unfixed = f"computing the frozen stages' backward: {why.replace('->', 'against')}" if c else why
    rows["frozen layers (backward skipped)"] = (c, unfixed + frozen_logged(frozen))
    if "conv + frozen BN + ReLU compiled" in arms:
        c, why = arm("conv + frozen BN + ReLU compiled")
        rows["conv + frozen BN + ReLU fused"] = (c, f"folded, each bottleneck one compiled region (Inductor fuses the "
                                                    f"bias, ReLU and residual add after oneDNN's conv): {why}")
    else:
        rows["conv + frozen BN + ReLU fused"] = (None, "not measured in this run (COMPILED_REGION = False: each of its "
                                                       "runs compiles); `make case-study` measures it")
    rows["fused Lamb"] = _lamb_row(lamb_bench, copy_gbs)
    if climb and climb.get("end_to_end"):
        kept = [r["rung"] for r in climb["rungs"] if r["handed_on"]]
        rows["overall"] = (climb["end_to_end"], f"the climb's confirmed rungs: {', '.join(kept) or 'none'}")
    elif RECIPE in arms:  # the paper's 2x is its fixes in bf16: the recipe, which notebook 09 confirms
        c, why = arm(RECIPE)
        rows["overall"] = (c, f"{RECIPE} (the fixes in bf16) as one block; notebook 09 confirms it against "
                              f"PyTorch's defaults in fresh paired rounds: {why}")
    else:
        c, why = arm("all fixes")
        rows["overall"] = (c, f"the fixes together only (make case-study climbs every rung): {why}")
    sources = PAPER_ARMS | {"overall": None if climb and climb.get("end_to_end") else RECIPE if RECIPE in arms
                            else "all fixes"}
    return pd.DataFrame([{"fix": name, "paper": PAPER[name], "here": c["ratio"] if c and c.get("n") else None,
                          "measured as": "the kernel alone" if name in KERNEL_ROWS else "the whole training step",
                          "here, worded": compare.describe(c) if c else "not measured", "why": why,
                          "arm": sources.get(name) if c and sources.get(name) in arms else None,
                          "workload": base.workload}
                         for name, (c, why) in rows.items()])


KERNEL_ROWS = {"focal loss forward", "focal loss backward", "fused Lamb"}  # timed alone, in one process


def paper_view(table: pd.DataFrame) -> pd.DataFrame:
    """The paper table as notebook 08 shows it: a ratio the paper does not give, or this run did
    not measure, said in words rather than NaN."""
    shown = table.drop(columns=["arm", "workload"], errors="ignore")  # the arm each row screened: for the page
    return choosing.in_words(shown, {"paper": "no number in the paper", "here": "not measured"}, digits=2)


def climbed_fact(ladder: str, preset: str) -> str:
    """The store's mark of a ladder that a climb made (``make case-study``): a later run keeps it."""
    return f"climbed/{ladder}/{preset}"


def recipe(plan: Plan) -> str | None:
    """The plan's arm that is the paper's recipe adapted to this CPU: every fix the workload declares
    together (``configs``: in bf16 where the gate finds a fast path); None: it declares none.
    torch.compile is left to ``make case-study``, whose climb weighs its compile time."""
    return RECIPE if RECIPE in plan.named else "all fixes" if "all fixes" in plan.named else None


def recipe_unfit(table: pd.DataFrame, plan: Plan, name: str) -> str | None:
    """Why the recipe's arm in notebook 08's sweep cannot be handed on (None: it can): it produced
    no result, ran something else (a fallback), or its loss drifted from the baseline's."""
    row = plan.row(table, name)
    if row.empty or not row.iloc[0]["runs"]:
        return "it produced no result in the sweep above"
    if row.iloc[0].get("fell_back"):
        return "it fell back to another kernel in the sweep above"
    drift = row.iloc[0].get("loss_drift")
    if drift is not None and drift == drift and drift > choosing.LOSS_TOLERANCE:
        return f"its loss drifted {drift:.0%} from the baseline's in the sweep above"
    return None


def hand_on_recipe(session, plan: Plan, table: pd.DataFrame) -> str:
    """RetinaNet's ladder in ``make run``: PyTorch's defaults, then the paper's recipe adapted to
    this CPU, named as such and handed on without a confirmation of its own where its arm of the
    sweep ran as asked with the baseline's loss: notebook 09's headline, the top against the
    defaults in fresh rounds, is its one confirmation."""
    name = recipe(plan)
    if name is None:
        return f"{plan.workload}: it declares none of the fixes; nothing to hand on."
    unfit = recipe_unfit(table, plan, name)
    if unfit:
        return f"{plan.workload}: {RECIPE} ({name}) is not handed on: {unfit}; PyTorch's defaults stay its top."
    top = plan.named[name]
    words = (f"{plan.workload}: {RECIPE} adapted to this CPU ({setting_label(top.to_dict(), plan.base.to_dict())}; "
             f"bf16 {'on: this CPU has a fast path' if top.dtype == 'bf16' else 'off: no fast path here'}; "
             "torch.compile left to make case-study) is the top of its ladder, handed on as one block (its fixes are "
             "not confirmed one by one: `make case-study` climbs them); notebook 09 confirms it against PyTorch's "
             "defaults in fresh rounds.")
    session.hand_on(top, RECIPE, {"workload": plan.workload, "sentence": words, "recipe": True},
                    stage="case-study fixes")
    return words


def settle_fixes(session, plans: dict[str, Plan], tables: dict, climbs: dict, preset: str, min_rounds: int,
                 max_rounds: int, budget_min: float | None, resume: bool = True, recipe: bool = False) -> list[str]:
    """Notebook 08's hand-on, per workload: the fastest of the fixes it declares, confirmed against
    its baseline (``Session.settle``). RetinaNet's ladder starts here (no earlier notebook
    measures it) unless a climb made it: the one above, or one stored by an earlier ``make
    case-study``, which this run never overwrites. With ``recipe`` (the standard preset) its top
    is the paper's recipe instead (``hand_on_recipe``). Returns the sentences, in order."""
    lines = []
    for workload, plan in plans.items():
        stored = session.store.get_fact(session.machine, climbed_fact(workload, preset))
        if workload in climbs or stored:
            lines.append(f"{workload}: its ladder is the climb above." if workload in climbs else
                         f"{workload}: its ladder is the climb `make case-study` stored on {stored['day']}; this run "
                         "leaves it as it is (notebook 09's headline is the climb's own comparison of its top with "
                         "PyTorch's defaults, in the climb's fresh paired rounds, not measured again).")
            continue
        if workload == "retinanet":  # its ladder starts here (an earlier run's, not a climb's, is replaced)
            session.reset_ladder(workload, preset)
            session.hand_on(plan.base, "baseline", {"workload": workload})
            if recipe:
                lines.append(hand_on_recipe(session, plan, tables.get(workload, pd.DataFrame())))
                continue
        if workload not in tables:
            lines.append(f"{workload}: it declares none of the fixes; nothing to hand on.")
            continue
        choice = session.settle("case_study", tables[workload], plan, min_rounds, max_rounds, budget_min, resume)
        lines.append(choice.sentence)
    return lines
