"""Workload: a small module called with batch sizes 8, 9, ..., 20 in turn.

Static shapes would recompile for every size; under the default dynamic=None both compilers mark
the batch dimension dynamic after the first change, so this measures the cost of a symbolic-size
graph and how many compiles the sweep needs (reported beside the times).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.workload import Case

NAME = "varying_batch"
DESCRIPTION = "Linear+GELU+LayerNorm, batch 8..20"
BATCH_SIZES = tuple(range(8, 21))


class Projection(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.proj(x)) + x)


def build(quick: bool) -> Case:
    seq, dim = (8, 32) if quick else (64, 256)

    def make_fn() -> nn.Module:
        torch.manual_seed(0)
        return Projection(dim).eval().requires_grad_(False)

    g = torch.Generator().manual_seed(1)
    inputs = [(torch.randn(b, seq, dim, generator=g),) for b in BATCH_SIZES]
    return Case(make_fn=make_fn, inputs=inputs, rtol=1e-4, atol=1e-4, notes={"batch_sizes": list(BATCH_SIZES)})
