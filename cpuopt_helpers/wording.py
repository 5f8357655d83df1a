"""Findings in words: the one place a decision's record becomes a sentence.

``render(finding)`` looks up the finding's ``kind`` in ``TEMPLATES`` (kind -> function of the
finding's values, its workload among them, and its comparison). Notebooks, the ladder and the
README print what this module writes, so prose and numbers never diverge; tests check the
records instead. The entries are grouped by the stage that makes them: first the decisions
(``choose``), then each stage's descriptive findings (``*_findings``).
"""

from __future__ import annotations

import math
from typing import Callable

from cpuopt_helpers import compare

BAD_INPUT = "bad input: "  # how a run's reason starts when its worker refused its input


def refusal(reason: str | None) -> str | None:
    """What a failed run's worker refused (a workload that is not one, an IPEX that does not match
    this torch), in one line, from the run's reason; None where it failed otherwise."""
    reason = reason or ""
    return reason[len(BAD_INPUT):].split("; stderr tail")[0] if reason.startswith(BAD_INPUT) else None


def reason_line(reason: str | None) -> str:
    """A failed run's reason in one line: what its worker refused, else the reason's first line and,
    where a stderr tail follows, the tail's last line (the exception that ended the run)."""
    refused = refusal(reason)
    if refused:
        return refused
    lines = [line.strip() for line in (reason or "").splitlines() if line.strip()]
    return " | ".join(lines[:1] + lines[-1:] if len(lines) > 1 and "stderr tail" in lines[0] else lines[:1])


def duration_words(seconds: float) -> str:
    """``1 h 2 min 5 s``, ``31 min 5 s``, ``42 s``: whole seconds."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours} h"] * bool(hours) + [f"{minutes} min"] * bool(hours or minutes) + [f"{secs} s"]
    return " ".join(parts)


def medians_disagree(ratio: float, comparison) -> str:
    """A clause where the ratio of two arms' medians lies outside the paired rounds' interval: the
    rounds' ratios spread so that the two statistics tell different stories (an outlying round or a
    drift), which the reader should know before acting on either; "" where they agree."""
    c = comparison if isinstance(comparison, dict) or comparison is None else comparison.to_dict()
    low, high = (c or {}).get("ci_low", math.nan), (c or {}).get("ci_high", math.nan)
    if not (math.isfinite(low) and math.isfinite(high) and math.isfinite(ratio)) or low <= ratio <= high:
        return ""
    return (f"; but the medians' ratio, {ratio:.2f}x, lies outside that interval: the rounds disagree (one or two "
            "outlying rounds, or a drift), so neither figure is safe to act on; measure it again")


def _after_ipex(c) -> str:
    """What notebook 05's last comparison means for the ladder: IPEX is never handed on here (it is
    archived and needs torch 2.8), so the verdict says what that costs, if anything."""
    verdict = c.verdict if c is not None else None
    if verdict in ("faster", "equivalent"):
        return (". So this torch does without IPEX at no cost: the ladder goes on in it (IPEX is archived and needs "
                "torch 2.8).")
    if verdict == "slower":
        return (". So IPEX is faster here: the ladder still goes on in this torch (IPEX is archived and needs torch "
                "2.8), at that cost; `cpuopt compare --a '--runtime ipex --ipex' --b ''` measures it for your model.")
    return ". Not decided; the ladder goes on in this torch (IPEX is archived and needs torch 2.8)."


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
    for setting in v.get("fell_back") or []:
        out += f" {setting} is no candidate: it did not run what it was asked to."
    return out


def _screened(v: dict) -> str:
    grew = v.get("rss_growth")
    return (f"{v['setting']} screened best at {v['ratio']:.2f}x {v.get('incumbent', 'the baseline')} over "
            f"{v['runs']} round(s)" + (f", with {grew:.0%} more peak memory" if grew is not None else ""))


def _confirmed(v: dict, c) -> str:
    inc = v.get("incumbent", "the baseline")
    head = f"{v['what']}: {_screened(v)}; confirmed in fresh rounds: {c.describe()}"
    return head + _handed_on(c, f"{inc} is kept") + _excluded(v)


def _handed_on(c, kept: str) -> str:
    """': handed on.' for a confirmed gain worth a change, else why the incumbent stays."""
    if c.pays:
        return ": handed on."
    if c.faster:
        return f", but by less than the {c.min_gain:.0%} worth a change; {kept}."
    return f"; {kept}."


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


def _who(v: dict) -> str:
    """"cnn: " where the finding names its workload (a sentence that reads without one too)."""
    return f"{v['workload']}: " if v.get("workload") else ""


def _baseline(v: dict, c) -> str:
    if v.get("gflops") is None:
        work = "GFLOP/s unknown (its FLOPs could not be counted)"
    else:
        share = (f", {v['gflops'] / v['peak_gflops']:.0%} of the measured fp32 GEMM ceiling" if v.get("peak_gflops")
                 else "")
        if v.get("theoretical_gflops"):
            share += f" and {v['gflops'] / v['theoretical_gflops']:.0%} of the theoretical fp32 peak"
        elif share:
            share += " (the theoretical fp32 peak is unknown here: `cpuopt doctor`)"
        work = f"{v['gflops']:.1f} GFLOP/s achieved{share}"
    runs = f"{v['runs']} run{'s' * (v['runs'] != 1)}{_run_shape(v)}"
    return (f"{v['workload']}: {v['samples_per_s']:.1f} samples/s (median of {runs}, range {v['low']:.1f}-"
            f"{v['high']:.1f}); {v['phase']} takes {v['phase_share']:.0%} of a {_ms(v['step_ms'])} step; {work}.")


def _run_shape(v: dict) -> str:
    """', each 6 timed steps of batch 32 after up to 3 warm-up steps': what one run timed, where it is known."""
    if not v.get("timed_steps"):
        return ""
    batch = f" of batch {v['batch']}" if v.get("batch") else ""
    warm = (f" after up to {v['warmup_steps']} warm-up step{'s' * (v['warmup_steps'] != 1)} (until step times "
            "settled)" if v.get("warmup_steps") else "")
    return f", each {v['timed_steps']} timed step{'s' * (v['timed_steps'] != 1)}{batch}{warm}"


def _epochs(v: dict, c) -> str:
    if v["epochs"] is not None:  # the first epoch at the target; a later one may fall below it again
        final = f", final {v['final_accuracy']:.1%}" if v.get("final_accuracy") is not None else ""
        return (f"digits model, global batch {v['global_batch']}: {v['epochs']} epochs to {v['target']:.0%} test "
                f"accuracy (first reached{final}; one seed)")
    return (f"digits model, global batch {v['global_batch']}: did not reach {v['target']:.0%} (final "
            f"{v['final_accuracy']:.1%}; one seed)")


def _allocator_handed_on(v: dict, c) -> str:
    """Which allocator notebook 04 hands on, in words: the C library's is named, and why it stays."""
    who = ", ".join(v["workloads"])
    if v["allocator"] == "default":
        return (f"{who}: the C library's allocator (glibc's malloc, nothing preloaded) stays: no other was confirmed "
                "faster in fresh paired rounds.")
    if v["allocator"] == "none":
        return f"{who}: nothing is handed on (no configuration finished)."
    return (f"{who}: {v['allocator']} is handed on, confirmed faster than the allocator before it in fresh paired "
            "rounds.")


def _profile_coverage(v: dict, c) -> str:
    """The oneDNN share of the logged run's step, with both steps named: the logged one it is a share of, and
    the plain one (notebook 01's run) the efficiency ratio divides by. A finding stored before the logged
    step was kept names the plain step alone."""
    ratio = f"; efficiency ratio {v['efficiency']:.0%}" if v["efficiency"] is not None else ""
    if v.get("logged_step_ms") is None:
        return (f"{v['workload']}: oneDNN primitives account for {v['coverage']:.0%} of the logged run's steps "
                f"({v['calls_per_step']:.0f} calls per {_ms(v['step_ms'])} step){ratio}.")
    return (f"{v['workload']}: oneDNN primitives take {v['coverage']:.0%} of the logged run's step "
            f"({_ms(v['logged_ms'])} of {_ms(v['logged_step_ms'])}, {v['calls_per_step']:.0f} calls); without the "
            f"log the step took {_ms(v['step_ms'])}{ratio} (over that step).")


