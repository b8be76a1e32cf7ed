"""Float arithmetic on symbols as Python computes it: each operation one IEEE double rounding.

Eager Python computes `x.shape[0] / 3 * 2` as int / int (rounded to a double), then times 2
(rounded again). Sympy's own `/`, `*` and `+` are exact rational arithmetic: it folds that into
0.666666666666667*s0, one rounding of a different number, so a value rendered from it could differ
from eager's in the last bit (5 gives 3.333333333333333, eager 3.3333333333333335). Here each float
operation is a sympy Function that sympy keeps as it is (it never distributes, reassociates or
folds it) and that computes its Python value once every argument is a number. kiln.symbolic's
SymNode builds these for float results; the one printer (render.py) spells each as one operation of
Python, C or Triton; the ATen re-tracer and the lowering map them to `operator.*` calls, the interval
evaluation (expr.bounds) bounds them. An int operand stays an int: Python converts it as the
operation needs (int / int divides exactly and rounds once), C casts it to double.
PyTorch counterpart: FloatTrueDiv, IntTrueDiv, ToFloat, FloatPow, OpaqueUnaryFn_sqrt of
torch/utils/_sympy/functions.py (there sympy's Add and Mul still fold float sums and products).
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable

import sympy


def _python_value(e: sympy.Basic) -> int | float:
    """A sympy number as the Python int or float it stands for."""
    return int(e) if e.is_Integer else float(e)


def _float_result(fn: Callable[..., Any], args: tuple[sympy.Basic, ...]) -> sympy.Basic | None:
    """fn's Python value on these arguments once they are all numbers (a double, held exactly), else None."""
    if not all(a.is_Number for a in args):
        return None
    value = fn(*[_python_value(a) for a in args])
    if isinstance(value, complex):  # (-8.0) ** 0.5 in Python: not a size value; kept symbolic
        return None
    return sympy.Float(float(value))


class FloatOp(sympy.Function):
    """One float operation of Python on its arguments, never simplified by sympy. `python` computes
    it on Python numbers (the hint, and the value once every symbol is substituted)."""

    is_real = True  # a double (sympy then keeps floor(x) a floor, not floor(re(x)) + I*floor(im(x)))
    python: Callable[..., Any]

    @classmethod
    def eval(cls, *args: sympy.Basic) -> sympy.Basic | None:
        return _float_result(cls.python, args)


class ToFloat(FloatOp):
    """`float(n)` of an int expression (`float(x.shape[0])`, sym_float)."""

    nargs = (1,)
    python = float


class FloatAdd(FloatOp):
    """`a + b` (`a - b` is FloatAdd(a, -b): negation is exact, so both round the same real)."""

    nargs = (2,)
    python = operator.add


class FloatMul(FloatOp):
    """`a * b`."""

    nargs = (2,)
    python = operator.mul

    @classmethod
    def eval(cls, a: sympy.Basic, b: sympy.Basic) -> sympy.Basic | None:
        # 1.0 * x is x exactly; the operand that is not 1.0 must already be a float (1.0 * n is float(n))
        for one, other in ((a, b), (b, a)):
            if one.is_Float and float(one) == 1.0 and is_float_valued(other):
                return other
        return _float_result(operator.mul, (a, b))


class FloatTrueDiv(FloatOp):
    """`a / b`: of two ints, Python's int / int (the exact quotient rounded once)."""

    nargs = (2,)

    @staticmethod
    def python(a: int | float, b: int | float) -> float:
        if b == 0:
            raise ZeroDivisionError("division by zero in a symbolic float")
        return a / b


class FloatFloorDiv(FloatOp):
    """`a // b` with a float operand, as Python computes it: through fmod, so 1.0 // 0.1 is 9.0 where
    floor(1.0 / 0.1) is 10 (torch.SymFloat's own `//` is the floor of the quotient); an int operand
    is converted to a double first, as Python converts it."""

    nargs = (2,)

    @staticmethod
    def python(a: int | float, b: int | float) -> float:
        return float(a) // float(b)


class FloatMod(FloatOp):
    """`a % b` with a float operand, as Python computes it: fmod's remainder moved to the divisor's
    sign (-1.0 % 3.0 is 2.0, 1.0 % -3.0 is -2.0, a zero remainder takes the divisor's sign)."""

    nargs = (2,)

    @staticmethod
    def python(a: int | float, b: int | float) -> float:
        return float(a) % float(b)


