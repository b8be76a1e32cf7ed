"""BatchNorm's lowerings: inference BatchNorm that is not folded; training BatchNorm is decomposed.

The functional training forward (AOT autograd's form of BatchNorm with its running-statistics update:
_native_batch_norm_legit_functional) and its backward (native_batch_norm_backward) have no rule here:
the `decompose` pass rewrites them into a var_mean over N, H and W, the normalize, the momentum update
of the running mean and the unbiased running variance, and for the backward the two per-channel sums
(of dy and of dy * (x - mean)) and the pointwise input gradient. Kiln's kernels compute them: on an
NCHW input one kernel runs the statistics, the update and the normalize (with the ReLU after it) per
channel along contiguous rows of H*W; on an NHWC input the statistics are sums along the rows of C
channels, each thread into its own row of accumulators (kiln.lower.schedule.reads_across), and the
normalize is a pointwise kernel in the input's layout. track_running_stats=False reaches the pass as
_native_batch_norm_legit.no_stats, decomposed alike. (ATen's kernels as externs were ~22% of a
DenseNet-style training step and kept the ReLU out of BatchNorm's pass.)

An inference BatchNorm after a convolution is folded instead (kiln.lower.fold_batch_norm); one that
is not (after a small convolution computed without oneDNN, after a Linear, a BatchNorm1d) is its
per-channel affine map, a lazy value that fuses with its neighbours.
"""
from __future__ import annotations

import operator
from typing import Any

import sympy
import torch

from kiln.lower import ops
from kiln.lower.ir import Value
from kiln.lower.lowerings import LoweringContext, TensorValue, compute_dtype, register

aten = torch.ops.aten


def _statistics_read(node: Any) -> bool:
    """Whether anything reads BatchNorm's second or third result (ATen's are empty in inference,
    where the node's metadata says one value per channel)."""
    return node is None or any(u.target is not operator.getitem or (u.args[1] != 0 and u.users) for u in node.users)


@register(aten._native_batch_norm_legit.default)
def batch_norm_legit(ctx: LoweringContext, x: TensorValue, weight: Any, bias: Any, running_mean: TensorValue,
                     running_var: TensorValue, training: bool, momentum: float, eps: float) -> Any:
    args = (x, weight, bias, running_mean, running_var, training, momentum, eps)
    if training or x.ndim < 2 or _statistics_read(ctx.node):
        return ctx.extern(aten._native_batch_norm_legit.default, args, {})
    dtype = compute_dtype(x.dtype)

    def per_channel(tv: TensorValue, c: sympy.Expr) -> Value:
        return ops.cast(tv.load([c]), dtype)

    def loader(idx: Any) -> Value:
        c = idx[1]
        scale = ops.op("rsqrt", ops.op("add", per_channel(running_var, c), ops.constant(float(eps), dtype)))
        if weight is not None:
            scale = ops.op("mul", scale, per_channel(weight, c))
        y = ops.op("mul", ops.op("sub", ops.cast(x.load(idx), dtype), per_channel(running_mean, c)), scale)
        return y if bias is None else ops.op("add", y, per_channel(bias, c))

    out = TensorValue(x.dtype, x.sizes, loader, origins=x.origins)
    unread = TensorValue(x.dtype, ctx.out_sizes(1), lambda idx: ops.constant(0.0, dtype))
    return out, unread, unread
