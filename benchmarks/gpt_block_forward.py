"""Workload: one transformer block of examples.gpt (pre-norm attention written with plain ops, GELU
MLP, residuals), forward only, no gradients.

A realistic mix: four matmul-like externs per block around layer norms, a masked softmax and GELU,
where the fusions between them decide the speed.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from benchmarks.workload import Case
from examples.gpt import Block, GPTConfig

NAME = "gpt_block_forward"
DESCRIPTION = "GPT block forward, no grad"


def config(quick: bool) -> GPTConfig:
    if quick:
        return GPTConfig(block_size=32, n_head=2, n_embd=32, dropout=0.0)
    return GPTConfig(block_size=128, n_head=4, n_embd=256, dropout=0.0)


def build(quick: bool) -> Case:
    cfg = config(quick)
    batch = 2 if quick else 8

    def make_fn() -> nn.Module:
        torch.manual_seed(0)
        return Block(cfg).eval().requires_grad_(False)

    x = torch.randn(batch, cfg.block_size, cfg.n_embd, generator=torch.Generator().manual_seed(1))
    return Case(make_fn=make_fn, inputs=[(x,)], rtol=1e-4, atol=1e-4)
