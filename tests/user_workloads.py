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


class Output:
    """What model libraries return: an object holding the tensors (here logits and an extra)."""

    def __init__(self, logits, hidden):
        self.logits, self.hidden = logits, hidden


class DictModel(nn.Module):
    """Takes keyword inputs (``model(**inputs)``) and returns an output object, not a tensor."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(32, 64)
        self.head = nn.Linear(64, 4)

    def forward(self, features, mask):
        hidden = torch.relu(self.embed(features * mask))
        return Output(self.head(hidden), hidden)


def dict_model(preset: str = "quick") -> Workload:
    """A classifier fed a dict of inputs, returning an output object: the loss reads ``.logits``."""
    torch.manual_seed(0)

    def make_batch(batch_size):
        g = torch.Generator().manual_seed(batch_size)
        features = torch.randn(batch_size, 32, generator=g)
        return {"features": features, "mask": torch.ones(batch_size, 32)}, (features[:, :4].argmax(dim=1))

    return Workload("dict-model", DictModel(), make_batch,
                    lambda out, y: nn.functional.cross_entropy(out.logits, y), 16)


class TupleModel(nn.Module):
    """Takes two positional inputs (``model(*inputs)``) and returns a (logits, aux) tuple."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, x, y):
        return self.a(x) + self.b(y), {"aux": self.b(y).mean()}


def tuple_model(preset: str = "quick") -> Workload:
    """Two positional inputs, a tuple (with a dict inside) out: the loss takes what it needs."""
    torch.manual_seed(0)

    def make_batch(batch_size):
        g = torch.Generator().manual_seed(batch_size)
        return (torch.randn(batch_size, 16, generator=g), torch.randn(batch_size, 16, generator=g)), \
            torch.randn(batch_size, 8, generator=g)

    return Workload("tuple-model", TupleModel(), make_batch,
                    lambda out, t: nn.functional.mse_loss(out[0], t) + 0.0 * out[1]["aux"], 16)


class Offset(nn.Module):
    """A regression whose outputs sit near 1000: bf16 (8 bits of mantissa, steps of 4-8 there)
    rounds away what the model learns, so its loss drifts far from fp32's."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 1)

    def forward(self, x):
        return self.linear(x) + 1000.0


def drift(preset: str = "quick") -> Workload:
    """A workload built to drift in bf16 (see Offset)."""
    torch.manual_seed(0)

    def make_batch(batch_size):
        g = torch.Generator().manual_seed(batch_size)
        x = torch.randn(batch_size, 8, generator=g)
        return x, 1000.0 + x[:, :1]

    return Workload("drift", Offset(), make_batch, nn.functional.mse_loss, 32)


class Tagger(nn.Module):
    """A small multi-label image tagger as a user might write one: conv + batch-norm blocks,
    keyword inputs (``model(**inputs)``), an output object out."""

    def __init__(self, tags: int = 12):
        super().__init__()
        blocks, cin = [], 3
        for cout in (16, 32, 32):
            blocks += [nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
            cin = cout
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, tags)

    def forward(self, pixels, brightness):
        x = self.features(pixels * brightness[:, None, None, None])
        return Output(self.head(x.mean((2, 3))), x)


def tagger(preset: str = "quick", frozen_bn: str = "none", focal: str = "reference") -> Workload:
    """Declares the case study's fixes as options (cpuopt_helpers.fixes): notebook 08 measures
    them on this model; the loss is the sigmoid focal loss over its 12 tags."""
    from cpuopt_helpers import fixes

    torch.manual_seed(0)

    def make_batch(batch_size):
        g = torch.Generator().manual_seed(batch_size)
        pixels = torch.randn(batch_size, 3, 32, 32, generator=g)
        tags = (pixels[:, :, :4, :4].reshape(batch_size, -1)[:, :12] > 0.5).float()
        return {"pixels": pixels, "brightness": torch.ones(batch_size)}, tags

    model = fixes.frozen_batch_norm(Tagger(), frozen_bn, make_batch(2)[0])
    focal_loss = fixes.focal_loss(focal)
    return Workload("tagger", model, make_batch,
                    lambda out, tags: focal_loss(out.logits, tags, reduction="mean"), 32, image_like=True)
