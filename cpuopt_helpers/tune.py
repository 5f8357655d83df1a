"""`cpuopt tune`: the best configuration this machine allows for one workload, in a time budget.

1. Candidates: PyTorch's defaults, the ladder the notebooks handed on for this workload
   (if any), and one change at a time from the defaults over the search space: threads,
   ranks and mode, allocator, OpenMP runtime, channels-last, torch.compile, optimizer
   implementation, bf16 where the CPU has a fast path, and AMD's zentorch backend on an AMD
   CPU where it is installed for this torch.
2. Successive halving: every candidate runs once; the faster half runs again, and so on,
   while the budget lasts; candidates are ranked by their median samples/s.
3. The best candidate is combined with the other winning changes (one run each). Picking
   the fastest of many is a selection, so the search's winner is then confirmed in fresh
   rounds against PyTorch's defaults with the comparison rule (``compare.run_adaptive``:
   at least 5 rounds, order alternating, stopping when the verdict is decided or the
   budget left is spent); run_cpu's defaults run in the same rounds.

The recommendation is the winner when its verdict against the defaults is ``faster``;
otherwise the defaults themselves, with the measured comparison that says why. No
interval is printed that was not measured.

``cpuopt tune --dry-run`` lists step 1's candidates with the cores of their instances and
measures nothing (``search_plan``); with ``--topology FILE`` it does so for another machine
(its saved ``cpuopt doctor --json`` or ``lscpu -p``), so a laptop shows what the search
would run on the server.
"""

from __future__ import annotations

import math
import shlex
import statistics
import time

from cpuopt_helpers import compare, launch, planning, runtimes, system
from cpuopt_helpers.config import RunConfig, normalise
from cpuopt_helpers.decisions import Comparison
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.stages import choosing, multi_instance, threads
from cpuopt_helpers.system import Facts

FINAL_ROUNDS = compare.MIN_ROUNDS  # rounds kept for the confirmation when the search stops


def search_space(default: RunConfig, facts: Facts, image_like: bool) -> list[RunConfig]:
    """One change at a time from the defaults (each a rung the notebooks measure)."""
    physical = facts.physical_cores
    out = [default.replace(threads=t) for t in threads.thread_counts(physical, physical) if t != default.threads]
    out += [default.replace(threads=t, instances=n, mode="ddp") for t, n in multi_instance.layouts(
        multi_instance.machine_of(facts)) if n > 1]
    out += [default.replace(allocator=a) for a, path in facts.allocators.items() if path]
    if facts.openmp.get("intel"):
        out.append(default.replace(omp_runtime="intel"))
    if image_like:
        out.append(default.replace(channels_last=True))
    out += [default.replace(optimizer_impl=i) for i in ("foreach", "fused")]
    out.append(default.replace(compile="default", warmup=max(default.warmup, 1)))
    if facts.cpu_vendor == "AuthenticAMD" and runtimes.zentorch_status(facts.cpu_vendor)["usable"]:
        out.append(default.replace(compile="zentorch", warmup=max(default.warmup, 1)))  # AMD's backend (notebook 05)
    if facts.bf16["accelerated"]:
        out.append(default.replace(dtype="bf16"))
    return out


def image_like(workload: str, preset: str) -> bool:
    """Whether the workload trains on images (its search then tries channels-last), from building it
    here: a user workload that fails to build is the user's input, said in one line before any search."""
    from cpuopt_helpers.workloads import BUILTINS, build_workload

    try:
        return bool(getattr(build_workload(workload, preset), "image_like", False))
    except CpuoptError:
        raise
    except Exception as exc:
        if workload in BUILTINS:
            raise
        said = (str(exc).strip().splitlines() or [""])[-1]
        raise CpuoptError(f"workload {workload!r} failed to build at preset {preset!r}: {type(exc).__name__}: "
                          f"{said}; fix it, then run `cpuopt bench --workload {workload} --steps 1` to check") from None


