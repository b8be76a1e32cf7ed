"""The one printer of size and index expressions: Python source, the user's words, or C.

The ShapeEnv renders a guard `Ge(s0 - 2, 0)` as `L['x'].size()[0] >= 2`, which `eval` computes from
the frame's locals `L` with Python's own semantics (`//`, `%`, `min`, `max`), and as
`x.size()[0] >= 2` for logs and explain(); kiln.lower prints index arithmetic as C (int64) for its
kernels and as Python for its wrapper. Input: a sympy expression (and a symbol -> source map);
output: a string. PyTorch counterpart: torch/utils/_sympy/printers.py and the guard printers.
"""
from __future__ import annotations

import re
from typing import Callable

import sympy

from kiln.symbolic.expr import BitwiseOp, FloorDiv, LShift, ModularIndexing, is_integral
from kiln.symbolic.floats import (FloatAdd, FloatFloorDiv, FloatLog2, FloatMod, FloatMul, FloatOp, FloatPow,
                                  FloatSqrt, FloatTrueDiv, RoundHalfEven, ToFloat, TruncToInt, is_float_valued)

# Python precedence, higher binds tighter.
_ATOM, _POW, _UNARY, _MUL, _ADD, _CMP, _NOT, _AND, _OR, _TERNARY = 100, 80, 70, 60, 50, 30, 20, 15, 10, 5

_CMP_TEXT = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=", sympy.Gt: ">", sympy.Ge: ">="}
_FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def render_python(expr: sympy.Basic, sources: dict[sympy.Symbol, str] | None = None) -> str:
    """Python source computing expr, each symbol replaced by its source (`L['x'].size()[0]`), or
    by its own name when no sources are given (the variables of kiln.lower's wrapper)."""
    return _Printer(str if sources is None else (lambda s: _lookup(sources, s))).text(expr)


def render_c(expr: sympy.Basic) -> str:
    """C (int64 arithmetic) computing an integer expr, each symbol by its own name. `//` and `%`
    become C's `/` and `%` where both operands are non-negative by construction (floor and
    truncation agree there), else calls of the kernel prelude's kiln_floordiv / kiln_mod."""
    return _Printer(str, c=True).text(expr)


