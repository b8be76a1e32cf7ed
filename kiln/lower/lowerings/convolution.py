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

from kiln.lower import ops
from kiln.lower.conv_layout import channels_last_eligible, channels_last_pays, small_conv_kind
from kiln.lower.fold_batch_norm import fold_conv_bn, fold_conv_bn_packed, mkldnn_convolution
from kiln.lower.ir import BufferRef, FloorDiv, Index, Layout, Masked, Value, contiguous_strides, index_vars
from kiln.lower.lowerings import (LoweringContext, TensorValue, compute_dtype, register, strided_value,
                                  value_cost)

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


def _ints(values: Sequence[Any]) -> tuple[int, ...] | None:
    try:
        return tuple(int(v) for v in values)
    except TypeError:  # a symbolic size
        return None


def _pair(values: Any) -> tuple[int, int]:
    values = [int(v) for v in values]
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def _small_kind(ctx: LoweringContext, x: TensorValue, weight: TensorValue, transposed: bool, groups: Any) -> str | None:
    meta = ctx.meta
    xs, ws = _ints(x.sizes), _ints(weight.sizes)
    if xs is None or ws is None or not isinstance(meta, torch.Tensor) or not isinstance(groups, int):
        return None
    return small_conv_kind(xs, ws, tuple(meta.shape), groups, transposed, meta.dtype, meta.device)


def _patch_loader(x: TensorValue, stride: tuple[int, int], padding: tuple[int, int],
                  dilation: tuple[int, int]) -> Any:
    """tap(n, c, h_out, w_out, i, j) -> x at tap (i, j) of that output pixel, 0 in the padding."""
    sizes = x.sizes
    dtype = compute_dtype(x.dtype)

    def tap(n: Any, c: Any, ho: Any, wo: Any, i: int, j: int) -> Value:
        h = ho * stride[0] - padding[0] + i * dilation[0]
        w = wo * stride[1] - padding[1] + j * dilation[1]
        value = x.load([n, c, h, w])
        mask: Value | None = None
        for pos, size, pad in ((h, sizes[2], padding[0]), (w, sizes[3], padding[1])):
            if pad:  # without padding every tap of a valid output pixel is inside the image
                ok = ops.op("logical_and", ops.op("ge", Index(pos), ops.constant(0, torch.int64)),
                            ops.op("lt", Index(pos), Index(size)))
                mask = ok if mask is None else ops.op("logical_and", mask, ok)
        return value if mask is None else Masked(mask, value, ops.constant(0, dtype), dtype)

    return tap


def _stored_once(ctx: LoweringContext, x: TensorValue, taps: int) -> TensorValue:
    """x as read by several taps: a lazy body worth more than a load is computed once first."""
    if taps == 1 or x.view is not None or value_cost(x.load(index_vars("i", x.ndim))) <= 4:
        return x
    return ctx.realize(x)


def _gemm_convolution(ctx: LoweringContext, x: TensorValue, weight: TensorValue, bias: Any, stride: Any,
                      padding: Any, dilation: Any) -> TensorValue:
    """A small dense convolution as one GEMM: patches (N*Ho*Wo, Ci*kh*kw) @ weight (Co, Ci*kh*kw)^T,
    whose result is the output in NHWC (declared so, like oneDNN's)."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    n, c_in = x.sizes[0], x.sizes[1]
    c_out, _, kh, kw = weight.sizes
    _, _, h_out, w_out = ctx.out_sizes()
    rows, depth = n * h_out * w_out, c_in * kh * kw
    x = _stored_once(ctx, x, int(kh * kw))
    if int(kh * kw) == 1 and stride == (1, 1) and padding == (0, 0) and is_channels_last(x):
        assert x.view is not None
        patches = strided_value(BufferRef(x.view.name, Layout(x.dtype, (rows, c_in), (c_in, 1), x.view.layout.offset)))
    else:
        tap = _patch_loader(x, stride, padding, dilation)
        shape = (n, h_out, w_out, c_in, kh, kw)
        grid = TensorValue(x.dtype, shape, lambda idx: tap(idx[0], idx[3], idx[1], idx[2], idx[4], idx[5]),
                           origins=x.origins)
        stored = ctx.realize(grid, Layout.contiguous(x.dtype, shape)).view
        assert stored is not None
        patches = strided_value(BufferRef(stored.name, Layout.contiguous(x.dtype, (rows, depth))))
    if weight.view is None or weight.view.layout.strides != contiguous_strides(weight.sizes):
        weight = ctx.realize(weight, Layout.contiguous(weight.dtype, weight.sizes))
    assert weight.view is not None
    # weight (Co, Ci, kh, kw) read as (Ci*kh*kw, Co): the patch columns are in (ci, i, j) order
    matrix = strided_value(BufferRef(weight.view.name, Layout(weight.dtype, (depth, c_out), (1, depth),
                                                              weight.view.layout.offset)))
    saved = ctx.meta
    ctx.meta = torch.empty((int(rows), int(c_out)), dtype=saved.dtype, device="meta")
    try:
        if bias is None:
            out = ctx.extern(aten.mm.default, (patches, matrix), {})
        else:
            out = ctx.extern(aten.addmm.default, (bias, patches, matrix), {})
    finally:
        ctx.meta = saved
    sizes = (n, c_out, h_out, w_out)
    ctx.relaid_out.add(out.view.name)
    return strided_value(BufferRef(out.view.name, Layout(x.dtype, sizes, channels_last_strides(sizes))))


def _depthwise_convolution(ctx: LoweringContext, x: TensorValue, weight: TensorValue, bias: Any, stride: Any,
                           padding: Any, dilation: Any) -> TensorValue:
    """A small depthwise convolution as a lazy value: each output element sums its kh*kw taps
    (unrolled), so the kernel that reads it (BatchNorm's affine map, ReLU6) computes it in place."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    c_in = x.sizes[1]
    c_out, _, kh, kw = (int(s) for s in weight.sizes)
    per_channel = c_out // int(c_in)
    x = _stored_once(ctx, x, kh * kw)
    tap = _patch_loader(x, stride, padding, dilation)
    dtype = compute_dtype(ctx.out_dtype())

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        n, co, ho, wo = idx
        ci = co if per_channel == 1 else FloorDiv(co, sympy.Integer(per_channel))
        acc: Value | None = None if bias is None else ops.cast(bias.load([co]), dtype)
        for i in range(kh):
            for j in range(kw):
                term = ops.op("mul", ops.cast(tap(n, ci, ho, wo, i, j), dtype),
                              ops.cast(weight.load([co, sympy.Integer(0), sympy.Integer(i), sympy.Integer(j)]), dtype))
                acc = term if acc is None else ops.op("add", acc, term)
        assert acc is not None
        return acc

    return TensorValue(ctx.out_dtype(), ctx.out_sizes(), loader, origins=x.origins)


@register(aten.convolution.default)
def convolution(ctx: LoweringContext, x: TensorValue, weight: TensorValue, bias: Any, stride: Any, padding: Any,
                dilation: Any, transposed: bool, output_padding: Any, groups: Any) -> Any:
    rest = (weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    kind = _small_kind(ctx, x, weight, transposed, groups)
    if kind == "gemm":
        return _gemm_convolution(ctx, x, weight, bias, stride, padding, dilation)
    if kind == "depthwise":
        return _depthwise_convolution(ctx, x, weight, bias, stride, padding, dilation)
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
