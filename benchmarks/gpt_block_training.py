"""Workload: forward and backward of one transformer block of examples.gpt, with a mean-square loss
on its output (the block in train mode, dropout 0 so that results are comparable with eager).

What AOT autograd's partitioner decides (which activations to save, which to recompute) and how well
the backward's pointwise work fuses shows here.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from benchmarks.gpt_block_forward import config
from benchmarks.workload import Case
from examples.gpt import Block

NAME = "gpt_block_training"
DESCRIPTION = "GPT block forward+backward"


class BlockWithLoss(nn.Module):
    def __init__(self, block: Block) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x).square().mean()


def build(quick: bool) -> Case:
    cfg = config(quick)
    batch = 2 if quick else 8

    def make_fn() -> nn.Module:
        torch.manual_seed(0)
        return BlockWithLoss(Block(cfg)).train()

    x = torch.randn(batch, cfg.block_size, cfg.n_embd, generator=torch.Generator().manual_seed(1))
    return Case(make_fn=make_fn, inputs=[(x,)], training=True, rtol=1e-3, atol=1e-5)
