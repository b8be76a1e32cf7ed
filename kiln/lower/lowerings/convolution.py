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

import operator
from typing import Any, Sequence

import sympy
import torch
import torch.fx

from kiln.lower import conv_layout, ops
from kiln.lower.conv_layout import channels_last_eligible, channels_last_pays, small_conv_kind
from kiln.lower.fold_batch_norm import fold_conv_bn, fold_conv_bn_packed, mkldnn_convolution
from kiln.lower.ir import (BufferRef, FloorDiv, Index, Layout, Load, Masked, Value, contiguous_strides, index_vars,
                          walk)
from kiln.lower.pack_convolution import pack_conv_weight
from kiln.lower.lowerings import (LoweringContext, TensorValue, compute_dtype, register, strided_value,
                                  value_cost)

aten = torch.ops.aten


def channels_last_strides(sizes: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    n, c, h, w = sizes
    return (h * w * c, sympy.Integer(1), w * c, c)


def is_channels_last(tv: TensorValue) -> bool:
    """Whether tv is a 4-d buffer stored NHWC (other ranks, as BatchNorm1d's and 3d's inputs: no)."""
    if tv.view is None or tv.ndim != 4:
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


def _output_saved(ctx: LoweringContext) -> bool:
    """Whether the current node's result is a graph output that the graph reads too: in a training
    forward, a convolution's result saved for the backward (a train-mode BatchNorm's input, whose
    NHWC result is saved as well). Graph outputs keep eager's layout, so each such NHWC result is
    copied back to NCHW (a transposing pass), and the backward gets NCHW anyway: measured on an
    EfficientNet-style training step at one thread, NHWC convolutions whose results were saved made
    the step 15% slower than NCHW ones. A result that is only returned is copied once, as before."""
    node = ctx.node
    users = node.users if node is not None else ()
    return any(u.op == "output" for u in users) and any(u.op != "output" for u in users)


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


def _stored_once(ctx: LoweringContext, x: TensorValue, taps: int, channels_last: bool = False) -> TensorValue:
    """x as read by several taps: a lazy body worth more than a load is computed once first (NHWC
    where the taps read along the channels)."""
    if taps == 1 or x.view is not None or value_cost(x.load(index_vars("i", x.ndim))) <= 4:
        return x
    if channels_last:
        return ctx.realize(x, Layout(x.dtype, x.sizes, channels_last_strides(x.sizes)))
    return ctx.realize(x)


def _patches(ctx: LoweringContext, x: TensorValue, out_hw: tuple[Any, Any], kernel: tuple[Any, Any],
             stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int]) -> TensorValue:
    """x's patches as a stored (N*Ho*Wo, Ci*kh*kw) matrix, columns in (ci, i, j) order (im2col): a
    view of x itself for a 1x1 kernel on NHWC input, else a buffer."""
    n, c_in = x.sizes[0], x.sizes[1]
    kh, kw = kernel
    rows, depth = n * out_hw[0] * out_hw[1], c_in * kh * kw
    x = _stored_once(ctx, x, int(kh * kw))
    if int(kh * kw) == 1 and stride == (1, 1) and padding == (0, 0) and is_channels_last(x):
        assert x.view is not None
        return strided_value(BufferRef(x.view.name, Layout(x.dtype, (rows, c_in), (c_in, 1), x.view.layout.offset)))
    tap = _patch_loader(x, stride, padding, dilation)
    shape = (n, out_hw[0], out_hw[1], c_in, kh, kw)
    grid = TensorValue(x.dtype, shape, lambda idx: tap(idx[0], idx[3], idx[1], idx[2], idx[4], idx[5]),
                       origins=x.origins)
    stored = ctx.realize(grid, Layout.contiguous(x.dtype, shape)).view
    assert stored is not None
    return strided_value(BufferRef(stored.name, Layout.contiguous(x.dtype, (rows, depth))))


def _as_matrix(tv: TensorValue, rows: Any, cols: Any, transposed: bool) -> TensorValue:
    """A stored contiguous tensor read as a (rows, cols) matrix, or as the transpose of (cols, rows)."""
    assert tv.view is not None
    strides = (1, rows) if transposed else (cols, 1)
    return strided_value(BufferRef(tv.view.name, Layout(tv.dtype, (rows, cols), strides, tv.view.layout.offset)))


def _contiguous(ctx: LoweringContext, tv: TensorValue) -> TensorValue:
    if tv.view is None or tv.view.layout.strides != contiguous_strides(tv.sizes):
        return ctx.realize(tv, Layout.contiguous(tv.dtype, tv.sizes))
    return tv


