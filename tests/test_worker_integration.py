"""Real worker processes: defaults, allocators, instances, pinning fallback, failures.

Every test here starts worker processes (slow) except the in-process check of a workload's own
FLOP count. Tests that only read different fields of the same run share it (module fixtures).
"""

import dataclasses
import json
import math
import os
import time
from pathlib import Path

import pytest

from cpuopt_helpers import launch, planning, system, worker
from cpuopt_helpers.config import RunConfig

slow = pytest.mark.slow
QUICK = dict(steps=4, warmup=1)


def run(config, **machine_changes):
    machine = planning.Machine.this()
    if machine_changes:
        machine = planning.Machine(**{**machine.__dict__, **machine_changes})
    return launch.run_plan(planning.build_plan(config, machine))


def conv_flops(batch, in_size, out_size, c_out, c_in, kernel, stride=1, padding=0):
    """Forward FLOPs of a square convolution: 2 * N * C_out * C_in * the kernel's taps that land on the
    input (those on padding are not work, as benchdnn counts), enumerated along one axis and squared."""
    row = sum(0 <= o * stride - padding + k < in_size for o in range(out_size) for k in range(kernel))
    return 2 * batch * c_out * c_in * row * row


# One training step of the quick cnn at its default batch (16 images, 3x32x32), counted by hand in
# the workbook's convention (tests/test_flops.py): backward = input gradient + weight gradient, each as
# large as the forward, so a layer costs 3x its forward; the stem 2x (its input, the images, needs no
# gradient). BatchNorm, ReLU, pooling, the loss and SGD count nothing.
QUICK_CNN_STEP_FLOPS = (
    2 * conv_flops(16, 32, 16, 16, 3, 7, 2, 3)     # stem: 7x7 stride 2 padding 3, 32 -> 16 px (max-pool to 8 px)
    + 3 * 2 * conv_flops(16, 8, 8, 16, 16, 3, 1, 1)  # stage 1: a basic block, two 3x3 convs 16 -> 16 at 8 px
    + 3 * conv_flops(16, 8, 4, 32, 16, 3, 2, 1)      # stage 2: 3x3 stride 2, 16 -> 32, 8 -> 4 px
    + 3 * conv_flops(16, 4, 4, 32, 32, 3, 1, 1)      #          3x3, 32 -> 32 at 4 px
    + 3 * conv_flops(16, 8, 4, 32, 16, 1, 2)         #          the 1x1 stride-2 shortcut, 16 -> 32
    + 3 * 2 * 16 * 32 * 10                           # head: Linear(32, 10)
)
assert QUICK_CNN_STEP_FLOPS == 74_901_504  # torch's formula, which counts the taps on padding too: 88,897,536


@pytest.fixture(scope="module")
def default_run():
    """One quick cnn run with every default, started from a large parent (700 MB touched, as a
    notebook kernel can be): the defaults test and the peak-RSS test read the same run."""
    parent = bytearray(700 * 1024 * 1024)
    parent[::4096] = b"\x01" * len(parent[::4096])
    try:
        return run(RunConfig(**QUICK))
    finally:
        del parent


