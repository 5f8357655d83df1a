"""`cpuopt tune`: the search logic with a deterministic runner (the real search: tests/test_readme.py)."""

import random
import subprocess
import sys
from pathlib import Path

import pytest

from cpuopt_helpers import planning, tune
from cpuopt_helpers.config import RunConfig, normalise
from cpuopt_helpers.errors import CpuoptError


def fake_runner(gains: dict, noise: float = 0.02, seed: int = 0):
    """samples/s = 100 x the product of the gains of the fields a config changes, +-noise."""
    rng = random.Random(seed)

    def run(config: RunConfig) -> dict:
        speed = 100.0
        for (field, value), gain in gains.items():
            if getattr(config, field) == value:
                speed *= gain
        if config.launcher == "run_cpu":
            speed *= 0.9
        return {"status": "ok", "samples_per_s": speed * (1 + rng.uniform(-noise, noise))}
    return run


def test_search_finds_and_combines_the_settings_that_pay(this_facts):
    gains = {("channels_last", True): 1.5, ("optimizer_impl", "foreach"): 1.2, ("allocator", "jemalloc"): 0.8}
    t = tune.tune("cnn", budget_min=60, facts=this_facts, runner=fake_runner(gains), progress=False)
    rec = t["recommended"]
    assert rec["channels_last"] is True and rec["optimizer_impl"] == "foreach" and rec["allocator"] != "jemalloc"
    assert t["speedup_vs_default"]["ci_low"] > 1.6 and t["speedup_vs_default"]["verdict"] == "faster"
    assert t["speedup_vs_run_cpu"]["ratio"] > t["speedup_vs_default"]["ratio"]  # run_cpu's defaults are 0.9x here
    assert t["speedup_vs_default"]["n"] >= 5 and {o.replace("R", "") for o in t["order"]} == {"AB", "BA"}
    assert len({o.index("R") for o in t["order"]}) > 1  # run_cpu's defaults (R) take a random place, recorded
    assert t["launch_command"].startswith("cpuopt launch --ncores-per-instance")
    assert "channels_last=True" in t["launch_command"] and "OMP_NUM_THREADS=" in t["shell_command"]


def test_nothing_that_pays_recommends_the_defaults(this_facts):
    t = tune.tune("cnn", budget_min=60, facts=this_facts, runner=fake_runner({}, noise=0.0), progress=False)
    assert t["changes"] == {} and t["speedup_vs_default"] is None and "defaults are recommended" in t["note"]
    # what is shown instead was measured: run_cpu's defaults against PyTorch's (0.9x in this fake machine)
    assert t["run_cpu_vs_default"]["ratio"] == pytest.approx(0.9) and t["run_cpu_vs_default"]["n"] >= 5
    assert "speedup over PyTorch's defaults: none: the defaults are recommended" in tune.format_tune(t)
    assert t["speedup_vs_run_cpu"]["ratio"] == pytest.approx(1 / 0.9)
    assert t["samples_per_s"]["recommended"] == t["samples_per_s"]["default"] == pytest.approx(100)
    assert t["recommended"] == normalise(RunConfig.for_preset("cnn", "quick"), this_facts.physical_cores
                                                     ).to_dict()


def test_a_search_winner_that_does_not_confirm_still_reports_run_cpu(this_facts):
    runner, runs = fake_runner({}, noise=0.01), {"lucky": 0}

    def lucky_in_the_search(config):  # channels_last measures 1.5x on its first three runs only
        r = runner(config)
        if config.channels_last and config.launcher != "run_cpu" and runs["lucky"] < 3:
            runs["lucky"] += 1
            r = dict(r, samples_per_s=r["samples_per_s"] * 1.5)
        return r
    t = tune.tune("cnn", budget_min=60, facts=this_facts, runner=lucky_in_the_search, progress=False)
    assert "channels_last=True" in t["search_winner"] and t["changes"] == {}
    assert t["speedup_vs_default"]["verdict"] != "faster" and "the defaults are recommended" in t["note"]
    # run_cpu's defaults ran in every final round (0.9x here): both comparisons with them are reported
    assert t["run_cpu_vs_default"]["ratio"] == pytest.approx(0.9, rel=0.03)
    assert t["speedup_vs_run_cpu"]["ratio"] == pytest.approx(1 / 0.9, rel=0.03)
    assert t["run_cpu_vs_default"]["n"] == t["speedup_vs_run_cpu"]["n"] == len(t["rounds"])
    assert t["samples_per_s"]["recommended"] == t["samples_per_s"]["default"]


