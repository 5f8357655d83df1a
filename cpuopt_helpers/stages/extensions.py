"""Stage 05, runtime: IPEX (in its own torch 2.8 runtime) against this torch's upstream
replacements (torch.compile, channels-last, foreach/fused optimizers).
"""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers.config import RunConfig, normalise, setting_label
from cpuopt_helpers.decisions import Choice, Finding, Plan, as_comparison
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.stages import choosing
from cpuopt_helpers.stages.choosing import paired
from cpuopt_helpers.system import Facts

OPTIMIZER_ARMS = ("SGD foreach", "SGD fused", "AdamW (default)", "AdamW fused")
DRIFT_TOLERANCE = 0.10  # how far zentorch's loss may lie from the eager run's and it still trains the same
NOTHING_COMPILED_S = 1.0  # a cold compile faster than this generated no kernel (Inductor's C++ alone takes seconds)


ZENTORCH = "torch.compile (zentorch)"
IPEX, IPEX_STOCK = "torch 2.8 + IPEX", "torch 2.8 (stock)"  # the IPEX runtime's two arms
EXTENSION_FACT = "vendor_extension/findings"  # what notebook 05 measured of the vendor's extension (`cpuopt doctor`)


def extension_findings(table: pd.DataFrame, plan: Plan, results: list[dict], zentorch: dict,
                       ipex_confirmed: dict | None = None) -> list[Finding]:
    """What notebook 05 measured of a vendor's extension, for `cpuopt doctor`: IPEX against its
    own torch, and zentorch against stock eager and Inductor, its loss, or why it was not measured."""
    return ipex_own_findings(results, plan, ipex_confirmed) + zentorch_findings(table, plan, results, zentorch)


def _note(workload: str, kind: str, comparison=None, **values) -> Finding:
    return Finding(workload, "extensions", kind, values, as_comparison(comparison))


def ipex_own_findings(results: list[dict], plan: Plan, confirmed: dict | None = None) -> list[Finding]:
    """IPEX against the stock torch 2.8 it runs in: ``confirmed`` (``confirm_ipex``'s fresh rounds)
    where given, else the screening rounds (empty where the IPEX runtime was not measured)."""
    configs, workload = plan.named, plan.workload
    if IPEX not in configs:
        return []
    h = {n: c.config_hash() for n, c in configs.items()}
    return [_note(workload, "ipex over its torch", confirmed or paired(results, h[IPEX_STOCK], h[IPEX]),
                  confirmed=bool(confirmed))]


def confirm_ipex(session, table: pd.DataFrame, plan: Plan, min_rounds: int, max_rounds: int,
                 budget_min: float | None = None, resume: bool = True) -> dict | None:
    """Notebook 05's question, answered by the comparison rule: IPEX against the stock torch 2.8
    it runs in, in fresh paired rounds (``session.confirm``, tagged ``05_ipex/ipex``). None where
    the IPEX runtime was not measured, or either arm produced no screening result."""
    if IPEX not in plan.named:
        return None
    rows = [plan.row(table, name) for name in (IPEX_STOCK, IPEX)]
    if any(row.empty or pd.isna(row.iloc[0]["samples_per_s"]) for row in rows):
        return None
    return session.confirm(plan.named[IPEX_STOCK], plan.named[IPEX], "05_ipex/ipex", min_rounds, max_rounds,
                           budget_min, resume)


def handed_on_over_ipex(session, table: pd.DataFrame, plan: Plan, choice: Choice, min_rounds: int,
                        max_rounds: int, budget_min: float | None = None, resume: bool = True) -> list[Finding]:
    """The question's other half, answered by the comparison rule: this torch as notebook 05
    hands it on (``choice``: its fastest confirmed eager setting, or stock where nothing beat
    it) against torch 2.8 + IPEX, in fresh paired rounds. Empty where IPEX was not measured or
    produced no screening result, or nothing is handed on."""
    if IPEX not in plan.named or choice.config is None:
        return []
    row = plan.row(table, IPEX)
    if row.empty or pd.isna(row.iloc[0]["samples_per_s"]):
        return []
    stock = plan.named["torch (stock)"]
    result = session.confirm(plan.named[IPEX], choice.config, "05_ipex/ipex", min_rounds, max_rounds, budget_min,
                             resume)
    setting = setting_label(choice.config.to_dict(), stock.to_dict()) if choice.changed else ""
    return [_note(plan.workload, "handed on over ipex", result, setting=setting)]


def runtimes_measured(ipex: dict, zentorch: dict, asked) -> tuple[bool, list[str]]:
    """Whether zentorch is measured (``asked``: "auto", on an AMD CPU where it fits this torch;
    True; False), and what notebook 05 says of both vendors' extensions before it measures."""
    use = zentorch["usable"] and (zentorch["amd"] if asked == "auto" else bool(asked))
    lines = [f"IPEX runtime: {ipex['path']}: torch {ipex['torch']}, IPEX {ipex['ipex']}, ISA {ipex.get('ipex_isa')}"
             if ipex["available"] else f"IPEX runtime skipped: {ipex['reason']}; the torch 2.8 and IPEX rows are left out"]
    if asked is True and not zentorch["usable"]:
        lines.append(f"zentorch asked for (ZENTORCH = True) but it cannot run: {zentorch['reason']}")
    if use:
        lines.append(f"zentorch: measured: {zentorch['version']}")
    elif zentorch["usable"] and not zentorch["reason"]:  # installed, and left out by the notebook's parameter (the standard preset's choice)
        lines.append(f"zentorch: {zentorch['version']} installed, not measured here (ZENTORCH = {asked!r})")
    else:
        lines.append(f"zentorch: {zentorch['reason']}")
    return use, lines


def configs(base: RunConfig, facts: Facts, image_like: bool = True, ipex_available: bool = False,
            compile_modes: tuple[str, ...] = ("default", "max-autotune"),
            optimizers: tuple[str, ...] = OPTIMIZER_ARMS, zentorch: bool = False) -> Plan:
    """Notebook 05: stock torch 2.8, torch 2.8 + IPEX, stock torch (this venv), and this
    torch's upstream replacements for what IPEX did, all on the same base setting.

    The arms are named, the first being the stock runtime every ratio is taken against.
    The AdamW pair measures the fused optimizer where it matters most (SGD's update is
    one multiply-add per weight).
    """
    base = normalise(base, facts.physical_cores).replace(runtime="main", ipex=False, compile=None,
                                                            optimizer="sgd", optimizer_impl="default")
    configs = {"torch (stock)": base}
    if ipex_available:
        configs[IPEX_STOCK] = base.replace(runtime="ipex")
        configs[IPEX] = base.replace(runtime="ipex", ipex=True)
    if image_like and not base.channels_last:
        configs["channels-last"] = base.replace(channels_last=True)
    for mode in compile_modes:
        configs[f"torch.compile ({mode})"] = base.replace(compile=mode, warmup=max(base.warmup, 1))
    if zentorch:  # AMD's backend, beside Inductor
        configs[ZENTORCH] = base.replace(compile="zentorch", warmup=max(base.warmup, 1))
    unknown = set(optimizers) - set(OPTIMIZER_ARMS)
    if unknown:
        raise CpuoptError(f"unknown optimizer arm(s) {', '.join(sorted(unknown))}; use some of {', '.join(OPTIMIZER_ARMS)}")
    arms = {"SGD foreach": base.replace(optimizer_impl="foreach"), "SGD fused": base.replace(optimizer_impl="fused"),
            "AdamW (default)": base.replace(optimizer="adamw"),
            "AdamW fused": base.replace(optimizer="adamw", optimizer_impl="fused")}
    return Plan.of(configs | {name: config for name, config in arms.items() if name in optimizers})


def table(results: list[dict], plan: Plan) -> pd.DataFrame:
    """``choosing.named_table``: every arm against the stock runtime, with compile times."""
    return choosing.named_table(results, plan.named)


def breakeven_steps(compile_s: float, eager_step_ms: float, compiled_step_ms: float) -> float | None:
    """Training steps after which compiling has paid for its compile time (None: it never does)."""
    saving_s = (eager_step_ms - compiled_step_ms) / 1e3
    return compile_s / saving_s if saving_s > 0 else None