class FloatPow(FloatOp):
    """`a ** b` with a float result (C's pow, which Python's float ** calls)."""

    nargs = (2,)

    @staticmethod
    def python(a: int | float, b: int | float) -> float:
        return float(a) ** float(b)


class FloatSqrt(FloatOp):
    """`math.sqrt(a)`: correctly rounded, unlike `a ** 0.5` (pow), which differs in the last bit
    for about one number in a thousand."""

    nargs = (1,)
    python = math.sqrt


class FloatLog2(FloatOp):
    """`math.log2(a)` (of a size: a number of halvings, a depth): C's log2, which Python calls, so
    the C form in the same process gives the same double. Defined for a > 0 only: SymNode guards it."""

    nargs = (1,)
    python = math.log2


class RoundHalfEven(sympy.Function):
    """`round(a)` of a float, an int: the nearest integer, a tie to the even one (Python's rule,
    and C's nearbyint under the default rounding mode). Not a FloatOp: its value is an int."""

    nargs = (1,)
    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Basic) -> sympy.Basic | None:
        if a.is_Integer:
            return a
        if a.is_Number and a.is_finite:
            return sympy.Integer(round(float(a)))
        return None


class TruncToInt(sympy.Function):
    """`int(a)` of a float (`math.trunc`): toward zero, so floor for a >= 0 and ceiling below; one
    function, so the value's sign is no decision to guard (torch's TruncToInt). Its value is an int."""

    nargs = (1,)
    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Basic) -> sympy.Basic | None:
        if a.is_integer:
            return a
        if a.is_Number and a.is_finite:
            return sympy.Integer(math.trunc(float(a)))
        return None


FLOAT_OPS: tuple[type[FloatOp], ...] = (ToFloat, FloatAdd, FloatMul, FloatTrueDiv, FloatFloorDiv, FloatMod, FloatPow,
                                         FloatSqrt, FloatLog2)


def is_float_valued(e: sympy.Basic) -> bool:
    """Whether e stands for a Python float: a float number, a float argument's symbol (real, not
    integer), a float operation, or a sum, product, min, max, abs or choice holding one."""
    if isinstance(e, FloatOp) or e.is_Float:
        return True
    if e.is_Symbol:
        return not e.is_integer
    if e.is_Number or not e.args:
        return False
    if isinstance(e, (sympy.Add, sympy.Mul, sympy.Min, sympy.Max, sympy.Abs)):
        return any(is_float_valued(a) for a in e.args)
    if isinstance(e, sympy.Piecewise):
        return any(is_float_valued(value) for value, _ in e.args)
    if isinstance(e, sympy.Pow):  # a float argument's power, kept by graphs from older records, or n ** -1
        base, exp = e.args
        # an int to a symbolic int power is an int: SymNode.pow made it only with the exponent's sign
        # guarded >= 0 (`2 ** levels`)
        return is_float_valued(base) or not exp.is_integer or (exp.is_Number and exp < 0)
    return False


def to_float(e: sympy.Basic) -> sympy.Basic:
    """e as a float value: `float(e)` of an int expression, e itself otherwise."""
    return e if is_float_valued(e) else ToFloat(e)


def float_sum(terms: list[sympy.Basic]) -> sympy.Basic:
    """Python's left-to-right sum of these terms, at least one of them a float."""
    total = terms[0]
    for term in terms[1:]:
        total = FloatAdd(total, term)
    return total


def float_floor(e: sympy.Basic, ceiling: bool = False) -> sympy.Basic:
    """math.floor (or math.ceil) of a float expression: the int expression itself for float(n)."""
    if isinstance(e, ToFloat):
        return e.args[0]
    return sympy.ceiling(e) if ceiling else sympy.floor(e)


# How each float operation applies to the graph's values (the ATen re-tracer and the lowering's
# interpreter of size arithmetic): the Python operation it is.
GRAPH_OPERATION: dict[type[FloatOp], Callable[..., Any]] = {
    FloatAdd: operator.add, FloatMul: operator.mul, FloatTrueDiv: operator.truediv, FloatPow: operator.pow,
    FloatMod: operator.mod,  # (FloatFloorDiv is kiln.symbolic.node.sym_floordiv: SymFloat's `//` is not Python's)
}