def render_triton(expr: sympy.Basic) -> str:
    """The C form's integer semantics in Triton's spelling, for a Triton kernel's index arithmetic:
    `//` and `%` on int tensors truncate as C's `/` and `%` do (so they are used where both operands
    are non-negative), and the rest calls the kernel prelude's kiln_floordiv_int / kiln_mod_int,
    tl.minimum / tl.maximum and tl.where."""
    return _Printer(str, c=True, triton=True).text(expr)


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
    def __init__(self, name_of: Callable[[sympy.Symbol], str], c: bool = False, triton: bool = False) -> None:
        self.name_of = name_of
        self.c = c  # C's integer semantics (truncating division), spelt as C or, with triton, as Triton
        self.triton = triton
        self.spell = _TRITON if triton else _C

    def text(self, expr: sympy.Basic) -> str:
        return self.render(expr)[0]

    def wrap(self, expr: sympy.Basic, min_prec: int) -> str:
        text, prec = self.render(expr)
        return text if prec >= min_prec else f"({text})"

    def render(self, e: sympy.Basic) -> tuple[str, int]:
        if e is sympy.true:
            return ("true" if self.c and not self.triton else "True"), _ATOM
        if e is sympy.false:
            return ("false" if self.c and not self.triton else "False"), _ATOM
        if e.is_Symbol:
            return self.name_of(e), _ATOM
        if e.is_Integer:
            v = int(e)
            return str(v), (_ATOM if v >= 0 else _UNARY)
        if e.is_Rational:
            return f"{e.p} {self.spell['div']} {e.q}", _MUL
        if e.is_Float:
            f = float(e)
            return repr(f), (_ATOM if f >= 0 else _UNARY)
        if e is sympy.oo or e is sympy.S.NegativeInfinity or e is sympy.nan:  # an inf or nan float argument, kept
            return self.non_finite(e)
        if isinstance(e, sympy.core.relational.Relational):
            # C ranks == below <; a parenthesized comparison reads the same in both languages
            return (f"({self.relation(e)})", _ATOM) if self.c else (self.relation(e), _CMP)
        if isinstance(e, FloatOp):
            return self.float_op(e)
        if self.c:
            c_form = self.c_only(e)
            if c_form is not None:
                return c_form
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
        if isinstance(e, (sympy.Mod, ModularIndexing)):
            return f"{self.wrap(e.args[0], _MUL + 1)} % {self.wrap(e.args[1], _MUL + 1)}", _MUL
        if isinstance(e, (sympy.Min, sympy.Max)):
            name = "min" if isinstance(e, sympy.Min) else "max"
            return f"{name}({', '.join(self.text(a) for a in e.args)})", _ATOM
        if isinstance(e, sympy.Abs):
            return f"abs({self.text(e.args[0])})", _ATOM
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            return self.rounding(e)
        if isinstance(e, RoundHalfEven):
            return self.round_half_even(e.args[0])
        if isinstance(e, TruncToInt):
            return self.trunc(e.args[0])
        if isinstance(e, sympy.Piecewise):
            (then, cond), (other, _) = e.args
            return f"{self.wrap(then, _OR)} if {self.wrap(cond, _OR)} else {self.wrap(other, _TERNARY)}", _TERNARY
        if isinstance(e, sympy.Not):
            return f"not {self.wrap(e.args[0], _NOT)}", _NOT
        if isinstance(e, sympy.And):
            return " and ".join(self.wrap(a, _AND + 1) for a in e.args), _AND
        if isinstance(e, sympy.Or):
            return " or ".join(self.wrap(a, _OR + 1) for a in e.args), _OR
        if isinstance(e, BitwiseOp):
            a, b = (self.wrap(x, _ATOM) for x in e.args)
            if self.c and not self.triton and isinstance(e, LShift):
                a = f"static_cast<int64_t>({self.text(e.args[0])})"  # a literal 1 is C's 32-bit int
            return f"({a} {e.text} {b})", _ATOM
        language = "Triton" if self.triton else "C" if self.c else "Python"
        raise NotImplementedError(f"kiln.symbolic.render: no {language} form for {type(e).__name__} in {e}")

    def float_op(self, e: FloatOp) -> tuple[str, int]:
        """One IEEE double operation, as Python computes it: C and Triton first make each int
        operand a double (Python converts it, and divides int / int as doubles below 2**53)."""
        args = e.args
        if isinstance(e, ToFloat):
            return self.as_double(args[0]) if self.c else f"float({self.text(args[0])})", _ATOM
        if isinstance(e, FloatSqrt):
            if self.triton:
                return f"libdevice.sqrt({self.as_double(args[0])})", _ATOM
            return f"{'std::sqrt' if self.c else 'math.sqrt'}({self.operand(args[0], _ATOM)})", _ATOM
        if isinstance(e, FloatLog2):
            if self.triton:
                return f"libdevice.log2({self.as_double(args[0])})", _ATOM
            return f"{'std::log2' if self.c else 'math.log2'}({self.operand(args[0], _ATOM)})", _ATOM
        if isinstance(e, FloatPow):
            if self.c:
                fn = "libdevice.pow" if self.triton else "std::pow"
                return f"{fn}({self.as_double(args[0])}, {self.as_double(args[1])})", _ATOM
            # ** is right-associative and binds tighter than a unary minus on its left
            return f"{self.wrap(args[0], _POW + 1)} ** {self.wrap(args[1], _UNARY)}", _POW
        a, b = args
        if isinstance(e, (FloatFloorDiv, FloatMod)):
            return self.float_division(e, a, b)
        if isinstance(e, FloatAdd):
            if b.could_extract_minus_sign():
                return f"{self.operand(a, _ADD)} - {self.operand(-b, _ADD + 1)}", _ADD
            return f"{self.operand(a, _ADD)} + {self.operand(b, _ADD + 1)}", _ADD
        op = "*" if isinstance(e, FloatMul) else "/"
        assert isinstance(e, (FloatMul, FloatTrueDiv))
        return f"{self.operand(a, _MUL)} {op} {self.operand(b, _MUL + 1)}", _MUL

    def float_division(self, e: FloatFloorDiv | FloatMod, a: sympy.Basic, b: sympy.Basic) -> tuple[str, int]:
        """Python's float `//` and `%` (through fmod, the remainder on the divisor's side): in C and
        Triton the kernel preludes' kiln_floordiv_float and kiln_fmod_float / kiln_mod_float, which
        compute ATen's floor division and remainder, the same rule; a zero remainder takes the
        divisor's sign, as in Python. A zero divisor never reaches them: the wrapper raises first
        (kiln.lower.ir LoopIR.divisors)."""
        if not self.c:
            op = "//" if isinstance(e, FloatFloorDiv) else "%"
            return f"{self.operand(a, _MUL)} {op} {self.operand(b, _MUL + 1)}", _MUL
        x, y = self.as_double(a), self.as_double(b)
        if isinstance(e, FloatFloorDiv):
            return f"kiln_floordiv_float({x}, {y})", _ATOM
        if self.triton:
            return f"libdevice.copysign(kiln_mod_float({x}, {y}), {y})", _ATOM
        return f"std::copysign(kiln_fmod_float({x}, {y}), {y})", _ATOM

    def non_finite(self, e: sympy.Basic) -> tuple[str, int]:
        """inf, -inf or nan (sympy's oo, -oo, nan): no literal spells them in Python or C."""
        if self.triton:
            raise NotImplementedError(f"kiln.symbolic.render: no Triton form for {e}")
        if e is sympy.nan:
            return ('__builtin_nan("")' if self.c else "float('nan')"), _ATOM
        text = "__builtin_inf()" if self.c else "float('inf')"
        return (text, _ATOM) if e is sympy.oo else (f"-{text}", _UNARY)

    def operand(self, e: sympy.Basic, min_prec: int) -> str:
        """An operand of a float operation: in C and Triton, an int one made a double first."""
        if self.c and not is_float_valued(e):
            return self.as_double(e)
        if self.triton and (e.is_Float or e.is_Symbol):
            return self.as_double(e)  # a bare literal would be Triton's float32, a float argument is one
        return self.wrap(e, min_prec)

    def as_double(self, e: sympy.Basic) -> str:
        if e.is_Integer or e.is_Float:
            literal = repr(float(e))
            return f"tl.full([], {literal}, tl.float64)" if self.triton else (
                literal if float(e) >= 0 or not self.c else f"({literal})")
        if self.triton:
            if e.is_Symbol or not is_float_valued(e):  # a scalar argument, or ints, made a float64 value
                return f"tl.full([], {self.text(e)}, tl.float64)"
            return self.wrap(e, _ATOM)
        if not self.c:
            return self.text(e)
        return f"static_cast<double>({self.text(e)})" if not is_float_valued(e) else self.wrap(e, _ATOM)

    def c_only(self, e: sympy.Basic) -> tuple[str, int] | None:
        """The C spelling of what C writes differently from Python (None: the shared form)."""
        if isinstance(e, (FloorDiv, ModularIndexing, sympy.Mod)):
            a, b = e.args
            if not (is_integral(a) and is_integral(b)):
                raise NotImplementedError(f"kiln.symbolic.render: no C or Triton form for {e} (float operands)")
            if _nonnegative(a) and _nonnegative(b):
                op = self.spell["div"] if isinstance(e, FloorDiv) else "%"
                return f"{self.wrap(a, _MUL + 1)} {op} {self.wrap(b, _MUL + 1)}", _MUL
            fn = self.spell["floordiv"] if isinstance(e, FloorDiv) else self.spell["mod"]
            return f"{fn}({self.text(a)}, {self.text(b)})", _ATOM
        if isinstance(e, sympy.Pow):
            base, exp = e.args
            if not is_integral(base) and self.triton and exp == sympy.Rational(1, 2):
                return f"libdevice.sqrt(tl.full([], {self.text(base)}, tl.float64))", _ATOM
            if not (is_integral(base) and exp.is_Integer and exp > 0) and not self.triton:  # a float power, in double
                if exp == sympy.Rational(1, 2):
                    return f"std::sqrt({self.text(base)})", _ATOM
                if exp.is_Integer and exp < 0:
                    return f"(1.0 / {self.wrap(sympy.Pow(base, -exp), _ATOM)})", _ATOM
                if not exp.is_Integer:
                    power = repr(float(exp)) if exp.is_number else self.text(exp)
                    return f"std::pow({self.text(base)}, {power})", _ATOM
            if not (exp.is_Integer and exp > 0):
                raise NotImplementedError(f"kiln.symbolic.render: no C or Triton form for the power {e}")
            return "(" + " * ".join([self.wrap(base, _MUL + 1)] * int(exp)) + ")", _ATOM
        if isinstance(e, (sympy.Min, sympy.Max)):
            fn = self.spell["min"] if isinstance(e, sympy.Min) else self.spell["max"]
            if not is_integral(e) and not self.triton:  # of a float argument: not through int64
                fn = fn.replace("int64_t", "double")
            text = self.text(e.args[0])
            for a in e.args[1:]:
                text = f"{fn}({text}, {self.text(a)})"
            return text, _ATOM
        if isinstance(e, sympy.Abs):
            return f"{self.spell['abs']}({self.text(e.args[0])})", _ATOM
        if isinstance(e, sympy.Piecewise):
            (then, cond), (other, _) = e.args
            if self.triton:
                return f"tl.where({self.text(cond)}, {self.text(then)}, {self.text(other)})", _ATOM
            return f"({self.text(cond)} ? {self.text(then)} : {self.text(other)})", _ATOM
        if isinstance(e, sympy.Not):
            return f"{self.spell['not']}{self.wrap(e.args[0], _ATOM)}", _UNARY
        if isinstance(e, (sympy.And, sympy.Or)):
            op = self.spell["and"] if isinstance(e, sympy.And) else self.spell["or"]
            return "(" + op.join(self.wrap(a, _ATOM) for a in e.args) + ")", _ATOM
        return None

    def rounding(self, e: sympy.floor | sympy.ceiling) -> tuple[str, int]:
        """floor(n / d) of integers n, d is exact integer division (`n // d`); anything else goes
        through a float in Python and has no C form."""
        num, den = sympy.fraction(sympy.together(e.args[0]))
        if den != 1 and is_integral(num) and is_integral(den):
            if isinstance(e, sympy.floor):
                return self.render(FloorDiv(num, den)) if not self.c else (
                    f"{self.spell['floordiv']}({self.text(num)}, {self.text(den)})", _ATOM)
            return self.render(-FloorDiv(-num, den)) if not self.c else (
                f"-{self.spell['floordiv']}({self.text(-num)}, {self.text(den)})", _UNARY)
        if self.c and not self.triton:  # a float argument's floor or ceiling (arange's length for step f)
            fn = "std::floor" if isinstance(e, sympy.floor) else "std::ceil"
            return f"static_cast<int64_t>({fn}({self.text(e.args[0])}))", _ATOM
        if self.c:  # Triton: a float expression of sizes (kiln.symbolic.floats), in float64
            if not is_float_valued(e.args[0]):
                raise NotImplementedError(f"kiln.symbolic.render: no Triton form for {e}")
            fn = "libdevice.floor" if isinstance(e, sympy.floor) else "libdevice.ceil"
            return f"{fn}({self.text(e.args[0])}).to(tl.int64)", _ATOM
        if isinstance(e, sympy.floor):
            return f"int({self.wrap(e.args[0], _MUL)} // 1)", _ATOM
        return f"-int(-{self.wrap(e.args[0], _UNARY)} // 1)", _UNARY

    def round_half_even(self, a: sympy.Basic) -> tuple[str, int]:
        """Python's round() of a float: C's nearbyint under the default (to nearest, ties to even)
        rounding mode, and libdevice's nearbyint, are the same rule."""
        if self.triton:
            return f"libdevice.nearbyint({self.as_double(a)}).to(tl.int64)", _ATOM
        if self.c:
            return f"static_cast<int64_t>(std::nearbyint({self.operand(a, _ATOM)}))", _ATOM
        return f"round({self.text(a)})", _ATOM

    def trunc(self, a: sympy.Basic) -> tuple[str, int]:
        """int() of a float: toward zero, as C's conversion of a double to an integer."""
        if self.triton:
            return f"libdevice.trunc({self.as_double(a)}).to(tl.int64)", _ATOM
        if self.c:
            return f"static_cast<int64_t>({self.operand(a, _ATOM)})", _ATOM
        return f"int({self.text(a)})", _ATOM

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
        # a float argument's quotient divides as floats (Triton's `//` would floor it)
        div = self.spell["div"] if self.c and is_integral(e) else "/"
        for d in den:
            text += f" {div} {d}"
        return text, _MUL

    def relation(self, e: sympy.core.relational.Relational) -> str:
        op = _CMP_TEXT[type(e)]
        lhs, rhs = e.args
        if rhs == 0 and not is_integral(lhs) and not lhs.is_number:
            # a float argument's canonical `d > 0`: its constant goes right, and the side with the
            # symbol reads positive (`0.5 - f >= 0` -> `f <= 0.5`, `f + 1.0 == 0` -> `f == -1.0`)
            const, rest = lhs.as_coeff_Add()
            lhs, rhs = rest, -const
            if rest.could_extract_minus_sign():
                lhs, rhs, op = -rest, const, _FLIPPED[op]
        elif rhs == 0 and isinstance(lhs, sympy.Add):
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


# How C and Triton spell the integer operations they share (C's truncating semantics in both).
_C = {"div": "/", "floordiv": "kiln_floordiv", "mod": "kiln_mod", "min": "std::min<int64_t>",
      "max": "std::max<int64_t>", "abs": "std::abs", "not": "!", "and": " && ", "or": " || "}
_TRITON = {"div": "//", "floordiv": "kiln_floordiv_int", "mod": "kiln_mod_int", "min": "tl.minimum",
           "max": "tl.maximum", "abs": "tl.abs", "not": "~", "and": " & ", "or": " | "}


def _nonnegative(e: sympy.Expr) -> bool:
    """Whether e is >= 0 by construction: non-negative integers and symbols under + * // % min max."""
    if e.is_Integer:
        return e >= 0
    if e.is_Symbol:
        return bool(e.is_nonnegative)
    if isinstance(e, (sympy.Add, sympy.Mul, FloorDiv, ModularIndexing, sympy.Mod, sympy.Min, sympy.Max)):
        return all(_nonnegative(a) for a in e.args)
    return False
