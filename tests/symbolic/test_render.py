"""Rendering: guard text evaluated with eval() must compute what Python computes on the same ints."""
from __future__ import annotations

import itertools
import operator

import pytest
import sympy
import torch

from kiln.symbolic import ShapeEnv, expr_of
from kiln.symbolic.expr import FloorDiv, canonical
from kiln.symbolic.render import render_python, render_words, user_words

# (name, function on ints) - each is applied both to SymInts (then rendered) and to plain ints
EXPRESSIONS = [
    ("floordiv", lambda a, b: a // 4),
    ("floordiv_neg", lambda a, b: (a - 9) // 4),
    ("floordiv_sym", lambda a, b: (a * 3 + 1) // b),
    ("nested_floordiv", lambda a, b: (a // 2) // 3),
    ("mod", lambda a, b: a % 3),
    ("mod_neg", lambda a, b: (2 - a) % 3),
    ("mod_sym", lambda a, b: (a + 5) % b),
    ("min", lambda a, b: torch.sym_min(a, b) if isinstance(a, torch.SymInt) else min(a, b)),
    ("max_expr", lambda a, b: torch.sym_max(a - b, 2 * b) if isinstance(a, torch.SymInt) else max(a - b, 2 * b)),
    ("poly", lambda a, b: a * b - 3 * a + 7),
    ("neg", lambda a, b: -a - b),
    ("pow", lambda a, b: a ** 2 + b ** 3),
    ("mixed", lambda a, b: -(a // 3) * (b % 4) + a),
]

VALUES = [v for v in itertools.product([-7, -1, 0, 1, 2, 5, 12], [1, 2, 3, 7])]


@pytest.mark.parametrize("name,fn", EXPRESSIONS, ids=[e[0] for e in EXPRESSIONS])
def test_rendered_expression_matches_python(name, fn):
    env = ShapeEnv()
    a = env.create_symbolic_int(5, "L['a']")
    b = env.create_symbolic_int(3, "L['b']")
    out = fn(a, b)
    text = env.render(expr_of(out))
    for va, vb in VALUES:
        assert eval(text, {"L": {"a": va, "b": vb}}) == fn(va, vb), (text, va, vb)


@pytest.mark.parametrize("op", [operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne])
def test_rendered_relations_keep_their_meaning(op):
    env = ShapeEnv()
    a = env.create_symbolic_int(5, "L['a']")
    b = env.create_symbolic_int(3, "L['b']")
    cond = expr_of(op(a // 2 + 1, b - a))
    for form in (cond, canonical(cond)):  # the canonical form states the same fact
        text = env.render(form)
        for va, vb in VALUES:
            assert eval(text, {"L": {"a": va, "b": vb}}) == op(va // 2 + 1, vb - va), (text, va, vb)


def test_readable_forms():
    s0, s1 = sympy.Symbol("s0", integer=True), sympy.Symbol("s1", integer=True)
    sources = {s0: "L['x'].size()[0]", s1: "L['self'].w.size()[1]"}
    assert render_python(canonical(sympy.Lt(s0, s1)), sources) == "L['self'].w.size()[1] > L['x'].size()[0]"
    assert render_python(canonical(sympy.Eq(s1, s0)), sources) in (
        "L['x'].size()[0] == L['self'].w.size()[1]", "L['self'].w.size()[1] == L['x'].size()[0]")
    assert render_python(canonical(sympy.Le(s0, 10)), sources) == "L['x'].size()[0] <= 10"
    assert render_python(sympy.Eq(sympy.Mod(s0, 8), 0), sources) == "L['x'].size()[0] % 8 == 0"
    assert render_python(FloorDiv(s0 - 1, 2) + 1, sources) == "(L['x'].size()[0] - 1) // 2 + 1"
    assert render_words(canonical(sympy.Lt(s0, s1)), sources) == "self.w.size()[1] > x.size()[0]"
    assert user_words("G['torch'].ones(L['n'])") == "torch.ones(n)"


def test_float_expressions_render_as_true_division():
    env = ShapeEnv()
    a = env.create_symbolic_int(5, "L['a']")
    f = a / 2 + 0.25
    text = env.render(expr_of(f))
    assert eval(text, {"L": {"a": 7}}) == pytest.approx(3.75)


def test_unbacked_symbols_cannot_be_rendered():
    env = ShapeEnv()
    u = env.create_unbacked_symint("nonzero")
    with pytest.raises(KeyError):
        env.render(expr_of(u + 1))
    assert env.words(expr_of(u + 1)) == "u0 + 1"


def test_sym_ite_and_float_guards_render():
    env = ShapeEnv()
    a = env.create_symbolic_int(5, "L['a']")
    b = env.create_symbolic_int(3, "L['b']")
    # torch.sym_ite itself insists on torch's own node class, so call the node method directly
    pick = (a > b).node.sym_ite((a - b).node, (b * 2).node)
    text = env.render(pick.expr)
    for va, vb in VALUES:
        assert eval(text, {"L": {"a": va, "b": vb}}) == (va - vb if va > vb else vb * 2)
    assert float(a / 2) == 2.5  # specializes the float: the guard says which inputs give 2.5
    guard = env.guards[-1].python
    assert eval(guard, {"L": {"a": 5}}) and not eval(guard, {"L": {"a": 6}})


class _CInt(int):
    """An int with C's (and Triton's, on int tensors) truncating `//` and `%`: what a Triton kernel
    computes when it runs the rendered text."""

    def __floordiv__(self, o: int) -> "_CInt":
        q = abs(int(self)) // abs(int(o))
        return _CInt(q if (self >= 0) == (o >= 0) else -q)

    def __rfloordiv__(self, o: int) -> "_CInt":
        return _CInt(o).__floordiv__(self)

    def __mod__(self, o: int) -> "_CInt":
        return _CInt(int(self) - int(self // o) * int(o))

    def __rmod__(self, o: int) -> "_CInt":
        return _CInt(o).__mod__(self)

    def __add__(self, o: int) -> "_CInt":
        return _CInt(int(self) + int(o))

    __radd__ = __add__

    def __sub__(self, o: int) -> "_CInt":
        return _CInt(int(self) - int(o))

    def __rsub__(self, o: int) -> "_CInt":
        return _CInt(int(o) - int(self))

    def __mul__(self, o: int) -> "_CInt":
        return _CInt(int(self) * int(o))

    __rmul__ = __mul__

    def __neg__(self) -> "_CInt":
        return _CInt(-int(self))


class _TL:
    minimum = staticmethod(lambda a, b: _CInt(min(a, b)))
    maximum = staticmethod(lambda a, b: _CInt(max(a, b)))
    where = staticmethod(lambda c, a, b: a if c else b)
    abs = staticmethod(lambda a: _CInt(abs(a)))


@pytest.mark.parametrize("name,fn", EXPRESSIONS, ids=[e[0] for e in EXPRESSIONS])
def test_triton_form_matches_python_under_truncating_division(name, fn):
    """The Triton form runs with truncating `//` and `%` (as Triton's integer ops do): it must still
    compute Python's floor semantics wherever an operand may be negative."""
    from kiln.symbolic.render import render_triton

    env = ShapeEnv()
    a = env.create_symbolic_int(5, "L['a']")
    b = env.create_symbolic_int(3, "L['b']")
    expr = expr_of(fn(a, b))
    text = render_triton(expr)
    sa, sb = expr_of(a), expr_of(b)
    scope = {"tl": _TL, "kiln_floordiv_int": lambda x, y: _CInt(int(x) // int(y)),
             "kiln_mod_int": lambda x, y: _CInt(int(x) % int(y))}
    for va, vb in VALUES:
        env_vals = {**scope, sa.name: _CInt(va), sb.name: _CInt(vb)}
        assert int(eval(text, env_vals)) == fn(va, vb), (text, va, vb)


def test_triton_form_of_min_max_abs_where():
    from kiln.symbolic.render import render_triton

    x, y = sympy.symbols("x y", integer=True, nonnegative=True)
    assert render_triton(sympy.Max(x, y + 1)) == "tl.maximum(x, y + 1)"
    assert render_triton(FloorDiv(x, 4)) == "x // 4"  # both operands >= 0: Triton's `//` is exact
    assert render_triton(FloorDiv(x - 5, 4)) == "kiln_floordiv_int(x - 5, 4)"
    assert render_triton(sympy.Piecewise((x, sympy.Lt(x, y)), (y, True))) == "tl.where((x < y), x, y)"
