"""ResNet-family image classifier on deterministic synthetic images."""

from __future__ import annotations

import torch
from torch import nn

from cpuopt_helpers.workloads import Workload, preset_value

# preset -> (block, blocks per stage, stem width, image size, classes, batch size)
PRESETS = {
    "quick": ("basic", (1, 1), 16, 32, 10, 16),              # tiny ResNet, seconds a run
    "standard": ("basic", (2, 2, 2, 2), 64, 112, 100, 16),   # ResNet-18 layout at 112 px
    "full": ("bottleneck", (3, 4, 6, 3), 64, 224, 1000, 64), # ResNet-50 at 224 px
}


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class Bottleneck(BasicBlock):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__(cin, width, stride)
        cout = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock], layers: tuple[int, ...], width: int, classes: int):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], width
        for i, n in enumerate(layers):
            w = width * 2**i
            for j in range(n):
                stages.append(block(cin, w, 2 if j == 0 and i > 0 else 1))
                cin = w * block.expansion
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def build(preset: str = "quick") -> Workload:
    kind, layers, width, size, classes, batch = preset_value(preset, PRESETS)
    torch.manual_seed(0)
    model = ResNet(BasicBlock if kind == "basic" else Bottleneck, layers, width, classes)

    def make_batch(batch_size: int):
        g = torch.Generator().manual_seed(batch_size)
        images = torch.randn(batch_size, 3, size, size, generator=g)
        labels = torch.randint(0, classes, (batch_size,), generator=g)
        return images, labels

    return Workload(f"cnn-{preset}", model, make_batch, nn.functional.cross_entropy, batch, image_like=True)
