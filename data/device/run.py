"""What two cores cannot show, measured on a many-core machine in one call: a record, not a test.

Run from the repository root with the source tree importable (no install, no papermill):

    PYTHONPATH=. python3 data/device/run.py --out DIR [--minutes 8.5] [--quick]

Each part runs while time is left, in this order; a part not reached or not run is said, with why:

1. the machine: ``cpuopt doctor --json`` (its row of the peak table, the measured GEMM ceilings);
2. where the CPU has AMX: RetinaNet at the standard preset, 80 classes, on two physical cores (the
   machines the workbook is tested on): PyTorch's defaults against the paper's recipe in 10 fixed paired
   rounds, profiled, with its targets (``cpuopt_helpers.fullstudy``; issue 35's 3x): its dated page;
3. where the CPU has AMX: the recipe at the full preset (264 classes) on every physical core, two runs
   (the configuration of part 2's page, under an allocator that keeps freed memory where one is found):
   images/s per physical core against MLPerf Training v3.0 Intel's 0.20;
4. threads: notebook 03's scaling (cnn, standard preset, 1 thread up to every physical core), two
   interleaved rounds;
5. instances: notebook 07's layouts (every physical core as 1, 2, 4, ... instances or DDP ranks), one
   round: a screen.

Writes into DIR: summary.md (each part's table and sentences, stamped), doctor.json, part 2's page,
results.sqlite (every run) and log.txt. ``--quick``: every part at the quick preset and in fewer
rounds, part 2 and 3 whatever the CPU, to try the script on any machine in a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cpuopt_helpers import fullstudy, records, targets  # noqa: E402
from cpuopt_helpers.config import RunConfig  # noqa: E402
from cpuopt_helpers.stages import multi_instance, threads  # noqa: E402


class Clock:
    """The call's deadline, and what each part said."""

    def __init__(self, minutes: float, log):
        self.end, self.log, self.parts = time.time() + 60 * minutes, log, []

    def left(self) -> float:
        return self.end - time.time()

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def part(self, title: str, lines: list[str]) -> None:
        self.parts.append((title, lines))
        for line in lines:
            self.say(f"  {line}")


def doctor(session, out: Path, clock: Clock, preset: str) -> dict:
    """Part 1: the GEMM ceilings measured (notebook 00's roofline, stored), then the doctor's facts."""
    from cpuopt_helpers import peak

    session.roofline(preset)
    done = subprocess.run([sys.executable, "-m", "cpuopt_helpers", "doctor", "--json"], capture_output=True,
                          text=True, cwd=ROOT, timeout=max(clock.left(), 1))
    (out / "doctor.json").write_text(done.stdout)
    facts = json.loads(done.stdout)
    clock.part("The machine (`cpuopt doctor --json`: doctor.json)", [
        f"{facts['cpu_model']}: {facts['physical_cores']} physical / {facts['logical_cores']} logical cores, "
        f"{facts['sockets']} socket(s), {len(facts['numa_nodes'])} NUMA node(s); "
        f"ISA: {', '.join(k for k, v in facts['isa'].items() if v)}",
        f"bf16: {'a fast path' if facts['bf16'].get('accelerated') else 'no fast path'}: {facts['bf16'].get('reason')}",
        f"the peak table's row: {facts['peak'].get('core') or 'none'} ({facts['peak'].get('source') or 'no source'})",
        *peak.peak_lines(session.peak(preset))])
    return facts


def two_cores() -> list[int]:
    """Two logical CPUs on two physical cores of one NUMA node (planning's core order)."""
    from cpuopt_helpers import system

    return system.topology().core_order()[:2]


