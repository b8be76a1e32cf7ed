"""Workload: log_softmax over vocabulary-sized rows, as a language model's loss takes it.

Rows of 32000 floats are longer than L1 holds: the max, the sum of exponentials and the output pass
each walk the row again, so the row's start must be on its way before the passes reach it. Eager's
kernel (vectorized exp, three passes) is the bar; a lone log_softmax gives a compiler no fusion win.
"""
from __future__ import annotations

import torch

from benchmarks.workload import Case, tensor_bytes

NAME = "softmax_vocab"
DESCRIPTION = "log_softmax(logits, dim=-1), 32000-wide rows"


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1)


def build(quick: bool) -> Case:
    rows = 8 if quick else 64
    x = torch.randn(rows, 32000, generator=torch.Generator().manual_seed(0)) * 3
    return Case(make_fn=lambda: log_softmax, inputs=[(x,)], bytes_moved=tensor_bytes(x, x))
