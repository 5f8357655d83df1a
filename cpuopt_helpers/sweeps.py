"""The configurations each optimisation notebook measures, built from the best one so far."""

from __future__ import annotations

from cpuopt_helpers.config import RunConfig

JEMALLOC_DEFAULT_CONF = (("MALLOC_CONF", ""),)  # jemalloc with its own defaults, not run_cpu's tuning


def thread_counts(physical: int, logical: int) -> list[int]:
    """1, 2, 4, ... up to the physical cores, the physical count itself, and the logical one with SMT."""
    counts = [t for t in (2**i for i in range(16)) if t < physical] + [physical]
    if logical > physical:
        counts.append(logical)
    return counts


def unique(configs: list[RunConfig]) -> list[RunConfig]:
    """Drop configurations that measure the same thing (same hash), keeping the first."""
    seen, out = set(), []
    for c in configs:
        if c.config_hash() not in seen:
            seen.add(c.config_hash())
            out.append(c)
    return out


def normalise(base: RunConfig, physical: int) -> RunConfig:
    """Spell out the thread count so that equal settings hash equally."""
    return base.replace(threads=base.threads or max(1, physical // base.instances))


def threading_configs(base: RunConfig, facts: dict, image_like: bool = True) -> list[RunConfig]:
    """Notebook 03: thread scaling, affinity, OpenMP runtime and KMP_BLOCKTIME, OMP_PROC_BIND,
    oversubscription and DataLoader workers, each against the base configuration."""
    physical, logical = facts["physical_cores"], facts["logical_cores"]
    base = normalise(base, physical)
    configs = [base] + [base.replace(threads=t) for t in thread_counts(physical, logical)]
    if facts["sockets"] > 1:  # on one socket scatter hands out the same cores as compact
        configs.append(base.replace(affinity="scatter"))
    configs.append(base.replace(affinity="none"))
    if facts["openmp"].get("intel"):
        configs += [base.replace(omp_runtime="intel", kmp_blocktime=b) for b in (0, 1, 200)]
    configs.append(base.replace(env={"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}))
    configs.append(base.replace(threads=2 * logical, oversubscribe=True))
    if image_like:  # an input pipeline worth feeding from worker processes: decoded, augmented images
        configs += [base.replace(loader_workers=w) for w in sorted({1, physical})]
    return unique(configs)


def allocator_configs(base: RunConfig, facts: dict) -> tuple[list[RunConfig], dict]:
    """Notebook 04: glibc, jemalloc with run_cpu's MALLOC_CONF and without, tcmalloc.

    Returns the configurations that can run here and, for each missing allocator, the
    command that installs it.
    """
    from cpuopt_helpers.system import INSTALL_HINTS

    base = normalise(base, facts["physical_cores"]).replace(allocator="default")
    base = base.replace(env={k: v for k, v in base.env if k != "MALLOC_CONF"})
    configs, missing = [base], {}
    if facts["allocators"].get("jemalloc"):
        configs += [base.replace(allocator="jemalloc"),
                    base.replace(allocator="jemalloc", env=dict(base.env) | dict(JEMALLOC_DEFAULT_CONF))]
    else:
        missing["jemalloc"] = INSTALL_HINTS["jemalloc"]
    if facts["allocators"].get("tcmalloc"):
        configs.append(base.replace(allocator="tcmalloc"))
    else:
        missing["tcmalloc"] = INSTALL_HINTS["tcmalloc"]
    return configs, missing


def launcher_configs(best: RunConfig, facts: dict) -> list[RunConfig]:
    """PyTorch's defaults, run_cpu's defaults and the best setting found, to be interleaved."""
    default = RunConfig.for_preset(best.workload, best.preset)
    default = normalise(default.replace(steps=best.steps, warmup=best.warmup), facts["physical_cores"])
    return unique([default, default.replace(launcher="run_cpu"), best])


def precision_configs(base: RunConfig, facts: dict, channels_last: bool) -> list[RunConfig]:
    """Notebook 06: fp32 and bf16 (autocast, loss in fp32), with channels-last off and on.

    Without a bf16 fast path the comparison runs on the quick preset with few steps, so
    that a 10-20x slower bf16 still finishes: it is measured, not skipped.
    """
    base = normalise(base, facts["physical_cores"]).replace(dtype="fp32", bf16_loss=False)
    if not facts["bf16"]["accelerated"]:
        base = base.replace(preset="quick", steps=5, warmup=1)
    layouts = [False, True] if channels_last else [base.channels_last]
    return unique([base.replace(channels_last=cl, dtype=dt) for cl in layouts for dt in ("fp32", "bf16")])


def runtime_configs(base: RunConfig, facts: dict, image_like: bool, ipex_available: bool,
                    compile_modes: tuple[str, ...] = ("default", "max-autotune")) -> dict[str, RunConfig]:
    """Notebook 05: stock torch 2.8, torch 2.8 + IPEX, stock torch (this venv), and this
    torch's upstream replacements for what IPEX did, all on the same base setting.

    Returns name -> config, the first being the stock runtime every ratio is taken against.
    The AdamW pair measures the fused optimizer where it matters most (SGD's update is
    one multiply-add per weight).
    """
    base = normalise(base, facts["physical_cores"]).replace(runtime="main", ipex=False, compile=None,
                                                            optimizer="sgd", optimizer_impl="default")
    configs = {"torch (stock)": base}
    if ipex_available:
        configs["torch 2.8 (stock)"] = base.replace(runtime="ipex")
        configs["torch 2.8 + IPEX"] = base.replace(runtime="ipex", ipex=True)
    if image_like and not base.channels_last:
        configs["channels-last"] = base.replace(channels_last=True)
    for mode in compile_modes:
        configs[f"torch.compile ({mode})"] = base.replace(compile=mode, warmup=max(base.warmup, 1))
    configs["SGD foreach"] = base.replace(optimizer_impl="foreach")
    configs["SGD fused"] = base.replace(optimizer_impl="fused")
    configs["AdamW (default)"] = base.replace(optimizer="adamw")
    configs["AdamW fused"] = base.replace(optimizer="adamw", optimizer_impl="fused")
    return configs


def layouts(physical: int) -> list[tuple[int, int]]:
    """(threads per rank, ranks) pairs that fit the physical cores: powers of two and the full count."""
    counts = sorted(set(thread_counts(physical, physical)))
    return [(t, n) for t in counts for n in counts if t * n <= physical]


def multi_instance_configs(base: RunConfig, facts: dict, batch_policy: str = "per_rank") -> list[RunConfig]:
    """Notebook 07: every layout as independent instances and, from two ranks, as one DDP job.

    One rank is the same process either way, so it runs once (independent)."""
    base = normalise(base, facts["physical_cores"]).replace(cores=None, batch_policy=batch_policy)
    configs = []
    for threads, ranks in layouts(facts["physical_cores"]):
        for mode in ("independent", "ddp") if ranks > 1 else ("independent",):
            configs.append(base.replace(threads=threads, instances=ranks, mode=mode))
    return unique(configs)


def with_options(config: RunConfig, **options) -> RunConfig:
    """The config with these workload options added to the ones it has."""
    return config.replace(options=dict(config.options) | {k: str(v) for k, v in options.items()})


def case_study_configs(base: RunConfig, facts: dict) -> dict[str, RunConfig]:
    """Notebook 08: RetinaNet as the paper trained it (Lamb, torchvision's FrozenBatchNorm2d
    and focal loss), each of the paper's fixes alone, then all of them together."""
    base = normalise(base, facts["physical_cores"]).replace(  # the baseline has none of the fixes,
        workload="retinanet", optimizer="lamb", optimizer_impl="default", options={})  # even when handed on
    return {
        "baseline": base,
        "fused FrozenBatchNorm2d": with_options(base, frozen_bn="fused"),
        "closed-form focal loss": with_options(base, focal="fast"),
        "multi-tensor Lamb": base.replace(optimizer_impl="foreach"),
        "all fixes": with_options(base, frozen_bn="fused", focal="fast").replace(optimizer_impl="foreach"),
    }
