"""Symbolic Python numbers: sizes read from tensors with dynamic dims, and arithmetic on them.

A `SymIntVariable` holds a torch.SymInt / SymFloat / SymBool (kiln.symbolic's node inside) and the
FX node computing it, so that `x.shape[0] * 2` is recorded in the graph. Turning one into a plain
Python value (a branch on it, `range` of it) asks the ShapeEnv, which records a guard.
Corresponds to torch/_dynamo/variables/tensor.py (SymNodeVariable).
"""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.fx

from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


class SymIntVariable(Variable):
    """A symbolic int, float or bool with the node that computes it."""

    def __init__(self, node: torch.fx.Node, example: Any) -> None:
        self.node = node
        self.example = example

    def describe(self) -> str:
        return f"symbolic {self.example}"

    def python_type(self) -> type:
        if isinstance(self.example, torch.SymBool):
            return bool
        if isinstance(self.example, torch.SymFloat):
            return float
        return int

    def truth(self, tx: "Tracer") -> bool:
        return bool(self.example)  # the ShapeEnv guards the branch taken

    def specialize(self) -> Any:
        """The value as a plain Python number (the ShapeEnv guards it equal to its hint)."""
        return self.python_type()(self.example)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        kind = self.python_type()
        if name == "real" or name == "numerator" and kind is int:
            return self
        if name == "imag":
            return ConstantVariable(kind(0))
        if name == "denominator" and kind is int:
            return ConstantVariable(1)
        if name in _KEPT_METHODS.get(kind, ()) or name in _SPECIALIZING_METHODS.get(kind, ()) \
                or kind in (int, float) and name in _OPERATOR_METHODS:
            return BoundMethodVariable(self, name)
        from kiln.capture.variables.exception import raise_in_trace
        error = AttributeError(f"{kind.__name__!r} object has no attribute {name!r}")
        raise raise_in_trace(error, f"AttributeError: {error} (raised natively)")

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        """A method of int or float on a symbolic value: kept symbolic where the answer is the value
        itself or a symbolic test (`is_integer`), else computed from the value, which the ShapeEnv
        then guards (as torch.SymInt.bit_length and SymFloat.hex do)."""
        from kiln.capture.variables.sequence import TupleVariable

        kind = self.python_type()
        if name in _KEPT_METHODS.get(kind, ()) and not args and not kwargs:
            if name in _IDENTITY_METHODS:
                return self
            if name == "as_integer_ratio":  # an int is its own numerator over 1
                return TupleVariable([self, tx.wrap_result(1)])
            return tx.call_op("call_method", name, [self], {})
        if kind in (int, float) and name in _OPERATOR_METHODS and len(args) == 1 and not kwargs:
            # `a.__floordiv__(b)`: the operator itself, where the method takes the other operand's
            # type (int's methods answer NotImplemented for a float, float's take ints)
            other = args[0]
            accepted = (int, bool) if kind is int else (int, bool, float)
            if other.python_type() not in accepted:
                return ConstantVariable(NotImplemented)
            symbol, reflected = _OPERATOR_METHODS[name]
            return tx.binary_op(symbol, other, self) if reflected else tx.binary_op(symbol, self, other)
        if name in _SPECIALIZING_METHODS.get(kind, ()):
            values = [a.specialize() if isinstance(a, SymIntVariable) else a.as_constant() for a in args]
            return tx.wrap_result(getattr(self.specialize(), name)(*values, **{k: v.as_constant()
                                                                              for k, v in kwargs.items()}))
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.node.op != "placeholder" and isinstance(self.example, torch.SymFloat):
            operands = _int_quotient(self.node)
            if operands is not None:
                # `x.shape[0] / 3` as eager computes it, int / int in Python: a lowered graph
                # computes s0 * 0.3333333333333333 (1.6666666666666665 for 5, not ...67)
                a, b = (glue.reconstruct(SymIntVariable(o, o.meta["example_value"])) if isinstance(o, torch.fx.Node)
                        else repr(o) for o in operands)
                return f"{glue.constant(operator.truediv)}({a}, {b})"
            # `float(x.shape[0])`: the float of a size has the size's (integer) expression, and a
            # lowered graph computes it as one; the program must get a float
            return f"{glue.constant(float)}({glue.graph_value(self)})"
        return glue.graph_value(self)


def _int_quotient(node: torch.fx.Node) -> tuple[Any, Any] | None:
    """The two operands of `a / b` where both are ints (symbolic or constant), else None."""
    if node.op != "call_function" or node.target is not operator.truediv or len(node.args) != 2 or node.kwargs:
        return None
    for operand in node.args:
        example = operand.meta.get("example_value") if isinstance(operand, torch.fx.Node) else operand
        if not (isinstance(example, torch.SymInt) or type(example) is int):
            return None
    return node.args[0], node.args[1]


# Methods of int and float on a symbolic value: those that stay symbolic, and those that need the
# value (their answers are not numbers of the same kind, or not expressible over sizes).
# The int methods whose result is the int itself (`n.__index__()`, `math.floor` of an int calls
# `__floor__`): the symbol is returned as it is, without a guard on its value.
_IDENTITY_METHODS = frozenset({"conjugate", "__index__", "__int__", "__trunc__", "__floor__", "__ceil__", "__pos__"})
_KEPT_METHODS: dict[type, frozenset[str]] = {
    int: frozenset({"conjugate", "as_integer_ratio"}) | _IDENTITY_METHODS,
    float: frozenset({"conjugate", "is_integer"}),
}
_SPECIALIZING_METHODS: dict[type, frozenset[str]] = {
    int: frozenset({"bit_length", "bit_count", "to_bytes"}),
    float: frozenset({"as_integer_ratio", "hex"}),
}


# int's and float's arithmetic dunders on a symbolic value: (operator, whether reflected)
_OPERATOR_METHODS: dict[str, tuple[str, bool]] = {
    f"__{reflected}{stem}__": (symbol, bool(reflected))
    for stem, symbol in (("add", "+"), ("sub", "-"), ("mul", "*"), ("truediv", "/"), ("floordiv", "//"),
                         ("mod", "%"), ("pow", "**"))
    for reflected in ("", "r")
}


def holds_symbolic_number(data: Variable | None) -> bool:
    """A symbolic number, or a list or tuple (a Size) holding one at any depth: torch.tensor's,
    new_tensor's or math.*'s argument built from dynamic sizes."""
    if isinstance(data, SymIntVariable):
        return True
    items = getattr(data, "items", None)  # a sequence's Variables (sequence.py imports this module)
    return isinstance(items, list) and any(holds_symbolic_number(item) for item in items)


def decided(var: Variable) -> Any:
    """The value of `var` with every symbolic number in it decided (the ShapeEnv guards each)."""
    if isinstance(var, SymIntVariable):
        return var.specialize()
    if not var.is_constant() and holds_symbolic_number(var) and var.python_type() in (list, tuple, torch.Size):
        return var.python_type()(decided(item) for item in var.items)  # type: ignore[attr-defined]
    return var.as_constant()


def symbolic_product(tx: "Tracer", items: Sequence[Variable], start: Variable) -> Variable:
    """math.prod over sizes some of which are symbolic: the product stays in the graph."""
    product = start
    for item in items:
        if isinstance(product, SymIntVariable) or isinstance(item, SymIntVariable):
            product = tx.call_op("call_function", operator.mul, [product, item], {})
        else:
            product = ConstantVariable(product.as_constant() * item.as_constant())
    return product
