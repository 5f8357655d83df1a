"""cpuopt_helpers.fixes: each transform gives the outputs and gradients of the separate ops."""

import copy

import pytest
import torch
from torch import nn

from cpuopt_helpers import fixes
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.fixes import FoldedConv2d, FrozenBatchNorm2d


def randomise_stats(model):
    """Batch norms with statistics and affine parameters far from the identity."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, FrozenBatchNorm2d)):
                c = m.running_mean.numel()
                m.weight.copy_(0.5 + 1.5 * torch.rand(c, generator=g))
                m.bias.copy_(torch.randn(c, generator=g))
                m.running_mean.copy_(0.3 * torch.randn(c, generator=g))
                m.running_var.copy_(0.5 + 2 * torch.rand(c, generator=g))
    return model


class Block(nn.Module):
    """conv -> bn -> relu, a residual whose conv output is also used elsewhere (not foldable),
    a conv with bias, a grouped conv, a conv called twice (each call into its own bn: not
    foldable), and a batch norm after a ReLU (not after a conv)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, groups=4, bias=True), nn.BatchNorm2d(8)
        self.conv3, self.bn3 = nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8)
        self.shared, self.bn4, self.bn5 = nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.BatchNorm2d(8)
        self.bn6 = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 3)

    def forward(self, images, scale):
        x = torch.relu(self.bn1(self.conv1(images)))
        x = torch.relu(self.bn2(self.conv2(x)))
        y = self.conv3(x)
        x = self.bn3(y) + y  # conv3's output feeds bn3 and the add
        x = self.bn4(self.shared(x)) + self.bn5(self.shared(x))  # one conv, two batch norms
        x = self.bn6(torch.relu(x))
        return {"logits": self.head(x.mean((2, 3))) * scale}


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"images": torch.randn(2, 3, 8, 8, generator=g), "scale": torch.tensor(2.0)}


def outputs_and_grads(model, batch):
    model.zero_grad()
    out = model(**batch)["logits"]
    out.pow(2).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def frozen(mode):
    torch.manual_seed(0)
    model = randomise_stats(Block())
    fixes.freeze_batch_norm(model, mode)
    return model


def test_freeze_keeps_statistics_and_makes_them_buffers():
    torch.manual_seed(0)
    model = randomise_stats(Block())
    before = model.bn2.running_var.clone()
    assert fixes.freeze_batch_norm(model) == 6
    assert isinstance(model.bn2, FrozenBatchNorm2d) and torch.equal(model.bn2.running_var, before)
    assert not any("bn" in n for n, _ in model.named_parameters())  # never trained
    torch.manual_seed(0)
    reference = randomise_stats(Block()).eval()  # frozen batch norm computes as batch norm in eval mode
    torch.testing.assert_close(model(**inputs())["logits"], reference(**inputs())["logits"])


def test_fused_and_folded_give_the_outputs_and_gradients_of_the_separate_ops():
    separate = frozen("separate")
    fused = copy.deepcopy(separate)
    fixes.set_batch_norm_mode(fused, "fused")
    folded = copy.deepcopy(fused)
    pairs = fixes.fold_batch_norm(folded, inputs(1))
    assert pairs == [("conv1", "bn1"), ("conv2", "bn2")]  # not conv3 (used twice), nor the shared conv
    assert type(folded.conv1) is FoldedConv2d and folded.bn1.mode == "folded" and folded.bn3.mode == "fused"
    assert folded.state_dict().keys() == separate.state_dict().keys()  # nothing renamed or added
    out, grads = outputs_and_grads(separate, inputs())
    for other in (fused, folded):
        o, g = outputs_and_grads(other, inputs())
        torch.testing.assert_close(o, out, rtol=1e-5, atol=1e-5)
        assert g.keys() == grads.keys()
        for name in grads:
            torch.testing.assert_close(g[name], grads[name], rtol=1e-4, atol=1e-5)


