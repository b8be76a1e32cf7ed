"""Lowerings of views and layout ops as index arithmetic: no copies.

A view of a strided buffer stays a strided view (a new Layout over the same storage), so externs
and graph outputs can use it as is; a view of a lazy value remaps the index handed to its loader.
cat and constant_pad_nd become masked loads. Corresponds to the view and layout lowerings of
torch/_inductor/lowering.py and ir.View.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import sympy
import torch

from kiln.lower import ops
from kiln.lower.ir import (BufferRef, FloorDiv, Index, Layout, Masked, ModularIndexing, Value,
                           contiguous_strides)
from kiln.lower.lowerings import (LoweringContext, TensorValue, compute_dtype, normalize_dim, register,
                                  stride_hint, strided_value, to_expr, wrapped_index)

aten = torch.ops.aten
Remap = Callable[[Sequence[sympy.Expr]], list[sympy.Expr]]


def remap(x: TensorValue, sizes: Sequence[sympy.Expr], fn: Remap,
          layout: Callable[[Layout], Layout | None] | None = None) -> TensorValue:
    """A view: new sizes, new index -> old index, and (if x is strided) the new layout."""
    if x.view is not None and layout is not None:
        new = layout(x.view.layout)
        if new is not None:
            return strided_value(BufferRef(x.view.name, new))
    return TensorValue(x.dtype, tuple(sizes), lambda idx: x.load(fn(idx)))


def _divides(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether a divides b (numerically, or as a polynomial factor of symbolic sizes)."""
    if a.is_number and b.is_number:
        return int(b) % int(a) == 0
    return sympy.fraction(sympy.cancel(b / a))[1] == 1


