"""Lowerings of reductions and the normalizations built from them.

Every reduction becomes a Reduction buffer over (kept dims) x (reduced dims); the pointwise work
before it is inlined into its body and the work after it (mean's divide, softmax's normalize,
layer norm's scale and shift) stays lazy, so the scheduler can put a whole softmax or layer norm in
one kernel. var/std are two-pass (mean, then squared deviations, corrected by the deviations' sum),
which fuses like layer norm.
cumsum/cumprod become Scan buffers (a running value along one dim) with the work before them inlined.
"""
from __future__ import annotations

import operator
import platform
from typing import Any, Callable, Sequence

import sympy
import torch

from kiln.lower import ops
from kiln.lower.checks import IndexCheck, all_of
from kiln.lower.ir import BufferRef, Index, Layout, Scan, Value, contiguous_strides, index_vars
from kiln.lower.lowerings import (LoweringContext, TensorValue, compute_dtype, normalize_dim, register,
                                  strided_value)
from kiln.symbolic.expr import surely_positive

aten = torch.ops.aten


def _dims(x: TensorValue, dim: Any) -> list[int]:
    if x.ndim == 0:  # dim 0 / -1 of a 0-d tensor names the tensor itself
        return []
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({normalize_dim(d, x.ndim) for d in dim})


def keep_dims(tv: TensorValue, dims: Sequence[int], ndim: int) -> TensorValue:
    """Re-insert size-1 dims at `dims` (keepdim=True) as a pure index remap."""
    sizes = list(tv.sizes)
    for d in dims:
        sizes.insert(d, sympy.Integer(1))

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        return tv.load([i for k, i in enumerate(idx) if k not in dims])

    view = None
    if tv.view is not None:
        lay = tv.view.layout
        strides = list(lay.strides)
        for d in dims:
            strides.insert(d, sympy.Integer(1))
        # eager gives a kept size-1 dim the stride a contiguous layout would: the next inner dim's
        # size * stride (1 when innermost), e.g. sum(1, keepdim=True) of (3, 4, 5) -> strides (5, 5, 1)
        for d in sorted(dims, reverse=True):
            strides[d] = strides[d + 1] * sizes[d + 1] if d + 1 < len(sizes) else sympy.Integer(1)
        view = BufferRef(tv.view.name, Layout(lay.dtype, tuple(sizes), tuple(strides), lay.offset))
    return TensorValue(tv.dtype, tuple(sizes), loader, view)


def reduce(ctx: LoweringContext, x: TensorValue, dim: Any, keepdim: bool, rtype: str, dtype: torch.dtype,
           pre: Callable[[Value], Value] = lambda v: v) -> TensorValue:
    """Reduce `x` over `dim` with `rtype`; `pre` is applied to each element (in the accumulator dtype)."""
    dims = _dims(x, dim)
    kept = [d for d in range(x.ndim) if d not in dims]
    acc = compute_dtype(dtype) if rtype not in ("argmax", "argmin", "any", "all") else compute_dtype(x.dtype)
    if rtype in ("any", "all"):
        acc = torch.bool

    def body(i: Sequence[sympy.Expr], r: Sequence[sympy.Expr]) -> Value:
        full: list[sympy.Expr] = [sympy.Integer(0)] * x.ndim
        for d, v in zip(kept, i):
            full[d] = v
        for d, v in zip(dims, r):
            full[d] = v
        return pre(ops.cast(x.load_for(full, dtype), acc))

    out = ctx.reduction(dtype, [x.sizes[d] for d in kept], [x.sizes[d] for d in dims], rtype, body)
    return keep_dims(out, dims, x.ndim) if keepdim else out


