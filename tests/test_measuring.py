"""Measuring core: steady-state warm-up, the multi-instance aggregate, machine state, code version."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cpuopt_helpers import launch, planning, provenance, worker
from cpuopt_helpers.config import RunConfig

# /proc/stat of a 2-CPU guest, read before and after a run: per CPU 1000 jiffies pass;
# cpu0 has 100 of them stolen, cpu1 10 (fields: user nice system idle iowait irq softirq steal guest guest_nice)
STAT_BEFORE = """\
cpu  20143 0 3386 20554 573 0 164 319 0 0
cpu0 5335 0 1157 15702 123 0 62 155 0 0
cpu1 14808 0 2229 4852 450 0 102 164 0 0
intr 1234567 0 0
ctxt 987654
"""
STAT_AFTER = """\
cpu  21783 0 3536 20654 573 0 164 429 0 0
cpu0 6135 0 1207 15752 123 0 62 255 0 0
cpu1 15648 0 2329 4902 450 0 102 174 0 0
intr 1234999 0 0
ctxt 999999
"""
OLD_KERNEL_STAT = "cpu  100 0 50 800 10 0 5\ncpu0 100 0 50 800 10 0 5\n"  # no steal column


# --- steady-state warm-up -------------------------------------------------------------

@pytest.mark.parametrize("times, settled", [
    ([], False),
    ([1.0, 1.0], False),  # two steps cannot show steady state
    ([5.0, 1.0, 1.02], True),  # the cold step sits in the window without deciding
    ([9.0, 1.0, 1.5], False),  # one fast step after slow ones is not steady
    ([1.0, 1.5, 1.0], False),  # a spike among the last two
    ([1.5, 1.0, 1.0], True),  # the spike has left the last two
    ([1.0, 1.09, 1.0], True),  # inside 10%
    ([1.0, 1.25, 1.0], False),
])
def test_settle_rule(times, settled):
    assert worker.warmup_settled(times) is settled


@pytest.mark.parametrize("warmup, steps, cap", [
    (0, 20, 0),  # warmup=0: no warm-up at all
    (1, 6, 7),  # standard: never more extra steps than the run times
    (3, 20, 13),  # quick: warmup + 10
    (5, 30, 15),  # full: 3 x warmup
    (1, 3, 4), (1, 1, 3),  # at least three steps, so steady state can be shown
])
def test_warmup_cap(warmup, steps, cap):
    assert worker.warmup_cap(warmup, steps) == cap


class ScriptedSteps:
    """A step whose durations follow a script, on a fake clock."""

    def __init__(self, durations):
        self.durations, self.now, self.calls = list(durations), 0.0, 0

    def clock(self):
        return self.now

    def step(self):
        self.now += self.durations[min(self.calls, len(self.durations) - 1)]
        self.calls += 1
        return float(self.calls), (0.0, 0.0, 0.0)


def warm(durations, warmup, steps, **kw):
    s = ScriptedSteps(durations)
    times, losses, settled = worker.run_warmup(s.step, warmup, steps, clock=s.clock, **kw)
    assert losses == [float(i + 1) for i in range(len(times))] and s.calls == len(times)
    return times, settled


def test_warmup_runs_until_steady():
    times, settled = warm([5, 1, 1.5, 1, 1, 1, 1], warmup=1, steps=20)
    assert times == [5, 1, 1.5, 1, 1] and settled


def test_warmup_runs_at_least_the_configured_steps():
    times, settled = warm([1.0], warmup=5, steps=20)
    assert len(times) == 5 and settled


def test_warmup_stops_at_the_cap_unsettled():
    times, settled = warm([1, 2] * 20, warmup=1, steps=6)
    assert len(times) == worker.warmup_cap(1, 6) == 7 and not settled


def test_warmup_zero_runs_nothing():
    assert warm([1.0], warmup=0, steps=20) == ([], False)


def test_warmup_follows_the_agreed_verdict():  # DDP: a rank keeps stepping until every rank settled
    asked = []
    times, settled = warm([1.0], warmup=1, steps=20, agree=lambda mine: asked.append(mine) or len(asked) >= 5)
    assert len(times) == 5 and settled and asked == [False, False, True, True, True]


def test_fresh_inductor_cache_for_compiled_runs_only(monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with worker.fresh_inductor_cache(False) as used:
        assert used is None and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    with worker.fresh_inductor_cache(True) as used:
        folder = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        assert used == "fresh" and os.path.isdir(folder) and not os.listdir(folder)
    assert not os.path.exists(folder) and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/mine")
    with worker.fresh_inductor_cache(True) as used:
        assert used == "yours: /somewhere/mine" and os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/mine"


def test_a_users_inductor_cache_that_holds_a_compile_is_said_filled(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with worker.fresh_inductor_cache(True) as used:
        assert used == f"yours: {tmp_path}"  # empty: the first compile is cold
    (tmp_path / "fxgraph").mkdir()
    with worker.fresh_inductor_cache(True) as used:
        assert used == f"yours, filled: {tmp_path}" and (tmp_path / "fxgraph").is_dir()  # kept, never removed


@pytest.mark.slow
def test_a_run_whose_cache_holds_its_compile_takes_its_first_step_as_the_warm_compile(tmp_path):
    """Two real compiled runs sharing one Inductor cache, as the climb's do: the first compiles cold and
    then again warm; the second's first compile is warm already, and it compiles no third time."""
    config = RunConfig.for_preset("cnn", "quick", steps=2, warmup=1, compile="default",
                                  env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    cold, warm = (launch.run_plan(planning.build_plan(config, planning.Machine.this())) for _ in range(2))
    assert cold["status"] == warm["status"] == "ok", (cold["reason"], warm["reason"])
    assert cold["instances"][0]["inductor_cache"] == f"yours: {tmp_path / 'inductor'}"
    assert warm["instances"][0]["inductor_cache"] == f"yours, filled: {tmp_path / 'inductor'}"
    assert warm["compile_warm_s"] == warm["compile_s"] == warm["instances"][0]["warmup_s"][0]
    assert cold["compile_warm_s"] != cold["compile_s"]  # measured again after the timed steps
    assert cold["fallbacks"] == warm["fallbacks"] == []  # the compiled model ran compiled


def test_a_compiled_function_that_ran_eager_is_a_fallback_and_one_that_compiled_is_not():
    import torch
    import torch._dynamo

    def compiled_here(x):
        return (x.sin() + 1).sum()

    def never_called(x):
        return x.cos()

    def disabled(x):
        return x.tan()

    torch.compile(compiled_here)(torch.ones(3))
    torch.compile(never_called)
    with torch._dynamo.config.patch(disable=True):
        torch.compile(disabled)(torch.ones(3))
        said = worker.compile_fallbacks({"off": disabled.__code__})
    fell = worker.compile_fallbacks({"ran": compiled_here.__code__, "not run": never_called.__code__})
    assert [f["what"] for f in fell] == ["torch.compile (not run)"] and fell[0]["fell_back_to"] == "eager"
    assert "recompile limit" in fell[0]["reason"] and "TORCH_LOGS" in fell[0]["reason"]
    assert [f["what"] for f in said] == ["torch.compile (off)"] and "TORCH_COMPILE_DISABLE" in said[0]["reason"]
    assert worker.compile_fallbacks({}) == []


@pytest.mark.slow
def test_the_flop_count_leaves_a_compiled_steps_timed_steps_compiled(tmp_path, monkeypatch):
    """Counted before the timed steps (a fresh FLOP cache: every configuration's first run), the step under
    torch's FLOP counter left the compiled step running eagerly: its timed steps compiled the loss's own
    kernel and ran the forward's Python. Counted after them, Dynamo is asked for nothing while they run."""
    monkeypatch.setenv("CPUOPT_BUILD", str(tmp_path))  # no FLOP count left by an earlier run
    config = RunConfig.for_preset("retinanet", "quick", steps=2, warmup=1, compile="default", compile_scope="step",
                                  options={"loss": "fused"})
    r = launch.run_plan(planning.build_plan(config, planning.Machine.this()))
    assert r["status"] == "ok", r["reason"]
    assert r["flops_per_step"] and not [n for n in r["notes"] if "during the timed steps" in n], r["notes"]
    assert r["fallbacks"] == []


def test_a_compile_during_the_timed_steps_is_a_note():
    assert worker.recompiled(3, 3) == []
    note, = worker.recompiled(3, 5)
    assert "2 frames" in note and "timed steps" in note and "eager" in note


# --- the multi-instance aggregate -------------------------------------------------------

def instance(index, start, end, step_s, batch=8, **extra):
    return {"index": index, "pid": 100 + index, "cores": [index], "affinity": [index], "pinned_by": "taskset",
            "ld_preload": "", "omp_num_threads": "1", "torch_threads": 1, "batch_size": batch,
            "output_dtype": "float32", "step_s": step_s, "warmup_s": extra.pop("warmup_s", [0.5, 0.1, 0.1]),
            "warmup_steps": extra.pop("warmup_steps", 3), "warmup_settled": extra.pop("warmup_settled", True),
            "timed_start": start, "timed_end": end, "compile_warm_s": extra.pop("compile_warm_s", None),
            "phase_s": {"forward": step_s, "backward": step_s, "optimizer": step_s}, "peak_rss_mb": 100.0,
            "loss_first": 2.0, "loss_last": 1.0, "flops_per_step": 1e9, "first_step_wall": (start or 100.0) - 1,
            "launch_wall": (start or 100.0) - 2, "versions": {"torch": "x"}, **extra}


def test_aggregate_is_total_samples_over_the_union_window():
    a = instance(0, 100.0, 101.0, [0.25] * 4)  # 32 samples in 1 s
    b = instance(1, 100.2, 101.5, [0.3] * 4)  # 32 samples in 1.3 s, started and ended later
    rate, window = launch.aggregate_samples_per_s([a, b])
    assert window == pytest.approx(1.5) and rate == pytest.approx(64 / 1.5)
    assert rate < 32 / 1.0 + 32 / 1.2  # less than the sum of the per-instance rates


def test_aggregate_without_timestamps_falls_back_to_the_longest_instance():
    a, b = instance(0, None, None, [0.25] * 4), instance(1, None, None, [0.5] * 4)
    assert launch.aggregate_samples_per_s([a, b]) == (pytest.approx(64 / 2.0), pytest.approx(2.0))


def test_slow_step_summary():
    s = launch.slow_step_summary([10.0] * 5 + [30.0])
    assert s["slow_steps"] == 1 and s["mean_over_median"] == pytest.approx(40 / 3 / 10)
    assert launch.slow_step_summary([]) == {"slow_steps": None, "mean_over_median": None}


def fake_plan(config):
    from cpuopt_helpers import system

    topo = system.Topology(tuple(system.Cpu(cpu=i, core=i, socket=0, node=0) for i in range(4)))
    return planning.build_plan(config, planning.Machine(topo, {}, False, True), base_env={}, python="/py")


def test_make_result_carries_the_new_fields():
    plan = fake_plan(RunConfig(instances=2, threads=1, compile="default", steps=4))
    state = provenance.machine_state(0.5, 4, 2, 0.1)
    a = instance(0, 100.0, 101.0, [0.25] * 4, warmup_steps=4, warmup_s=[9.0, 0.3, 0.25, 0.25], compile_warm_s=1.5)
    b = instance(1, 100.2, 101.5, [0.3] * 4, warmup_steps=6, warmup_settled=False,
                 warmup_s=[8.0, 0.4, 0.2, 0.3, 0.25, 0.3], compile_warm_s=2.0)
    r = launch.make_result(plan, "ok", "", [b, a], None, state)
    assert r["samples_per_s"] == pytest.approx(64 / 1.5) and r["timed_window_s"] == pytest.approx(1.5)
    assert r["system_share"] is None and r["page_faults_per_step"] is None  # workers that did not say
    a["cpu_s"] = {"user": 3.0, "system": 1.0, "page_faults": 400}  # 4 steps
    b["cpu_s"] = {"user": 1.0, "system": 0.0, "page_faults": 0}
    both = launch.make_result(plan, "ok", "", [b, a], None, state)
    assert both["system_share"] == pytest.approx(0.2) and both["page_faults_per_step"] == pytest.approx(100)
    assert r["achieved_gflops"] == pytest.approx(8 * 1e9 / 1.5 / 1e9)
    assert r["warmup_steps"] == 6 and r["warmup_settled"] is False
    assert r["compile_s"] == 9.0 and r["compile_warm_s"] == 2.0
    assert r["machine_state"] == state and r["code_version"] == provenance.code_version()
    assert [i["samples_per_s"] for i in r["instances"]] == [pytest.approx(32 / 1.0), pytest.approx(32 / 1.2)]
    assert [i["timed_start"] for i in r["instances"]] == [100.0, 100.2]
    failed = launch.make_result(plan, "failed", "boom", [], None, state)
    assert failed["machine_state"] == state and failed["code_version"]["measuring_hash"]
    assert failed["warmup_steps"] is None and failed["compile_warm_s"] is None


# --- machine state --------------------------------------------------------------------

def test_proc_stat_parser():
    rows = provenance.parse_proc_stat(STAT_BEFORE)
    assert set(rows) == {"cpu", "cpu0", "cpu1"} and rows["cpu0"][7] == 155 and len(rows["cpu"]) == 10


def test_steal_share_over_the_runs_cores():
    assert provenance.steal_pct(STAT_BEFORE, STAT_AFTER, [0]) == pytest.approx(10.0)
    assert provenance.steal_pct(STAT_BEFORE, STAT_AFTER, [1]) == pytest.approx(1.0)
    assert provenance.steal_pct(STAT_BEFORE, STAT_AFTER, [0, 1]) == pytest.approx(5.5)
    assert provenance.steal_pct(STAT_BEFORE, STAT_AFTER) == pytest.approx(5.5)  # the "cpu" line
    assert provenance.steal_pct(STAT_BEFORE, STAT_AFTER, [7]) == pytest.approx(5.5)  # not listed: all
    assert provenance.steal_pct(STAT_BEFORE, STAT_BEFORE, [0]) is None  # no time passed
    assert provenance.steal_pct(OLD_KERNEL_STAT, OLD_KERNEL_STAT) is None  # no steal column


def test_usable_cpus_reads_a_cgroup_quota():
    assert provenance.usable_cpus(8) == 8 and provenance.usable_cpus(8, "max 100000\n") == 8
    assert provenance.usable_cpus(8, "150000 100000\n") == 2 and provenance.usable_cpus(2, "800000 100000") == 2
    assert provenance.usable_cpus(4, "50000 100000") == 1


@pytest.mark.parametrize("load1, usable, steal, previous, loaded", [
    (0.3, 2, 0.5, 0, False),
    (2.9, 2, 0.5, 0, False),  # our own previous run (2 threads) plus the margin of 1
    (3.1, 2, 0.5, 0, True),
    (3.1, 2, 5.5, 0, True),  # stolen time alone
    (0.1, 2, 5.1, 0, True),
    (4.5, 2, 0.0, 4, False),  # the previous run oversubscribed with 4 threads
    (5.1, 2, 0.0, 4, True),
    (60.0, 56, None, 0, False), (62.0, 56, None, 0, True),  # margin 10% of the CPUs on a big machine
    (None, 2, None, 0, False),  # nothing known
])
def test_loaded_rule(load1, usable, steal, previous, loaded):
    assert provenance.is_loaded(load1, usable, steal, previous) is loaded


def test_machine_state_from_proc_stat_fixtures():
    state = provenance.machine_state(1.2, 2, 2, provenance.steal_pct(STAT_BEFORE, STAT_AFTER, [0]))
    assert state == {"load1": 1.2, "usable_cpus": 2, "threads": 2, "previous_threads": 0, "steal_pct": 10.0,
                     "others_pct": None, "round_trip_ns": None, "round_trip_cpus": None, "loaded": True}


def test_a_runs_round_trip_is_its_farthest_instances_before_and_after():
    two = [{"round_trip_ns": [250.0, 480.0], "round_trip_cpus": [2, 3]},
           {"round_trip_ns": [300.0, 260.0], "round_trip_cpus": [0, 1]}]
    assert launch.round_trips(two) == ([300.0, 480.0], [[0, 1], [2, 3]])
    assert launch.round_trips([two[0], {"round_trip_ns": None}]) == (None, None)  # an instance of one CPU
    assert launch.round_trips([None, {}]) == (None, None) and launch.round_trips([]) == (None, None)  # failed; older


def test_other_work_is_the_machines_busy_time_less_the_runs_own():
    # 2 CPUs, 10 s at 100 ticks a second: 2000 ticks; busy: user 1500 + nice 100 + system 200 + irq/softirq 20
    before = [0] * 10
    after = [1500, 100, 200, 170, 0, 10, 10, 10, 0, 0]
    assert sum(after[:8]) == 2000
    assert provenance.others_pct(before, after, own_s=16.0, hz=100) == pytest.approx(11.0)  # (1820 - 1600) / 2000
    assert provenance.others_pct(before, after, own_s=17.2, hz=100) == pytest.approx(5.0)  # (1820 - 1720) / 2000
    assert provenance.others_pct(before, after, own_s=19.0, hz=100) == 0.0  # accounting noise: never below zero
    assert provenance.others_pct(before, before, 1.0, 100) is None and provenance.others_pct([1, 2], [3, 4], 1, 100) \
        is None


@pytest.mark.skipif(not os.path.exists("/proc/stat") or len(os.sched_getaffinity(0)) < 2, reason="Linux, 2 CPUs")
def test_the_worker_counts_the_cpus_it_may_run_on_only(monkeypatch):
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid: {0})  # pinned to CPU 0
    one = worker.machine_jiffies()
    every = provenance.parse_proc_stat(open("/proc/stat").read())["cpu"]  # read after: all CPUs, later
    assert len(one) == len(every) and sum(one[:8]) < sum(every[:8])
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid: {4096})  # a CPU /proc/stat does not list
    assert sum(worker.machine_jiffies()[:8]) >= sum(every[:8])  # the whole machine's line