def _nhwc_rows(ctx: LoweringContext, tv: TensorValue) -> TensorValue:
    """A 4-d tensor as the (N*H*W, C) matrix of its NHWC storage (stored so first if it is not)."""
    n, c, h, w = tv.sizes
    if not is_channels_last(tv):
        tv = ctx.realize(tv, Layout(tv.dtype, tv.sizes, channels_last_strides(tv.sizes)))
    assert tv.view is not None
    return strided_value(BufferRef(tv.view.name, Layout(tv.dtype, (n * h * w, c), (c, 1), tv.view.layout.offset)))


def _matmul(ctx: LoweringContext, a: TensorValue, b: TensorValue, bias: Any = None) -> TensorValue:
    """mm (or addmm with a bias row) as an extern, its result a fresh contiguous matrix."""
    saved = ctx.meta
    dtype = a.dtype
    ctx.meta = torch.empty((int(a.sizes[0]), int(b.sizes[1])), dtype=dtype, device="meta")
    try:
        if bias is None:
            return ctx.extern(aten.mm.default, (a, b), {})
        return ctx.extern(aten.addmm.default, (bias, a, b), {})
    finally:
        ctx.meta = saved


def _nhwc_result(ctx: LoweringContext, matrix: TensorValue, sizes: tuple) -> TensorValue:
    """A (N*H*W, C) result read as the (N, C, H, W) tensor it holds in NHWC (declared relaid out)."""
    assert matrix.view is not None
    ctx.relaid_out.add(matrix.view.name)
    return strided_value(BufferRef(matrix.view.name, Layout(matrix.dtype, sizes, channels_last_strides(sizes))))


