"""User workloads as a user would write them (package.module:function), for tests."""

import os
import time

import torch
from torch import nn

from cpuopt_helpers.workloads import Workload


def build(preset: str = "quick") -> Workload:
    """A tiny MLP regression: what a user's own model looks like to the workbook."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def make_batch(batch_size):
        g = torch.Generator().manual_seed(batch_size)
        x = torch.randn(batch_size, 32, generator=g)
        return x, x.sum(dim=1, keepdim=True)

    return Workload("mlp", model, make_batch, nn.functional.mse_loss, 8, flops_per_sample=6 * (32 * 64 + 64))


def build_uncounted(preset: str = "quick") -> Workload:
    """The same MLP without ``flops_per_sample``: the worker must count its FLOPs itself."""
    workload = build(preset)
    workload.flops_per_sample = None
    return workload


def crash(preset: str = "quick") -> Workload:
    """A workload whose construction fails, as a broken user model would."""
    raise RuntimeError("deliberate crash in a user workload")


def hang(preset: str = "quick") -> Workload:
    """A workload that never starts training (a stuck data source)."""
    with open(os.environ["CPUOPT_TEST_PIDFILE"], "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(3600)


def crash_second(preset: str = "quick") -> Workload:
    """Instance 1 fails while instance 0 trains normally: one rank of a job dying."""
    if os.environ.get("CPUOPT_INSTANCE") == "1":
        raise RuntimeError("instance 1 fails on purpose")
    return build(preset)


def crash_rank1_in_training(preset: str = "quick") -> Workload:
    """Rank 1 of a DDP job dies in its third step, while rank 0 waits in the gradient all-reduce."""
    workload = build(preset)
    calls = {"n": 0}
    loss_fn = workload.loss_fn

    def failing_loss(outputs, targets):
        calls["n"] += 1
        if os.environ.get("CPUOPT_INSTANCE") == "1" and calls["n"] == 3:
            raise RuntimeError("rank 1 fails on purpose in its third step")
        return loss_fn(outputs, targets)

    workload.loss_fn = failing_loss
    return workload