def test_a_small_budget_still_ends_with_the_final_comparison(this_facts):
    calls = []
    runner = fake_runner({("channels_last", True): 1.5})

    def slow(config):
        import time

        calls.append(config)
        time.sleep(0.05)
        return runner(config)
    t = tune.tune("cnn", budget_min=0.002, facts=this_facts, runner=slow, progress=False)
    assert len(calls) == 1 + 2 * len(t["rounds"]) and len(t["rounds"]) >= 5  # the defaults, then final rounds only
    assert t["run_cpu_vs_default"]["n"] == len(t["rounds"])


def test_ddp_recommendation_launches_under_torchrun():
    config = RunConfig(threads=1, instances=2, mode="ddp", allocator="tcmalloc")
    line = planning.command_lines(config)["launch"]
    assert line.startswith("cpuopt launch --nproc-per-node 2 --ncores-per-instance 1 --allocator tcmalloc")


def test_bad_budget_is_a_clear_error(this_facts):
    with pytest.raises(CpuoptError, match="budget"):
        tune.tune("cnn", budget_min=0, facts=this_facts, runner=fake_runner({}), progress=False)


@pytest.mark.slow
def test_bad_workload_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "cpuopt_helpers.cli", "tune", "--workload", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown workload 'nope'" in proc.stderr


# The real budgeted search (a workload's tune on real workers) is tests/test_readme.py's: the tune
# line of docs/own-model.md, on the user model it shows.


def test_dry_run_plans_the_search_for_a_server():
    machine = planning.Machine.from_file(str(Path(__file__).parent / "fixtures" / "lscpu_p_xeon_2s_smt.txt"))
    facts = tune.machine_facts(machine)
    rows = tune.search_plan("cnn", "quick", facts, machine)
    ddp = {(r["config"]["threads"], r["config"]["instances"]) for r in rows if r["config"]["mode"] == "ddp"}
    assert ddp == {(7, 2), (7, 4), (7, 8), (14, 2), (14, 4), (28, 2)}  # Table 2's multi-rank layouts
    for r in rows:  # every rank of up to 28 threads on one socket of the fixture
        assert all(len({c // 28 for c in cores}) == 1 for cores in r["cores"] if len(cores) <= 28), r["label"]
    assert rows[0]["config"]["threads"] == 56 and not any(r["config"]["dtype"] == "bf16" for r in rows)
    text = tune.format_search_plan(rows, machine)
    assert text.splitlines()[0].startswith(f"# cpuopt tune would measure these {len(rows)} candidates")
    assert "threads=7 instances=8 mode=ddp: cores 0-6 | 7-13 | 14-20 | 21-27 | 28-34 | 35-41 | 42-48 | 49-55" in text


def test_the_search_includes_zentorch_on_an_amd_cpu_where_it_fits_this_torch(monkeypatch, this_facts):
    from cpuopt_helpers import runtimes

    default = normalise(RunConfig.for_preset("cnn", "quick"), 2)
    facts = this_facts.replace(physical_cores=2)
    monkeypatch.setattr(runtimes, "zentorch_status", lambda vendor: {"usable": True, "amd": vendor == "AuthenticAMD"})
    on_amd = tune.search_space(default, facts.replace(cpu_vendor="AuthenticAMD"), image_like=True)
    on_intel = tune.search_space(default, facts.replace(cpu_vendor="GenuineIntel"), image_like=True)
    assert [c.compile for c in on_amd if c.compile] == ["default", "zentorch"]
    assert [c.compile for c in on_intel if c.compile] == ["default"]
    monkeypatch.setattr(runtimes, "zentorch_status", lambda vendor: {"usable": False, "amd": True})
    assert "zentorch" not in [c.compile for c in tune.search_space(default, facts.replace(cpu_vendor="AuthenticAMD"),
                                                                   image_like=True)]


@pytest.mark.parametrize("confirming", [False, True])
def test_an_interrupted_search_says_its_ranking_so_far_and_its_confirmation_if_begun(this_facts, confirming, capsys):
    """Ctrl-C during the search: the ranking so far (no verdict); during the final rounds (where run_cpu's
    defaults run too): those rounds as well. `cpuopt tune` prints it before it stops."""
    from cpuopt_helpers import cli

    inner, calls = fake_runner({("channels_last", True): 1.5}), []

    def runner(config):
        calls.append(config)
        if (sum(c.launcher == "run_cpu" for c in calls) > 2) if confirming else len(calls) > 4:
            raise KeyboardInterrupt
        return inner(config)

    with pytest.raises(KeyboardInterrupt):
        cli.tuned(lambda: tune.tune("cnn", budget_min=60, facts=this_facts, runner=runner, progress=False), False)
    out = capsys.readouterr().out
    assert out.startswith("tune cnn interrupted: ") and "not a verdict" in out
    assert 1 <= out.count(" samples/s (median of ") <= 5
    assert ("its confirmation against PyTorch's defaults so far" in out) == confirming
