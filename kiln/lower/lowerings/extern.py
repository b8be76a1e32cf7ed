"""Extern calls: ops that run as ATen calls from the wrapper (matmuls, convolutions, fallbacks).

mm/addmm/bmm/convolution are faster in ATen (its BLAS and oneDNN) than any loop Kiln would write,
so they are externs by design (convolution's rule, which also picks its layout, is in convolution.py).
Any other op without a lowering, or whose lowering refuses its arguments, becomes a `fallback`: the
same extern, plus a KILN_LOGS=perf_hints line saying so.

Epilogues (bias + activation after a matmul) are not fused into the extern: an ATen/BLAS call cannot
run Kiln's code on its output tile while it is in cache, so true fusion needs Kiln's own GEMM, which
would be slower than MKL's for these sizes. What is done instead: the bias stays inside the BLAS call
(a Linear arrives as addmm), the activation is the first kernel after it reading the result once, and
a lazy matmul input is stored once and shared by every reader (graph.py `_realize_extern_inputs`).
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.lower.lowerings import LoweringContext, register

aten = torch.ops.aten

EXTERN_BY_DESIGN = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
                    aten.convolution_backward.default, torch.ops.mkldnn._linear_pointwise.default,
                    aten._scaled_dot_product_flash_attention_for_cpu.default,
                    aten._scaled_dot_product_flash_attention_for_cpu_backward.default)


def _extern_rule(op: Any):
    def rule(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
        return ctx.extern(op, args, kwargs)
    return rule


for _op in EXTERN_BY_DESIGN:
    if _op is not aten.convolution_backward.default:  # small ones are computed (lowerings.convolution)
        register(_op)(_extern_rule(_op))


def fallback(ctx: LoweringContext, op: Any, args: tuple, kwargs: dict[str, Any], reason: str) -> Any:
    """Run `op` as an ATen call; logged as a perf hint because it breaks fusion around it."""
    return ctx.extern(op, args, kwargs, reason=reason)


def is_random(op: Any) -> bool:
    """Whether `op` draws from a generator (its schema's nondeterministic_seeded tag): under
    kiln.config.fallback_random it is neither decomposed nor lowered, and runs as the ATen call."""
    return isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags
