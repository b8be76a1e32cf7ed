"""Lowerings of elementwise ATen ops: arithmetic, comparisons, where, casts, math and activations.

Each rule promotes its operands the way ATen's TensorIterator does (the output dtype comes from the
node's meta value; comparisons compute in the promoted input dtype) and returns a lazy TensorValue
whose loader broadcasts its inputs, so chains of these ops inline into one loop body.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import sympy
import torch

from kiln.lower import ops
from kiln.lower.ir import Index, Value
from kiln.lower.lowerings import (LoweringContext, TensorValue, broadcast_load, compute_dtype, register)
from kiln.symbolic.expr import is_integral

aten = torch.ops.aten


def _meta_of(a: Any) -> Any:
    if isinstance(a, TensorValue):
        return torch.empty([1] * min(a.ndim, 1), dtype=a.dtype, device="meta")
    if isinstance(a, sympy.Basic):
        return 1 if is_integral(a) else 1.0  # a size, or a float argument (promotes as a Python float)
    return a


def promoted(*args: Any) -> torch.dtype:
    """ATen's result_type over tensors (0-d ones weigh less) and Python scalars."""
    metas = [_meta_of(a) for a in args if a is not None]
    result = metas[0] if isinstance(metas[0], torch.Tensor) else torch.tensor(metas[0]).to("meta")
    dtype = torch.result_type(result, metas[1]) if len(metas) > 1 else result.dtype
    for m in metas[2:]:
        dtype = torch.result_type(torch.empty([1], dtype=dtype, device="meta"), m)
    return dtype


_REDUCED_FLOATS = (torch.float16, torch.bfloat16)


def operand(a: Any, idx: Any, dtype: torch.dtype, promoted_to: torch.dtype | None = None,
            exact: bool = False) -> Value:
    """`a` at `idx` in the compute dtype; `promoted_to` is the dtype the op promotes its inputs to;
    `exact`: an operand of another dtype is not rounded to a half/bfloat16 `promoted_to` first."""
    if isinstance(a, TensorValue):
        value = broadcast_load(a, idx, promoted_to)
        if promoted_to in _REDUCED_FLOATS and not exact and a.dtype != promoted_to and not a.dtype.is_complex:
            # eager converts an integer (or bool) operand to the half/bfloat16 common dtype before
            # the op computes in float32: `int64 / half` sees 70000 as inf, 2049 as 2048
            value = ops.cast(ops.op("to_dtype", ops.cast(value, torch.float32), param=promoted_to), torch.float32)
        return ops.cast(value, dtype)
    if isinstance(a, sympy.Basic):
        return ops.cast(Index(a, torch.int64 if is_integral(a) else torch.float64), dtype)
    if promoted_to in _REDUCED_FLOATS and not exact and isinstance(a, (bool, int, float)):
        a = float(torch.tensor(float(a)).to(promoted_to))  # a Python scalar converts as a 0-d tensor
    return ops.constant(a, dtype)


def pointwise(ctx: LoweringContext, args: list[Any], fn: Callable[..., Value],
              compute: torch.dtype | None = None, scalar_opmath: bool = False,
              round_scalars: bool = False) -> TensorValue:
    """The lazy result of `fn` applied elementwise to `args` broadcast to the node's output shape.
    `scalar_opmath`: ATen's half/bfloat16 kernel (mul, div, floor_divide) reads a one-element second
    operand or a Python scalar as a float32 scalar, unrounded; elsewhere an operand of another dtype
    (integers, a float32 0-d tensor) is rounded to the half dtype as eager casts it, a Python scalar
    only with `round_scalars` (the binary ops measured to round it: add, sub, remainder, comparisons
    ...; lerp's weight and other ops' scalar parameters are read unrounded)."""
    out = ctx.out_dtype()
    sizes = ctx.out_sizes()
    promoted_to = compute or out
    compute = compute_dtype(promoted_to)
    result = compute_dtype(out)
    exact = [(isinstance(a, (bool, int, float)) and not round_scalars)
             or (scalar_opmath and k == 1 and (isinstance(a, (bool, int, float))
                                               or isinstance(a, TensorValue) and all(n == 1 for n in a.sizes)))
             for k, a in enumerate(args)]

    def loader(idx: Any) -> Value:
        value = fn(*[operand(a, idx, compute, promoted_to, e) for a, e in zip(args, exact)])
        if out in _REDUCED_FLOATS:
            # each half op's result as eager stores it, also where the kernel reads it on in float32:
            # `(x * 60000).isinf()` in float16 is True (70000 overflows), in float32 False
            value = ops.op("to_dtype", ops.cast(value, torch.float32), param=out)
        return ops.cast(value, result)

    return TensorValue(out, sizes, loader)


def c(v: float, like: Value) -> Value:
    return ops.constant(v, like.dtype)


# ----------------------------------------------------------------------------- unary math

UNARY = {
    aten.abs.default: "abs", aten.neg.default: "neg", aten.exp.default: "exp", aten.exp2.default: "exp2",
    aten.expm1.default: "expm1", aten.log.default: "log", aten.log2.default: "log2",
    aten.log10.default: "log10", aten.log1p.default: "log1p", aten.sqrt.default: "sqrt",
    aten.rsqrt.default: "rsqrt", aten.sin.default: "sin", aten.cos.default: "cos", aten.tan.default: "tan",
    aten.asin.default: "asin", aten.acos.default: "acos", aten.atan.default: "atan",
    aten.sinh.default: "sinh", aten.cosh.default: "cosh", aten.tanh.default: "tanh",
    aten.asinh.default: "asinh", aten.acosh.default: "acosh", aten.atanh.default: "atanh",
    aten.erf.default: "erf", aten.erfc.default: "erfc", aten.sigmoid.default: "sigmoid",
    aten.floor.default: "floor", aten.ceil.default: "ceil", aten.round.default: "round",
    aten.trunc.default: "trunc", aten.reciprocal.default: "reciprocal", aten.sign.default: "sign",
    aten.sgn.default: "sign", aten.bitwise_not.default: "bitwise_not", aten.lgamma.default: "lgamma",
    aten.frac.default: "frac",
}
PREDICATES = {aten.isnan.default: "isnan", aten.isinf.default: "isinf", aten.logical_not.default: "logical_not",
              aten.signbit.default: "signbit", aten.isfinite.default: "isfinite"}


def _unary_rule(name: str) -> Callable[..., TensorValue]:
    def rule(ctx: LoweringContext, x: TensorValue) -> TensorValue:
        return pointwise(ctx, [x], lambda a: ops.op(name, a))
    return rule


def _predicate_rule(name: str) -> Callable[..., TensorValue]:
    def rule(ctx: LoweringContext, x: TensorValue) -> TensorValue:
        return pointwise(ctx, [x], lambda a: ops.op(name, a), compute=x.dtype)
    return rule


for _overload, _name in UNARY.items():
    register(_overload)(_unary_rule(_name))
for _overload, _name in PREDICATES.items():
    register(_overload)(_predicate_rule(_name))


# ----------------------------------------------------------------------------- binary arithmetic

def _symbolic(alpha: Any) -> bool:
    """An `alpha` that is a symbol (a float argument that changes: an optimizer's lr under a
    scheduler): an operand of the kernel, read when it runs, rather than a constant."""
    return not isinstance(alpha, (int, float))


def _alpha(ctx: LoweringContext, alpha: Any) -> Any:
    """`alpha` as eager's half/bfloat16 add and sub kernels read it: rounded to the output dtype
    (`torch.add(x, y, alpha=0.3)` of float16 multiplies by 0.2998..., measured: 3.8% of a
    (64, 257) float16 output differed by an ulp with 0.3 unrounded)."""
    out = ctx.out_dtype()
    if out in (torch.float16, torch.bfloat16) and isinstance(alpha, float):
        return float(torch.tensor(alpha, dtype=out))
    return alpha


@register(aten.add.Tensor, aten.add.Scalar)
def add(ctx: LoweringContext, a: Any, b: Any, *, alpha: Any = 1) -> TensorValue:
    if alpha == 1:
        return pointwise(ctx, [a, b], ops.binary("add"), round_scalars=True)
    if _symbolic(alpha):
        return pointwise(ctx, [a, b, alpha], lambda x, y, s: ops.op("add", x, ops.op("mul", y, s)))
    alpha = _alpha(ctx, alpha)
    return pointwise(ctx, [a, b], lambda x, y: ops.op("add", x, ops.op("mul", y, c(alpha, y))))


