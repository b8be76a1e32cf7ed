"""Lowerings of data-dependent indexing, scatters and random numbers.

Gathers (index, gather, embedding, index_select) are loads whose address has an indirect part: a
loaded int64 times the source's stride (`Load.extra`). Scatters copy their input into a fresh buffer
and then store (or add) into it in place with a Scatter record. Random ops draw from a
counter-based generator keyed by (seed, element number), so results do not depend on threads.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import sympy
import torch

from kiln.lower import ops
from kiln.lower.checks import all_of, checked_index
from kiln.lower.ir import Index, Layout, Load, Masked, ModularIndexing, Scatter, Value, contiguous_strides
from kiln.lower.lowerings import (LoweringContext, TensorValue, broadcast_load, broadcast_sizes, compute_dtype,
                                  dense_layout, normalize_dim, register, strided_value, to_expr, wrapped_index)

aten = torch.ops.aten


def _indirect_offset(lay: Layout, indirect: dict[int, Value], op: str) -> tuple[Value, Value]:
    """The element offset of the loaded indices (each made non-negative where `op` wraps negative
    ones) and the condition that all are in bounds, checked the way eager checks `op`. Along a dim
    of known non-zero size a failed index becomes 0, so the offset stays inside the tensor."""
    extra: Value | None = None
    conditions: list[Value] = []
    # aten.index / index_put name the n-th index tensor in their error (x[:, :, i]: "dimension 0")
    named = {d: n for n, d in enumerate(sorted(indirect))} if op in ("index", "index_put") else None
    for d, v in indirect.items():
        ok, v = checked_index(v, lay.sizes[d], op, d if named is None else named[d])
        conditions.append(ok)
        if _known_nonempty(lay.sizes[d]):
            v = ops.op("where", ok, v, ops.constant(0, torch.int64))
        term = ops.op("mul", v, ops.cast(Index(lay.strides[d]), torch.int64))
        extra = term if extra is None else ops.op("add", extra, term)
    assert extra is not None
    return extra, all_of(conditions)


def _known_nonempty(size: sympy.Expr) -> bool:
    return bool(size.is_number and size > 0)


def indirect_load(ctx: LoweringContext, x: TensorValue, idx: Sequence[sympy.Expr],
                  indirect: dict[int, Value], op: str) -> Value:
    """x[idx] where the dims in `indirect` take loaded index values instead of idx; an index out of
    bounds reads element 0 of its dim, or nothing where the dim may be empty, and makes the wrapper
    raise eager's error for `op`."""
    assert x.view is not None
    lay = x.view.layout
    direct = [sympy.Integer(0) if d in indirect else i for d, i in enumerate(idx)]
    extra, in_bounds = _indirect_offset(lay, indirect, op)
    dtype = compute_dtype(lay.dtype)
    load = Load(x.view.name, lay.index(direct), dtype, extra)
    if all(_known_nonempty(lay.sizes[d]) and lay.strides[d] != 0 for d in indirect):
        return load  # an unconditional load vectorizes; a masked one (a branch around it) does not
    # (along a stride-0 dim of an expanded view the offset folds to 0 and, with it, the check that
    # feeds it: the mask keeps the check alive, so x.expand(4, 3)[4] raises as in eager)
    return Masked(in_bounds, load, ops.constant(0, dtype), dtype)


@register(aten.gather.default)
def gather(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, *, sparse_grad: bool = False) -> TensorValue:
    x = ctx.realize(x)
    dim = normalize_dim(dim, x.ndim)
    return TensorValue(x.dtype, index.sizes, lambda idx: indirect_load(ctx, x, idx, {dim: index.load(idx)}, "gather"))


