"""Extern calls: ops that run as ATen calls from the wrapper (matmuls, convolutions, fallbacks).

mm/addmm/bmm/convolution are faster in ATen (its BLAS and oneDNN) than any loop Kiln would write,
so they are externs by design. Any other op without a lowering, or whose lowering refuses its
arguments, becomes a `fallback`: the same extern, plus a KILN_LOGS=perf_hints line saying so.
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.lower.lowerings import LoweringContext, register

aten = torch.ops.aten

EXTERN_BY_DESIGN = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
                    aten.convolution.default, aten.convolution_backward.default,
                    aten._scaled_dot_product_flash_attention_for_cpu.default,
                    aten._scaled_dot_product_flash_attention_for_cpu_backward.default)


def _extern_rule(op: Any):
    def rule(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
        return ctx.extern(op, args, kwargs)
    return rule


for _op in EXTERN_BY_DESIGN:
    register(_op)(_extern_rule(_op))


def fallback(ctx: LoweringContext, op: Any, args: tuple, kwargs: dict[str, Any], reason: str) -> Any:
    """Run `op` as an ATen call; logged as a perf hint because it breaks fusion around it."""
    return ctx.extern(op, args, kwargs, reason=reason)
