"""RunConfig: one measured configuration, validated, serialisable and hashable."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cpuopt_helpers.errors import CpuoptError

PRESETS = ("quick", "standard", "full")
# preset -> (timed steps, warm-up steps) used by the notebooks
PRESET_STEPS = {"quick": (20, 3), "standard": (6, 1), "full": (30, 5)}


@dataclass(frozen=True)
class RunConfig:
    """Everything that decides how one measured run is launched and what it trains.

    ``threads`` is per instance; None means the physical cores divided by the instances.
    ``cores`` pins instance i to cores[i]; None lets the launcher hand out cores.
    ``env`` adds extra environment variables (as sorted key/value pairs).
    ``options`` are the workload's own options (as sorted key/value pairs), passed to its
    ``build(preset, **options)``, e.g. RetinaNet's ``frozen_bn=fused``.
    ``affinity``: compact (consecutive cores), scatter (spread across sockets) or none (no
    pinning). ``oversubscribe`` allows more threads than cores, to measure what that costs.
    ``dtype="bf16"`` trains under ``torch.autocast("cpu", dtype=torch.bfloat16)`` with the
    loss in fp32, unless ``bf16_loss`` (to show why the paper keeps it in fp32).
    ``loader_workers`` > 0 feeds batches through a DataLoader with that many worker
    processes. ``launcher="run_cpu"`` runs the worker under PyTorch's own launcher with its
    defaults (the comparison users ask for).
    ``runtime``: the interpreter the worker runs under: main (this one), ipex (the
    ``.venv-ipex`` built by ``make ipex``: torch 2.8 + IPEX 2.8) or a path to a python.
    ``ipex`` applies ``ipex.optimize(model, optimizer, dtype)`` (needs an IPEX runtime).
    ``compile`` wraps the model in ``torch.compile`` (default or max-autotune mode of Inductor, or
    AMD's zentorch backend); ``compile_scope`` step compiles the whole training step instead: the
    forward with its loss as one region (its backward compiled with it) and ``optimizer.step``.
    ``optimizer`` sgd (momentum 0.9), adamw or lamb (cpuopt_helpers.kernels.lamb);
    ``optimizer_impl`` default (torch's choice: a per-parameter loop on CPU), foreach or fused.
    ``mode``: independent (instances train alone; throughput summed) or ddp (instances are
    ranks of one DistributedDataParallel job on gloo). ``batch_policy``: per_rank (each
    instance trains batch_size samples a step) or global (batch_size is split between ranks).
    ``onednn_verbose`` is a file that receives the oneDNN verbose log of the timed steps
    (``FILE.N`` for instance N when several run); ``trace`` a file that receives the
    torch.profiler Chrome trace of the timed steps (and ``FILE.ops.json``, its operators), with
    the operators' input shapes unless ``trace_shapes`` is False (a light trace, for times only).

    The knobs a user sets are listed once, in ``KNOBS`` below: the CLI's options, the
    launcher's environment and the command lines that train with a config all come from it.
    """

    workload: str = "cnn"
    preset: str = "quick"
    batch_size: int | None = None
    steps: int = 20
    warmup: int = 3
    threads: int | None = None
    instances: int = 1
    mode: str = "independent"
    cores: tuple[tuple[int, ...], ...] | None = None
    allocator: str = "default"
    omp_runtime: str = "gnu"
    kmp_blocktime: int | None = None
    dtype: str = "fp32"
    channels_last: bool = False
    seed: int = 0
    onednn_verbose: str | None = None
    trace: str | None = None
    trace_shapes: bool = True
    affinity: str = "compact"
    oversubscribe: bool = False
    loader_workers: int = 0
    launcher: str = "cpuopt"
    bf16_loss: bool = False
    runtime: str = "main"
    ipex: bool = False
    compile: str | None = None
    compile_scope: str = "model"
    optimizer: str = "sgd"
    optimizer_impl: str = "default"
    batch_policy: str = "per_rank"
    timeout_s: float = 600.0
    env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    options: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def __post_init__(self):
        """env and options given as dicts (``RunConfig(options={"width": "2048"})``) are kept as the
        sorted pairs a RunConfig holds, core sets as tuples: a config hashes the same however written."""
        for key in ("env", "options"):
            if isinstance(getattr(self, key), dict):
                object.__setattr__(self, key, pairs(getattr(self, key)))
        if self.cores is not None:
            object.__setattr__(self, "cores", tuple(tuple(c) for c in self.cores))

    @classmethod
    def for_preset(cls, workload: str, preset: str, **fields) -> "RunConfig":
        """A config with the preset's step counts (a notebook's starting point)."""
        if preset not in PRESET_STEPS:
            raise CpuoptError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
        steps, warmup = PRESET_STEPS[preset]
        return cls(workload=workload, preset=preset, steps=steps, warmup=warmup).replace(**fields)

    def replace(self, **changes) -> "RunConfig":
        """A copy with some fields changed (configs are never edited in place)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["cores"] = [list(c) for c in self.cores] if self.cores is not None else None
        d["env"] = dict(self.env)
        d["options"] = dict(self.options)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise CpuoptError(f"unknown RunConfig field(s) {sorted(unknown)}; known: {sorted(known)}")
        d = dict(d)  # cores as tuples: __post_init__
        env, options = dict(d.get("env") or {}), dict(d.get("options") or {})
        if "CPUOPT_RETINANET" in env:  # stored before workload options: RetinaNet's variant, as options
            options.update(dict(p.split("=", 1) for p in env.pop("CPUOPT_RETINANET").split(",") if "=" in p))
        d["env"], d["options"] = pairs(env), pairs(options)
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        return cls.from_dict(json.loads(text))

    def config_hash(self) -> str:
        """Stable id of what is measured: the fields that differ from their defaults (so a
        field added later, at its default, re-measures nothing). The timeout and where a
        log goes do not change the measurement."""
        d, default = self.to_dict(), RunConfig().to_dict()
        d.pop("timeout_s")
        for key in ("onednn_verbose", "trace"):
            d[key] = bool(d[key]) if d[key] else d[key]
        d = {k: v for k, v in d.items() if k in ("workload", "preset") or v != default[k]}
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def label(self) -> str:
        """A short human name: only the fields that differ from the defaults (env that says only
        where a cache goes, ``WHERE_ONLY``, left out: it names no setting)."""
        default = RunConfig(workload=self.workload, preset=self.preset).to_dict()
        mine = dict(self.to_dict(), env={k: v for k, v in self.env if k not in WHERE_ONLY})
        parts = [f"{k}={v}" for k, v in mine.items()
                 if k not in ("workload", "preset", "timeout_s", "options") and v != default[k]]
        parts += [f"{k}={v}" for k, v in self.options]
        return f"{self.workload}[{self.preset}]" + (" " + " ".join(parts) if parts else "")


def normalise(base: RunConfig, physical: int) -> RunConfig:
    """Spell out the thread count so that equal settings hash equally."""
    return base.replace(threads=base.threads or max(1, physical // base.instances))


WHERE_ONLY = {"TORCHINDUCTOR_CACHE_DIR"}  # env that says where, not how: never a setting's name


def setting_hash(config: dict) -> str:
    """The hash of what a configuration sets: where its logs, traces and caches go left out, so
    two runs of one setting compare equal (the baseline is found by this, never by its label)."""
    c = dict(config, onednn_verbose=None, trace=None, timeout_s=RunConfig.timeout_s,
             env={k: v for k, v in dict(config.get("env") or {}).items() if k not in WHERE_ONLY})
    return RunConfig.from_dict(c).config_hash()


def setting_label(config: dict, baseline: dict) -> str:
    """What a configuration changes against the baseline, e.g. 'omp_runtime=intel kmp_blocktime=0'."""
    skip = {"timeout_s", "onednn_verbose", "trace", "options", "env"}
    parts = [f"{k}={v}" for k, v in config.items() if k not in skip and v != baseline.get(k)]
    mine, theirs = ({k: v for k, v in dict(c.get("env") or {}).items() if k not in WHERE_ONLY} for c in (config, baseline))
    parts += [f"{k}={mine.get(k, 'unset')}" for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    mine, theirs = config.get("options") or {}, baseline.get("options") or {}  # a workload's options by name
    parts += [f"{k}={mine.get(k, 'default')}" for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    return " ".join(parts) or "baseline"


def check_workload_spec(spec: str) -> None:
    """Fail early on an unknown built-in or an unimportable user workload (``workloads.build_function``:
    a built-in's module, which imports torch, is not imported)."""
    from cpuopt_helpers.workloads import BUILTINS, build_function

    if ":" not in spec:
        if spec not in BUILTINS:
            raise CpuoptError(f"unknown workload {spec!r}; use one of {', '.join(sorted(BUILTINS))} "
                              "or your own as package.module:function")
        return
    build_function(spec)


# --- the knobs: one row per RunConfig field a user sets ---------------------------------------

RUN_CPU_JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto"  # PyTorch's run_cpu's
# run_cpu's, with freed memory kept. With run_cpu's setting, as with jemalloc's own defaults, jemalloc hands
# a freed large block back to the OS at once, and the next step faults its pages in again. Decay -1 keeps
# freed pages for reuse (jemalloc's TUNING.md); a training step allocates the same sizes every time.
# tests/test_worker_integration.py counts the page faults of both; data/compare/ holds a paired comparison
# of both at RetinaNet's full preset.
JEMALLOC_CONF = RUN_CPU_JEMALLOC_CONF + ",dirty_decay_ms:-1,muzzy_decay_ms:-1"
KMP_AFFINITY = "granularity=fine,compact,1,0"


@dataclass(frozen=True)
class Knob:
    """One row of KNOBS: a RunConfig field, how a user sets it and what it does to a launch.

    ``flag``: its `cpuopt bench` option ("" for none); ``kind`` str, int, float or bool (a
    switch); ``choices``/``minimum``/``invalid``: what validation accepts and says otherwise;
    ``requires(config)`` -> "" or why the value needs another setting (the vendor or runtime
    it needs); ``env`` the variables a launch sets from it, as (variable, value in words,
    when) for the launch module's table, and ``env_of(config)`` -> their values (a value
    already in the caller's environment wins, with a warning); ``preload`` value -> the
    library kind the launch preloads (LD_PRELOAD); ``launch``: also an option of `cpuopt
    launch` and of a script's compare arms (it acts before the process starts, on any
    program); ``in_script``: what a script must do itself to get it (said beside its launch
    line); ``placement``: it changes where or how the process runs, not the work of a step
    (runs that differ only in these share one FLOP count).
    """

    field: str
    flag: str
    help: str
    kind: type = str
    choices: tuple = ()
    name: str = ""  # in error messages, e.g. "omp runtime" (default: the field)
    minimum: float | None = None
    invalid: str = ""  # the error below the minimum, with {value}
    requires: Callable[[RunConfig], str] | None = None
    env: tuple[tuple[str, str, str], ...] = ()
    env_of: Callable[[RunConfig], dict] | None = None
    preload: tuple[tuple[str, str], ...] = ()
    launch: bool = False
    in_script: bool = False
    placement: bool = False
    metavar: str | None = None
    const: str | None = None  # the value of the bare flag (an option whose value may be left out)

    @property
    def default(self):
        """The field's default in RunConfig (None for a field it does not have yet)."""
        field = RunConfig.__dataclass_fields__.get(self.field)
        return field.default if field is not None else None


def _intel(config: RunConfig) -> bool:
    return config.omp_runtime == "intel"


KNOBS: tuple[Knob, ...] = (
    Knob("batch_size", "--batch-size", "samples per step and instance (default: the workload's)", int, minimum=1,
         invalid="batch size must be a positive integer, got {value}"),
    Knob("steps", "--steps", "timed steps (default 20)", int, minimum=1, placement=True,
         invalid="steps must be a positive integer, got {value}"),
    Knob("warmup", "--warmup", "untimed warm-up steps (default 3)", int, minimum=0, placement=True,
         invalid="warm-up steps cannot be negative, got {value}"),
    Knob("threads", "--threads", "threads per instance (default: physical cores / instances)", int, placement=True,
         env=(("OMP_NUM_THREADS", "threads per instance", "always"), ("MKL_NUM_THREADS", "threads per instance", "always")),
         env_of=lambda c: {"OMP_NUM_THREADS": str(c.threads), "MKL_NUM_THREADS": str(c.threads)}),
    Knob("instances", "--instances", "independent instances on disjoint cores", int, minimum=1,
         invalid="instances must be at least 1, got {value}"),
    Knob("mode", "--mode", "independent (instances train alone) | ddp (ranks of one DistributedDataParallel job)",
         choices=("independent", "ddp"),
         requires=lambda c: "--mode ddp is launched by cpuopt itself; drop --launcher run_cpu"
         if c.mode == "ddp" and c.launcher != "cpuopt" else ""),
    Knob("batch_policy", "--batch-policy", "per_rank (each instance trains --batch-size) | global (--batch-size "
         "split between ranks)", choices=("per_rank", "global"), name="batch policy"),
    Knob("affinity", "--affinity", "compact | scatter | none (no pinning)", choices=("compact", "scatter", "none"),
         launch=True, placement=True),
    Knob("allocator", "--allocator", "default | jemalloc | tcmalloc", choices=("default", "jemalloc", "tcmalloc"),
         launch=True, placement=True, preload=(("jemalloc", "jemalloc"), ("tcmalloc", "tcmalloc")),
         env=(("LD_PRELOAD", "the allocator's library, then libiomp5.so", "jemalloc/tcmalloc, intel OpenMP"),
              ("MALLOC_CONF", f"{JEMALLOC_CONF} (PyTorch's run_cpu's, freed memory kept)", "jemalloc")),
         env_of=lambda c: {"MALLOC_CONF": JEMALLOC_CONF} if c.allocator == "jemalloc" else {}),
    Knob("omp_runtime", "--omp-runtime", "gnu | intel", choices=("gnu", "intel"), name="omp runtime", launch=True,
         placement=True, preload=(("intel", "iomp"),),
         env=(("KMP_AFFINITY", KMP_AFFINITY, "intel OpenMP"),),
         env_of=lambda c: {"KMP_AFFINITY": KMP_AFFINITY} if _intel(c) and c.affinity != "none" else {}),
    Knob("kmp_blocktime", "--kmp-blocktime", "ms an Intel OpenMP thread spins (needs --omp-runtime intel)", int,
         minimum=0, invalid="--kmp-blocktime must be 0 ms or more (KMP_BLOCKTIME), got {value}", launch=True,
         placement=True,
         requires=lambda c: "--kmp-blocktime (KMP_BLOCKTIME) only applies to Intel OpenMP; add --omp-runtime intel"
         if c.kmp_blocktime is not None and not _intel(c) else "",
         env=(("KMP_BLOCKTIME", "the config's value, else 1 (run_cpu's default)", "intel OpenMP"),),
         env_of=lambda c: {"KMP_BLOCKTIME": str(1 if c.kmp_blocktime is None else c.kmp_blocktime)} if _intel(c) else {}),
    Knob("oversubscribe", "--oversubscribe", "allow more threads than cores (to measure it)", bool, placement=True),
    Knob("loader_workers", "--loader-workers", "feed batches through a DataLoader with N workers", int, minimum=0,
         invalid="DataLoader workers cannot be negative, got {value}", placement=True),
    Knob("launcher", "--launcher", "cpuopt | run_cpu (PyTorch's torch.backends.xeon.run_cpu with its defaults)",
         choices=("cpuopt", "run_cpu"), placement=True, requires=lambda c: run_cpu_decides(c)),  # defined below
    Knob("dtype", "--dtype", "fp32 | bf16 (autocast; loss in fp32)", choices=("fp32", "bf16"), in_script=True),
    Knob("bf16_loss", "--bf16-loss", "with --dtype bf16: the loss in bf16 too (not advised)", bool,
         requires=lambda c: "--bf16-loss only applies with --dtype bf16" if c.bf16_loss and c.dtype != "bf16" else ""),
    Knob("channels_last", "--channels-last", "channels-last memory format (CNNs)", bool, in_script=True),
    Knob("runtime", "--runtime", "main | ipex (.venv-ipex: torch 2.8 + IPEX, built by `make ipex`) | path of a python"),
    Knob("ipex", "--ipex", "apply ipex.optimize (needs --runtime ipex)", bool,
         requires=lambda c: "--ipex needs the IPEX runtime: add --runtime ipex (built by `make ipex`)"
         if c.ipex and c.runtime == "main" else
         "--ipex and --compile are separate rungs here; measure them one at a time" if c.ipex and c.compile else ""),
    Knob("compile", "--compile", "torch.compile the model: default | max-autotune (Inductor) | zentorch (AMD's "
         "backend, pip install zentorch for this torch); compile time reported apart",
         choices=("default", "max-autotune", "zentorch"), name="compile mode", metavar="MODE", const="default",
         in_script=True,
         requires=lambda c: "--compile needs at least one warm-up step (the compilation runs there, timed apart)"
         if c.compile and c.warmup < 1 else ""),
    Knob("compile_scope", "--compile-scope", "with --compile: model (the model alone) | step (the whole training "
         "step: the forward with its loss as one region, its backward with it, and the optimizer's step unless "
         "--optimizer-impl fused)",
         choices=("model", "step"), name="compile scope", metavar="SCOPE", in_script=True,
         requires=lambda c: "--compile-scope step needs --compile default or max-autotune (Inductor)"
         if c.compile_scope == "step" and c.compile in (None, "zentorch") else ""),
    Knob("optimizer", "--optimizer", "sgd (momentum 0.9) | adamw | lamb", choices=("sgd", "adamw", "lamb")),
    Knob("optimizer_impl", "--optimizer-impl", "default | foreach | fused", choices=("default", "foreach", "fused"),
         name="optimizer implementation", in_script=True),
    Knob("onednn_verbose", "--onednn-verbose", "write the oneDNN verbose log of the timed steps (not the warm-up) "
         "to FILE", metavar="FILE", placement=True),
    Knob("trace", "--trace", "record the timed steps with torch.profiler: Chrome trace to FILE, operators to "
         "FILE.ops.json", metavar="FILE", placement=True),
    Knob("trace_shapes", "--no-trace-shapes", "with --trace: a light trace without the operators' input shapes "
         "(times only: recording shapes slows every call)", bool, placement=True,
         requires=lambda c: "--no-trace-shapes only applies with --trace FILE" if not c.trace_shapes and not c.trace
         else ""),
    Knob("timeout_s", "--timeout", "seconds before the run is stopped", float, minimum=1e-9,
         invalid="--timeout must be a positive number of seconds, got {value}", placement=True),
    Knob("cores", "", "", placement=True),
    Knob("seed", "", ""),
)
KNOB = {k.field: k for k in KNOBS}
# What a launch sets whose value in the caller's environment wins over the plan's (with a warning);
# LD_PRELOAD is the exception: the plan's libraries are appended to the caller's.
USER_WINS = tuple(v for k in KNOBS for v, _, _ in k.env if v != "LD_PRELOAD")
# What changes where or how a run executes, not the work of one step (see Knob.placement).
PLACEMENT_FIELDS = tuple(k.field for k in KNOBS if k.placement)


def knob_env(config: RunConfig, knobs: tuple[Knob, ...] = KNOBS) -> tuple[dict, list[str]]:
    """The variables the knobs set for this config, and the library kinds to preload, in order."""
    env, preload = {}, []
    for knob in knobs:
        if knob.env_of:
            env.update(knob.env_of(config))
        preload += [kind for value, kind in knob.preload if getattr(config, knob.field) == value]
    return env, preload


def run_cpu_decides(config: RunConfig) -> str:
    """'' or the settings a run under run_cpu would carry in its label but not apply: run_cpu
    chooses the library, OpenMP, pinning, the cores and the one instance itself, in its own environment."""
    if config.launcher != "run_cpu":
        return ""
    default = RunConfig()
    set_here = [f for f in ("instances", "cores", "oversubscribe", "affinity", "allocator", "omp_runtime",
                            "kmp_blocktime") if getattr(config, f) != getattr(default, f)]
    set_here += ["env"] if any(k not in WHERE_ONLY for k, _ in config.env) else []
    return (f"--launcher run_cpu decides {', '.join(set_here)} itself (its defaults): drop "
            + " ".join(f"--{f.replace('_', '-')}" for f in set_here) + ", or measure them with --launcher cpuopt"
            if set_here else "")


def check_outputs(config: RunConfig) -> None:
    """Refuse a run that could not write its oneDNN log or trace, before it measures (the worker
    writes them after its timed steps): the files the worker writes (``worker.log_path``: FILE, or
    FILE.N for instance N; beside them FILE.meta.json, FILE.ops.json), checked without creating any."""
    for path, flag in ((config.onednn_verbose, "--onednn-verbose"), (config.trace, "--trace")):
        if not path:
            continue
        for name in [path] if config.instances == 1 else [f"{path}.{i}" for i in range(config.instances)]:
            target = Path(os.path.abspath(name))
            if target.is_dir():
                raise CpuoptError(f"{flag} {path}: {target} is a folder: name a file, e.g. "
                                  f"{flag} {target / 'run.log'}")
            writable = (os.access(target, os.W_OK) if target.exists()
                        else target.parent.is_dir() and os.access(target.parent, os.W_OK | os.X_OK))
            if not writable:
                raise CpuoptError(f"{flag} {path}: cannot write {target} (its folder is missing or not writable): "
                                  "name a file in a folder you can write")


def check_knobs(config: RunConfig, knobs: tuple[Knob, ...] = KNOBS) -> None:
    """Every knob's value against its row: choices, minimum, what it requires."""
    for knob in knobs:
        value = getattr(config, knob.field)
        if value is None:
            continue
        if knob.choices and value not in knob.choices:
            raise CpuoptError(f"unknown {knob.name or knob.field} {value!r}; use one of {', '.join(knob.choices)}")
        if knob.minimum is not None and not value >= knob.minimum:  # below it, or a NaN
            raise CpuoptError(knob.invalid.format(value=value))
    for knob in knobs:
        why = knob.requires(config) if knob.requires else ""
        if why:
            raise CpuoptError(why)


def validate(config: RunConfig, logical_cores: int, physical_cores: int, check_workload: bool = True) -> RunConfig:
    """Check a config against its knobs and the machine; return it with `threads` filled in.

    Every error says what is wrong and what to do, in one line.
    """
    if config.preset not in PRESETS:
        raise CpuoptError(f"unknown preset {config.preset!r}; use one of {', '.join(PRESETS)}")
    check_knobs(config)
    if config.batch_policy == "global" and config.batch_size is not None and config.batch_size % config.instances:
        raise CpuoptError(f"global batch {config.batch_size} does not split evenly into {config.instances} ranks; "
                          "pick a multiple of --instances")
    threads = check_layout(config, logical_cores, physical_cores)
    for where, names in (("--env", dict(config.env)), ("your environment", os.environ)):
        if "CPUOPT_RETINANET" in names:
            raise CpuoptError(f"CPUOPT_RETINANET (in {where}) is not read any more: give RetinaNet's variant as "
                              "workload options (cpuopt bench --option frozen_bn=fused) and unset it")
    if check_workload:
        check_workload_spec(config.workload)
        from cpuopt_helpers.workloads import check_options

        check_options(config.workload, dict(config.options))  # before any process starts
    return config.replace(threads=threads)


def check_layout(config: RunConfig, logical_cores: int, physical_cores: int) -> int:
    """Instances, threads and core sets against the machine's cores; the threads per instance."""
    if config.instances > logical_cores:
        raise CpuoptError(f"{config.instances} instances need at least {config.instances} cores; "
                          f"this machine has {logical_cores}: use --instances {logical_cores} or fewer")
    threads = config.threads
    if threads is None:
        threads = max(1, physical_cores // config.instances)
    if threads <= 0:
        raise CpuoptError(f"--threads must be at least 1, got {threads}")
    if threads > logical_cores and not config.oversubscribe:
        raise CpuoptError(f"--threads {threads} is more than the {logical_cores} logical cores here; "
                          f"use at most {logical_cores} (see `cpuopt doctor`), or --oversubscribe to measure that")
    if threads * config.instances > logical_cores and not config.oversubscribe:
        raise CpuoptError(f"{config.instances} instances x {threads} threads = {threads * config.instances} "
                          f"cores, but this machine has {logical_cores}; lower --threads or --instances")
    if config.cores is not None:
        if len(config.cores) != config.instances:
            raise CpuoptError(f"cores lists {len(config.cores)} core sets for {config.instances} instances; "
                              "give one set per instance")
        flat = [c for group in config.cores for c in group]
        if len(set(flat)) != len(flat):
            raise CpuoptError(f"core sets {config.cores} overlap; give each instance its own cores")
        bad = [c for c in flat if not 0 <= c < 4096]
        if bad:
            raise CpuoptError(f"core ids {bad} are not valid CPU numbers")
    return threads


# --- a config as the command lines that train with it -------------------------------------------

def bench_line(config: RunConfig, knobs: tuple[Knob, ...] = KNOBS) -> str:
    """The `cpuopt bench` line that measures this configuration: an option for every knob that
    differs from its default."""
    words = ["cpuopt", "bench", "--workload", config.workload, "--preset", config.preset, *bench_options(config, knobs)]
    return " ".join(shlex.quote(w) for w in words)


def compare_line(a: RunConfig, b: RunConfig) -> str:
    """The `cpuopt compare` line that measures ``b`` against ``a`` (one workload and preset) in paired
    rounds until their interval decides: each arm its `cpuopt bench` options."""
    def arm(config: RunConfig) -> str:  # in double quotes where that needs no escape: readable around '...'
        inner = " ".join(shlex.quote(w) for w in bench_options(config))
        return f'"{inner}"' if inner and not set(inner) & set('"$`\\!') else shlex.quote(inner)

    return (f"cpuopt compare --workload {shlex.quote(a.workload)} --preset {shlex.quote(a.preset)} "
            f"--a {arm(a)} --b {arm(b)}")


def bench_options(config: RunConfig, knobs: tuple[Knob, ...] = KNOBS) -> list[str]:
    """`cpuopt bench`'s options for this configuration, after --workload and --preset: one for
    every knob that differs from its default, then its --env and --option pairs."""
    default = RunConfig(workload=config.workload, preset=config.preset)
    words = []
    for knob in knobs:
        value = getattr(config, knob.field)
        if not knob.flag or value == getattr(default, knob.field, knob.default):
            continue
        words += [knob.flag] if knob.kind is bool else [knob.flag, str(value)]
    words += [w for k, v in config.env for w in ("--env", f"{k}={v}")]
    return words + [w for k, v in config.options for w in ("--option", f"{k}={v}")]


def launch_line(config: RunConfig, command: str, knobs: tuple[Knob, ...] = KNOBS) -> str:
    """The `cpuopt launch` line that runs ``command`` (a script) with this configuration; what
    the script must do itself (``Knob.in_script``) follows as a comment."""
    words = ["cpuopt", "launch"]
    if config.mode == "ddp" and config.instances > 1:
        words += ["--nproc-per-node", str(config.instances), "--ncores-per-instance", str(config.threads)]
    elif config.instances > 1:
        words += ["--ninstances", str(config.instances), "--ncores-per-instance", str(config.threads)]
    else:
        words += ["--ncores-per-instance", str(config.threads)]
    if config.instances > 1 and config.workload == "script":  # copies of a script: each in its own folder
        words += ["--instance-dirs", "runs"]
    extras = []
    for knob in knobs:
        value = getattr(config, knob.field)
        if value == knob.default or not (knob.launch or knob.in_script):
            continue
        if knob.launch:
            words += [knob.flag] if knob.kind is bool else [knob.flag, str(value)]
        else:
            extras.append(f"{knob.field}={value}")
    line = " ".join(words) + f" -- {command}"
    return line + (f"   # in the script: {', '.join(extras)}" if extras else "")


def pairs(mapping: dict) -> tuple[tuple[str, str], ...]:
    """A dict of settings as the sorted (key, string value) pairs a RunConfig holds."""
    return tuple(sorted((str(k), str(v)) for k, v in mapping.items()))