@register(aten.sub.Tensor, aten.sub.Scalar)
def sub(ctx: LoweringContext, a: Any, b: Any, *, alpha: Any = 1) -> TensorValue:
    if alpha == 1:
        return pointwise(ctx, [a, b], ops.binary("sub"), round_scalars=True)
    if _symbolic(alpha):
        return pointwise(ctx, [a, b, alpha], lambda x, y, s: ops.op("sub", x, ops.op("mul", y, s)))
    alpha = _alpha(ctx, alpha)
    return pointwise(ctx, [a, b], lambda x, y: ops.op("sub", x, ops.op("mul", y, c(alpha, y))))


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(ctx: LoweringContext, a: Any, b: Any, *, alpha: Any = 1) -> TensorValue:
    if _symbolic(alpha):
        return pointwise(ctx, [b, a, alpha], lambda x, y, s: ops.op("sub", x, ops.op("mul", y, s)))
    if alpha == 1:
        return pointwise(ctx, [b, a], ops.binary("sub"), round_scalars=True)
    alpha = _alpha(ctx, alpha)
    return pointwise(ctx, [b, a], lambda x, y: ops.op("sub", x, ops.op("mul", y, c(alpha, y))))


@register(aten.mul.Tensor, aten.mul.Scalar)
def mul(ctx: LoweringContext, a: Any, b: Any) -> TensorValue:
    return pointwise(ctx, [a, b], ops.binary("mul"), scalar_opmath=True)


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def div(ctx: LoweringContext, a: Any, b: Any, *, rounding_mode: str | None = None) -> TensorValue:
    if rounding_mode is None:
        return pointwise(ctx, [a, b], ops.binary("truediv"), scalar_opmath=True)
    name = "floordiv" if rounding_mode == "floor" else "truncdiv"
    return pointwise(ctx, [a, b], ops.binary(name), scalar_opmath=True)