@pytest.mark.parametrize("others, loaded", [(None, False), (0.0, False), (4.9, False), (5.1, True)])
def test_other_work_during_the_timed_steps_loads_the_machine_whatever_the_load_average(others, loaded):
    assert provenance.is_loaded(0.3, 2, 0.0, 0, others) is loaded  # a quiet load average: the burst came after it
    assert provenance.machine_state(0.3, 2, 2, 0.0, 0, others)["loaded"] is loaded


def test_other_work_is_read_where_one_process_is_the_runs_work_only(monkeypatch):
    monkeypatch.setattr(launch.os, "sysconf", lambda name: 100)
    worker_said = {"machine_jiffies": {"before": [0] * 8, "after": [1500, 100, 200, 170, 0, 10, 10, 10]},
                   "cpu_s": {"user": 15.0, "system": 2.2, "page_faults": 0}}
    one = RunConfig(threads=2)
    assert launch.other_work(one, [worker_said]) == pytest.approx(5.0)
    assert launch.other_work(RunConfig(instances=2, threads=1), [worker_said, worker_said]) is None  # two windows
    assert launch.other_work(one.replace(loader_workers=1), [worker_said]) is None  # its loaders are processes too
    assert launch.other_work(one, [None]) is None and launch.other_work(one, [{"cpu_s": {}}]) is None