@register(aten.index_select.default)
def index_select(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue) -> TensorValue:
    if x.ndim == 0:  # the only valid index is 0
        return TensorValue(x.dtype, ctx.out_sizes(), lambda idx: x.load([]))
    dim = normalize_dim(dim, x.ndim)
    if any(s == 0 for s in x.sizes) and any(s != 0 for s in index.sizes):
        # the result is empty, so a kernel would load (and check) nothing, while eager checks every
        # index: ATen's own call does (a symbolic size is never 0: sizes 0 and 1 are specialized)
        return ctx.extern(aten.index_select.default, (x, dim, index), {}, reason="an empty tensor")
    x = ctx.realize(x)
    one_d = index.ndim == 1
    # eager's CPU kernel raises RuntimeError along dim 1 of a tensor of 2 or more dims, IndexError
    # otherwise
    check = "index_select_dim1" if x.ndim > 1 and dim == 1 else "index_select"
    return TensorValue(x.dtype, ctx.out_sizes(), lambda idx: indirect_load(
        ctx, x, idx, {dim: index.load([idx[dim]] if one_d else [])}, check))


@register(aten.embedding.default)
def embedding(ctx: LoweringContext, weight: TensorValue, indices: TensorValue, *args: Any) -> TensorValue:
    weight = ctx.realize(weight)
    k = indices.ndim
    return TensorValue(weight.dtype, ctx.out_sizes(), lambda idx: indirect_load(
        ctx, weight, [sympy.Integer(0), idx[k]], {0: indices.load(idx[:k])}, "embedding"))


def _index_plan(x: TensorValue, indices: Sequence[TensorValue | None]) -> tuple[list[int], tuple, bool]:
    """Which dims are indexed, the broadcast shape of the index tensors, and whether that block
    replaces the indexed dims in place (adjacent indexed dims) or moves to the front."""
    dims = [d for d, t in enumerate(indices) if t is not None]
    shape = broadcast_sizes(*[indices[d].sizes for d in dims])  # type: ignore[union-attr]
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    return dims, shape, adjacent


def _split_index(x: TensorValue, indices: Sequence[TensorValue | None], idx: Sequence[sympy.Expr]):
    dims, shape, adjacent = _index_plan(x, indices)
    nb = len(shape)
    start = dims[0] if adjacent else 0
    bidx = list(idx[start:start + nb])
    rest = list(idx[:start]) + list(idx[start + nb:])
    direct: list[sympy.Expr] = []
    it = iter(rest)
    for d in range(x.ndim):
        direct.append(sympy.Integer(0) if d in dims else next(it))
    loaded = {d: broadcast_load(indices[d], bidx) for d in dims}  # type: ignore[arg-type]
    return direct, loaded


@register(aten.index.Tensor)
def index(ctx: LoweringContext, x: TensorValue, indices: Sequence[TensorValue | None]) -> TensorValue:
    if any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices):
        raise NotImplementedError("boolean mask indexing has a data-dependent shape")
    x = ctx.realize(x)
    indices = list(indices) + [None] * (x.ndim - len(indices))

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        direct, loaded = _split_index(x, indices, idx)
        return indirect_load(ctx, x, direct, loaded, "index")

    return TensorValue(x.dtype, ctx.out_sizes(), loader)


@register(aten.take.default)
def take(ctx: LoweringContext, x: TensorValue, index: TensorValue) -> TensorValue:
    """x.flatten()[index] (-numel <= i < numel), raising eager's own error: the index counts
    elements of the flattened tensor. A strided input is copied row-major first."""
    x = ctx.realize(x)
    assert x.view is not None
    lay = x.view.layout
    if any(st != c and sz != 1 for sz, st, c in zip(lay.sizes, lay.strides, contiguous_strides(lay.sizes))):
        x = _fresh_copy(ctx, x)
        assert x.view is not None
        lay = x.view.layout
    flat = Layout(lay.dtype, (lay.numel(),), (sympy.Integer(1),), lay.offset)
    assert x.view is not None
    name = x.view.name

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        extra, in_bounds = _indirect_offset(flat, {0: index.load(idx)}, "take")
        dtype = compute_dtype(lay.dtype)
        load = Load(name, flat.offset, dtype, extra)
        return load if _known_nonempty(flat.sizes[0]) else Masked(in_bounds, load, ops.constant(0, dtype), dtype)

    return TensorValue(x.dtype, index.sizes, loader)