def _gemm_convolution(ctx: LoweringContext, x: TensorValue, weight: TensorValue, bias: Any, stride: Any,
                      padding: Any, dilation: Any) -> TensorValue:
    """A small dense convolution as one GEMM: patches (N*Ho*Wo, Ci*kh*kw) @ weight (Co, Ci*kh*kw)^T,
    whose result is the output in NHWC (declared so, like oneDNN's)."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    c_out, c_in, kh, kw = weight.sizes
    _, _, h_out, w_out = ctx.out_sizes()
    patches = _patches(ctx, x, (h_out, w_out), (kh, kw), stride, padding, dilation)
    matrix = _as_matrix(_contiguous(ctx, weight), c_in * kh * kw, c_out, transposed=True)
    out = _matmul(ctx, patches, matrix, bias)
    return _nhwc_result(ctx, out, (x.sizes[0], c_out, h_out, w_out))


def reads_channels_last(x: TensorValue) -> bool:
    """Whether x is stored NHWC, or is a value computed from NHWC buffers (a ReLU6 of an NHWC
    convolution's result, not yet stored): what its loads read is contiguous along the channels
    and strided along the columns. Such an x is copied and read in NHWC order, so the copy is one
    streaming pass and the taps load along the channels (in NCHW order each load would jump by
    H * W elements: measured 10x slower on MobileNetV2's depthwise layers). kiln.lower.graph stores
    such a value NHWC too where it is stored for several readers, as eager's pointwise ops keep
    their input's memory format."""
    if is_channels_last(x):
        return True
    if x.view is not None or x.ndim != 4:
        return False
    idx = index_vars("nhwc", 4)
    channels, columns = idx[1], idx[3]
    along_channels = False
    for value in walk(x.load(idx)):
        if not isinstance(value, Load):
            continue
        index = sympy.expand(value.index)
        column_step = index.coeff(columns)
        if column_step == 1:
            return False  # something read NCHW
        if index.coeff(channels) == 1 and column_step != 0:
            along_channels = True
    return along_channels


def _padded(ctx: LoweringContext, x: TensorValue, padding: tuple[int, int], nhwc: bool) -> TensorValue:
    """x with `padding` zeros around its last two dims, stored NHWC where x is read so, else NCHW:
    the taps of a depthwise convolution then read it without a bounds test, which lets the loop over
    channels (NHWC) or columns (NCHW) vectorize."""
    n, c, h, w = x.sizes
    sizes = (n, c, h + 2 * padding[0], w + 2 * padding[1])
    tap = _patch_loader(x, (1, 1), padding, (1, 1))
    padded = TensorValue(x.dtype, sizes, lambda idx: tap(idx[0], idx[1], idx[2], idx[3], 0, 0), origins=x.origins)
    layout = Layout(x.dtype, sizes, channels_last_strides(sizes) if nhwc else contiguous_strides(sizes))
    return ctx.realize(padded, layout)


def _depthwise_convolution(ctx: LoweringContext, x: TensorValue, weight: TensorValue, bias: Any, stride: Any,
                           padding: Any, dilation: Any) -> TensorValue:
    """A small depthwise convolution as a lazy value: each output element sums its kh*kw taps
    (unrolled), so the kernel that reads it (BatchNorm's affine map, ReLU6) computes it in place.
    The input is read from a zero-padded copy, and on NHWC input the weight from a (kh, kw, C)
    copy, so that every tap is a plain load along the vectorized (channel) loop."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    c_in = x.sizes[1]
    c_out, _, kh, kw = (int(s) for s in weight.sizes)
    per_channel = c_out // int(c_in)
    nhwc = reads_channels_last(x)
    if padding != (0, 0):
        x = _padded(ctx, x, padding, nhwc)
        padding = (0, 0)
    else:
        x = _stored_once(ctx, x, kh * kw, channels_last=nhwc)
    if nhwc and per_channel == 1:  # (C, 1, kh, kw) stored as (kh, kw, C): a tap's weights along C
        strides = (sympy.Integer(1), sympy.Integer(kh * kw * c_out), sympy.Integer(kw * c_out), sympy.Integer(c_out))
        if weight.view is None or tuple(weight.view.layout.strides) != strides:
            weight = ctx.realize(weight, Layout(weight.dtype, weight.sizes, strides))
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


def _tap_source(pos: Any, size_out: Any, pad: int, k: int, step: int, dil: int) -> tuple[Any, Value]:
    """For input row `pos` and kernel tap k: the output row that read it through that tap, and the
    condition that one exists, as the backward of a convolution needs."""
    shifted = pos + pad - k * dil
    if step == 1:
        out_pos = shifted
        conds = [ops.op("ge", Index(shifted), ops.constant(0, torch.int64)),
                 ops.op("lt", Index(shifted), Index(size_out))]
    else:
        out_pos = FloorDiv(shifted, sympy.Integer(step))
        conds = [ops.op("ge", Index(shifted), ops.constant(0, torch.int64)),
                 ops.op("eq", Index(shifted - out_pos * step), ops.constant(0, torch.int64)),
                 ops.op("lt", Index(out_pos), Index(size_out))]
    cond = conds[0]
    for c in conds[1:]:
        cond = ops.op("logical_and", cond, c)
    return out_pos, cond


def _scatter_taps(sizes: tuple, out_hw: tuple[Any, Any], kernel: tuple[int, int], stride: tuple[int, int],
                  padding: tuple[int, int], dilation: tuple[int, int], dtype: torch.dtype,
                  term: Any) -> TensorValue:
    """The gradient of a convolution's input as a lazy gather: element (n, c, h, w) sums, over the
    taps (i, j) through which an output pixel (ho, wo) read it, term(n, c, ho, wo, i, j)."""
    compute = compute_dtype(dtype)

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        n, c, h, w = idx
        acc: Value = ops.constant(0, compute)
        for i in range(kernel[0]):
            ho, hok = _tap_source(h, out_hw[0], padding[0], i, stride[0], dilation[0])
            for j in range(kernel[1]):
                wo, wok = _tap_source(w, out_hw[1], padding[1], j, stride[1], dilation[1])
                ok = ops.op("logical_and", hok, wok)
                acc = ops.op("add", acc, Masked(ok, ops.cast(term(n, c, ho, wo, i, j), compute),
                                                ops.constant(0, compute), compute))
        return acc

    return TensorValue(dtype, sizes, loader)


def _gemm_convolution_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, weight: TensorValue,
                               stride: tuple, padding: tuple, dilation: tuple, mask: Sequence[bool]) -> tuple:
    """The backward of `_gemm_convolution`: with G the output gradient as (N*Ho*Wo, Co) rows,
    grad_weight = G^T @ patches(x), grad_input = col2im(G @ weight), grad_bias = G's column sums."""
    n, c_in, h, w = x.sizes
    c_out, _, kh, kw = (int(s) for s in weight.sizes)
    h_out, w_out = grad.sizes[2], grad.sizes[3]
    rows, depth = n * h_out * w_out, c_in * kh * kw
    g = _nhwc_rows(ctx, grad)
    assert g.view is not None
    grad_x = grad_w = grad_b = None
    if mask[1]:
        patches = _patches(ctx, x, (h_out, w_out), (kh, kw), stride, padding, dilation)
        g_t = strided_value(BufferRef(g.view.name, Layout(g.dtype, (c_out, rows), (1, c_out), g.view.layout.offset)))
        flat = _matmul(ctx, g_t, patches)
        assert flat.view is not None
        ctx.relaid_out.add(flat.view.name)  # returned, it takes eager's strides (NHWC on NHWC input)
        grad_w = strided_value(BufferRef(flat.view.name, Layout.contiguous(flat.dtype, weight.sizes)))
    if mask[0]:
        cols = _matmul(ctx, g, _as_matrix(_contiguous(ctx, weight), c_out, depth, transposed=False))
        if kh * kw == 1 and stride == (1, 1) and padding == (0, 0):
            grad_x = _nhwc_result(ctx, cols, tuple(x.sizes))
        else:
            assert cols.view is not None
            grid = strided_value(BufferRef(cols.view.name, Layout.contiguous(cols.dtype, (n, h_out, w_out, c_in, kh, kw))))
            grad_x = _scatter_taps(tuple(x.sizes), (h_out, w_out), (kh, kw), stride, padding, dilation, x.dtype,
                                   lambda b, c, ho, wo, i, j: grid.load([b, ho, wo, c, sympy.Integer(i), sympy.Integer(j)]))
    if mask[2]:
        grad_b = ctx.reduction(grad.dtype, (c_out,), (rows,), "sum", lambda i, r: g.load([r[0], i[0]]))
    return grad_x, grad_w, grad_b


def _depthwise_convolution_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, weight: TensorValue,
                                    stride: tuple, padding: tuple, dilation: tuple, mask: Sequence[bool]) -> tuple:
    """The backward of `_depthwise_convolution`: grad_input gathers each input pixel's taps, grad_weight
    and grad_bias are reductions over (N, Ho, Wo) per output channel (and tap)."""
    n, c_in, h, w = x.sizes
    c_out, _, kh, kw = (int(s) for s in weight.sizes)
    h_out, w_out = grad.sizes[2], grad.sizes[3]
    per_channel = c_out // int(c_in)
    dtype = compute_dtype(grad.dtype)
    grad = _stored_once(ctx, grad, kh * kw * per_channel)
    grad_x = grad_w = grad_b = None
    if mask[0]:
        def term(b: Any, c: Any, ho: Any, wo: Any, i: int, j: int) -> Value:
            acc: Value | None = None
            for m in range(per_channel):
                co = c * per_channel + m
                t = ops.op("mul", ops.cast(grad.load([b, co, ho, wo]), dtype),
                           ops.cast(weight.load([co, sympy.Integer(0), sympy.Integer(i), sympy.Integer(j)]), dtype))
                acc = t if acc is None else ops.op("add", acc, t)
            assert acc is not None
            return acc

        grad_x = _scatter_taps(tuple(x.sizes), (h_out, w_out), (kh, kw), stride, padding, dilation, x.dtype, term)
    if mask[1]:
        tap = _patch_loader(x, stride, padding, dilation)

        def weight_term(i: Sequence[sympy.Expr], r: Sequence[sympy.Expr]) -> Value:
            co = i[0]
            ci = co if per_channel == 1 else FloorDiv(co, sympy.Integer(per_channel))
            return ops.op("mul", ops.cast(grad.load([r[0], co, r[1], r[2]]), dtype),
                          ops.cast(tap(r[0], ci, r[1], r[2], i[2], i[3]), dtype))

        grad_w = ctx.reduction(weight.dtype, tuple(weight.sizes), (n, h_out, w_out), "sum", weight_term)
    if mask[2]:
        grad_b = ctx.reduction(grad.dtype, (c_out,), (n, h_out, w_out), "sum",
                               lambda i, r: grad.load([r[0], i[0], r[1], r[2]]))
    return grad_x, grad_w, grad_b


def _depthwise_backward_channels_last(ctx: LoweringContext, args: tuple) -> Any:
    """oneDNN's depthwise backward on x (and the gradient, which ATen would convert to x's layout)
    stored NHWC: the input's gradient comes back NHWC (declared so); the weight's is declared in
    eager's layout, which `_checked_result` restores (ATen returns it NHWC too: a size-1 dimension's
    stride differs, a copy of a few kh*kw*C elements)."""
    grad, x = _channels_last_input(ctx, args[0]), _channels_last_input(ctx, args[1])
    saved = ctx.meta
    metas = list(saved)
    metas[0] = _channels_last_meta(metas[0])
    ctx.meta = type(saved)(metas)
    try:
        out = ctx.extern(aten.convolution_backward.default, (grad, x) + tuple(args[2:]), {})
    finally:
        ctx.meta = saved
    if isinstance(out[0], TensorValue) and out[0].view is not None:
        ctx.relaid_out.add(out[0].view.name)
    return out


@register(aten.convolution_backward.default)
def convolution_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, weight: TensorValue,
                         bias_sizes: Any, stride: Any, padding: Any, dilation: Any, transposed: bool,
                         output_padding: Any, groups: Any, output_mask: Sequence[bool]) -> Any:
    args = (grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask)
    xs, ws, gs = _ints(x.sizes), _ints(weight.sizes), _ints(grad.sizes)
    metas = [m for m in ctx.meta if isinstance(m, torch.Tensor)] if isinstance(ctx.meta, (tuple, list)) else []
    kind = None
    if xs is not None and ws is not None and gs is not None and metas and isinstance(groups, int):
        kind = small_conv_kind(xs, ws, gs, groups, transposed, metas[0].dtype, metas[0].device, backward=True)
    if kind is None:
        if (conv_layout.DEPTHWISE_BACKWARD_CHANNELS_LAST and metas and xs is not None and gs is not None
                and ws is not None and not transposed and isinstance(groups, int) and groups == xs[1] > 1
                and ws[1] == 1 and ws[2] * ws[3] >= conv_layout.DEPTHWISE_BACKWARD_CHANNELS_LAST_MIN_TAPS
                and channels_last_eligible(metas[0].dtype, metas[0].device, len(xs))):
            return _depthwise_backward_channels_last(ctx, args)
        return ctx.extern(aten.convolution_backward.default, args, {})
    rule = _gemm_convolution_backward if kind == "gemm" else _depthwise_convolution_backward
    return rule(ctx, grad, x, weight, _pair(stride), _pair(padding), _pair(dilation), list(output_mask))


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
                                                                       and not _input_leaves_graph(ctx)
                                                                       and not _output_saved(ctx))):
        if conv_layout.NHWC_WEIGHT_COPY and not transposed:
            rest = (_channels_last_input(ctx, weight),) + rest[1:]
        return _extern_channels_last(ctx, aten.convolution.default, x, rest)
    return ctx.extern(aten.convolution.default, (x,) + rest, {})


