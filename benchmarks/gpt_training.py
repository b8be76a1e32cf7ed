"""Workload: the training step of `make demo` (examples/demo.py): the small GPT of examples.gpt
(2 layers, 4 heads, 64 channels, vocabulary 128) on a batch of 8 x 64 tokens, forward with
cross-entropy, then backward.

Small matrices and many ops per layer: per-call and per-kernel overhead matter as much as kernels.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from benchmarks.workload import Case
from examples.demo import CONFIG
from examples.gpt import GPT, sample_batch

NAME = "gpt_training"
DESCRIPTION = "demo GPT forward+CE+backward"


class GPTLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gpt = GPT(CONFIG)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.gpt(idx, targets)[1]


def build(quick: bool) -> Case:
    def make_fn() -> nn.Module:
        torch.manual_seed(0)
        return GPTLoss().train()

    idx, targets = sample_batch(CONFIG, 4 if quick else 8, 32 if quick else 64)
    return Case(make_fn=make_fn, inputs=[(idx, targets)], training=True, rtol=1e-3, atol=1e-5)
