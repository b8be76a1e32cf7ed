"""Workload: a chain of pointwise ops over two large float32 tensors.

Eager runs one ATen kernel per op and writes every intermediate to memory; a fusing compiler runs
one loop that reads x and y once and writes the result once, so this measures fusion and the
achieved memory bandwidth of one generated kernel.
"""
from __future__ import annotations

import torch

from benchmarks.workload import Case, tensor_bytes

NAME = "pointwise_chain"
DESCRIPTION = "sin/cos/mul/relu/sigmoid chain over 2 tensors"


def pointwise_chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a = (torch.sin(x) + torch.cos(y)) * x
    b = torch.relu(a) + 1.0
    return b * torch.sigmoid(y) - 0.5 * x


def build(quick: bool) -> Case:
    n = 1 << (18 if quick else 22)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g)
    y = torch.randn(n, generator=g)
    out_bytes = tensor_bytes(x)  # one output the size of x
    return Case(make_fn=lambda: pointwise_chain, inputs=[(x, y)], bytes_moved=tensor_bytes(x, y) + out_bytes)