def standard_study(out: Path, clock: Clock, quick: bool) -> None:
    """Part 2: the full study's code at the standard preset, its process held to two physical cores."""
    cpus = two_cores()
    argv = [sys.executable, "-m", "cpuopt_helpers.fullstudy", "--page", str(out), "--preset",
            "quick" if quick else "standard", "--classes", "80", "--rounds", "5" if quick else "10",
            "--budget-min", f"{max(clock.left() / 60 - 3, 1):.1f}"]  # minutes kept for the parts after it
    clock.say(f"part 2 on CPUs {cpus}: {' '.join(argv[1:])}")
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=max(clock.left() - 150, 1),
                              preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        said = (done.stdout + done.stderr).splitlines()
    except subprocess.TimeoutExpired as exc:
        said = [f"stopped at the call's deadline after {exc.timeout:.0f} s", *(exc.stdout or b"").decode().splitlines()]
    pages = sorted(out.glob("*-retinanet-*.md"))
    clock.part(f"RetinaNet, {'quick' if quick else 'standard'} preset, 80 classes, two physical cores: "
               "defaults against the recipe",
               [f"its page: {pages[-1].name}" if pages else "no page was written",
                *[line.removeprefix("- ") for line in said if line.strip() and "%|" not in line]])


def full_rate(session, clock: Clock, quick: bool) -> None:
    """Part 3: the recipe at the full preset on every physical core, two runs: images/s per core."""
    base, top, source = fullstudy.arms(session, 264, "quick" if quick else "full")
    keeps = fullstudy.allocator_arm(top, 1.0, session.facts) or top  # the allocator the full study kept
    config = keeps.replace(threads=session.facts.physical_cores, timeout_s=max(clock.left() / 2 - 30, 60))
    clock.say(f"part 3: {config.label()}")
    runs = session.sweep([config], rounds=2, tag="device/full-rate")
    figures = fullstudy.arm_figures(runs, session.facts.physical_cores)
    if not figures:
        lines = [f"no run finished: {runs[-1]['status']}: {(runs[-1].get('reason') or '')[:200]}"]
    else:
        lines = [f"{source}; {config.label()}",
                 f"{figures['samples_per_s']:.3f} images/s, {figures['per_core']:.3f} per physical core "
                 f"({figures['runs']} runs, median), {figures['per_core'] / targets.MLPERF_PER_CORE:.0%} of "
                 f"MLPerf Training v3.0 Intel's {targets.MLPERF_PER_CORE}; step {figures['step_s']:.1f} s "
                 f"(forward {figures['forward_s']:.1f} / backward {figures['backward_s']:.1f} / optimizer "
                 f"{figures['optimizer_s']:.2f} s)"]
    clock.part(f"RetinaNet, {config.preset} preset, 264 classes, every physical core: images/s per core", lines)


def runs_while_time(session, configs: list[RunConfig], rounds: int, tag: str, clock: Clock) -> list[dict]:
    """Up to ``rounds`` rounds of the configs, one run at a time, each started only where half as
    long again as the longest run so far is left (a round of many layouts can outlast the call)."""
    runs, longest = [], 0.0
    for i in range(rounds):
        for config in configs:
            if 1.5 * longest > clock.left():
                clock.say(f"{tag}: stopped at the call's time, {len(runs)} runs done ({clock.left():.0f} s left)")
                return runs
            began = time.time()
            runs += session.sweep([config], rounds=1, tag=f"{tag}/{i}")
            longest = max(longest, time.time() - began)
    return runs


def cnn(quick: bool) -> RunConfig:
    """Notebooks 03 and 07's workload, in runs short enough for many of them."""
    return RunConfig(workload="cnn", preset="quick" if quick else "standard", steps=10, warmup=2, timeout_s=120.0)


def scaling(session, clock: Clock, quick: bool) -> None:
    """Part 4: notebook 03's thread scaling."""
    facts = session.facts
    counts = threads.thread_counts(facts.physical_cores, facts.logical_cores)
    runs = runs_while_time(session, [cnn(quick).replace(threads=t) for t in counts], 2, "device/threads", clock)
    table = threads.scaling_table(runs, "cnn")
    clock.part("Threads: cnn, one instance (notebook 03's scaling)",
               [*records.table([records.Row(f"{int(r.threads)} thread{'s' * (r.threads > 1)}",
                                            f"{r.samples_per_s:.1f} samples/s", f"efficiency {r.efficiency:.0%}",
                                            f"{int(r.runs)} runs (median)") for r in table.itertuples()]),
                *[f.sentence for f in threads.scaling_findings(table, "cnn")]])


