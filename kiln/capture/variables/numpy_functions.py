"""numpy functions, operators and ndarray methods traced as torch ops, with numpy's dtype rules.

One table, `NUMPY_FUNCTIONS`, filled by `@numpy_function(np.exp, ...)`: each entry records torch
ops on the arrays' tensors. The result dtype is numpy's own answer: numpy runs the same call on
one-element stand-ins of the same dtypes and ranks (`result_dtype`), inputs are cast to the dtype
the op computes in, and the output to numpy's. A numpy function outside the table called on a
traced array is a graph break naming the function. Corresponds to torch/_numpy (numpy on torch)
and the numpy call rules of torch/_dynamo/variables/misc.py (NumpyVariable).
"""
from __future__ import annotations

import operator
import warnings
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeGuard

import numpy as np
import torch

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.numpy_array import NumpyArrayVariable, torch_dtype
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

Impl = Callable[["Tracer", Any, list[Variable], dict[str, Variable]], Variable]
NUMPY_FUNCTIONS: dict[Any, Impl] = {}


def numpy_function(*fns: Any) -> Callable[[Impl], Impl]:
    """Register `impl(tx, np_fn, args, kwargs)` as the traced form of each numpy function in `fns`."""
    def register(impl: Impl) -> Impl:
        for fn in fns:
            if fn in NUMPY_FUNCTIONS:
                raise ValueError(f"numpy.{fn.__name__} already has a traced form")
            NUMPY_FUNCTIONS[fn] = impl
        return impl
    return register


# ------------------------------------------------------------------------------------ helpers

