"""RunConfig: one measured configuration, validated, serialisable and hashable."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
from dataclasses import dataclass, field

from cpuopt_helpers.errors import CpuoptError

PRESETS = ("quick", "standard", "full")
ALLOCATORS = ("default", "jemalloc", "tcmalloc")
OMP_RUNTIMES = ("gnu", "intel")
DTYPES = ("fp32", "bf16")
MODES = ("independent", "ddp")
BATCH_POLICIES = ("per_rank", "global")
OPTIMIZERS = ("sgd", "adamw", "lamb")
OPTIMIZER_IMPLS = ("default", "foreach", "fused")
COMPILE_MODES = ("default", "max-autotune", "zentorch")  # zentorch: AMD's backend (cpuopt_helpers.runtimes)
AFFINITIES = ("compact", "scatter", "none")
LAUNCHERS = ("cpuopt", "run_cpu")
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
    AMD's zentorch backend).
    ``optimizer`` sgd (momentum 0.9), adamw or lamb (cpuopt_helpers.kernels.lamb);
    ``optimizer_impl`` default (torch's choice: a per-parameter loop on CPU), foreach or fused.
    ``mode``: independent (instances train alone; throughput summed) or ddp (instances are
    ranks of one DistributedDataParallel job on gloo). ``batch_policy``: per_rank (each
    instance trains batch_size samples a step) or global (batch_size is split between ranks).
    ``onednn_verbose`` is a file that receives the oneDNN verbose log of the timed steps
    (``FILE.N`` for instance N when several run); ``trace`` a file that receives the
    torch.profiler Chrome trace of the timed steps (and ``FILE.ops.json``, its operators).
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
    affinity: str = "compact"
    oversubscribe: bool = False
    loader_workers: int = 0
    launcher: str = "cpuopt"
    bf16_loss: bool = False
    runtime: str = "main"
    ipex: bool = False
    compile: str | None = None
    optimizer: str = "sgd"
    optimizer_impl: str = "default"
    batch_policy: str = "per_rank"
    timeout_s: float = 600.0
    env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    options: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @classmethod
    def for_preset(cls, workload: str, preset: str, **fields) -> "RunConfig":
        """A config with the preset's step counts (a notebook's starting point)."""
        if preset not in PRESET_STEPS:
            raise CpuoptError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
        steps, warmup = PRESET_STEPS[preset]
        return cls(workload=workload, preset=preset, steps=steps, warmup=warmup).replace(**fields)

    def replace(self, **changes) -> "RunConfig":
        """A copy with some fields changed (configs are never edited in place)."""
        for key in ("env", "options"):
            if key in changes and isinstance(changes[key], dict):
                changes[key] = pairs(changes[key])
        if changes.get("cores") is not None:
            changes["cores"] = tuple(tuple(c) for c in changes["cores"])
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
        d = dict(d)
        if d.get("cores") is not None:
            d["cores"] = tuple(tuple(c) for c in d["cores"])
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
        """A short human name: only the fields that differ from the defaults."""
        default = RunConfig(workload=self.workload, preset=self.preset).to_dict()
        parts = [f"{k}={v}" for k, v in self.to_dict().items()
                 if k not in ("workload", "preset", "timeout_s", "options") and v != default[k]]
        parts += [f"{k}={v}" for k, v in self.options]
        return f"{self.workload}[{self.preset}]" + (" " + " ".join(parts) if parts else "")


def check_workload_spec(spec: str) -> None:
    """Fail early on an unknown built-in or an unimportable user workload."""
    from cpuopt_helpers.workloads import BUILTINS

    if ":" not in spec:
        if spec not in BUILTINS:
            raise CpuoptError(f"unknown workload {spec!r}; use one of {', '.join(sorted(BUILTINS))} "
                              "or your own as package.module:function")
        return
    module_name, _, func = spec.partition(":")
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise CpuoptError(f"cannot import {module_name!r} for workload {spec!r}; "
                          "run from the folder that holds it or add it to PYTHONPATH")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module failed while importing
        raise CpuoptError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    if not callable(getattr(module, func, None)):
        raise CpuoptError(f"{module_name!r} has no function {func!r}; a workload is "
                          "package.module:function with function(preset) -> Workload")


def validate(config: RunConfig, logical_cores: int, physical_cores: int, check_workload: bool = True) -> RunConfig:
    """Check a config against the machine; return it with `threads` filled in.

    Every error says what is wrong and what to do, in one line.
    """
    if config.preset not in PRESETS:
        raise CpuoptError(f"unknown preset {config.preset!r}; use one of {', '.join(PRESETS)}")
    for name, value, allowed in (("allocator", config.allocator, ALLOCATORS),
                                 ("omp runtime", config.omp_runtime, OMP_RUNTIMES),
                                 ("dtype", config.dtype, DTYPES), ("mode", config.mode, MODES),
                                 ("affinity", config.affinity, AFFINITIES), ("launcher", config.launcher, LAUNCHERS)):
        if value not in allowed:
            raise CpuoptError(f"unknown {name} {value!r}; use one of {', '.join(allowed)}")
    if config.batch_size is not None and config.batch_size <= 0:
        raise CpuoptError(f"batch size must be a positive integer, got {config.batch_size}")
    if config.steps <= 0:
        raise CpuoptError(f"steps must be a positive integer, got {config.steps}")
    if config.warmup < 0:
        raise CpuoptError(f"warm-up steps cannot be negative, got {config.warmup}")
    if config.instances <= 0:
        raise CpuoptError(f"instances must be at least 1, got {config.instances}")
    if config.timeout_s <= 0:
        raise CpuoptError(f"timeout must be positive, got {config.timeout_s}")
    if config.bf16_loss and config.dtype != "bf16":
        raise CpuoptError("--bf16-loss only applies with --dtype bf16")
    if config.loader_workers < 0:
        raise CpuoptError(f"DataLoader workers cannot be negative, got {config.loader_workers}")
    if config.kmp_blocktime is not None and config.kmp_blocktime < 0:
        raise CpuoptError(f"KMP_BLOCKTIME must be >= 0 ms, got {config.kmp_blocktime}")
    for name, value, allowed in (("optimizer", config.optimizer, OPTIMIZERS),
                                 ("optimizer implementation", config.optimizer_impl, OPTIMIZER_IMPLS),
                                 ("batch policy", config.batch_policy, BATCH_POLICIES)):
        if value not in allowed:
            raise CpuoptError(f"unknown {name} {value!r}; use one of {', '.join(allowed)}")
    if config.compile is not None and config.compile not in COMPILE_MODES:
        raise CpuoptError(f"unknown compile mode {config.compile!r}; use one of {', '.join(COMPILE_MODES)}")
    if config.compile and config.warmup < 1:
        raise CpuoptError("--compile needs at least one warm-up step (the compilation runs there, timed apart)")
    if config.ipex and config.runtime == "main":
        raise CpuoptError("--ipex needs the IPEX runtime: add --runtime ipex (built by `make ipex`)")
    if config.ipex and config.compile:
        raise CpuoptError("--ipex and --compile are separate rungs here; measure them one at a time")
    if config.mode == "ddp" and config.launcher != "cpuopt":
        raise CpuoptError("--mode ddp is launched by cpuopt itself; drop --launcher run_cpu")
    if config.batch_policy == "global" and config.batch_size is not None and config.batch_size % config.instances:
        raise CpuoptError(f"global batch {config.batch_size} does not split evenly into {config.instances} ranks; "
                          "pick a multiple of --instances")
    if config.instances > logical_cores:
        raise CpuoptError(f"{config.instances} instances need at least {config.instances} cores; "
                          f"this machine has {logical_cores}: use --instances {logical_cores} or fewer")
    threads = config.threads
    if threads is None:
        threads = max(1, physical_cores // config.instances)
    if threads <= 0:
        raise CpuoptError(f"threads must be at least 1, got {threads}")
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
    for where, names in (("--env", dict(config.env)), ("your environment", os.environ)):
        if "CPUOPT_RETINANET" in names:
            raise CpuoptError(f"CPUOPT_RETINANET (in {where}) is not read any more: give RetinaNet's variant as "
                              "workload options (cpuopt bench --option frozen_bn=fused) and unset it")
    if check_workload:
        check_workload_spec(config.workload)
        from cpuopt_helpers.workloads import check_options

        check_options(config.workload, dict(config.options))  # before any process starts
    return config.replace(threads=threads)


def pairs(mapping: dict) -> tuple[tuple[str, str], ...]:
    """A dict of settings as the sorted (key, string value) pairs a RunConfig holds."""
    return tuple(sorted((str(k), str(v)) for k, v in mapping.items()))