def _best_layout(v: dict, c) -> str:
    """The best multi-rank layout against one rank on the fewest threads (the paper's normalisation) and, where
    measured, against one process on the same cores: the run it would replace (a screen, one set of runs)."""
    said = (f"{v['workload']}, {v['mode']}: best multi-rank layout {v['ranks']} ranks x {v['threads']} "
            f"thread{'s' if v['threads'] != 1 else ''} at {v['samples_per_s']:.1f} samples/s = {v['normalised']:.2f}x "
            f"one rank on {_base_threads(v)} thread{'s' if _base_threads(v) != 1 else ''}{_base_rate(v)} "
            f"(ideal {v['ideal']:.0f}x, efficiency {v['efficiency']:.0%})")
    alone = v.get("one_process_samples_per_s")
    if alone:
        what = ("independent copies train separate models: more trials at once, not one training run sooner"
                if v["mode"] == "independent" else "one model trained by all ranks")
        said += (f"; {v['samples_per_s'] / alone:.2f}x one process on all {v['ranks'] * v['threads']} threads "
                 f"({alone:.1f} samples/s; {what})")
    runs = v.get("runs")  # a finding stored before its runs were kept says nothing of them
    return said + (f" (screened only, {runs} run{'s' * (runs != 1)} of each layout: no verdict)." if runs else ".")


def _larger_batch(v: dict, c) -> str:
    """Epochs to the target at two global batches. An epoch of the larger one takes ``factor``x fewer optimizer
    steps, the learning rate is the same for both and each ran once: a count, not advice."""
    small, large, factor = v["small_epochs"], v["large_epochs"], v["factor"]
    trend = "more" if large > small else "fewer" if large < small else "as many"
    steps = "fewer" if large < small * factor else "more" if large > small * factor else "as many"
    unreached = ", ".join(str(b) for b in v.get("unreached") or [])
    return (f"a {factor}x larger global batch needed {trend} epochs to the target ({small} -> {large}; one seed each, "
            f"the same learning rate) and {steps} optimizer steps (an epoch of it takes {factor}x fewer)"
            + (f"; at global batch {unreached} it did not reach the target at all" if unreached else "")
            + ": adding ranks at a fixed per-rank batch grows the global batch, so count the epochs your model needs "
            "at the global batch you will run.")


def _compile_breakeven(v: dict, c) -> str:
    warm = f", {v['compile_warm_s']:.0f} s again with a warm cache" if v.get("compile_warm_s") is not None else ""
    return (f"{v['workload']}: {v['name']} compiled in {v['compile_s']:.0f} s from a cold cache{warm}; "
            + (f"it pays for itself after {v['steps']:,.0f} steps." if v["steps"] else
               "its steps are not faster, so it never pays for itself."))


def _frozen_convs(v: dict, c) -> str:
    (hi, lo), (w_hi, w_lo), (d_hi, d_lo), (ms_hi, ms_lo) = (v["trainable_layers"], v["backward_weights_convs"],
                                                          v["backward_data_convs"], v["onednn_ms"])
    return (f"{_who(v)}trainable_layers {hi} -> {lo}: backward-weights convolutions per step {w_hi:.0f} -> {w_lo:.0f}, "
            f"backward-data {d_hi:.0f} -> {d_lo:.0f}; their oneDNN time {ms_hi:.1f} -> {ms_lo:.1f} ms per step: stock "
            "PyTorch skips the weight gradients of frozen stages and the data gradients below the lowest trainable "
            "one (the paper's IPEX build did not, until fixed).")


def _focal_limit(v: dict, c) -> str:
    ms, limit = v["median_ms"], v["limit_ms"]
    return (f"focal loss at {v['shape']}: the fastest kernel ({v['kernel']}) takes {ms:.2f} ms forward + backward; "
            f"moving the least it must ({v['bytes_per_logit']} x {v['element_bytes']} B a logit: logits and targets "
            f"read twice, the gradient written) at the measured copy bandwidth of {v['copy_gbs']:.1f} GB/s takes "
            f"{limit:.2f} ms, the physical limit; the kernel takes {ms / limit:.1f}x it. The case study aims for a "
            "kernel within 2x of the limit: "
            f"{'reached' if v['within'] else 'not reached, so a faster kernel is still possible'}.")


def _compiled(v: dict) -> str:
    warm = f" ({v['compile_warm_s']:.0f} s with a warm cache)" if v.get("compile_warm_s") is not None else ""
    return f"{v.get('rung', 'runtime: torch.compile')}: compiled in {v['compile_s']:.0f} s{warm}"


def _compile_pays(v: dict, c) -> str:
    carried = v["carried"]
    return (f"{_compiled(v)}; against {v.get('against', 'eager')} in fresh rounds: {describe(c)}; it pays for its cold "
            "compile after "
            f"{v['pays_after']:,.0f} steps, " + ("within" if carried else "beyond")
            + f" a training run of {v['train_steps']:,} steps: "
            + ("carried up the ladder (later runs compile from a warm cache in their untimed warm-up)." if carried
               else "not carried up the ladder."))


def _climb_rung(v: dict, c) -> str:
    """A rung's own finding (kind and values, its comparison the outer one's), after the ladder's name."""
    said = v["said"]
    return f"{v['ladder']}: {TEMPLATES[said['kind']]({'workload': v['workload'], **said['values']}, c)}"


def _climb_top(v: dict, c) -> str:
    return (f"{v['ladder']}: the top of the ladder ({v['change']}) against PyTorch's defaults, {c.n} fresh paired "
            f"rounds: {describe(c)}; the paper's about 2x (here: at least {v['target']:.1f}x with the interval's "
            f"lower end above {v['target_low']}) is {'reached' if v['met'] else 'not reached'}.")


# profiledn.wholestep's words: what a whole step's gap and its time between operators are spent on
_CAUSE_WORDS = {"compute": "GEMM-like kernels running below the measured GEMM ceiling",
                "memory": "memory-bound operators running below the copy bandwidth (many are too small to reach it)",
                "no work": "operators that move no data (views, allocations: framework overhead)",
                "unknown": "operators whose work is not counted",
                "between ops": "time between operators (Python, the autograd engine, the loop)"}
_PHASE_WORDS = {"forward": "forward operators (Python and module calls, and the loop from one step to the next)",
                "loss": "the loss's operators",
                "backward": "backward operators (the autograd engine between nodes)",
                "optimizer": "the optimizer's operators (notebook 05 measures its foreach and fused implementations)"}


def _primitive(v: dict) -> str:
    """A primitive kind with its direction in words ("backward weights convolution"; reorders have none)."""
    return f"{v['direction'].replace('_', ' ')} {v['primitive']}" if v["direction"] != "none" else v["primitive"]


def _shares(parts: dict) -> str:
    """"a 59%, b 24%": each part's share of their sum, the largest first, the empty ones left out."""
    total = sum(parts.values())
    return ", ".join(f"{k} {ms / total:.0%}" for k, ms in sorted(parts.items(), key=lambda kv: -kv[1]) if ms > 0)


DIGITS_MODES = {"bf16": "bf16 (the loss in fp32)", "bf16_loss": "bf16 with the loss in bf16 too"}


def _digits_accuracy(v: dict) -> str:
    """One precision mode's test accuracy against fp32's, in images where the count is known: one
    seed each, so a difference of a few images is no finding."""
    mode = DIGITS_MODES.get(v["mode"], v["mode"])
    head = f"digits, {mode}: final test accuracy {v['accuracy']:.1%} vs {v['fp32_accuracy']:.1%} in fp32"
    n = v.get("test_samples")
    if n:
        diff, noise = _images_apart(v["accuracy"], v["fp32_accuracy"], n)
        head += (f" ({abs(diff)} of {n} test images {'more' if diff > 0 else 'fewer'} right, one seed each)" if diff
                 else f" (the same count of {n} test images right, one seed each)")
        head += (f": within the test set's own noise (about {noise} images), so on this model {mode} did not hurt "
                 "accuracy that one seed can show" if abs(diff) <= noise else
                 f": beyond the test set's own noise (about {noise} images); one seed each, so confirm it with more "
                 "seeds before relying on it")
    fp32 = f" (fp32: {v['fp32_loss']:.4f})" if v.get("fp32_loss") is not None else ""
    return f"{head}; final loss {v['loss']:.4f}{fp32}."


