"""DDP ranks and torchrun launches: real processes on this machine's cores.

The DDP tests read one shared job (two ranks, started as a user would, through `cpuopt bench`);
bad launch input is checked in-process (fast) and once more through the command (slow).
"""

import json
import subprocess
import sys
import time

import pytest
import torch

from cpuopt_helpers import cli as cpuopt_cli
from cpuopt_helpers import launch, planning, rank_exec, system, worker
from cpuopt_helpers.config import RunConfig
from cpuopt_helpers.errors import CpuoptError

TWO_CORES = system.topology().logical_cores >= 2


def run(config):
    return launch.run_plan(planning.build_plan(config, planning.Machine.this()))


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "cpuopt_helpers.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_ranks_see_different_data_so_the_sync_check_means_something():
    x, y = torch.randn(8, 3, 4, 4), torch.randint(0, 10, (8,))
    x0, y0 = worker.rank_batch(x, y, 0)
    x1, y1 = worker.rank_batch(x, y, 1)
    assert torch.equal(x0, x) and torch.equal(y0, y)
    assert not torch.allclose(x1, x) and not torch.equal(y1, y) and int(y1.max()) <= int(y.max())


def test_param_checksum_sees_a_single_changed_weight():
    model = torch.nn.Linear(4, 3)
    before = worker.param_checksum(model)
    with torch.no_grad():
        model.weight[1, 2] += 1e-3
    assert worker.param_checksum(model) != before


def test_rank_exec_reads_its_core_group():
    assert rank_exec.rank_cores("0,1;2,3", 1) == [2, 3]
    with pytest.raises(SystemExit, match="no core group"):
        rank_exec.rank_cores("0;1", 2)


@pytest.fixture(scope="module")
def ddp_job():
    """One DDP job, two ranks of one thread, a global batch of 16, through `cpuopt bench --json`."""
    if not TWO_CORES:
        pytest.skip("needs two cores")
    proc = cli("bench", "--workload", "cnn", "--preset", "quick", "--instances", "2", "--threads", "1",
               "--mode", "ddp", "--batch-size", "16", "--batch-policy", "global", "--steps", "4", "--warmup", "1",
               "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_two_ddp_ranks_on_two_cores_end_in_sync(ddp_job):
    r = ddp_job
    assert r["status"] == "ok", r["reason"]
    assert r["params_in_sync"] is True and r["backend"] == "gloo"
    assert len(r["param_checksums"]) == 2 and r["param_checksums"][0] == r["param_checksums"][1]
    cores = [tuple(i["affinity"]) for i in r["instances"]]
    assert len(cores) == 2 and not set(cores[0]) & set(cores[1])
    assert all(i["torch_threads"] == 1 for i in r["instances"])


@pytest.mark.slow
def test_global_batch_is_split_between_ranks(ddp_job):
    r = ddp_job
    assert r["status"] == "ok", r["reason"]
    assert [i["batch_size"] for i in r["instances"]] == [8, 8] and r["global_batch"] == 16


def test_global_batch_must_split_evenly():
    with pytest.raises(CpuoptError, match="split evenly"):
        planning.build_plan(RunConfig(mode="ddp", instances=2, threads=1, batch_size=15, batch_policy="global"),
                          planning.Machine.this())


@pytest.mark.slow
@pytest.mark.skipif(not TWO_CORES, reason="needs two cores")
def test_a_crashing_rank_ends_the_job_and_leaves_no_process():
    start = time.monotonic()
    r = run(RunConfig(workload="tests.user_workloads:crash_rank1_in_training", mode="ddp", instances=2, threads=1,
                      seed=4242, steps=6, warmup=1, timeout_s=120))
    assert r["status"] == "failed" and "instance 1" in r["reason"] and "fails on purpose" in r["reason"]
    assert time.monotonic() - start < 60  # rank 0, blocked in the all-reduce, was stopped
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", '"seed": 4242'], capture_output=True, text=True).stdout.split()
    assert left == []


@pytest.mark.slow
def test_cli_bench_ddp_reports_two_ranks_in_sync(ddp_job):
    r = ddp_job
    assert r["status"] == "ok" and r["params_in_sync"] is True
    assert [i["cores"] for i in r["instances"]] == [[0], [1]]


@pytest.mark.slow
@pytest.mark.skipif(not TWO_CORES, reason="needs two cores")
def test_torchrun_launch_pins_each_rank(tmp_path):
    proc = cli("launch", "--nproc-per-node", "2", "--log-dir", str(tmp_path), "--",
               "python", "examples/ddp_train.py", "--epochs", "1")
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "instance_0.log").read_text()
    assert "params_in_sync=True" in log
    for rank, core in ((0, 0), (1, 1)):
        assert f"rank {rank}/2 local_rank {rank} cores [{core}] OMP_NUM_THREADS=1 torch_threads=1" in log