def machine_facts(machine: planning.Machine) -> system.Facts:
    """What the search space needs to know about a machine read from --topology: its topology
    and counts, its libraries, and bf16 where its doctor JSON says (lscpu text does not: no bf16)."""
    topo = machine.topology
    return system.Facts.from_dict({**machine.facts, "bf16": machine.facts.get("bf16") or {"accelerated": False}}).replace(
        physical_cores=topo.physical_cores, logical_cores=topo.logical_cores, sockets=topo.sockets,
        topology=topo.to_dict(), allocators={k: machine.libraries.get(k) for k in ("jemalloc", "tcmalloc")},
        openmp={"intel": machine.libraries.get("iomp")})


def search_plan(workload: str, preset: str, facts: Facts, machine: planning.Machine, script: list[str] | None = None,
                instances: bool = False) -> list[dict]:
    """What the search would measure first, measuring nothing (`cpuopt tune --dry-run`): every
    candidate with its instances' cores on ``machine``, this one or another's (--topology);
    ``script``: that command's launch candidates (``scripts.search_space``, copies with ``instances``)."""
    from cpuopt_helpers import scripts

    if script:
        default = scripts.script_config(script, facts.physical_cores)
        candidates = [default] + scripts.search_space(default, facts, instances)
    else:
        default = normalise(RunConfig.for_preset(workload, preset), facts.physical_cores)
        candidates = [default] + search_space(default, facts, image_like(workload, preset))
    rows = []
    for config in choosing.unique(candidates):
        plan = planning.build_plan(config, machine, command=script)
        rows.append({"label": label(config), "config": config.to_dict(), "pinning": plan.pinning,
                     "cores": [list(i.cores) for i in plan.instances], "argv": [list(i.argv) for i in plan.instances]})
    return rows


def format_search_plan(rows: list[dict], machine: planning.Machine) -> str:
    where = machine.topology.summary() + (f", from {machine.source}" if machine.source else "")
    lines = [f"# cpuopt tune would measure these {len(rows)} candidates once each ({where}); the faster half then "
             "runs again, and the winner is confirmed against PyTorch's defaults in fresh rounds"]
    for r in rows:
        cores = " | ".join(system.format_cpu_list(c) for c in r["cores"])
        lines.append(f"{r['label']}: cores {cores} ({r['pinning']})")
    return "\n".join(lines)


def changes(config: RunConfig, default: RunConfig) -> dict:
    """The fields in which a config differs from the defaults."""
    base = default.to_dict()
    return {k: v for k, v in config.to_dict().items() if v != base[k] and k not in ("timeout_s", "warmup")}


def combine(default: RunConfig, winners: list[RunConfig]) -> RunConfig | None:
    """The defaults with every winner's changes applied (the first winner wins conflicts)."""
    merged: dict = {}
    for w in winners:
        for k, v in changes(w, default).items():
            merged.setdefault(k, v)
    if merged.get("mode") == "ddp" and merged.get("compile"):
        merged.pop("compile")  # measured one at a time; DDP with compile is left to the user
    try:
        return default.replace(**merged, warmup=max(default.warmup, 1)) if merged else None
    except (TypeError, ValueError):
        return None


