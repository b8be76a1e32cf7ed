"""Workload: an attention's scaled and causally masked softmax over (batch, heads, queries, keys).

Short rows (128 keys) of a 4-d tensor: per-row costs (the end of each reduction, the start of the
next row) weigh as much as the exponentials; the scale and the mask fuse into the softmax's passes,
which eager runs as three kernels.
"""
from __future__ import annotations

import torch

from benchmarks.workload import Case, tensor_bytes

NAME = "attention_softmax"
DESCRIPTION = "softmax(scores * scale + causal_mask, dim=-1), 128-key rows"


def attention_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores * 0.125 + mask, dim=-1)


def build(quick: bool) -> Case:
    batch = 2 if quick else 8
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(batch, 12, 128, 128, generator=g) * 3
    mask = torch.zeros(128, 128).masked_fill(torch.ones(128, 128, dtype=torch.bool).triu(1), float("-inf"))
    return Case(make_fn=lambda: attention_softmax, inputs=[(scores, mask)],
                bytes_moved=tensor_bytes(scores, mask, scores))
