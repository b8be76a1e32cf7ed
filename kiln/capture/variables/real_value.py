"""Trace-time values as the real Python objects they stand for.

A few callables are handed to torch, not traced: a selective-checkpoint policy that AOT autograd
calls on each ATen op, a pytree registry's own flatten function, a treespec's context. When the
traced code built them (a `functools.partial`, a lambda, a list of ops), `real_value` makes the
real object from their Variables; a value that only exists in the graph (a tensor) has none.
Used by kiln/capture/variables/checkpoint.py and pytree.py.
"""
from __future__ import annotations

import functools
import types
from typing import Any

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.functions import NestedFunctionVariable, PartialVariable
from kiln.capture.variables.sequence import ListVariable, TupleVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.errors import Unsupported


def real_value(var: Variable) -> Any:
    """The real Python object a trace-time callable or constant stands for (a function, a partial
    made during the trace, a list of ops); Unsupported when there is none."""
    if isinstance(var, PartialVariable):
        return functools.partial(real_value(var.fn), *[real_value(a) for a in var.args],
                                 **{k: real_value(v) for k, v in var.kwargs.items()})
    if isinstance(var, ListVariable):
        return [real_value(i) for i in var.items]
    if isinstance(var, TupleVariable):
        items = [real_value(i) for i in var.items]
        return tuple(items) if var.tuple_type is tuple else var.tuple_type(*items)
    if isinstance(var, ConstantVariable):
        return var.value
    if isinstance(var, NestedFunctionVariable):
        return _real_nested_function(var)
    if isinstance(var, TensorVariable):
        raise Unsupported("a tensor where a value known at trace time is needed", kind="unsupported")
    return var.as_python_value()


def _real_nested_function(var: Any) -> types.FunctionType:
    """A function made by the traced code (a lambda, an inner def): the real function, when its
    defaults and closure cells hold values known at trace time."""
    cells = []
    for cell in var.closure or ():
        if cell.real is not None and not cell.loaded:
            cells.append(cell.real)  # never read by the trace: the real cell holds the value
        elif cell.contents is None:
            raise Unsupported("a function closing over an unassigned variable", kind="unsupported")
        else:
            cells.append(types.CellType(real_value(cell.contents)))
    if var.kwdefaults:
        raise Unsupported("a function with keyword-only defaults", kind="unsupported")
    defaults = tuple(real_value(d) for d in var.defaults) or None
    return types.FunctionType(var.code, var.f_globals, var.code.co_name, defaults,
                              tuple(cells) if cells else None)
