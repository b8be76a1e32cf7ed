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

A batched matrix-vector product on the CPU is not an extern: `vector_bmm` computes it in Kiln's loops.
"""
from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch

from kiln.lower import ops
from kiln.lower.ir import Value
from kiln.lower.lowerings import LoweringContext, TensorValue, compute_dtype, register

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
    if _op not in (aten.convolution_backward.default, aten.bmm.default):  # their rules are below / in convolution.py
        register(_op)(_extern_rule(_op))


def vector_bmm(node: Any) -> bool:
    """Whether the FX node is a float bmm on the CPU whose rows or columns are single ([B, 1, K] @
    [B, K, N], [B, M, K] @ [B, K, 1], or the outer product [B, M, 1] @ [B, 1, N]): memory-bound work
    that BLAS runs one tiny GEMM per batch for (a mixture of experts' per-token expert weights,
    [64, 1, 64] @ [64, 64, 128], took ATen 8x as long as the loops). Computed as a multiply and a
    sum over K, its inputs stay lazy: a gather of the weights is read inside the sum, never stored.
    torch.compile does the same on the CPU (its bmm lowering, for M or N of 1)."""
    if getattr(node, "target", None) is not aten.bmm.default:
        return False
    metas = [a.meta.get("val") if hasattr(a, "meta") else None for a in node.args[:2]]
    a, b = metas
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() != 3 or b.dim() != 3:
        return False
    if a.device.type != "cpu" or a.dtype not in (torch.float32, torch.float64) or b.dtype != a.dtype:
        return False
    sizes = [*a.shape, *b.shape]
    if not all(type(s) is int for s in sizes):
        return False
    return a.shape[1] == 1 or b.shape[2] == 1 or a.shape[2] == 1


@register(aten.bmm.default)
def bmm(ctx: LoweringContext, a: TensorValue, b: TensorValue) -> TensorValue:
    if not vector_bmm(ctx.node):
        return ctx.extern(aten.bmm.default, (a, b), {})
    dtype = compute_dtype(a.dtype)
    zero = sympy.Integer(0)
    # the vector (or both sides of an outer product) is read once per element of the other side:
    # a lazy one (an MoE's silu between its two products) is stored, not recomputed N times over
    if a.sizes[1] == 1 or a.sizes[2] == 1:
        a = ctx.realize(a)
    if b.sizes[2] == 1 or a.sizes[2] == 1:
        b = ctx.realize(b)
    if a.sizes[2] == 1:  # an outer product per batch: pointwise
        def outer(idx: Sequence[sympy.Expr]) -> Value:
            return ops.op("mul", a.load([idx[0], idx[1], zero]), b.load([idx[0], zero, idx[2]]))
        return TensorValue(a.dtype, (a.sizes[0], a.sizes[1], b.sizes[2]), outer)

    def product(i: Sequence[sympy.Expr], r: Sequence[sympy.Expr]) -> Value:
        return ops.op("mul", ops.cast(a.load([i[0], i[1], r[0]]), dtype), ops.cast(b.load([i[0], r[0], i[2]]), dtype))

    return ctx.reduction(a.dtype, [a.sizes[0], a.sizes[1], b.sizes[2]], [a.sizes[2]], "sum", product)


def fallback(ctx: LoweringContext, op: Any, args: tuple, kwargs: dict[str, Any], reason: str) -> Any:
    """Run `op` as an ATen call; logged as a perf hint because it breaks fusion around it."""
    return ctx.extern(op, args, kwargs, reason=reason)


def is_random(op: Any) -> bool:
    """Whether `op` draws from a generator (its schema's nondeterministic_seeded tag): under
    kiln.config.fallback_random it is neither decomposed nor lowered, and runs as the ATen call."""
    return isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags
