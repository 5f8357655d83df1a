"""The `cpuopt` command: doctor, bench, launch, tune, profile and workbook.

Exit codes: 0 ok, 1 a run or notebook failed, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys

from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.system import format_cpu_list


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input in one line, exit code 2."""

    def error(self, message: str):
        raise CpuoptError(f"{message} (see `{self.prog} --help`)")


TOPOLOGY_HELP = ("plan for another machine: its saved `cpuopt doctor --json` or `lscpu -p` output "
                 "(with --dry-run; a run measures this machine)")


def machine_for(args):
    """This machine, or with --topology FILE the one it describes (plans only: needs --dry-run)."""
    from cpuopt_helpers import planning

    if not getattr(args, "topology", None):
        return planning.Machine.this()
    if not args.dry_run:
        raise CpuoptError("--topology plans for another machine: add --dry-run (a run measures this machine)")
    return planning.Machine.from_file(args.topology)


def print_plan(plan, machine) -> None:
    """A dry run: the plan as shell, headed by the machine it was planned for when that is another."""
    if machine.source:
        print(f"# planned for {machine.source}: {machine.topology.summary()}")
    print(plan.shell_command())


def add_script_options(parser: argparse.ArgumentParser, what: str) -> None:
    """--script and how its throughput is read (cpuopt_helpers.scripts)."""
    parser.add_argument("--script", metavar="COMMAND", help=f"a training command instead of a workload, e.g. "
                        f"'python train.py --epochs 1'; {what}")
    parser.add_argument("--metric", metavar="REGEX", help="with --script: the throughput in its output, one group "
                        "around the number, higher is better (default: the line cpuopt_helpers.throughput prints, "
                        "else the command's wall time)")
    parser.add_argument("--metric-lower", action="store_true", help="--metric reads a time (lower is better)")


def add_knob_options(parser: argparse.ArgumentParser, where: str = "bench", knobs: tuple = ()) -> None:
    """An option for every knob of ``config.KNOBS`` that ``where`` takes: `cpuopt bench` all that
    have a flag, `cpuopt launch` (and a script's compare arms) those that act on any program."""
    from cpuopt_helpers.config import KNOBS

    for knob in knobs or KNOBS:
        if not knob.flag or (where == "launch" and not knob.launch):
            continue
        if knob.kind is bool:
            action = "store_false" if knob.default else "store_true"
            parser.add_argument(knob.flag, dest=knob.field, action=action, help=knob.help)
        elif knob.const is not None:
            parser.add_argument(knob.flag, dest=knob.field, nargs="?", const=knob.const, metavar=knob.metavar,
                                help=knob.help)
        else:
            parser.add_argument(knob.flag, dest=knob.field, type=knob.kind, default=knob.default,
                                metavar=knob.metavar, help=knob.help)


def knob_values(args, where: str = "bench", knobs: tuple = ()) -> dict:
    """The RunConfig fields the parsed knob options set."""
    from cpuopt_helpers.config import KNOBS

    return {k.field: getattr(args, k.field) for k in knobs or KNOBS
            if k.flag and (where != "launch" or k.launch) and hasattr(args, k.field)}


def split_cores(text: str, groups: int, threads: int | None, what: str = "instances") -> tuple[list, int]:
    """``--cores 0-3,8-11`` split evenly between ``groups`` instances (or ranks): the core sets and the
    cores of each, checked against ``--ncores-per-instance`` where given."""
    from cpuopt_helpers import planning

    listed = planning.parse_core_list(text)
    if len(listed) % groups:
        raise CpuoptError(f"--cores {text} lists {len(listed)} core{'s' * (len(listed) != 1)}, which do not split "
                          f"evenly into {groups} {what}: list a multiple of {groups} cores, or ask for fewer {what}")
    per = len(listed) // groups
    if threads is not None and threads != per:
        raise CpuoptError(f"--cores gives {per} cores per instance but --ncores-per-instance says {threads}")
    return [listed[i * per:(i + 1) * per] for i in range(groups)], per


def script_launch_config(name: str, options: str, command: list[str], physical_cores: int):
    """A --script comparison arm: its launch options (--threads, --cores, --ninstances and the
    launch knobs) as a script run's configuration."""
    import shlex

    from cpuopt_helpers import scripts

    parser = _Parser(prog=f"cpuopt compare --script {name}", add_help=False)
    parser.add_argument("--threads", "--ncores-per-instance", type=int, dest="threads")
    parser.add_argument("--cores")
    parser.add_argument("--ninstances", type=int, default=1)
    add_knob_options(parser, "launch")
    try:
        args = parser.parse_args(shlex.split(options))
    except ValueError as exc:
        raise CpuoptError(f"{name} {options!r} is not a valid option string: {exc}") from None
    except CpuoptError as exc:  # said without the arm parser's "(see ... --help)": it has no help of its own
        flags = ", ".join(a.option_strings[0] for a in parser._actions)
        said = str(exc).split(" (see `")[0]
        raise CpuoptError(f"{name} {options!r}: {said}; with --script the arms take launch options: {flags}") from None
    changes = dict(knob_values(args, "launch"), instances=args.ninstances)  # several copies: opt-in by naming them
    if args.cores:
        cores, per = split_cores(args.cores, args.ninstances, None)
        changes.update(cores=tuple(tuple(c) for c in cores), threads=per)
    elif args.threads is not None:
        changes["threads"] = args.threads
    elif args.ninstances > 1:
        changes["threads"] = max(1, physical_cores // args.ninstances)
    return scripts.script_config(command, physical_cores, **changes)


def minutes(text: str) -> float:
    """--budget-min's type: a positive, finite number of minutes."""
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of minutes, got {text!r}")
    return value


def build_parser(knobs: tuple = ()) -> argparse.ArgumentParser:
    """The `cpuopt` command line; ``knobs`` (default ``config.KNOBS``) make the options of bench and launch."""
    parser = _Parser(prog="cpuopt", description="Measure what makes deep-learning training fast on this CPU.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    doctor = sub.add_parser("doctor", help="machine and software facts, and what is missing")
    doctor.add_argument("--json", action="store_true", help="print the facts as JSON")
    add_bench_parser(sub, knobs)
    add_launch_parser(sub, knobs)
    add_compare_parser(sub)
    add_tune_parser(sub)
    lad = sub.add_parser("ladder", help="what the notebooks handed on: each rung, its ratio to the rung before "
                                        "and to the baseline, with intervals")
    lad.add_argument("--workload", help="one workload (default: every workload with a ladder)")
    lad.add_argument("--preset", default="standard", help="quick | standard | full (default standard, as make run)")
    lad.add_argument("--json", action="store_true", help="print the rungs as JSON")
    add_profile_parser(sub)
    add_workbook_parser(sub)
    return parser


def add_bench_parser(sub, knobs: tuple = ()) -> None:
    bench = sub.add_parser("bench", help="measure one configuration in fresh worker processes")
    bench.add_argument("--workload", default="cnn", help="cnn, transformer, rnn, retinanet, or package.module:function")
    bench.add_argument("--preset", default="quick", help="quick | standard | full (default quick)")
    add_knob_options(bench, "bench", knobs)
    bench.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="an option of the workload, e.g. --option classes=601 for retinanet (repeatable; "
                            "a name it does not have is refused with the list of those it has)")
    bench.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                       help="an environment variable for the worker, e.g. MALLOC_CONF=... (repeatable)")
    bench.add_argument("--dry-run", action="store_true", help="print the launch plan as shell commands and exit")
    bench.add_argument("--topology", metavar="FILE", help=TOPOLOGY_HELP)
    bench.add_argument("--save", action="store_true", help="also write the result to the results store")
    bench.add_argument("--json", action="store_true", help="print the RunResult as JSON")


def spellings(flag: str) -> list[str]:
    """A launch flag as torchrun and run_cpu take it: --nproc-per-node and --nproc_per_node."""
    underscored = "--" + flag[2:].replace("-", "_")
    return [flag] if underscored == flag else [flag, underscored]


def add_launch_parser(sub, knobs: tuple = ()) -> None:
    launch = sub.add_parser("launch", help="run any command with cpuopt's threads, pinning, allocator and OpenMP",
                            usage="cpuopt launch [options] -- COMMAND ...")
    launch.add_argument("--ninstances", type=int, default=1, help="instances of the command, on disjoint cores")
    launch.add_argument(*spellings("--ncores-per-instance"), type=int, help="cores (and threads) per instance")
    launch.add_argument("--cores", "--core-list", dest="cores",
                        help="cores to use, e.g. 0-3,8-11 (split evenly between instances; run_cpu's --core-list)")
    launch.add_argument(*spellings("--nproc-per-node"), type=int,
                        help="run the script under torchrun with N ranks here, each pinned to its own cores")
    for flag, what in TORCHRUN_FLAGS:
        launch.add_argument(*spellings(flag), help=what)
    add_knob_options(launch, "launch", knobs)
    launch.add_argument("--log-dir", "--log-path", dest="log_dir", default="build/launch",
                        help="one log per instance here (default build/launch; run_cpu's --log-path)")
    launch.add_argument("--instance-dirs", metavar="DIR", help="run instance N in DIR/instance_N (created), so that "
                        "copies writing files never collide; words of the command naming a file here are made absolute")
    launch.add_argument("--dry-run", action="store_true", help="print the plan as shell commands and exit")
    launch.add_argument("--topology", metavar="FILE", help=TOPOLOGY_HELP)
    launch.add_argument("program", nargs=argparse.REMAINDER, metavar="COMMAND", help="-- then the command to run")


TORCHRUN_FLAGS = (("--nnodes", "machines in the job (torchrun)"), ("--node-rank", "this machine's rank (torchrun)"),
                  ("--rdzv-backend", "rendezvous backend, e.g. c10d (torchrun)"),
                  ("--rdzv-endpoint", "HOST:PORT of the rendezvous (torchrun)"),
                  ("--rdzv-id", "job id shared by all machines (torchrun)"))


def add_compare_parser(sub) -> None:
    cmp = sub.add_parser("compare", help="adaptive A/B of two bench option strings: ratio b/a, interval, verdict")
    cmp.add_argument("--workload", help="cnn, transformer, rnn, retinanet, or package.module:function (default cnn)")
    cmp.add_argument("--preset", default="quick", help="quick | standard | full (default quick)")
    cmp.add_argument("--a", required=True, help="bench options of arm a, e.g. '' (PyTorch's defaults)")
    cmp.add_argument("--b", required=True, help="bench options of arm b, e.g. '--allocator tcmalloc'")
    cmp.add_argument("--min-rounds", type=int, default=5, help="rounds before a verdict (default 5)")
    cmp.add_argument("--max-rounds", type=int, default=14, help="rounds at most (default 14)")
    cmp.add_argument("--budget-min", type=minutes, help="minutes at most (default: no limit)")
    cmp.add_argument("--json", action="store_true", help="print the comparison with every round's throughputs")
    add_script_options(cmp, "--a/--b are then launch options, e.g. '--allocator tcmalloc', '--threads 1'")


def add_tune_parser(sub) -> None:
    tune = sub.add_parser("tune", help="search the best configuration for a workload within a time budget")
    tune.add_argument("--workload", help="cnn, transformer, rnn, retinanet, or package.module:function (default cnn)")
    tune.add_argument("--preset", default="quick", help="quick | standard | full (default quick; standard starts "
                      "from the ladder make run stored)")
    tune.add_argument("--budget-min", type=minutes, default=10, help="minutes the search may take (default 10)")
    tune.add_argument("--json", action="store_true", help="print the recommendation as JSON")
    tune.add_argument("--dry-run", action="store_true",
                      help="print the candidates the search would measure, with their cores, and exit")
    tune.add_argument("--topology", metavar="FILE", help=TOPOLOGY_HELP)
    add_script_options(tune, "its launch configuration is searched")
    tune.add_argument("--allow-instances", action="store_true",
                      help="with --script: also try several copies side by side, each on its own cores, in its own "
                      "working directory, with CPUOPT_INSTANCE set (opt-in: copies can collide on files and ports)")


def add_profile_parser(sub) -> None:
    prof = sub.add_parser("profile", help="break a oneDNN verbose log down, compare two, project the ceiling; "
                          "--whole-step: project every operator of the step from a torch.profiler trace")
    prof.add_argument("log", nargs="?", help="a oneDNN verbose log (any version), e.g. from `cpuopt bench "
                      "--onednn-verbose`; with --whole-step and no --trace: a trace from `cpuopt bench --trace FILE`")
    prof.add_argument("--compare", metavar="LOG2", help="a second log to compare against (the reference first)")
    prof.add_argument("--by", default="kind", help="kind | direction | kind_direction | impl | isa | shape")
    prof.add_argument("--steps", type=int, help="training steps the log covers (per-step figures)")
    prof.add_argument("--project", "--replay", dest="project", action="store_true",
                      help="replay every distinct primitive in isolation and report the efficiency ratio")
    prof.add_argument("--step-ms", type=float, help="measured step time, for the efficiency ratio")
    prof.add_argument("--threads", type=int, help="threads for the replay (default: physical cores); with "
                      "--whole-step --workload: the worker's threads")
    prof.add_argument("--trace", metavar="TRACE", help="also read a trace from `cpuopt bench --trace TRACE`")
    prof.add_argument("--csv", metavar="FILE", help="also write the breakdown as verbose_converter's breakdown "
                      "generator does (CSV, one row per distinct primitive, heaviest first)")
    prof.add_argument("--benchdnn", metavar="FILE", nargs="?", const="-",
                      help="benchdnn reproducer lines, one per distinct primitive (verbose_converter's syntax): "
                           "printed alone, or written to FILE beside the usual output")
    prof.add_argument("--whole-step", action="store_true",
                      help="whole-step projection from a torch.profiler trace (TRACE, or LOG --trace TRACE to add the "
                           "log's per-primitive roofline, or --workload W to capture one now): every top-level "
                           "operator with its time, FLOPs, bytes and ceiling (notebook 00's roofline), the step at "
                           "every ceiling, coverage and the gap by cause")
    prof.add_argument("--workload", help="with --whole-step: capture this workload now (a plain run for the "
                      "unprofiled step, a run traced with input shapes for the work, and one traced without them "
                      "for the times; each in a fresh worker)")
    prof.add_argument("--preset", help="with --whole-step: quick | standard | full (default quick): the preset "
                      "--workload captures, and the roofline measured where none is stored")
    prof.add_argument("--roofline", metavar="FILE", help="with --whole-step: the ceilings as JSON (`python -m "
                      "cpuopt_helpers.roofline` output); default: this machine's stored roofline, measured if none")
    prof.add_argument("--top", type=int, help="with --whole-step: operator rows printed (default 15)")
    prof.add_argument("--json", action="store_true", help="print the breakdown as JSON")