BAD_TORCHRUN_INPUT = [
    (["--nproc-per-node", "0", "--", "python", "examples/ddp_train.py"], "at least 1"),
    (["--nproc-per-node", "2", "--", "python", "-m", "train"], "training script"),
    (["--nproc-per-node", "2", "--", "python", "missing.py"], "no such script"),
    (["--nproc-per-node", "9999", "--", "python", "examples/ddp_train.py"], "instances"),
]


@pytest.mark.parametrize("args, message", BAD_TORCHRUN_INPUT)
def test_torchrun_launch_bad_input_is_one_line_and_exit_2(args, message, capsys):
    assert cpuopt_cli.main(["launch", *args]) == 2
    out, err = capsys.readouterr()
    assert message in err and len(err.strip().splitlines()) == 1 and out == ""


@pytest.mark.slow
def test_torchrun_launch_bad_input_from_the_command_line():
    for args, message in BAD_TORCHRUN_INPUT:
        proc = cli("launch", *args)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
            (args, proc.stderr)


def test_torchrun_plan_passes_multi_node_options():
    plan = planning.build_torchrun_plan(RunConfig(threads=1), planning.Machine.this(), ["python", "examples/ddp_train.py"],
                                      2, ["--nnodes=2", "--rdzv-endpoint=head:29400"])
    argv = plan.instances[0].argv
    assert argv[1:4] == ("-m", "torch.distributed.run", "--nproc-per-node=2")
    assert "--nnodes=2" in argv and "--rdzv-endpoint=head:29400" in argv
    assert argv[-3:] == ("-m", "cpuopt_helpers.rank_exec", "examples/ddp_train.py")  # `python` dropped
    assert plan.instances[0].env["CPUOPT_RANK_CORES"] == "0;1" and plan.instances[0].env["OMP_NUM_THREADS"] == "1"


@pytest.mark.slow
@pytest.mark.skipif(not TWO_CORES, reason="needs two cores")
def test_two_node_agents_on_localhost_end_in_sync_with_their_own_logs(tmp_path):
    """`cpuopt launch --nnodes 2` as two machines would run it: two torchrun node agents meeting at
    a c10d rendezvous on a loopback port, each node's rank on its own core (--cores)."""
    port = planning.free_port()
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "cpuopt_helpers.cli", "launch", "--nproc-per-node", "1", "--nnodes", "2",
         "--node-rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--rdzv-id", "cpuopt-test", "--cores", str(node), "--log-dir", str(tmp_path), "--",
         "python", "examples/ddp_train.py", "--epochs", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    try:
        outs = [p.communicate(timeout=300) for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    for p, (_, err) in zip(nodes, outs):
        assert p.returncode == 0, err
    logs = {node: (tmp_path / f"node{node}_instance_0.log").read_text() for node in (0, 1)}
    assert not (tmp_path / "instance_0.log").exists()  # the nodes' logs never share a name
    for node, log in logs.items():  # each node's one rank ran on the core it was given
        assert f"/2 local_rank 0 cores [{node}] OMP_NUM_THREADS=1 torch_threads=1" in log, log
    assert "params_in_sync=True" in logs[0] + logs[1]  # rank 0 (either node) gathered every rank's parameters