@register(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(ctx: LoweringContext, a: Any, b: Any) -> TensorValue:
    return pointwise(ctx, [a, b], ops.binary("floordiv"), scalar_opmath=True)


BINARY = {
    aten.remainder.Tensor: "mod", aten.remainder.Scalar: "mod", aten.fmod.Tensor: "fmod",
    aten.fmod.Scalar: "fmod", aten.maximum.default: "maximum", aten.minimum.default: "minimum",
    aten.fmax.default: "fmax", aten.fmin.default: "fmin", aten.atan2.default: "atan2",
    aten.copysign.Tensor: "copysign", aten.hypot.default: "hypot",
    aten.bitwise_and.Tensor: "bitwise_and", aten.bitwise_and.Scalar: "bitwise_and",
    aten.bitwise_or.Tensor: "bitwise_or", aten.bitwise_or.Scalar: "bitwise_or",
    aten.bitwise_xor.Tensor: "bitwise_xor", aten.bitwise_xor.Scalar: "bitwise_xor",
    aten.bitwise_left_shift.Tensor: "lshift", aten.bitwise_right_shift.Tensor: "rshift",
}
COMPARE = {
    aten.eq.Tensor: "eq", aten.eq.Scalar: "eq", aten.ne.Tensor: "ne", aten.ne.Scalar: "ne",
    aten.lt.Tensor: "lt", aten.lt.Scalar: "lt", aten.le.Tensor: "le", aten.le.Scalar: "le",
    aten.gt.Tensor: "gt", aten.gt.Scalar: "gt", aten.ge.Tensor: "ge", aten.ge.Scalar: "ge",
}
LOGICAL = {aten.logical_and.default: "logical_and", aten.logical_or.default: "logical_or",
           aten.logical_xor.default: "logical_xor"}


def _binary_rule(name: str) -> Callable[..., TensorValue]:
    def rule(ctx: LoweringContext, a: Any, b: Any) -> TensorValue:
        return pointwise(ctx, [a, b], ops.binary(name), round_scalars=True)
    return rule


def _compare_rule(name: str) -> Callable[..., TensorValue]:
    def rule(ctx: LoweringContext, a: Any, b: Any) -> TensorValue:
        return pointwise(ctx, [a, b], ops.binary(name), compute=promoted(a, b), round_scalars=True)
    return rule


def _logical_rule(name: str) -> Callable[..., TensorValue]:
    def rule(ctx: LoweringContext, a: Any, b: Any) -> TensorValue:
        return pointwise(ctx, [a, b], ops.binary(name), compute=torch.bool)
    return rule


for _overload, _name in BINARY.items():
    register(_overload)(_binary_rule(_name))
for _overload, _name in COMPARE.items():
    register(_overload)(_compare_rule(_name))
for _overload, _name in LOGICAL.items():
    register(_overload)(_logical_rule(_name))


_POW_BY_OPS = {3: lambda x: ops.op("mul", ops.op("mul", x, x), x), -1: lambda x: ops.op("reciprocal", x),
               -2: lambda x: ops.op("reciprocal", ops.op("mul", x, x)), -0.5: lambda x: ops.op("rsqrt", x)}


@register(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(ctx: LoweringContext, a: Any, b: Any) -> TensorValue:
    if isinstance(b, (int, float)) and not isinstance(b, bool) and isinstance(a, TensorValue):
        if b == 1:
            return pointwise(ctx, [a], lambda x: x)
        if b == 2:
            return pointwise(ctx, [a], lambda x: ops.op("mul", x, x))
        if b == 0.5 and ctx.out_dtype().is_floating_point:
            return pointwise(ctx, [a], lambda x: ops.op("sqrt", x))
        # eager's other exponents without a pow call (float32/64; x ** 3 in GELU-tanh): as exact as
        # eager's, and a libm powf call per element, slow on a negative base, is gone
        if a.dtype in (torch.float32, torch.float64) and b in _POW_BY_OPS:
            return pointwise(ctx, [a], _POW_BY_OPS[b])
    return pointwise(ctx, [a, b], ops.binary("pow"), round_scalars=True)


# ----------------------------------------------------------------------------- where, clamp, fill

@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx: LoweringContext, cond: Any, a: Any, b: Any) -> TensorValue:
    out_dtype = ctx.out_dtype()
    out = compute_dtype(out_dtype)

    def loader(idx: Any) -> Value:
        return ops.op("where", operand(cond, idx, torch.bool), operand(a, idx, out, out_dtype),
                      operand(b, idx, out, out_dtype))

    return TensorValue(ctx.out_dtype(), ctx.out_sizes(), loader)


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(ctx: LoweringContext, x: TensorValue, mask: Any, value: Any) -> TensorValue:
    return where(ctx, mask, value, x)


def _clamp(x: Value, lo: Value | None, hi: Value | None) -> Value:
    # ATen: min(max(x, lo), hi) with NaN in x kept (maximum/minimum propagate NaN)
    if lo is not None:
        x = ops.op("maximum", x, lo)
    if hi is not None:
        x = ops.op("minimum", x, hi)
    return x


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(ctx: LoweringContext, x: TensorValue, min: Any = None, max: Any = None) -> TensorValue:
    args = [x] + [a for a in (min, max) if a is not None]

    def fn(*vals: Value) -> Value:
        it = iter(vals[1:])
        lo = next(it) if min is not None else None
        hi = next(it) if max is not None else None
        return _clamp(vals[0], lo, hi)

    return pointwise(ctx, args, fn)


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(ctx: LoweringContext, x: TensorValue, lo: Any) -> TensorValue:
    return pointwise(ctx, [x, lo], lambda v, m: _clamp(v, m, None))


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(ctx: LoweringContext, x: TensorValue, hi: Any) -> TensorValue:
    return pointwise(ctx, [x, hi], lambda v, m: _clamp(v, None, m))


@register(aten.hardtanh.default)
def hardtanh(ctx: LoweringContext, x: TensorValue, lo: float = -1.0, hi: float = 1.0) -> TensorValue:
    return pointwise(ctx, [x, lo, hi], _clamp)


@register(aten.nan_to_num.default)
def nan_to_num(ctx: LoweringContext, x: TensorValue, nan: float | None = None, posinf: float | None = None,
               neginf: float | None = None) -> TensorValue:
    info = torch.finfo(x.dtype) if x.dtype.is_floating_point else None
    if info is None:
        return pointwise(ctx, [x], lambda v: v)
    big = info.max if posinf is None else posinf
    small = info.min if neginf is None else neginf
    nanv = 0.0 if nan is None else nan

    def fn(v: Value) -> Value:
        v = ops.op("where", ops.op("isnan", v), c(nanv, v), v)
        inf = ops.op("isinf", v)
        pos = ops.op("gt", v, c(0.0, v))
        return ops.op("where", inf, ops.op("where", pos, c(big, v), c(small, v)), v)

    return pointwise(ctx, [x], fn)


# ----------------------------------------------------------------------------- activations

@register(aten.relu.default)
def relu(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    return pointwise(ctx, [x], ops.unary("relu"))


@register(aten.gelu.default)
def gelu(ctx: LoweringContext, x: TensorValue, *, approximate: str = "none") -> TensorValue:
    def exact(v: Value) -> Value:
        cdf = ops.op("mul", c(0.5, v), ops.op("add", c(1.0, v), ops.op("erf", ops.op("mul", v, c(math.sqrt(0.5), v)))))
        return ops.op("mul", v, cdf)

    def tanh(v: Value) -> Value:
        cube = ops.op("mul", ops.op("mul", v, v), v)
        inner = ops.op("mul", c(math.sqrt(2 / math.pi), v), ops.op("add", v, ops.op("mul", c(0.044715, v), cube)))
        return ops.op("mul", ops.op("mul", c(0.5, v), v), ops.op("add", c(1.0, v), ops.op("tanh", inner)))

    return pointwise(ctx, [x], tanh if approximate == "tanh" else exact)


@register(aten.silu.default)
def silu(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    return pointwise(ctx, [x], lambda v: ops.op("truediv", v, ops.op("add", c(1.0, v), ops.op("exp", ops.op("neg", v)))))


@register(aten.leaky_relu.default)
def leaky_relu(ctx: LoweringContext, x: TensorValue, slope: float = 0.01) -> TensorValue:
    return pointwise(ctx, [x], lambda v: ops.op("where", ops.op("gt", v, c(0, v)), v, ops.op("mul", v, c(slope, v))))


@register(aten.elu.default)
def elu(ctx: LoweringContext, x: TensorValue, alpha: float = 1.0, scale: float = 1.0,
        input_scale: float = 1.0) -> TensorValue:
    def fn(v: Value) -> Value:
        neg = ops.op("mul", ops.op("expm1", ops.op("mul", v, c(input_scale, v))), c(alpha * scale, v))
        return ops.op("where", ops.op("gt", v, c(0, v)), ops.op("mul", v, c(scale, v)), neg)

    return pointwise(ctx, [x], fn)


@register(aten.hardsigmoid.default)
def hardsigmoid(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    return pointwise(ctx, [x], lambda v: ops.op("truediv", _clamp(ops.op("add", v, c(3, v)), c(0, v), c(6, v)), c(6, v)))


@register(aten.hardswish.default)
def hardswish(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    return pointwise(ctx, [x], lambda v: ops.op("truediv", ops.op(
        "mul", v, _clamp(ops.op("add", v, c(3, v)), c(0, v), c(6, v))), c(6, v)))


@register(aten.softplus.default)
def softplus(ctx: LoweringContext, x: TensorValue, beta: float = 1.0, threshold: float = 20.0) -> TensorValue:
    def fn(v: Value) -> Value:
        bx = ops.op("mul", v, c(beta, v))
        soft = ops.op("truediv", ops.op("log1p", ops.op("exp", bx)), c(beta, v))
        return ops.op("where", ops.op("gt", bx, c(threshold, v)), v, soft)

    return pointwise(ctx, [x], fn)


@register(aten.threshold.default)
def threshold(ctx: LoweringContext, x: TensorValue, thresh: float, value: float) -> TensorValue:
    return pointwise(ctx, [x], lambda v: ops.op("where", ops.op("le", v, c(thresh, v)), c(value, v), v))


@register(aten.sigmoid_backward.default)
def sigmoid_backward(ctx: LoweringContext, grad: TensorValue, y: TensorValue) -> TensorValue:
    return pointwise(ctx, [grad, y], lambda g, s: ops.op("mul", g, ops.op("mul", ops.op("sub", c(1, s), s), s)))


@register(aten.tanh_backward.default)
def tanh_backward(ctx: LoweringContext, grad: TensorValue, y: TensorValue) -> TensorValue:
    return pointwise(ctx, [grad, y], lambda g, t: ops.op("mul", g, ops.op("sub", c(1, t), ops.op("mul", t, t))))


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(ctx: LoweringContext, a: TensorValue, b: Any, w: Any) -> TensorValue:
    # ATen's two-sided formula keeps lerp(a, b, 1) == b exactly
    def fn(x: Value, y: Value, t: Value) -> Value:
        diff = ops.op("sub", y, x)
        low = ops.op("add", x, ops.op("mul", t, diff))
        high = ops.op("sub", y, ops.op("mul", diff, ops.op("sub", c(1, t), t)))
        return ops.op("where", ops.op("lt", ops.op("abs", t), c(0.5, t)), low, high)

    return pointwise(ctx, [a, b, w], fn)


# ----------------------------------------------------------------------------- casts, copies, fills

@register(aten._to_copy.default)
def to_copy(ctx: LoweringContext, x: TensorValue, **kwargs: Any) -> TensorValue:
    """A conversion. Half types compute in float32, so a conversion to one that a consumer reads
    in the same kernel must still round to its precision: x.half().float() is not x in eager.
    (torch.compile skips that rounding unless emulate_precision_casts is on; Kiln always does it.)"""
    target = ctx.out_dtype()
    if target in (torch.float16, torch.bfloat16) and x.dtype != target:
        return pointwise(ctx, [x], lambda v: ops.cast(ops.op("to_dtype", v, param=target), torch.float32),
                         compute=x.dtype)
    if x.dtype in (torch.float16, torch.bfloat16) and x.view is None and target != x.dtype:
        # the source is a half-typed value still in a kernel (in float32): round it to its type
        # first, as eager stored it (x.half() * 0.1).float()
        source = x.dtype
        return pointwise(ctx, [x], lambda v: ops.cast(ops.op("to_dtype", v, param=source), torch.float32),
                         compute=x.dtype)
    return pointwise(ctx, [x], lambda v: v, compute=x.dtype)


@register(aten.clone.default, aten.lift_fresh_copy.default)
def clone(ctx: LoweringContext, x: TensorValue, **kwargs: Any) -> TensorValue:
    return pointwise(ctx, [x], lambda v: v)


@register(aten.copy.default)
def copy(ctx: LoweringContext, dst: TensorValue, src: TensorValue, non_blocking: bool = False) -> TensorValue:
    return pointwise(ctx, [src], lambda v: v, compute=src.dtype)


@register(aten.fill.Scalar, aten.full_like.default, aten.fill.Tensor)
def fill_like(ctx: LoweringContext, x: TensorValue, value: Any, **kwargs: Any) -> TensorValue:
    return pointwise(ctx, [value], lambda v: v)


@register(aten.zeros_like.default, aten.empty_like.default)
def zeros_like(ctx: LoweringContext, x: TensorValue, **kwargs: Any) -> TensorValue:
    # empty is filled with zeros: a deterministic choice that costs one store
    return pointwise(ctx, [0], lambda v: v)


@register(aten.ones_like.default)
def ones_like(ctx: LoweringContext, x: TensorValue, **kwargs: Any) -> TensorValue:
    return pointwise(ctx, [1], lambda v: v)


@register(aten.full.default, aten.scalar_tensor.default)
def full(ctx: LoweringContext, size: Any, value: Any = None, **kwargs: Any) -> TensorValue:
    if value is None:  # scalar_tensor(value)
        value = size
    return pointwise(ctx, [value], lambda v: v)


@register(aten.zeros.default, aten.empty.memory_format, aten.empty_strided.default, aten.new_zeros.default,
          aten.new_empty.default, aten.new_empty_strided.default)
def zeros(ctx: LoweringContext, *args: Any, **kwargs: Any) -> TensorValue:
    return pointwise(ctx, [0], lambda v: v)


@register(aten.ones.default, aten.new_ones.default)
def ones(ctx: LoweringContext, *args: Any, **kwargs: Any) -> TensorValue:
    return pointwise(ctx, [1], lambda v: v)


@register(aten.new_full.default)
def new_full(ctx: LoweringContext, x: TensorValue, size: Any, value: Any, **kwargs: Any) -> TensorValue:
    return pointwise(ctx, [value], lambda v: v)


@register(aten.arange.start_step, aten.arange.default, aten.arange.start)
def arange(ctx: LoweringContext, *args: Any, **kwargs: Any) -> TensorValue:
    start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
    out = ctx.out_dtype()
    dt = compute_dtype(out)
    if not out.is_floating_point and isinstance(start, (int, sympy.Basic)) and isinstance(step, (int, sympy.Basic)):
        return TensorValue(out, ctx.out_sizes(), lambda idx: ops.cast(Index(sympy.sympify(start) + idx[0] * step), dt))
    calc = torch.float64

    def loader(idx: Any) -> Value:
        i = ops.cast(Index(idx[0]), calc)
        return ops.cast(ops.op("add", operand(start, idx, calc), ops.op("mul", i, operand(step, idx, calc))), dt)

    return TensorValue(out, ctx.out_sizes(), loader)