def _images_apart(a: float, b: float, n: int) -> tuple[int, int]:
    """Test images more right at accuracy ``a`` than at ``b`` over ``n``, and the test set's own noise: two
    standard errors of the difference of two accuracies over n test images (binomial), at least one image."""
    p = (a + b) / 2
    return round(a * n) - round(b * n), max(1, round(2 * math.sqrt(2 * p * (1 - p) / n) * n))


def _loss_precision(v: dict, c) -> str:
    """Notebook 06's third question: the loss in fp32 (the paper's advice) against the loss in bf16 too, on the
    digits' accuracy, one seed each; its speed is not measured apart."""
    head = (f"digits, the loss under bf16: {v['fp32_loss_accuracy']:.1%} of the test images right with the loss in "
            f"fp32, {v['bf16_loss_accuracy']:.1%} with it in bf16")
    if not v.get("test_samples"):
        return head + " (one seed each); the workbook keeps the loss in fp32, as the paper advises."
    diff, noise = _images_apart(v["fp32_loss_accuracy"], v["bf16_loss_accuracy"], v["test_samples"])
    if abs(diff) <= noise:
        return (head + f": within the test set's own noise (about {noise} images), so this model cannot tell whether "
                "the loss must stay in fp32; the workbook keeps it in fp32, as the paper advises (the loss's speed "
                "is not measured apart).")
    if diff > 0:
        return (head + f": {diff} images more right with the loss in fp32, beyond the test set's own noise (about "
                f"{noise}): keep the loss in fp32, as the paper advises (one seed each: more seeds confirm it).")
    return (head + f": {-diff} images more right with the loss in bf16, beyond the test set's own noise (about "
            f"{noise}), one seed each: not reason enough to leave the paper's advice without more seeds.")


def _ms(ms: float) -> str:
    """A duration for a sentence, to about three figures: ``0.39 ms``, ``43.9 ms``, ``594 ms``, ``18.47 s``."""
    if ms >= 1000:
        return f"{ms / 1e3:.2f} s"
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def _log_total(v: dict, c) -> str:
    per = f" ({_ms(v['total_ms'] / v['steps'])} per step over {v['steps']} steps)" if v["steps"] else ""
    return (f"{_who(v)}{v['executions']} primitive executions took {_ms(v['total_ms'])}{per}; "
            + ", ".join(f"{kind} {share:.0%}" for kind, share in v["kinds"]) + ".")


def _logs_time(v: dict, c) -> str:
    (la, lb), (ta, tb) = v["labels"], v["ms"]
    if not v["per_step"]:
        return f"Logged oneDNN time: {_ms(ta)} in {la} vs {_ms(tb)} in {lb}."
    if not (ta and tb):
        return f"{la if not ta else lb} logged no oneDNN time."
    return f"oneDNN time per step: {_ms(ta)} in {la} vs {_ms(tb)} in {lb}: {lb} spends {_more_or_less(tb / ta)}."


def _more_or_less(ratio: float, what: str = "time in oneDNN") -> str:
    """'12% more time in oneDNN' / '3% less ...' / 'the same ...': a time ratio in words, never an 'x' that a
    reader could take for a speed ratio."""
    change = round(abs(ratio - 1) * 100)
    return f"the same {what}" if change == 0 else f"{change}% {'more' if ratio > 1 else 'less'} {what}"


DIRECTION_WORDS = {"none": "no direction (reorders, sums, concatenations)"}  # primitives without a prop_kind


def _calls(calls: int, steps: int | None) -> str:
    """'431 calls a step' where the log's steps are known (as its other per-step figures), else the log's total."""
    return f"{calls / steps:.0f} calls a step" if steps else f"{calls} calls in the log"


def _log_reorders(v: dict, c) -> str:
    """How much of oneDNN's time reorders take, what they move, and the fix that fits the larger part."""
    roles = {role: share for role, share in (v.get("roles") or {}).items() if share > 0}
    split = ", ".join(f"{role} {share:.0%}" for role, share in sorted(roles.items(), key=lambda kv: -kv[1]))
    said = (f"{_who(v)}Reorders (layout conversions, no useful compute) take {v['share']:.0%} of oneDNN time in "
            f"{_calls(v['calls'], v.get('steps'))}" + (f" ({split})" if roles else ""))
    if v["share"] <= 0.1:
        return said + "."
    if roles and max(roles, key=roles.get) == "weights":
        return said + ("; most move weights into the kernels' blocked layout, again at every call since training "
                       "changes them: channels-last does not remove those, keeping the weights in that layout does "
                       "(IPEX's weight prepacking; notebook 05 measures IPEX as a whole, not this alone).")
    return said + "; a consistent layout (channels-last for CNNs) may remove many of them."


def _replay_against_log(v: dict, c) -> str:
    return (f"{_who(v)}replay against the log, like for like ({v['alike']} primitives found in the replay's own log, "
            f"first creation and warm-up excluded): {_ms(v['alike_replayed_ms_per_step'])} per step replayed vs "
            f"{_ms(v['alike_logged_ms_per_step'])} logged (replay takes {_more_or_less(v['agreement'], 'time')}). "
            "Timed as whole PyTorch calls the "
            f"replayed primitives take {_ms(v['call_replayed_ms_per_step'])} against "
            f"{_ms(v['call_logged_ms_per_step'])} logged" + (
                ": the difference is the call's dispatch and the reorders it adds around the primitive, which the "
                "projection leaves out." if _ms(v["call_replayed_ms_per_step"]) != _ms(v["call_logged_ms_per_step"])
                else "."))


AGREEMENT_TRUSTED = 0.10  # replay within 10% of the log, like for like: its efficiency ratio is read as a share


def _projection_efficiency(v: dict, c) -> str:
    head = f"{_who(v)}measured step {_ms(v['step_ms'])}; efficiency ratio {v['efficiency']:.0%}"
    agreement = v.get("agreement")
    if agreement is not None and abs(agreement - 1) > AGREEMENT_TRUSTED:
        return (head + f": not to be read as a share of the step, since the same primitives took "
                f"{_more_or_less(agreement, 'time')} replayed than logged (the line above), more than "
                f"{AGREEMENT_TRUSTED:.0%} apart; the logged share of the step in oneDNN is the safer figure.")
    if v["efficiency"] > 1:
        return (head + ": replayed one by one, the kernels take longer than the whole step, so the step is "
                "kernel-bound and isolated replay (cold caches, no overlap between primitives) overstates them.")
    return (head + " (oneDNN's kernels, replayed alone where they can be, take that share of it): the other "
            f"{1 - v['efficiency']:.0%} is time they do not account for, spent outside oneDNN (framework overhead, "
            "operators served by other libraries, Python) or in its kernels running slower in the step than alone "
            "(the logged share above times them as they ran).")


def _whole_step_coverage(v: dict, c) -> str:
    said = (f"{_who(v)}{v['coverage']:.1%} of the operators' time has a work count and a ceiling "
            f"({v['top_level_per_step']:.0f} top-level operators a step); {v['between_ops_share']:.1%} of the "
            f"{_ms(v['step_ms'])} traced step falls between operators, so {v['step_coverage']:.1%} of the whole step "
            "is projected.")
    if v["plain_step_ms"]:
        said += f" Unprofiled, the step took {_ms(v['plain_step_ms'])}."
    if v["shaped_step_ms"] is not None:  # timed from the light trace
        shaped = v["shaped_step_ms"]
        said += (f" (Times from a trace without shapes; recording shapes stretched the step to {_ms(shaped)}.)"
                 if shaped > v["step_ms"] else f" (Times from a trace without shapes; the trace with shapes took "
                 f"{_ms(shaped)}, not longer in this run: the runs' own noise hid what recording shapes costs.)")
    return said


def _whole_step_projection(v: dict, c) -> str:
    gap = v["gap_ms"]
    traced = f"its traced step ({_ms(v['step_ms'])})" if v.get("step_ms") else "the traced step"
    said = (f"{_who(v)}at every ceiling {traced} would take {_ms(v['projected_ms'])} "
            f"({v['speedup_bound']:.1f}x faster)" if v["speedup_bound"] else f"{_who(v)}no projection")
    if sum(gap.values()) > 0:
        said += (f"; of the {_ms(sum(gap.values()))} gap, {_shares(gap)}: most of the room is in "
                 f"{_CAUSE_WORDS[max(gap, key=gap.get)]}.")
    return said


