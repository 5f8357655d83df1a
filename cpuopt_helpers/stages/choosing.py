"""Shared by the stages: the table of settings against a base (ratios paired by round),
the choice of a winner through compare.py, and the small config helpers.
"""

from __future__ import annotations

import math

import pandas as pd

from cpuopt_helpers import compare, stats
from cpuopt_helpers.config import RunConfig, setting_hash, setting_label
from cpuopt_helpers.decisions import Choice, Finding, Plan, as_comparison


def unique(configs: list[RunConfig]) -> list[RunConfig]:
    """Drop configurations that measure the same thing (same hash), keeping the first."""
    seen, out = set(), []
    for c in configs:
        if c.config_hash() not in seen:
            seen.add(c.config_hash())
            out.append(c)
    return out


def with_options(config: RunConfig, **options) -> RunConfig:
    """The config with these workload options added to the ones it has."""
    return config.replace(options=dict(config.options) | {k: str(v) for k, v in options.items()})


PHASES = ("forward", "backward", "optimizer")


def throughput_table(results: list[dict]) -> pd.DataFrame:
    """One row per workload: median samples/s over runs with their range (low-high; a few
    runs give no honest interval of their own), median step and phase times, achieved
    GFLOP/s, the kernel's share of CPU time and page faults a step (``kernel_medians``), the
    spread warning, and how many of its runs timed out or crashed (``failed``)."""
    rows, failed = {}, {}
    for r in results:
        workload = r["config"]["workload"]
        if r["status"] == "ok":
            rows.setdefault(workload, []).append(r)
        else:
            failed[workload] = failed.get(workload, 0) + 1
    out = []
    for workload, runs in rows.items():
        sps = [r["samples_per_s"] for r in runs]
        step = stats.summarize([r["step_ms"]["median"] for r in runs])["median"]
        row = {"workload": workload, "samples_per_s": stats.summarize(sps)["median"], "low": min(sps),
               "high": max(sps), "runs": len(runs), "failed": failed.get(workload, 0), "step_ms": step,
               "gflops": (stats.summarize([r["achieved_gflops"] for r in runs])["median"]  # uncounted: unknown, not 0
                          if all(r["achieved_gflops"] for r in runs) else math.nan),
               "startup_s": stats.summarize([r["startup_s"] for r in runs])["median"],
               "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
               "warning": stats.spread_warning(sps, f"{workload} samples/s")} | kernel_medians(runs) | run_shape(runs)
        for phase in PHASES:
            row[f"{phase}_ms"] = stats.summarize([r["phase_ms"][phase] for r in runs])["median"]
        timed = sum(row[f"{p}_ms"] for p in PHASES)
        for phase in PHASES:
            row[f"{phase}_share"] = row[f"{phase}_ms"] / step
        row["other_share"] = max(0.0, 1 - timed / step)
        out.append(row)
    return pd.DataFrame(out).set_index("workload") if out else pd.DataFrame()


def samples_a_step(result: dict) -> int | None:
    """The samples one step of a run trains, over its instances (or DDP's ranks); None without instances."""
    sizes = [i.get("batch_size") for i in result.get("instances") or []]
    return sum(sizes) if sizes and None not in sizes else None


def run_shape(runs: list[dict]) -> dict:
    """What one run timed: ``batch`` (samples a step, over its instances), ``timed_steps`` and ``warmup_steps``
    (the most any of the runs took: warm-up goes on until steps settle); None where the results do not say."""
    def most(values):
        values = [v for v in values if v is not None]
        return max(values) if values else None
    return {"batch": most(samples_a_step(r) for r in runs),
            "timed_steps": most(r.get("config", {}).get("steps") for r in runs),
            "warmup_steps": most(r.get("warmup_steps") for r in runs)}


def failures(results: list[dict]) -> list[str]:
    return [f"{r['label']}: {r['status']}: {r['reason'].splitlines()[0] if r['reason'] else ''}"
            for r in results if r["status"] != "ok"]


# Numerics and memory guard every choice. With the same seed and the same batch, a setting that
# leaves the arithmetic alone trains along the baseline's loss curve; one that changes it (bf16,
# compile, fused optimizers, IPEX, another torch) may drift. A setting is handed on only if its
# loss, averaged over the steps both ran (warm-up included), lies within LOSS_TOLERANCE of the
# baseline's (relative; LOSS_FLOOR keeps losses near zero from counting every wobble). A setting
# that raises peak memory by more than MEMORY_WARNING says so beside its speed.
LOSS_TOLERANCE = 0.10
LOSS_FLOOR = 0.05
MEMORY_WARNING = 1.20


def common_steps(results: list[dict]) -> int:
    """How many steps every ok run recorded a loss for (0 where a run recorded none)."""
    lengths = [len(r.get("losses") or []) for r in results if r["status"] == "ok"]
    return min(lengths) if lengths else 0


def mean_loss(runs: list[dict], steps: int) -> float | None:
    """The arm's loss: the median over runs of each run's mean loss over its first ``steps`` steps."""
    if not steps or any(not r.get("losses") for r in runs):
        return None
    return stats.summarize([sum(r["losses"][:steps]) / steps for r in runs])["median"]


def loss_drift(loss: float | None, base_loss: float | None) -> float | None:
    """How far an arm's loss lies from the baseline's, as a share of it (None: not recorded;
    infinite where the arm's loss is NaN or infinite and the baseline's is not)."""
    if loss is None or base_loss is None:
        return None
    if not math.isfinite(loss):
        return math.inf if math.isfinite(base_loss) else None
    return abs(loss - base_loss) / max(abs(base_loss), LOSS_FLOOR)


HOW_IT_FAILED = {"failed": "crashed", "timeout": "timed out", "unsupported": "no kernel on this CPU"}


def failed_rows(failed: dict[tuple, list[dict]], keys, baseline: dict) -> list[dict]:
    """A row for each arm none of whose runs finished, so that a table shows it, with why."""
    rows = []
    for key in [k for k in failed if k not in keys]:
        runs = failed[key]
        how = sorted({HOW_IT_FAILED.get(r["status"], r["status"]) for r in runs})
        rows.append({"setting": setting_label(runs[0]["config"], baseline), "samples_per_s": math.nan, "runs": 0,
                     "failed": len(runs), "verdict": f"no result: {', '.join(how)}", "arm": key[1],
                     "config_hash": runs[0]["config_hash"], "config": runs[0]["config"], "fell_back": False,
                     "is_baseline": False})
    return rows


def kernel_medians(runs: list[dict]) -> dict:
    """The kernel's share of the timed steps' CPU time and the page faults a step (``launch.kernel_time``),
    medians over runs; NaN where a run did not say (a worker that read no CPU time)."""
    keys = ("system_share", "page_faults_per_step")
    if not runs or any(r.get(k) is None for r in runs for k in keys):
        return dict.fromkeys(keys, math.nan)
    return {k: stats.summarize([r[k] for r in runs])["median"] for k in keys}


def compare_configs(results: list[dict], baseline: dict, workload: str | None = None) -> pd.DataFrame:
    """One row per arm of a sweep: median samples/s with the range over rounds, peak RSS,
    and the ratio to the baseline arm paired round by round (``compare.paired_ratio``:
    ``ratio_low``/``ratio_high`` are its interval, NaN below the minimum rounds). ``failed``
    counts an arm's runs that timed out or crashed (its numbers are its finished runs'); an
    arm none of whose runs finished has a row of its own, its verdict saying how it failed."""
    groups: dict[tuple, list[dict]] = {}
    failed: dict[tuple, list[dict]] = {}
    for r in results:
        if workload is None or r["config"]["workload"] == workload:
            (groups if r["status"] == "ok" else failed).setdefault((r.get("sweep"), r.get("arm", 0)), []).append(r)
    wanted = setting_hash(baseline)
    base_key = next((k for k, rs in sorted(groups.items(), key=lambda kv: kv[0][1])
                     if setting_hash(rs[0]["config"]) == wanted), None)
    base_by_round = {(r.get("sweep"), r["round"]): r["samples_per_s"] for r in groups.get(base_key, [])}
    steps = common_steps([r for rs in groups.values() for r in rs])
    base_loss = mean_loss(groups.get(base_key, []), steps)
    base_rss = stats.summarize([r["peak_rss_mb"] for r in groups[base_key]])["median"] if base_key in groups else None
    rows = []
    for key, runs in groups.items():
        sps = [r["samples_per_s"] for r in runs]
        row = {"setting": "baseline" if key == base_key else setting_label(runs[0]["config"], baseline),
               "samples_per_s": stats.summarize(sps)["median"], "low": min(sps), "high": max(sps), "runs": len(runs),
               "peak_rss_mb": stats.summarize([r["peak_rss_mb"] for r in runs])["median"],
               "config_hash": runs[0]["config_hash"], "arm": key[1], "config": runs[0]["config"],
               "failed": len(failed.get(key, [])), **kernel_medians(runs)}
        same_data = all(runs[0]["config"].get(k) == baseline.get(k) for k in ("loader_workers", "batch_size", "instances"))
        loss = mean_loss(runs, steps)
        row.update(loss=loss,  # other batches (a DataLoader's, other sizes): not comparable
                   loss_drift=loss_drift(loss, base_loss) if same_data else None,
                   rss_ratio=row["peak_rss_mb"] / base_rss if base_rss else None)
        pairs = [(base_by_round[(r.get("sweep"), r["round"])], r["samples_per_s"]) for r in runs
                 if (r.get("sweep"), r["round"]) in base_by_round]
        if pairs and key != base_key:
            ratio = dict(compare.paired_ratio([a for a, _ in pairs], [b for _, b in pairs]), screened=True)
            screened = ratio["verdict"] == "too few rounds"  # ranks, decides nothing: said so in the table
            row.update(ratio=ratio["ratio"], ratio_low=ratio["ci_low"], ratio_high=ratio["ci_high"], comparison=ratio,
                       verdict=f"screened, {ratio['n']} round{'s' * (ratio['n'] != 1)}" if screened else ratio["verdict"])
        elif key == base_key:
            row.update(ratio=1.0, verdict="the reference")  # every ratio is over it: no verdict of its own
        if key != base_key and setting_hash(runs[0]["config"]) == wanted:
            row["setting"] = "baseline (repeat arm)"
        fell = list({f["what"]: f for r in runs for f in r.get("fallbacks") or []}.values())
        if fell:  # it measured something other than it was asked to: said in its name, never a candidate
            row["setting"] += "".join(f" ({f['what']} fell back to {f['fell_back_to']}: {f['reason'][:80]})"
                                      for f in fell)
        row["fell_back"] = bool(fell)
        row["is_baseline"] = key == base_key
        rows.append(row)
    table = pd.DataFrame(rows + failed_rows(failed, groups, baseline))
    return table.sort_values("samples_per_s", ascending=False).reset_index(drop=True) if len(table) else table


def settings_table(results: list[dict], plan: Plan) -> pd.DataFrame:
    """``compare_configs`` of a plan's workload against its base (a stage's ``table``)."""
    return compare_configs(results, plan.base.to_dict(), plan.workload)


def in_words(table: pd.DataFrame, words: dict[str, str], digits: int = 3) -> pd.DataFrame:
    """A table as a notebook shows it: rounded, and each named column's missing cells (None, NaN)
    said in its words ("not compiled", "not reached") rather than left blank or NaN."""
    named = [c for c in words if c in table]
    shown = table.round(digits).astype({c: object for c in named})
    return shown.fillna({c: words[c] for c in named})


