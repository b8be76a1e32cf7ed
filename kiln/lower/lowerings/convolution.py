"""Convolutions and pooling: oneDNN externs, run on channels-last (NHWC) activations on CPU.

ATen's CPU convolution (oneDNN) works in NHWC: given NCHW it converts the input, and, for max
pooling, the NCHW kernel is many times slower than the NHWC one. So a 2-d float convolution's input
is stored channels-last, and its output (which ATen then returns channels-last) is declared so:
the kernel that computes the input (a ReLU, an add of a residual) writes NHWC directly, the
convolution's consumers read it with NHWC strides, and graph outputs still get eager's layout
(outputs are stored in the layout of their meta). The weights of a folded BatchNorm come
channels-last from `kiln::fold_conv_bn` (kiln.lower.fold_batch_norm). Corresponds to Inductor's
layout optimization for convolution graphs (torch/_inductor/graph.py, `decide_layout_opt`).
"""
from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch
import torch.fx

from kiln.lower.conv_layout import channels_last_eligible, channels_last_pays
from kiln.lower.fold_batch_norm import fold_conv_bn, fold_conv_bn_packed, mkldnn_convolution
from kiln.lower.ir import Layout, contiguous_strides
from kiln.lower.lowerings import LoweringContext, TensorValue, register

aten = torch.ops.aten


def channels_last_strides(sizes: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    n, c, h, w = sizes
    return (h * w * c, sympy.Integer(1), w * c, c)


def is_channels_last(tv: TensorValue) -> bool:
    if tv.view is None:
        return False
    lay = tv.view.layout
    want = channels_last_strides(lay.sizes)
    return lay.offset == 0 and all(s == 1 or sympy.expand(a - b) == 0
                                   for s, a, b in zip(lay.sizes, lay.strides, want))


def _nhwc_weight(weight: TensorValue) -> bool:
    """An NHWC weight that is not also contiguous (a 1x1 kernel can be both): a folded one."""
    return (is_channels_last(weight) and weight.view is not None
            and weight.view.layout.strides != contiguous_strides(weight.view.layout.sizes))


def _wants_channels_last(ctx: LoweringContext, x: TensorValue) -> bool:
    meta = ctx.meta[0] if isinstance(ctx.meta, (tuple, list)) else ctx.meta
    return (isinstance(meta, torch.Tensor) and all(isinstance(s, int) for s in meta.shape)
            and channels_last_eligible(x.dtype, meta.device, x.ndim))


def _input_leaves_graph(ctx: LoweringContext) -> bool:
    """Whether the current node's first input is also a graph output: in a training forward, what
    the backward reads (a convolution's input, the ReLU before a pooling). Graph outputs keep
    eager's layout, so an NHWC copy for this node would be one more pass, and the backward, which
    gets the NCHW one, would run NCHW anyway."""
    node = ctx.node
    x = node.args[0] if node is not None and node.args else None
    return isinstance(x, torch.fx.Node) and any(u.op == "output" for u in x.users)


def _channels_last_input(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    """`x` stored NHWC: as it is when it already is, else computed (or copied) into a new buffer."""
    if is_channels_last(x):
        return x
    return ctx.realize(x, Layout(x.dtype, x.sizes, channels_last_strides(x.sizes)))


def _channels_last_meta(meta: Any) -> Any:
    """The result ATen returns for an NHWC input: the node's meta with channels-last strides."""
    if isinstance(meta, (tuple, list)):
        return type(meta)(_channels_last_meta(m) for m in meta)
    if isinstance(meta, torch.Tensor) and meta.dim() == 4:
        return torch.empty(meta.shape, dtype=meta.dtype, device="meta").contiguous(memory_format=torch.channels_last)
    return meta


def extern_in_layout_of(ctx: LoweringContext, op: Any, x: TensorValue, rest: tuple, channels_last: bool) -> Any:
    """ctx.extern(op, (x, *rest)); with `channels_last` (x is stored NHWC), its 4-d results are
    declared NHWC, which is what ATen's convolution, pooling and BatchNorm return for such an x."""
    if not channels_last:
        return ctx.extern(op, (x,) + rest, {})
    saved = ctx.meta
    ctx.meta = _channels_last_meta(saved)
    try:
        out = ctx.extern(op, (x,) + rest, {})
    finally:
        ctx.meta = saved
    ctx.relaid_out.update(tv.view.name for tv in (out if isinstance(out, tuple) else (out,))
                          if isinstance(tv, TensorValue) and tv.view is not None and tv.ndim == 4)
    return out


def _extern_channels_last(ctx: LoweringContext, op: Any, x: TensorValue, rest: tuple) -> Any:
    return extern_in_layout_of(ctx, op, _channels_last_input(ctx, x), rest, True)


def _pays_channels_last(x: TensorValue, weight: TensorValue) -> bool:
    return channels_last_pays(int(x.sizes[2] * x.sizes[3]), _nhwc_weight(weight))


@register(aten.convolution.default)
def convolution(ctx: LoweringContext, x: TensorValue, weight: TensorValue, bias: Any, stride: Any, padding: Any,
                dilation: Any, transposed: bool, output_padding: Any, groups: Any) -> Any:
    rest = (weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    # a folded weight is NHWC exactly where fold_batch_norm decided this convolution runs NHWC (ATen
    # would run it so anyway); otherwise the same rule decides here
    if _wants_channels_last(ctx, x) and (_nhwc_weight(weight) or (_pays_channels_last(x, weight)
                                                                       and not _input_leaves_graph(ctx))):
        return _extern_channels_last(ctx, aten.convolution.default, x, rest)
    return ctx.extern(aten.convolution.default, (x,) + rest, {})


@register(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx: LoweringContext, x: TensorValue, *rest: Any) -> Any:
    # NHWC only when that costs no copy (x is computed here, or already NHWC): ATen's NCHW kernel
    # is slow, but a copy of a stored NCHW tensor is not free either
    if _wants_channels_last(ctx, x) and (x.view is None or is_channels_last(x)) and not _input_leaves_graph(ctx):
        return _extern_channels_last(ctx, aten.max_pool2d_with_indices.default, x, tuple(rest))
    return ctx.extern(aten.max_pool2d_with_indices.default, (x,) + tuple(rest), {})


@register(mkldnn_convolution)
def convolution_packed(ctx: LoweringContext, x: TensorValue, weight: TensorValue, *rest: Any) -> Any:
    """A convolution on a weight packed by kiln::fold_conv_bn_packed: NHWC results always; the
    input is stored NHWC where that pays (the same rule as for ATen's convolution)."""
    if x.ndim == 4 and channels_last_pays(int(x.sizes[2] * x.sizes[3]), True) and not _input_leaves_graph(ctx):
        x = _channels_last_input(ctx, x)
    return extern_in_layout_of(ctx, mkldnn_convolution, x, (weight,) + rest, True)


@register(fold_conv_bn, fold_conv_bn_packed)
def fold_conv_bn_extern(ctx: LoweringContext, *args: Any) -> Any:
    return ctx.extern(ctx.node.target, args, {})
