"""numpy ndarrays during capture: a tensor node that follows numpy's rules instead of torch's.

`x.numpy()` on a traced tensor gives a `NumpyArrayVariable` over the same node (numpy shares the
tensor's memory); numpy functions (numpy_functions.py), operators, indexing and methods on it
record the equivalent torch ops, with the dtypes numpy would give (float64 defaults, true division
of ints to float64, python scalars that do not widen an array). `torch.from_numpy` turns it back
into a TensorVariable; a frame that returns one returns a real ndarray (`tensor.numpy()` in the
glue). Corresponds to torch/_dynamo/variables/tensor.py (NumpyNdarrayVariable).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from kiln.capture.guards import Guard
from kiln.capture.sources import Source
from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.tensor import TensorVariable, tensor_method
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import CaptureState, Tracer
    from kiln.capture.variables.tensor import TensorVariable

# numpy dtype <-> torch dtype, for the dtypes both have (numpy has no bfloat16).
_NP_TO_TORCH = {np.dtype(np.bool_): torch.bool, np.dtype(np.uint8): torch.uint8, np.dtype(np.int8): torch.int8,
                np.dtype(np.int16): torch.int16, np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64,
                np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
                np.dtype(np.float64): torch.float64, np.dtype(np.complex64): torch.complex64,
                np.dtype(np.complex128): torch.complex128}
_TORCH_TO_NP = {t: n for n, t in _NP_TO_TORCH.items()}


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (or anything `np.dtype()` accepts)."""
    found = _NP_TO_TORCH.get(np.dtype(dtype))
    if found is None:
        raise Unsupported(f"numpy dtype {np.dtype(dtype)} has no torch equivalent", kind="numpy")
    return found


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    found = _TORCH_TO_NP.get(dtype)
    if found is None:
        raise Unsupported(f"a {dtype} tensor as a numpy array (numpy has no such dtype; raised natively)",
                          kind="numpy")
    return found