def screened_only(workload: str, stage: str, rows: list[dict]) -> list[Finding]:
    """Settings a screening ranked without a verdict (fewer rounds than a verdict needs): one
    record for all of them, with their ratios, not a "too few rounds" sentence each."""
    if not rows:
        return []
    return [Finding(workload, stage, "screened only", {
        "settings": [r["setting"] for r in rows], "rounds": max(int(r["comparison"]["n"]) for r in rows),
        "ratios": [math.nan if r["comparison"].get("ratio") is None else float(r["comparison"]["ratio"])
                   for r in rows],
        "min_rounds": int(rows[0]["comparison"].get("min_rounds", compare.MIN_ROUNDS))})]


def is_screened(row) -> bool:
    """A table row whose comparison with the baseline ranks but decides nothing (too few rounds)."""
    return isinstance(row.get("comparison"), dict) and row["comparison"].get("verdict") == "too few rounds"


def choose(table: pd.DataFrame, what: str, confirm=None, candidates: pd.DataFrame | None = None,
           screen_gate: bool = True, incumbent: RunConfig | None = None, incumbent_name: str = "the baseline",
           stage: str = "", workload: str | None = None) -> Choice:
    """The configuration to hand on, the comparison behind it and why (a ``decisions.Choice``).

    The incumbent is the table's baseline row (found by configuration, ``compare_configs``), or
    the row of ``incumbent`` where given. Screening ranks the other settings (highest paired
    ratio to it); picking the best of several is a selection, so the winner is confirmed
    against the incumbent in fresh, adaptive rounds (``confirm(incumbent, winner) -> compare
    result``, e.g. ``Session.confirm``) and handed on only on the verdict ``faster``; with
    ``screen_gate`` False the best is confirmed even where one screening round put it below the
    incumbent (a ladder of one candidate a rung, where a single noisy round would otherwise
    decide). A setting whose loss drifted from the incumbent's beyond LOSS_TOLERANCE is no
    candidate; the finding names it, and the winner's peak memory where it grew by more than
    MEMORY_WARNING. ``incumbent_name`` is how the sentences call the incumbent; ``workload``
    what the finding is of (default: the table's workload, else ``what``).
    """
    values = {"what": what, "incumbent": incumbent_name, "tolerance": LOSS_TOLERANCE}
    workload = workload or (str(table["config"].iloc[0]["workload"]) if len(table) and "config" in table else what)

    def decided(config, kind, comparison=None, **more) -> Choice:
        comparison = as_comparison(comparison)
        finding = Finding(workload, stage, kind, dict(values, **more), comparison)
        return Choice(RunConfig.from_dict(config) if config is not None else None, comparison, finding)

    if table.empty:
        return decided(None, "no result")
    if incumbent is not None:
        base = table[table["config_hash"].map(lambda h: h == incumbent.config_hash())]
    else:
        base = table[table["is_baseline"]] if "is_baseline" in table else table.iloc[0:0]
    pool = table if candidates is None else candidates  # rows of the table: the incumbent's index is theirs
    others = pool[pool.index != (base.index[0] if len(base) else None)]
    others = others.dropna(subset=["ratio"]) if "ratio" in others else others.iloc[0:0]
    if base.empty:
        return decided(None, "no baseline")
    base = base.iloc[0]
    if others.empty:
        return decided(base["config"], "no other")
    drift = pd.to_numeric(others.get("loss_drift", pd.Series(index=others.index, dtype=float)), errors="coerce")
    drifted = drift > LOSS_TOLERANCE  # not recorded (NaN): not judged
    values["excluded"] = [[r["setting"], float(d) if math.isfinite(d) else None]
                          for (_, r), d in zip(others[drifted].iterrows(), drift[drifted])]
    others = others[~drifted]
    fell = others.get("fell_back", pd.Series(False, index=others.index)).fillna(False).astype(bool)
    values["fell_back"] = list(others[fell]["setting"])
    others = others[~fell]
    if others.empty:
        return decided(base["config"], "all drifted")
    best = others.sort_values("ratio", ascending=False).iloc[0]
    grew = best.get("rss_ratio") is not None and best["rss_ratio"] > MEMORY_WARNING
    values.update(setting=best["setting"], ratio=float(best["ratio"]), runs=int(best["runs"]),
                  rss_growth=float(best["rss_ratio"] - 1) if grew else None, config_hash=best["config_hash"])
    if best["ratio"] <= 1.0 and screen_gate:
        return decided(base["config"], "not beaten")
    if confirm is None:
        return decided(base["config"], "not confirmed")
    result = confirm(RunConfig.from_dict(base["config"]), RunConfig.from_dict(best["config"]))
    return decided(best["config"] if compare.pays(result) else base["config"], "confirmed", result)