@slow
def test_cnn_quick_with_defaults(default_run):
    r = default_run
    assert r["status"] == "ok", r["reason"]
    assert r["samples_per_s"] > 0 and r["step_ms"]["n"] == 4
    assert set(r["phase_ms"]) == {"forward", "backward", "optimizer"}
    assert r["instances"][0]["output_dtype"] == "float32"  # no autocast unless asked (test_bf16: bf16 when asked)
    assert sum(r["phase_ms"].values()) <= r["step_ms"]["p90"] * 1.05
    # the worker's count (torch's FLOP counter, flops.py's formulas) against the hand count
    assert abs(r["flops_per_step"] - QUICK_CNN_STEP_FLOPS) <= 0.05 * QUICK_CNN_STEP_FLOPS, r["flops_per_step"]
    cached = json.loads(Path(launch.flops_cache_file(RunConfig.from_dict(r["config"]))).read_text())
    assert cached["flops_per_step"] == r["flops_per_step"]  # left for the next run of this model
    # achieved GFLOP/s recomputed from the instance's own timings: FLOPs x timed steps over the wall
    # window from its first timed step's start to its last one's end (what the result divides by) ...
    inst = r["instances"][0]
    steps = inst["step_ms"]["n"]
    window_s = inst["timed_end"] - inst["timed_start"]
    assert r["achieved_gflops"] == pytest.approx(r["flops_per_step"] * steps / window_s / 1e9, rel=1e-6)
    # ... and that window is the step times (their sum: batch x steps / the instance's samples/s) with
    # nothing else in it but the loop's bookkeeping (measured under 1% on a loaded two-core machine;
    # 5% leaves room for a preemption between two steps)
    step_time_s = inst["batch_size"] * steps / inst["samples_per_s"]
    assert step_time_s <= window_s * 1.001
    assert r["achieved_gflops"] == pytest.approx(r["flops_per_step"] * steps / step_time_s / 1e9, rel=0.05)
    assert r["peak_rss_mb"] > 50 and r["startup_s"] > 0
    assert 0 <= r["system_share"] < 1 and r["page_faults_per_step"] >= 0  # read by the worker around its timed steps
    assert r["versions"]["torch"].startswith("2.13.0")
    inst = r["instances"][0]
    assert inst["torch_threads"] == system.topology().physical_cores
    assert inst["affinity"] == sorted(system.topology().core_order()[:inst["torch_threads"]])


@slow
def test_tcmalloc_is_preloaded_for_real():
    lib = system.locate_library("tcmalloc")
    if lib is None:
        pytest.skip("tcmalloc not installed here (make setup installs it as root)")
    r = run(RunConfig(allocator="tcmalloc", **QUICK))
    assert r["status"] == "ok", r["reason"]
    assert r["env"]["LD_PRELOAD"] == lib
    assert r["instances"][0]["ld_preload"] == lib  # seen from inside the worker


def test_jemalloc_as_configured_keeps_freed_memory_that_run_cpus_setting_returns():
    """Training allocates the same large blocks every step. With config.JEMALLOC_CONF jemalloc reuses
    a freed block's pages; with run_cpu's MALLOC_CONF it hands them back to the OS and faults them in
    again at the next allocation (page faults counted, not timed)."""
    import subprocess
    import sys

    from cpuopt_helpers import config

    lib = system.locate_library("jemalloc")
    if lib is None:
        pytest.skip("jemalloc not installed here (make setup installs it as root)")
    code = ("import resource\nfor _ in range(10):\n    block = b'x' * (64 << 20)\n    del block\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)")

    def faults(conf: str) -> int:
        env = {**os.environ, "LD_PRELOAD": lib, "MALLOC_CONF": conf}
        return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                  check=True, timeout=60).stdout)

    returned, kept = faults(config.RUN_CPU_JEMALLOC_CONF), faults(config.JEMALLOC_CONF)
    assert returned > 10 * (64 << 20) // 4096 * 0.9  # each block's pages faulted in anew (4 KB pages)
    assert kept < returned / 3, (kept, returned)


@slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_two_instances_on_different_cores():
    r = run(RunConfig(instances=2, threads=1, **QUICK))
    assert r["status"] == "ok", r["reason"]
    a, b = r["instances"]
    assert len(a["affinity"]) == 1 and len(b["affinity"]) == 1 and a["affinity"] != b["affinity"]
    assert a["pid"] != b["pid"] and a["torch_threads"] == b["torch_threads"] == 1
    # all samples over the window from the first start of timed steps to the last end (not a sum of rates)
    assert a["timed_end"] > a["timed_start"] and b["timed_end"] > b["timed_start"]
    window = max(a["timed_end"], b["timed_end"]) - min(a["timed_start"], b["timed_start"])
    samples = sum(i["batch_size"] * i["step_ms"]["n"] for i in (a, b))
    assert r["timed_window_s"] == pytest.approx(window) and r["samples_per_s"] == pytest.approx(samples / window)
    assert max(a["timed_start"], b["timed_start"]) < min(a["timed_end"], b["timed_end"])  # the barrier: they overlap
    assert r["warmup_steps"] == max(a["warmup_steps"], b["warmup_steps"])
    assert r["warmup_settled"] == (a["warmup_settled"] and b["warmup_settled"])
    assert r["machine_state"]["threads"] == 2


@slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_worker_pins_itself_without_numactl_or_taskset():
    last = sorted(os.sched_getaffinity(0))[-1]
    r = run(RunConfig(threads=1, cores=((last,),), **QUICK), numactl=False, taskset=False)
    assert r["status"] == "ok", r["reason"]
    assert r["pinning"] == "sched_setaffinity" and r["argv"][0][0] != "numactl"
    assert r["instances"][0]["affinity"] == [last] and r["instances"][0]["pinned_by"] == "sched_setaffinity"


# The user MLP's training step at its default batch (8), by hand: Linear(32, 64) costs its forward
# 2*8*32*64 twice (forward and weight gradient; no input gradient, the batch needs none), Linear(64, 1)
# its forward 2*8*64*1 three times (forward, input and weight gradient); ReLU, MSE and SGD nothing.
USER_MLP_STEP_FLOPS = 2 * (2 * 8 * 32 * 64) + 3 * (2 * 8 * 64 * 1)
assert USER_MLP_STEP_FLOPS == 68_608


@slow
def test_user_workload_runs_without_changing_the_package():
    r = run(RunConfig(workload="tests.user_workloads:build_uncounted", **QUICK))  # no flops_per_sample
    assert r["status"] == "ok", r["reason"]
    assert r["instances"][0]["batch_size"] == 8  # the workload's own default batch
    assert r["flops_per_step"] == USER_MLP_STEP_FLOPS  # counted by the worker, not given


def test_a_workloads_own_flops_per_sample_is_taken_as_given():
    """In-process (no worker started): where the workload states its FLOPs, the worker takes them
    (8 x 6 x 2,112 = 101,376, its x3 convention) instead of counting (68,608, see above)."""
    r = worker.train(RunConfig(workload="tests.user_workloads:build", steps=1, warmup=1))
    assert r["batch_size"] == 8 and r["flops_per_step"] == 8 * 6 * (32 * 64 + 64) != USER_MLP_STEP_FLOPS


def test_the_protocol_calls_a_model_with_a_tensor_a_tuple_or_a_dict():
    torch = pytest.importorskip("torch")
    seen = []
    model = lambda *args, **kwargs: seen.append((len(args), sorted(kwargs))) or torch.ones(1)  # noqa: E731
    for inputs in (torch.zeros(2), (torch.zeros(2), torch.zeros(3)), {"a": torch.zeros(2), "mask": torch.ones(2)}):
        worker.call_model(model, inputs)
    assert seen == [(1, []), (2, []), (0, ["a", "mask"])]


def test_outputs_of_any_kind_give_their_dtype_and_keep_their_shape():
    torch = pytest.importorskip("torch")
    from tests.user_workloads import Output

    bf = torch.zeros(2, dtype=torch.bfloat16)
    assert worker.float_dtype(bf) == "bfloat16" and worker.float_dtype(torch.zeros(2, dtype=torch.long)) is None
    assert worker.float_dtype((torch.zeros(1, dtype=torch.long), {"x": bf})) == "bfloat16"
    assert worker.float_dtype(Output(bf, None)) == "bfloat16" and worker.float_dtype(3) is None
    cast = worker.map_tensors({"a": (bf, [bf]), "n": 3}, lambda t: t.float())
    assert cast["a"][0].dtype == cast["a"][1][0].dtype == torch.float32 and cast["n"] == 3
    assert isinstance(cast["a"], tuple) and isinstance(cast["a"][1], list)
    @dataclasses.dataclass(frozen=True)
    class Out:  # own-model.md's output dataclass: its tensors cast, its type kept
        logits: object
        hidden: object = None

    cast = worker.map_tensors(Out(bf, [bf]), lambda t: t.float())
    assert isinstance(cast, Out) and cast.logits.dtype == cast.hidden[0].dtype == torch.float32
    opaque = Output(bf, None)
    assert worker.map_tensors(opaque, lambda t: t.float()) is opaque  # any other object reaches the loss as it is