def tune(workload: str, budget_min: float, preset: str = "quick", facts: Facts | None = None,
         ladder: list[dict] | None = None, runner=None, progress: bool = True, script: list[str] | None = None,
         reading=None, instances: bool = False) -> dict:
    """Search within the budget; measure the recommendation against both defaults.

    ``script`` (a command line's words) tunes that command instead of a workload: its launch
    configuration only (``scripts.search_space``; several copies only with ``instances``), each
    run read as ``reading`` says (``scripts.Reading``; a failed run is never a candidate)."""
    from cpuopt_helpers import scripts, system

    if not (math.isfinite(budget_min) and budget_min > 0):
        raise CpuoptError(f"--budget-min must be a positive number of minutes, got {budget_min}")
    facts = facts or system.collect_facts()
    if script:
        scripts.run_cpu_ready(script)
        workload, reading = scripts.SCRIPT, reading or scripts.Reading()
        runner = runner or (lambda c: scripts.run_script(c, script, reading, facts))
    else:
        runner = runner or (lambda c: launch.run(c, facts))
    default, candidates = starting_candidates(workload, preset, facts, ladder, script, instances)
    search = Search(runner, time.monotonic() + budget_min * 60, workload, progress)
    try:
        best = search.run(default, candidates)
        outcome = confirm_against_defaults(search, default, best)
    except KeyboardInterrupt as exc:  # what it measured so far, for `cpuopt tune` to say before it stops
        exc.partial = {"workload": workload, "candidates": search.table(),
                       "confirmation": getattr(exc, "partial", None)}
        raise
    finally:
        search.bar.close()
    recommended, rounds = outcome["recommended"], outcome["rounds"]
    command = shlex.join(script) if script else None
    lines = planning.command_lines(recommended, planning.Machine.this(), script)
    return {"workload": workload, "preset": preset, "budget_min": budget_min,
            "recommended": recommended.to_dict(), "recommended_label": label(recommended),
            "changes": changes(recommended, default), "search_winner": label(best),
            **outcome["comparisons"],
            "rounds": rounds, "order": outcome["order"], "stopped": outcome["stopped"],
            "samples_per_s": {k: statistics.median([v for v in vs if v]) if any(vs) else None
                              for k, vs in outcome["speeds"].items()},
            "launch_command": lines["launch"], "shell_command": lines["shell"],
            "candidates": search.table(),
            "failed": [{"label": k, "reason": v} for k, v in search.failures.items() if k not in
                       {label(search.by_hash[h]) for h in search.samples}],
            "runs": len(search.run_s) + sum(2 if outcome["challenger_is_run_cpu"] else 3 for _ in rounds),
            "note": outcome["note"],
            **({"script": command, "metric": list(search.metrics), "in_the_script": scripts.IN_SCRIPT} if script else {})}


def starting_candidates(workload: str, preset: str, facts: Facts, ladder: list[dict] | None, script: list[str] | None,
                        instances: bool) -> tuple[RunConfig, list[RunConfig]]:
    """PyTorch's defaults (checked against this machine before anything is measured) and the
    search's candidates: the defaults first, the ladder handed on, then one change at a time."""
    from cpuopt_helpers import scripts

    if script:
        default = scripts.script_config(script, facts.physical_cores)
        planning.build_plan(default, planning.Machine.this(), command=script)  # bad machine: fail before measuring
        return default, choosing.unique([default] + scripts.search_space(default, facts, instances))
    default = normalise(RunConfig.for_preset(workload, preset), facts.physical_cores)
    planning.build_plan(default, planning.Machine.this())  # bad workload or machine: fail before measuring
    handed_on = [RunConfig.from_dict(s["config"]) for s in (ladder or []) if s["config"]["workload"] == workload]
    space = search_space(default, facts, image_like(workload, preset))
    return default, choosing.unique([default] + [c.replace(preset=preset, steps=default.steps, onednn_verbose=None,
                                                           trace=None, trace_shapes=True,
                                                           warmup=max(default.warmup, c.warmup))
                                                 for c in handed_on] + space)


