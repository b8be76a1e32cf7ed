"""Workload: a ResNet-18-sized CNN (torchvision's layout: a 7x7 stem, four stages of two basic blocks
with 64/128/256/512 channels, BatchNorm after every convolution, global pooling, a linear head),
forward only, in eval mode under no_grad.

Written here rather than imported from torchvision (not a dependency). What shows: convolutions
(oneDNN externs) and what happens around them: BatchNorm folded into the convolution's weights, the
residual add and ReLU applied in one pass over the convolution's output, and the memory layout.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from benchmarks.workload import Case

NAME = "resnet18_inference"
DESCRIPTION = "ResNet-18 forward, eval, no grad"


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers = []
        cin = width
        for k, stride in enumerate((1, 2, 2, 2)):
            cout = width * 2 ** k
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():  # non-trivial BatchNorm statistics, as in a trained network
            if isinstance(m, nn.BatchNorm2d):
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.uniform_(m.bias, -0.2, 0.2)
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def input_shape(quick: bool) -> tuple[int, int, int, int]:
    return (2, 3, 32, 32) if quick else (8, 3, 64, 64)


def build(quick: bool) -> Case:
    def make_fn() -> nn.Module:
        torch.manual_seed(0)
        return ResNet18().eval()

    x = torch.randn(*input_shape(quick), generator=torch.Generator().manual_seed(1))
    return Case(make_fn=make_fn, inputs=[(x,)], rtol=1e-3, atol=1e-4)