def _indices_unread(ctx: LoweringContext) -> bool:
    """Whether only the values of the current node's (values, indices) are read (item 0; an item 1
    that nothing reads may be there)."""
    node = ctx.node
    return node is not None and all(u.op == "call_function" and u.target is operator.getitem
                                    and (u.args[1] == 0 or not u.users) for u in node.users)


def _max_pool_value(ctx: LoweringContext, x: TensorValue, kernel_size: Any, stride: Any = (), padding: Any = 0,
                    dilation: Any = 1, ceil_mode: bool = False) -> TensorValue | None:
    """max_pool2d's values as a lazy value (each output the maximum of its taps, a NaN winning, as
    ATen's kernel; a tap outside the image is -inf, which no value loses to), or None where it does
    not apply (symbolic sizes, a non-float dtype). It fuses with what reads it and with the ReLU or
    BatchNorm before it, where ATen's extern is one more pass over the image (8% of a ShuffleNet-style
    inference call; Inductor lowers it the same way)."""
    meta = ctx.meta[0] if isinstance(ctx.meta, (tuple, list)) else None
    sizes = _ints(x.sizes)
    if (meta is None or sizes is None or len(sizes) != 4 or not x.dtype.is_floating_point
            or not all(isinstance(s, int) for s in meta.shape)):
        return None
    k = _pair(kernel_size)
    st = _pair(stride) if stride else k
    pad, dil = _pair(padding if isinstance(padding, (list, tuple)) else [padding]), _pair(
        dilation if isinstance(dilation, (list, tuple)) else [dilation])
    out_h, out_w = int(meta.shape[2]), int(meta.shape[3])
    if 0 in (*sizes, out_h, out_w):
        return None
    # NHWC where x is read so or is computed here (as for ATen's pooling below): the maximum then runs
    # along the channels; in NCHW its loop runs along a row of few columns at a stride of 2
    nhwc = reads_channels_last(x) or x.view is None
    dtype = compute_dtype(x.dtype)
    # taps past an edge (padding, ceil_mode's last window) read a copy of x with -inf around it, so
    # that no tap needs a bounds test (GCC left the loop of loads under nine lane-invariant masks
    # scalar: 12x slower than the copy and the maximum together, on a ShuffleNet-style stem)
    low = pad
    high = tuple(max(0, (out - 1) * st[d] + (k[d] - 1) * dil[d] - pad[d] - (sizes[2 + d] - 1))
                 for d, out in enumerate((out_h, out_w)))
    if any(low) or any(high):
        src = x
        n, c, h, w = sizes
        padded_sizes = (n, c, h + low[0] + high[0], w + low[1] + high[1])

        def padded_loader(idx: Sequence[sympy.Expr]) -> Value:
            hh, ww = idx[2] - low[0], idx[3] - low[1]
            ok = ops.op("logical_and", ops.op("logical_and", ops.op("ge", Index(hh), ops.constant(0, torch.int64)),
                                                             ops.op("lt", Index(hh), ops.constant(h, torch.int64))),
                        ops.op("logical_and", ops.op("ge", Index(ww), ops.constant(0, torch.int64)),
                               ops.op("lt", Index(ww), ops.constant(w, torch.int64))))
            value = ops.cast(src.load([idx[0], idx[1], hh, ww]), dtype)
            return Masked(ok, value, ops.constant(float("-inf"), dtype), dtype)

        padded_sizes_e = tuple(sympy.Integer(v) for v in padded_sizes)
        x = ctx.realize(TensorValue(x.dtype, padded_sizes_e, padded_loader, origins=x.origins),
                        Layout(x.dtype, padded_sizes_e, channels_last_strides(padded_sizes_e) if nhwc
                               else contiguous_strides(padded_sizes_e)))
    elif x.view is None:  # the taps read a stored x: with a ReLU inlined into each of nine taps, GCC
        # vectorized the loop only outside an OpenMP region (inside, its if-conversion gave up)
        x = ctx.realize(x, Layout(x.dtype, x.sizes, channels_last_strides(x.sizes) if nhwc
                                  else contiguous_strides(x.sizes)))

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        n, c, ho, wo = idx
        acc: Value | None = None
        for i in range(k[0]):
            for j in range(k[1]):
                value = ops.cast(x.load([n, c, ho * st[0] + i * dil[0], wo * st[1] + j * dil[1]]), dtype)
                acc = value if acc is None else ops.op("maximum", acc, value)
        assert acc is not None
        return acc

    value = TensorValue(x.dtype, tuple(sympy.Integer(s) for s in meta.shape), loader, origins=x.origins)
    if nhwc:  # stored NHWC, as ATen's pooling returns it: a reader that wants NCHW (a convolution at
        # few pixels) would otherwise compute it along the columns, a gather at C elements' stride
        stored = ctx.realize(value, Layout(value.dtype, value.sizes, channels_last_strides(value.sizes)))
        assert stored.view is not None
        ctx.relaid_out.add(stored.view.name)  # returned, it is copied out in eager's strides
        return stored
    return value