def layouts(session, clock: Clock, quick: bool) -> None:
    """Part 5: notebook 07's layouts, one round."""
    plan = multi_instance.configs(cnn(quick), session.facts)
    runs = runs_while_time(session, [arm.config for arm in plan.arms], 1, "device/layouts", clock)
    table = multi_instance.layout_table(runs, "cnn")
    shown = table[["mode", "threads", "ranks", "samples_per_s", "normalised", "efficiency", "runs", "failed"]]
    clock.part("Instances: cnn, every physical core (notebook 07's layouts; one round, a screen)",
               ["```", shown.to_string(index=False, float_format="{:.2f}".format), "```",
                *[f.sentence for f in multi_instance.layout_findings(table, runs, "cnn")]])


def markdown(said: list[str]) -> list[str]:
    """A part's lines as a list, its tables and fenced blocks as they are."""
    out, fenced = [], False
    for line in said:
        fenced ^= line.startswith("```")
        out.append(line if fenced or line.startswith(("```", "|")) else f"- {line}")
    return out


def summary(out: Path, clock: Clock, facts: dict, began: datetime, commit: str, argv: list[str]) -> Path:
    """summary.md: the stamp, then each part's lines as they were said."""
    lines = [f"# What two cores cannot show: {facts['cpu_model']}, {began:%Y-%m-%d}", "",
             f"Measured on {began:%Y-%m-%d} from {began:%H:%M} UTC on **{facts['cpu_model']}** "
             f"({facts['physical_cores']} physical / {facts['logical_cores']} logical cores), torch "
             f"{facts['versions'].get('torch', '?')}; commit {commit}, measuring code "
             f"{records.code_version()['measuring_hash']}. Regenerate with `PYTHONPATH=. python3 "
             f"data/device/run.py {' '.join(argv)}`. Single runs and screens are said as such; only part 2's "
             "comparison is a verdict.", ""]
    for title, said in clock.parts:
        lines += [f"## {title}", "", *markdown(said), ""]
    path = out / "summary.md"
    path.write_text("\n".join(lines))
    return path


# (name, function, seconds it needs at least, runs only where the CPU has AMX or with --quick)
PARTS = (("RetinaNet standard on two cores", standard_study, 240, True),
         ("RetinaNet full rate", full_rate, 120, True),
         ("threads", scaling, 60, False), ("layouts", layouts, 60, False))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="data/device/run.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="where the record goes")
    ap.add_argument("--minutes", type=float, default=8.5, help="the call's time: no part starts after it")
    ap.add_argument("--quick", action="store_true", help="every part small, to try the script (a few minutes)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    build = Path(os.environ.setdefault("CPUOPT_BUILD", "/tmp/cpuopt-device-build"))
    began = datetime.now(timezone.utc)
    with open(args.out / "log.txt", "w") as log:
        clock = Clock(args.minutes, log)
        from cpuopt_helpers.session import Session

        session = Session()
        facts = doctor(session, args.out, clock, "quick" if args.quick else "standard")
        amx = facts["isa"].get("amx_bf16", False)
        for name, part, need, amx_only in PARTS:
            if amx_only and not (amx or args.quick):
                clock.part(name, ["not run: this CPU has no AMX (the part checks issue 35's AMX targets)"])
            elif clock.left() < need:
                clock.part(name, [f"not reached: {clock.left():.0f} s left, it needs {need} s or more"])
            else:
                clock.say(f"{name}: {clock.left():.0f} s left")
                try:
                    part(*((args.out,) if part is standard_study else (session,)), clock, args.quick)
                except Exception as exc:  # a part that breaks leaves the others their time
                    clock.part(name, [f"failed: {type(exc).__name__}: {exc}"])
            page = summary(args.out, clock, facts, began, records.own_commit(), argv)  # after each: a kill keeps it
            if (build / "results.sqlite").exists():
                shutil.copy(build / "results.sqlite", args.out / "results.sqlite")
    print(f"the record: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
