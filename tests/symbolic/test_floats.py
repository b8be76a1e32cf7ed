"""kiln.symbolic.floats: each float operation on sizes stays one IEEE rounding through sympy, the
printers, the interval evaluation and the canonical form of guards."""
from __future__ import annotations

import math

import sympy

from kiln.symbolic.expr import bounds, canonical, decide, int_symbol, relation
from kiln.symbolic.floats import FloatAdd, FloatMul, FloatPow, FloatSqrt, FloatTrueDiv, ToFloat, is_float_valued
from kiln.symbolic.render import render_c, render_python, render_triton

s0 = int_symbol("s0", size=True)
s1 = int_symbol("s1", size=True)


def at(e: sympy.Basic, **values: int) -> float:
    return float(e.xreplace({sympy.Symbol(k, integer=True, nonnegative=True): sympy.Integer(v)
                             for k, v in values.items()}))


def test_sympy_keeps_each_rounding() -> None:
    e = FloatMul(FloatTrueDiv(s0, 3), 2)
    assert str(e) == "FloatMul(FloatTrueDiv(s0, 3), 2)"  # not 0.666666666666667*s0
    for n in range(1, 200):
        assert at(e, s0=n) == n / 3 * 2
        assert at(FloatAdd(FloatMul(FloatAdd(FloatTrueDiv(s0, 10), -0.3), 3), 0.1), s0=n) == (n / 10 - 0.3) * 3 + 0.1
        assert at(FloatSqrt(s0), s0=n) == math.sqrt(n)  # not n ** 0.5, which differs for some n
    assert at(FloatAdd(FloatAdd(ToFloat(s0), 1e20), -1e20), s0=3) == (3 + 1e20) - 1e20 == 0.0
    assert FloatMul(sympy.Float(1.0), FloatTrueDiv(s0, 3)) == FloatTrueDiv(s0, 3)  # exact
    assert FloatMul(sympy.Float(1.0), s0) != s0  # 1.0 * n is a float: kept


def test_printed_as_one_operation_each() -> None:
    e = FloatMul(FloatTrueDiv(s0, 3), 2)
    assert render_python(e) == "s0 / 3 * 2"
    assert render_c(e) == "static_cast<double>(s0) / 3.0 * 2.0"
    assert render_python(FloatAdd(FloatTrueDiv(s0, 3), -0.1)) == "s0 / 3 - 0.1"
    assert render_python(FloatMul(2.5, FloatAdd(s0, 0.5))) == "2.5 * (s0 + 0.5)"
    assert render_python(FloatTrueDiv(s0 + 1, s1)) == "(s0 + 1) / s1"
    assert render_c(FloatTrueDiv(s0 + 1, s1)) == "static_cast<double>(s0 + 1) / static_cast<double>(s1)"
    assert render_python(FloatSqrt(s0)) == "math.sqrt(s0)"
    assert render_c(FloatSqrt(s0)) == "std::sqrt(static_cast<double>(s0))"
    assert render_triton(FloatSqrt(s0)) == "libdevice.sqrt(tl.full([], s0, tl.float64))"
    assert render_python(ToFloat(s0)) == "float(s0)" and render_c(ToFloat(s0)) == "static_cast<double>(s0)"
    assert render_python(FloatPow(ToFloat(s0), -0.5)) == "float(s0) ** -0.5"
    assert render_c(sympy.floor(FloatMul(s0, 1.5))) == "static_cast<int64_t>(std::floor(static_cast<double>(s0) * 1.5))"
    for n in range(2, 50):  # the Python text computes eager's value
        assert eval(render_python(FloatAdd(FloatMul(2.5, FloatAdd(s0, 0.5)), -0.1)), {"s0": n}) == 2.5 * (n + 0.5) - 0.1


def test_guards_compare_the_rounded_value() -> None:
    e = FloatMul(FloatTrueDiv(s0, 3), 2)
    assert render_python(canonical(relation("gt", e, sympy.Float(2.5)))) == "s0 / 3 * 2 > 2.5"
    eq = canonical(relation("eq", e, sympy.Float(5 / 3 * 2)))
    assert render_python(eq) == "s0 / 3 * 2 == 3.3333333333333335"  # every digit, no common factor taken out


def test_bounds_of_float_operations() -> None:
    size = lambda s: (2, math.inf)  # noqa: E731  (a backed size's range)
    e = FloatMul(FloatTrueDiv(s0, 3), 2)
    assert bounds(e, size, {}) == (2 / 3 * 2, math.inf)
    assert decide(relation("gt", e, sympy.Integer(0)), size, {}) is True
    assert decide(relation("ge", FloatSqrt(s0), sympy.Float(1.4)), size, {}) is True
    assert decide(relation("gt", FloatTrueDiv(s0, s1), sympy.Float(1.0)), size, {}) is None
    assert bounds(FloatTrueDiv(s0, s1 - 2), size, {})[0] == -math.inf  # a divisor that may be 0


def test_float_valued() -> None:
    assert is_float_valued(FloatTrueDiv(s0, 3)) and is_float_valued(-ToFloat(s0))
    assert is_float_valued(sympy.Symbol("zf0", real=True)) and is_float_valued(sympy.Float(2.0))
    assert not is_float_valued(s0 * 2 + 1) and not is_float_valued(sympy.floor(FloatTrueDiv(s0, 3)))