def paired(results: list[dict], a: str, b: str) -> dict | None:
    """Throughput of config b over config a (hashes), paired by the rounds of their sweep (screening
    rounds: ``screened``, so that too few of them read "screened only", not a cut-short confirmation)."""
    by = {h: {(r.get("sweep"), r["round"]): r["samples_per_s"] for r in results
              if r["status"] == "ok" and r["config_hash"] == h} for h in (a, b)}
    rounds = sorted(set(by[a]) & set(by[b]), key=str)
    if not rounds:
        return None
    return dict(compare.paired_ratio([by[a][k] for k in rounds], [by[b][k] for k in rounds]), screened=True)


def paired_steps(results: list[dict], a: str, b: str) -> tuple[float, float] | None:
    """The mean step (ms) of configs a and b (hashes) over the rounds ``paired`` pairs, each the median over
    those rounds: the step times its ratio is made of (a run's median step can differ from its mean). A run's
    mean step is ``samples_a_step`` over its samples/s; None where a paired run has no instances to read
    them from."""
    by = {h: {(r.get("sweep"), r["round"]): r for r in results if r["status"] == "ok" and r["config_hash"] == h}
          for h in (a, b)}
    rounds = set(by[a]) & set(by[b])
    runs = {h: [by[h][k] for k in rounds] for h in (a, b)}
    if not rounds or any(samples_a_step(r) is None for h in (a, b) for r in runs[h]):
        return None
    return tuple(stats.summarize([1e3 * samples_a_step(r) / r["samples_per_s"] for r in runs[h]])["median"]
                 for h in (a, b))


def named_table(results: list[dict], configs: dict) -> pd.DataFrame:
    """compare_configs against the first named config, with a `name` column, in the given order."""
    names = {c.config_hash(): n for n, c in configs.items()}
    first = next(iter(configs.values()))
    table = compare_configs([r for r in results if r["config_hash"] in names], first.to_dict(), first.workload)
    if table.empty:
        return table
    table.insert(0, "name", table["config_hash"].map(names))
    for key in ("compile_s", "compile_warm_s"):  # cold (fresh Inductor cache) and warm compile times
        times: dict[str, list[float]] = {}
        for r in results:
            if r["status"] == "ok" and r.get(key) and r["config_hash"] in names:
                times.setdefault(r["config_hash"], []).append(r[key])
        table[key] = table["config_hash"].map(lambda h: stats.summarize(times[h])["median"] if h in times else None)
    table["step_ms"] = [None] * len(table)
    for i, h in enumerate(table["config_hash"]):
        steps = [r["step_ms"]["median"] for r in results if r["status"] == "ok" and r["config_hash"] == h]
        table.at[i, "step_ms"] = stats.summarize(steps)["median"] if steps else None
    order = {n: i for i, n in enumerate(configs)}
    return table.sort_values("name", key=lambda s: s.map(order)).reset_index(drop=True)
