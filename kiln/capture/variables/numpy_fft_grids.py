"""numpy's discrete Fourier transforms (`np.fft.*`) and grid builders (`np.meshgrid`) on traced
arrays, as torch ops with numpy's result dtypes.

Registered in numpy_functions.py's table (`@numpy_function`). A transform computes in the
precision numpy answers with (numpy 2 keeps single precision: float32 in, complex64 out), so the
input is cast to that precision and torch.fft's result is numpy's. `np.meshgrid` copies by default,
as numpy does: the expanded views are cloned, so that writing one output never reaches another or
an input. Corresponds to torch/_numpy/fft.py and torch/_numpy/_funcs_impl.py (meshgrid).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.numpy_array import NumpyArrayVariable, torch_dtype
from kiln.capture.variables.numpy_functions import _constant, _name, cast, numpy_function, wrap_out
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

# numpy.fft function -> (torch.fft function, numpy's parameter names after the array, and torch's)
_TRANSFORMS: dict[Any, tuple[Any, tuple[str, ...], tuple[str, ...]]] = {}
for _name_1d in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft"):
    _TRANSFORMS[getattr(np.fft, _name_1d)] = (getattr(torch.fft, _name_1d), ("n", "axis", "norm"), ("n", "dim", "norm"))
for _name_nd in ("fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn", "irfftn"):
    _TRANSFORMS[getattr(np.fft, _name_nd)] = (getattr(torch.fft, _name_nd), ("s", "axes", "norm"), ("s", "dim", "norm"))


def _arguments(fn: Any, names: tuple[str, ...], args: list[Variable], kwargs: dict[str, Variable]) -> dict[str, Any]:
    """numpy's optional parameters by name, from positions after the array and keywords."""
    extra = [k for k in kwargs if k not in names]
    if extra or len(args) > len(names):
        raise Unsupported(f"{_name(fn)} with these arguments {extra}", kind="numpy")
    found = {name: _constant(value) for name, value in zip(names, args)}
    found.update({k: _constant(v) for k, v in kwargs.items()})
    return found


def _transform_dtype(fn: Any, array: NumpyArrayVariable, given: dict[str, Any]) -> np.dtype:
    """numpy's own answer for the result dtype: the transform run on a small array of the same
    dtype and rank with the same options (one element per axis would be too few for irfft)."""
    stand_in = np.ones((4,) * max(array.ndim, 1), dtype=array.dtype)
    try:
        return np.asarray(fn(stand_in, **given)).dtype
    except Exception as exc:
        raise Unsupported(f"{_name(fn)} raised {type(exc).__name__}: {exc} (raised natively)", kind="numpy") from exc


