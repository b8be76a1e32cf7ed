"""Workload: a BERT-base-sized encoder stack (hidden 768, 12 heads, FFN 3072, post-norm layers as in
BERT, GELU, an additive attention mask), forward only under no_grad.

Written with plain ops (no transformers dependency in the benchmark): per layer four linear
projections, two batched matmuls, a masked softmax, two layer norms and a GELU. Matmul epilogues
(bias + activation) and the fusions around the softmax and layer norms decide the speed.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.workload import Case

NAME = "bert_encoder_inference"
DESCRIPTION = "BERT-base encoder layers, no grad"


class EncoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads) + mask
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = self.ln1(x + self.out(ctx))
        return self.ln2(x + self.down(F.gelu(self.up(x))))


class Encoder(nn.Module):
    def __init__(self, layers: int, hidden: int = 768, heads: int = 12, ffn: int = 3072) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads, ffn) for _ in range(layers))

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask)
        return x


def build(quick: bool) -> Case:
    layers, batch, seq = (1, 1, 32) if quick else (4, 2, 128)

    def make_fn() -> nn.Module:
        torch.manual_seed(0)
        return Encoder(layers).eval().requires_grad_(False)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, seq, 768, generator=g)
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    attention_mask[:, seq - seq // 8:] = 0  # padding at the end of every sequence
    return Case(make_fn=make_fn, inputs=[(x, attention_mask)], rtol=1e-3, atol=1e-4)