def _name(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or "numpy"
    if module.split(".")[0] != "numpy" or module.startswith("numpy._") or module.startswith("numpy.core"):
        module = "numpy"  # np.exp is numpy.exp, not numpy._core.umath.exp
    return f"{module}.{getattr(fn, '__name__', fn)}"


def _oracle_arg(v: Variable) -> Any:
    from kiln.capture.variables.sequence import BaseSequenceVariable
    if isinstance(v, NumpyArrayVariable):
        return v.oracle_value()
    if isinstance(v, BaseSequenceVariable):
        return [_oracle_arg(i) for i in v.items]
    return _constant(v)


def _constant(v: Variable) -> Any:
    from kiln.capture.variables.symint import SymIntVariable
    if isinstance(v, SymIntVariable):
        return int(v.specialize())  # a size numpy needs as a number: guarded to its value
    return v.as_python_value()


def result_dtype(fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> np.dtype:
    """The dtype numpy gives `fn(*args, **kwargs)`: numpy runs it on one-element stand-ins."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(*[_oracle_arg(a) for a in args], **{k: _oracle_arg(v) for k, v in kwargs.items()})
    except Unsupported:
        raise
    except Exception as exc:
        raise Unsupported(f"{_name(fn)} raised {type(exc).__name__}: {exc} (raised natively)", kind="numpy") from exc
    return np.asarray(out).dtype


def _is_array(v: Variable) -> TypeGuard[NumpyArrayVariable]:
    return isinstance(v, NumpyArrayVariable)


def _array(fn: Any, v: Variable) -> NumpyArrayVariable:
    """`v` as a traced array: numpy also takes lists and scalars here, which are not traced."""
    if not isinstance(v, NumpyArrayVariable):
        raise Unsupported(f"{_name(fn)} on {v.describe()}", kind="numpy")
    return v


def cast(tx: "Tracer", v: Variable, dtype: np.dtype) -> Variable:
    """`v` as a tensor of `dtype` (python scalars stay scalars: torch treats them as weak too)."""
    if not isinstance(v, NumpyArrayVariable):
        return v
    target = torch_dtype(dtype)
    if v.example.dtype == target:
        return v.tensor()
    return tx.call_op("call_method", "to", [v.tensor(), ConstantVariable(target)], {})


def wrap_out(tx: "Tracer", out: Variable, dtype: np.dtype, scalar: bool) -> NumpyArrayVariable:
    """The op's tensor as numpy's result: cast to numpy's dtype when torch gave another."""
    target = torch_dtype(dtype)
    if out.example.dtype != target:  # type: ignore[attr-defined]
        out = tx.call_op("call_method", "to", [out, ConstantVariable(target)], {})
    return NumpyArrayVariable.of(out, scalar)


def _all_scalars(args: Sequence[Variable]) -> bool:
    return all(a.scalar if isinstance(a, NumpyArrayVariable) else True for a in args)


def _no_kwargs(fn: Any, kwargs: dict[str, Variable], allowed: Sequence[str] = ()) -> None:
    extra = [k for k in kwargs if k not in allowed]
    if extra:
        raise Unsupported(f"{_name(fn)} with keyword arguments {extra}", kind="numpy")


def _pick(args: list[Variable], kwargs: dict[str, Variable], index: int, name: str, default: Any) -> Any:
    if len(args) > index:
        return _constant(args[index])
    if name in kwargs:
        return _constant(kwargs[name])
    return default


# ------------------------------------------------------------------------------------ elementwise

def _elementwise(torch_fn: Any, compute: str = "out") -> Impl:
    """A ufunc: inputs cast to the output dtype (compute="out", so ints divide and exp in float64)
    or to their common dtype (compute="common": comparisons, whose output is bool)."""
    def impl(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        _no_kwargs(fn, kwargs)
        out_dtype = result_dtype(fn, args, {})
        common = np.result_type(*[_oracle_arg(a) for a in args])
        # Computing in the output dtype is what makes ints divide (and exp) in float64; an output
        # that cannot hold the inputs (abs of complex, isnan) is computed in the inputs' dtype.
        work = out_dtype if compute == "out" and np.can_cast(common, out_dtype, "same_kind") else common
        targs = [cast(tx, a, work) for a in args]
        out = tx.call_op("call_function", torch_fn, targs, {})
        return wrap_out(tx, out, out_dtype, _all_scalars(args))
    return impl


_UNARY = {np.exp: torch.exp, np.log: torch.log, np.log2: torch.log2, np.log10: torch.log10,
          np.log1p: torch.log1p, np.expm1: torch.expm1, np.sqrt: torch.sqrt, np.sin: torch.sin,
          np.cos: torch.cos, np.tan: torch.tan, np.arcsin: torch.asin, np.arccos: torch.acos,
          np.arctan: torch.atan, np.sinh: torch.sinh, np.cosh: torch.cosh, np.tanh: torch.tanh,
          np.abs: torch.abs, np.absolute: torch.abs, np.negative: operator.neg, np.floor: torch.floor,
          np.ceil: torch.ceil, np.trunc: torch.trunc, np.sign: torch.sign, np.square: torch.square,
          np.reciprocal: torch.reciprocal, np.isnan: torch.isnan, np.isinf: torch.isinf,
          np.isfinite: torch.isfinite, np.logical_not: torch.logical_not, np.rint: torch.round,
          np.invert: operator.invert, np.exp2: torch.exp2}
_BINARY = {np.add: operator.add, np.subtract: operator.sub, np.multiply: operator.mul,
           np.true_divide: operator.truediv, np.floor_divide: operator.floordiv, np.remainder: operator.mod,
           np.power: operator.pow, np.arctan2: torch.atan2, np.bitwise_and: operator.and_,
           np.bitwise_or: operator.or_, np.bitwise_xor: operator.xor, np.logical_and: torch.logical_and,
           np.logical_or: torch.logical_or, np.logical_xor: torch.logical_xor, np.hypot: torch.hypot}
_COMPARE = {np.less: operator.lt, np.less_equal: operator.le, np.equal: operator.eq,
            np.not_equal: operator.ne, np.greater: operator.gt, np.greater_equal: operator.ge}
_COMMON = {np.isnan, np.isinf, np.isfinite, np.logical_not, np.logical_and, np.logical_or, np.logical_xor}

_ELEMENTWISE: dict[Any, Any] = {**_UNARY, **_BINARY}  # numpy ufunc -> torch function or operator
for _np_fn, _torch_fn in _ELEMENTWISE.items():
    numpy_function(_np_fn)(_elementwise(_torch_fn, "common" if _np_fn in _COMMON else "out"))
for _np_fn, _torch_fn in _COMPARE.items():
    numpy_function(_np_fn)(_elementwise(_torch_fn, "common"))


@numpy_function(np.maximum, np.minimum)
def maximum(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs)
    out_dtype = result_dtype(fn, args, {})
    a, b = (_as_array(tx, v, out_dtype) for v in args)
    out = tx.call_op("call_function", torch.maximum if fn is np.maximum else torch.minimum, [a, b], {})
    return wrap_out(tx, out, out_dtype, _all_scalars(args))


def _as_array(tx: "Tracer", v: Variable, dtype: np.dtype) -> Variable:
    """An array or a python scalar as a tensor of `dtype` (for torch ops that take tensors only)."""
    if isinstance(v, NumpyArrayVariable):
        return cast(tx, v, dtype)
    return tx.call_op("call_function", torch.tensor, [v], {"dtype": ConstantVariable(torch_dtype(dtype))})


@numpy_function(np.clip)
def clip(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("a_min", "a_max", "min", "max"))
    lo = args[1] if len(args) > 1 else kwargs.get("a_min", kwargs.get("min", ConstantVariable(None)))
    hi = args[2] if len(args) > 2 else kwargs.get("a_max", kwargs.get("max", ConstantVariable(None)))
    out_dtype = result_dtype(fn, [args[0], lo, hi], {})
    if any(isinstance(v, NumpyArrayVariable) for v in (lo, hi)):
        raise Unsupported("numpy.clip with array bounds", kind="numpy")
    out = tx.call_op("call_function", torch.clamp, [cast(tx, args[0], out_dtype), lo, hi], {})
    return wrap_out(tx, out, out_dtype, _all_scalars(args[:1]))


@numpy_function(np.where)
def where(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs)
    if len(args) != 3:
        raise Unsupported("numpy.where with one argument (its output size depends on the data)", kind="numpy")
    out_dtype = result_dtype(fn, args, {})
    cond = _as_array(tx, args[0], np.dtype(np.bool_))
    a, b = (_as_array(tx, v, out_dtype) for v in args[1:])
    return wrap_out(tx, tx.call_op("call_function", torch.where, [cond, a, b], {}), out_dtype, False)


@numpy_function(np.matmul, np.dot)
def matmul(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs)
    a, b = args
    if not (_is_array(a) and _is_array(b)) or (fn is np.dot and (a.ndim > 2 or b.ndim > 2)):
        raise Unsupported(f"{_name(fn)} on these operands", kind="numpy")
    out_dtype = result_dtype(fn, args, {})
    out = tx.call_op("call_function", torch.matmul, [cast(tx, a, out_dtype), cast(tx, b, out_dtype)], {})
    return wrap_out(tx, out, out_dtype, out.example.dim() == 0)  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------ reductions

_REDUCTIONS = {np.sum: torch.sum, np.prod: torch.prod, np.mean: torch.mean, np.max: torch.amax,
               np.amax: torch.amax, np.min: torch.amin, np.amin: torch.amin, np.std: torch.std,
               np.var: torch.var, np.argmax: torch.argmax, np.argmin: torch.argmin, np.any: torch.any,
               np.all: torch.all}
_KEEP_INPUT_DTYPE = {np.argmax, np.argmin, np.any, np.all}


@numpy_function(*_REDUCTIONS)
def reduction(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("axis", "keepdims", "ddof", "dtype"))
    a = args[0]
    if not _is_array(a):
        raise Unsupported(f"{_name(fn)} on {a.describe()}", kind="numpy")
    axis = _pick(args, kwargs, 1, "axis", None)
    keepdims = bool(_pick(args, kwargs, 99, "keepdims", False))
    ddof = _pick(args, kwargs, 99, "ddof", 0)
    options = {k: v for k, v in kwargs.items() if k in ("axis", "keepdims", "ddof", "dtype")}
    out_dtype = result_dtype(fn, [a], {**options, **({"axis": ConstantVariable(axis)} if axis is not None else {})})
    t = a.tensor() if fn in _KEEP_INPUT_DTYPE else cast(tx, a, out_dtype)
    torch_fn = _REDUCTIONS[fn]
    extra: dict[str, Variable] = {}
    if fn in (np.std, np.var):
        extra["correction"] = ConstantVariable(ddof)
    if axis is None:
        out = tx.call_op("call_function", torch_fn, [t], extra)
        if keepdims:
            out = tx.call_op("call_method", "reshape", [out, ConstantVariable((1,) * a.ndim)], {})
    else:
        dim = tuple(axis) if isinstance(axis, (tuple, list)) else axis
        if fn in (np.argmax, np.argmin, np.any, np.all) and isinstance(dim, tuple):
            raise Unsupported(f"{_name(fn)} over several axes", kind="numpy")
        out = tx.call_op("call_function", torch_fn, [t], {**extra, "dim": ConstantVariable(dim),
                                                          "keepdim": ConstantVariable(keepdims)})
    return wrap_out(tx, out, out_dtype, out.example.dim() == 0)  # type: ignore[attr-defined]


@numpy_function(np.cumsum, np.cumprod)
def cumulative(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("axis",))
    a = args[0]
    axis = _pick(args, kwargs, 1, "axis", None)
    out_dtype = result_dtype(fn, [a], {} if axis is None else {"axis": ConstantVariable(axis)})
    t = cast(tx, a, out_dtype)
    if axis is None:
        t = tx.call_op("call_method", "reshape", [t, ConstantVariable(-1)], {})
        axis = 0
    out = tx.call_op("call_function", torch.cumsum if fn is np.cumsum else torch.cumprod,
                     [t, ConstantVariable(axis)], {})
    return wrap_out(tx, out, out_dtype, False)


# ------------------------------------------------------------------------------------ shapes

def _shape_arg(args: list[Variable]) -> Any:
    if len(args) == 1:
        return _constant(args[0])
    return tuple(_constant(a) for a in args)


@numpy_function(np.reshape)
def reshape(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    a = _array(fn, args[0])
    _no_kwargs(fn, kwargs, ("newshape", "shape"))
    given = kwargs.get("shape", kwargs.get("newshape"))
    if len(args) > 1:
        shape = _shape_arg(args[1:])
    elif given is not None:
        shape = _constant(given)
    else:
        raise Unsupported(f"{_name(fn)} without a shape (raised natively)", kind="numpy")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    out = tx.call_op("call_method", "reshape", [a.tensor(), ConstantVariable(shape)], {})
    return NumpyArrayVariable.of(out)


@numpy_function(np.transpose)
def transpose(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    a = _array(fn, args[0])
    _no_kwargs(fn, kwargs, ("axes",))
    axes = _shape_arg(args[1:]) if len(args) > 1 else _constant(kwargs.get("axes", ConstantVariable(None)))
    if axes is None:
        axes = tuple(reversed(range(a.ndim)))
    out = tx.call_op("call_method", "permute", [a.tensor(), ConstantVariable(tuple(axes))], {})
    return NumpyArrayVariable.of(out)


@numpy_function(np.swapaxes)
def swapaxes(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs)
    out = tx.call_op("call_function", torch.transpose, [_array(fn, args[0]).tensor(), args[1], args[2]], {})
    return NumpyArrayVariable.of(out)


@numpy_function(np.expand_dims)
def expand_dims(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("axis",))
    axis = _pick(args, kwargs, 1, "axis", None)
    a = _array(fn, args[0])
    out = tx.call_op("call_function", torch.unsqueeze, [a.tensor(), ConstantVariable(axis)], {})
    return NumpyArrayVariable.of(out)


@numpy_function(np.squeeze)
def squeeze(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("axis",))
    axis = _pick(args, kwargs, 1, "axis", None)
    extra = [] if axis is None else [ConstantVariable(axis)]
    out = tx.call_op("call_function", torch.squeeze, [_array(fn, args[0]).tensor(), *extra], {})
    return NumpyArrayVariable.of(out)


@numpy_function(np.ravel)
def ravel(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs)
    out = tx.call_op("call_method", "reshape", [_array(fn, args[0]).tensor(), ConstantVariable(-1)], {})
    return NumpyArrayVariable.of(out)


@numpy_function(np.concatenate, np.stack)
def join(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.sequence import ListVariable
    _no_kwargs(fn, kwargs, ("axis",))
    values = tx.iterate(args[0])
    items = [i for i in values if _is_array(i)]
    if len(items) != len(values):
        raise Unsupported(f"{_name(fn)} of values that are not all traced arrays", kind="numpy")
    axis = _pick(args, kwargs, 1, "axis", 0)
    out_dtype = np.result_type(*[i.dtype for i in items])
    parts = [cast(tx, i, out_dtype) for i in items]
    if axis is None:
        if fn is np.stack:
            raise Unsupported("numpy.stack(axis=None)", kind="numpy")
        parts = [tx.call_op("call_method", "reshape", [p, ConstantVariable(-1)], {}) for p in parts]
        axis = 0
    out = tx.call_op("call_function", torch.cat if fn is np.concatenate else torch.stack,
                     [ListVariable(parts), ConstantVariable(axis)], {})
    return NumpyArrayVariable.of(out)


@numpy_function(np.round, np.around)
def round_(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("decimals",))
    decimals = _pick(args, kwargs, 1, "decimals", 0)
    a = args[0]
    out_dtype = result_dtype(fn, [a], {})
    if not np.issubdtype(out_dtype, np.floating):
        return a if decimals >= 0 else _unsupported(fn, "negative decimals on integers")
    # both round half to even, also with decimals (scaled by 10**decimals)
    out = tx.call_op("call_function", torch.round, [cast(tx, a, out_dtype)], {"decimals": ConstantVariable(decimals)})
    return wrap_out(tx, out, out_dtype, _all_scalars([a]))


def _unsupported(fn: Any, why: str) -> Variable:
    raise Unsupported(f"{_name(fn)} with {why}", kind="numpy")


@numpy_function(np.sort, np.flip)
def sort_or_flip(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("axis",))
    a = _array(fn, args[0])
    axis = _pick(args, kwargs, 1, "axis", -1 if fn is np.sort else None)
    if fn is np.sort:
        if axis is None:
            a = NumpyArrayVariable.of(tx.call_op("call_method", "reshape", [a.tensor(), ConstantVariable(-1)], {}))
            axis = 0
        # numpy sorts NaN last, as torch.sort does; a stable sort gives the same values either way
        out = tx.call_op("call_function", torch.sort, [a.tensor()], {"dim": ConstantVariable(axis),
                                                                    "stable": ConstantVariable(True)})
        return NumpyArrayVariable.of(out.items[0])  # type: ignore[attr-defined]
    dims = tuple(range(a.ndim)) if axis is None else ((axis,) if isinstance(axis, int) else tuple(axis))
    return NumpyArrayVariable.of(tx.call_op("call_function", torch.flip, [a.tensor(), ConstantVariable(dims)], {}))


@numpy_function(np.outer, np.einsum)
def products(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs)
    arrays = args[1:] if fn is np.einsum else args
    if not all(_is_array(a) for a in arrays):
        raise Unsupported(f"{_name(fn)} on values that are not all traced arrays", kind="numpy")
    out_dtype = result_dtype(fn, args, {})
    parts = [cast(tx, a, out_dtype) for a in arrays]
    if fn is np.outer:
        flat = [tx.call_op("call_method", "reshape", [p, ConstantVariable(-1)], {}) for p in parts]
        out = tx.call_op("call_function", torch.outer, flat, {})
    else:
        out = tx.call_op("call_function", torch.einsum, [args[0], *parts], {})
    return wrap_out(tx, out, out_dtype, out.example.dim() == 0)  # type: ignore[attr-defined]


@numpy_function(np.linalg.norm)
def norm(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("axis", "keepdims"))
    a = args[0]
    if len(args) > 1 and _constant(args[1]) is not None:
        raise Unsupported("numpy.linalg.norm with an ord", kind="numpy")
    axis = _pick(args, kwargs, 2, "axis", None)
    keepdims = bool(_pick(args, kwargs, 3, "keepdims", False))
    if axis is not None and not isinstance(axis, int):
        raise Unsupported("numpy.linalg.norm over several axes (a matrix norm)", kind="numpy")
    out_dtype = result_dtype(fn, [a], {} if axis is None else {"axis": ConstantVariable(axis)})
    t = cast(tx, a, out_dtype)
    # ord=None: the 2-norm of the flattened array (the Frobenius norm of a matrix) or along `axis`
    dim = ConstantVariable(None if axis is None else axis)
    out = tx.call_op("call_function", torch.linalg.vector_norm, [t], {"dim": dim, "keepdim": ConstantVariable(keepdims)})
    return wrap_out(tx, out, out_dtype, out.example.dim() == 0)  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------ creation

def _dtype_option(kwargs: dict[str, Variable], default: Any) -> np.dtype:
    value = kwargs.get("dtype")
    given = None if value is None else _constant(value)
    return np.dtype(default if given is None else given)


@numpy_function(np.ones, np.zeros, np.full)
def filled(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("dtype",))
    shape = _constant(args[0])
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if fn is np.full:
        fill = _constant(args[1])
        dtype = _dtype_option(kwargs, np.asarray(fill).dtype)
    else:
        fill = 1 if fn is np.ones else 0
        dtype = _dtype_option(kwargs, np.float64) if len(args) < 2 else np.dtype(_constant(args[1]))
    out = tx.call_op("call_function", torch.full, [ConstantVariable(shape), ConstantVariable(fill)],
                     {"dtype": ConstantVariable(torch_dtype(dtype))})
    return NumpyArrayVariable.of(out)


@numpy_function(np.ones_like, np.zeros_like, np.full_like)
def filled_like(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("dtype",))
    a = _array(fn, args[0])
    fill = _constant(args[1]) if fn is np.full_like else (1 if fn is np.ones_like else 0)
    dtype = _dtype_option(kwargs, a.dtype)
    out = tx.call_op("call_function", torch.full_like, [a.tensor(), ConstantVariable(fill)],
                     {"dtype": ConstantVariable(torch_dtype(dtype))})
    return NumpyArrayVariable.of(out, a.scalar)


@numpy_function(np.arange)
def arange(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("dtype",))
    values = [_constant(a) for a in args]
    dtype = _dtype_option(kwargs, np.result_type(*values))
    out = tx.call_op("call_function", torch.arange, [ConstantVariable(v) for v in values],
                     {"dtype": ConstantVariable(torch_dtype(dtype))})
    return NumpyArrayVariable.of(out)


@numpy_function(np.linspace)
def linspace(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("num", "dtype"))
    start, stop = _constant(args[0]), _constant(args[1])
    num = _pick(args, kwargs, 2, "num", 50)
    dtype = _dtype_option(kwargs, np.float64)
    out = tx.call_op("call_function", torch.linspace, [ConstantVariable(start), ConstantVariable(stop),
                                                       ConstantVariable(num)],
                     {"dtype": ConstantVariable(torch.float64)})
    return wrap_out(tx, out, dtype, False)


@numpy_function(np.array, np.asarray)
def array(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _no_kwargs(fn, kwargs, ("dtype",))
    a = args[0]
    if isinstance(a, NumpyArrayVariable):
        dtype = _dtype_option(kwargs, a.dtype)
        copy = fn is np.array or dtype != a.dtype
        out = tx.call_op("call_method", "to", [a.tensor(), ConstantVariable(torch_dtype(dtype))],
                         {"copy": ConstantVariable(copy)})
        return NumpyArrayVariable.of(out)
    value = _constant(a)  # nested lists of python numbers: numpy decides the dtype
    dtype = _dtype_option(kwargs, np.asarray(value).dtype)
    out = tx.call_op("call_function", torch.tensor, [tx.wrap_result(value)],
                     {"dtype": ConstantVariable(torch_dtype(dtype))})
    return NumpyArrayVariable.of(out)


# ------------------------------------------------------------------------------------ entry points

class NumpyFunctionVariable(Variable):
    """A function of the numpy namespace. On traced arrays it records torch ops (or breaks, naming
    the function); on python values only it behaves as before (folds a ufunc, or breaks)."""

    def __init__(self, fn: Any, source: Any = None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return f"function {_name(self.fn)}"

    def python_type(self) -> type:
        return type(self.fn)

    def as_python_value(self) -> Any:
        return self.fn

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        return tx.wrap(getattr(self.fn, name), None)

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.user_object import ObjectVariable

        if self.fn in _DTYPE_INFO:
            values = [_constant(a) for a in args]
            try:
                return tx.wrap_result(self.fn(*values, **{k: _constant(v) for k, v in kwargs.items()}))
            except Exception as exc:
                raise Unsupported(f"{_name(self.fn)} raised {type(exc).__name__} (raised natively)", kind="numpy") from exc
        if isinstance(self.fn, type) and not kwargs and all(a.is_constant() for a in args):
            return tx.wrap_result(self.fn(*[a.as_constant() for a in args]))  # np.float32(2.5): a numpy scalar
        if isinstance(self.fn, type) and len(args) == 1 and not kwargs and isinstance(args[0], NumpyArrayVariable):
            # np.float64(traced scalar or array): numpy's conversion, a cast
            array = args[0]
            out = cast(tx, array, np.dtype(self.fn))
            return NumpyArrayVariable.of(out, array.scalar or array.ndim == 0)
        arrays = any(_touches_array(v) for v in [*args, *kwargs.values()])
        impl = NUMPY_FUNCTIONS.get(self.fn)
        if impl is not None and (arrays or self.fn in _CREATION):
            return impl(tx, self.fn, list(args), dict(kwargs))
        if arrays:
            raise Unsupported(f"{_name(self.fn)} is not traced on arrays (it runs natively)", kind="numpy")
        return ObjectVariable(self.fn, self.source).call(tx, args, kwargs)

    def reconstruct(self, glue: Any) -> str:
        if self.source is not None:
            return self.source.name()
        return glue.constant(self.fn)


_CREATION = {np.ones, np.zeros, np.full, np.arange, np.linspace, np.array, np.asarray, np.fft.fftfreq,
             np.fft.rfftfreq}
# numpy classes whose instances describe a dtype: built at trace time from constants (np.finfo(a.dtype))
_DTYPE_INFO = (np.finfo, np.iinfo, np.dtype)


def _touches_array(v: Variable) -> bool:
    from kiln.capture.variables.sequence import BaseSequenceVariable
    if isinstance(v, NumpyArrayVariable):
        return True
    return isinstance(v, BaseSequenceVariable) and any(_touches_array(i) for i in v.items)


_NP_SCALAR_TYPES = {np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32,
                    np.float64, np.complex64, np.complex128}


def is_numpy_function(value: Any) -> bool:
    """numpy's ufuncs, module-level functions and scalar types (np.float32: a cast on arrays)."""
    if isinstance(value, type):
        return issubclass(value, np.generic) and value in _NP_SCALAR_TYPES or value in _DTYPE_INFO
    if isinstance(value, np.ufunc):
        return True
    try:
        return value in NUMPY_FUNCTIONS or (callable(value) and (getattr(value, "__module__", None) or "")
                                            .split(".")[0] == "numpy")
    except TypeError:
        return False


__all__ = ["NUMPY_FUNCTIONS", "NumpyFunctionVariable", "cast", "is_numpy_function", "numpy_function",
           "result_dtype", "wrap_out"]