def _forward_backward(v: dict, c) -> str:
    """Why the forward takes what it takes against the backward, from a trace's phase account."""
    def rate(gflops, share):
        return (f"{gflops:.0f} GFLOP/s ({share:.0%} of the measured GEMM ceiling)" if gflops and share
                else "an unknown rate")

    ratio = (f"{v['ratio']:.2f}x the backward's time" if v["ratio"] is not None else
             "no ratio (no backward was traced)")
    said = (f"{_who(v)}the forward with its loss takes {v['forward_ms'] / 1e3:.2f} s, the backward "
            f"{v['backward_ms'] / 1e3:.2f} s: {ratio}. {_ratio_goal(v)}.")
    if v["work_ratio"]:
        said += (f" Why, from the trace: the backward does {v['work_ratio']:.2f}x the forward's GFLOP "
                 f"({v['full_backward']:.0f}x where every layer trains and its input needs a gradient"
                 + ("; frozen layers skip theirs, and the layers below the lowest trainable one their input's"
                    if v["work_ratio"] < 0.9 * v["full_backward"] else "")
                 + f"), so at one speed per FLOP the forward would take {1 / v['work_ratio']:.2f} of the backward.")
    loss = (f"The loss is {v['loss_share']:.0%} of the forward" if v["loss_share"] is not None else
            "The trace marks no loss (compiled into the forward's region, the loss is counted with the forward)")
    said += (f" {loss}; GEMM-like operators are "
             f"{v['gemm_share_forward']:.0%} of the forward with its loss at "
             f"{rate(v['forward_gflops'], v['forward_of_ceiling'])} "
             f"and {v['gemm_share_backward']:.0%} of the backward at "
             f"{rate(v['backward_gflops'], v['backward_of_ceiling'])}.")
    return said


def _ratio_goal(v: dict) -> str:
    """profiledn.account's goal for the forward against the backward, and which of its two ways it meets."""
    share, rate = v.get("bound_share", 0.8), v.get("bound_rate", 0.5)
    goal = (f"The goal: {v['goal']:.1f}x at most, or a GEMM-bound forward (GEMM-like operators {share:.0%} or more "
            f"of its time, at {rate:.0%} or more of the measured GEMM ceiling)")
    if v["ratio"] is not None and v["ratio"] <= v["goal"]:
        return goal + ": met"
    if v["met"]:
        return goal + ": met, GEMM-bound"
    short = []
    if v["gemm_share_forward"] < share:
        short.append(f"GEMM-like operators {v['gemm_share_forward']:.0%} of its time")
    if (v["forward_of_ceiling"] or 0) < rate:
        short.append(f"at {v['forward_of_ceiling'] or 0:.0%} of the ceiling")
    return goal + ": not met" + (f" ({', '.join(short)})" if short else "")


def _whole_step_gemm(v: dict, c) -> str:
    """GEMM-like operators against the measured ceiling, the basis said: their time a step against the time
    they would take at the ceiling (older records: the time-weighted average alone)."""
    if "ms" in v:
        basis = (f"take {_ms(v['ms'])} a step; at the measured GEMM ceiling of their dtype they would take "
                 f"{_ms(v['at_ceiling_ms'])}: they run at {v['of_ceiling']:.0%} of that ceiling")
        if v.get("no_ceiling_ms"):
            basis += f" (another {_ms(v['no_ceiling_ms'])} a step of them ran in a dtype with no ceiling measured)"
    else:
        basis = f"run at {v['of_ceiling']:.0%} of the measured GEMM ceiling on average (time-weighted)"
    return (f"{_who(v)}GEMM-like operators {basis}{_of_theory(v.get('of_theoretical'))}; the heaviest, "
            f"{v['heaviest']} ({v['shapes']}), at {v['heaviest_of_ceiling']:.0%} of that ceiling"
            f"{_of_theory(v.get('heaviest_of_theoretical'))}.")


def _of_theory(share) -> str:
    """The share of the theoretical peak beside a share of the measured ceiling; above all of it, what
    that says: no core computes faster than its peak, so the clock it was taken at was lower than the
    cores ran at (a clock measured in a VM; a turbo above sysfs's maximum)."""
    if share is None:
        return " (the theoretical peak is unknown here)"
    return f" and {share:.0%} of the theoretical peak" + (
        " (above it: the cores ran faster than the clock the peak was taken at)" if share > 1 else "")


_FIX_WORDS = {
    "gemm": "GEMM-like work below the GEMM ceiling: a faster kernel path for it (channels-last, bf16 where the CPU "
            "has a fast path, prepacked weights, max-autotune's GEMM templates)",
    "kernel": "memory-bound work below the copy rate: one fused kernel or a compiled region for it (as the "
              "paper's focal-loss kernel)",
    "layout": "reorders and copies between layouts: one layout through the step (channels-last)",
    "dispatch": "time between operators: fusion or a compiled region (torch.compile) to cut dispatch",
}


def _above_ceiling(v: dict, c) -> str:
    """Operators measured faster than their ceiling: GEMM-like ones above the measured GEMM ceiling
    (a plain GEMM at a few sizes), others above the DRAM copy rate; the projection keeps their times.
    A finding stored before the split gives the share alone (all of it above the copy rate then)."""
    gemm, memory = v.get("compute", 0.0), v.get("memory", v["share"])
    parts = []
    if gemm > 0.01:
        parts.append(f"{gemm:.0%} in GEMM-like operators measured above the measured GEMM ceiling (a plain GEMM at a "
                     "few sizes: these kernels beat it)")
    if memory > 0.01:
        parts.append(f"{memory:.0%} in operators measured above the DRAM copy rate (data in cache: for them the "
                     "ceiling is cache bandwidth)")
    said = " and ".join(parts) or f"{v['share']:.0%} in operators measured above their ceiling"
    return f"{_who(v)}of the operators' time, {said}; the projection keeps their measured time."


def _next_fix(v: dict, c) -> str:
    if v["op"] == "between operators":
        where = (f"the time between operators, most of it leading to the {v['phase']} ({v['gap_ms'] / 1e3:.2f} s "
                 f"a step, {v['share']:.0%} of the step)")
    else:
        where = (f"{v['op']} in the {v['phase']} ({v['ms'] / 1e3:.2f} s a step, {v['share']:.0%} of the step), "
                 f"{v['gap_ms'] / 1e3:.2f} s a step above its ceiling")
    return f"{_who(v)}the next fix the profile points at: {where}: {_FIX_WORDS[v['fix']]}."


def _next_fix_tried(v: dict, c) -> str:
    """fullstudy: the next fix's convolution alone under each path (kernels.conv_paths)."""
    said = f"{_who(v)}the next fix, tried: {v['op']} ({v['shapes']}) alone, forward and backward"
    if "error" in v:
        return f"{said}: the trial did not finish ({v['error']}); nothing is said of its paths."
    if "skipped" in v:
        return f"{said}: not run: {v['skipped']}."
    share = f" ({v['alone_gflops'] / v['ceiling']:.0%} of the measured GEMM ceiling)" if v["ceiling"] else ""
    said += (f", {v['rounds']} interleaved rounds: in the step's dtype and layout ({v.get('layout') or 'NCHW'}), "
             f"{v['alone_gflops']:.0f} GFLOP/s alone{share}, "
             f"{v['step_gflops']:.0f} GFLOP/s in the step; "
             + "; ".join(f"{p['path']} {p['ratio']:.2f}x (95% CI {compare.interval_ends(p['low'], p['high'])}): "
                         f"{p['verdict']}"
                         for p in v["paths"]) + ".")
    best = v["best"]
    if best:
        how = f"`{best['flags']}`" if best["flags"] else "no option applies it yet"
        said += (f" {best['path']} is the fastest confirmed path: about {v['saving_ms'] / 1e3:.2f} s a step less "
                 f"at this shape ({how}).")
        if best["flags"]:
            return said + _flag_over_whole_step(best)
        return said + (" A saving alone, not yet over the whole step: there the tensors around this layer, the "
                       "layouts they are in and what a compiled graph fuses decide whether it stays.")
    said += f" No path is confirmed faster by {compare.MIN_GAIN:.0%} or more"
    if not v["ceiling"] or v["step_gflops"] >= v["ceiling"]:
        return said + "."
    # time a unit of work: at the ceiling, alone, in the step; the gap above the ceiling split between them
    at_ceiling, alone, in_step = 1 / v["ceiling"], 1 / v["alone_gflops"], 1 / v["step_gflops"]
    kernel = min(max((alone - at_ceiling) / (in_step - at_ceiling), 0.0), 1.0)
    return (f"{said}: of this shape's time above the ceiling, {kernel:.0%} is its kernel's own (the fastest path "
            f"PyTorch offers here, alone) and {1 - kernel:.0%} comes from around it in the step (caches, the work "
            "beside it).")