def test_folding_applies_the_batch_norm_anew_at_every_step():
    """After an optimizer step the folded conv computes with the updated weight x scale: it
    trains exactly as the separate ops do."""
    separate = frozen("separate")
    folded = copy.deepcopy(separate)
    fixes.fold_batch_norm(folded, inputs())
    for model in (separate, folded):
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        for step in range(3):
            outputs_and_grads(model, inputs(step))
            opt.step()
    torch.testing.assert_close(folded.conv1.weight, separate.conv1.weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(folded(**inputs(7))["logits"], separate(**inputs(7))["logits"], rtol=1e-4, atol=1e-5)


def test_finding_the_pairs_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = randomise_stats(Block())  # trainable batch norm: a forward in train mode updates statistics
    fixes.freeze_batch_norm(model)
    model.bn6 = nn.BatchNorm2d(8)  # one left trainable
    before = {n: b.clone() for n, b in model.named_buffers()}
    fixes.conv_bn_pairs(model, inputs())
    assert all(torch.equal(b, before[n]) for n, b in model.named_buffers())
    assert not model.conv1._forward_hooks and not model.bn1._forward_pre_hooks


@pytest.mark.parametrize("mode", ["none", "separate", "fused", "folded"])
def test_the_frozen_bn_option_as_a_workload_applies_it(mode):
    torch.manual_seed(0)
    model = fixes.frozen_batch_norm(randomise_stats(Block()), mode, inputs())
    kinds = {type(m).__name__ for m in model.modules()}
    assert ("BatchNorm2d" in kinds) == (mode == "none")
    assert ("FoldedConv2d" in kinds) == (mode == "folded")
    assert {m.mode for m in model.modules() if isinstance(m, FrozenBatchNorm2d)} <= {mode, "fused", "folded"}


def test_bad_fix_values_are_refused():
    with pytest.raises(CpuoptError, match="frozen_bn must be one of none, separate, fused, folded"):
        fixes.frozen_batch_norm(Block(), "merged")
    with pytest.raises(CpuoptError, match="needs example inputs"):
        fixes.frozen_batch_norm(Block(), "folded")
    with pytest.raises(CpuoptError, match="focal must be one of reference, fast"):
        fixes.focal_loss("quick")


def test_the_fast_focal_loss_equals_the_reference_with_gradients(monkeypatch):
    from cpuopt_helpers.kernels import focal_loss

    monkeypatch.setitem(focal_loss.STATUS, "compiled", False)  # the eager kernels (auto compiles where it can)
    g = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(64, 10, generator=g)).requires_grad_()
    targets = (torch.rand(64, 10, generator=g) < 0.1).float()
    values = {}
    for kind in ("reference", "fast"):
        loss = fixes.focal_loss(kind)(logits, targets, reduction="sum")
        values[kind] = (loss.detach(), torch.autograd.grad(loss, logits)[0])
    torch.testing.assert_close(values["fast"][0], values["reference"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values["fast"][1], values["reference"][1], rtol=1e-4, atol=1e-6)


def test_declared_fixes_are_read_from_the_options():
    assert set(fixes.declared({"frozen_bn": "separate", "classes": 80})) == {"frozen_bn"}
    assert fixes.declared({"width": 3}) == {}


def test_retinanet_folded_trains_as_the_separate_ops():
    from cpuopt_helpers.fixes import FoldedConv2d
    from cpuopt_helpers.workloads import build_workload

    separate = build_workload("retinanet", "quick")
    folded = build_workload("retinanet", "quick", {"frozen_bn": "folded"})
    convs = [m for m in separate.model.backbone.modules() if isinstance(m, nn.Conv2d)]
    assert sum(isinstance(m, FoldedConv2d) for m in folded.model.modules()) == len(convs)  # every backbone conv
    images, targets = separate.make_batch(2)
    losses, grads = [], []
    for w in (separate, folded):
        loss = w.loss_fn(w.model(images), targets)
        losses.append(loss.detach())
        grads.append([p.grad for p in w.model.parameters() if p.requires_grad] if loss.backward() is None else None)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5)


@pytest.mark.slow  # compiles four blocks (about half a minute)
def test_retinanet_compiled_regions_train_as_the_separate_ops():
    from cpuopt_helpers.workloads import build_workload

    separate = build_workload("retinanet", "quick")
    compiled = build_workload("retinanet", "quick", {"frozen_bn": "compiled"})
    blocks = [m for m in compiled.model.modules() if getattr(m, "_compiled_call_impl", None) is not None]
    assert len(blocks) == 4  # one bottleneck a stage in the quick preset; the stem stays eager
    for block in blocks[:-1]:  # one region runs compiled, inside the whole model: a quarter of the cold compile
        block._compiled_call_impl = None
    images, targets = separate.make_batch(2)
    losses, grads = [], []
    for w in (separate, compiled):
        loss = w.loss_fn(w.model(images), targets)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad for p in w.model.parameters() if p.requires_grad])
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5)
