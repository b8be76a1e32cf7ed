"""Rendering size expressions as Python source over named inputs, and in the user's own words.

Used by the ShapeEnv when it records a guard: `Ge(s0 - 2, 0)` becomes `L['x'].size()[0] >= 2`, an
expression that `eval` computes from the frame's locals `L` with Python's own semantics (`//`,
`%`, `min`, `max`), and `x.size()[0] >= 2` for logs and explain(). Input: a sympy expression and a
symbol -> source map; output: a string. PyTorch counterpart: the guard printers of
torch/fx/experimental/symbolic_shapes.py and torch/utils/_sympy/printers.py.
"""
from __future__ import annotations

import re
from typing import Callable

import sympy

from kiln.symbolic.expr import FloorDiv, is_integral

# Python precedence, higher binds tighter.
_ATOM, _POW, _UNARY, _MUL, _ADD, _CMP, _NOT, _AND, _OR, _TERNARY = 100, 80, 70, 60, 50, 30, 20, 15, 10, 5

_CMP_TEXT = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=", sympy.Gt: ">", sympy.Ge: ">="}
_FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def render_python(expr: sympy.Basic, sources: dict[sympy.Symbol, str]) -> str:
    """Python source computing expr, each symbol replaced by its source (`L['x'].size()[0]`)."""
    return _Printer(lambda s: _lookup(sources, s)).text(expr)


def render_words(expr: sympy.Basic, sources: dict[sympy.Symbol, str]) -> str:
    """The same expression as the user would write it: `x.size()[0] == y.size()[1]`."""
    return _Printer(lambda s: user_words(_lookup(sources, s))).text(expr)


def user_words(source: str) -> str:
    """`L['x'].size()[0]` -> `x.size()[0]`; `G['w']` -> `w`: sources as names in the user's code."""
    return re.sub(r"\b[LG]\[['\"]([A-Za-z_][A-Za-z0-9_]*)['\"]\]", r"\1", source)


def _lookup(sources: dict[sympy.Symbol, str], symbol: sympy.Symbol) -> str:
    source = sources.get(symbol)
    if source is None:
        raise KeyError(f"symbol {symbol} has no source (an unbacked symbol cannot appear in a guard)")
    return source


