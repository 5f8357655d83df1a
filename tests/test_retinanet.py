"""The RetinaNet workload: structure, variants and targets (notebook 08 trains it for real)."""

import pytest
import torch

from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.workloads import build_workload, retinanet


def build(monkeypatch, spec=""):
    options = dict(item.split("=") for item in spec.split(",") if item)
    return build_workload("retinanet", "quick", options)


def test_heads_cover_every_anchor_of_p3_to_p7(monkeypatch):
    w = build(monkeypatch)
    images, targets = w.make_batch(2)
    out = w.model(images)
    assert out.shape == (2, len(retinanet.anchors(64)), 80 + 4) == (2, targets.shape[1], 84)
    assert len(retinanet.anchors(256)) == 9 * (32 * 32 + 16 * 16 + 8 * 8 + 4 * 4 + 2 * 2)
    from cpuopt_helpers.kernels import benchmark

    for size in (64, 256, 800):  # the kernel benchmark times the workload's own logit shapes
        assert benchmark.anchors(size) == len(retinanet.anchors(size))


def test_every_box_gets_a_positive_anchor(monkeypatch):
    w = build(monkeypatch)
    _, targets = w.make_batch(3)
    labels = targets[..., 0]
    assert ((labels >= 0).sum(1) >= 1).all() and (labels == -1).any()
    assert torch.isfinite(targets[..., 1:][labels >= 0]).all()


@pytest.mark.parametrize("layers, trained", [(0, set()), (3, {"layer2", "layer3", "layer4"}),
                                             (5, {"conv1", "layer1", "layer2", "layer3", "layer4"})])
def test_trainable_layers_freeze_the_rest_of_the_backbone(monkeypatch, layers, trained):
    w = build(monkeypatch, f"trainable_layers={layers}")
    found = {n.split(".")[0] for n, p in w.model.backbone.named_parameters() if p.requires_grad}
    assert found == trained
    assert all(p.requires_grad for p in w.model.fpn.parameters())


@pytest.mark.parametrize("kernel", ["eager", pytest.param("auto", marks=pytest.mark.slow)])
def test_fast_focal_loss_gives_the_same_detection_loss(monkeypatch, kernel):
    """The fast kernel as the workload calls it (impl auto): forced to eager (fast), and as auto
    picks it on this machine (slow: where torch.compile works, Inductor compiles it first)."""
    from cpuopt_helpers.kernels import focal_loss

    if kernel == "eager":
        monkeypatch.setitem(focal_loss.STATUS, "compiled", False)  # auto's verdict: eager kernels
    ref = build(monkeypatch)
    images, targets = ref.make_batch(2)
    out = ref.model(images).float()
    fast = build(monkeypatch, "focal=fast")
    torch.testing.assert_close(fast.loss_fn(out, targets), ref.loss_fn(out, targets), rtol=1e-5, atol=1e-6)


def test_601_classes_widen_the_classification_head(monkeypatch):
    w = build(monkeypatch, "classes=601")
    assert w.model(w.make_batch(1)[0]).shape[-1] == 605


@pytest.mark.parametrize("options, message", [
    ({"classes": "0"}, "positive integer"), ({"classes": "x"}, "classes='x' is not an integer"),
    ({"trainable_layers": "6"}, "0-5"), ({"frozen_bn": "merged"}, "separate or fused or folded"),
    ({"frozen_backward": "always"}, "frozen_backward must be skip or compute"),
    ({"speed": "11"}, "has no option 'speed'; its options .*classes=80, trainable_layers=3")])
def test_bad_options_are_refused_before_anything_is_built(options, message):
    from cpuopt_helpers.workloads import check_options

    with pytest.raises(CpuoptError, match=message):
        check_options("retinanet", options)


def test_options_are_typed_from_the_build_signature():
    from cpuopt_helpers.workloads import check_options, declared_options

    assert declared_options("retinanet") == {"classes": 80, "trainable_layers": 3, "frozen_bn": "separate",
                                             "focal": "reference", "frozen_backward": "skip",
                                             "loss": "composite"}
    assert check_options("retinanet", {"classes": "601", "focal": "fast"}) == {"classes": 601, "focal": "fast"}
    with pytest.raises(CpuoptError, match="workload 'cnn' has no option 'classes'; its options .*: none"):
        check_options("cnn", {"classes": "601"})


def test_cli_bad_option_is_exit_2_and_an_option_changes_the_hash(capsys, monkeypatch):
    from cpuopt_helpers import cli
    from cpuopt_helpers.config import RunConfig

    assert cli.main(["bench", "--workload", "retinanet", "--option", "classes=x", "--dry-run"]) == 2
    assert "option classes='x' is not an integer" in capsys.readouterr().err
    assert cli.main(["bench", "--workload", "retinanet", "--option", "classes", "--dry-run"]) == 2
    assert "--option 'classes' is not KEY=VALUE" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["bench", "--workload", "retinanet", "--option", "frozen_bn=fused"])
    config = cli.bench_config(args)
    assert config.options == (("frozen_bn", "fused"),) and "frozen_bn=fused" in config.label()
    plain = RunConfig(workload="retinanet")
    assert config.replace(options={}).config_hash() == plain.config_hash() != config.config_hash()
    # the old environment variable no longer picks a variant behind the config's back: refused
    monkeypatch.setenv("CPUOPT_RETINANET", "frozen_bn=fused")
    assert cli.main(["bench", "--workload", "retinanet", "--dry-run"]) == 2
    assert "CPUOPT_RETINANET (in your environment) is not read any more" in capsys.readouterr().err


def test_frozen_backward_compute_runs_the_frozen_stages_backward_and_drops_it(monkeypatch):
    """The paper's unfixed build, emulated: the same loss and trained gradients, the frozen
    weights' gradients computed (their hooks fire) but never kept, so no optimizer moves them."""
    skip, compute = build(monkeypatch), build(monkeypatch, "frozen_backward=compute")
    fired = []
    for name, p in compute.model.backbone.named_parameters():
        if name.startswith(("conv1", "layer1")):
            p.register_post_accumulate_grad_hook(lambda p, name=name: fired.append(name))
    images, targets = skip.make_batch(2)
    losses = [w.loss_fn(w.model(images), targets) for w in (skip, compute)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[0], losses[1])
    assert "conv1.weight" in fired and any(n.startswith("layer1") for n in fired)
    for (name, a), b in zip(skip.model.named_parameters(), compute.model.parameters()):
        if name.startswith(("backbone.conv1", "backbone.layer1")):
            assert a.grad is None and b.grad is None and b.requires_grad and not a.requires_grad
        elif a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad)
    from cpuopt_helpers.kernels.lamb import Lamb

    opt = Lamb(compute.model.parameters(), impl="fused")
    before = compute.model.backbone.conv1.weight.detach().clone()
    opt.step()
    assert torch.equal(compute.model.backbone.conv1.weight, before)  # dropped gradients: no update
