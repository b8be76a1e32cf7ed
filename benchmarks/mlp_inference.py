"""Workload: a two-layer MLP with GELU, inference only (no parameter needs a gradient).

Dominated by the two matmuls, which every compiler hands to the same BLAS; what is left to win is
fusing the bias add and GELU into one pass, and the per-call overhead of the compiled wrapper.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from benchmarks.workload import Case

NAME = "mlp_inference"
DESCRIPTION = "Linear-GELU-Linear forward, no grad"


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def build(quick: bool) -> Case:
    batch, dim, hidden = (32, 64, 256) if quick else (256, 512, 2048)

    def make_fn() -> nn.Module:
        torch.manual_seed(0)
        return MLP(dim, hidden).eval().requires_grad_(False)

    x = torch.randn(batch, dim, generator=torch.Generator().manual_seed(1))
    return Case(make_fn=make_fn, inputs=[(x,)], rtol=1e-4, atol=1e-4)