def rounded_on_read(tv: Any) -> Any:
    """`tv`, a float16/bfloat16 result of a reduction-built op, rounded to its dtype wherever a later
    op of the same kernel reads it: eager stores the op's result in the half type (summed, divided,
    square-rooted in float32, then rounded once), so `y - y.logsumexp(-1, keepdim=True)` subtracts
    the rounded value. A kernel that fuses the reduction reads its float value, through the buffer's
    view too (`y.sum(-1)[:, None]` rebuilds a loader from it), so the result is lazy: the view is
    dropped. float32 and the other dtypes pass unchanged."""
    if not isinstance(tv, TensorValue) or tv.dtype not in (torch.float16, torch.bfloat16):
        return tv
    inner, half = tv.loader, tv.dtype
    return TensorValue(half, tv.sizes, lambda idx: ops.cast(ops.cast(inner(idx), half), torch.float32),
                       None, tv.origins)


# the ops whose half-type result a lowering computes in float32 over several steps (amax/amin/max/min
# return an element of the input, exact in its type, and are left out)
ROUNDED_OUTPUTS = frozenset({
    aten.sum.dim_IntList, aten.sum.default, aten.prod.dim_int, aten.prod.default, aten.mean.dim,
    aten.mean.default, aten.var.correction, aten.var.dim, aten.std.correction, aten.std.dim,
    aten.var_mean.correction, aten.logsumexp.default, aten._softmax.default, aten._log_softmax.default,
    aten.native_layer_norm.default, aten.linalg_vector_norm.default, aten.cumsum.default, aten.cumprod.default,
})


def numel_of(x: TensorValue, dim: Any) -> sympy.Expr:
    return sympy.Mul(*[x.sizes[d] for d in _dims(x, dim)])


def lazy(tv: TensorValue, dtype: torch.dtype, fn: Callable[..., Value], *others: TensorValue) -> TensorValue:
    """Pointwise over `tv`'s shape of fn(tv, *others) where the others broadcast by keepdim size-1s."""
    def loader(idx: Sequence[sympy.Expr]) -> Value:
        vals = [o.load([sympy.Integer(0) if s == 1 else i for i, s in zip(idx, o.sizes)]) for o in others]
        return ops.cast(fn(tv.load(idx), *vals), compute_dtype(dtype))

    return TensorValue(dtype, tv.sizes, loader)


def scalar_of(expr: sympy.Expr, dtype: torch.dtype) -> Value:
    return ops.cast(Index(expr), dtype) if not expr.is_number else ops.constant(float(expr), dtype)


