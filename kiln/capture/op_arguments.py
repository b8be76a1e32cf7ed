"""A traced value as the tracer hands it to a graph op: the FX node argument it becomes, and the
example value the op runs on at trace time (kiln.capture.tracer's call_op). Containers become
containers of node arguments, constants literals the graph's code can print, numpy scalars the
Python numbers torch reads them as where that is the same op."""
from __future__ import annotations

import enum
import operator
from typing import Any, Sequence

import numpy as np
import torch

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.dict import DictVariable
from kiln.capture.variables.sequence import ListVariable, TupleVariable
from kiln.capture.variables.slice import SliceVariable
from kiln.capture.variables.symint import SymIntVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.errors import Unsupported


def node_arg(var: Any) -> Any:
    """A Variable as an FX node argument (nodes for graph values, Python values otherwise)."""
    from kiln.capture.variables.torch import TorchFunctionVariable

    if isinstance(var, (TensorVariable, SymIntVariable)):
        return var.node
    if isinstance(var, ConstantVariable):
        return _graph_literal(var.value)
    if isinstance(var, TupleVariable):
        return tuple(node_arg(i) for i in var.items)
    if isinstance(var, ListVariable):
        return [node_arg(i) for i in var.items]
    if isinstance(var, SliceVariable):
        return slice(*(node_arg(p) for p in var.parts()))
    if isinstance(var, DictVariable):
        return {k: node_arg(v) for k, v in var.items.items()}
    if isinstance(var, TorchFunctionVariable):
        return var.fn
    if var.is_constant():
        return _graph_literal(var.as_constant())
    raise Unsupported(f"passing {var.describe()} to a graph op", kind="unsupported_call")


def _graph_literal(value: Any) -> Any:
    """A constant as a graph argument. FX prints a numpy scalar as `np.int64(4)`, which the
    graph's code cannot evaluate: np.int64 and np.bool_ become the Python int and bool torch reads
    them as, an int or float enum member the number. Other numpy scalars are refused here (np.float64 makes a float64 tensor where 0.5
    makes a float32 one); call_op converts them for arithmetic on tensors, where they are the same."""
    if type(value) in (np.int64, np.bool_):
        return value.item()
    if isinstance(value, enum.Enum) and isinstance(value, (int, float)):
        # an IntEnum / IntFlag member is the number it holds to torch; FX would print it by name
        # (`P.None` for a flag combination, which is not code)
        return (int if isinstance(value, int) else float)(value)
    if isinstance(value, np.generic):
        raise Unsupported(f"passing the numpy scalar {value!r} to a graph op", kind="numpy")
    return value


# Tensor arithmetic, where a numpy scalar operand acts as the Python number it holds
_SCALAR_OPERATORS = frozenset({operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
                               operator.mod, operator.pow, operator.iadd, operator.isub, operator.imul,
                               operator.itruediv, operator.ifloordiv, operator.imod, operator.ipow})


def scalar_operands(target: Any, args: Sequence[Variable]) -> Sequence[Variable]:
    if target not in _SCALAR_OPERATORS or not any(isinstance(a, TensorVariable) for a in args):
        return args
    return [ConstantVariable(a.value.item()) if isinstance(a, ConstantVariable) and isinstance(a.value, np.generic)
            and isinstance(a.value, (np.integer, np.floating, np.bool_)) else a for a in args]


def example_arg(var: Any) -> Any:
    """A Variable as the example value an op runs on at trace time."""
    from kiln.capture.variables.torch import TorchFunctionVariable

    if isinstance(var, (TensorVariable, SymIntVariable)):
        return var.example
    if isinstance(var, ConstantVariable):
        return var.value
    if isinstance(var, TupleVariable):
        values = [example_arg(i) for i in var.items]
        return torch.Size(values) if var.tuple_type is torch.Size else tuple(values)
    if isinstance(var, ListVariable):
        return [example_arg(i) for i in var.items]
    if isinstance(var, SliceVariable):
        return slice(*(example_arg(p) for p in var.parts()))
    if isinstance(var, DictVariable):
        return {k: example_arg(v) for k, v in var.items.items()}
    if isinstance(var, TorchFunctionVariable):
        return var.fn
    return var.as_constant()
