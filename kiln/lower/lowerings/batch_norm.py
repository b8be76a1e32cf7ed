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
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.lower.ir import Layout
from kiln.lower.lowerings import LoweringContext, TensorValue, register
from kiln.lower.lowerings.convolution import channels_last_strides, extern_in_layout_of, is_channels_last

aten = torch.ops.aten


@register(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(ctx: LoweringContext, x: TensorValue, *rest: Any) -> Any:
    return extern_in_layout_of(ctx, aten._native_batch_norm_legit_functional.default, x, rest,
                               is_channels_last(x))


@register(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, *rest: Any) -> Any:
    channels_last = is_channels_last(x)
    if channels_last and grad.view is None:  # the kernel computing the gradient writes it NHWC
        grad = ctx.realize(grad, Layout(grad.dtype, grad.sizes, channels_last_strides(grad.sizes)))
    return extern_in_layout_of(ctx, aten.native_batch_norm_backward.default, grad, (x,) + rest, channels_last)