@register(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx: LoweringContext, x: TensorValue, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorValue:
    return reduce(ctx, x, dim, keepdim, "sum", ctx.out_dtype())


@register(aten.prod.dim_int, aten.prod.default)
def prod(ctx: LoweringContext, x: TensorValue, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorValue:
    return reduce(ctx, x, dim, keepdim, "prod", ctx.out_dtype())


@register(aten.mean.dim, aten.mean.default)
def mean(ctx: LoweringContext, x: TensorValue, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorValue:
    out = ctx.out_dtype()
    s = reduce(ctx, x, dim, keepdim, "sum", out)
    n = numel_of(x, dim)
    return lazy(s, out, lambda v: ops.op("truediv", v, scalar_of(n, v.dtype)))


def without_identity(ctx: LoweringContext, x: TensorValue, dim: Any, kind: str, compute: Callable[[], Any],
                     args: Sequence[Any], kwargs: dict[str, Any] | None = None) -> Any:
    """`compute()`, the lowered reduction (a value or a tuple), of an op that has no identity (max,
    argmax, aminmax, the inf norm: `kind` names it as kiln.lower.checks does), which eager refuses
    over an empty dim (`dim` given) or an empty tensor. A reduced size that is 0 here runs the ATen
    call (`args`, `kwargs`: the rule's own), which raises eager's error when the graph runs. A size
    that may be 0 only at run time (data-dependent, or from an int argument) is checked there: the
    result's loads carry `index_ok(0, size)`, whose failure makes the wrapper raise eager's error."""
    whole = dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0)
    dims = _dims(x, dim)
    sizes = [(0, numel_of(x, None))] if whole else [(d, x.sizes[d]) for d in dims]
    unsure = [(d, size) for d, size in sizes if not surely_positive(size)]
    kept = sympy.Mul(*[x.sizes[d] for d in range(x.ndim) if d not in dims])
    # the check runs where the result is read: an output that may be empty would read nothing
    if any(size.is_number and size == 0 for _, size in sizes) or (unsure and not surely_positive(kept)):
        return ctx.extern(ctx.node.target, tuple(args), kwargs or {}, reason="a reduction over an empty dim")
    out = compute()
    if not unsure:
        return out
    site = f"{kind}_empty" if whole else f"{kind}_empty_dim"

    def checked(tv: TensorValue) -> TensorValue:
        def loader(idx: Sequence[sympy.Expr]) -> Value:
            zero = ops.cast(Index(sympy.Integer(0)), torch.int64)  # a tile in Triton, as indices are
            ok = all_of([ops.op("index_ok", zero, ops.cast(Index(size), torch.int64), param=IndexCheck(site, d))
                         for d, size in unsure])
            v = tv.load(idx)
            return ops.op("where", ok, v, _unlike(v))

        return TensorValue(tv.dtype, tv.sizes, loader)

    return tuple(checked(o) for o in out) if isinstance(out, tuple) else checked(out)


def _unlike(v: Value) -> Value:
    """A value that differs from `v` whatever `v` is, for the branch a failed check takes. With the
    same value in both branches (a constant: an empty reduction's result is its initial value,
    which the compiler can see) the select would fold and the check, a `const` call, be dropped."""
    if v.dtype == torch.bool:
        return ops.op("logical_not", v)
    if v.dtype.is_floating_point:
        return ops.constant(float("nan"), v.dtype)
    return ops.op("bitwise_xor", v, ops.constant(1, v.dtype))


@register(aten.amax.default, aten.max.default)
def amax(ctx: LoweringContext, x: TensorValue, dim: Any = None, keepdim: bool = False) -> TensorValue:
    if ctx.node.target == aten.max.default:
        return without_identity(ctx, x, None, "max", lambda: reduce(ctx, x, None, False, "max", ctx.out_dtype()),
                                (x,))
    return without_identity(ctx, x, dim, "amax", lambda: reduce(ctx, x, dim, keepdim, "max", ctx.out_dtype()),
                            (x, dim, keepdim))


@register(aten.amin.default, aten.min.default)
def amin(ctx: LoweringContext, x: TensorValue, dim: Any = None, keepdim: bool = False) -> TensorValue:
    if ctx.node.target == aten.min.default:
        return without_identity(ctx, x, None, "min", lambda: reduce(ctx, x, None, False, "min", ctx.out_dtype()),
                                (x,))
    return without_identity(ctx, x, dim, "amin", lambda: reduce(ctx, x, dim, keepdim, "min", ctx.out_dtype()),
                            (x, dim, keepdim))


def _arg_reduce(ctx: LoweringContext, x: TensorValue, dim: Any, keepdim: bool, rtype: str) -> TensorValue:
    if dim is None and keepdim:
        dims = list(range(x.ndim))
        return keep_dims(_first_extreme(ctx, x, None, False, rtype), dims, x.ndim)
    return _first_extreme(ctx, x, dim, keepdim, rtype)


def _first_extreme(ctx: LoweringContext, x: TensorValue, dim: Any, keepdim: bool, rtype: str,
                   extreme: TensorValue | None = None) -> TensorValue:
    """argmax / argmin as two reductions that vectorize: the max (min), then the least position
    holding it (the first NaN where the max is NaN), eager's first occurrence. The one-pass
    running (value, position) pair is a serial loop, 3x slower than ATen's max.dim over rows of
    4096 floats; the second pass rereads a row in cache. `extreme`: the max (min) with the reduced
    dims kept, where the caller computed it already (max.dim's values)."""
    if extreme is None:
        extreme = reduce(ctx, x, dim, True, "max" if rtype == "argmax" else "min", x.dtype)
    dims = _dims(x, dim)
    kept = [d for d in range(x.ndim) if d not in dims]
    acc = compute_dtype(x.dtype)
    strides = contiguous_strides([x.sizes[d] for d in dims])

    def body(i: Sequence[sympy.Expr], r: Sequence[sympy.Expr]) -> Value:
        full: list[sympy.Expr] = [sympy.Integer(0)] * x.ndim
        for d, v in zip(kept, i):
            full[d] = v
        at = list(full)
        for d, v in zip(dims, r):
            full[d] = v
        v, e = ops.cast(x.load(full), acc), ops.cast(extreme.load(at), acc)
        hit = ops.op("eq", v, e)
        if acc.is_floating_point:
            hit = ops.op("logical_or", hit, ops.op("logical_and", ops.op("isnan", e), ops.op("isnan", v)))
        position = ops.cast(Index(sum((rv * st for rv, st in zip(r, strides)), sympy.Integer(0))), torch.int64)
        return ops.op("where", hit, position, ops.constant(2 ** 63 - 1, torch.int64))

    out = ctx.reduction(torch.int64, [x.sizes[d] for d in kept], [x.sizes[d] for d in dims], "min", body)
    return keep_dims(out, dims, x.ndim) if keepdim else out


@register(aten.argmax.default)
def argmax(ctx: LoweringContext, x: TensorValue, dim: Any = None, keepdim: bool = False) -> TensorValue:
    return without_identity(ctx, x, dim, "argmax", lambda: _arg_reduce(ctx, x, dim, keepdim, "argmax"),
                            (x, dim, keepdim))


@register(aten.argmin.default)
def argmin(ctx: LoweringContext, x: TensorValue, dim: Any = None, keepdim: bool = False) -> TensorValue:
    return without_identity(ctx, x, dim, "argmin", lambda: _arg_reduce(ctx, x, dim, keepdim, "argmin"),
                            (x, dim, keepdim))


def _indices_read(ctx: LoweringContext) -> bool:
    """Whether anything reads the positions (output 1) of the max.dim / min.dim node being lowered."""
    node = ctx.node
    if node is None:
        return True
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem:
            return True  # the pair used whole
        if user.args[1] != 0 and user.users:
            return True
    return False


def _extreme_and_position(ctx: LoweringContext, x: TensorValue, dim: int, keepdim: bool,
                          rtype: str) -> tuple[TensorValue, TensorValue]:
    """max.dim / min.dim: the extreme, reduced once (kept dims, viewed away without keepdim), and
    its first position only where a reader takes it: `torch.max(x, 2)[0]` (PointNet's pooling) is
    one reduction, as amax, not two plus an argmax pass over the data again."""
    dims = _dims(x, dim)
    extreme = reduce(ctx, x, dim, True, rtype, x.dtype)
    values = extreme if keepdim or not dims else _drop_dims(extreme, dims)
    if not _indices_read(ctx):
        # never loaded, so never computed: the node's unread second output
        return values, TensorValue(torch.int64, values.sizes, lambda idx: ops.constant(0, torch.int64))
    return values, _first_extreme(ctx, x, dim, keepdim, "argmax" if rtype == "max" else "argmin", extreme)


def _drop_dims(tv: TensorValue, dims: Sequence[int]) -> TensorValue:
    """The size-1 dims `dims` of `tv` viewed away (the inverse of keep_dims), as an index remap."""
    sizes = [s for d, s in enumerate(tv.sizes) if d not in dims]

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        it = iter(idx)
        return tv.load([sympy.Integer(0) if d in dims else next(it) for d in range(tv.ndim)])

    return TensorValue(tv.dtype, tuple(sizes), loader)


@register(aten.max.dim)
def max_dim(ctx: LoweringContext, x: TensorValue, dim: int, keepdim: bool = False) -> tuple[TensorValue, TensorValue]:
    return without_identity(ctx, x, dim, "max", lambda: _extreme_and_position(ctx, x, dim, keepdim, "max"),
                            (x, dim, keepdim))


@register(aten.min.dim)
def min_dim(ctx: LoweringContext, x: TensorValue, dim: int, keepdim: bool = False) -> tuple[TensorValue, TensorValue]:
    return without_identity(ctx, x, dim, "min", lambda: _extreme_and_position(ctx, x, dim, keepdim, "min"),
                            (x, dim, keepdim))


@register(aten.aminmax.default)
def aminmax(ctx: LoweringContext, x: TensorValue, *, dim: Any = None, keepdim: bool = False
            ) -> tuple[TensorValue, TensorValue]:
    return without_identity(ctx, x, dim, "aminmax", lambda: (
        reduce(ctx, x, dim, keepdim, "min", x.dtype), reduce(ctx, x, dim, keepdim, "max", x.dtype)),
        (x,), {"dim": dim, "keepdim": keepdim})


@register(aten.any.default, aten.any.dim, aten.any.dims)
def any_(ctx: LoweringContext, x: TensorValue, dim: Any = None, keepdim: bool = False) -> TensorValue:
    return reduce(ctx, x, dim, keepdim, "any", ctx.out_dtype())


@register(aten.all.default, aten.all.dim, aten.all.dims)
def all_(ctx: LoweringContext, x: TensorValue, dim: Any = None, keepdim: bool = False) -> TensorValue:
    return reduce(ctx, x, dim, keepdim, "all", ctx.out_dtype())


def _variance(ctx: LoweringContext, x: TensorValue, dim: Any, correction: Any, keepdim: bool,
              dtype: torch.dtype) -> tuple[TensorValue, TensorValue]:
    """(var, mean) by two passes, both kept lazy for fusion. The second pass is the corrected
    two-pass sum: the squared deviations from the rounded mean m hold n * (mean - m)^2 too, which
    the same pass's sum of the deviations takes back out (sum(d^2) - sum(d)^2 / n). Without it the
    float mean's rounding was of the size of a tiny variance: var over a dim of 2 lost 3e-4
    relative, a row of 4096 around 1000 with spread 1e-3 lost 3e-3 (eager's double Welford: 6e-8)."""
    acc = compute_dtype(dtype)
    n = numel_of(x, dim)
    total = reduce(ctx, x, dim, True, "sum", dtype)
    m = lazy(total, dtype, lambda v: ops.op("truediv", v, scalar_of(n, acc)))
    d = lazy(x, dtype, lambda v, mu: ops.op("sub", ops.cast(v, acc), mu), m)
    dev = lazy(x, dtype, lambda v, mu: ops.op("mul", ops.op("sub", ops.cast(v, acc), mu),
                                               ops.op("sub", ops.cast(v, acc), mu)), m)
    ss = reduce(ctx, dev, dim, keepdim, "sum", dtype)
    sd = reduce(ctx, d, dim, keepdim, "sum", dtype)
    corr = 1 if correction is None else correction
    zero = ops.constant(0, acc)

    def corrected(v: Value, s: Value) -> Value:
        # rounding can leave the difference just under 0 where every element is the same; an
        # overflowed sum of squares stays infinite (inf - inf would be NaN), as eager's double's
        fixed = ops.op("maximum", ops.op("sub", v, ops.op("truediv", ops.op("mul", s, s), scalar_of(n, acc))), zero)
        return ops.op("where", ops.op("isinf", v), v, fixed)

    var = lazy(ss, dtype, lambda v, s: ops.op("truediv", corrected(v, s), ops.op(
        "maximum", ops.op("sub", scalar_of(n, acc), ops.constant(corr, acc)), zero)), sd)
    if not keepdim:
        dims = _dims(x, dim)
        kept = m
        m = TensorValue(kept.dtype, tuple(s for k, s in enumerate(kept.sizes) if k not in dims),
                        lambda idx: kept.load(_unsqueeze_idx(idx, dims, x.ndim)))
    return var, m


def _unsqueeze_idx(idx: Sequence[sympy.Expr], dims: Sequence[int], ndim: int) -> list[sympy.Expr]:
    it = iter(idx)
    return [sympy.Integer(0) if k in dims else next(it) for k in range(ndim)]


@register(aten.var.correction, aten.var.dim)
def var(ctx: LoweringContext, x: TensorValue, dim: Any = None, *args: Any, correction: Any = None,
        keepdim: bool = False) -> TensorValue:
    if args:  # var.dim(x, dim, unbiased, keepdim)
        correction = 1 if args[0] else 0
        keepdim = args[1] if len(args) > 1 else keepdim
    return _variance(ctx, x, dim, correction, keepdim, ctx.out_dtype())[0]


@register(aten.std.correction, aten.std.dim)
def std(ctx: LoweringContext, x: TensorValue, dim: Any = None, *args: Any, correction: Any = None,
        keepdim: bool = False) -> TensorValue:
    v = var(ctx, x, dim, *args, correction=correction, keepdim=keepdim)
    return lazy(v, ctx.out_dtype(), lambda t: ops.op("sqrt", t))


@register(aten.var_mean.correction)
def var_mean(ctx: LoweringContext, x: TensorValue, dim: Any = None, *, correction: Any = None,
             keepdim: bool = False) -> tuple[TensorValue, TensorValue]:
    return _variance(ctx, x, dim, correction, keepdim, ctx.out_dtype(0))


@register(aten.logsumexp.default)
def logsumexp(ctx: LoweringContext, x: TensorValue, dim: Any, keepdim: bool = False) -> TensorValue:
    out = ctx.out_dtype()
    acc = compute_dtype(out)
    m = reduce(ctx, x, dim, True, "max", out)
    # an infinite max would turn exp(x - max) into NaN; ATen shifts by 0 there instead
    shift = lazy(m, out, lambda v: ops.op("where", ops.op("isinf", v), ops.constant(0, acc), v))
    # ATen composes it of ops on tensors of the input's type: a half input rounds x - max, its exp,
    # the sum, its log and the result, each to the half type (float32 has nothing to round)
    rnd: Callable[[Value], Value] = ((lambda v: ops.cast(ops.cast(v, out), acc)) if out != acc else (lambda v: v))
    e = lazy(x, out, lambda v, s: rnd(ops.op("exp", rnd(ops.op("sub", ops.cast(v, acc), s)))), shift)
    s = reduce(ctx, e, dim, True, "sum", out)
    res = lazy(s, out, lambda v, sh: ops.op("add", rnd(ops.op("log", rnd(v))), sh), shift)
    if keepdim:
        return res
    dims = _dims(x, dim)
    return TensorValue(out, tuple(sz for k, sz in enumerate(res.sizes) if k not in dims),
                       lambda idx: res.load(_unsqueeze_idx(idx, dims, x.ndim)))


@register(aten._softmax.default)
def softmax(ctx: LoweringContext, x: TensorValue, dim: int, half_to_float: bool = False) -> TensorValue:
    out = ctx.out_dtype()
    acc = compute_dtype(out)
    m = reduce(ctx, x, dim, True, "max", out)
    # exp(x - max) is stored once (in float) and read back, not computed twice; the scheduler keeps it
    # in a per-thread row buffer when the whole softmax is one kernel
    e = ctx.realize(lazy(x, acc, lambda v, mx: ops.op("exp", ops.op("sub", ops.cast(v, acc), mx)), m))
    # the row sum in float, as ATen's kernels keep it: a buffer of the half type (where the softmax
    # is two kernels, fused with another reduction of x) rounded it
    s = reduce(ctx, e, dim, True, "sum", acc)
    if x.ndim == 0 or normalize_dim(dim, x.ndim) == x.ndim - 1:
        # ATen's last-dim kernel multiplies by the reciprocal of the sum (one divide per row) and
        # rounds once
        inv = lazy(s, out, lambda t: ops.op("reciprocal", t))
        return lazy(e, out, lambda v, r: ops.op("mul", v, r), inv)
    # along another dim ATen divides; for a half type, its vector lanes round once and its scalar
    # tails round each exponential to the half type first (vector_lane says which is which)
    d = normalize_dim(dim, x.ndim)
    lane = vector_lane(ctx, x, d)

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        v = e.load(idx)
        if out in (torch.float16, torch.bfloat16):
            rounded = ops.cast(ops.cast(v, out), acc)
            in_vector = lane(idx)
            v = (rounded if in_vector == ops.constant(False, torch.bool)
                 else ops.op("where", in_vector, v, rounded))
        return ops.op("truediv", v, s.load([sympy.Integer(0) if k == d else i for k, i in enumerate(idx)]))

    return TensorValue(out, x.sizes, loader)


# ATen's vector width in lanes of a 16-bit type by torch.backends.cpu.get_cpu_capability() on x86-64
# (Vectorized<Half> / Vectorized<BFloat16>: 512-bit registers with AVX-512, 256-bit otherwise)
_HALF_LANES = {"AVX512": 32, "AVX2": 16, "DEFAULT": 16}


def vector_lane(ctx: LoweringContext, x: TensorValue, dim: int) -> Callable[[Sequence[sympy.Expr]], Value]:
    """Whether ATen's CPU softmax of a half type along `dim` (not the last) computes the element at
    an index in one of its vectors, which keep the exponentials in float and round once, rather than
    in a scalar tail, which rounds each exponential to the half type first. The split is ATen's
    _vec_softmax for reduced floating types: the outer x inner positions cut evenly over the threads
    (at run time: the kernel reads torch's thread count), each thread's share walked in vectors of the
    ISA's width that stay within one row of `inner` positions."""
    device = getattr(ctx.meta, "device", None)
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    lanes = _HALF_LANES.get(torch.backends.cpu.get_cpu_capability()) if x86 else None
    if device is None or device.type != "cpu" or lanes is None:
        # another ISA's vector widths are not known here: every element as ATen's scalar path
        return lambda idx: ops.constant(False, torch.bool)
    inner = sympy.Integer(1)
    for sz in x.sizes[dim + 1:]:
        inner = inner * sz
    total = inner
    for sz in x.sizes[:dim]:
        total = total * sz

    def predicate(idx: Sequence[sympy.Expr]) -> Value:
        flat, stride = sympy.Integer(0), sympy.Integer(1)
        for k in reversed([k for k in range(x.ndim) if k != dim]):
            flat, stride = flat + idx[k] * stride, stride * x.sizes[k]
        return ops.op("aten_vector_lane", Index(flat), Index(inner), Index(total), param=lanes)

    return predicate


@register(aten._log_softmax.default)
def log_softmax(ctx: LoweringContext, x: TensorValue, dim: int, half_to_float: bool = False) -> TensorValue:
    out = ctx.out_dtype()
    acc = compute_dtype(out)
    m = reduce(ctx, x, dim, True, "max", out)
    e = lazy(x, out, lambda v, mx: ops.op("exp", ops.op("sub", ops.cast(v, acc), mx)), m)
    s = reduce(ctx, e, dim, True, "sum", out)
    if _half_last_dim(out, dim, x.ndim):
        # ATen's last-dim kernel keeps each row's sum and then its log in the half type (rounded)
        def rounded(v: Value) -> Value:
            return ops.cast(ops.cast(v, out), acc)
        return lazy(x, out, lambda v, mx, t: ops.op("sub", ops.op("sub", ops.cast(v, acc), mx),
                                                   rounded(ops.op("log", rounded(t)))), m, s)
    return lazy(x, out, lambda v, mx, t: ops.op("sub", ops.op("sub", ops.cast(v, acc), mx), ops.op("log", t)), m, s)


def _half_last_dim(out: torch.dtype, dim: int, ndim: int) -> bool:
    """Whether ATen's CPU softmax/log_softmax takes its last-dim kernel for a half-type result,
    whose roundings differ from its kernel for the other dims."""
    return out in (torch.float16, torch.bfloat16) and normalize_dim(dim, ndim) == max(ndim, 1) - 1


@register(aten.native_layer_norm.default)
def native_layer_norm(ctx: LoweringContext, x: TensorValue, normalized_shape: Sequence[Any], weight: Any,
                      bias: Any, eps: float) -> tuple[TensorValue, TensorValue, TensorValue]:
    out = ctx.out_dtype(0)
    acc = compute_dtype(out)
    k = len(normalized_shape)
    dims = list(range(x.ndim - k, x.ndim))
    # the statistics' own dtype: float32 for a half input with float32 parameters (CPU's mixed type)
    var_, mean_ = _variance(ctx, x, dims, 0, True, ctx.out_dtype(1))
    rstd = lazy(var_, ctx.out_dtype(2), lambda v: ops.op("rsqrt", ops.op("add", v, ops.constant(eps, acc))))

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        red = [sympy.Integer(0) if d in dims else i for d, i in enumerate(idx)]
        v = ops.op("mul", ops.op("sub", ops.cast(x.load(idx), acc), mean_.load(red)), rstd.load(red))
        if weight is not None:
            v = ops.op("mul", v, ops.cast(weight.load(idx[x.ndim - k:]), acc))
        if bias is not None:
            v = ops.op("add", v, ops.cast(bias.load(idx[x.ndim - k:]), acc))
        return v

    return TensorValue(out, x.sizes, loader), mean_, rstd


@register(aten.linalg_vector_norm.default)
def vector_norm(ctx: LoweringContext, x: TensorValue, ord: float = 2, dim: Any = None, keepdim: bool = False,
                *, dtype: Any = None) -> TensorValue:
    out = ctx.out_dtype()
    acc = compute_dtype(out)
    absx: Callable[[Value], Value] = lambda v: ops.op("abs", v)
    if ord in (float("inf"), float("-inf")):
        rtype, sign = ("max", "") if ord > 0 else ("min", "-")
        return without_identity(ctx, x, dim, f"norm{sign}inf", lambda: reduce(ctx, x, dim, keepdim, rtype, out, absx),
                                (x, ord, dim, keepdim), {"dtype": dtype} if dtype is not None else {})
    if ord == 0:
        return reduce(ctx, x, dim, keepdim, "sum", out, lambda v: ops.cast(ops.op("ne", v, ops.constant(0, acc)), acc))
    if ord == 1:
        return reduce(ctx, x, dim, keepdim, "sum", out, absx)
    if ord == 2:
        s = reduce(ctx, x, dim, keepdim, "sum", out, lambda v: ops.op("mul", v, v))
        return lazy(s, out, lambda v: ops.op("sqrt", v))
    p = ops.constant(ord, acc)
    s = reduce(ctx, x, dim, keepdim, "sum", out, lambda v: ops.op("pow", ops.op("abs", v), p))
    return lazy(s, out, lambda v: ops.op("pow", v, ops.constant(1.0 / ord, acc)))


def _scan_acc(dtype: torch.dtype) -> torch.dtype:
    """The running value's type, as ATen's CPU cumulative kernels pick it: double for float32 and
    float64, float for half types, int64 for integers."""
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return torch.float64 if dtype.is_floating_point else torch.int64


def scan(ctx: LoweringContext, x: TensorValue, dim: int, scan_type: str) -> TensorValue:
    """A Scan buffer: the pointwise work producing `x` is inlined into its body."""
    out = ctx.out_dtype()
    if x.ndim == 0:  # the running value of one element is the element
        return lazy(x, out, lambda v: v)
    layout = Layout.contiguous(out, x.sizes)
    body = ops.cast(x.load(index_vars("i", x.ndim)), compute_dtype(out))
    origins = tuple(dict.fromkeys(ctx.pending_origins + ctx.origins))
    buf = ctx.add(Scan(ctx.new_name(), layout, origins, body, normalize_dim(dim, x.ndim), scan_type, _scan_acc(out)))
    return strided_value(BufferRef(buf.name, layout))


@register(aten.cumsum.default)
def cumsum(ctx: LoweringContext, x: TensorValue, dim: int, *, dtype: Any = None) -> TensorValue:
    return scan(ctx, x, dim, "sum")


@register(aten.cumprod.default)
def cumprod(ctx: LoweringContext, x: TensorValue, dim: int, *, dtype: Any = None) -> TensorValue:
    return scan(ctx, x, dim, "prod")
