"""Stage 05, runtime: IPEX (in its own torch 2.8 runtime) against this torch's upstream
replacements (torch.compile, channels-last, foreach/fused optimizers).
"""

from __future__ import annotations

import pandas as pd

from cpuopt_helpers import compare
from cpuopt_helpers.config import RunConfig, normalise
from cpuopt_helpers.decisions import Choice
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.stages import choosing
from cpuopt_helpers.stages.choosing import paired
from cpuopt_helpers.system import Facts

OPTIMIZER_ARMS = ("SGD foreach", "SGD fused", "AdamW (default)", "AdamW fused")
NOTHING_COMPILED_S = 1.0  # a cold compile faster than this generated no kernel (Inductor's C++ alone takes seconds)


ZENTORCH = "torch.compile (zentorch)"
EXTENSION_FACT = "vendor_extension/findings"  # what notebook 05 measured of the vendor's extension (`cpuopt doctor`)


def extension_findings(results: list[dict], configs: dict, table: pd.DataFrame, workload: str,
                       zentorch: dict) -> list[str]:
    """What notebook 05 measured of a vendor's extension, for `cpuopt doctor`: IPEX against its
    own torch, and zentorch against stock eager and Inductor, its loss, or why it was not measured."""
    return ipex_own_findings(results, configs, workload) + zentorch_findings(results, configs, table, workload, zentorch)


def ipex_own_findings(results: list[dict], configs: dict, workload: str) -> list[str]:
    """IPEX against the stock torch 2.8 it runs in (empty where the IPEX runtime was not measured)."""
    if "torch 2.8 + IPEX" not in configs:
        return []
    h = {n: c.config_hash() for n, c in configs.items()}
    return [f"{workload}: IPEX over its own stock torch 2.8: "
            f"{compare.describe(paired(results, h['torch 2.8 (stock)'], h['torch 2.8 + IPEX']))}."]


def runtimes_measured(ipex: dict, zentorch: dict, asked) -> tuple[bool, list[str]]:
    """Whether zentorch is measured (``asked``: "auto", on an AMD CPU where it fits this torch;
    True; False), and what notebook 05 says of both vendors' extensions before it measures."""
    use = zentorch["usable"] and (zentorch["amd"] if asked == "auto" else bool(asked))
    lines = [f"IPEX runtime: {ipex['path']}: torch {ipex['torch']}, IPEX {ipex['ipex']}, ISA {ipex.get('ipex_isa')}"
             if ipex["available"] else f"IPEX runtime skipped: {ipex['reason']}; the torch 2.8 and IPEX rows are left out"]
    if asked is True and not zentorch["usable"]:
        lines.append(f"zentorch asked for (ZENTORCH = True) but it cannot run: {zentorch['reason']}")
    lines.append(f"zentorch: {'measured: ' + str(zentorch['version']) if use else zentorch['reason']}")
    return use, lines


def configs(base: RunConfig, facts: Facts, image_like: bool, ipex_available: bool,
            compile_modes: tuple[str, ...] = ("default", "max-autotune"),
            optimizers: tuple[str, ...] = OPTIMIZER_ARMS, zentorch: bool = False) -> dict[str, RunConfig]:
    """Notebook 05: stock torch 2.8, torch 2.8 + IPEX, stock torch (this venv), and this
    torch's upstream replacements for what IPEX did, all on the same base setting.

    Returns name -> config, the first being the stock runtime every ratio is taken against.
    The AdamW pair measures the fused optimizer where it matters most (SGD's update is
    one multiply-add per weight).
    """
    base = normalise(base, facts.physical_cores).replace(runtime="main", ipex=False, compile=None,
                                                            optimizer="sgd", optimizer_impl="default")
    configs = {"torch (stock)": base}
    if ipex_available:
        configs["torch 2.8 (stock)"] = base.replace(runtime="ipex")
        configs["torch 2.8 + IPEX"] = base.replace(runtime="ipex", ipex=True)
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
    return configs | {name: config for name, config in arms.items() if name in optimizers}


def breakeven_steps(compile_s: float, eager_step_ms: float, compiled_step_ms: float) -> float | None:
    """Training steps after which compiling has paid for its compile time (None: it never does)."""
    saving_s = (eager_step_ms - compiled_step_ms) / 1e3
    return compile_s / saving_s if saving_s > 0 else None


