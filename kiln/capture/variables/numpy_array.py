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
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from kiln.capture.guards import Guard
from kiln.capture.sources import Source
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import CaptureState, Tracer

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

    def tensor(self) -> Variable:
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
        from kiln.capture.variables.functions import BoundMethodVariable

        if name == "shape":
            from kiln.capture.variables.sequence import TupleVariable
            return TupleVariable(list(self.tensor().size(tx).items), tuple)  # numpy's shape is a tuple
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
            return self.call_method(tx, "transpose", [], {})
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

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.numpy_functions import call_array_method
        return call_array_method(tx, self, name, list(args), dict(kwargs))

    # ------------------------------------------------------------------ rebuilding it at run time
    def reconstruct(self, glue: "GlueBuilder") -> str:
        # numpy() shares the tensor's memory, as the ndarray eager made shared it; `[()]` turns a
        # 0-d array into the numpy scalar numpy itself returns from reductions and indexing.
        return f"{glue.graph_value(self)}.numpy()" + ("[()]" if self.scalar else "")


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
    return NumpyArrayVariable(tensor.node, example)  # type: ignore[attr-defined]


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
    return NumpyArrayVariable(node, fake)


def is_numpy_array_variable(value: Variable) -> bool:
    return isinstance(value, NumpyArrayVariable)


__all__ = ["NumpyArrayVariable", "NumpyTensorSource", "is_numpy_array_variable", "wrap_ndarray_input", "numpy_dtype", "numpy_to_tensor",
           "tensor_to_numpy", "torch_dtype"]