def _fresh_copy(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    # eager's out-of-place scatter/index_put/index_fill clone `x` keeping its strides (the meta's)
    meta = ctx.meta
    if isinstance(meta, torch.Tensor) and tuple(to_expr(s) for s in meta.shape) == tuple(x.sizes):
        lay = dense_layout(meta)
        layout = Layout(x.dtype, lay.sizes, lay.strides)
    else:
        layout = Layout.contiguous(x.dtype, x.sizes)
    copy = TensorValue(x.dtype, x.sizes, x.loader)  # without the view, so realize really copies
    return ctx.realize(copy, layout)


def _scatter(ctx: LoweringContext, target: TensorValue, ranges: Sequence[sympy.Expr], direct_of, indirect_of,
             value_of, mode: str | None, op: str) -> TensorValue:
    assert target.view is not None
    lay = target.view.layout
    i = tuple(sympy.Symbol(f"i{k}", integer=True, nonnegative=True) for k in range(len(ranges)))
    direct = direct_of(i)
    extra, in_bounds = _indirect_offset(lay, indirect_of(i), op)
    body = ops.cast(value_of(i), compute_dtype(lay.dtype))
    ctx.add(Scatter(ctx.new_name(), lay, ctx.origins, target.view.name, tuple(ranges), lay.index(direct), extra,
                    body, mode, in_bounds))
    return strided_value(target.view)


@register(aten.scatter.src, aten.scatter.value)
def scatter(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src: Any,
            mode: str | None = None) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    out = _fresh_copy(ctx, x)
    dtype = compute_dtype(x.dtype)
    value = (lambda i: ops.cast(src.load(i), dtype)) if isinstance(src, TensorValue) else (lambda i: ops.constant(src, dtype))
    return _scatter(ctx, out, index.sizes, lambda i: [sympy.Integer(0) if d == dim else v for d, v in enumerate(i)],
                    lambda i: {dim: index.load(i)}, value, mode, "scatter")


@register(aten.scatter_add.default)
def scatter_add(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src: TensorValue) -> TensorValue:
    return _in_float(x, lambda wide: scatter(ctx, wide, dim, index, _rounded(src), mode="add"))


HALF = (torch.float16, torch.bfloat16)


def _in_float(x: TensorValue, add_into: Callable[[TensorValue], TensorValue]) -> TensorValue:
    """An accumulating scatter into `x` that ATen's CPU kernel sums in float32 when `x` is a half
    type (scatter_add, and index_add where it hands over to scatter_add), rounding once at the end:
    the scatter adds into a float32 copy, and the result is that copy rounded to x's type.
    (index_put with accumulate and index_add's own loop round after every element instead: those
    add into the half-typed buffer, see the code generators' half-typed adds.)"""
    if x.dtype not in HALF:
        return add_into(x)
    half = x.dtype
    wide = add_into(TensorValue(torch.float32, x.sizes, _rounded(x).loader))
    return TensorValue(half, x.sizes, lambda idx: ops.cast(ops.op("to_dtype", wide.load(idx), param=half),
                                                           torch.float32))


def _rounded(src: TensorValue) -> TensorValue:
    """A half-typed source as the elements eager adds: rounded to its type (a value still in a
    kernel is float32)."""
    if src.dtype not in HALF or src.view is not None:
        return src
    half = src.dtype
    return TensorValue(half, src.sizes, lambda idx: ops.cast(ops.op("to_dtype", src.load(idx), param=half),
                                                              torch.float32))


@register(aten.index_put.default)
def index_put(ctx: LoweringContext, x: TensorValue, indices: Sequence[TensorValue | None], values: TensorValue,
              accumulate: bool = False) -> TensorValue:
    if any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices):
        raise NotImplementedError("boolean mask index_put has a data-dependent shape")
    out = _fresh_copy(ctx, x)
    indices = list(indices) + [None] * (x.ndim - len(indices))
    dims, shape, adjacent = _index_plan(x, indices)
    rest = [x.sizes[d] for d in range(x.ndim) if d not in dims]
    start = dims[0] if adjacent else 0
    ranges = rest[:start] + list(shape) + rest[start:]
    dtype = compute_dtype(x.dtype)
    return _scatter(ctx, out, ranges, lambda i: _split_index(x, indices, i)[0],
                    lambda i: _split_index(x, indices, i)[1],
                    lambda i: ops.cast(broadcast_load(values, i), dtype), "add" if accumulate else None, "index_put")


