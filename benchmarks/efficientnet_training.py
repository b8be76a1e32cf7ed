"""Workload: a training step of a small EfficientNet-style CNN in train mode: a strided stem
convolution, inverted-residual (MBConv) blocks (1x1 expansion, 3x3 depthwise convolution,
squeeze-and-excitation, 1x1 projection, residual when the shape allows), a 1x1 head, global pooling
and a linear classifier; every convolution followed by BatchNorm on batch statistics (running
statistics updated) and most by SiLU; cross-entropy loss, backward.

What shows: BatchNorm's training forward and backward between many small convolutions (the graph
resnet18_training has, with depthwise convolutions, SiLU and the squeeze-excitation gates in
between), where most of the time outside the convolutions is pointwise and per-channel reduction
work, and whether the compiled graphs leave the Python wrapper at all.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.workload import Case

NAME = "efficientnet_training"
DESCRIPTION = "EfficientNet-style CNN (BN train) fwd+CE+bwd"


def conv_bn(cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.SiLU())
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.expand(F.silu(self.reduce(x.mean((2, 3), keepdim=True))))
        return x * gate.sigmoid()


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.body = nn.Sequential(
            conv_bn(cin, hidden),
            conv_bn(hidden, hidden, 3, stride, groups=hidden),
            SqueezeExcite(hidden, max(cin // 4, 4)),
            conv_bn(hidden, cout, act=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return out + x if self.residual else out


class EfficientNetStyle(nn.Module):
    # (output channels, stride) per block, after a 16-channel stem of stride 2
    BLOCKS = ((16, 1), (24, 2), (24, 1), (40, 2), (40, 1), (80, 2))

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        blocks: list[nn.Module] = [conv_bn(3, 16, 3, 2)]
        cin = 16
        for cout, stride in self.BLOCKS:
            blocks.append(MBConv(cin, cout, stride))
            cin = cout
        blocks.append(conv_bn(cin, 160))
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Linear(160, num_classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(self.features(x).mean((2, 3)))
        return F.cross_entropy(logits, target)


def build(quick: bool) -> Case:
    def make_fn() -> nn.Module:
        torch.manual_seed(0)
        return EfficientNetStyle().train()

    # the last stage runs at 1/16 of the image: 4x4 pixels at 64x64 (quick), so each BatchNorm there
    # still normalizes batch*16 values per channel and the gradients stay comparable with eager's
    batch, size = (4, 64) if quick else (16, 128)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=g)
    target = torch.randint(0, 10, (batch,), generator=g)
    return Case(make_fn=make_fn, inputs=[(x, target)], training=True, rtol=1e-3, atol=1e-4)