def _flag_over_whole_step(path: dict) -> str:
    """A path's flag changes every layer, not the one shape tried: the climb's rung that compared it over the
    whole step, where one is stored."""
    said = f" `{path['flags']}` changes every layer, not this shape alone: "
    ws = path.get("whole_step")
    if not ws:
        return said + "only the whole step compared tells whether it pays (`make case-study` climbs a rung for it)."
    day = f", climbed on {ws['day']}" if ws.get("day") else ""
    sentence = (ws.get("sentence") or "").removeprefix(f"{ws['rung']}: ").rstrip(".")
    verdict = f": {sentence}." if sentence else " (`cpuopt ladder` gives its verdict)."
    said += f"the standard-preset ladder's rung \"{ws['rung']}\" compared it over the whole step{day}" + verdict
    if ws.get("kept") is None:
        return said
    return said + (f" So: the ladder kept `{path['flags']}`, and the top already trains with it." if ws["kept"] else
                   f" So: this shape's gain alone did not carry over the whole step; leave `{path['flags']}` out, as "
                   "the ladder does.")


def _base_threads(v: dict) -> int:
    """The multi-instance reference's threads (a finding stored before they were kept: from its ideal)."""
    return v.get("base_threads") or round(v["threads"] * v["ranks"] / v["ideal"])


def _base_rate(v: dict) -> str:
    """The multi-instance reference's own rate, where the finding carries it."""
    return f" ({v['base_samples_per_s']:.1f} samples/s)" if v.get("base_samples_per_s") else ""


def _full_preset_top(v: dict, c) -> str:
    said = (f"{_who(v)}at the {v['preset']} preset ({v['classes']} classes), {v['change']} over PyTorch's defaults: "
            f"{compare.describe(c.to_dict() if c else None)}.")
    if v["per_core"] is not None:
        said += f" The top trains {v['per_core']:.3f} images/s per physical core" + _of_mlperf(v, long=True) + "."
    if not v["bf16_fast"]:
        said += (f" In {v['dtype']}: this CPU has no bf16 fast path ({v['bf16_reason']}); the 3x and per-core goals "
                 "are checked on an AMX machine.")
    return said


def _kernel_time(v: dict, c) -> str:
    said = (f"{_who(v)}the OS kernel took {v['share']:.0%} of the timed steps' CPU time (system time), "
            f"{v['page_faults']:,.0f} page faults a step: memory the allocator hands back to the OS is faulted in "
            "again, page by page, and every operator that touches new memory waits for it")
    if v["allocator"] != "default":
        return said + f"; its allocator ({v['allocator']}) does not keep enough of it."
    if v.get("tried"):
        return said + f"; the study tried the top under {v['tried']}, which keeps freed memory for reuse (below)."
    return said + ("; an allocator that keeps freed memory for reuse may pay (`--allocator tcmalloc`, or `--allocator "
                   "jemalloc`, whose MALLOC_CONF here keeps it; notebook 04 compares them; `make setup` installs "
                   "both).")


def _allocator_tried(v: dict, c) -> str:
    """fullstudy.kernel_findings: the top under an allocator that keeps freed memory against the top."""
    said = (f"{_who(v)}an allocator that keeps freed memory, tried: the top under {v['allocator']} over the top as "
            f"compared above, in fresh paired rounds: {compare.describe(c.to_dict() if c else None)}.")
    before, after = v["before"], v["after"]
    if after.get("system_share") is not None:
        said += (f" In the trial's own runs, the OS kernel's share of CPU time went from "
                 f"{before['system_share']:.0%} to "
                 f"{after['system_share']:.0%}, its page faults from {before['page_faults_per_step']:,.0f} a step to "
                 f"{after['page_faults_per_step']:,.0f}.")
    if v["faster"] and v["per_core"] is not None:
        said += (f" With it the top trains {v['per_core']:.3f} images/s per physical core{_of_mlperf(v)} (`--allocator "
                 f"{v['allocator']}`). The study hands nothing on: a ladder's allocator rung (`make case-study`) "
                 "chooses one for the top.")
    return said


def _of_mlperf(v: dict, long: bool = False) -> str:
    """The rate's share of MLPerf's, where the study ran at MLPerf's size (``mlperf_per_core`` None
    elsewhere); ``long``: with where MLPerf's rate comes from, and saying so where it is not comparable."""
    if v.get("mlperf_per_core") is None:
        return " (MLPerf's rate is at the full preset's size: not comparable)" if long else ""
    return (f", {v['per_core'] / v['mlperf_per_core']:.0%} of MLPerf" + (" Training v3.0 Intel" if long else "")
            + f"'s {v['mlperf_per_core']:.2f}" + (" (AMX, communication included)" if long else ""))


def _target(v: dict, c) -> str:
    """targets.findings: one target of the case study, its verdict on this CPU, and what the run allows."""
    at = f"at the {v['preset']} preset ({v['classes']} classes)"
    who = v.get("fastest", "top")  # the fastest configuration confirmed: its rate, bound and peak share
    if v["figure"] == "per_core":
        want, unit = f"{v['value']:.2f} images/s per physical core" + (f", {v['source']}" if v["source"] else ""), ""
        got = "no run finished" if v["measured"] is None else f"the {who} trains {v['measured']:.3f}"
    else:
        want = (f"the top over PyTorch's defaults {v['value']:.1f}x in {v['rounds']} paired rounds"
                + (f", the interval's lower end at {v['lower']:.1f} or more" if v["lower"] else ""))
        unit, got = "x", f"measured {compare.describe(c.to_dict() if c else None)}"
    said = f"Target for {v['path_name']} CPUs {at}: {want}. "
    if c is not None and v["status"] == "not met" and v["figure"] != "per_core" and c.verdict == "faster":
        got += " than the defaults, yet short of the target"  # a verdict on the defaults, not on the target
    if c is not None and v["status"] == "not met" and v["figure"] != "per_core" and c.n < v["rounds"]:
        got += (f"; in {c.n} rounds, fewer than the {v['rounds']} it needs, but the interval's upper end is already "
                f"below {v['value']:.1f}x")
    said += {"met": f"Met: {got}.", "not met": f"Not met: {got}.", "no result": f"Not checked: {got}.",
             "too few rounds": f"Not checked: {got}; the target needs {v['rounds']} paired rounds.",
             "other path": f"Not checked here (this CPU: {v['here']}); {got}."}[v["status"]]
    if v["status"] == "other path":  # another CPU's target: its bound and peak share say nothing of it here
        return said + (f" For reference only: on this CPU, at every ceiling (this run's projection), the {who} would "
                       f"reach {v['bound']:.2f}{unit}." if v["bound"] is not None else "")
    if v["bound"] is not None:
        beyond = v["bound"] < v["value"]
        said += (f" At every ceiling (this run's projection) the {who} would reach {v['bound']:.2f}{unit} here: "
                 + ("below the target, so no faster kernel for its operators reaches it on this machine; it needs "
                    "less work or another CPU." if beyond else "the target is within that bound."))
    if v["needed_share"] is not None:
        said += (f" The target asks for {v['needed_share']:.0%} of the theoretical peak over the whole step"
                 + (" (more than this CPU's cores can do at all, at the top's work a step)" if v["needed_share"] > 1
                    else "") + (f"; the {who} runs at {v['top_share']:.0%}." if v["top_share"] is not None else "."))
    return said


def _fresh_memory(v: dict, c) -> str:
    """stages.baseline.system_findings: writing memory the OS maps at first touch, against mapped memory."""
    slower = v["mapped_gbs"] / v["fresh_gbs"]
    said = (f"Writing fresh memory (a large block the C library's malloc maps anew, each page faulted in at first "
            f"touch) runs at {v['fresh_gbs']:.1f} GB/s, against {v['mapped_gbs']:.1f} GB/s into memory already "
            f"mapped: {slower:.1f}x slower")
    if slower < v["costly"]:
        return said + "; page faults cost little here."
    return said + (". A step whose allocator hands large freed blocks back to the OS pays that at every reuse; an "
                   "allocator that keeps them avoids it (notebook 04 gives the OS kernel's share of CPU time under "
                   "each).")