@register(aten.index_add.default)
def index_add(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, source: TensorValue,
              alpha: Any = 1) -> TensorValue:
    return _index_add_or_copy(ctx, x, dim, index, source, alpha, "index_add")


@register(aten.index_copy.default)
def index_copy(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, source: TensorValue) -> TensorValue:
    return _index_add_or_copy(ctx, x, dim, index, source, 1, "index_copy")


def _index_add_or_copy(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, source: TensorValue,
                       alpha: Any, op: str) -> TensorValue:
    """x with source's slices added or copied at `index` along dim. Kept whole rather than
    decomposed into index_put, which would accept the negative indices eager rejects here."""
    if x.ndim == 0 or source.ndim != x.ndim or index.ndim > 1:
        raise NotImplementedError(f"{op} of a 0-d tensor or source")  # runs as the ATen call
    dim = normalize_dim(dim, x.ndim)
    check = _index_add_check(op, x.ndim, dim, alpha, index.dtype, x.dtype, source.dtype)
    source = _rounded(source)  # what eager adds (times alpha): the source as stored

    def add_into(target: TensorValue) -> TensorValue:
        out = _fresh_copy(ctx, target)
        dtype = compute_dtype(target.dtype)

        def value(i: Sequence[sympy.Expr]) -> Value:
            v = ops.cast(source.load(i), dtype)
            return v if alpha == 1 else ops.op("mul", v, ops.constant(alpha, dtype))

        return _scatter(ctx, out, source.sizes, lambda i: [sympy.Integer(0) if d == dim else v for d, v in enumerate(i)],
                        lambda i: {dim: index.load([i[dim]] if index.ndim == 1 else [])}, value,
                        "add" if op == "index_add" else None, check)

    if check == "index_add_nd":  # ATen's scatter_add: a half type sums in float32
        return _in_float(x, add_into)
    return add_into(x)


def _index_add_check(op: str, ndim: int, dim: int, alpha: Any, index_dtype: torch.dtype,
                     *dtypes: torch.dtype) -> str:
    """The check kind eager's CPU index_add raises with. Along the first or the last dim of a tensor
    of 2+ dims, with alpha 1, an int64 index and no complex32 operand, ATen hands the work to
    scatter_add, whose check is a RuntimeError; every other case runs its own loop, which raises
    IndexError. (Source and self slices always match here: the meta check rejects anything else.)"""
    scatter_path = (op == "index_add" and ndim > 1 and dim in (0, ndim - 1) and alpha == 1
                    and index_dtype == torch.int64 and torch.complex32 not in dtypes)
    return "index_add_nd" if scatter_path else op


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, value: Any) -> TensorValue:
    """x with `value` at `index` along dim; kept whole (its decomposition goes through index_copy,
    which rejects the negative indices index_fill accepts)."""
    if x.ndim == 0 or index.ndim > 1:
        raise NotImplementedError("index_fill of a 0-d tensor")  # runs as the ATen call
    dim = normalize_dim(dim, x.ndim)
    out = _fresh_copy(ctx, x)
    dtype = compute_dtype(x.dtype)
    ranges = [(index.sizes[0] if index.ndim else sympy.Integer(1)) if d == dim else s for d, s in enumerate(x.sizes)]
    fill = (lambda i: ops.cast(value.load([]), dtype)) if isinstance(value, TensorValue) else (
        lambda i: ops.constant(value, dtype))
    return _scatter(ctx, out, ranges, lambda i: [sympy.Integer(0) if d == dim else v for d, v in enumerate(i)],
                    lambda i: {dim: index.load([i[dim]] if index.ndim == 1 else [])}, fill, None, "index_fill")