def add_workbook_parser(sub) -> None:
    wb = sub.add_parser("workbook", help="run the notebooks with papermill, build the run's report, write the "
                        "README's results block")
    wb_sub = wb.add_subparsers(dest="wb_command", required=True, parser_class=_Parser, metavar="ACTION")
    wb_run = wb_sub.add_parser("run", help="run the notebooks in order")
    wb_run.add_argument("--preset", default="standard", help="quick | standard | full (default standard)")
    wb_run.add_argument("--only", action="append",
                        help="notebook number(s) to run: --only 01, --only 01,02 or --only 01 --only 02")
    wb_run.add_argument("--out", help="output folder (default build/)")
    wb_run.add_argument("--workloads", metavar="A,B", help="the workloads of every notebook that takes a list "
                        "(built-in names or your own package.module:function)")
    wb_run.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"), default=[],
                        help="a notebook parameter for every notebook that has it, as papermill's -p "
                             "(repeatable; lists as a,b or a JSON list)")
    wb_report = wb_sub.add_parser("report", help="write BUILD/report/index.html from what the last run left in BUILD")
    wb_report.add_argument("--out", help="the run's output folder (default build/)")
    wb_readme = wb_sub.add_parser("readme", help="write the README's results section from the results store")
    wb_readme.add_argument("--preset", default="standard", help="which preset's results to report")
    wb_readme.add_argument("--write", metavar="README", help="update this README in place (else print)")
    wb_readme.add_argument("--check", metavar="README", help="exit 1 when this README's block differs from the store")
    wb_readme.add_argument("--page", metavar="FOLDER", help="also write the run's whole page there, dated and named "
                           "after the machine, and link it from the block (make run: docs/results); with --check: "
                           "the folder the block's link names")


def bench_config(args):
    """The RunConfig that `cpuopt bench` options describe: each knob's option sets its field
    (``config.KNOBS``), --env and --option their pairs."""
    from cpuopt_helpers.config import RunConfig

    return RunConfig(workload=args.workload, preset=args.preset, **knob_values(args),
                     env=parse_pairs(args.env), options=parse_pairs(args.option, "--option"))


def launch_config(args):
    """The RunConfig that `cpuopt launch` options describe: the instances and their cores
    (--cores split between the instances, or the local ranks of --nproc-per-node) and the launch knobs."""
    from cpuopt_helpers.config import RunConfig

    cores, threads = None, args.ncores_per_instance
    if args.cores is not None:  # --cores '' is no core list, not all of them
        ranks = bool(args.nproc_per_node and args.nproc_per_node > 0)
        cores, threads = split_cores(args.cores, args.nproc_per_node if ranks else args.ninstances, threads,
                                     "ranks" if ranks else "instances")
    return RunConfig(instances=len(cores) if cores else args.ninstances, threads=threads, cores=cores,
                     **knob_values(args, "launch"))


def check_nodes(nnodes: str | None, node_rank: str | None) -> None:
    """torchrun's --nnodes (N or MIN:MAX) and --node-rank (0 to N-1), checked before torchrun waits for
    machines that cannot come."""
    import re

    match = re.fullmatch(r"(\d+)(?::(\d+))?", nnodes or "1")
    low, high = (int(match.group(1)), int(match.group(2) or match.group(1))) if match else (0, 0)
    if not 1 <= low <= high:
        raise CpuoptError(f"--nnodes {nnodes!r} is not a machine count: give N, or MIN:MAX as torchrun takes it")
    if node_rank is not None and not (node_rank.isdecimal() and int(node_rank) < high):
        raise CpuoptError(f"--node-rank {node_rank!r} is not a rank of {high} machine(s): give 0 to {high - 1}, "
                          "each machine its own")


def in_launch_words(exc: CpuoptError, instances: str = "--ninstances",
                    threads: str = "--ncores-per-instance") -> CpuoptError:
    """A layout error (``config.check_layout`` speaks bench's --instances and --threads) in the
    words of `cpuopt launch` (--nproc-per-node for ranks) or of a --script arm (--ninstances, --threads)."""
    import re

    words = {"instances": instances, "threads": threads}
    text = str(exc).replace(", or --oversubscribe to measure that", "")  # a bench option, not a launch one
    return CpuoptError(re.sub(r"--(instances|threads)\b", lambda m: words[m.group(1)], text))


def _launch(args) -> int:
    from cpuopt_helpers import launch

    try:
        plan, machine = launch_plan(args)
    except CpuoptError as exc:
        raise in_launch_words(exc, "--nproc-per-node" if args.nproc_per_node is not None else "--ninstances") from None
    if args.dry_run:
        print_plan(plan, machine)
        return 0
    node = ""  # in a job of several machines, each one's logs carry its name
    if args.nproc_per_node is not None and args.nnodes not in (None, "1"):
        node = f"node{args.node_rank}" if args.node_rank is not None else f"{socket.gethostname()}-{os.getpid()}"
    cwds = launch.instance_dirs(args.instance_dirs, len(plan.instances)) if args.instance_dirs else None
    outcome = launch.run_command_plan(plan, args.log_dir, node=node, cwds=cwds)
    for inst in outcome["instances"]:
        print(f"cpuopt: instance {inst['index']} on cores {format_cpu_list(inst['cores'])}: exit code "
              f"{inst['returncode']}, log {inst['log']}", file=sys.stderr)
    if outcome["failed"] is not None:
        print(f"cpuopt: instance {outcome['failed']} failed with exit code {outcome['returncode']}; "
              "the other instances were stopped", file=sys.stderr)
        return 1
    return 0


def launch_plan(args):
    """`cpuopt launch`'s plan (its instances or local ranks) and the machine it is for."""
    from cpuopt_helpers import planning

    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not command:
        raise CpuoptError("no command given; write it after --, e.g. "
                          "cpuopt launch --allocator jemalloc -- python train.py")
    if not args.dry_run:  # a dry run only prints the plan, for another machine too
        from cpuopt_helpers.launch import findable

        findable(command[0], dict(os.environ))
    machine = machine_for(args)
    config = launch_config(args)
    given = [flag for flag, _ in TORCHRUN_FLAGS if getattr(args, flag[2:].replace("-", "_")) is not None]
    if given and args.nproc_per_node is None:
        raise CpuoptError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} torchrun's: add "
                          "--nproc-per-node N to run the script under torchrun with N ranks here")
    if args.nproc_per_node is not None:
        if args.nproc_per_node <= 0:
            raise CpuoptError(f"--nproc-per-node must be at least 1, got {args.nproc_per_node}")
        if args.ninstances != 1:
            raise CpuoptError("--nproc-per-node and --ninstances are two ways to say the same; give one")
        check_nodes(args.nnodes, args.node_rank)
        torchrun_args = [f"{flag}={getattr(args, flag[2:].replace('-', '_'))}" for flag, _ in TORCHRUN_FLAGS
                         if getattr(args, flag[2:].replace("-", "_")) is not None]
        plan = planning.build_torchrun_plan(config, machine, command, args.nproc_per_node, torchrun_args)
    else:
        plan = planning.build_plan(config, machine, command=planning.absolute_paths(command) if args.instance_dirs
                                   else command)
    return plan, machine


def _doctor(args) -> int:
    from cpuopt_helpers import peak, runtimes, system
    from cpuopt_helpers.results import ResultStore
    from cpuopt_helpers.stages.extensions import EXTENSION_FACT

    store, facts = ResultStore(), system.collect_facts()
    roofline = next((r for r in (store.get_fact(facts.fingerprint, f"roofline/{p}") for p in ("standard", "quick")) if r),
                    None)  # notebook 00's measured ceilings, where it ran
    facts = facts.replace(ipex_runtime=runtimes.ipex_facts(), peak=peak.peak_report(
        system.read_cpuinfo(), facts.physical_cores, roofline))
    facts = facts.replace(vendor_extension=runtimes.vendor_extension(
        facts.cpu_vendor, facts.ipex_runtime, store.get_fact(facts.fingerprint, EXTENSION_FACT)))
    print(json.dumps(facts.to_dict(), indent=2) if args.json else system.format_facts(facts))
    return 0


def _bench(args) -> int:
    from cpuopt_helpers import launch, planning, system
    from cpuopt_helpers.config import check_outputs
    from cpuopt_helpers.results import ResultStore

    config = bench_config(args)
    machine = machine_for(args)
    plan = planning.build_plan(config, machine)
    if not machine.source:  # a log or trace it could not write is said before anything runs, dry or not
        check_outputs(config)  # (a plan for another machine names that machine's files)
    if args.dry_run:
        print_plan(plan, machine)
        return 0
    store = ResultStore() if args.save else None  # a store it could not open, too
    facts = system.collect_facts()
    result = launch.run_plan(plan, facts)
    refused = launch.refusal(result["reason"])  # the worker refused its input: one line, exit 2
    try:  # said before it is saved, and saved even where the output's reader has gone (| head)
        if args.json or not refused:
            print(json.dumps(result, indent=2) if args.json else format_result(result), flush=True)
    finally:
        if store:
            store.save_result(result, sweep="cli", tag="cli")
    if refused:
        raise CpuoptError(refused)
    return 0 if result["status"] == "ok" else 1


def known_preset(preset: str) -> str:
    from cpuopt_helpers.config import PRESETS

    if preset not in PRESETS:
        raise CpuoptError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
    return preset


def _ladder(args) -> int:
    from cpuopt_helpers import ladder, planning, system
    from cpuopt_helpers.config import RunConfig, check_workload_spec
    from cpuopt_helpers.results import ResultStore

    known_preset(args.preset)
    store, facts = ResultStore(), system.collect_facts()
    machine = facts.fingerprint
    names = ladder.workloads(store, machine, args.preset, args.workload)
    found = {w: ladder.rungs(store, machine, w, args.preset, facts.physical_cores) for w in names}
    found = {w: rows for w, rows in found.items() if rows}
    if not found:
        if args.workload:
            check_workload_spec(args.workload)  # a misspelt name is said so, not "no ladder for it"
        raise CpuoptError(f"no ladder for {args.workload or 'any workload'} on the {args.preset} preset on this machine "
                          f"in {store.path}; run the notebooks first (make run, or --preset quick after make test)")
    if args.json:
        def command(rung) -> str:
            return planning.command_lines(RunConfig.from_dict(rung.config))["bench"]

        print(json.dumps({w: [dict(r.to_dict(), command=command(r)) for r in rows] for w, rows in found.items()},
                         indent=2))
    else:
        print("\n".join(line for w, rows in found.items() for line in ladder.format_rungs(w, rows)))
    return 0


def _compare(args) -> int:
    import shlex

    from cpuopt_helpers import launch, planning, system
    from cpuopt_helpers.config import check_outputs
    from cpuopt_helpers.results import ResultStore, run_comparison

    one_subject(args)
    if args.script is not None:  # `--script ''` is refused there, not compared as the workload
        return _compare_script(args)
    configs = []
    for name, options in (("--a", args.a), ("--b", args.b)):
        try:
            words = shlex.split(options)
        except ValueError as exc:
            raise CpuoptError(f"{name} {options!r} is not a valid option string: {exc}") from None
        if any(w in ("--workload", "--preset") or w.startswith(("--workload=", "--preset=")) for w in words):
            raise CpuoptError(f"{name} {options!r}: give --workload and --preset once, outside --a/--b")
        flag = next((w for w in words if w in ("--json", "--dry-run", "--save")), None)
        if flag:
            outside = ", and --json goes outside them" if flag == "--json" else ""
            raise CpuoptError(f"{name} {options!r}: {flag} is not an arm's option; --a and --b take what "
                              f"`cpuopt bench` measures (threads, allocator, dtype, ...){outside}")
        if any(w.startswith("--topology") for w in words):
            raise CpuoptError(f"{name} {options!r}: compare measures this machine; --topology only plans "
                              "(bench --dry-run)")
        try:
            bench_args = build_parser().parse_args(["bench", "--workload", args.workload, "--preset", args.preset,
                                                    *words])
        except CpuoptError as exc:
            raise CpuoptError(f"{name} {options!r}: {exc}") from None
        configs.append(bench_config(bench_args))
    if not 2 <= args.min_rounds <= args.max_rounds:
        raise CpuoptError(f"need 2 <= --min-rounds ({args.min_rounds}) <= --max-rounds ({args.max_rounds})")
    for name, options, config in zip(("--a", "--b"), (args.a, args.b), configs):
        try:  # a bad option fails before anything is measured, naming its arm
            planning.build_plan(config, planning.Machine.this())
            check_outputs(config)
        except CpuoptError as exc:
            raise CpuoptError(f"{name} {options!r}: {exc}") from None
    facts = system.collect_facts()
    return compared(lambda: run_comparison(
        configs[0], configs[1], ResultStore(), lambda c: launch.run(c, facts), tag="cli-compare",
        machine=facts.fingerprint, min_rounds=args.min_rounds, max_rounds=args.max_rounds,
        budget_s=args.budget_min * 60 if args.budget_min else None, resume=False, progress=shows_progress(args),
        say=rounds_to_stderr(args.json)), f"{configs[1].label()} over {configs[0].label()}", args.json)


