"""Workload: one training step of the ResNet-18-sized CNN of benchmarks.resnet18_inference: forward in
train mode (BatchNorm on batch statistics, running stats updated), cross-entropy loss, backward.

What shows: BatchNorm's training forward and backward (reductions over N, H, W per channel) and the
ReLU/add work between the convolutions and their gradients.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.resnet18_inference import ResNet18, input_shape
from benchmarks.workload import Case

NAME = "resnet18_training"
DESCRIPTION = "ResNet-18 forward+CE+backward"


class ResNetWithLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = ResNet18(num_classes=100)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(x), target)


def build(quick: bool) -> Case:
    def make_fn() -> nn.Module:
        torch.manual_seed(0)
        return ResNetWithLoss().train()

    g = torch.Generator().manual_seed(1)
    # quick: 48x48, not the inference workload's 32x32, where the last stage runs at 1x1 pixels and
    # each BatchNorm normalizes 2 values per channel: its gradients are chaotic (eager float32 against
    # float64 differs by as much as the gradients themselves), so no compiler could match eager
    shape = (2, 3, 48, 48) if quick else input_shape(quick)
    x = torch.randn(*shape, generator=g)
    target = torch.randint(0, 100, (shape[0],), generator=g)
    return Case(make_fn=make_fn, inputs=[(x, target)], training=True, rtol=1e-3, atol=1e-4)