@register(aten.slice_scatter.default)
def slice_scatter(ctx: LoweringContext, x: TensorValue, src: TensorValue, dim: int = 0, start: Any = None,
                  end: Any = None, step: int = 1) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    from kiln.lower.lowerings.views import _norm_bound
    begin = _norm_bound(0 if start is None else start, x.sizes[dim])
    stop = _norm_bound(x.sizes[dim] if end is None else end, x.sizes[dim])
    dtype = compute_dtype(x.dtype)

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        i = idx[dim]
        inside = ops.op("logical_and", ops.op("ge", Index(i), Index(begin)), ops.op("lt", Index(i), Index(stop)))
        if step != 1:
            inside = ops.op("logical_and", inside, ops.op("eq", Index(ModularIndexing(i - begin + step * stop, step)),
                                                          ops.constant(0, torch.int64)))
        from kiln.lower.ir import FloorDiv
        sidx = [FloorDiv(i - begin, step) if d == dim else v for d, v in enumerate(idx)]
        return Masked(inside, ops.cast(src.load(sidx), dtype), ops.cast(x.load(idx), dtype), dtype)

    return TensorValue(x.dtype, x.sizes, loader)


@register(aten.select_scatter.default)
def select_scatter(ctx: LoweringContext, x: TensorValue, src: TensorValue, dim: int, index: int) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    at = wrapped_index(index, x.sizes[dim])
    dtype = compute_dtype(x.dtype)

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        hit = ops.op("eq", Index(idx[dim]), Index(at))
        sidx = [v for d, v in enumerate(idx) if d != dim]
        return Masked(hit, ops.cast(src.load(sidx), dtype), ops.cast(x.load(idx), dtype), dtype)

    return TensorValue(x.dtype, x.sizes, loader)


# ----------------------------------------------------------------------------- random

def _random(ctx: LoweringContext, kind: str, sizes: Sequence[sympy.Expr], dtype: torch.dtype) -> TensorValue:
    base = ctx.random_offset
    numel = sympy.Mul(*sizes) if sizes else sympy.Integer(1)
    ctx.random_offset = base + numel
    strides = contiguous_strides(sizes)
    calc = compute_dtype(dtype)

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        counter = Index(base + sum((i * s for i, s in zip(idx, strides)), sympy.Integer(0)))
        return ops.cast(ops.op(kind, counter, param=torch.float32 if calc != torch.float64 else torch.float64), calc)

    return TensorValue(dtype, tuple(sizes), loader)


@register(aten.rand.default, aten.rand_like.default)
def rand(ctx: LoweringContext, *args: Any, **kwargs: Any) -> TensorValue:
    return _random(ctx, "rand", ctx.out_sizes(), ctx.out_dtype())


@register(aten.randn.default, aten.randn_like.default)
def randn(ctx: LoweringContext, *args: Any, **kwargs: Any) -> TensorValue:
    return _random(ctx, "randn", ctx.out_sizes(), ctx.out_dtype())


@register(aten.bernoulli.p)
def bernoulli(ctx: LoweringContext, x: TensorValue, p: float = 0.5, *, generator: Any = None) -> TensorValue:
    r = _random(ctx, "rand", x.sizes, torch.float32)
    dtype = compute_dtype(x.dtype)
    return TensorValue(x.dtype, x.sizes, lambda idx: ops.cast(ops.op("lt", r.load(idx), ops.constant(p, torch.float32)), dtype))


@register(aten.native_dropout.default)
def native_dropout(ctx: LoweringContext, x: TensorValue, p: float, train: bool | None) -> tuple[TensorValue, TensorValue]:
    dtype = compute_dtype(x.dtype)
    if train is False:
        return x, TensorValue(torch.bool, x.sizes, lambda idx: ops.constant(True, torch.bool))
    r = _random(ctx, "rand", x.sizes, torch.float32)

    def keep(idx: Sequence[sympy.Expr]) -> Value:
        return ops.op("lt", r.load(idx), ops.constant(1.0 - p, torch.float32))

    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    out = TensorValue(x.dtype, x.sizes, lambda idx: ops.op(
        "where", keep(idx), ops.op("mul", x.load(idx), ops.constant(scale, dtype)), ops.constant(0, dtype)))
    return out, TensorValue(torch.bool, x.sizes, keep)
