"""RetinaNet with a ResNeXt backbone: the paper's case study, written here (no torchvision).

ResNeXt-50 32x4d with FrozenBatchNorm2d, an FPN (P3-P7), the classification and box
heads, 9 anchors per cell, IoU target assignment and the focal loss plus smooth-L1 box
loss, on deterministic synthetic images and boxes.

Variants (the fixes notebook 08 measures) are the workload's options, the keyword
parameters of ``build`` (``cpuopt bench --workload retinanet --option frozen_bn=fused``,
``RunConfig(options={"focal": "fast"})``):

- ``classes``: 80 (COCO-like, default) or 601 (OpenImages-like), or any count;
- ``trainable_layers``: 0-5 backbone stages trained, the rest frozen (torchvision's
  default 3: layer4, layer3, layer2);
- ``frozen_backward``: ``skip`` (stock PyTorch: no gradient is computed for the frozen
  stages' weights, nor for the data below the lowest trainable stage) or ``compute`` (the
  paper's unfixed IPEX build, emulated: the frozen weights take part in autograd, their
  gradients are computed and then dropped, so the optimizer never sees them);
- ``frozen_bn``: ``separate`` (torchvision's FrozenBatchNorm2d: a multiply and an add),
  ``fused`` (one batch-norm call with frozen statistics), ``folded`` (into the convolution
  before it, anew at every step) or ``compiled`` (folded, and each bottleneck block one
  ``torch.compile`` region: conv + frozen BN + ReLU fused by Inductor);
- ``focal``: ``reference`` (torchvision's composite formula) or ``fast`` (the closed-form
  kernel of ``cpuopt_helpers.kernels.focal_loss``).

The fixes are ``cpuopt_helpers.fixes``' transforms, which any model can take.

Target assignment runs once per batch when the batch is built (the synthetic batch is
fixed), not inside the timed step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from cpuopt_helpers import fixes
from cpuopt_helpers.errors import CpuoptError
from cpuopt_helpers.fixes import FrozenBatchNorm2d
from cpuopt_helpers.workloads import Workload, preset_value

# preset -> (stem width, groups, width per group, blocks per stage, FPN channels, head convs, image size, batch)
PRESETS = {
    "quick": (16, 4, 16, (1, 1, 1, 1), 64, 1, 64, 4),        # narrow and shallow, seconds a run
    "standard": (64, 32, 4, (3, 4, 6, 3), 256, 4, 256, 2),   # ResNeXt-50 32x4d at 256 px
    "full": (64, 32, 4, (3, 4, 6, 3), 256, 4, 800, 2),       # the paper's 800 px
}
ANCHORS_PER_CELL = 9
FROZEN_BACKWARD = ("skip", "compute")
BOXES_PER_IMAGE = 6


def validate_options(options: dict) -> None:
    """Refuse option values RetinaNet cannot build, before any process starts."""
    if options.get("classes", 80) < 1:
        raise CpuoptError(f"retinanet: classes must be a positive integer, got {options['classes']}")
    if not 0 <= options.get("trainable_layers", 3) <= 5:
        raise CpuoptError(f"retinanet: trainable_layers must be 0-5, got {options['trainable_layers']}")
    for key, allowed in (("frozen_bn", fixes.BN_MODES), ("focal", fixes.OPTIONS["focal"][0]),
                         ("frozen_backward", FROZEN_BACKWARD), ("loss", fixes.OPTIONS["loss"][0])):
        if options.get(key, allowed[0]) not in allowed:
            raise CpuoptError(f"retinanet: {key} must be {' or '.join(allowed)}, got {options[key]!r}")


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, groups: int, width_per_group: int, bn: str):
        super().__init__()
        width = int(planes * width_per_group / 64) * groups
        cout = planes * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), FrozenBatchNorm2d(width, bn)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = FrozenBatchNorm2d(width, bn)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), FrozenBatchNorm2d(cout, bn)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), FrozenBatchNorm2d(cout, bn))
                           if stride != 1 or cin != cout else None)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNeXt(nn.Module):
    """The backbone; returns C3, C4, C5 (strides 8, 16, 32)."""

    def __init__(self, width: int, groups: int, width_per_group: int, layers: tuple[int, ...], bn: str):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = FrozenBatchNorm2d(width, bn)
        cin, stages = width, []
        for i, n in enumerate(layers):
            planes = width * 2**i
            blocks = []
            for j in range(n):
                blocks.append(Bottleneck(cin, planes, 2 if j == 0 and i > 0 else 1, groups, width_per_group, bn))
                cin = planes * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.channels = [width * 2**i * Bottleneck.expansion for i in (1, 2, 3)]

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        c3 = self.layer2(self.layer1(x))
        c4 = self.layer3(c3)
        return c3, c4, self.layer4(c4)


def _drop_grad(p: torch.Tensor) -> None:
    p.grad = None


def freeze(backbone: ResNeXt, trainable_layers: int, frozen_backward: str = "skip") -> None:
    """torchvision's rule: the last `trainable_layers` of layer4, layer3, layer2, layer1, conv1 train.

    ``frozen_backward="compute"`` emulates a build that does not skip the frozen stages'
    backward: their weights keep requires_grad (so autograd computes their weight gradients
    and the data gradients down to the stem) and each gradient is dropped as it lands."""
    train = ["layer4", "layer3", "layer2", "layer1", "conv1"][:trainable_layers]
    for name, p in backbone.named_parameters():
        trained = any(name.startswith(t) for t in train)
        p.requires_grad_(trained or frozen_backward == "compute")
        if not trained and frozen_backward == "compute":
            p.register_post_accumulate_grad_hook(_drop_grad)


class FPN(nn.Module):
    """P3-P5 from C3-C5 (lateral 1x1 + top-down), P6 from P5 and P7 from P6 (stride-2 3x3)."""

    def __init__(self, in_channels: list[int], channels: int):
        super().__init__()
        self.lateral = nn.ModuleList(nn.Conv2d(c, channels, 1) for c in in_channels)
        self.output = nn.ModuleList(nn.Conv2d(channels, channels, 3, padding=1) for _ in in_channels)
        self.p6 = nn.Conv2d(channels, channels, 3, 2, 1)
        self.p7 = nn.Conv2d(channels, channels, 3, 2, 1)

    def forward(self, feats):
        laterals = [conv(f) for conv, f in zip(self.lateral, feats)]
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + F.interpolate(laterals[i], size=laterals[i - 1].shape[-2:],
                                                              mode="nearest")
        outs = [conv(x) for conv, x in zip(self.output, laterals)]
        p6 = self.p6(outs[-1])
        return outs + [p6, self.p7(F.relu(p6))]


class Head(nn.Module):
    """Shared across levels: `convs` 3x3 conv + ReLU, then a 3x3 conv to anchors x outputs."""

    def __init__(self, channels: int, convs: int, outputs: int, prior: float | None = None):
        super().__init__()
        self.tower = nn.Sequential(*[m for _ in range(convs) for m in (nn.Conv2d(channels, channels, 3, padding=1),
                                                                          nn.ReLU(inplace=True))])
        self.out = nn.Conv2d(channels, ANCHORS_PER_CELL * outputs, 3, padding=1)
        self.outputs = outputs
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, std=0.01)
                nn.init.zeros_(m.bias)
        if prior is not None:  # RetinaNet's prior: every anchor starts as background with p = prior
            nn.init.constant_(self.out.bias, -math.log((1 - prior) / prior))

    def forward(self, feats):
        outs = []
        for f in feats:
            y = self.out(self.tower(f))
            n, _, h, w = y.shape
            outs.append(y.view(n, ANCHORS_PER_CELL, self.outputs, h, w).permute(0, 3, 4, 1, 2)
                        .reshape(n, h * w * ANCHORS_PER_CELL, self.outputs))
        return torch.cat(outs, 1)


class RetinaNet(nn.Module):
    """Images -> one tensor [batch, anchors, classes + 4]: class logits, then box deltas."""

    def __init__(self, preset: str, classes: int, trainable_layers: int, bn: str, frozen_backward: str = "skip"):
        super().__init__()
        width, groups, wpg, layers, channels, convs, _, _ = preset_value(preset, PRESETS)
        self.backbone = ResNeXt(width, groups, wpg, layers, bn)
        freeze(self.backbone, trainable_layers, frozen_backward)
        self.fpn = FPN(self.backbone.channels, channels)
        self.classification = Head(channels, convs, classes, prior=0.01)
        self.regression = Head(channels, convs, 4)

    def forward(self, images):
        feats = self.fpn(self.backbone(images))
        return torch.cat([self.classification(feats), self.regression(feats)], dim=2)


def anchors(size: int) -> torch.Tensor:
    """[anchors, 4] boxes (x1, y1, x2, y2) for P3-P7, ordered (level, y, x, anchor) like the heads."""
    out = []
    for level in range(3, 8):
        stride, cells = 2**level, -(-size // 2**level)
        base = 32 * 2 ** (level - 3)
        shapes = torch.tensor([(base * s * math.sqrt(1 / r), base * s * math.sqrt(r))
                               for s in (1, 2 ** (1 / 3), 2 ** (2 / 3)) for r in (0.5, 1.0, 2.0)])  # (w, h)
        half = torch.cat([-shapes, shapes], 1) / 2  # [9, 4]
        ys, xs = torch.meshgrid(torch.arange(cells), torch.arange(cells), indexing="ij")
        centres = ((torch.stack([xs, ys, xs, ys], -1).reshape(-1, 1, 4) + 0.5) * stride).float()
        out.append((centres + half).reshape(-1, 4))
    return torch.cat(out)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    area = lambda x: (x[:, 2] - x[:, 0]).clamp(min=0) * (x[:, 3] - x[:, 1]).clamp(min=0)  # noqa: E731
    lt, rb = torch.max(a[:, None, :2], b[None, :, :2]), torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


def encode(gt: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """Box deltas (dx, dy, dw, dh) of gt against its anchor (weights 1, as torchvision's RetinaNet)."""
    aw, ah = anchor[:, 2] - anchor[:, 0], anchor[:, 3] - anchor[:, 1]
    gw, gh = gt[:, 2] - gt[:, 0], gt[:, 3] - gt[:, 1]
    return torch.stack([((gt[:, 0] + gt[:, 2]) - (anchor[:, 0] + anchor[:, 2])) / 2 / aw,
                        ((gt[:, 1] + gt[:, 3]) - (anchor[:, 1] + anchor[:, 3])) / 2 / ah,
                        torch.log(gw / aw), torch.log(gh / ah)], 1)


def assign(anchor: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[anchors, 5]: class (-1 background, -2 ignored) and box deltas, by IoU (0.5 / 0.4, with
    each box's best anchor kept positive, as torchvision's matcher allows)."""
    iou = box_iou(anchor, boxes)
    best, idx = iou.max(1)
    cls = torch.where(best >= 0.5, labels[idx].float(), torch.full_like(best, -1.0))
    cls = torch.where((best >= 0.4) & (best < 0.5), torch.full_like(best, -2.0), cls)
    best_anchor = iou.argmax(0)
    cls[best_anchor] = labels.float()
    idx[best_anchor] = torch.arange(len(boxes))
    return torch.cat([cls[:, None], encode(boxes[idx], anchor)], 1)


def synthetic_targets(grid: torch.Tensor, size: int, classes: int, batch_size: int,
                      g: torch.Generator) -> torch.Tensor:
    """[batch, anchors, 5]: each image's BOXES_PER_IMAGE random boxes and labels, assigned to the grid."""
    targets = []
    for _ in range(batch_size):
        centre = torch.rand(BOXES_PER_IMAGE, 2, generator=g) * size
        half = (0.05 + 0.3 * torch.rand(BOXES_PER_IMAGE, 2, generator=g)) * size / 2
        boxes = torch.cat([(centre - half).clamp(0, size), (centre + half).clamp(0, size)], 1)
        labels = torch.randint(0, classes, (BOXES_PER_IMAGE,), generator=g)
        targets.append(assign(grid, boxes, labels))
    return torch.stack(targets)


def detection_loss(focal):
    def loss_fn(outputs, targets):
        classes = outputs.shape[-1] - 4
        logits, deltas = outputs[..., :classes], outputs[..., classes:]
        labels = targets[..., 0]
        valid, positive = labels > -1.5, labels >= 0
        num_pos = positive.sum().clamp(min=1)
        onehot = torch.zeros_like(logits)
        onehot[positive, labels[positive].long()] = 1.0
        cls_loss = focal(logits[valid], onehot[valid], reduction="sum") / num_pos
        box_loss = F.smooth_l1_loss(deltas[positive], targets[..., 1:][positive], beta=1 / 9, reduction="sum")
        return cls_loss + box_loss / num_pos
    return loss_fn


def build(preset: str = "quick", classes: int = 80, trainable_layers: int = 3, frozen_bn: str = "separate",
          focal: str = "reference", frozen_backward: str = "skip", loss: str = "composite") -> Workload:
    validate_options({"classes": classes, "trainable_layers": trainable_layers, "frozen_bn": frozen_bn,
                      "focal": focal, "frozen_backward": frozen_backward, "loss": loss})
    size, batch = preset_value(preset, PRESETS)[6:]
    torch.manual_seed(0)
    folding = frozen_bn in ("folded", "compiled")
    model = RetinaNet(preset, classes, trainable_layers, "fused" if folding else frozen_bn, frozen_backward)
    if folding:
        fixes.fold_batch_norm(model, torch.zeros(1, 3, size, size))
    if frozen_bn == "compiled":
        fixes.compile_regions(model)
    grid = anchors(size)

    def make_batch(batch_size: int):
        g = torch.Generator().manual_seed(batch_size)
        images = torch.randn(batch_size, 3, size, size, generator=g)
        return images, synthetic_targets(grid, size, classes, batch_size, g)

    if loss == "fused":
        from cpuopt_helpers.kernels.detection_loss import detection_loss as loss_fn
    else:
        loss_fn = detection_loss(fixes.focal_loss(focal))
    name = f"retinanet-{preset}-{classes}c-tl{trainable_layers}"
    return Workload(name, model, make_batch, loss_fn, batch, image_like=True)
