"""A whole ladder climbed without a worker: stages 01 and 03-07 through a Session whose runs are
made up (deterministic throughputs per configuration, seeded noise), for the golden-ladder test.

What it records (rung configurations, their order, the verdicts behind them) must not change
when the deciding layer is restructured: ``tests/fixtures/golden_ladder.json`` was written by
this climb before the refactor of issue 31 (``CPUOPT_RECORD_GOLDEN=1 pytest
tests/test_golden_ladder.py`` writes it again, only when behaviour is meant to change).
"""

from __future__ import annotations

import hashlib
import math
import random

import pandas as pd

from cpuopt_helpers.config import RunConfig, normalise
from cpuopt_helpers.results import ResultStore
from cpuopt_helpers.session import Session
from tests.conftest import make_facts

# what each change multiplies samples/s by: some pay, some cost, some do nothing
FACTORS = {("omp_runtime", "intel"): 1.25, ("kmp_blocktime", 0): 1.02, ("affinity", "none"): 0.9,
           ("allocator", "jemalloc"): 1.15, ("allocator", "tcmalloc"): 1.12, ("channels_last", True): 1.2,
           ("optimizer_impl", "fused"): 1.01, ("optimizer_impl", "foreach"): 0.98, ("dtype", "bf16"): 1.6,
           ("mode", "ddp"): 1.01, ("loader_workers", 1): 0.97, ("loader_workers", 2): 0.96}
NOISE = 0.03  # log-normal sd of one run


class FakeSession(Session):
    """A Session whose ``run`` makes a result up instead of starting a worker."""

    calls: dict

    def run(self, config: RunConfig) -> dict:
        from cpuopt_helpers.config import validate

        config = validate(config, self.facts.logical_cores, self.facts.physical_cores, check_workload=False)
        key = config.config_hash()
        self.calls[key] = self.calls.get(key, 0) + 1
        noise = random.Random(f"{key}/{self.calls[key]}").gauss(0, NOISE)
        speed = 100.0 * config.threads * config.instances / self.facts.physical_cores
        for (field, value), factor in FACTORS.items():
            if getattr(config, field) == value:
                speed *= factor
        if config.oversubscribe:
            speed *= 0.5
        if dict(config.env).get("OMP_PROC_BIND"):
            speed *= 1.03
        speed *= math.exp(noise)
        return {"status": "ok", "reason": "", "config": config.to_dict(), "config_hash": key,
                "label": config.label(), "samples_per_s": speed, "step_ms": {"median": 1000 / speed},
                "peak_rss_mb": 100.0 * config.instances, "losses": [1.0, 0.9], "created_at": "2026-12-01T00:00:00",
                "params_in_sync": True, "system": self.machine, "phase_ms": {}, "startup_s": 1.0}


def facts() -> dict:
    """A 2-core machine with both allocators, Intel's OpenMP and a bf16 fast path."""
    return make_facts(fingerprint="golden", bf16={"accelerated": True, "path": "AMX", "reason": "made up"})


def record(session: Session, stage: str, choice) -> dict:
    comparison = choice.comparison
    return {"stage": stage, "sentence": choice.sentence,
            "chosen": choice.config.config_hash() if choice.config is not None else None,
            "verdict": comparison.verdict if comparison else None, "n": comparison.n if comparison else None}


def climb(tmp_path, workload: str = "cnn") -> dict:
    """01 and 03-07 as their notebooks run them, on ``workload`` at the quick preset."""
    from cpuopt_helpers import ladder
    from cpuopt_helpers.results import run_sweep
    from cpuopt_helpers.stages import stage

    session = FakeSession(facts=facts(), store=ResultStore(tmp_path / "golden.sqlite"))
    session.calls = {}
    preset, decisions = "quick", []
    session.hand_on(RunConfig.for_preset(workload, preset), "baseline")
    accuracy = pd.DataFrame({"final_accuracy": [0.95, 0.948]}, index=pd.Index(["fp32", "bf16"], name="mode"))
    options = {"threading": ((True,), {}), "runtime": ((True, False, ()), {}), "bf16": ((True,), {}),
               "allocator": ((), {}), "multi-instance": ((), {})}
    context = {"bf16": {"accuracy": accuracy, "gate": session.facts.bf16}}
    for rung, tag in (("threading", "03"), ("allocator", "04"), ("runtime", "05"), ("bf16", "06"),
                      ("multi-instance", "07")):  # the stage protocol, as the notebooks follow it
        module, (args, kwargs) = stage(rung).module, options[rung]
        base = session.best_config(workload, preset, before=rung)
        plan = module.configs(normalise(base, 2) if rung == "threading" else base, session.facts, *args, **kwargs)
        res = run_sweep(plan.configs, session.store, session.run, rounds=2, tag=tag, machine=session.machine,
                        progress=False)
        choice = session.settle(rung, module.table(res, plan), plan, 5, 14, None, True, **context.get(rung, {}))
        decisions.append(record(session, rung, choice))

    rows = ladder.rungs(session.store, session.machine, workload, preset, 2)
    rungs = [{"step": r.step, "config_hash": RunConfig.from_dict(r.config).config_hash(),
              "config": {k: v for k, v in r.config.items() if k != "timeout_s"},
              "verdict": r.vs_previous.verdict if r.vs_previous else None, "confirmed": r.confirmed} for r in rows]
    digest = hashlib.sha1(repr(sorted(session.calls.items())).encode()).hexdigest()[:12]
    return {"decisions": decisions, "rungs": rungs, "runs": sum(session.calls.values()), "calls_digest": digest}
