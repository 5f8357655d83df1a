"""Any training script as a measured run (`cpuopt compare --script`, `cpuopt tune --script`).

A run is the script started under a launch configuration (threads, cores, affinity,
allocator, OpenMP runtime: what `cpuopt launch` sets; the script's own code is not
touched), in a fresh process, with its exit code checked: a script that fails is a failed
run with the tail of its output, never a result. Its throughput, higher is better, is read
in the first way that applies:

1. ``--metric REGEX``: the last match of the expression's one group in the output (stdout
   and stderr), a rate such as samples/s; with ``--metric-lower`` a time (seconds a step,
   an epoch), taken as its inverse.
2. The line ``cpuopt_helpers.throughput`` prints (the script called ``throughput.step`` per
   step, its warm-up steps untimed, or ``throughput.report`` once).
3. Otherwise the wall time of the whole command, inverted: start-up, data loading and
   warm-up included, which the result says.

``python`` (or ``python3``) as the command's first word is the interpreter cpuopt runs
under, so the script sees the same environment in every configuration. Several copies of
one script side by side (each on its own cores) are opt-in only, since copies can collide
on files and ports: `cpuopt tune --script ... --allow-instances`, or a comparison arm with
``--ninstances N``. Each copy then runs in its own working directory (``instance_N`` of a
fresh folder; words of the command that name a file here are made absolute) with
CPUOPT_INSTANCE and CPUOPT_INSTANCES set, and the throughput is the copies' sum (with the
wall time: copies / wall time).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from cpuopt_helpers import launch, planning, throughput
from cpuopt_helpers.config import RunConfig, normalise
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.stages import multi_instance, threads
from cpuopt_helpers.system import Facts

SCRIPT = "script"  # RunConfig.workload of a script run; the command's hash is its one option
WALL_TIME = "the wall time of the whole command (start-up, data loading and warm-up included)"
IN_SCRIPT = ("channels-last and torch.compile (notebook 05), foreach/fused optimizers (notebook 05), bf16 autocast "
             "(notebook 06, where the CPU has a bf16 fast path): changes to the script's own code, which "
             "`--script` cannot make")


def parse_command(text: str) -> list[str]:
    """The script's command line as words, its ``python`` the interpreter running cpuopt."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise CpuoptError(f"--script {text!r} is not a valid command line: {exc}") from None
    if not words:
        raise CpuoptError("--script needs a command, e.g. --script 'python train.py --epochs 1'")
    if words[0] in ("python", "python3"):
        words[0] = sys.executable
    launch.findable(words[0], dict(os.environ))  # a program not there: said once, before any round
    if words[0] == sys.executable and len(words) > 1 and words[1].endswith(".py") and not Path(words[1]).is_file():
        raise CpuoptError(f"no such script {words[1]!r} (from {os.getcwd()}); give its path from here")
    return words


def command_hash(command: list[str]) -> str:
    return hashlib.sha256(shlex.join(command).encode()).hexdigest()[:10]


def script_config(command: list[str], physical_cores: int, **changes) -> RunConfig:
    """The launch configuration of a script run: PyTorch's defaults with ``changes``; the
    command's hash keeps each script's runs (and stored sweeps) apart."""
    base = RunConfig(workload=SCRIPT, options=(("command", command_hash(command)),))
    return normalise(base, physical_cores).replace(**changes)


def label(config: RunConfig) -> str:
    """A script run's name: what its launch configuration changes, nothing else."""
    plain = config.replace(options=())
    return SCRIPT + plain.label()[len(f"{plain.workload}[{plain.preset}]"):]


@dataclass(frozen=True)
class Reading:
    """How the throughput is read from a run's output (see the module's docstring)."""

    pattern: str | None = None
    lower: bool = False

    def __post_init__(self):
        if self.pattern is None:
            if self.lower:
                raise CpuoptError("--metric-lower needs --metric REGEX (the time to read)")
            return
        try:
            groups = re.compile(self.pattern).groups
        except re.error as exc:
            raise CpuoptError(f"--metric {self.pattern!r} is not a regular expression: {exc}") from None
        if groups != 1:
            raise CpuoptError(f"--metric {self.pattern!r} needs exactly one group around the number, e.g. "
                              "'samples/s: ([0-9.]+)'")

    def read(self, output: str, wall_s: float) -> tuple[float | None, str]:
        """(throughput, how it was read); (None, why not) when the output holds none."""
        if self.pattern is not None:
            found = re.findall(self.pattern, output)
            if not found:
                return None, f"--metric {self.pattern!r} matched nothing in the script's output"
            try:
                value = float(found[-1])
            except ValueError:
                return None, f"--metric {self.pattern!r} matched {found[-1]!r}, which is not a number"
            if self.lower:
                if value <= 0:
                    return None, f"--metric-lower read {value}, not a positive time"
                return 1.0 / value, f"1 / the time --metric {self.pattern!r} read (last match: {value:g})"
            return value, f"--metric {self.pattern!r} (last match)"
        reports = [line[len(throughput.MARKER):] for line in output.splitlines() if line.startswith(throughput.MARKER)]
        if reports:
            import json

            try:
                data = json.loads(reports[-1])
            except ValueError:
                data = None
            if not isinstance(data, dict):
                return None, f"the script's throughput line {reports[-1][:80]!r} is not the JSON throughput.step writes"
            if data.get("samples_per_s") is None:
                return None, (f"the script called throughput.step only {data.get('steps')} time(s), no more than its "
                              f"{data.get('warmup')} warm-up steps: nothing was timed (CPUOPT_WARMUP_STEPS sets them)")
            how = (f"the script's throughput.step: {data['steps']} timed steps after {data['warmup']} warm-up"
                   if "steps" in data else "the script's throughput.report")
            return data["samples_per_s"], how
        return 1.0 / wall_s, WALL_TIME