def test_run_threads_counts_dataloader_workers():
    assert provenance.run_threads(RunConfig(instances=2, threads=3, loader_workers=1)) == 8


# --- code version ---------------------------------------------------------------------

def make_tree(root, extra=()):
    for name in ("worker.py", "launch.py", "config.py", "plots.py", "workloads/cnn.py", "kernels/lamb.py", *extra):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")


def test_code_version_changes_with_the_measuring_code_only(tmp_path):
    make_tree(tmp_path)
    first = provenance.code_version(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{12}", first["measuring_hash"]) and first["package"] == provenance.package_version()
    (tmp_path / "plots.py").write_text("# drawing changed\n")
    assert provenance.code_version(tmp_path) == first  # not measuring code
    (tmp_path / "workloads" / "cnn.py").write_text("# the model changed\n")
    changed = provenance.code_version(tmp_path)
    assert changed["measuring_hash"] != first["measuring_hash"]
    (tmp_path / "flops.py").write_text("# FLOP formulas\n")
    assert provenance.code_version(tmp_path)["measuring_hash"] != changed["measuring_hash"]


def test_measuring_hash_is_over_names_and_texts():
    base = provenance.measuring_hash({"worker.py": "a", "launch.py": "b"})
    assert base == provenance.measuring_hash({"launch.py": "b", "worker.py": "a"})  # order does not matter
    assert base != provenance.measuring_hash({"worker.py": "a", "launch.py": "b "})
    assert base != provenance.measuring_hash({"worker.py": "b", "launch.py": "a"})


def test_code_version_of_this_package(monkeypatch):
    names = [f.relative_to(provenance.PACKAGE_DIR).as_posix() for f in provenance.measuring_files()]
    assert {"worker.py", "launch.py", "config.py", "workloads/cnn.py", "kernels/lamb.py", "fixes.py"} <= set(names)
    named = [p for p in provenance.MEASURING_SOURCES if "*" not in p]
    assert set(named) <= set(names), "a measuring source named that does not exist (renamed?)"
    assert "plots.py" not in names and "results.py" not in names
    version = provenance.code_version()
    assert version["package"] == provenance.package_version() and re.fullmatch(r"[0-9a-f]{12}", version["measuring_hash"])
    texts = {n: (provenance.PACKAGE_DIR / n).read_text() for n in names}
    assert version["measuring_hash"] == provenance.measuring_hash(texts)


# --- real workers ---------------------------------------------------------------------

@pytest.mark.slow
def test_quick_worker_reports_steady_state_window_machine_and_code():
    before = time.time()
    config = RunConfig.for_preset("cnn", "quick", steps=3)
    r = launch.run_plan(planning.build_plan(config, planning.Machine.this()))
    after = time.time()
    assert r["status"] == "ok", r["reason"]
    (inst,) = r["instances"]
    assert config.warmup <= r["warmup_steps"] == inst["warmup_steps"] <= worker.warmup_cap(config.warmup, 3)
    assert len(inst["warmup_s"]) == r["warmup_steps"] and isinstance(r["warmup_settled"], bool)
    # settled, by its definition worked out here: the last two warm-up steps within the tolerance of the last three's median
    last = sorted(inst["warmup_s"][-3:])[1] if len(inst["warmup_s"]) >= 3 else None
    steady = last is not None and all(abs(t - last) <= worker.SETTLE_TOLERANCE * last for t in inst["warmup_s"][-2:])
    assert r["warmup_settled"] == steady
    assert steady or r["warmup_steps"] == worker.warmup_cap(config.warmup, 3)  # unsettled: it warmed up to the cap
    assert before < inst["timed_start"] < inst["timed_end"] < after
    window = inst["timed_end"] - inst["timed_start"]
    assert r["timed_window_s"] == pytest.approx(window)
    assert r["samples_per_s"] == pytest.approx(inst["batch_size"] * 3 / window)
    assert window >= 3 * r["step_ms"]["p10"] / 1e3  # the window holds the three timed steps
    assert r["compile_s"] is None and r["compile_warm_s"] is None and inst["inductor_cache"] is None
    assert isinstance(r["slow_steps"], int) and r["mean_over_median"] >= 0.5
    state = r["machine_state"]
    assert set(state) == {"load1", "usable_cpus", "threads", "previous_threads", "steal_pct", "others_pct",
                          "round_trip_ns", "round_trip_cpus", "loaded"}
    if len(os.sched_getaffinity(0)) > 1:  # the probe between its first two cores, before and after its timed steps
        assert len(state["round_trip_ns"]) == 2 and all(10 < t < 1e6 for t in state["round_trip_ns"])
        assert state["round_trip_cpus"] == [inst["cores"][:2]]
    assert 0 <= state["others_pct"] <= 100  # one process, no DataLoader: the timed window's own reading
    assert state["load1"] >= 0 and state["usable_cpus"] == len(os.sched_getaffinity(0))
    assert state["threads"] == inst["torch_threads"] and isinstance(state["loaded"], bool)
    assert state["steal_pct"] is None or 0 <= state["steal_pct"] <= 100
    assert r["code_version"] == provenance.code_version()


def test_the_round_trip_probe_times_two_cores_and_gives_up_without_a_far_end(monkeypatch):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        trip = worker.round_trip_ns(cpus[:2], trips=200)
        assert 10 < trip < 1e6  # ns: a Python ping-pong through one shared page
    assert os.sched_getaffinity(0) == set(cpus)  # pinned for the probe only
    assert worker.round_trip_ns(cpus[:1]) is None  # one CPU: nothing to time
    assert worker.round_trip_ns([cpus[0], 100000]) is None  # the far end cannot run there: it exits, no answer
    fds = len(os.listdir("/proc/self/fd"))

    def refused(*_):
        raise OSError(1, "Operation not permitted")  # a seccomp profile without memfd_create

    monkeypatch.setattr(os, "memfd_create", refused)
    assert worker.round_trip_ns([0, 1]) is None and len(os.listdir("/proc/self/fd")) == fds  # no run fails for it


def test_the_probe_waits_out_openmps_spinning_threads():
    assert worker.openmp_idle_s({"KMP_BLOCKTIME": "1"}) == pytest.approx(0.011)  # what the plan sets for Intel's
    assert worker.openmp_idle_s({"KMP_BLOCKTIME": "200"}) == pytest.approx(0.21)
    assert worker.openmp_idle_s({"KMP_BLOCKTIME": "infinite"}) == pytest.approx(1.01)  # capped at a second
    assert worker.openmp_idle_s({"LD_PRELOAD": "/x/libiomp5.so"}) == pytest.approx(0.21)  # Intel's default
    assert worker.openmp_idle_s({}) == pytest.approx(0.01)  # GNU OpenMP


@pytest.mark.slow
def test_the_probe_and_the_logs_cores_are_the_instances_where_intel_openmp_pinned_the_main_thread(tmp_path):
    machine = planning.Machine.this()
    if len(os.sched_getaffinity(0)) < 2 or not machine.libraries.get("iomp"):
        pytest.skip("needs two CPUs and Intel OpenMP (make setup installs it)")
    log = tmp_path / "cnn.log"
    config = RunConfig.for_preset("cnn", "quick", steps=2, omp_runtime="intel", onednn_verbose=str(log))
    r = launch.run_plan(planning.build_plan(config, machine))
    assert r["status"] == "ok", r["reason"]
    assert len(r["machine_state"]["round_trip_ns"]) == 2  # None where it probed the main thread's one CPU
    cores = r["instances"][0]["cores"]
    assert len(cores) > 1 and json.loads(Path(f"{log}.meta.json").read_text())["cores"] == cores  # what --project
    # replays on: the main thread's one CPU would run the log's threads on one core


@pytest.mark.slow
def test_busy_processes_beside_a_run_load_it_though_the_load_average_lags():
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:  # one busy process a CPU, started together with the run: the 1-minute load average has not seen them yet
        deadline = time.monotonic() + 60  # but running before the run is (a loaded machine, make test's, starts
        while time.monotonic() < deadline and min(map(_cpu_s, hogs)) < 0.2:  # them slowly)
            time.sleep(0.05)
        config = RunConfig.for_preset("cnn", "quick", steps=10)
        r = launch.run_plan(planning.build_plan(config, planning.Machine.this()))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert r["status"] == "ok", r["reason"]
    assert r["machine_state"]["others_pct"] > provenance.OTHERS_LOADED_PCT and r["machine_state"]["loaded"]


def test_a_failing_worker_leaves_the_moment_it_failed_for_the_launcher(monkeypatch, tmp_path):
    monkeypatch.setenv("CPUOPT_BARRIER", str(tmp_path))
    monkeypatch.setenv("CPUOPT_INSTANCE", "1")
    before = time.time()
    worker.note_failure()
    assert before <= float((tmp_path / "1.failed").read_text()) <= time.time()


def _cpu_s(proc: subprocess.Popen) -> float:
    """A child's CPU seconds so far (user and system, from /proc)."""
    try:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
