"""Real worker processes: defaults, allocators, instances, pinning fallback, failures."""

import os
import time

import pytest

from cpuopt_helpers import launch, system
from cpuopt_helpers.config import RunConfig

pytestmark = pytest.mark.slow
QUICK = dict(steps=4, warmup=1)


def run(config, **machine_changes):
    machine = launch.Machine.this()
    if machine_changes:
        machine = launch.Machine(**{**machine.__dict__, **machine_changes})
    return launch.run_plan(launch.build_plan(config, machine))


def test_cnn_quick_with_defaults():
    r = run(RunConfig(**QUICK))
    assert r["status"] == "ok", r["reason"]
    assert r["samples_per_s"] > 0 and r["step_ms"]["n"] == 4
    assert set(r["phase_ms"]) == {"forward", "backward", "optimizer"}
    assert sum(r["phase_ms"].values()) <= r["step_ms"]["p90"] * 1.05
    assert r["flops_per_step"] > 1e6 and r["achieved_gflops"] > 0  # counted by torch's FLOP counter
    assert r["peak_rss_mb"] > 50 and r["startup_s"] > 0
    assert r["versions"]["torch"].startswith("2.13.0")
    inst = r["instances"][0]
    assert inst["torch_threads"] == system.topology().physical_cores
    assert inst["affinity"] == sorted(system.topology().core_order()[:inst["torch_threads"]])


def test_tcmalloc_is_preloaded_for_real():
    lib = system.locate_library("tcmalloc")
    if lib is None:
        pytest.skip("tcmalloc not installed here (make setup installs it as root)")
    r = run(RunConfig(allocator="tcmalloc", **QUICK))
    assert r["status"] == "ok", r["reason"]
    assert r["env"]["LD_PRELOAD"] == lib
    assert r["instances"][0]["ld_preload"] == lib  # seen from inside the worker


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_two_instances_on_different_cores():
    r = run(RunConfig(instances=2, threads=1, **QUICK))
    assert r["status"] == "ok", r["reason"]
    a, b = r["instances"]
    assert len(a["affinity"]) == 1 and len(b["affinity"]) == 1 and a["affinity"] != b["affinity"]
    assert a["pid"] != b["pid"] and a["torch_threads"] == b["torch_threads"] == 1
    # all samples over the window from the first start of timed steps to the last end (not a sum of rates)
    window = max(a["timed_end"], b["timed_end"]) - min(a["timed_start"], b["timed_start"])
    assert window >= max(a["timed_end"] - a["timed_start"], b["timed_end"] - b["timed_start"]) > 0
    samples = sum(i["batch_size"] * i["step_ms"]["n"] for i in (a, b))
    assert r["timed_window_s"] == pytest.approx(window) and r["samples_per_s"] == pytest.approx(samples / window)
    assert max(a["timed_start"], b["timed_start"]) < min(a["timed_end"], b["timed_end"])  # the barrier: they overlap
    assert r["warmup_steps"] == max(a["warmup_steps"], b["warmup_steps"])
    assert r["warmup_settled"] == (a["warmup_settled"] and b["warmup_settled"])
    assert r["machine_state"]["threads"] == 2


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_worker_pins_itself_without_numactl_or_taskset():
    last = sorted(os.sched_getaffinity(0))[-1]
    r = run(RunConfig(threads=1, cores=((last,),), **QUICK), numactl=False, taskset=False)
    assert r["status"] == "ok", r["reason"]
    assert r["pinning"] == "sched_setaffinity" and r["argv"][0][0] != "numactl"
    assert r["instances"][0]["affinity"] == [last] and r["instances"][0]["pinned_by"] == "sched_setaffinity"


def test_user_workload_runs_without_changing_the_package():
    r = run(RunConfig(workload="tests.user_workloads:build", **QUICK))
    assert r["status"] == "ok", r["reason"]
    assert r["instances"][0]["batch_size"] == 8 and r["flops_per_step"] == 8 * 6 * (32 * 64 + 64)


def test_crashing_worker_becomes_a_failed_result():
    r = run(RunConfig(workload="tests.user_workloads:crash", **QUICK))
    assert r["status"] == "failed"
    assert "exited with code 1" in r["reason"] and "deliberate crash in a user workload" in r["reason"]
    assert r["samples_per_s"] is None


def test_hanging_worker_times_out_and_leaves_no_process(tmp_path):
    pidfile = tmp_path / "pids"
    config = RunConfig(workload="tests.user_workloads:hang", timeout_s=6, env=(("CPUOPT_TEST_PIDFILE", str(pidfile)),),
                       **QUICK)
    start = time.monotonic()
    r = run(config)
    assert r["status"] == "timeout" and "6 s timeout" in r["reason"]
    assert time.monotonic() - start < 20
    pid = int(pidfile.read_text().split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_one_failing_instance_stops_the_others_at_once():
    start = time.monotonic()
    r = run(RunConfig(workload="tests.user_workloads:crash_second", instances=2, threads=1, timeout_s=120,
                      steps=2000, warmup=1))
    assert r["status"] == "failed" and "instance 1 exited with code 1" in r["reason"]
    assert "instance 1 fails on purpose" in r["reason"]
    assert time.monotonic() - start < 60  # not the 120 s timeout: instance 0 was stopped


def test_dataloader_workers_feed_the_steps():
    r = run(RunConfig(loader_workers=2, **QUICK))
    assert r["status"] == "ok", r["reason"]
    assert r["loss_first"] != r["loss_last"]


def test_affinity_none_leaves_pinning_to_the_os():
    r = run(RunConfig(affinity="none", **QUICK))
    assert r["status"] == "ok" and r["pinning"] == "none"
    assert r["instances"][0]["pinned_by"] == "none" and "numactl" not in r["argv"][0]
    assert r["instances"][0]["affinity"] == sorted(os.sched_getaffinity(0))


def test_run_cpu_launcher_with_its_defaults():
    r = run(RunConfig(launcher="run_cpu", **QUICK))
    assert r["status"] == "ok", r["reason"]
    assert r["argv"][0][1:3] == ["-m", "torch.backends.xeon.run_cpu"]
    assert "run_cpu" in r["launcher_log"]  # what run_cpu itself logged about its choices


def test_peak_rss_is_the_workers_own_not_its_parents():
    parent = bytearray(700 * 1024 * 1024)  # a large parent, as a notebook kernel can be
    parent[::4096] = b"\x01" * len(parent[::4096])
    r = run(RunConfig(**QUICK))
    assert r["status"] == "ok" and 20 < r["peak_rss_mb"] < 650
    del parent