def saying_partial(run, say):
    """``run()``; interrupted (Ctrl-C, SIGTERM), ``say`` what it measured so far (the ``partial`` the
    interruption carries), then let the interruption end the command."""
    try:
        return run()
    except KeyboardInterrupt as exc:
        if getattr(exc, "partial", None):
            say(exc.partial)
        raise


def compared(comparison, title: str, as_json: bool, **extra) -> int:
    """Run ``comparison()`` (``results.run_comparison``) and report it, or the rounds it completed."""
    result = saying_partial(comparison, lambda partial: report_comparison(dict(partial, **extra), title, as_json))
    return report_comparison(dict(result, **extra), title, as_json)


def _readme(args) -> int:
    """`cpuopt workbook readme`: print, write or check the README's block; write the run's page."""
    from pathlib import Path

    from cpuopt_helpers import pages, system
    from cpuopt_helpers.results import ResultStore, build_dir

    store, facts = ResultStore(), system.collect_facts()
    readme = Path(args.check or args.write or ".")
    link = (os.path.relpath(Path(args.page) / f"{pages.page_stem(store, facts, known_preset(args.preset))}.md",
                            readme.parent) if args.page else None)  # the block links the page written beside it
    section = pages.results_markdown(store, facts, known_preset(args.preset), page=link)
    if args.check:
        problem = pages.check_readme(Path(args.check), section)
        print(f"cpuopt: {problem}; `cpuopt workbook readme --write {args.check}` regenerates it" if problem else
              f"{args.check}: the results block is what the store gives", file=sys.stderr if problem else sys.stdout)
        return 1 if problem else 0
    if args.write:
        pages.update_readme(Path(args.write), section)
    else:
        print(section)
    if args.page:
        page = pages.write_results_page(store, facts, args.preset, Path(args.page), build_dir() / "figures")
        print(f"results page: {page}", file=sys.stderr)
    return 0


def rounds_to_stderr(as_json: bool):
    """With --json, stdout holds the result alone: each round's line goes to stderr as it lands
    (without it, the progress bar shows the running ratio)."""
    return (lambda line: print(line, file=sys.stderr, flush=True)) if as_json else None


def shows_progress(args) -> bool:
    """A progress bar for a person at a terminal: not with --json, not into a log or a pipe."""
    return not args.json and sys.stderr.isatty()


STOPPED = {"decided": "once the verdict was decided", "max_rounds": "at --max-rounds",
           "budget": "when --budget-min was spent", "failed": "because an arm cannot run",
           "interrupted": "when interrupted"}  # compare's ``stopped``, in words (--json keeps the word)


def report_comparison(result: dict, title: str, as_json: bool) -> int:
    """A comparison as JSON or in words (ratio, interval, verdict, rounds, failed runs, the run an
    interruption cut short); exit 1 without a round, 2 where a worker refused its input."""
    from cpuopt_helpers import compare, launch

    interrupted = result.get("stopped") == "interrupted"
    if as_json:
        print(json.dumps(result, indent=2), flush=True)
    else:
        print(f"b over a ({title}): {compare.describe(result)}", flush=True)
        failed = f" (and {result['failed_rounds']} with a failed run)" if result.get("failed_rounds") else ""
        why = STOPPED.get(result["stopped"], result["stopped"])
        print(f"  rounds: {result['n']} with a result{failed}, order {' '.join(result['order']) or '(none ran)'}; "
              f"stopped {why}")
        cut = result.get("cut_run")
        if cut:
            print(f"  the run cut short: arm {cut['arm']} had run {cut['ran_s']:.0f} s"
                  + (f", {cut['ran_s'] / cut['median_s']:.1f}x its median run ({cut['median_s']:.0f} s)"
                     if cut["median_s"] else "") + "; left out of the rounds")
        said = [launch.reason_line(reason) for reason in result["failures"]]
        for line in list(dict.fromkeys(said))[:3]:  # each failure once: a refused input fails every run alike
            print(f"  failed run: {line}")
        if result.get("machine_sentence"):
            print(f"  machine: {result['machine_sentence']}")
    refused = [r for r in map(launch.refusal, result["failures"]) if r] if not (result["n"] or interrupted) else []
    if refused:  # no round, for a reason the user can fix: one line, exit 2
        raise CpuoptError(refused[0])
    return 0 if result["n"] else 1


def _compare_script(args) -> int:
    from cpuopt_helpers import planning, scripts, system
    from cpuopt_helpers.results import ResultStore, run_comparison

    command, reading = scripts.parse_command(args.script), scripts.Reading(args.metric, args.metric_lower)
    if not 2 <= args.min_rounds <= args.max_rounds:
        raise CpuoptError(f"need 2 <= --min-rounds ({args.min_rounds}) <= --max-rounds ({args.max_rounds})")
    machine = planning.Machine.this()
    a, b = (script_launch_config(name, options, command, machine.topology.physical_cores)
            for name, options in (("--a", args.a), ("--b", args.b)))
    for name, options, config in (("--a", args.a, a), ("--b", args.b, b)):
        try:  # bad options fail before anything runs, naming their arm in its own words
            planning.build_plan(config, machine, command=command)
        except CpuoptError as exc:
            raise CpuoptError(f"{name} {options!r}: {in_launch_words(exc, threads='--threads')}") from None
    facts = system.collect_facts()
    return compared(lambda: run_comparison(
        a, b, ResultStore(), lambda c: scripts.run_script(c, command, reading, facts), tag="cli-compare-script",
        machine=facts.fingerprint, min_rounds=args.min_rounds, max_rounds=args.max_rounds,
        budget_s=args.budget_min * 60 if args.budget_min else None, resume=False, progress=shows_progress(args),
        say=rounds_to_stderr(args.json)), f"{scripts.label(b)} over {scripts.label(a)}, {args.script}", args.json,
        script=args.script)