@register(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx: LoweringContext, x: TensorValue, *rest: Any) -> Any:
    if _indices_unread(ctx):  # inference: no indices to compute
        value = _max_pool_value(ctx, x, *rest)
        if value is not None:
            return value, None
    # NHWC only when that costs no copy (x is computed here, or already NHWC): ATen's NCHW kernel
    # is slow, but a copy of a stored NCHW tensor is not free either
    if _wants_channels_last(ctx, x) and (x.view is None or is_channels_last(x)) and not _input_leaves_graph(ctx):
        return _extern_channels_last(ctx, aten.max_pool2d_with_indices.default, x, tuple(rest))
    return ctx.extern(aten.max_pool2d_with_indices.default, (x,) + tuple(rest), {})


@register(mkldnn_convolution)
def convolution_packed(ctx: LoweringContext, x: TensorValue, weight: TensorValue, *rest: Any) -> Any:
    """A convolution on a weight packed by kiln::fold_conv_bn_packed or kiln::pack_conv_weight: NHWC
    results always; the input is stored NHWC where that pays (the same rule as for ATen's convolution)."""
    if (x.ndim == 4 and (channels_last_pays(int(x.sizes[2] * x.sizes[3]), True) or reads_channels_last(x))
            and not _input_leaves_graph(ctx)):
        x = _channels_last_input(ctx, x)
    return extern_in_layout_of(ctx, mkldnn_convolution, x, (weight,) + rest, True)


@register(fold_conv_bn, fold_conv_bn_packed, pack_conv_weight)
def fold_conv_bn_extern(ctx: LoweringContext, *args: Any) -> Any:
    return ctx.extern(ctx.node.target, args, {})