@slow
@pytest.mark.parametrize("workload", ["dict_model", "tuple_model"])
def test_models_taking_a_dict_or_a_tuple_and_returning_objects_train(workload):
    """A model called with keyword inputs returning an output object, and one with two positional
    inputs returning a tuple: trained plainly, in bf16 autocast, with channels-last asked for (no
    4-D input: nothing to change) and with a DataLoader's workers collating the dict."""
    name = f"tests.user_workloads:{workload}"
    plain = run(RunConfig(workload=name, **QUICK))
    assert plain["status"] == "ok", plain["reason"]
    assert plain["instances"][0]["output_dtype"] == "float32" and plain["flops_per_step"] > 0
    bf16 = run(RunConfig(workload=name, dtype="bf16", channels_last=True, loader_workers=1, **QUICK))
    assert bf16["status"] == "ok", bf16["reason"]
    assert bf16["instances"][0]["output_dtype"] == "bfloat16"
    assert math.isfinite(bf16["loss_last"])
    if workload == "dict_model":  # DDP ranks get their own data from a dict too, and stay in sync
        ddp = run(RunConfig(workload=name, mode="ddp", instances=2, threads=1, **QUICK))
        assert ddp["status"] == "ok", ddp["reason"]
        assert ddp["params_in_sync"] is True


@slow
def test_crashing_worker_becomes_a_failed_result():
    r = run(RunConfig(workload="tests.user_workloads:crash", **QUICK))
    assert r["status"] == "failed"
    assert "exited with code 1" in r["reason"] and "deliberate crash in a user workload" in r["reason"]
    assert r["samples_per_s"] is None


@slow
def test_hanging_worker_times_out_and_leaves_no_process(tmp_path):
    pidfile = tmp_path / "pids"
    # 15 s: time to start Python and torch (and write the pid) even while the other half of
    # `make test` runs beside this one
    config = RunConfig(workload="tests.user_workloads:hang", timeout_s=15, env=(("CPUOPT_TEST_PIDFILE", str(pidfile)),),
                       **QUICK)
    start = time.monotonic()
    r = run(config)
    assert r["status"] == "timeout" and "15 s timeout" in r["reason"]
    assert time.monotonic() - start < 40
    pid = int(pidfile.read_text().split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_one_failing_instance_stops_the_others_at_once():
    start = time.monotonic()
    r = run(RunConfig(workload="tests.user_workloads:crash_second", instances=2, threads=1, timeout_s=120,
                      steps=2000, warmup=1))
    assert r["status"] == "failed" and "instance 1 exited with code 1" in r["reason"]
    assert "instance 1 fails on purpose" in r["reason"]
    assert time.monotonic() - start < 60  # not the 120 s timeout: instance 0 was stopped


@slow
def test_dataloader_workers_feed_the_steps():
    r = run(RunConfig(loader_workers=2, **QUICK))
    assert r["status"] == "ok", r["reason"]
    assert r["loss_first"] != r["loss_last"]


@slow
def test_affinity_none_leaves_pinning_to_the_os():
    r = run(RunConfig(affinity="none", **QUICK))
    assert r["status"] == "ok" and r["pinning"] == "none"
    assert r["instances"][0]["pinned_by"] == "none" and "numactl" not in r["argv"][0]
    assert r["instances"][0]["affinity"] == sorted(os.sched_getaffinity(0))


@slow
def test_run_cpu_launcher_with_its_defaults():
    r = run(RunConfig(launcher="run_cpu", **QUICK))
    assert r["status"] == "ok", r["reason"]
    assert r["argv"][0][1:3] == ["-m", "torch.backends.xeon.run_cpu"]
    assert "run_cpu" in r["launcher_log"]  # what run_cpu itself logged about its choices


@slow
def test_peak_rss_is_the_workers_own_not_its_parents(default_run):
    r = default_run  # started from a parent of 700 MB (see the fixture)
    assert r["status"] == "ok" and 20 < r["peak_rss_mb"] < 650


@pytest.mark.slow
def test_an_operation_this_cpu_has_no_kernel_for_is_unsupported_not_failed():
    """A bf16 LSTM: oneDNN has no kernel for it on a CPU without a bf16 path (AVX2), and trains
    it where there is one; either way the result says which, never a bare failure."""
    from cpuopt_helpers import system

    r = launch.run(RunConfig(workload="rnn", dtype="bf16", steps=2, warmup=1))
    assert r["status"] in ("ok", "unsupported"), r["reason"]
    if r["status"] == "unsupported":
        assert "could not create a primitive descriptor" in r["reason"]
        assert not system.collect_facts().bf16["accelerated"]
