"""The measured process: pin, build the workload, train, print one JSON line.

Imports only the standard library and torch (the package's own RunConfig and workload
registry aside), so it also runs under another interpreter. Its configuration arrives as
``--config`` (a RunConfig's JSON), read with ``RunConfig.from_json``: everything a run asks
for is a field of it. The launcher sets its environment before it
starts; the worker never changes thread pools or allocators itself.

Environment read here (set by launch.py):
    CPUOPT_CORES        comma list of logical CPUs to run on (pins itself if not already)
    CPUOPT_INSTANCE     index of this instance, CPUOPT_INSTANCES how many run together
    CPUOPT_BARRIER      a folder; timed steps start when every instance has warmed up (and a
                        failing instance leaves the moment it failed there: N.failed)
    CPUOPT_LAUNCH_TIME  wall time at which the launcher started the process
    TORCHINDUCTOR_CACHE_DIR  for --compile: when unset, the worker makes a fresh empty one
                        (so ``compile_s`` is a cold compile) and removes it at the end;
                        one that holds an earlier run's compile makes the first compile warm

Warm-up (never timed) runs at least ``warmup`` steps and goes on until step times settle:
the last two warm-up steps each lie within 10% of the median of the last three
(``warmup_settled``). It stops at ``warmup_cap`` steps either way (at most
max(3 x warmup, warmup + 10), and never more extra steps than the run times), and the
result says how many ran and whether they settled. ``warmup=0`` runs no warm-up (and is
reported unsettled). DDP ranks agree (all must settle) so they run the same steps.

The timed loop is bracketed by wall-clock times (``timed_start``, ``timed_end``, from
``time.time()``) so the launcher can divide the samples of all instances by the window
that covers all their timed steps.

Compile time, cold and warm: ``compile_s`` (in launch.py) is the first warm-up step,
which compiles with an empty Inductor cache; ``compile_warm_s`` is measured after the
timed steps: ``torch._dynamo.reset()`` forgets every compiled graph and the next step
compiles again, now hitting the cache the first compile filled (the in-process view of a
second launch of the same job, without its start-up cost). Where the run's Inductor cache held
an earlier run's compile already (the climb's shared cache), the first warm-up step was that warm
compile: it is ``compile_warm_s`` too, and the run spends no time compiling again.

Around the timed steps (after the warm-up, after the last instance's timed steps) the worker
times the round trip of a byte between its first two CPUs (``round_trip_ns``, before and
after): on a VM whose host moves the vCPUs between core complexes it moves with them, and so
do the step times (data/vcpu_placement).

The FLOP count (one more step, under torch's FLOP counter, where no earlier run left it) comes
last, after the timed steps and the warm compile: a compiled step run once under the counter runs
its Python eagerly from then on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.errors import CpuoptError

RESULT_KEY = "cpuopt_instance"
PROGRESS_KEY = "cpuopt_progress"  # a line during the timed steps: what a run that times out had reached
PROGRESS_EVERY_S = 1.0


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM).

    Not getrusage's ru_maxrss: Linux carries that across fork and exec, so a worker started
    from a large notebook kernel would report the kernel's peak instead of its own.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pin_to_cores() -> tuple[list[int], str]:
    """Pin to CPUOPT_CORES unless numactl/taskset already did; return (cores, how)."""
    wanted = os.environ.get("CPUOPT_CORES")
    if not wanted:
        return sorted(os.sched_getaffinity(0)), "none"
    cores = {int(c) for c in wanted.split(",")}
    if os.sched_getaffinity(0) == cores:
        return sorted(cores), os.environ.get("CPUOPT_PINNING", "launcher")
    os.sched_setaffinity(0, cores)
    return sorted(cores), "sched_setaffinity"


# The far end of the probe: a fresh interpreter (no fork of a process with torch's threads), pinned to
# one CPU, answering each 1 written into the shared page with a 0; it gives up when no 1 comes.
PONG = """
import mmap, os, sys
fd, cpu, trips = map(int, sys.argv[1:])
os.sched_setaffinity(0, {cpu})
page = mmap.mmap(fd, 64)
page[1] = 1
for _ in range(trips):
    spins = 0
    while page[0] != 1:
        spins += 1
        if spins > 20000000:
            sys.exit(1)
    page[0] = 0