def parse_pairs(items: list[str], flag: str = "--env") -> tuple[tuple[str, str], ...]:
    """KEY=VALUE pairs from --env (or --option), checked."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CpuoptError(f"{flag} {item!r} is not KEY=VALUE")
        if any(k == key for k, _ in pairs):
            raise CpuoptError(f"{flag} {key}= is given twice ({dict(pairs)[key]!r} and {value!r}): give it once")
        pairs.append((key, value))
    return tuple(sorted(pairs))


def format_result(r: dict) -> str:
    """A few readable lines about one RunResult."""
    if r["status"] != "ok":
        return f"{r['label']}: {r['status']}: {r['reason']}"
    s, p = r["step_ms"], r["phase_ms"]
    spread = f"p10 {s['p10']:.2f}, p90 {s['p90']:.2f}, " if s["n"] >= 5 else ""  # from fewer steps they are not
    lines = [
        f"{r['label']}: {r['samples_per_s']:.1f} samples/s over the timed window, step {s['median']:.2f} ms "
        f"({spread}n={s['n']})",
        f"  forward {p['forward']:.2f} ms, backward {p['backward']:.2f} ms, optimizer {p['optimizer']:.2f} ms; "
        + (f"{r['achieved_gflops']:.1f} GFLOP/s" if r["achieved_gflops"] else "GFLOP/s unknown (FLOPs not counted)")
        + f"; peak RSS {r['peak_rss_mb']:.0f} MB; "
        f"loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}; launch to first step {r['startup_s']:.2f} s",
    ]
    if r.get("system_share") is not None:
        lines.append(f"  the OS kernel took {r['system_share']:.0%} of the timed steps' CPU time (system time); "
                     f"{r['page_faults_per_step']:,.0f} page faults a step")
    lines += [f"  fell back: {f['what']} ran {f['fell_back_to']} ({f['reason']})" for f in r.get("fallbacks") or []]
    for i in r["instances"]:
        lines.append(f"  instance {i['index']}: cores {format_cpu_list(i['cores'])} ({i['pinned_by']}), "
                     f"{i['torch_threads']} threads, {i['samples_per_s']:.1f} samples/s over its steps alone"
                     + (f", LD_PRELOAD={i['ld_preload']}" if i["ld_preload"] else ""))
    lines += [f"  warning: {w}" for w in r["warnings"]]
    return "\n".join(lines)


def _profile(args) -> int:
    import math

    if args.steps is not None and args.steps <= 0:
        raise CpuoptError(f"--steps must be a positive integer, got {args.steps}")
    if args.step_ms is not None and not (math.isfinite(args.step_ms) and args.step_ms > 0):
        raise CpuoptError(f"--step-ms must be a positive number of milliseconds (the measured step), "
                          f"got {args.step_ms}")
    if args.threads is not None and not 1 <= args.threads <= (os.cpu_count() or 1):
        raise CpuoptError(f"--threads must be 1 to {os.cpu_count()} (this machine's logical CPUs), got {args.threads}")
    if args.top is not None and (args.top <= 0 or not args.whole_step):
        raise CpuoptError(f"--top {args.top}: give a positive count of operator rows, with --whole-step"
                          if args.whole_step else "--top is for --whole-step (its operator rows)")
    args.top = args.top or 15
    if not args.whole_step and (args.preset or args.roofline):
        raise CpuoptError(f"--{'preset' if args.preset else 'roofline'} is for --whole-step (the ceilings it "
                          "projects with); a oneDNN log is profiled as it is")
    args.preset = known_preset(args.preset or "quick")
    if args.whole_step:
        return _whole_step(args)
    if args.step_ms is not None and not args.project:
        raise CpuoptError("--step-ms is for --project (the measured step the efficiency ratio divides by)")
    if args.workload:
        raise CpuoptError("--workload is for --whole-step (capture and project a step); a log is profiled as it is")
    if not args.log:
        raise CpuoptError("name a oneDNN verbose log (`cpuopt bench --onednn-verbose FILE`), or use --whole-step")
    from cpuopt_helpers.profiledn import replay

    meta = replay.log_meta(args.log, needed=(() if args.steps else ("steps",))
                           + (("threads", "cores") if args.project and not args.threads else ()))
    args.steps = args.steps or meta.get("steps")
    if args.project and not args.steps:
        raise CpuoptError("--project needs --steps N (how many training steps the log covers); logs captured by "
                          "`cpuopt bench --onednn-verbose` record it beside the log")
    out, parsed, table = profile_log(args)
    if args.benchdnn == "-" and not args.json:  # the reproducer lines alone, ready for a file
        print("\n".join(out["benchdnn"]))
        if out["benchdnn_note"]:
            print(f"cpuopt: {out['benchdnn_note']}", file=sys.stderr)
        return 0
    if args.project:
        out.update(project(args, meta))
    if args.trace:
        from cpuopt_helpers.profiledn import trace

        summary = trace.summarize_trace(args.trace)
        out["trace"] = {k: v for k, v in summary.items() if k != "top_ops"}
        out["trace"]["top_ops"] = summary["top_ops"].to_dict(orient="records")
        out["trace_findings"] = [f.sentence for f in trace.trace_findings(summary)]
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        print_profile(args, out, parsed, table)
    return 0


def write_file(path: str, text: str) -> None:
    """Write what a command was asked to write, or say in one line why it cannot."""
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise CpuoptError(f"cannot write {path}: {exc.strerror}; name a file in a folder you can write") from exc


def profile_log(args) -> tuple[dict, object, object]:
    """`cpuopt profile LOG`: the breakdown, its findings, the comparison with --compare, the CSV
    (--csv) and benchdnn reproducer lines (--benchdnn) of one oneDNN log."""
    from cpuopt_helpers import profiledn

    parsed = profiledn.parse_log(args.log)
    parsed.require_primitives()
    other = profiledn.parse_log(args.compare) if args.compare else None
    if other is not None:
        other.require_primitives()
    table = profiledn.breakdown(parsed.exec, args.by, args.steps)
    if args.csv:
        write_file(args.csv, profiledn.converter_breakdown(parsed.exec))
    out = {"summary": parsed.summary(), "total_ms": float(parsed.exec["time_ms"].sum()),
           "exec_lines": parsed.counts["exec"], "counts": parsed.counts, "info": parsed.info,
           "malformed_examples": parsed.malformed_examples,
           "breakdown": table.reset_index().to_dict(orient="records"),
           "findings": [f.sentence for f in profiledn.findings(parsed.exec, args.steps)]}
    if args.benchdnn:
        lines, skipped = profiledn.benchdnn_lines(parsed.exec)
        note = ("no benchdnn line for " + ", ".join(f"{n} distinct {k}" for k, n in skipped.items())
                + " (graph partitions and kinds without a benchdnn driver)") if skipped else ""
        out.update(benchdnn=lines, benchdnn_skipped=skipped, benchdnn_note=note)
        if args.benchdnn != "-":
            write_file(args.benchdnn, "\n".join(lines) + "\n")
            out["findings"].append(f"{len(lines)} benchdnn reproducer lines written to {args.benchdnn} "
                                   f"(each runs as `benchdnn --mode=P LINE`)" + (f"; {note}" if note else "") + ".")
    if other is not None:
        labels = ("A", "B")
        out["compare"] = profiledn.compare(parsed.exec, other.exec, args.by, labels).reset_index().to_dict(
            orient="records")
        out["compare_findings"] = [f.sentence for f in profiledn.compare_findings(parsed.exec, other.exec, labels)]
    return out, parsed, table


def project(args, meta: dict) -> dict:
    """--project: every distinct primitive replayed in isolation on the log's cores, the efficiency ratio."""
    from cpuopt_helpers import system
    from cpuopt_helpers.profiledn import replay

    topo = system.topology()
    threads = args.threads or meta.get("threads") or topo.physical_cores
    cores = meta.get("cores") if threads == meta.get("threads") else sorted(topo.core_order()[:threads])
    proj = replay.project_log(args.log, args.steps, args.step_ms, threads, cores)
    return {"projection": {k: v for k, v in proj.items() if k != "table"},
            "projection_findings": [f.sentence for f in replay.projection_findings(proj)]}