@numpy_function(*_TRANSFORMS)
def transform(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    array = args[0]
    if not isinstance(array, NumpyArrayVariable):
        raise Unsupported(f"{_name(fn)} on {array.describe()}", kind="numpy")
    torch_fn, np_names, torch_names = _TRANSFORMS[fn]
    given = _arguments(fn, np_names, args[1:], kwargs)
    out_dtype = _transform_dtype(fn, array, given)
    # the input in the precision of numpy's answer: a real input as the real dtype of that precision
    precision = np.dtype(np.float32) if out_dtype in (np.complex64, np.float32) else np.dtype(np.float64)
    work = np.result_type(precision, np.complex64) if array.dtype.kind == "c" else precision
    options: dict[str, Variable] = {t: ConstantVariable(tuple(v) if isinstance(v, list) else v)
               for n, t in zip(np_names, torch_names) if (v := given.get(n)) is not None}
    out = tx.call_op("call_function", torch_fn, [cast(tx, array, work)], options)
    return wrap_out(tx, out, out_dtype, False)


@numpy_function(np.fft.fftshift, np.fft.ifftshift)
def shift(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    array = args[0]
    if not isinstance(array, NumpyArrayVariable):
        raise Unsupported(f"{_name(fn)} on {array.describe()}", kind="numpy")
    axes = _arguments(fn, ("axes",), args[1:], kwargs).get("axes")
    options: dict[str, Variable] = {} if axes is None else {"dim": ConstantVariable(tuple(axes) if isinstance(axes, list) else axes)}
    torch_fn = torch.fft.fftshift if fn is np.fft.fftshift else torch.fft.ifftshift
    return NumpyArrayVariable.of(tx.call_op("call_function", torch_fn, [array.tensor()], options))


@numpy_function(np.fft.fftfreq, np.fft.rfftfreq)
def frequencies(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    given = _arguments(fn, ("n", "d"), args, kwargs)
    if "n" not in given:
        raise Unsupported(f"{_name(fn)} without n (raised natively)", kind="numpy")
    torch_fn = torch.fft.fftfreq if fn is np.fft.fftfreq else torch.fft.rfftfreq
    out = tx.call_op("call_function", torch_fn, [ConstantVariable(given["n"]), ConstantVariable(given.get("d", 1.0))],
                     {"dtype": ConstantVariable(torch.float64)})  # numpy's frequencies are float64
    return NumpyArrayVariable.of(out)


@numpy_function(np.meshgrid)
def meshgrid(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """Each input flattened, laid along its own axis and broadcast to the grid (the first two axes
    swapped for indexing="xy"); each output keeps its input's dtype, as numpy's does."""
    from kiln.capture.variables.sequence import TupleVariable

    extra = [k for k in kwargs if k not in ("indexing", "sparse", "copy")]
    if extra or not all(isinstance(a, NumpyArrayVariable) for a in args):
        raise Unsupported(f"numpy.meshgrid with {extra or 'values that are not traced arrays'}", kind="numpy")
    indexing = _constant(kwargs.get("indexing", ConstantVariable("xy")))
    sparse = bool(_constant(kwargs.get("sparse", ConstantVariable(False))))
    copy = bool(_constant(kwargs.get("copy", ConstantVariable(True))))
    if indexing not in ("xy", "ij"):
        raise Unsupported(f"numpy.meshgrid(indexing={indexing!r}) (raised natively)", kind="numpy")
    arrays = [a for a in args if isinstance(a, NumpyArrayVariable)]
    flat = [tx.call_op("call_method", "reshape", [a.tensor(), ConstantVariable(-1)], {}) for a in arrays]
    axes = list(range(len(flat)))
    if indexing == "xy" and len(flat) > 1:
        axes[0], axes[1] = 1, 0
    lengths = [f.size(tx, 0) for f in flat]  # type: ignore[attr-defined]
    shape: list[Variable] = list(lengths)
    for n, axis in enumerate(axes):
        shape[axis] = lengths[n]
    outputs: list[Variable] = []
    for n, axis in enumerate(axes):
        view = [1] * len(flat)
        view[axis] = -1
        out = tx.call_op("call_method", "reshape", [flat[n], ConstantVariable(tuple(view))], {})
        if not sparse:
            out = tx.call_op("call_method", "expand", [out, TupleVariable(shape)], {})
        if copy:
            out = tx.call_op("call_method", "clone", [out], {"memory_format": ConstantVariable(torch.contiguous_format)})
        outputs.append(NumpyArrayVariable.of(out))
    return TupleVariable(outputs)  # numpy 2 returns a tuple


@numpy_function(np.empty_like)
def empty_like(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    array = args[0]
    if not isinstance(array, NumpyArrayVariable) or set(kwargs) - {"dtype"} or len(args) > 1:
        raise Unsupported("numpy.empty_like with these arguments", kind="numpy")
    dtype = np.dtype(_constant(kwargs["dtype"])) if "dtype" in kwargs else array.dtype
    out = tx.call_op("call_function", torch.empty_like, [array.tensor()],
                     {"dtype": ConstantVariable(torch_dtype(dtype)),
                      "memory_format": ConstantVariable(torch.contiguous_format)})
    return NumpyArrayVariable.of(out, array.scalar)
