"""BatchNorm in training: ATen's own kernels as externs, forward and backward.

The decomposition (var_mean, then a normalizing pass) lowers to reductions over N, H and W that keep
the channel, a column reduction Kiln's loops do with strided loads: slower than ATen's kernels,
which collect each channel's statistics in one vectorized pass in NCHW and in NHWC alike. So the
functional training forward (AOT autograd's form of BatchNorm with its running-statistics update)
and its backward stay whole and run in ATen; the ReLU after the forward and the residual add are
still fused into the kernel that reads its result. On a channels-last input ATen returns
channels-last results, and the results are declared so (no relayout copy). Inference BatchNorm
after a convolution is folded instead (kiln.lower.fold_batch_norm). Corresponds to Inductor's
choice to keep batch_norm's backward as a fallback on CPU.

An inference BatchNorm that is not folded (after a small convolution computed without oneDNN, after
a Linear, a BatchNorm1d) is its per-channel affine map, a lazy value that fuses with its neighbours.
"""
from __future__ import annotations

from typing import Any

import torch

import operator

import sympy

from kiln.lower import ops
from kiln.lower.ir import Layout, Value
from kiln.lower.lowerings import LoweringContext, TensorValue, compute_dtype, register
from kiln.lower.lowerings.convolution import channels_last_strides, extern_in_layout_of, is_channels_last

aten = torch.ops.aten


@register(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(ctx: LoweringContext, x: TensorValue, *rest: Any) -> Any:
    return extern_in_layout_of(ctx, aten._native_batch_norm_legit_functional.default, x, rest,
                               is_channels_last(x))


def _channels_last_3d(tv: TensorValue) -> bool:
    """Whether a 5-d tv is stored channels-last (NDHWC, torch.channels_last_3d)."""
    if tv.view is None or tv.ndim != 5:
        return False
    lay = tv.view.layout
    return lay.offset == 0 and all(s == 1 or sympy.expand(a - b) == 0
                                   for s, a, b in zip(lay.sizes, lay.strides, _ndhwc_strides(lay.sizes)))


def _ndhwc_strides(sizes: Any) -> tuple[sympy.Expr, ...]:
    n, c, d, h, w = sizes
    return (d * h * w * c, sympy.Integer(1), h * w * c, w * c, c)


@register(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, *rest: Any) -> Any:
    channels_last = is_channels_last(x)
    # ATen's backward takes its channels-last path only when the gradient is stored as the input
    # is; its other path sums in another order than eager's. The kernel computing the gradient
    # writes it so, and a gradient that arrives in another layout (a contiguous tangent) is copied.
    if channels_last and not is_channels_last(grad):
        grad = ctx.realize(grad, Layout(grad.dtype, grad.sizes, channels_last_strides(grad.sizes)))
    if _channels_last_3d(x) and not _channels_last_3d(grad):
        grad = ctx.realize(grad, Layout(grad.dtype, grad.sizes, _ndhwc_strides(grad.sizes)))
    return extern_in_layout_of(ctx, aten.native_batch_norm_backward.default, grad, (x,) + rest, channels_last)


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