class NumpyArrayVariable(Variable):
    """An ndarray (or, with `scalar`, a numpy scalar such as np.float64) computed by the graph."""

    def __init__(self, node: torch.fx.Node, example: torch.Tensor, scalar: bool = False) -> None:
        self.node = node
        self.example = example
        self.scalar = scalar and example.dim() == 0
        # True when numpy's strides are the tensor's (an array from `t.numpy()` or an input, or a
        # transpose of one); numpy may lay out what its own functions make otherwise than torch
        self.numpy_strides = False

    @staticmethod
    def of(tensor: Variable, scalar: bool = False) -> "NumpyArrayVariable":
        from kiln.capture.variables.tensor import TensorVariable
        if not isinstance(tensor, TensorVariable):
            raise Unsupported(f"a numpy operation gave {tensor.describe()}", kind="numpy")
        return NumpyArrayVariable(tensor.node, tensor.example, scalar)

    # ------------------------------------------------------------------ what it is
    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.example.dtype)

    @property
    def ndim(self) -> int:
        return self.example.dim()

    def describe(self) -> str:
        kind = "numpy scalar" if self.scalar else "ndarray"
        return f"{kind} {self.node.name} ({self.dtype})"

    def python_type(self) -> type:
        return self.dtype.type if self.scalar else np.ndarray

    def tensor(self) -> "TensorVariable":
        """The same value as a TensorVariable (what torch ops take)."""
        from kiln.capture.variables.tensor import TensorVariable
        return TensorVariable(self.node, self.example)

    def oracle_value(self) -> Any:
        """A one-element stand-in with this dtype and rank: numpy runs on it to tell result dtypes."""
        if self.scalar:
            return self.dtype.type(1)
        return np.ones((1,) * self.ndim, dtype=self.dtype)

    def truth(self, tx: "Tracer") -> bool:
        raise Unsupported(f"branching on the value of {self.describe()} (data-dependent control flow)",
                          kind="data_dependent_branch")

    def length(self, tx: "Tracer") -> Variable:
        if self.ndim == 0:
            raise Unsupported("len() of a 0-d array (raised natively)", kind="numpy")
        return self.tensor().length(tx)

    def iterate(self, tx: "Tracer") -> list[Variable]:
        rows = self.tensor().iterate(tx)
        return [NumpyArrayVariable.of(r, scalar=True) for r in rows]

    # ------------------------------------------------------------------ attributes and methods
    def getattr(self, tx: "Tracer", name: str) -> Variable:

        if name == "shape":
            from kiln.capture.variables.sequence import TupleVariable
            return TupleVariable(self.tensor().size(tx).iterate(tx), tuple)  # numpy's shape is a tuple
        if name == "ndim":
            return ConstantVariable(self.ndim)
        if name == "dtype":
            return ConstantVariable(self.dtype)  # a trace-time fact (str(a.dtype), a.dtype == ...)
        if name == "size":
            return self.tensor().call_method(tx, "numel", [], {})
        if name in ("itemsize", "nbytes"):
            size = self.dtype.itemsize
            return ConstantVariable(size) if name == "itemsize" else \
                tx.call_op("call_function", operator.mul, [self.tensor().call_method(tx, "numel", [], {}),
                                                           ConstantVariable(size)], {})
        if name == "T":
            transposed = self.call_method(tx, "transpose", [], {})
            if isinstance(transposed, NumpyArrayVariable):
                transposed.numpy_strides = self.numpy_strides  # reversed, as numpy reverses them
            return transposed
        if name == "strides":
            return self._strides(tx)
        if name == "__class__":
            return tx.wrap_result(self.python_type())
        if name in ("real", "imag"):
            if not self.example.is_complex():  # numpy: the array itself, or zeros of its dtype
                part = self.tensor() if name == "real" else \
                    tx.call_op("call_function", torch.zeros_like, [self.tensor()], {})
                return NumpyArrayVariable.of(part, self.scalar)
            part = tx.call_op("call_function", getattr(torch, name), [self.tensor()], {})
            return NumpyArrayVariable.of(part, self.scalar)
        if callable(getattr(np.ndarray, name, None)):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"ndarray attribute {name!r} is not traced", kind="numpy")

    def _strides(self, tx: "Tracer") -> Variable:
        """numpy's strides, in bytes: the tensor's times the item size, where they are numpy's."""
        from kiln.capture.variables.sequence import TupleVariable

        if not self.numpy_strides:
            raise Unsupported("ndarray.strides of an array numpy computed (its layout may differ from torch's)",
                              kind="numpy")
        steps = self.tensor().stride(tx).iterate(tx)
        return TupleVariable([tx.binary_op("*", s, ConstantVariable(self.dtype.itemsize)) for s in steps])

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        return call_array_method(tx, self, name, list(args), dict(kwargs))

    # ------------------------------------------------------------------ rebuilding it at run time
    def reconstruct(self, glue: "GlueBuilder") -> str:
        # numpy() shares the tensor's memory, as the ndarray eager made shared it; `[()]` turns a
        # 0-d array into the numpy scalar numpy itself returns from reductions and indexing.
        return f"{glue.graph_value(self)}.numpy()" + ("[()]" if self.scalar else "")


@tensor_method("numpy")
def tensor_to_numpy(tx: "Tracer", tensor: Variable, kwargs: dict[str, Variable]) -> NumpyArrayVariable:
    """`t.numpy()` on a traced tensor; what eager refuses stays a break that raises natively."""
    example = tensor.example  # type: ignore[attr-defined]
    if kwargs:
        raise Unsupported("Tensor.numpy(force=...)", kind="numpy")
    if example.requires_grad:
        raise Unsupported("Tensor.numpy() on a tensor that requires grad (raised natively)", kind="numpy")
    if example.device.type != "cpu":
        raise Unsupported(f"Tensor.numpy() on a {example.device.type} tensor (raised natively)", kind="numpy")
    numpy_dtype(example.dtype)
    array = NumpyArrayVariable(tensor.node, example)  # type: ignore[attr-defined]
    array.numpy_strides = True  # numpy() shares the tensor's memory and layout
    return array


def numpy_to_tensor(tx: "Tracer", fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable | None:
    """`torch.from_numpy(a)` / `torch.as_tensor(a)` / `torch.tensor(a)` on a traced ndarray, else None."""
    if not args or not isinstance(args[0], NumpyArrayVariable):
        return None
    array = args[0]
    if fn is torch.from_numpy or (fn in (torch.as_tensor, torch.asarray) and not kwargs):
        if array.scalar and fn is torch.from_numpy:
            raise Unsupported("torch.from_numpy on a numpy scalar (raised natively)", kind="numpy")
        return array.tensor()
    if fn in (torch.tensor, torch.as_tensor, torch.asarray):
        options = {k: v for k, v in kwargs.items()}
        result = tx.call_op("call_method", "to", [array.tensor()], {**options, "copy": ConstantVariable(True)}) \
            if fn is torch.tensor else tx.call_op("call_method", "to", [array.tensor()], options)
        return result
    return None


def numpy_new_tensor(tx: "Tracer", tensor: Variable, args: Sequence[Variable], kwargs: dict[str, Variable]
                     ) -> Variable | None:
    """`t.new_tensor(a)` on a traced ndarray: a copy of it in t's dtype and device (or the ones
    given), as torch.tensor(a, dtype=t.dtype) makes it; None for anything else (requires_grad=,
    another argument: the method's usual path)."""
    if len(args) != 1 or not isinstance(args[0], NumpyArrayVariable) or set(kwargs) - {"dtype", "device"}:
        return None
    example = tensor.example  # type: ignore[attr-defined]
    options = {"dtype": kwargs.get("dtype", ConstantVariable(example.dtype)),
               "device": kwargs.get("device", ConstantVariable(example.device)), "copy": ConstantVariable(True)}
    return tx.call_op("call_method", "to", [args[0].tensor()], options)


TensorVariable.new_tensor_of_array = numpy_new_tensor


# ------------------------------------------------------------------------------------ operators, methods
# The functions these call live in numpy_functions.py (which imports this module), so they are
# imported where used.

OPERATOR_UFUNCS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
                   "//": np.floor_divide, "%": np.remainder, "**": np.power, "@": np.matmul,
                   "&": np.bitwise_and, "|": np.bitwise_or, "^": np.bitwise_xor,
                   "<": np.less, "<=": np.less_equal, "==": np.equal, "!=": np.not_equal, ">": np.greater,
                   ">=": np.greater_equal}
_INPLACE = {"+": "add_", "-": "sub_", "*": "mul_", "/": "div_", "//": "floor_divide_", "%": "remainder_",
            "**": "pow_", "&": "bitwise_and_", "|": "bitwise_or_", "^": "bitwise_xor_"}


def numpy_operator(tx: "Tracer", symbol: str, a: Variable, b: Variable, inplace: bool = False) -> Variable:
    """`a <symbol> b` where one side is a traced array (BINARY_OP and COMPARE_OP)."""
    from kiln.capture.variables.numpy_functions import NUMPY_FUNCTIONS, cast, result_dtype

    ufunc = OPERATOR_UFUNCS.get(symbol)
    if ufunc is None:
        raise Unsupported(f"the operator {symbol} on {a.describe()} and {b.describe()}", kind="numpy")
    if _is_tensor(a) or _is_tensor(b):
        return _tensor_with_numpy_scalar(tx, ufunc, a, b, inplace)
    for side in (a, b):
        if not (isinstance(side, (NumpyArrayVariable, ConstantVariable)) and
                (not isinstance(side, ConstantVariable) or isinstance(side.value, _NUMBERS))):
            raise Unsupported(f"{a.describe()} {symbol} {b.describe()}", kind="numpy")
    if not inplace or not isinstance(a, NumpyArrayVariable) or a.scalar:
        return NUMPY_FUNCTIONS[ufunc](tx, ufunc, [a, b], {})
    # `a += b` writes into a's memory (and the tensor it came from); numpy refuses to change its dtype.
    out_dtype = result_dtype(ufunc, [a, b], {})
    if out_dtype != a.dtype and not np.can_cast(out_dtype, a.dtype, casting="same_kind"):
        raise Unsupported(f"{a.describe()} {symbol}= {b.describe()} cannot cast to {a.dtype} (raised natively)",
                          kind="numpy")
    value = cast(tx, b, out_dtype) if isinstance(b, NumpyArrayVariable) else b
    tx.call_op("call_method", _INPLACE[symbol], [a.tensor(), value], {})
    return a


# Python numbers and numpy's scalars (np.float32(2.5), np.finfo(...).eps): numpy's own promotion
# rules (result_dtype) decide the dtype, and the torch op takes the number they hold.
_NUMBERS = (bool, int, float, complex, np.bool_, np.integer, np.floating, np.complexfloating)


def _is_tensor(v: Variable) -> bool:
    from kiln.capture.variables.tensor import TensorVariable
    return isinstance(v, TensorVariable)


def _tensor_with_numpy_scalar(tx: "Tracer", ufunc: Any, a: Variable, b: Variable, inplace: bool) -> Variable:
    """`tensor * np.float64(...)`: a tensor defers nothing to numpy (its __array_priority__), and
    torch takes a numpy scalar like a Python number: it does not widen the tensor's dtype."""
    from kiln.capture.variables.numpy_functions import _BINARY, _COMPARE

    tensor, scalar = (a, b) if _is_tensor(a) else (b, a)
    if not (isinstance(scalar, NumpyArrayVariable) and scalar.scalar):
        raise Unsupported(f"{a.describe()} and {b.describe()} in one operation (a tensor with an ndarray)",
                          kind="numpy")
    example = tensor.example  # type: ignore[attr-defined]
    if np.issubdtype(scalar.dtype, np.floating):
        target = example.dtype if (example.is_floating_point() or example.is_complex()) else torch.get_default_dtype()
    elif np.issubdtype(scalar.dtype, np.integer):
        target = torch.int64 if example.dtype == torch.bool else example.dtype
    else:
        raise Unsupported(f"a tensor with a numpy {scalar.dtype} scalar", kind="numpy")
    weak = scalar.tensor() if scalar.example.dtype == target else \
        tx.call_op("call_method", "to", [scalar.tensor(), ConstantVariable(target)], {})
    table: dict[Any, Callable[..., Any]] = {**_BINARY, **_COMPARE, np.matmul: operator.matmul}
    fn = table[ufunc]
    if inplace and _is_tensor(a):
        fn = getattr(operator, "i" + fn.__name__.rstrip("_"), fn) if fn.__module__ == "_operator" else fn
    args = [tensor, weak] if tensor is a else [weak, tensor]
    return tx.call_op("call_function", fn, args, {})


def numpy_unary(tx: "Tracer", fn: Any, value: NumpyArrayVariable) -> Variable:
    from kiln.capture.variables.numpy_functions import NUMPY_FUNCTIONS
    ufunc = {operator.neg: np.negative, operator.pos: np.positive, operator.invert: np.invert}.get(fn)
    if ufunc is np.positive:
        return value
    if ufunc is None:
        raise Unsupported(f"{getattr(fn, '__name__', fn)} on {value.describe()}", kind="numpy")
    return NUMPY_FUNCTIONS[ufunc](tx, ufunc, [value], {})


_METHODS = {"sum": np.sum, "prod": np.prod, "mean": np.mean, "max": np.max, "min": np.min, "std": np.std,
            "var": np.var, "argmax": np.argmax, "argmin": np.argmin, "any": np.any, "all": np.all,
            "cumsum": np.cumsum, "cumprod": np.cumprod, "transpose": np.transpose, "swapaxes": np.swapaxes,
            "squeeze": np.squeeze, "ravel": np.ravel, "clip": np.clip, "dot": np.matmul,
            "__abs__": np.abs, "__neg__": np.negative}


def call_array_method(tx: "Tracer", array: NumpyArrayVariable, name: str, args: list[Variable],
                      kwargs: dict[str, Variable]) -> Variable:
    """`array.name(*args, **kwargs)` for a traced ndarray."""
    from kiln.capture.variables.numpy_functions import NUMPY_FUNCTIONS, _constant, _no_kwargs, cast, reshape
    if name in _METHODS:
        fn = _METHODS[name]
        return NUMPY_FUNCTIONS[fn](tx, fn, [array, *args], kwargs)
    if name == "reshape":
        return reshape(tx, np.reshape, [array, *args], kwargs)
    if name == "astype":
        _no_kwargs(np.ndarray.astype, kwargs, ("copy",))
        dtype = np.dtype(_constant(args[0]))
        out = tx.call_op("call_method", "to", [array.tensor(), ConstantVariable(torch_dtype(dtype))],
                         {"copy": ConstantVariable(True)})
        return NumpyArrayVariable.of(out, array.scalar)
    if name in ("copy", "flatten"):
        out = tx.call_op("call_method", "clone", [array.tensor()], {})
        if name == "flatten":
            out = tx.call_op("call_method", "reshape", [out, ConstantVariable(-1)], {})
        return NumpyArrayVariable.of(out, array.scalar)
    if name == "__getitem__":
        key = _index_key(args[0])
        out = tx.call_op("call_function", operator.getitem, [array.tensor(), key], {})
        scalar = out.example.dim() == 0 and _all_int_index(args[0])  # type: ignore[attr-defined]
        return NumpyArrayVariable.of(out, scalar)
    if name == "__setitem__":
        value = args[1]
        if isinstance(value, NumpyArrayVariable):
            value = cast(tx, value, array.dtype)
        tx.call_op("call_function", operator.setitem, [array.tensor(), _index_key(args[0]), value], {})
        return ConstantVariable(None)
    if name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
        raise Unsupported(f"ndarray.{name}() reads the array's data, which is not known while tracing",
                          kind="item")
    raise Unsupported(f"ndarray.{name} is not traced (it runs natively)", kind="numpy")


def _index_key(key: Variable) -> Variable:
    from kiln.capture.variables.sequence import TupleVariable
    if isinstance(key, NumpyArrayVariable):
        return key.tensor()
    if isinstance(key, TupleVariable):
        return TupleVariable([_index_key(k) for k in key.items])
    return key


def _all_int_index(key: Variable) -> bool:
    from kiln.capture.variables.sequence import TupleVariable
    items = key.items if isinstance(key, TupleVariable) else [key]
    return all(isinstance(k, ConstantVariable) and type(k.value) is int for k in items)


@dataclass(frozen=True)
class NumpyTensorSource(Source):
    """The tensor sharing the memory of the ndarray at `base` (what the graph takes as input)."""

    base: Source

    def name(self) -> str:
        return f"__import__('torch').from_numpy({self.base.name()})"


def wrap_ndarray_input(state: "CaptureState", value: np.ndarray, source: Source) -> NumpyArrayVariable:
    """An ndarray read from the frame (an argument, a resume function's local): a graph input
    through `torch.from_numpy`, guarded as an ndarray and then as that tensor (dtype, shape)."""
    if value.dtype not in _NP_TO_TORCH or not value.flags.writeable or any(s % value.itemsize for s in value.strides) \
            or any(s < 0 for s in value.strides):
        raise Unsupported(f"an ndarray input of dtype {value.dtype} with strides {value.strides}", kind="numpy")
    state.output.guards.append(Guard(source.name(), "check_type", np.ndarray))
    node, fake = state.output.tensor_input(torch.from_numpy(value), NumpyTensorSource(source))
    array = NumpyArrayVariable(node, fake)
    array.numpy_strides = True  # from_numpy keeps the array's strides (guarded with the tensor)
    return array


def is_numpy_array_variable(value: Variable) -> bool:
    return isinstance(value, NumpyArrayVariable)


__all__ = ["NumpyArrayVariable", "NumpyTensorSource", "call_array_method", "is_numpy_array_variable",
           "numpy_operator", "numpy_unary", "wrap_ndarray_input", "numpy_dtype", "numpy_to_tensor",
           "tensor_to_numpy", "torch_dtype"]