def _headline(v: dict, c) -> str:
    """Notebook 09's summary of one ladder (``stages.summary.headline_findings``)."""
    head = (f"{v['workload']}: the ladder's top over PyTorch's defaults, in {c.n} fresh paired rounds: {describe(c)}"
            if c else f"{v['workload']}: nothing was handed on beyond PyTorch's defaults")
    if v["largest_step"]:
        s = v["largest_step"]
        head += f"; the largest confirmed step: {s['step']} ({s['change']}, {s['ratio']:.2f}x the rung before)"
    if v["usd_per_1000"] is not None:
        head += f"; ${v['usd_per_1000']:.4f} per 1000 samples at ${v['price_per_hour']:g}/hour"
    if v["peak_share"] is not None:
        dtype = v["ceiling"].split()[0]
        head += f"; {v['peak_share']:.0%} of the measured {v['ceiling']} ceiling"
        head += (f", {v['theoretical_share']:.0%} of the theoretical {dtype} peak" if v["theoretical_share"] is not None
                 else f", the theoretical {dtype} peak unknown here (`cpuopt doctor`)")
        if v["peak_share"] > 1:  # the ceiling is a plain GEMM at a few sizes, measured once: not a bound
            head += (" (above the measured ceiling: its kernels beat a plain GEMM at the sizes measured, or the ceiling "
                     "was measured while something else ran: a quiet rerun measures it again)")
    return head + "."