def findings(results: list[dict], configs: dict, table: pd.DataFrame, workload: str) -> list[str]:
    """Notebook 05's answer for one workload, worded from its measurements."""
    if table.empty:
        return [f"{workload}: no configuration produced a result."]
    h = {n: c.config_hash() for n, c in configs.items()}
    lines = ipex_own_findings(results, configs, workload)
    if "torch 2.8 + IPEX" in h:
        lines.append(f"{workload}: stock torch (this venv) over torch 2.8 + IPEX: "
                     f"{compare.describe(paired(results, h['torch 2.8 + IPEX'], h['torch (stock)']))}.")
    upstream = table[~table["name"].isin(["torch 2.8 (stock)", "torch 2.8 + IPEX", "AdamW (default)",
                                          "AdamW fused"]) & ~table["is_baseline"]].dropna(subset=["ratio"])
    best = upstream.sort_values("ratio", ascending=False).iloc[0] if len(upstream) else None
    if best is not None:
        lines.append(f"{workload}: fastest with this torch in screening: {best['name']} at "
                     f"{best['samples_per_s']:.1f} samples/s, {compare.describe(best['comparison'])} against stock.")
        if "torch 2.8 + IPEX" in h:
            lines.append(f"{workload}: {best['name']} over torch 2.8 + IPEX: "
                         f"{compare.describe(paired(results, h['torch 2.8 + IPEX'], best['config_hash']))}.")
    if "AdamW fused" in h and "AdamW (default)" in h:
        lines.append(f"{workload}: fused AdamW over the default AdamW: "
                     f"{compare.describe(paired(results, h['AdamW (default)'], h['AdamW fused']))}.")
    eager = table[table["name"] == "torch (stock)"]
    for row in table[table["compile_s"].notna()].itertuples():
        if eager.empty:
            break
        steps = breakeven_steps(row.compile_s, eager.iloc[0]["step_ms"], row.step_ms)
        warm = f", {row.compile_warm_s:.0f} s again with a warm cache" if row.compile_warm_s == row.compile_warm_s \
            and row.compile_warm_s is not None else ""
        if row.compile_s < NOTHING_COMPILED_S:
            lines.append(f"{workload}: {row.name} took {row.compile_s:.2f} s from a cold cache, too short for any "
                         "kernel to have been generated: the step ran (almost) all eagerly (torch.compile leaves "
                         "nn.LSTM/GRU to eager unless torch._dynamo.config.allow_rnn is set), so its ratio is "
                         "eager's against eager's.")
            continue
        lines.append(f"{workload}: {row.name} compiled in {row.compile_s:.0f} s from a cold cache{warm}; "
                     + (f"it pays for itself after {steps:,.0f} steps." if steps else
                        "its steps are not faster, so it never pays for itself."))
    return lines


def zentorch_findings(results: list[dict], configs: dict, table: pd.DataFrame, workload: str,
                      status: dict) -> list[str]:
    """zentorch's training throughput against stock eager and Inductor, and whether its loss
    matches the eager run's; or why it was not measured, or what failed."""
    if ZENTORCH not in configs:
        return [f"{workload}: zentorch: {status.get('reason') or 'not measured here (ZENTORCH = False)'}."]
    h = {n: c.config_hash() for n, c in configs.items()}
    row = table[table["name"] == ZENTORCH] if "name" in table else table.iloc[0:0]
    if row.empty or pd.isna(row.iloc[0]["samples_per_s"]):
        failed = next((r["reason"] for r in results if r["config_hash"] == h[ZENTORCH] and r["status"] != "ok"), "")
        last = [line for line in (failed or "no result").splitlines() if line.strip()][-1:] or ["no result"]
        return [f"{workload}: zentorch: its training run failed, measured: {last[0][:200]}."]
    lines = [f"{workload}: zentorch over stock eager: {compare.describe(paired(results, h['torch (stock)'], h[ZENTORCH]))}."]
    inductor = [n for n in configs if n.startswith("torch.compile (") and n != ZENTORCH]
    lines += [f"{workload}: zentorch over Inductor ({n[len('torch.compile ('):-1]}): "
              f"{compare.describe(paired(results, h[n], h[ZENTORCH]))}." for n in inductor]
    if not inductor:
        lines.append(f"{workload}: zentorch against Inductor: Inductor is not measured in this run (COMPILE_MODES = []).")
    drift = row.iloc[0].get("loss_drift")
    if drift is not None and drift == drift:
        lines.append(f"{workload}: zentorch's loss over the steps lies {drift:.1%} from the eager run's "
                     + ("(within the 10% a setting may drift: it trains the same)." if drift <= 0.10
                        else "(beyond 10%: it does not train the same; no candidate)."))
    return lines


def choose(table: pd.DataFrame, configs: dict, confirm=None) -> Choice:
    """Notebook 05's hand-on: the fastest eager setting of this torch (no IPEX runtime, no compile).

    IPEX is archived and runs only in its own torch 2.8 runtime; torch.compile costs its
    compile time in every new process, and the later notebooks start many short ones.
    Both are reported, neither is handed on; the choice is made like every other (ratio
    above 1 over the whole interval).
    """
    eager = [n for n, c in configs.items() if c.runtime == "main" and not c.compile and c.optimizer == "sgd"]
    return choosing.choose(table, "runtime", confirm, candidates=table[table["name"].isin(eager)], stage="runtime")
