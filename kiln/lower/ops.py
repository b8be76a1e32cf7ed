"""The loop-level op set: the scalar operations a kernel body may apply, one table entry each.

Lowerings build bodies only from these ops (through the constructors below), and every code
generator must give each op a rendering (kiln.lower.codegen.cpp checks its table against OPS).
Arguments of one op always share a dtype: lowerings insert `to_dtype` casts the way ATen promotes.
Corresponds to the `ops.*` handlers of torch/_inductor (V.ops), without the ambient virtualization.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kiln.errors import VerificationError
from kiln.lower.ir import Const, Op, Value


@dataclass(frozen=True)
class OpDef:
    name: str
    arity: int
    result: str  # "same" (dtype of the arguments), "bool", or "param" (the op's dtype parameter)
    doc: str


OPS: dict[str, OpDef] = {}
_STAGE = "lower_to_loop_ir"  # the pass that builds op nodes, named by a VerificationError


def _define(arity: int, result: str, names: str, doc: str) -> None:
    for name in names.split():
        assert name not in OPS, name
        OPS[name] = OpDef(name, arity, result, doc)


_define(1, "same", "neg abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan "
        "sinh cosh tanh asinh acosh atanh erf erfc sigmoid floor ceil round trunc reciprocal sign "
        "relu bitwise_not lgamma frac", "elementwise unary math, NaN in -> NaN out as in ATen")
_define(1, "bool", "isnan isinf isfinite logical_not signbit", "unary predicates")
_define(2, "same", "add sub mul truediv floordiv truncdiv mod fmod pow maximum minimum fmax fmin "
        "atan2 copysign hypot bitwise_and bitwise_or bitwise_xor lshift rshift",
        "binary arithmetic; maximum/minimum propagate NaN, fmax/fmin ignore it; mod is Python's %")
_define(2, "bool", "eq ne lt le gt ge logical_and logical_or logical_xor", "comparisons")
_define(3, "same", "where", "where(cond, a, b): cond is bool, a and b share the result dtype")
_define(1, "param", "to_dtype", "cast to the dtype parameter (C conversion; float->bool is != 0)")
_define(2, "bool", "index_ok", "index_ok(i, size): whether i may index a dim of that size (the op's "
        "kiln.lower.checks.IndexCheck parameter says how); a failure is recorded for the wrapper to raise")
_define(3, "bool", "aten_vector_lane", "aten_vector_lane(p, row, total): whether ATen's CPU kernel that splits "
        "`total` positions (rows of `row`) evenly over torch.get_num_threads() threads computes position p in a "
        "full vector of `param` lanes, not in a row's scalar tail (its roundings differ); C++ only")
_define(1, "param", "rand randn", "counter-based random: arg is the int64 element counter, "
        "the seed comes from the kernel's seed argument plus the op's static offset")


def op(name: str, *args: Value, param: object = None) -> Value:
    """Build one op node, checking arity and that the arguments agree on dtype (explicit checks, so
    that `python -O` keeps them: a lowering that breaks them is a bug, reported as VerificationError)."""
    d = OPS[name]
    if len(args) != d.arity:
        raise VerificationError(_STAGE, f"{name} takes {d.arity} arguments, got {len(args)}")
    if name == "where":
        if args[0].dtype != torch.bool or args[1].dtype != args[2].dtype:
            raise VerificationError(_STAGE, f"where({args[0].dtype}, {args[1].dtype}, {args[2].dtype}): "
                                            "the condition must be bool and the branches share a dtype")
        dtype = args[1].dtype
    elif d.result == "param":
        if not isinstance(param, torch.dtype):
            raise VerificationError(_STAGE, f"{name} needs a dtype parameter, got {param!r}")
        dtype = param
    else:
        if any(a.dtype != args[0].dtype for a in args):
            raise VerificationError(_STAGE, f"{name} arguments disagree on dtype: {[a.dtype for a in args]}")
        dtype = torch.bool if d.result == "bool" else args[0].dtype
    return Op(name, tuple(args), dtype, param)


def cast(v: Value, dtype: torch.dtype) -> Value:
    if v.dtype == dtype:
        return v
    if isinstance(v, Const):
        return constant(v.value, dtype)
    return op("to_dtype", v, param=dtype)


def constant(value: bool | int | float, dtype: torch.dtype) -> Const:
    if dtype == torch.bool:
        return Const(bool(value), dtype)
    if dtype.is_floating_point:
        return Const(float(value), dtype)
    return Const(integer_value(value, dtype), dtype)


def integer_value(value: bool | int | float, dtype: torch.dtype) -> int:
    """`value` converted to the integer dtype as a kernel converts it at run time (the rule of the
    C++ prelude's kiln_to_int32_t/int64_t, which is ATen's on x86-64): a float truncates, NaN and
    values out of range become the minimum of int32 (int8, int16, int32) or int64 (uint8, int64),
    and the narrow types keep the low bits."""
    if isinstance(value, float):
        wide = 64 if dtype in (torch.int64, torch.uint8) else 32
        inside = value == value and -2.0 ** (wide - 1) <= value < 2.0 ** (wide - 1)
        value = int(value) if inside else -(1 << (wide - 1))
    info = torch.iinfo(dtype)
    low = int(value) & ((1 << info.bits) - 1)
    return low - (1 << info.bits) if info.min < 0 and low >= 1 << (info.bits - 1) else low


def unary(name: str) -> Callable[[Value], Value]:
    return lambda x: op(name, x)


def binary(name: str) -> Callable[[Value, Value], Value]:
    return lambda a, b: op(name, a, b)