TEMPLATES: dict[str, Callable[[dict, object], str]] = {
    # stages.case_study: a kernel benchmark whose compiled kernel could not compile here
    "kernel fell back": lambda v, c: (f"{v['benchmark']} benchmark: {v['what']} fell back to {v['fell_back_to']} "
                                      f"({v['reason']}): its row is {v['fell_back_to']}'s, or not there, and a run "
                                      "asking for it trains with the fallback (its result says so)."),
    # stages.summary: notebook 09's headline of each ladder, and whether its runs time enough steps
    "ladder headline": _headline,
    "baseline spread": lambda v, c: (
        f"{v['workload']}: PyTorch's defaults ran at {v['low']:.1f}-{v['high']:.1f} samples/s over the {v['runs']} "
        f"runs of them stored on this machine (median {v['median']:.1f}): absolute rates moved this much between "
        "notebooks and rounds, which is why every verdict here is a ratio of runs paired in one round."),
    # targets.findings: the case study's targets for this CPU's kind, each with its verdict
    "target": _target,
    "steady window": lambda v, c: (
        f"{v['workload']} at the {v['preset']} preset ({'/'.join(map(str, v['steps']))} timed steps a run): the steps' "
        f"own noise explains {v['share']:.0%} of a paired comparison's variance ({v['rounds']} rounds of "
        f"{v['comparisons']} comparison{'s' * (v['comparisons'] != 1)}): "
        + ("steady enough; more rounds, not more steps, narrow an interval." if v["steady"] else
           "not steady: more timed steps a run would narrow every interval.")),
    "steadiness unknown": lambda v, c: (f"{v['workload']} at the {v['preset']} preset: no comparison of it ran 3 "
                                        "paired rounds here, so whether its runs time enough steps is not known."),
    # stages.choosing.screened_only: settings ranked by a screening, no verdict (the table shows them)
    "screened only": lambda v, c: (
        f"{_who(v)}{len(v['settings'])} setting{'s' * (len(v['settings']) != 1)} screened only ({v['rounds']} "
        f"round{'s' * (v['rounds'] != 1)}, fewer than the {v['min_rounds']} a verdict needs)" + (
            ", each against the baseline: " + ", ".join(f"{s} {r:.2f}x" for s, r in sorted(
                ((s, r) for s, r in zip(v["settings"], v["ratios"]) if r == r), key=lambda sr: -sr[1]))
            if v.get("ratios") and any(r == r for r in v["ratios"]) else "")
        + ": the table ranks them, a confirmation decides."),
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
        f"{v['single_sps']:.1f} (screening only): no DDP layout screened faster, so none was confirmed; one rank "
        "on all cores is kept (independent copies train separate models: no candidate for one training run)."),
    "ddp confirmed": lambda v, c: (
        f"{v['what']}: {_where(v)} over one rank x {v['single_threads']} threads, in fresh rounds: {c.describe()}"
        + _handed_on(c, "one rank on all cores is kept")),
    # stages.baseline: the machine (system_findings) and each workload at PyTorch's defaults (findings)
    "machine": lambda v, c: (
        f"{v['cpu_model']}: {v['physical_cores']} physical / {v['logical_cores']} logical cores on {v['sockets']} "
        f"socket(s) and {v['numa_nodes']} NUMA node(s); widest vector ISA: {v['widest_isa']}."),
    "ceilings": lambda v, c: (
        f"Measured ceilings on {v['threads']} threads: fp32 GEMM {v['gemm_gflops']:.0f} GFLOP/s, "
        + (f"bf16 GEMM {v['bf16_gflops']:.0f} GFLOP/s, " if v.get("bf16_gflops") else "") + "memory copy "
        f"{v['copy_gbs']:.1f} GB/s; an fp32 kernel needs about {v['gemm_gflops'] / v['copy_gbs']:.0f} FLOP per byte "
        "moved to be compute-bound here."),
    "fresh memory": _fresh_memory,
    "bf16 flags": lambda v, c: (
        f"bf16: CPU flags {', '.join(v['flags']) if v['flags'] else 'none of amx_bf16/avx512_bf16/avx_ne_convert'}; "
        f"oneDNN reports bf16 support: {'yes' if v['onednn_bf16'] else 'no'}."),
    "missing tools": lambda v, c: "Missing: " + ("; ".join(f"{k} ({why})" for k, why in v["missing"].items())
                                                 if v["missing"] else
                                                 "nothing; every allocator and OpenMP runtime can be measured."),
    "numactl refused": lambda v, c: (f"numactl is installed but refused here ({v['reason']}); runs pin with taskset "
                                     "or sched_setaffinity instead."),
    "no baseline result": lambda v, c: (f"{v['workload']}: no result; see the failures above."
                                        if v["workload"] else "No workload produced a result; see the failures above."),
    "ladder starts": lambda v, c: (f"{v['workload']}: its ladder starts at PyTorch's defaults, "
                                   f"{v['samples_per_s']:.1f} samples/s."),
    "baseline throughput": _baseline,
    "gemm gap": lambda v, c: (
        f"Furthest from the GEMM ceiling: {v['furthest']} ({v['furthest_share']:.0%}); closest: {v['closest']} "
        f"({v['closest_share']:.0%}). The gap is the room that the next notebooks try to win."),
    "noisy runs": lambda v, c: v["warning"],  # stats.spread_warning's sentence, as the baseline table holds it
    # stages.threads: thread scaling, and each setting against the baseline
    "one thread count": lambda v, c: f"{v['workload']}: only one thread count measured.",
    "thread scaling": lambda v, c: (
        f"{v['workload']}: {v['threads']} threads give {v['samples_per_s']:.1f} samples/s, "
        f"{v['samples_per_s'] / v['first_samples_per_s']:.2f}x of {v['first_threads']} thread(s) "
        f"({v['efficiency']:.0%} of ideal linear scaling); the fastest count is {v['fastest_threads']}."),
    "no baseline comparison": lambda v, c: f"{v['workload']}: no comparison with the baseline was possible.",
    "setting over baseline": lambda v, c: f"{v['workload']}: {v['setting']}: {describe(c)}.",
    # stages.allocator: peak memory, the launchers against PyTorch's defaults, what is handed on where
    "peak memory": lambda v, c: (
        f"{v['workload']}: peak RSS {v['baseline_mb']:.0f} MB with glibc; "
        + "; ".join(f"{s} {mb:.0f} MB ({mb / v['baseline_mb'] - 1:+.0%})" for s, mb in v["settings"]) + "."),
    "run_cpu over defaults": lambda v, c: (f"{v['workload']}: run_cpu's defaults over PyTorch's defaults: "
                                           f"{describe(c)}."),
    "best over defaults": lambda v, c: (f"{v['workload']}: the best setting ({v['setting']}) over PyTorch's defaults: "
                                        f"{describe(c)}."),
    "defaults best": lambda v, c: (f"{v['workload']}: the best setting is PyTorch's defaults; compared with run_cpu "
                                   "only."),
    "allocator handed on": _allocator_handed_on,
    "allocators missing": lambda v, c: "Not measured (not installed): " + ", ".join(v["missing"]) + ".",
    # stages.extensions: IPEX in its own runtime, this torch's replacements, compile times, zentorch
    "no runtime result": lambda v, c: f"{v['workload']}: no configuration produced a result.",
    "ipex over its torch": lambda v, c: (f"{v['workload']}: IPEX over its own stock torch 2.8"
                                        f"{', in fresh paired rounds' if v.get('confirmed') else ''}: {describe(c)}."),
    "stock over ipex": lambda v, c: f"{v['workload']}: stock torch (this venv) over torch 2.8 + IPEX: {describe(c)}.",
    "fastest upstream": lambda v, c: (
        f"{v['workload']}: fastest with this torch in screening: {v['name']} at {v['samples_per_s']:.1f} samples/s, "
        f"{describe(c)} against stock." if c is None or c.ratio is None or c.ratio > 1 else
        f"{v['workload']}: with this torch no setting outran stock in screening; the closest, {v['name']} at "
        f"{v['samples_per_s']:.1f} samples/s, {describe(c)} against stock."),
    "handed on over ipex": lambda v, c: (
        f"{v['workload']}: this torch as notebook 05 hands it on ({v['setting'] or 'stock, nothing beat it'}) over "
        f"torch 2.8 + IPEX, in fresh paired rounds: {describe(c)}" + _after_ipex(c)),
    "upstream over ipex": lambda v, c: f"{v['workload']}: {v['name']} over torch 2.8 + IPEX: {describe(c)}.",
    "fused adamw": lambda v, c: f"{v['workload']}: fused AdamW over the default AdamW: {describe(c)}.",
    "compiled nothing": lambda v, c: (
        f"{v['workload']}: {v['name']} took {v['compile_s']:.2f} s from a cold cache, too short for any kernel to "
        "have been generated: the step ran (almost) all eagerly (torch.compile leaves nn.LSTM/GRU to eager unless "
        "torch._dynamo.config.allow_rnn is set), so its ratio is eager's against eager's."),
    "compile breakeven": _compile_breakeven,
    "zentorch not measured": lambda v, c: (f"{v['workload']}: zentorch: "
                                           f"{v.get('reason') or 'not measured here (ZENTORCH = False)'}."),
    "zentorch failed": lambda v, c: f"{v['workload']}: zentorch: its training run failed, measured: {v['error']}.",
    "zentorch over eager": lambda v, c: f"{v['workload']}: zentorch over stock eager: {describe(c)}.",
    "zentorch over inductor": lambda v, c: f"{v['workload']}: zentorch over Inductor ({v['mode']}): {describe(c)}.",
    "zentorch without inductor": lambda v, c: (f"{v['workload']}: zentorch against Inductor: Inductor is not measured "
                                               "in this run (COMPILE_MODES = [])."),
    "zentorch loss drift": lambda v, c: (
        f"{v['workload']}: zentorch's loss over the steps lies {v['drift']:.1%} from the eager run's "
        + (f"(within the {v['tolerance']:.0%} a setting may drift: it trains the same)." if v["within"] else
           f"(beyond {v['tolerance']:.0%}: it does not train the same; no candidate).")),
    # stages.precision: the bf16 gate, bf16 against fp32, accuracy on the digits
    "bf16 gate": lambda v, c: (f"bf16 fast path on this CPU: {'yes, ' + v['path'] if v['accelerated'] else 'no'} "
                               f"({v['reason']})."),
    "bf16 over fp32": lambda v, c: f"{v['workload']}: {v['setting']} over fp32: {describe(c)}.",
    "digits accuracy": lambda v, c: _digits_accuracy(v),
    "loss precision": _loss_precision,
    # stages.multi_instance: the best layouts, DDP against independent instances, convergence
    # (a table with no result says "no layout", as choose does)
    "best layout": _best_layout,
    "ddp over independent": lambda v, c: (
        f"{v['workload']}: DDP over independent instances at {v['ranks']} x {v['threads']}: {describe(c)} "
        "(the difference is the gradient all-reduce)."),
    "ddp in sync": lambda v, c: (f"{v['workload']}: parameters identical on every rank after training in "
                                 f"{v['in_sync']} of {v['layouts']} DDP layouts."),
    "epochs to target": _epochs,
    "larger global batch": _larger_batch,
    # stages.case_study: the frozen layers, the focal-loss and Lamb kernels
    "frozen layers unlogged": lambda v, c: f"{_who(v)}frozen layers: fewer than two settings were logged.",
    "frozen layers convolutions": _frozen_convs,
    "frozen backward skipped": lambda v, c: (
        f"{_who(v)}skipping the frozen stages' backward (stock PyTorch) over computing it (the paper's unfixed "
        f"build, emulated): {describe(c)} (the paper: +16%)."),
    "trainable layers": lambda v, c: f"{_who(v)}{v['name']} over the default {v['default']}: {describe(c)}.",
    "focal kernel": lambda v, c: (f"focal loss at {v['shape']} ({v['elements']:,} logits): {v['kernel']} forward + "
                                  f"backward over the reference, in-process rounds: {describe(c)}."),
    "focal backward share": lambda v, c: (
        f"{v['shape']}: the reference focal loss's backward, timed alone, takes {v['reference_ms']:.1f} ms, "
        f"{v['reference_ms'] / v['backward_ms']:.1%} of the baseline's measured backward phase "
        f"({v['backward_ms']:.0f} ms); not comparable with a profile's share of the loss, where one is given: "
        "that times all the loss's terms in a traced step's backward nodes."),
    "focal limit": _focal_limit,
    "lamb not run": lambda v, c: f"IPEX's fused Lamb: {v['reason']}",
    "lamb kernel": lambda v, c: (
        f"Lamb on RetinaNet[{v['preset']}]'s {v['elements']:,} trainable parameters, torch {v['torch']}: "
        f"{v['kernel']} {v['median_ms']:.1f} ms vs the loop's {v['loop_ms']:.1f} ms (medians); paired round by round: "
        f"{describe(c)}{medians_disagree(v['loop_ms'] / v['median_ms'], c)}" + (
            f"; each runtime's ratio is over its own loop: beside it, torch {v['here']['torch']}'s loop takes "
            f"{v['here']['loop_ms']:.1f} ms and its fastest, {v['here']['kernel']}, {v['here']['median_ms']:.1f} ms."
            if v.get("here") else ".")),
    # stages.summary: each arm of a table against its first (the case study's fixes against the baseline)
    "no case study result": lambda v, c: "case study: no configuration produced a result.",
    "arm over first": lambda v, c: f"{_who(v)}{v['name']} over {v['first']}: {describe(c)}.",
    "bf16 in the recipe": lambda v, c: (
        f"{v['workload']}: {v['dtype']} on top of the fixes (the paper's recipe over all the fixes in fp32): "
        f"{describe(c)}; set beside the fixes' own ratio above, this says how much of the recipe is {v['dtype']}'s."),
    # stages.climb: a rung skipped, torch.compile's rung, each rung after its ladder's name, the top
    "rung skipped": lambda v, c: f"{v['rung']}: skipped: {v['reason']}.",
    "compile no result": lambda v, c: (f"{v.get('rung', 'runtime: torch.compile')}: no result to compare; not "
                                       "carried up the ladder."),
    "compile no time": lambda v, c: (f"{v.get('rung', 'runtime: torch.compile')}: its run recorded no compile time; "
                                     "not carried up the ladder."),
    "compile unconfirmed": lambda v, c: (f"{_compiled(v)}; not confirmed (its screening produced no comparison); not "
                                         "carried up the ladder."),
    "compile not faster": lambda v, c: (f"{_compiled(v)}; against {v.get('against', 'eager')} in fresh rounds: "
                                        f"{describe(c)}; not carried up the ladder."),
    "compile pays": _compile_pays,
    "climb rung": _climb_rung,
    "climb kept defaults": lambda v, c: (f"{v['ladder']}: no rung was confirmed faster; PyTorch's defaults stay the "
                                         "best configuration measured."),
    "climb top": _climb_top,
    # ProfileDNN (profiledn/*, stages/profiling.py)
    # profiledn.breakdown.findings: one oneDNN log (after its profile's label, where given)
    "log empty": lambda v, c: f"{_who(v)}The log holds no executed primitive.",
    "log total": _log_total,
    "log directions": lambda v, c: f"{_who(v)}By direction: " + ", ".join(
        f"{DIRECTION_WORDS.get(d, d.replace('_', ' '))} {share:.0%} ({_calls(calls, v.get('steps'))})"
        for d, share, calls in v["directions"]) + ".",
    "log reorders": _log_reorders,
    "log reference kernels": lambda v, c: (
        f"{_who(v)}Reference (unoptimised) implementations run {v['executions']} times ({v['share']:.0%} of the time): "
        f"{', '.join(v['kinds'])}."),
    # profiledn.breakdown.compare_findings: two logs (``labels``) side by side
    "logs onednn time": _logs_time,
    "logs one run only": lambda v, c: f"{_primitive(v)} runs only in {v['only_in']} ({v['calls']} calls).",
    "logs calls": lambda v, c: f"{_primitive(v)}: {v['calls'][0]} calls vs {v['calls'][1]}.",
    "logs share moved": lambda v, c: (f"{_primitive(v)}: share of oneDNN time {v['shares'][0]:.0%} -> "
                                      f"{v['shares'][1]:.0%}."),
    "logs heaviest implementation": lambda v, c: (
        f"The heaviest implementation changed: {v['implementations'][0]} ({v['shares'][0]:.0%} of oneDNN time) in "
        f"{v['labels'][0]}, {v['implementations'][1]} ({v['shares'][1]:.0%}) in {v['labels'][1]}."),
    "logs distinct primitives": lambda v, c: (
        f"Distinct primitives: {v['distinct'][0]} in {v['labels'][0]}, {v['distinct'][1]} in {v['labels'][1]}, "
        f"{v['both']} in both."),
    # profiledn.capture: the profiles (their workload is the profile's label), and a comparison of two
    "profile failed": lambda v, c: f"{v['workload']}: not profiled ({v['reason']}).",
    "profile coverage": _profile_coverage,
    "profile logged faster": lambda v, c: (
        f"{v['workload']}: the logged run's step ({_ms(v['traced_step_ms'])}) was faster than the plain run's "
        f"({_ms(v['step_ms'])}), though logging only adds work: in one run each the machine's noise outweighed "
        "the log's cost, and the efficiency ratio (over the plain step) is uncertain by as much."),
    "profile outside onednn": lambda v, c: (
        f"For {', '.join(v['profiles'])} most of the step runs outside oneDNN (GEMMs through MKL, PyTorch's own "
        "kernels): the oneDNN log alone does not explain it; the framework profiler trace does."),
    "profile comparison": lambda v, c: (
        f"{'' if v['labels'][0].startswith(v['workload']) else v['workload'] + ', '}{v['labels'][0]} vs "
        f"{v['labels'][1]}: measured step {_ms(v['step_ms'][0])} vs "
        f"{_ms(v['step_ms'][1])} (the second's speed over the first's: {v['step_ms'][0] / v['step_ms'][1]:.2f}x, in "
        "one run each; the optimisation "
        "notebooks measure it with repeats)."),
    "profile comparison note": lambda v, c: v["note"],  # why the pair is worth reading, as variant_pairs says it
    # profiledn.replay.projection_findings: the log's primitives replayed in isolation
    "projection kernels": lambda v, c: (
        f"{_who(v)}oneDNN primitives replayed in isolation take {_ms(v['kernel_ms_per_step'])} per step "
        f"({v['replayed']} distinct primitives replayed"
        + (f", {v['not_replayed']} counted at logged time)." if v["not_replayed"] else ", every one of the log's).")),
    "projection against log": _replay_against_log,
    "projection efficiency": _projection_efficiency,
    "projection not replayed": lambda v, c: (f"{_who(v)}not replayed: {', '.join(v['kinds'])} "
                                             f"({_ms(v['ms_per_step'])} per step at logged time)."),
    # profiledn.trace.trace_findings: a torch.profiler trace of the timed steps
    "trace top operators": lambda v, c: f"{_who(v)}top operators by self CPU time: " + ", ".join(
        f"{name} {share:.0%}" for name, share in v["operators"]) + ".",
    "trace outside onednn": lambda v, c: (f"{_who(v)}{v['share']:.0%} of self CPU time is in operators that do not "
                                          "call oneDNN."),
    "trace spans": lambda v, c: (
        f"{_who(v)}{v['ops_per_step']:.0f} operator spans per step ({v['ops_per_ms']:.1f} per ms), median "
        f"{v['median_span_us']:.0f} µs; {v['short_span_share']:.0%} are shorter than 10 µs."),
    "trace fragmented": lambda v, c: (f"{_who(v)}with spans this short (the line above), dispatching them may cost "
                                      "much: `cpuopt profile --whole-step` measures that cost as the time between "
                                      "operators; where it is large, fusing operators (a compiled graph or a custom "
                                      "kernel) may pay."),
    "trace loss": lambda v, c: (
        f"{_who(v)}the loss (all its terms), as it ran inside the traced step: forward "
        f"{_ms(v['loss_forward_ms'])} a step, backward {_ms(v['loss_backward_ms'])}, {v['loss_backward_share']:.1%} of "
        f"the {_ms(v['backward_ms'])} of backward nodes (autograd sequence numbers in the trace of the real step)."),
    # profiledn.wholestep.wholestep_findings: every operator of a traced step against its ceiling
    "whole step count unknown": lambda v, c: (
        f"{_who(v)}the trace does not say how many steps it holds (no FILE.ops.json beside it, no Optimizer.step "
        "annotation): every time below is for the whole trace, not per step."),
    "whole step coverage": _whole_step_coverage,
    "whole step projection": _whole_step_projection,
    "whole step between ops": lambda v, c: (
        f"{_who(v)}of the {_ms(sum(v['between_ops_ms'].values()))} a step between operators, "
        f"{_shares(v['between_ops_ms'])}: most of it leads to "
        f"{_PHASE_WORDS[max(v['between_ops_ms'], key=v['between_ops_ms'].get)]}."),
    "whole step gemm": _whole_step_gemm,
    # profiledn.account: a traced step by phase; fullstudy: RetinaNet at the full preset
    "forward backward": _forward_backward,
    "kernel time": _kernel_time,
    "kernel share": lambda v, c: (  # stages.allocator.kernel_findings
        f"{_who(v)}the OS kernel's share of the timed steps' CPU time (system time; page faults a step): " + "; ".join(
            f"{name} {share:.0%} ({faults:,.0f})"
            for name, share, faults in v["settings"])
        + ". Memory an allocator hands back to the OS is faulted in again, page by page, at its next use."),
    "allocator tried": _allocator_tried,
    "allocator not tried": lambda v, c: (
        f"{_who(v)}the top under {v['allocator']}, which keeps freed memory, was not tried: its paired rounds and "
        f"profile need about {v['need_min']:.0f} min, and {v['left_min']:.0f} min of the study's budget were left "
        f"(`make case-study PRESET=full BUDGET_MIN=N`). That comparison alone: `{v['command']}`."),
    "next fix": _next_fix,
    "next fix tried": _next_fix_tried,
    "full preset top": _full_preset_top,
    "whole step above ceiling": _above_ceiling,
    # stages.profiling.slow_kernels: the implementations that take the most oneDNN time
    "no primitive ran": lambda v, c: "No oneDNN primitive ran.",
    "slowest kernels": lambda v, c: "Slowest kernels: " + "; ".join(
        f"{kind} {impl} {share:.0%} ({calls} calls)" for kind, impl, share, calls in v["kernels"]) + ".",
}


def render(finding) -> str:
    """The finding's sentence (``finding``: a ``decisions.Finding``)."""
    try:
        template = TEMPLATES[finding.kind]
    except KeyError:
        raise ValueError(f"no sentence for findings of kind {finding.kind!r}; add one to wording.TEMPLATES") from None
    return template({"workload": finding.workload, **finding.values}, finding.comparison)


def describe(comparison) -> str:
    """A comparison in the rule's words (a ``decisions.Comparison`` or the rule's dict)."""
    return compare.describe(comparison if isinstance(comparison, dict) or comparison is None else comparison.to_dict())
