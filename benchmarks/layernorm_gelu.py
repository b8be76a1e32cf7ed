"""Workload: layer norm followed by GELU, as in every transformer MLP input.

A reduction (mean and variance per row) with pointwise work before and after it: a fusing compiler
makes it one kernel that reads each row once. On this machine the real torch.compile is slower than
eager here (0.89x when measured), which makes it a target for Kiln.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.workload import Case, tensor_bytes

NAME = "layernorm_gelu"
DESCRIPTION = "gelu(layer_norm(x)) over rows"


def layernorm_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.layer_norm(x, (x.shape[-1],), weight, bias))


def build(quick: bool) -> Case:
    rows, cols = (512, 256) if quick else (4096, 1024)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=g)
    w = torch.randn(cols, generator=g)
    b = torch.randn(cols, generator=g)
    return Case(make_fn=lambda: layernorm_gelu, inputs=[(x, w, b)], bytes_moved=tensor_bytes(x, w, b, x))