def run_script(config: RunConfig, command: list[str], reading: Reading, facts: Facts | None = None,
               machine: planning.Machine | None = None, timeout_s: float | None = 1800) -> dict:
    """Run the script once under ``config`` (several copies, each in its own working directory,
    where ``config.instances`` > 1); a result shaped as the worker's (storable, comparable)."""
    copies = config.instances > 1
    plan = planning.build_plan(config, machine or planning.Machine.this(),
                             command=planning.absolute_paths(command) if copies else command)
    with tempfile.TemporaryDirectory(prefix="cpuopt-script-") as logs:
        cwds = launch.instance_dirs(logs, config.instances) if copies else None
        start = time.monotonic()
        outcome = launch.run_command_plan(plan, logs, echo=None, timeout_s=timeout_s, cwds=cwds)
        wall_s = time.monotonic() - start
        outputs = [Path(i["log"]).read_text(errors="replace") for i in outcome["instances"]]
    result = {"config": config.to_dict(), "config_hash": config.config_hash(),
              "label": f"{label(config)}: {shlex.join(command)}",
              "command": shlex.join(command), "command_hash": command_hash(command), "wall_s": wall_s,
              "pinning": plan.pinning, "argv": [list(i.argv) for i in plan.instances],
              "env": {k: v for k, v in plan.instances[0].env.items() if k != "PYTHONPATH"},
              "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "system": facts.fingerprint if facts else None, "samples_per_s": None, "metric": None}
    which = outcome["failed"] or 0
    tail = "\n".join(outputs[which].splitlines()[-15:])
    copy = f"copy {which} of {len(outputs)}: " if copies else ""
    if outcome.get("timed_out"):
        return dict(result, status="failed", reason=f"{copy}still running after {timeout_s:.0f} s; stopped\n{tail}")
    if outcome["failed"] is not None:
        return dict(result, status="failed", reason=f"{copy}exit code {outcome['returncode']}\n{tail}")
    readings = [reading.read(output, wall_s) for output in outputs]
    for i, (value, how) in enumerate(readings):
        if value is None:
            tail = "\n".join(outputs[i].splitlines()[-15:])
            return dict(result, status="failed", reason=f"{f'copy {i} of {len(outputs)}: ' if copies else ''}{how}\n{tail}")
    how = readings[0][1] + (f", summed over {len(outputs)} copies" if copies else "")
    return dict(result, status="ok", samples_per_s=sum(v for v, _ in readings), metric=how, reason="",
                copies=[{"index": i, "samples_per_s": v} for i, (v, _) in enumerate(readings)])


def stored_runner(command: list[str], reading: Reading, facts: Facts, store, tag: str = "cli-tune-script"):
    """``run_script`` for the tuner, each run also written to the results store (the report's
    table shows it), in one sweep per search."""
    return storing(lambda config: run_script(config, command, reading, facts), store,
                   f"{tag}-{command_hash(command)}", tag)


def storing(run, store, sweep_prefix: str, tag: str):
    """``run`` (a RunConfig to its result) with each result written to ``store`` as it comes, in
    one sweep per search (``sweep_prefix`` and the time): an interrupted search keeps its runs."""
    sweep = f"{sweep_prefix}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
    count = [0]

    def stored(config: RunConfig) -> dict:
        result = run(config)
        store.save_result(result, sweep=sweep, arm=0, round=count[0], tag=tag)
        count[0] += 1
        return result

    return stored


def search_space(default: RunConfig, facts: Facts, instances: bool = False) -> list[RunConfig]:
    """The launch-level knobs, one change at a time: threads, allocator, OpenMP runtime and its
    KMP_BLOCKTIME, no pinning; with ``instances`` (opt-in, see the module's docstring) also
    several copies on disjoint cores, the layouts notebook 07 measures."""
    physical = facts.physical_cores
    out = [default.replace(threads=t) for t in threads.thread_counts(physical, physical) if t != default.threads]
    if instances:
        out += [default.replace(threads=t, instances=n) for t, n in multi_instance.layouts(
            multi_instance.machine_of(facts)) if n > 1]
    out += [default.replace(allocator=a) for a, path in facts.allocators.items() if path]
    if facts.openmp.get("intel"):
        out += [default.replace(omp_runtime="intel"), default.replace(omp_runtime="intel", kmp_blocktime=1)]
    out.append(default.replace(affinity="none"))
    return out


def run_cpu_ready(command: list[str]) -> None:
    """PyTorch's run_cpu runs a Python script (python SCRIPT.py ...), nothing else: say so early."""
    if not (len(command) > 1 and command[0] == sys.executable and command[1].endswith(".py")):
        raise CpuoptError("cpuopt tune --script also measures PyTorch's run_cpu, which runs Python scripts only: "
                          "give --script 'python SCRIPT.py ...'")
    if not Path(command[1]).is_file():
        raise CpuoptError(f"no such script {command[1]!r}")