def findings(table: pd.DataFrame, plan: Plan, results: list[dict], ipex_confirmed: dict | None = None) -> list[Finding]:
    """Notebook 05's answer for one workload, from its measurements (IPEX against its own torch:
    ``confirm_ipex``'s result where it ran)."""
    configs, workload = plan.named, plan.workload
    if table.empty or "ratio" not in table:  # nothing ran, or only failures (their rows say how)
        return [_note(workload, "no runtime result")]
    h = {n: c.config_hash() for n, c in configs.items()}
    found = ipex_own_findings(results, plan, ipex_confirmed)
    if IPEX in h:
        found.append(_note(workload, "stock over ipex", paired(results, h[IPEX], h["torch (stock)"])))
    other = {h[n] for n in (IPEX_STOCK, IPEX, "AdamW (default)", "AdamW fused") if n in h}
    upstream = table[~table["config_hash"].isin(other) & ~table["is_baseline"]].dropna(subset=["ratio"])
    best = upstream.sort_values("ratio", ascending=False).iloc[0] if len(upstream) else None
    if best is not None:
        found.append(_note(workload, "fastest upstream", best["comparison"], name=best["name"],
                           samples_per_s=float(best["samples_per_s"])))
        if IPEX in h:
            found.append(_note(workload, "upstream over ipex", paired(results, h[IPEX],
                                                                      best["config_hash"]), name=best["name"]))
    if "AdamW fused" in h and "AdamW (default)" in h:
        found.append(_note(workload, "fused adamw", paired(results, h["AdamW (default)"], h["AdamW fused"])))
    return found + compile_findings(table, plan)


def compile_findings(table: pd.DataFrame, plan: Plan) -> list[Finding]:
    """Each compiled setting's cold (and warm) compile time, and after how many steps it pays for itself."""
    workload, eager = plan.workload, plan.row(table, "torch (stock)")
    if eager.empty:
        return []
    found = []
    for row in table[table["compile_s"].notna()].itertuples():
        if row.compile_s < NOTHING_COMPILED_S:
            found.append(_note(workload, "compiled nothing", name=row.name, compile_s=float(row.compile_s)))
            continue
        steps = breakeven_steps(row.compile_s, eager.iloc[0]["step_ms"], row.step_ms)
        warm = row.compile_warm_s
        found.append(_note(workload, "compile breakeven", name=row.name, compile_s=float(row.compile_s),
                           compile_warm_s=float(warm) if warm is not None and warm == warm else None,
                           steps=float(steps) if steps is not None else None))
    return found


def zentorch_findings(table: pd.DataFrame, plan: Plan, results: list[dict], status: dict) -> list[Finding]:
    """zentorch's training throughput against stock eager and Inductor, and whether its loss
    matches the eager run's; or why it was not measured, or what failed."""
    configs, workload = plan.named, plan.workload
    if ZENTORCH not in configs:
        return [_note(workload, "zentorch not measured", reason=status.get("reason"))]
    h = {n: c.config_hash() for n, c in configs.items()}
    row = plan.row(table, ZENTORCH)
    if row.empty or pd.isna(row.iloc[0]["samples_per_s"]):
        failed = next((r["reason"] for r in results if r["config_hash"] == h[ZENTORCH] and r["status"] != "ok"), "")
        last = [line for line in (failed or "no result").splitlines() if line.strip()][-1:] or ["no result"]
        return [_note(workload, "zentorch failed", error=last[0][:200])]
    found = [_note(workload, "zentorch over eager", paired(results, h["torch (stock)"], h[ZENTORCH]))]
    inductor = [c for c in configs.values() if c.compile and c.compile != "zentorch"]
    found += [_note(workload, "zentorch over inductor", paired(results, c.config_hash(), h[ZENTORCH]),
                    mode=c.compile) for c in inductor]
    if not inductor:
        found.append(_note(workload, "zentorch without inductor"))
    drift = row.iloc[0].get("loss_drift")
    if drift is not None and drift == drift:
        found.append(_note(workload, "zentorch loss drift", drift=float(drift), tolerance=DRIFT_TOLERANCE,
                           within=bool(drift <= DRIFT_TOLERANCE)))
    return found


def choose(table: pd.DataFrame, plan: Plan, confirm=None) -> Choice:
    """Notebook 05's hand-on: the fastest eager setting of this torch (no IPEX runtime, no compile).

    IPEX is archived and runs only in its own torch 2.8 runtime; torch.compile costs its
    compile time in every new process, and the later notebooks start many short ones.
    Both are reported, neither is handed on; the choice is made like every other (ratio
    above 1 over the whole interval).
    """
    eager = [c.config_hash() for c in plan.configs if c.runtime == "main" and not c.compile and c.optimizer == "sgd"]
    candidates = table[table["config_hash"].isin(eager)] if len(table) else None
    return choosing.choose(table, "runtime", confirm, candidates=candidates, stage="runtime", workload=plan.workload)