def view_groups(old: Sequence[sympy.Expr], new: Sequence[sympy.Expr]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of old dims with runs of new dims of equal product; size-1 dims are left out."""
    o = [k for k, s in enumerate(old) if s != 1]
    n = [k for k, s in enumerate(new) if s != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(o) and j < len(n):
        go, gn = [o[i]], [n[j]]
        po, pn = old[o[i]], new[n[j]]
        i, j = i + 1, j + 1
        while sympy.expand(po - pn) != 0:
            if _divides(po, pn) and i < len(o):
                po, i = po * old[o[i]], i + 1
                go.append(o[i - 1])
            elif j < len(n):
                pn, j = pn * new[n[j]], j + 1
                gn.append(n[j - 1])
            else:
                raise NotImplementedError(f"view {list(old)} -> {list(new)}")
        groups.append((go, gn))
    return groups


def view_as(x: TensorValue, sizes: Sequence[sympy.Expr]) -> TensorValue:
    sizes = tuple(sympy.sympify(s) for s in sizes)
    if tuple(x.sizes) == sizes:
        return x
    if any(s == 0 for s in sizes):
        # No elements: dims cannot be paired by their products (every product is 0), and nothing
        # will ever be read through the view, so any strides do.
        if x.view is not None:
            lay = Layout.contiguous(x.dtype, sizes)
            return strided_value(BufferRef(x.view.name, Layout(lay.dtype, lay.sizes, lay.strides, x.view.layout.offset)))
        zero = ops.constant(0, compute_dtype(x.dtype))
        return TensorValue(x.dtype, sizes, lambda idx: zero)
    groups = view_groups(x.sizes, sizes)

    def fn(idx: Sequence[sympy.Expr]) -> list[sympy.Expr]:
        out: list[sympy.Expr] = [sympy.Integer(0)] * x.ndim
        for go, gn in groups:
            gs = [sizes[k] for k in gn]
            flat = sum((idx[k] * st for k, st in zip(gn, contiguous_strides(gs))), sympy.Integer(0))
            ostr = contiguous_strides([x.sizes[k] for k in go])
            for pos, (k, st) in enumerate(zip(go, ostr)):
                q = FloorDiv(flat, st)
                out[k] = q if pos == 0 else ModularIndexing(q, x.sizes[k])
        return out

    def layout(lay: Layout) -> Layout | None:
        strides: list[sympy.Expr] = [sympy.Integer(1)] * len(sizes)
        for go, gn in groups:
            for a, b in zip(go, go[1:]):  # the old dims of a group must be one contiguous run
                if sympy.expand(lay.strides[a] - lay.strides[b] * lay.sizes[b]) != 0:
                    return None
            inner = lay.strides[go[-1]]
            for k, st in zip(gn, contiguous_strides([sizes[k] for k in gn])):
                strides[k] = st * inner
        return Layout(lay.dtype, sizes, tuple(strides), lay.offset)

    return remap(x, sizes, fn, layout)


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(ctx: LoweringContext, x: TensorValue, size: Sequence[Any]) -> TensorValue:
    return view_as(x, ctx.out_sizes())


@register(aten.view.dtype)
def view_dtype(ctx: LoweringContext, x: TensorValue, dtype: torch.dtype) -> TensorValue:
    return ctx.extern(aten.view.dtype, [x, dtype], {}, reason="bit reinterpretation")


@register(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def alias(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    return x


@register(aten.permute.default)
def permute(ctx: LoweringContext, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    dims = [normalize_dim(d, x.ndim) for d in dims]
    inverse = [dims.index(k) for k in range(x.ndim)]
    return remap(x, [x.sizes[d] for d in dims], lambda idx: [idx[inverse[k]] for k in range(x.ndim)],
                 lambda lay: Layout(lay.dtype, tuple(lay.sizes[d] for d in dims),
                                    tuple(lay.strides[d] for d in dims), lay.offset))


@register(aten.t.default)
def t(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    return x if x.ndim < 2 else permute(ctx, x, [1, 0])


@register(aten.transpose.int)
def transpose(ctx: LoweringContext, x: TensorValue, a: int, b: int) -> TensorValue:
    dims = list(range(x.ndim))
    if x.ndim == 0:
        return x
    a, b = normalize_dim(a, x.ndim), normalize_dim(b, x.ndim)
    dims[a], dims[b] = dims[b], dims[a]
    return permute(ctx, x, dims)


@register(aten.expand.default)
def expand(ctx: LoweringContext, x: TensorValue, size: Sequence[Any], *, implicit: bool = False) -> TensorValue:
    sizes = ctx.out_sizes()
    lead = len(sizes) - x.ndim

    def fn(idx: Sequence[sympy.Expr]) -> list[sympy.Expr]:
        return [sympy.Integer(0) if s == 1 else i for i, s in zip(idx[lead:], x.sizes)]

    def layout(lay: Layout) -> Layout:
        strides = [sympy.Integer(0)] * lead + [
            sympy.Integer(0) if (s == 1 and n != 1) else st for s, n, st in zip(lay.sizes, sizes[lead:], lay.strides)]
        return Layout(lay.dtype, sizes, tuple(strides), lay.offset)

    return remap(x, sizes, fn, layout)


def _norm_bound(v: Any, size: sympy.Expr) -> sympy.Expr:
    """A slice bound as an index into [0, size]: a negative one counted from the end, clamped. On a
    symbolic size a bound counted from the end may still fall before 0 (x[-512:] of fewer rows):
    clamped by a max the kernel computes, where the trace's own answer is not at hand."""
    v = sympy.sympify(v)
    if v.is_number:
        if v >= sys.maxsize // 2:
            return size
        if v < 0:
            v = v + size
            if not size.is_number:
                return sympy.Max(sympy.Integer(0), v)
        if size.is_number:
            v = sympy.Integer(max(0, min(int(v), int(size))))
    return v


def _traced_begin(ctx: LoweringContext, dim: int) -> sympy.Expr | None:
    """The first index a slice takes along `dim`, as the trace computed it: the storage offset its
    fake result moved by, over the input's stride. On a symbolic size the start clamps to the
    size's range (x[-512:] of s1 rows starts at 0 where the trace guarded s1 < 512, not at s1 - 512)
    and only the trace's guards say which way; None where the metadata does not tell (stride 0)."""
    node = ctx.node
    source = node.args[0] if node is not None and node.args else None
    before = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    after = ctx.meta
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return None
    stride = to_expr(before.stride()[dim])
    if stride == 0:
        return None
    moved = sympy.cancel((to_expr(after.storage_offset()) - to_expr(before.storage_offset())) / stride)
    numerator, denominator = sympy.fraction(moved)
    return sympy.expand(numerator) if denominator == 1 else None


@register(aten.slice.Tensor)
def slice_(ctx: LoweringContext, x: TensorValue, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    sizes = ctx.out_sizes()
    begin = _norm_bound(0 if start is None else start, x.sizes[dim])
    if not begin.is_number or not x.sizes[dim].is_number:
        traced = _traced_begin(ctx, dim)
        begin = traced if traced is not None else begin
    step_ = sympy.sympify(step)

    def fn(idx: Sequence[sympy.Expr]) -> list[sympy.Expr]:
        return [begin + i * step_ if k == dim else i for k, i in enumerate(idx)]

    def layout(lay: Layout) -> Layout:
        strides = list(lay.strides)
        strides[dim] = lay.strides[dim] * step_
        return Layout(lay.dtype, sizes, tuple(strides), lay.offset + begin * lay.strides[dim])

    return remap(x, sizes, fn, layout)


@register(aten.select.int)
def select(ctx: LoweringContext, x: TensorValue, dim: int, index: Any) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    index = wrapped_index(index, x.sizes[dim])
    sizes = [s for k, s in enumerate(x.sizes) if k != dim]

    def fn(idx: Sequence[sympy.Expr]) -> list[sympy.Expr]:
        return list(idx[:dim]) + [index] + list(idx[dim:])

    def layout(lay: Layout) -> Layout:
        return Layout(lay.dtype, tuple(sizes), tuple(s for k, s in enumerate(lay.strides) if k != dim),
                      lay.offset + index * lay.strides[dim])

    return remap(x, sizes, fn, layout)


def _squeeze(x: TensorValue, dims: Sequence[int]) -> TensorValue:
    dims = [d for d in dims if x.sizes[d] == 1]
    sizes = [s for k, s in enumerate(x.sizes) if k not in dims]

    def fn(idx: Sequence[sympy.Expr]) -> list[sympy.Expr]:
        it = iter(idx)
        return [sympy.Integer(0) if k in dims else next(it) for k in range(x.ndim)]

    def layout(lay: Layout) -> Layout:
        return Layout(lay.dtype, tuple(sizes), tuple(s for k, s in enumerate(lay.strides) if k not in dims),
                      lay.offset)

    return remap(x, sizes, fn, layout)


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(ctx: LoweringContext, x: TensorValue, dim: Any = None) -> TensorValue:
    if dim is None:
        dims = list(range(x.ndim))
    else:
        dims = [normalize_dim(d, x.ndim) for d in ([dim] if isinstance(dim, int) else dim)]
    return _squeeze(x, dims)


def unsqueeze_value(x: TensorValue, dim: int) -> TensorValue:
    sizes = list(x.sizes)
    sizes.insert(dim, sympy.Integer(1))

    def layout(lay: Layout) -> Layout:
        strides = list(lay.strides)
        strides.insert(dim, sympy.Integer(1))
        return Layout(lay.dtype, tuple(sizes), tuple(strides), lay.offset)

    return remap(x, sizes, lambda idx: list(idx[:dim]) + list(idx[dim + 1:]), layout)


@register(aten.unsqueeze.default)
def unsqueeze(ctx: LoweringContext, x: TensorValue, dim: int) -> TensorValue:
    return unsqueeze_value(x, normalize_dim(dim, x.ndim + 1))


@register(aten.as_strided.default)
def as_strided(ctx: LoweringContext, x: TensorValue, size: Sequence[Any], stride: Sequence[Any],
               storage_offset: Any = None) -> TensorValue:
    base = ctx.realize(x, _eager_storage_layout(ctx, x))
    assert base.view is not None
    lay = base.view.layout
    # an explicit storage_offset counts from the start of the storage, our layouts from the data pointer
    base_offset = ctx.storage_offsets.get(base.view.name, sympy.Integer(0))
    offset = lay.offset if storage_offset is None else sympy.sympify(storage_offset) - base_offset
    new = Layout(lay.dtype, ctx.out_sizes(), tuple(sympy.sympify(s) for s in stride), offset)
    return strided_value(BufferRef(base.view.name, new))


def _eager_storage_layout(ctx: LoweringContext, x: TensorValue) -> Layout | None:
    """as_strided addresses its input's memory as eager laid it out: an input that is a whole
    tensor of its own (offset 0, dense) which Kiln stores otherwise (a sin of a transposed input,
    stored contiguous) is first stored in eager's strides."""
    node = ctx.node.args[0] if ctx.node is not None and ctx.node.args else None
    meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(meta, torch.Tensor) or meta.layout != torch.strided or to_expr(meta.storage_offset()) != 0:
        return None
    sizes = [to_expr(v) for v in meta.shape]
    strides = [to_expr(v) for v in meta.stride()]
    hints = [stride_hint(v) for v in meta.stride()]
    dense = sympy.Integer(1)
    for d in sorted(range(len(sizes)), key=lambda d: hints[d]):
        if sizes[d] != 1 and sympy.expand(strides[d] - dense) != 0:
            return None
        dense = dense * sizes[d]
    if x.view is not None and x.view.layout.offset == 0 and all(
            sizes[d] == 1 or sympy.expand(a - b) == 0 for d, (a, b) in enumerate(zip(x.view.layout.strides, strides))):
        return None  # already stored so
    return Layout(x.dtype, tuple(sizes), tuple(strides))


@register(aten.split.Tensor, aten.split_with_sizes.default)
def split(ctx: LoweringContext, x: TensorValue, split: Any, dim: int = 0) -> tuple[TensorValue, ...]:
    dim = normalize_dim(dim, x.ndim)
    parts = [ctx.out_sizes(k)[dim] for k in range(len(ctx.meta))]
    out, start = [], sympy.Integer(0)
    for k, n in enumerate(parts):
        out.append(_narrow(x, dim, start, n))
        start = start + n
    return tuple(out)


def _narrow(x: TensorValue, dim: int, start: sympy.Expr, length: sympy.Expr) -> TensorValue:
    sizes = list(x.sizes)
    sizes[dim] = length

    def layout(lay: Layout) -> Layout:
        return Layout(lay.dtype, tuple(sizes), lay.strides, lay.offset + start * lay.strides[dim])

    return remap(x, sizes, lambda idx: [i + start if k == dim else i for k, i in enumerate(idx)], layout)


@register(aten.unbind.int)
def unbind(ctx: LoweringContext, x: TensorValue, dim: int = 0) -> tuple[TensorValue, ...]:
    return tuple(select(ctx, x, dim, k) for k in range(int(x.sizes[normalize_dim(dim, x.ndim)])))


@register(aten.flip.default)
def flip(ctx: LoweringContext, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    dims = [normalize_dim(d, x.ndim) for d in dims]
    return TensorValue(x.dtype, x.sizes, lambda idx: x.load(
        [x.sizes[k] - 1 - i if k in dims else i for k, i in enumerate(idx)]))


@register(aten.roll.default)
def roll(ctx: LoweringContext, x: TensorValue, shifts: Sequence[int], dims: Sequence[int] = ()) -> TensorValue:
    if not dims:
        flat = view_as(x, [sympy.Mul(*x.sizes)])
        return view_as(roll(ctx, flat, shifts, [0]), x.sizes)
    moves = {normalize_dim(d, x.ndim): s for d, s in zip(dims, shifts) if x.sizes[normalize_dim(d, x.ndim)] != 0}

    def fn(idx: Sequence[sympy.Expr]) -> list[sympy.Expr]:
        out = []
        for k, i in enumerate(idx):
            if k in moves:
                size = x.sizes[k]
                i = ModularIndexing(i + size - (moves[k] % size if size.is_number else moves[k]), size)
            out.append(i)
        return out

    return TensorValue(x.dtype, x.sizes, lambda idx: x.load(fn(idx)))


@register(aten.repeat.default)
def repeat(ctx: LoweringContext, x: TensorValue, repeats: Sequence[Any]) -> TensorValue:
    sizes = ctx.out_sizes()
    lead = len(sizes) - x.ndim
    return TensorValue(x.dtype, sizes, lambda idx: x.load(
        [ModularIndexing(i, s) for i, s in zip(idx[lead:], x.sizes)]))


@register(aten.cat.default)
def cat(ctx: LoweringContext, tensors: Sequence[TensorValue], dim: int = 0) -> TensorValue:
    sizes = ctx.out_sizes()
    dim = normalize_dim(dim, len(sizes))
    # ATen skips 1-d empty inputs whatever the dim (legacy behaviour)
    parts = [t for t in tensors if not (t.ndim == 1 and t.sizes[0] == 0)]
    dtype = compute_dtype(ctx.out_dtype())

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        starts, acc = [], sympy.Integer(0)
        for p in parts:
            starts.append(acc)
            acc = acc + p.sizes[dim]
        shifted = [[i - starts[k] if d == dim else i for d, i in enumerate(idx)] for k in range(len(parts))]
        value = ops.cast(parts[-1].load(shifted[-1]), dtype)
        for k in range(len(parts) - 2, -1, -1):
            inside = ops.op("lt", Index(idx[dim]), Index(starts[k + 1]))
            value = Masked(inside, ops.cast(parts[k].load(shifted[k]), dtype), value, dtype)
        return value

    return TensorValue(ctx.out_dtype(), sizes, loader)


@register(aten.constant_pad_nd.default)
def constant_pad_nd(ctx: LoweringContext, x: TensorValue, pad: Sequence[Any], value: float = 0) -> TensorValue:
    sizes = ctx.out_sizes()
    dtype = compute_dtype(x.dtype)
    lefts = {x.ndim - 1 - k: sympy.sympify(pad[2 * k]) for k in range(len(pad) // 2)}

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        src = [i - lefts.get(d, 0) for d, i in enumerate(idx)]
        mask: Value | None = None
        for d in lefts:
            ok = ops.op("logical_and", ops.op("ge", Index(src[d]), ops.constant(0, torch.int64)),
                        ops.op("lt", Index(src[d]), Index(x.sizes[d])))
            mask = ok if mask is None else ops.op("logical_and", mask, ok)
        if mask is None:
            return x.load(src)
        return Masked(mask, ops.cast(x.load(src), dtype), ops.constant(value, dtype), dtype)

    return TensorValue(x.dtype, sizes, loader)