def readable(table):
    """A table as people read it: shares as percentages, times to 0.01 ms (--json keeps every digit)."""
    shares = [c for c in table.columns if "share" in str(c)]
    return table.round(2).astype({c: object for c in shares}).assign(
        **{str(c): table[c].map(lambda v: f"{v:.0%}" if v == v else "") for c in shares})


def print_profile(args, out: dict, parsed, table) -> None:
    import pandas as pd

    with pd.option_context("display.width", 160, "display.max_columns", 20, "display.max_colwidth", 60):
        print(parsed.summary())
        print(readable(table).to_string())
        if args.compare:
            print(f"\nA = {args.log}, B = {args.compare}")
            print(readable(pd.DataFrame(out["compare"])).to_string(index=False))
    for key in ("findings", "compare_findings", "projection_findings", "trace_findings"):
        for line in out.get(key, []):
            print(f"- {line}")
    if parsed.counts["malformed"]:
        print(f"- {parsed.counts['malformed']} malformed line(s) skipped, e.g. {parsed.malformed_examples[0]}")


def _whole_step(args) -> int:
    """`cpuopt profile --whole-step`: the projection of every operator of a traced step."""
    from cpuopt_helpers.profiledn import wholestep
    from cpuopt_helpers.profiledn.trace import load_events

    if args.workload and (args.log or args.trace):
        raise CpuoptError("--whole-step takes a trace (TRACE or LOG --trace TRACE) or --workload W to capture one, "
                          "not both")
    if args.compare or args.project or args.csv or args.benchdnn:
        raise CpuoptError("--whole-step does not combine with --compare, --project, --csv or --benchdnn (a oneDNN "
                          "log's breakdown); run them apart")
    log_file, trace_file = (args.log, args.trace) if args.trace else (None, args.log)
    plain_ms, out = None, {}
    if args.workload:
        trace_file, plain_ms = capture_step(args)
        out["trace_file"] = trace_file
    if not trace_file:
        raise CpuoptError("--whole-step needs a trace (`cpuopt bench --trace FILE`) or --workload W to capture one")
    events = load_events(trace_file)  # a file that is no trace is refused before the ceilings are measured and stored
    ceilings = wholestep.machine_ceilings(args.preset, args.roofline)
    result = wholestep.whole_step(trace_file, ceilings, args.steps, plain_ms, events=events)
    out.update({k: v for k, v in result.items() if k not in ("rows", "table")})
    out["operators"] = wholestep.records(result["table"])
    out["findings"] = [f.sentence for f in wholestep.wholestep_findings(result, args.workload or "")]
    prims = None
    if log_file:
        from cpuopt_helpers import profiledn

        parsed = profiledn.parse_log(log_file)
        parsed.require_primitives()
        prims = wholestep.primitive_roofline(parsed.exec, ceilings, args.steps or result["steps"])
        out["primitives"] = wholestep.records(prims)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        print_whole_step(args, out, result, ceilings, plain_ms, log_file, prims)
    return 0


def capture_step(args) -> tuple[str, float]:
    """--whole-step --workload W: a plain run, a run traced with shapes and a light trace, each
    in a fresh worker; the shaped trace's file and the unprofiled step time."""
    from cpuopt_helpers.config import RunConfig
    from cpuopt_helpers.profiledn import wholestep
    from cpuopt_helpers.profiledn.capture import safe_name
    from cpuopt_helpers.results import build_dir

    config = RunConfig(workload=args.workload, preset=args.preset, threads=args.threads,
                       **({"steps": args.steps} if args.steps else {}))
    folder = build_dir() / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    trace_file = str(folder / f"{safe_name(args.workload)}_{args.preset}.trace.json")
    traced, timed, plain = wholestep.capture(config, trace_file)
    for run in (plain, traced, timed):
        if run["status"] != "ok":
            reason = (run.get("reason") or "no reason given").strip().splitlines() or ["no reason given"]
            if run is not timed:
                raise CpuoptError(f"the {args.workload} run ended {run['status']}: {reason[-1][:300]}")
            logging.getLogger(__name__).warning("the light trace's run ended %s (%s): the times are the shaped "
                                                "trace's", run["status"], reason[-1][:200])
    return trace_file, plain["step_ms"]["median"]


def print_whole_step(args, out: dict, result: dict, ceilings, plain_ms: float | None, log_file: str | None,
                     prims) -> None:
    import pandas as pd

    from cpuopt_helpers.profiledn import wholestep

    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 40):
        if "trace_file" in out:
            print(f"trace: {out['trace_file']}")
        gemm = ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in ceilings.gemm_gflops.items())
        print(f"ceilings ({ceilings.source}): GEMM {gemm}; copy {ceilings.copy_gbs:.1f} GB/s")
        print(f"step {result['step_ms']:.2f} ms traced" + (f" ({plain_ms:.2f} ms unprofiled)" if plain_ms else "")
              + (f"; times from a light trace (with shapes {result['shaped_step_ms']:.2f} ms)"
                 if result["timing"] == "light trace" else "")
              + f", projected {result['projected_ms']:.3f} ms; coverage {result['coverage']:.1%} of the operators' "
              f"time ({result['step_coverage']:.1%} of the step); between ops {result['between_ops_share']:.1%} "
              "of the step")
        print("\ngap by cause (ms per step, share of the step):")
        print(wholestep.cause_table(result).round(3).to_string())
        cols = ["phase", "op", "shapes", "bound", "calls", "ms", "share", "intensity", "achieved_gflops",
                "achieved_gbs", "of_ceiling", "projected_ms"]
        print(f"\ntop {args.top} of {len(result['table'])} operator rows (per step):")
        print(result["table"][cols].head(args.top).round(3).to_string(index=False))
        if log_file:
            print(f"\noneDNN primitives of {log_file} (per step):")
            print(prims.head(args.top).round(3).to_string(index=False))
    for line in out["findings"]:
        print(f"- {line}")


def one_subject(args) -> None:
    """compare and tune measure a workload or a script, never both (--workload: cnn where neither is given)."""
    if args.script is not None and args.workload is not None:
        raise CpuoptError(f"give --workload or --script, not both: the script {args.script!r} is measured as it is, "
                          f"and --workload {args.workload} would not be")
    if (args.metric or args.metric_lower) and args.script is None:
        raise CpuoptError("--metric reads a --script's output; a workload reports its own samples/s")
    args.workload = args.workload or "cnn"


def _tune(args) -> int:
    from cpuopt_helpers import scripts, system, tune
    from cpuopt_helpers.results import ResultStore

    one_subject(args)
    if args.allow_instances and not args.script:
        raise CpuoptError("--allow-instances is for --script (a workload's search always includes several ranks)")
    command = scripts.parse_command(args.script) if args.script is not None else None  # `--script ''` refused
    reading = scripts.Reading(args.metric, args.metric_lower)  # a bad --metric is refused in a dry run too
    if args.dry_run or args.topology:
        machine = machine_for(args)  # --topology without --dry-run is refused here
        facts = tune.machine_facts(machine) if machine.source else system.collect_facts()
        rows = tune.search_plan(args.workload, args.preset, facts, machine, command, args.allow_instances)
        print(json.dumps(rows, indent=2) if args.json else tune.format_search_plan(rows, machine))
        return 0
    if args.script:
        facts = system.collect_facts()
        return tuned(lambda: tune.tune(
            scripts.SCRIPT, args.budget_min, facts=facts, progress=shows_progress(args), script=command,
            reading=reading, runner=scripts.stored_runner(command, reading, facts, ResultStore()),
            instances=args.allow_instances),
            args.json)
    from cpuopt_helpers import launch

    facts = system.collect_facts()
    store = ResultStore()
    ladder = store.ladder(facts.fingerprint, args.workload, args.preset)
    runner = scripts.storing(lambda config: launch.run(config, facts), store, f"cli-tune-{args.workload}",
                             "cli-tune")
    return tuned(lambda: tune.tune(args.workload, args.budget_min, args.preset, facts, ladder, runner=runner,
                                   progress=shows_progress(args)), args.json)


def tuned(search, as_json: bool) -> int:
    """Run ``search()`` (``tune.tune``) and print its recommendation, or what it measured so far (a
    ranking, and the confirmation's rounds where it had begun)."""
    from cpuopt_helpers import tune

    result = saying_partial(search, lambda partial: print(
        json.dumps(partial, indent=2) if as_json else tune.format_partial(partial), flush=True))
    print(json.dumps(result, indent=2) if as_json else tune.format_tune(result))
    return 0


def _workbook(args) -> int:
    from pathlib import Path

    from cpuopt_helpers import system, workbook

    if args.wb_command == "readme":
        return _readme(args)
    from datetime import datetime, timezone

    from cpuopt_helpers.report import build_report
    from cpuopt_helpers.results import ResultStore, build_dir, loaded_sentence

    out = Path(args.out).resolve() if args.out else build_dir().resolve()
    if args.wb_command == "report":
        if not out.exists():  # a report of nothing, in a folder made for it, would hide a mistyped --out
            raise CpuoptError(f"--out {args.out}: no such folder; give the folder a run wrote (default build/)")
        if out.is_dir() and not any((out / name).exists() for name in ("notebooks", "results.sqlite", "report")):
            raise CpuoptError(f"--out {args.out or out}: holds no workbook run (no notebooks/, results.sqlite or "
                              "report/); give the folder `cpuopt workbook run --out` wrote (default build/)")
        print(f"report: {build_report(out, system.collect_facts())}")
        return 0
    only = [n for part in args.only for n in part.split(",") if n] if args.only is not None else None
    if only == []:  # `--only ''`: not every notebook
        raise CpuoptError("--only names no notebook; give numbers or names, e.g. --only 01,03")
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    report = workbook.run_workbook(preset=args.preset, only=only, out=args.out,
                                   parameters=workbook.cli_parameters(args.workloads, args.parameter))
    print(workbook.format_report(report))
    said = loaded_sentence([r for r in ResultStore(out / "results.sqlite").results() if r["created_at"] >= started])
    if said:  # why a run took longer than it should, and why its verdicts may be within noise
        print(said)
    print(f"report: {build_report(out, system.collect_facts())}")
    return 0 if all(r["status"] == "ok" for r in report) else 1


def _glue_option_strings(argv: list[str]) -> list[str]:
    """`compare --b '--channels-last'`: argparse would read the value as an option; glue it."""
    if "compare" not in argv:
        return argv
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("--a", "--b") and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C raises KeyboardInterrupt; ``signum`` makes the exit code."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop_on_termination() -> None:
    """SIGTERM and SIGHUP (``timeout``, ``kill``, a CI job cancelled, a terminal closed) stop a command
    as Ctrl-C does: its workers, in sessions of their own, are stopped, and what it stored is kept.
    Once: a second signal (bash passes a closed terminal's SIGHUP on) does not cut the clean-up short.
    A signal the caller ignores stays ignored (``nohup`` keeps a run going after its terminal closes)."""
    import signal

    watched = [sig for sig in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(sig) == signal.SIG_DFL]

    def stop(signum, frame):
        for sig in watched:
            signal.signal(sig, signal.SIG_IGN)
        raise Terminated(signum)

    for sig in watched:
        signal.signal(sig, stop)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="cpuopt: %(levelname)s: %(message)s")
    if argv is None:  # the command line (a caller in Python keeps its own signal handlers)
        _stop_on_termination()
    if os.getcwd() not in sys.path:  # the `cpuopt` script, unlike `python -m`, does not look in the
        sys.path.append(os.getcwd())  # current folder, where a user's package.module:function sits
    try:
        words = _glue_option_strings(sys.argv[1:] if argv is None else list(argv))
        args, extra = build_parser().parse_known_args(words)
        if extra:  # said with the subcommand's help, where the options it takes are
            sub = [args.wb_command] if getattr(args, "wb_command", None) else []
            where = " ".join(["cpuopt", args.command, *sub])
            raise CpuoptError(f"unrecognized arguments: {' '.join(extra)} (see `{where} --help`)")
        commands = {"doctor": _doctor, "bench": _bench, "launch": _launch, "profile": _profile, "workbook": _workbook,
                    "tune": _tune, "compare": _compare, "ladder": _ladder}
        return commands[args.command](args)
    except CpuoptError as exc:
        print(f"cpuopt: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head`
        return 0
    except KeyboardInterrupt as exc:  # Ctrl-C, or Terminated: 128 + the signal, as a shell reports it
        print("cpuopt: interrupted; its workers are stopped, and the runs it stored are kept", file=sys.stderr)
        return 128 + getattr(exc, "signum", 2)
    except OSError as exc:  # a folder or file the command was pointed at, or one it writes into
        where = f" {exc.filename}" if exc.filename else ""
        print(f"cpuopt: error: cannot use{where}: {exc.strerror or exc}; give a path this user can read and "
              "write (a folder where a folder is expected)", file=sys.stderr)
        return 2
    except Exception:  # a bug in cpuopt: the traceback, and where to send it
        import traceback

        traceback.print_exc()
        print("cpuopt: this is a bug in cpuopt, not in your input: please report it with the traceback above "
              "and `cpuopt doctor --json`", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
