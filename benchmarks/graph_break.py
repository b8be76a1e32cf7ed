"""Workload: a small MLP step with one graph break (`.item()` on an intermediate).

The break splits the function into two graphs joined by a resume function; this workload is here
for compile time: a warm start (a second process) must reach its first compiled call from the
frame cache, resume function included, without capturing anything (kiln.capture.persist).
"""
from __future__ import annotations

import torch

from benchmarks.workload import Case, tensor_bytes

NAME = "graph_break"
DESCRIPTION = "matmul+relu, .item() (one graph break), divide+tanh"


def graph_break(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.relu(x @ w)
    scale = h.abs().max().item() + 1.0  # a Python float: the frame breaks here
    return torch.tanh(h / scale) * w.sum(0)


def build(quick: bool) -> Case:
    n = 256 if quick else 1024
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 512, generator=g)
    w = torch.randn(512, 512, generator=g) / 22.0
    return Case(make_fn=lambda: graph_break, inputs=[(x, w)], bytes_moved=tensor_bytes(x, w) + tensor_bytes(x))
