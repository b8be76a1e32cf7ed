"""Workload: one training step of a three-layer MLP: forward, MSE loss, backward.

The compiled region is the module's forward with its loss; `loss.backward()` runs outside it, as in
a user's training loop, so the compiled backward (AOT autograd's second graph) is timed too.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.workload import Case

NAME = "mlp_training"
DESCRIPTION = "3-layer MLP forward+MSE+backward"


class MLPWithLoss(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, dim)
        )

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.layers(x), target)


def build(quick: bool) -> Case:
    batch, dim, hidden = (32, 64, 128) if quick else (256, 256, 1024)

    def make_fn() -> nn.Module:
        torch.manual_seed(0)
        return MLPWithLoss(dim, hidden)

    g = torch.Generator().manual_seed(1)
    x, target = torch.randn(batch, dim, generator=g), torch.randn(batch, dim, generator=g)
    return Case(make_fn=make_fn, inputs=[(x, target)], training=True, rtol=1e-3, atol=1e-5)