"""


def round_trip_ns(cpus: list[int], trips: int = 2000) -> float | None:
    """The round trip (ns) of one byte of a shared page between this process, pinned for the probe to
    the first of ``cpus``, and a process on the second: the tenth percentile of ``trips`` (the trips the
    scheduler did not delay). Two cores of one L3 answer sooner than two of different core complexes or
    sockets (on a VM, where the host put its vCPUs at that moment). Python on both ends adds a fixed
    cost to each trip, so compare it only with itself. It first waits out the OpenMP threads' spinning
    (``openmp_idle_s``), which would share the far end's CPU. None with fewer than two CPUs, where the
    far end did not answer, or where the OS refused any part of it: a probe never fails a run."""
    if len(cpus) < 2 or not hasattr(os, "memfd_create"):
        return None
    time.sleep(openmp_idle_s())
    try:
        return _ping_pong(cpus[0], cpus[1], trips)
    except OSError:
        return None


def openmp_idle_s(env=os.environ) -> float:
    """How long OpenMP's threads may spin after their last parallel region, and 10 ms: Intel's
    KMP_BLOCKTIME (ms; "infinite" and anything above a second count as a second), 200 ms where Intel
    OpenMP is preloaded without it (its default), none for GNU OpenMP (it spins well under a ms)."""
    blocktime = env.get("KMP_BLOCKTIME")
    if blocktime is not None:
        ms = int(blocktime) if blocktime.isdigit() else 1000
    else:
        ms = 200 if "iomp" in env.get("LD_PRELOAD", "") else 0
    return min(ms, 1000) / 1000 + 0.01


def _reap(process) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


def _ping_pong(near: int, far_cpu: int, trips: int, limit_s: float = 2.0) -> float | None:
    """``round_trip_ns``'s measurement: at most ``limit_s`` of round trips, else None."""
    import mmap
    import subprocess

    with contextlib.ExitStack() as undo:  # undone in reverse: the mask, the far end, the page, the fd
        fd = os.memfd_create("cpuopt-probe")
        undo.callback(os.close, fd)
        os.ftruncate(fd, 64)
        page = mmap.mmap(fd, 64)
        undo.callback(page.close)
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        far = subprocess.Popen([sys.executable, "-S", "-c", PONG, str(fd), str(far_cpu), str(trips)],
                               pass_fds=(fd,), env=env, stderr=subprocess.DEVNULL)
        undo.callback(_reap, far)
        mask = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {near})
        undo.callback(os.sched_setaffinity, 0, mask)
        deadline = time.monotonic() + 10
        while page[1] != 1 and far.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        times, stop = [], time.monotonic() + limit_s
        for _ in range(trips if page[1] == 1 else 0):
            t, spins = time.perf_counter_ns(), 0
            page[0] = 1
            while page[0] != 0 and spins < 20000000:
                spins += 1
            times.append(time.perf_counter_ns() - t)
            if spins >= 20000000 or time.monotonic() > stop:
                return None
    return float(sorted(times)[trips // 10]) if len(times) == trips else None  # the tenth percentile


def wait_for_peers(timeout_s: float = 300.0, stage: str = "ready") -> None:
    """File barrier: timed steps of all instances overlap ("ready": all warmed up; "timed": all timed)."""
    folder, total = os.environ.get("CPUOPT_BARRIER"), int(os.environ.get("CPUOPT_INSTANCES", "1"))
    if not folder or total <= 1:
        return
    open(os.path.join(folder, f"{stage}.{os.environ.get('CPUOPT_INSTANCE', '0')}"), "w").close()
    deadline = time.monotonic() + timeout_s
    while len([f for f in os.listdir(folder) if f.startswith(f"{stage}.")]) < total:
        if time.monotonic() > deadline:
            raise TimeoutError(f"other instances did not reach {stage!r} within {timeout_s:.0f} s")
        time.sleep(0.002)


SETTLE_TOLERANCE = 0.10  # a warm-up step within 10% of the recent median counts as steady


def warmup_settled(times: list[float], tolerance: float = SETTLE_TOLERANCE) -> bool:
    """Steady state: the last two step times each lie within ``tolerance`` of the median of the last three.

    Three steps at least: one step cannot show that it is steady, and the median of three
    lets an earlier slow (cold) step sit in the window without deciding the verdict; two
    steps must agree with it, so one fast step after slow ones (or a step still moving by
    more than the tolerance) does not pass. E.g. [5.0, 1.0, 1.02] passes, [9.0, 1.0, 1.5] not.
    """
    if len(times) < 3:
        return False
    mid = statistics.median(times[-3:])
    return mid > 0 and all(abs(t - mid) <= tolerance * mid for t in times[-2:])


def warmup_cap(warmup: int, steps: int) -> int:
    """The most warm-up steps a run takes: max(3 x warmup, warmup + 10), but never more extra
    steps than the run times (at least 2, so three steps can show steady state). 0 stays 0."""
    if warmup <= 0:
        return 0
    return min(max(3 * warmup, warmup + 10), warmup + max(steps, 2))


def run_warmup(step: Callable[[], tuple], warmup: int, steps: int,
               agree: Callable[[bool], bool] = lambda settled: settled,
               clock: Callable[[], float] = time.perf_counter) -> tuple[list[float], list[float], bool]:
    """Untimed warm-up until steady (see ``warmup_settled``): (step seconds, losses, settled).

    ``agree`` turns this process's verdict into the one every process acts on (DDP ranks
    must run the same number of steps); it is asked once per step from ``warmup`` on.
    """
    times, losses, settled = [], [], False
    cap = warmup_cap(warmup, steps)
    while len(times) < cap:
        t = clock()
        losses.append(step()[0])
        times.append(clock() - t)
        if len(times) >= warmup:
            settled = agree(warmup_settled(times))
            if settled:
                break
    return times, losses, settled


def all_ranks_agree(settled: bool) -> bool:
    """DDP: settled only when every rank has settled (a MIN all-reduce), so all keep stepping together."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([int(settled)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


@contextlib.contextmanager
def fresh_inductor_cache(compiled: bool):
    """A new, empty TORCHINDUCTOR_CACHE_DIR for a compiled run, removed afterwards; yields what was used.

    Inductor's cache outlives processes (/tmp/torchinductor_USER by default), so without
    this a compile time would depend on what ran before. A value the user set wins (the
    launcher warns): "yours: PATH". Must run before torch is imported.
    """
    if not compiled:
        yield None
        return
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        folder = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        yield ("yours, filled: " if os.path.isdir(folder) and os.listdir(folder) else "yours: ") + folder
        return
    folder = tempfile.mkdtemp(prefix="cpuopt-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    try:
        yield "fresh"
    finally:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        shutil.rmtree(folder, ignore_errors=True)


def warm_compile_s(step: Callable[[], tuple]) -> float:
    """Compile time with Inductor's cache filled: forget every compiled graph, time the step that recompiles."""
    import torch._dynamo

    torch._dynamo.reset()
    t = time.perf_counter()
    step()
    return time.perf_counter() - t


def dynamo_frames() -> int:
    """How many frames Dynamo has been asked to compile so far in this process (0 where torch.compile never ran)."""
    if "torch._dynamo" not in sys.modules:  # not imported for an eager run
        return 0
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


def recompiled(warm: int, timed: int) -> list[str]:
    """A note where Dynamo compiled during the timed steps (``dynamo_frames`` before and after them)."""
    if timed <= warm:
        return []
    return [f"torch.compile was asked to compile {timed - warm} frames during the timed steps (a guard failed, "
            "TORCH_LOGS=recompiles says which, or code ran outside its compiled graph): those steps' times "
            "include compiling or eager code"]


def compile_fallbacks(frames: dict) -> list[dict]:
    """The compiled callables (name -> the code object torch.compile wrapped) for which Dynamo holds no
    compiled graph after the steps: they ran eager, silently (TORCH_COMPILE_DISABLE, a graph break it
    could not resume from, its recompile limit). A fallback each, as the package's kernels report theirs."""
    if not frames:
        return []
    import torch._dynamo

    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list as cache_entries
    except ImportError:  # another torch: nothing to check with
        return []
    reason = ("torch.compile is disabled here (TORCH_COMPILE_DISABLE or torch._dynamo.config.disable)"
              if torch._dynamo.config.disable else
              "Dynamo holds no compiled graph for it after the steps (a graph break it could not resume "
              "from, or its recompile limit; TORCH_LOGS=graph_breaks,recompiles says which)")
    return [{"what": f"torch.compile ({name})", "fell_back_to": "eager", "reason": reason}
            for name, code in frames.items() if not cache_entries(code)]


def count_flops(step, *args) -> float | None:
    """FLOPs of one forward + backward + update (torch's FLOP counter, CPU formulas corrected)."""
    from cpuopt_helpers.flops import count_flops as counted

    return counted(step, *args)


def cached_flops(count: Callable[[], float | None]) -> float | None:
    """``count()``, or the count an earlier run of the same model left in the file the launcher
    names in CPUOPT_FLOPS_CACHE (see launch.flops_cache_file); a fresh count is left there."""
    path = os.environ.get("CPUOPT_FLOPS_CACHE")
    if path:
        try:
            with open(path) as f:
                return float(json.load(f)["flops_per_step"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    flops = count()
    if path and flops:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(f"{path}.{os.getpid()}", "w") as f:
                json.dump({"flops_per_step": flops}, f)
            os.replace(f"{path}.{os.getpid()}", path)  # whole or not at all, whoever writes last
        except OSError:
            pass
    return flops


def log_path(path: str | None) -> str | None:
    """Where this instance writes its oneDNN verbose log (or trace), if asked to (``path``)."""
    if not path:
        return None
    if int(os.environ.get("CPUOPT_INSTANCES", "1")) > 1:
        path = f"{path}.{os.environ.get('CPUOPT_INSTANCE', '0')}"
    return os.path.abspath(path)


@contextlib.contextmanager
def onednn_verbose_to(path: str | None):
    """Send oneDNN's verbose output (printed by C code on fd 1) to a file, then restore.

    Only the code inside the block is logged: the timed steps, never the warm-up.
    """
    if path is None:
        yield
        return
    import ctypes

    import torch

    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    with open(path, "wb") as log:
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                yield
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)


LOSS_SPAN = "cpuopt::loss"  # the loss's forward in a trace (profiledn.trace.loss_backward)


@contextlib.contextmanager
def profiler_trace_to(path: str | None, steps: int, shapes: bool = True):
    """Record the block with torch.profiler; save the Chrome trace and an operator table.

    With the operators' input shapes and dtypes (and torch's FLOPs where it counts them):
    what profiledn.wholestep reads to give every operator its work and its ceiling. Recording
    shapes slows each call, so wholestep takes the times from a second, light trace without them
    (``shapes`` False: the config's ``trace_shapes``).
    """
    if path is None:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes, with_flops=shapes) as prof:
        yield
    prof.export_chrome_trace(path)
    ops = [{"name": e.key, "count": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
            "cpu_total_ms": e.cpu_time_total / 1e3} for e in prof.key_averages()]
    with open(f"{path}.ops.json", "w") as f:
        json.dump({"steps": steps, "ops": ops}, f)


def onednn_version(build_info: str) -> str | None:
    match = re.search(r"MKL-DNN v([\d.]+)", build_info)
    return match.group(1) if match else None


@dataclass
class Prepared:
    """A workload ready to train: the step function and what the result reports."""

    workload: object
    batch_size: int
    step: Callable[[], tuple[float, tuple[float, float, float]]]
    bare_step: Callable[[], object]
    seen: dict  # what the step actually ran with (output dtype, IPEX version and notes, DDP backend)
    model: object = None
    optimizer: object = None


# The workload protocol's inputs and outputs: a model takes a tensor, a tuple (``model(*inputs)``)
# or a dict (``model(**inputs)``) and may return anything (a tensor, a tuple, a dict, an output
# object); the loss function gets the outputs as they are.

def call_model(model, inputs):
    """The protocol's call: a dict as keyword arguments, a tuple as positional ones, else one argument."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


def map_tensors(value, fn):
    """``fn`` applied to every tensor in a tensor, tuple, list, dict or dataclass instance (an
    output object such as ``Output(logits)``), recursively, keeping the container's type; anything
    else (another object, a number) is returned as it is."""
    import dataclasses

    import torch

    if isinstance(value, torch.Tensor):
        return fn(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: map_tensors(getattr(value, f.name), fn)
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(map_tensors(v, fn) for v in value))
    if type(value) in (tuple, list):
        return type(value)(map_tensors(v, fn) for v in value)
    if type(value) is dict:
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def float_dtype(value, depth: int = 3) -> str | None:
    """The dtype of the first floating-point tensor in a model's outputs (a tensor, a sequence, a
    mapping or an object holding tensors as attributes), or None where there is none."""
    import torch

    if isinstance(value, torch.Tensor):
        return str(value.dtype).replace("torch.", "") if value.is_floating_point() else None
    if depth == 0:
        return None
    items = (value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list))
             else vars(value).values() if hasattr(value, "__dict__") and not isinstance(value, type) else ())
    for item in items:
        found = float_dtype(item, depth - 1)
        if found:
            return found
    return None


def rank_batch(inputs, targets, rank: int):
    """Rank r's own batch in DDP: noise on float inputs, shifted class targets (rank 0 unchanged).

    Ranks must see different data: with identical batches their parameters would agree
    even if gradients were never averaged, and the sync check would prove nothing.
    """
    import torch

    if rank == 0:
        return inputs, targets
    g = torch.Generator().manual_seed(1000 + rank)
    noisy = map_tensors(inputs, lambda x: x + 0.5 * torch.randn(x.shape, generator=g, dtype=x.dtype)
                        if x.is_floating_point() else x)
    if isinstance(targets, torch.Tensor) and not targets.is_floating_point():
        targets = (targets + rank) % (int(targets.max()) + 1)
    return noisy, targets


def batch_source(workload, batch_size: int, loader_workers: int, channels_last: bool, rank: int = 0):
    """A function returning (model inputs, targets) for each step.

    Without loader workers: one synthetic batch, built once (data loading is not measured).
    With N > 0: a DataLoader with N worker processes over a pool of samples, each sample
    lightly augmented (noise on float inputs), so the loader competes with the training
    threads for cores as a real input pipeline does.
    """
    import torch

    def arrange(inputs, targets):
        if channels_last:
            inputs = map_tensors(inputs, lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t)
        return inputs, targets

    if not loader_workers:
        fixed = arrange(*rank_batch(*workload.make_batch(batch_size), rank))
        return lambda: fixed
    pool_inputs, pool_targets = rank_batch(*workload.make_batch(batch_size * 4), rank)
    samples = batch_size * 4  # what make_batch was asked for

    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return 1 << 30

        def __getitem__(self, i):
            i %= samples
            xs = map_tensors(pool_inputs, lambda x: x[i] + 0.01 * torch.randn_like(x[i]) if x.is_floating_point() else x[i])
            return xs, map_tensors(pool_targets, lambda t: t[i])

    loader = iter(torch.utils.data.DataLoader(Samples(), batch_size=batch_size, num_workers=loader_workers,
                                              persistent_workers=True, prefetch_factor=2))

    def next_batch():
        inputs, targets = next(loader)  # the loader collates a tuple into a list
        return arrange(tuple(inputs) if isinstance(pool_inputs, tuple) else inputs, targets)

    return next_batch


def make_optimizer(params, name: str, impl: str):
    """SGD (momentum 0.9), AdamW or Lamb; impl default (torch's choice; Lamb: a loop), foreach or fused
    (Lamb: one pass over flat buffers, ``cpuopt_helpers.kernels.lamb``)."""
    import torch

    if name == "lamb":
        from cpuopt_helpers.kernels.lamb import Lamb

        return Lamb(params, lr=1e-3, impl="loop" if impl == "default" else impl)
    kwargs = {} if impl == "default" else {impl: True}
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, **kwargs)
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, **kwargs)


def rank_and_world() -> tuple[int, int]:
    return int(os.environ.get("CPUOPT_INSTANCE", "0")), int(os.environ.get("CPUOPT_INSTANCES", "1"))


def ipex_optimize(model, optimizer, dtype: str, seen: dict):
    """ipex.optimize for training; where IPEX refuses to prepack weights, retry without and say so."""
    import torch

    from cpuopt_helpers.runtimes import import_ipex

    ipex = import_ipex()
    seen["ipex"] = ipex.__version__
    kind = torch.bfloat16 if dtype == "bf16" else torch.float32
    try:
        return ipex.optimize(model, optimizer=optimizer, dtype=kind)
    except (RuntimeError, AssertionError, ValueError) as exc:
        seen["ipex_note"] = f"ipex.optimize refused weight prepacking ({str(exc).splitlines()[0][:160]}); " \
                            "ran with weights_prepack=False"
        return ipex.optimize(model, optimizer=optimizer, dtype=kind, weights_prepack=False)


def plain_step_flops(model, workload, batch_size: int, optimizer: str) -> float | None:
    """FLOPs of one training step of a copy of the plain model (forward, loss, backward, update)."""
    import copy

    twin = copy.deepcopy(model)
    opt = make_optimizer(twin.parameters(), optimizer, "default")
    inputs, targets = workload.make_batch(batch_size)

    def one_step():
        opt.zero_grad(set_to_none=True)
        workload.loss_fn(call_model(twin, inputs), targets).backward()
        opt.step()
    return count_flops(one_step)


def prepare(config: RunConfig) -> Prepared:
    """Build the workload, apply the config's optimisations, return the step functions.

    ``step`` times forward (with the loss), backward and the optimizer separately and
    returns the loss; ``bare_step`` is the same work with no clocks and no ``.item()``
    (the overhead benchmark compares the two).
    """
    import torch

    from cpuopt_helpers.workloads import build_workload

    torch.manual_seed(config.seed)
    rank, world = rank_and_world()
    workload = build_workload(config.workload, config.preset, dict(config.options))
    batch_size = config.batch_size or workload.default_batch_size
    if config.batch_policy == "global":
        batch_size = max(1, batch_size // world)
    channels_last = config.channels_last and workload.image_like
    seen: dict = {}
    model, optimizer = optimised(config, workload, batch_size, channels_last, seen)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if config.dtype == "bf16" \
        else contextlib.nullcontext
    clock = time.perf_counter

    to_loss = loss_of(config, workload)
    next_batch = batch_source(workload, batch_size, config.loader_workers, channels_last,
                              rank if config.mode == "ddp" else 0)
    inputs, targets = next_batch()
    forward_loss = forward_with_loss(config, model, to_loss, autocast, optimizer)
    if config.compile and config.compile_scope == "step":  # checked after the steps (compile_fallbacks)
        seen["compiled_frames"] = {"the step's forward and loss": forward_loss._torchdynamo_orig_callable.__code__}

    def step():
        nonlocal inputs, targets
        if config.loader_workers:
            inputs, targets = next_batch()  # a fresh batch from the loader's worker processes
        t0 = clock()
        optimizer.zero_grad(set_to_none=True)
        loss, outputs = forward_loss(inputs, targets)
        seen["output_dtype"] = float_dtype(outputs)
        t1 = clock()
        loss.backward()
        t2 = clock()
        optimizer.step()
        t3 = clock()
        return loss.item(), (t1 - t0, t2 - t1, t3 - t2)

    def bare_step():
        inputs, targets = next_batch()
        optimizer.zero_grad(set_to_none=True)
        loss, _ = forward_loss(inputs, targets)
        loss.backward()
        optimizer.step()
        return loss

    return Prepared(workload, batch_size, step, bare_step, seen, model, optimizer)


def loss_of(config: RunConfig, workload) -> Callable:
    """The workload's loss as the step computes it, outside autocast: in bf16 the floating-point
    tensors among the outputs are cast (to fp32: the loss and its reductions in fp32, as the paper
    advises; to bf16 with bf16_loss, what it advises against); fp32 outputs, and outputs of any
    other kind, reach loss_fn as they are. A trace (--trace) marks the loss: its backward is
    found by the autograd sequence numbers."""
    import torch

    def to_loss(outputs, targets):
        with torch.profiler.record_function(LOSS_SPAN):
            if config.dtype == "bf16":
                dtype = torch.bfloat16 if config.bf16_loss else torch.float32
                outputs = map_tensors(outputs, lambda t: t.to(dtype) if t.is_floating_point() else t)
            return workload.loss_fn(outputs, targets)
    return to_loss


def optimised(config: RunConfig, workload, batch_size: int, channels_last: bool, seen: dict):
    """The workload's model and its optimizer with the config's optimisations: channels-last,
    IPEX, DDP, torch.compile (Inductor or AMD's zentorch), in that order."""
    import torch

    model = workload.model
    model.train()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = make_optimizer(model.parameters(), config.optimizer, config.optimizer_impl)
    if config.ipex:  # IPEX's own operators escape the FLOP counter: count the same work before
        seen["flops_per_step"] = plain_step_flops(model, workload, batch_size, config.optimizer)
        model, optimizer = ipex_optimize(model, optimizer, config.dtype, seen)
    if config.mode == "ddp":
        import torch.distributed as dist

        rank, world = rank_and_world()
        dist.init_process_group("gloo", rank=rank, world_size=world)
        seen["backend"] = dist.get_backend()
        model = torch.nn.parallel.DistributedDataParallel(model)
    if config.compile == "zentorch":  # AMD's backend over ZenDNN, checked against this torch first
        from cpuopt_helpers.runtimes import import_zentorch

        import_zentorch()
        model = torch.compile(model, backend="zentorch")
    elif config.compile and config.compile_scope == "model":  # scope "step": compiled_step, in prepare
        model = torch.compile(model, mode=compile_mode(config))
    if config.compile and config.compile_scope == "model":  # checked after the steps (compile_fallbacks)
        seen["compiled_frames"] = {"the model": type(model._orig_mod).forward.__code__}
    return model, optimizer


def compile_mode(config: RunConfig) -> str | None:
    return None if config.compile == "default" else config.compile


def forward_with_loss(config: RunConfig, model, to_loss: Callable, autocast, optimizer) -> Callable:
    """The step's forward and loss: forward_loss(inputs, targets) -> (loss, outputs), the model under
    autocast and the loss outside it. With ``--compile-scope step`` the whole training step is
    compiled: this function as one region (AOTAutograd compiles its backward with it) and
    ``optimizer.step`` (replaced in place), unless the optimizer is fused already: torch's fused
    steps are closed to the compiler (a graph break, nothing gained), and the package's fused Lamb,
    one compiled loop already, went far slower compiled again around its flat buffers' views
    (single runs on 2026-12-05, RetinaNet standard, Zen 4: 0.44 s a step against 0.05)."""
    import torch

    def forward_loss(inputs, targets):
        with autocast():
            outputs = call_model(model, inputs)
        return to_loss(outputs, targets), outputs

    if not (config.compile and config.compile_scope == "step"):
        return forward_loss
    if config.optimizer_impl != "fused":
        optimizer.step = torch.compile(optimizer.step, mode=compile_mode(config))
    return torch.compile(forward_loss, mode=compile_mode(config))


def param_checksum(model) -> float:
    """A checksum of every parameter (float64 sums weighted by position), to compare ranks."""
    import torch

    with torch.no_grad():
        return float(sum((p.detach().double().flatten() * torch.arange(1, p.numel() + 1, dtype=torch.float64)).sum()
                         for p in model.parameters()))


def ddp_sync_report(model) -> dict:
    """Every rank's parameter checksum, gathered; in sync when all agree to float rounding."""
    import torch.distributed as dist

    mine = param_checksum(model)
    checksums = [None] * dist.get_world_size()
    dist.all_gather_object(checksums, mine)
    scale = max(1.0, max(abs(c) for c in checksums))
    in_sync = all(abs(c - checksums[0]) <= 1e-9 * scale for c in checksums)
    return {"param_checksums": checksums, "params_in_sync": in_sync}


def kernel_fallbacks() -> list[dict]:
    """The package's kernels that ran other than asked in this process: fused Lamb or the focal
    loss's compiled kernels fell back to eager where torch.compile failed (their STATUS says why)."""
    out = []
    for module, what in (("cpuopt_helpers.kernels.lamb", "fused Lamb"),
                         ("cpuopt_helpers.kernels.focal_loss", "the focal loss's compiled kernels"),
                         ("cpuopt_helpers.kernels.detection_loss", "the fused detection loss's compiled loop")):
        status = getattr(sys.modules.get(module), "STATUS", None) or {}
        if status.get("compiled") is False:
            out.append({"what": what, "fell_back_to": "eager", "reason": status.get("reason", "")})
    return out


def train(config: RunConfig, cache_filled: bool = False, cores: list[int] | None = None) -> dict:
    """Run warm-up and timed steps of one workload; return this instance's result. ``cache_filled``:
    Inductor's cache held an earlier compile, so the first warm-up step compiled warm. ``cores``: the
    instance's (``pin_to_cores``; Intel OpenMP's affinity pins the main thread to one of them)."""
    import torch

    prepared = prepare(config)
    workload, batch_size, step = prepared.workload, prepared.batch_size, prepared.step
    first_step_wall = time.time()
    agree = all_ranks_agree if config.mode == "ddp" else (lambda settled: settled)
    warmup_s, losses, settled = run_warmup(step, config.warmup, config.steps, agree)
    frames_warm = dynamo_frames()
    cpus = cores or sorted(os.sched_getaffinity(0))
    trip_before = round_trip_ns(cpus)  # where its cores sit now: around the timed steps, not in them
    wait_for_peers()
    verbose_log, trace = log_path(config.onednn_verbose), log_path(config.trace)
    with onednn_verbose_to(verbose_log), profiler_trace_to(trace, config.steps, config.trace_shapes):
        timed = timed_steps(step, config.steps, losses, 0 if verbose_log else batch_size)  # stdout is the log then
    frames_timed = dynamo_frames()
    wait_for_peers(config.timeout_s, stage="timed")  # what follows must not disturb another instance's timed steps
    trips = [trip_before, round_trip_ns(cpus)]
    compile_warm = None
    if config.compile:
        compile_warm = warmup_s[0] if cache_filled and warmup_s else warm_compile_s(step)
    # Last: a step under torch's FLOP counter (a dispatch mode) leaves a compiled step running its Python
    # eagerly from then on (torch 2.13; in the timed steps that was 20-50% slower forwards, a compile among them)
    flops_per_step = (workload.flops_per_sample * batch_size if workload.flops_per_sample
                      else prepared.seen.get("flops_per_step") or cached_flops(lambda: count_flops(step)))
    if verbose_log:  # what the log covers, so `cpuopt profile LOG --project` needs no --steps
        with open(f"{verbose_log}.meta.json", "w") as f:
            json.dump({"steps": config.steps, "threads": torch.get_num_threads(),
                       "cores": cpus, "workload": config.workload}, f)  # the instance's, not the main thread's
    result = {
        "batch_size": batch_size, **timed,
        "warmup_s": warmup_s,
        "warmup_steps": len(warmup_s),
        "warmup_settled": settled,
        "round_trip_ns": None if None in trips else trips, "round_trip_cpus": cpus[:2],
        "compile_warm_s": compile_warm,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses,  # every step's, warm-up first: the same seed and batch give comparable curves
        "flops_per_step": flops_per_step,
        "output_dtype": prepared.seen.get("output_dtype"),
        "notes": ([prepared.seen["ipex_note"]] if "ipex_note" in prepared.seen else []) + recompiled(frames_warm,
                                                                                                   frames_timed),
        "fallbacks": kernel_fallbacks() + compile_fallbacks(prepared.seen.get("compiled_frames", {})),
        "onednn_log": verbose_log,
        "trace": trace,
        "first_step_wall": first_step_wall,
        "torch_threads": torch.get_num_threads(),
        "python_executable": sys.executable,
        "versions": run_versions(prepared.seen),
    }
    if config.mode == "ddp":
        result.update(ddp_sync_report(prepared.model), backend=prepared.seen["backend"])
        del prepared, step  # the DDP reducer goes before its process group: the other order can hang
        end_ddp()
    return result


def run_versions(seen: dict) -> dict:
    """The versions a result records: Python, torch, its oneDNN, and IPEX where the run used it."""
    import torch

    versions = {"python": sys.version.split()[0], "torch": torch.__version__,
                "onednn": onednn_version(torch.__config__.show())}
    if "ipex" in seen:
        versions["ipex"] = seen["ipex"]
    return versions


def timed_steps(step: Callable[[], tuple], steps: int, losses: list[float], batch_size: int = 0) -> dict:
    """The timed loop: each step's time and phases, the losses appended, bracketed by wall-clock
    times (comparable between the instances of one run), and the CPU time the process's threads spent
    in it, in user space and in the kernel, with the page faults taken (``cpu_s``), and that of the CPUs
    it may run on (``machine_jiffies``: the launcher tells other work from it). After each step a progress line
    (PROGRESS_KEY: steps and samples done, seconds since the first) tells the launcher, should
    the run time out, the throughput it reached: at most one a second, so that it costs the timed
    window nothing measurable."""
    clock = time.perf_counter
    times, phases = [], []
    jiffies = machine_jiffies()  # its CPUs', to tell other work from this process's (launch)
    before = resource.getrusage(resource.RUSAGE_SELF)  # every thread's: what the kernel did for the steps
    timed_start = said = time.time()
    for k in range(steps):
        t = clock()
        loss, phase = step()
        times.append(clock() - t)
        phases.append(phase)
        losses.append(loss)
        if batch_size and time.time() - said >= PROGRESS_EVERY_S:
            said = time.time()
            print(json.dumps({PROGRESS_KEY: {"steps": k + 1, "samples": (k + 1) * batch_size,
                                             "elapsed_s": said - timed_start}}), flush=True)
    after = resource.getrusage(resource.RUSAGE_SELF)
    jiffies = {"before": jiffies, "after": machine_jiffies()} if jiffies else None
    return {"step_s": times, "timed_start": timed_start, "timed_end": time.time(), "machine_jiffies": jiffies,
            "phase_s": {name: [p[i] for p in phases] for i, name in enumerate(("forward", "backward", "optimizer"))},
            "cpu_s": {"user": after.ru_utime - before.ru_utime, "system": after.ru_stime - before.ru_stime,
                      "page_faults": after.ru_minflt - before.ru_minflt + after.ru_majflt - before.ru_majflt}}


def machine_jiffies() -> list[int] | None:
    """/proc/stat's CPU time by kind, in clock ticks, summed over the CPUs this process may run on:
    the run's cores where it is pinned, so that other work on other cores does not count. The
    whole machine's line where /proc/stat does not list them; None off Linux."""
    from cpuopt_helpers.provenance import parse_proc_stat

    try:
        with open("/proc/stat") as f:
            rows = parse_proc_stat(f.read())
    except OSError:
        return None
    mine = [rows.get(f"cpu{c}") for c in sorted(os.sched_getaffinity(0))]
    return [sum(column) for column in zip(*mine)] if mine and all(mine) else rows.get("cpu")


def end_ddp() -> None:
    """Tear a DDP job down once the caller dropped its model: the reducer collected, then the
    process group (the other order can hang)."""
    import gc

    import torch.distributed as dist

    gc.collect()
    dist.barrier()  # every rank done with the job's collectives before any tears its connections down
    dist.destroy_process_group()


# oneDNN has no kernel for this operation in this dtype on this CPU (e.g. a bf16 LSTM on an
# AVX2-only CPU): the run is recorded as `unsupported`, measured and said, not a crash
UNSUPPORTED_SIGNS = ("could not create a primitive descriptor",)
UNSUPPORTED_EXIT = 3
REFUSAL = "cpuopt worker: error: "  # how a worker says its input is wrong, then exits 2 (read by launch)


def note_failure() -> None:
    """Leave the moment this instance failed in the launcher's folder (CPUOPT_BARRIER), so that
    it names the instance that failed first: a DDP rank fails too once its peer has crashed."""
    folder = os.environ.get("CPUOPT_BARRIER")
    if folder:
        try:
            with open(os.path.join(folder, f"{os.environ.get('CPUOPT_INSTANCE', '0')}.failed"), "w") as f:
                f.write(repr(time.time()))
        except OSError:
            pass


def end_with_launcher() -> None:
    """Ask Linux to stop this worker (SIGTERM) when the launcher that started it dies: a launcher
    killed outright (`kill -9`, the OOM killer, a notebook's kernel that died) cannot stop its
    workers, which run in sessions of their own, and one would measure on into the next run.
    (numactl and taskset exec, so the launcher is the parent; a wrapper that forks is, and ends with it.)"""
    launcher = os.environ.get("CPUOPT_LAUNCHER_PID", "")
    if not (launcher.isdecimal() and sys.platform.startswith("linux")):
        return
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(launcher):
        try:
            os.kill(int(launcher), 0)
        except ProcessLookupError:  # the launcher died before this asked: nobody will read the result
            os._exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="cpuopt's measured process (started by the launcher)")
    parser.add_argument("--config", required=True, help="RunConfig as JSON")
    config = RunConfig.from_json(parser.parse_args(argv).config)
    end_with_launcher()
    cores, pinned_by = pin_to_cores()
    try:
        with fresh_inductor_cache(bool(config.compile)) as inductor_cache:  # before torch is imported
            result = train(config, (inductor_cache or "").startswith("yours, filled: "), cores)
    except BaseException as exc:
        note_failure()
        if isinstance(exc, CpuoptError):  # e.g. an IPEX that does not match this torch: say so, exit 2
            print(f"{REFUSAL}{exc}", file=sys.stderr)
            return 2
        if isinstance(exc, RuntimeError) and any(sign in str(exc) for sign in UNSUPPORTED_SIGNS):
            print(f"cpuopt worker: unsupported on this CPU: {str(exc).splitlines()[0]}", file=sys.stderr)
            return UNSUPPORTED_EXIT
        raise
    result.update({
        "inductor_cache": inductor_cache,
        "index": int(os.environ.get("CPUOPT_INSTANCE", "0")),
        "pid": os.getpid(),
        "cores": cores,
        "affinity": sorted(os.sched_getaffinity(0)),
        "pinned_by": pinned_by,
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "peak_rss_mb": peak_rss_mb(),
        "launch_wall": float(os.environ.get("CPUOPT_LAUNCH_TIME", "nan")),
    })
    sys.stdout.flush()
    print(json.dumps({RESULT_KEY: result}), flush=True)
    if config.mode == "ddp" or not (config.loader_workers or config.compile):
        # Skip the interpreter's teardown: with torch and torch._dynamo loaded it takes ~1.3 s
        # (of a ~12 s run on two cores), measures nothing and, in DDP, is where gloo can abort
        # a pinned rank (see rank_exec). The result and every log are written and flushed by
        # now. Outside DDP, child processes are the exception (a DataLoader's workers,
        # Inductor's compile workers): a normal exit joins them, so none outlives this run
        # into the next one's measurement.
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
