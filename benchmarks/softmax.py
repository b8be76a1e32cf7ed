"""Workload: softmax over the last dimension of a large matrix.

Two reductions (max, then sum of exponentials) and a pointwise normalisation: a fusing compiler does
it in one kernel with per-row passes. On this machine the real torch.compile is slower than eager
here (0.86x when measured), which makes it a target for Kiln.
"""
from __future__ import annotations

import torch

from benchmarks.workload import Case, tensor_bytes

NAME = "softmax"
DESCRIPTION = "softmax(x, dim=-1)"


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def build(quick: bool) -> Case:
    rows, cols = (512, 256) if quick else (4096, 1024)
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0))
    return Case(make_fn=lambda: softmax, inputs=[(x,)], bytes_moved=tensor_bytes(x, x))