class Search:
    """Successive halving within a deadline: every candidate once, the faster half again, and so on;
    then the winners' changes combined. Keeps every run's samples/s and every failure."""

    def __init__(self, runner, deadline: float, workload: str, progress: bool):
        from cpuopt_helpers.progress import bar

        self.runner, self.deadline = runner, deadline
        self.failures: dict[str, str] = {}  # label -> why its last run failed
        self.metrics: dict[str, None] = {}  # how a script's throughput was read, in order of first use
        self.samples: dict[str, list[float]] = {}
        self.by_hash: dict[str, RunConfig] = {}
        self.run_s: list[float] = []
        self.bar = bar(desc=f"tune {workload}", unit="run", disable=not progress)

    def measure(self, config: RunConfig) -> None:
        start = time.monotonic()
        self.bar.set_postfix_str(label(config)[:50])
        r = self.runner(config)
        self.run_s.append(time.monotonic() - start)
        self.bar.update()
        if r["status"] == "ok":
            self.samples.setdefault(config.config_hash(), []).append(r["samples_per_s"])
            if r.get("metric"):
                self.metrics[r["metric"]] = None
        else:
            self.failures[label(config)] = (r.get("reason") or r["status"]).strip()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def table(self) -> list[dict]:
        """Every candidate that ran: its label, runs and median samples/s, the fastest first."""
        return [{"label": label(self.by_hash[h]), "runs": len(self.samples[h]),
                 "samples_per_s": statistics.median(self.samples[h])} for h in self.ranked(self.samples)]

    def room(self, runs: int) -> bool:
        """Time for ``runs`` more runs, keeping time for the final interleaved rounds."""
        per_run = statistics.median(self.run_s) if self.run_s else 10.0
        return self.left() > per_run * (runs + 3 * FINAL_ROUNDS)

    def ranked(self, hashes) -> list[str]:
        return sorted(hashes, key=lambda h: -statistics.median(self.samples[h]))

    def run(self, default: RunConfig, candidates: list[RunConfig]) -> RunConfig:
        """The search's winner (the defaults where nothing ran faster)."""
        self.by_hash.update({c.config_hash(): c for c in candidates})
        self.measure(default)
        for config in candidates[1:]:
            if not self.room(1):
                break
            self.measure(config)
        alive = self.ranked(list(self.samples))
        while len(alive) > 2 and self.room(len(alive) // 2):
            alive = alive[:max(2, len(alive) // 2)]
            for h in alive:
                self.measure(self.by_hash[h])
            alive = self.ranked(alive)
        base = self.samples.get(default.config_hash())
        winners = [self.by_hash[h] for h in alive if base and statistics.median(self.samples[h])
                   > statistics.median(base) and h != default.config_hash()]
        merged = combine(default, winners[:3]) if len(winners) > 1 else None
        if merged is not None and self.room(1):
            self.by_hash[merged.config_hash()] = merged
            self.measure(merged)
            if merged.config_hash() in self.samples:
                alive = self.ranked(list(dict.fromkeys(alive + [merged.config_hash()])))
        return self.by_hash[alive[0]] if alive else default


def confirm_against_defaults(search: Search, default: RunConfig, best: RunConfig) -> dict:
    """The final rounds: the search's winner (or, when nothing beat the defaults, run_cpu's
    defaults) against PyTorch's defaults with the comparison rule, run_cpu's defaults in every
    round; the recommendation and both comparisons with run_cpu's defaults, whatever won."""
    run_cpu = default.replace(launcher="run_cpu")
    challenger = best if best.config_hash() != default.config_hash() else run_cpu
    run_cpu_speeds: dict[int, float | None] = {}
    seed, slots, calls = len(search.samples), {}, {}

    def run(config: RunConfig) -> float | None:
        r = search.runner(config)
        search.bar.update()
        return r["samples_per_s"] if r["status"] == "ok" else None

    def final(arm: str, i: int) -> float | None:
        k = calls[i] = calls.get(i, -1) + 1  # the arm's place in the round: 0 or 1
        slot = slots.setdefault(i, compare.extra_slot(i, seed))  # run_cpu's own place: before, between, after
        if challenger is not run_cpu and slot == k:
            run_cpu_speeds[i] = run(run_cpu)
        speed = run(default if arm == "a" else challenger)
        if challenger is not run_cpu and slot == 2 and k == 1:
            run_cpu_speeds[i] = run(run_cpu)
        return speed

    confirmation = compare.run_adaptive(final, budget_s=max(search.left(), 1.0), seed=seed, reserved=True)
    rounds = confirmation["rounds"]
    if challenger is run_cpu:  # nothing beat the defaults in the search
        cpu, vs_default, recommended = [r[1] for r in rounds], None, default
        note = "no candidate beat PyTorch's defaults in the search: the defaults are recommended"
    else:
        cpu, vs_default = [run_cpu_speeds.get(i) for i in range(len(rounds))], confirmation
        recommended = best if compare.pays(confirmation) else default
        note = "" if recommended is best else (
            f"{label(best)} measured fastest in the search, but confirmed against the defaults it is "
            f"{compare.describe(confirmation)}: the defaults are recommended")
    won = recommended is not default  # the search winner, confirmed against the defaults
    speeds = {"recommended": [r[1] for r in rounds] if won else [r[0] for r in rounds],
              "default": [r[0] for r in rounds], "run_cpu": cpu}
    comparisons = {"speedup_vs_default": brief(vs_default), "search_winner_vs_default": brief(vs_default),
                   "speedup_vs_run_cpu": brief(compare.sequential_ratio(speeds["run_cpu"], speeds["recommended"])),
                   "run_cpu_vs_default": brief(compare.sequential_ratio(speeds["default"], speeds["run_cpu"]))}
    order = [o if challenger is run_cpu else o[:slots[i]] + "R" + o[slots[i]:] for i, o in enumerate(confirmation["order"])]
    return {"recommended": recommended, "rounds": rounds, "order": order, "note": note,
            "stopped": confirmation["stopped"], "speeds": speeds, "comparisons": comparisons,
            "challenger_is_run_cpu": challenger is run_cpu}


def brief(c: dict | None) -> dict | None:
    """A comparison as the recommendation keeps it (``decisions.Comparison``'s fields)."""
    return None if c is None else Comparison.from_dict(c).to_dict()


def label(config: RunConfig) -> str:
    from cpuopt_helpers import scripts

    return scripts.label(config) if config.workload == scripts.SCRIPT else config.label()


def format_partial(p: dict) -> str:
    """An interrupted search in words: its ranking so far (no verdict), and its confirmation's rounds if begun."""
    rows = p["candidates"]
    lines = [f"tune {p['workload']} interrupted: {len(rows)} candidate(s) ran; a ranking from its runs so far, "
             "not a verdict (nothing was confirmed):"]
    lines += [f"  {r['label']}: {r['samples_per_s']:.1f} samples/s (median of {r['runs']} run(s))" for r in rows[:5]]
    if p.get("confirmation"):
        lines.append(f"  its confirmation against PyTorch's defaults so far: {compare.describe(p['confirmation'])}")
    return "\n".join(lines)


def format_tune(t: dict) -> str:
    def ci(s):
        return compare.describe(dict(s, margin=compare.MARGIN, min_rounds=compare.MIN_ROUNDS)) if s else "not measured"

    what = t["script"] if t.get("script") else f"{t['workload']}[{t['preset']}]"
    lines = [f"recommended for {what}: {t['recommended_label']}",
             f"  changes from PyTorch's defaults: {t['changes'] or 'none'}",
             "  speedup over PyTorch's defaults: "
             + (ci(t['speedup_vs_default']) if t['speedup_vs_default'] else "none: the defaults are recommended"),
             f"  speedup over run_cpu's defaults: {ci(t['speedup_vs_run_cpu'])}",
             *([f"  run_cpu's defaults over PyTorch's defaults: {ci(t['run_cpu_vs_default'])}"]
               if t["run_cpu_vs_default"] else []),
             f"  train with:  {t['launch_command']}",
             f"  or in plain shell:  {t['shell_command']}",
             f"  ({len(t['candidates'])} candidates, {t['runs']} runs in a {t['budget_min']:g}-minute budget)"]
    for f in t.get("failed", []):
        lines.append(f"  left out, its run failed: {f['label']}: {f['reason'].splitlines()[0][:160]}")
    if t.get("metric"):
        lines.append(f"  throughput read from: {'; '.join(t['metric'])}")
    if t.get("in_the_script"):
        lines.append(f"  still to try in the script itself: {t['in_the_script']}")
    if t["note"]:
        lines.append(f"  note: {t['note']}")
    return "\n".join(lines)
