"""Workload: a training step of two transformer blocks of examples.gpt, each under activation
checkpointing (`torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`), with a
mean-square loss on the output: forward, loss, backward.

Checkpointing keeps only each block's input and runs the block's forward again inside the backward.
A compiler traces the checkpointed regions into its graph and its partitioner recomputes them in
the backward graph instead of saving their activations; what shows is that recomputation and how it
fuses with the backward's own work (gpt_block_training is the same kind of block without it).
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from benchmarks.gpt_block_forward import config
from benchmarks.workload import Case
from examples.gpt import Block

NAME = "checkpoint_training"
DESCRIPTION = "2 checkpointed GPT blocks fwd+bwd"


class CheckpointedBlocks(nn.Module):
    def __init__(self, blocks: list[Block]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return x.square().mean()


def build(quick: bool) -> Case:
    cfg = config(quick)
    batch = 2 if quick else 8

    def make_fn() -> nn.Module:
        torch.manual_seed(0)
        return CheckpointedBlocks([Block(cfg), Block(cfg)]).train()

    x = torch.randn(batch, cfg.block_size, cfg.n_embd, generator=torch.Generator().manual_seed(1))
    return Case(make_fn=make_fn, inputs=[(x,)], training=True, rtol=1e-3, atol=1e-5)