class _Printer:
    def __init__(self, name_of: Callable[[sympy.Symbol], str]) -> None:
        self.name_of = name_of

    def text(self, expr: sympy.Basic) -> str:
        return self.render(expr)[0]

    def wrap(self, expr: sympy.Basic, min_prec: int) -> str:
        text, prec = self.render(expr)
        return text if prec >= min_prec else f"({text})"

    def render(self, e: sympy.Basic) -> tuple[str, int]:
        if e is sympy.true:
            return "True", _ATOM
        if e is sympy.false:
            return "False", _ATOM
        if e.is_Symbol:
            return self.name_of(e), _ATOM
        if e.is_Integer:
            v = int(e)
            return str(v), (_ATOM if v >= 0 else _UNARY)
        if e.is_Rational:
            return f"{e.p} / {e.q}", _MUL
        if e.is_Float:
            v = float(e)
            return repr(v), (_ATOM if v >= 0 else _UNARY)
        if isinstance(e, sympy.core.relational.Relational):
            return self.relation(e), _CMP
        if isinstance(e, sympy.Add):
            return self.add(e), _ADD
        if isinstance(e, sympy.Mul):
            return self.mul(e)
        if isinstance(e, sympy.Pow):
            base, exp = e.args
            if exp == -1:
                return f"1 / {self.wrap(base, _MUL + 1)}", _MUL
            # ** is right-associative and binds tighter than unary minus on its left
            return f"{self.wrap(base, _POW + 1)} ** {self.wrap(exp, _POW)}", _POW
        # Python would read `2 * a % 3` right too, but `(2 * a) % 3` is what a person expects to see
        if isinstance(e, FloorDiv):
            return f"{self.wrap(e.args[0], _MUL + 1)} // {self.wrap(e.args[1], _MUL + 1)}", _MUL
        if isinstance(e, sympy.Mod):
            return f"{self.wrap(e.args[0], _MUL + 1)} % {self.wrap(e.args[1], _MUL + 1)}", _MUL
        if isinstance(e, (sympy.Min, sympy.Max)):
            name = "min" if isinstance(e, sympy.Min) else "max"
            return f"{name}({', '.join(self.text(a) for a in e.args)})", _ATOM
        if isinstance(e, sympy.Abs):
            return f"abs({self.text(e.args[0])})", _ATOM
        if isinstance(e, sympy.floor):
            return f"int({self.wrap(e.args[0], _MUL)} // 1)", _ATOM
        if isinstance(e, sympy.ceiling):
            return f"-int(-{self.wrap(e.args[0], _UNARY)} // 1)", _UNARY
        if isinstance(e, sympy.Piecewise):
            (then, cond), (other, _) = e.args
            return f"{self.wrap(then, _OR)} if {self.wrap(cond, _OR)} else {self.wrap(other, _TERNARY)}", _TERNARY
        if isinstance(e, sympy.Not):
            return f"not {self.wrap(e.args[0], _NOT)}", _NOT
        if isinstance(e, sympy.And):
            return " and ".join(self.wrap(a, _AND + 1) for a in e.args), _AND
        if isinstance(e, sympy.Or):
            return " or ".join(self.wrap(a, _OR + 1) for a in e.args), _OR
        raise NotImplementedError(f"kiln.symbolic.render: no Python form for {type(e).__name__} in {e}")

    def add(self, e: sympy.Add) -> str:
        terms = e.as_ordered_terms()
        parts: list[str] = []
        for i, term in enumerate(terms):
            negative = term.could_extract_minus_sign()
            body = self.wrap(-term if negative else term, _ADD + 1 if i else _ADD)
            if i == 0:
                parts.append(f"-{self.wrap(-term, _UNARY)}" if negative else body)
            else:
                parts.append(f" - {self.wrap(-term, _ADD + 1)}" if negative else f" + {body}")
        return "".join(parts)

    def mul(self, e: sympy.Mul) -> tuple[str, int]:
        if e.could_extract_minus_sign():
            return f"-{self.wrap(-e, _UNARY)}", _UNARY
        coeff, rest = e.as_coeff_Mul()
        num: list[str] = []
        den: list[str] = []
        if coeff.is_Rational and coeff != 1:
            if coeff.p != 1:
                num.append(str(coeff.p))
            if coeff.q != 1:
                den.append(str(coeff.q))
        elif coeff != 1:
            num.append(self.wrap(coeff, _MUL))
        for factor in sympy.Mul.make_args(rest):
            if isinstance(factor, sympy.Pow) and factor.args[1].is_Number and factor.args[1] < 0:
                den.append(self.wrap(sympy.Pow(factor.args[0], -factor.args[1]), _MUL + 1))
            else:
                # `*` is left-associative: only the first factor may itself be a `//` or `%`
                num.append(self.wrap(factor, _MUL if not num else _MUL + 1))
        text = " * ".join(num) if num else "1"
        for d in den:
            text += f" / {d}"
        return text, _MUL

    def relation(self, e: sympy.core.relational.Relational) -> str:
        op = _CMP_TEXT[type(e)]
        lhs, rhs = e.args
        if rhs == 0 and isinstance(lhs, sympy.Add):
            # canonical `d >= 0`: move negative terms right, `s0 - s1 - 1 >= 0` -> `s0 >= s1 + 1`
            pos = [t for t in lhs.args if not t.could_extract_minus_sign()]
            neg = [-t for t in lhs.args if t.could_extract_minus_sign()]
            lhs, rhs = sympy.Add(*pos), sympy.Add(*neg)
        if lhs.is_number and not rhs.is_number:
            lhs, rhs, op = rhs, lhs, _FLIPPED[op]
        if op == ">=" and isinstance(rhs, sympy.Add) and not rhs.is_number and sympy.Integer(1) in rhs.args \
                and is_integral(lhs) and is_integral(rhs):
            rhs, op = rhs - 1, ">"  # `a >= b + 1` reads better as `a > b` (integers)
        return f"{self.wrap(lhs, _CMP + 1)} {op} {self.wrap(rhs, _CMP + 1)}"
