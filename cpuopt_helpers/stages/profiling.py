"""Stage 02, profiling (ProfileDNN): where does the step's time go in oneDNN, and how fast
could its kernels run? The runs a profile needs (a plain run, a logged run, a trace) and the
paper's comparisons (channels-last, IPEX, bf16) are made here, through the session; parsing,
breakdown and projection live in profiledn/.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.decisions import Finding
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.profiledn import wholestep
from cpuopt_helpers.profiledn.breakdown import STAGE
from cpuopt_helpers.profiledn.capture import Comparison, Profile, safe_name
from cpuopt_helpers.profiledn.parse import parse_log
from cpuopt_helpers.profiledn.replay import project_log
from cpuopt_helpers.profiledn.trace import summarize_trace


def slow_kernels(df: pd.DataFrame, top: int = 5, workload: str = "", stage: str = STAGE) -> list[Finding]:
    """The implementations that take the most oneDNN time, with their ISA: names the slow kernels
    (``workload``: whose log, kept on the record; ``stage``: the notebook's that tells it)."""
    if df.empty:
        return [Finding(workload, stage, "no primitive ran")]
    by_impl = df.groupby(["kind", "impl"])["time_ms"].agg(["sum", "count"]).sort_values("sum", ascending=False)
    total = by_impl["sum"].sum()
    kernels = [[kind, impl, float(row["sum"] / total), int(row["count"])]
               for (kind, impl), row in by_impl.head(top).iterrows()]
    return [Finding(workload, stage, "slowest kernels", {"kernels": kernels})]


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


VARIANTS = ("channels-last", "IPEX", "bf16")
SLOW_BF16_STEPS, SLOW_BF16_REPEATS = 3, 2  # bf16 without a fast path: enough to see its kernels


def unasked(variant: str) -> dict:
    """A comparison no workload was named for, as ``variant_pairs`` leaves one out: with the parameter that asks."""
    parameter = f"COMPARE_{variant.upper().replace('-', '_')}"
    return {"workload": "", "variant": variant, "skip": f"{variant}: not compared in this run ({parameter} names no "
            f"workload; papermill's -p {parameter} cnn asks for it)"}


def variant_pairs(profiles: list[Profile], workloads: dict[str, list[str]], ipex: dict, bf16: dict,
                  slow_bf16: bool = True) -> list[dict]:
    """The paper's comparisons, planned: for each variant (``VARIANTS``) and each workload named
    in ``workloads[variant]``, the reference and the variant's config, or why it is left out.

    - channels-last: the profile above against the same config in NHWC;
    - IPEX: torch 2.8 stock against torch 2.8 + ``ipex.optimize``, both in the IPEX runtime
      (one oneDNN build, so what differs is IPEX's); where the runtime is built (``ipex``:
      ``runtimes.ipex_facts()``);
    - bf16: the profile above (fp32) against bf16 autocast; where the CPU has no bf16 fast
      path (``bf16``: the gate) it still runs, and the log shows the kernels that serve it, over
      ``SLOW_BF16_STEPS`` timed steps with ``SLOW_BF16_REPEATS`` replay repeats a primitive (a
      comparison per step: it runs many times slower than fp32 there); unless ``slow_bf16`` is
      False (``make run``'s standard preset), which leaves it out, saying so.
    """
    unknown = set(workloads) - set(VARIANTS)
    if unknown:
        raise CpuoptError(f"unknown comparison(s) {', '.join(sorted(unknown))}; use some of {', '.join(VARIANTS)}")
    done = {p.label: p for p in profiles}
    pairs = []
    for variant in VARIANTS:
        if not workloads.get(variant):  # asked for none: said, so a pair the text promises is not missing unsaid
            pairs.append(unasked(variant))
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
            elif bf16.get("accelerated"):
                pairs.append({"workload": w, "variant": variant, "base": base, "labels": ("fp32", "bf16"),
                              "other": config.replace(dtype="bf16"),
                              "note": f"bf16 has a fast path here: {bf16.get('reason', '')}"})
            elif not slow_bf16:
                pairs.append({"workload": w, "variant": variant, "skip": f"{w}: not compared in bf16: this CPU has "
                              f"no bf16 fast path ({bf16.get('reason') or 'the gate found none'}); the full preset "
                              "profiles its slow kernels anyway (SLOW_BF16 = True)"})
            else:
                slow = config.replace(dtype="bf16", steps=min(config.steps, SLOW_BF16_STEPS), warmup=min(config.warmup, 1))
                pairs.append({"workload": w, "variant": variant, "base": base, "labels": ("fp32", "bf16"),
                              "other": slow, "repeats": SLOW_BF16_REPEATS,
                              "note": f"bf16 has no fast path here, so expect reference or emulated kernels "
                                      f"({bf16.get('reason', '')}); profiled over {slow.steps} timed steps with "
                                      f"{SLOW_BF16_REPEATS} replay repeats a primitive, compared per step."})
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
        other = profile_workload(session, pair["other"], log_dir, label=f"{w} {lb}",
                                 repeats=min(repeats, pair.get("repeats", repeats)))
        comparison = Comparison(base, other, (la, lb), pair["note"])
        if comparison.ok:
            comparisons.append(comparison)
        else:
            failed = next(p for p in (base, other) if not p.ok)
            why = (failed.traced.get("reason") or failed.plain.get("reason") or "no log").strip().splitlines()
            notes.append(f"{w}: {la} vs {lb} not compared: {failed.label} failed: {why[-1][:200] if why else ''}")
    return comparisons, notes
