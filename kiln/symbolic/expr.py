"""Sympy vocabulary of sizes and index arithmetic: FloorDiv, ModularIndexing, canonical guards, ranges.

Sits under kiln.symbolic's SymNode and ShapeEnv: the node builds expressions with these helpers,
the environment canonicalizes each decision before recording it and decides questions statically
with `bounds`, an interval evaluation over each symbol's value range (sizes are assumed >= 2).
kiln.lower indexes with the same functions; kiln.symbolic.render prints them as Python or C.
Input: sympy expressions over size symbols; output: expressions, canonical relations, intervals.
PyTorch counterpart: torch/utils/_sympy/functions.py and value_ranges.py (much smaller here).
"""
from __future__ import annotations

import math
import operator
from typing import Callable, Mapping

import sympy

from kiln.symbolic.floats import (FloatAdd, FloatLog2, FloatMul, FloatOp, FloatPow, FloatSqrt, FloatTrueDiv,
                                  RoundHalfEven, ToFloat, TruncToInt, is_float_valued)

INF = math.inf
Interval = tuple[float, float]  # (lo, hi); ints, or +-inf when unbounded
UNKNOWN: Interval = (-INF, INF)


class FloorDiv(sympy.Function):
    """Python's `a // b` on integers (floor, also for negative operands); kept as its own node so
    it renders back as `//` exactly. Lowering indexes with it too: the C printer writes it as C's
    `/` where both operands are known non-negative (there floor and truncation agree)."""

    nargs = (2,)
    is_integer = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:
        if divisor == 1:
            return base
        if base.is_Integer and divisor.is_Integer:
            if divisor == 0:
                raise ZeroDivisionError("integer division by zero in a symbolic size")
            return sympy.Integer(int(base) // int(divisor))
        if base == 0:
            return sympy.Integer(0)
        if (isinstance(base, FloorDiv) and base.args[1].is_Integer and base.args[1] > 0
                and divisor.is_Integer and divisor > 0):
            # (a // m) // d == a // (m * d) for positive m and d
            return FloorDiv(base.args[0], base.args[1] * divisor)
        # Terms that are exact multiples of the divisor leave the floor unchanged when taken out:
        # (q*b + r) // b == q + r // b for every integer q (8*s0 // (2*s0) is 4, (i*s + j) // s is i + j // s).
        whole, rest = _split_multiples(base, divisor)
        if not whole:
            return None
        quotient = sympy.Add(*[t / divisor for t in whole])
        return quotient + FloorDiv(sympy.Add(*rest), divisor) if rest else quotient


class ModularIndexing(sympy.Function):
    """Python's `a % b` on integers, as index arithmetic writes it (the digit of a flat index in a
    reshape, a roll); the C printer writes C's `%` where both operands are known non-negative."""

    nargs = (2,)
    is_integer = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:
        if divisor == 1 or base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            if divisor == 0:
                raise ZeroDivisionError("integer modulo by zero in a symbolic size")
            return sympy.Integer(int(base) % int(divisor))
        whole, rest = _split_multiples(base, divisor)
        if not whole:
            return None
        return ModularIndexing(sympy.Add(*rest), divisor) if rest else sympy.Integer(0)


class BitwiseOp(sympy.Function):
    """Python's `&`, `|`, `^`, `<<`, `>>` on integers where no exact arithmetic form exists (a mask
    that is not a run of low bits, two symbolic operands, a symbolic shift count): kept opaque as
    torch's BitwiseFn_* and LShift/RShift are, folded once both operands are known, printed as the
    operator itself. Its range is bounded for non-negative operands (`bounds`)."""

    nargs = (2,)
    is_integer = True
    text = ""
    apply_int: Callable[[int, int], int] = staticmethod(lambda a, b: 0)

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(cls.apply_int(int(a), int(b)))
        return None


class BitwiseAnd(BitwiseOp):
    text = "&"
    apply_int = staticmethod(operator.and_)


class BitwiseOr(BitwiseOp):
    text = "|"
    apply_int = staticmethod(operator.or_)


class BitwiseXor(BitwiseOp):
    text = "^"
    apply_int = staticmethod(operator.xor)


class LShift(BitwiseOp):
    text = "<<"
    apply_int = staticmethod(operator.lshift)


class RShift(BitwiseOp):
    text = ">>"
    apply_int = staticmethod(operator.rshift)


def _bitwise_bounds(expr: BitwiseOp, a: Interval, b: Interval) -> Interval:
    """The range of a bitwise op of non-negative operands (anything else: unknown)."""
    if a[0] < 0 or b[0] < 0:
        return UNKNOWN

    def top(hi: float) -> float:  # the largest value with no more bits than hi
        return INF if math.isinf(hi) else float(2 ** int(hi).bit_length() - 1)

    if isinstance(expr, BitwiseAnd):
        return (0, min(a[1], b[1]))
    if isinstance(expr, BitwiseOr):
        return (max(a[0], b[0]), top(max(a[1], b[1])))
    if isinstance(expr, BitwiseXor):
        return (0, top(max(a[1], b[1])))
    if isinstance(expr, LShift):
        hi = INF if math.isinf(a[1]) or b[1] > 62 else a[1] * 2 ** int(b[1])
        return (a[0] * 2 ** int(min(b[0], 62)), hi)
    lo = 0 if b[1] > 62 else int(a[0]) >> int(b[1])
    return (lo, a[1] if math.isinf(a[1]) else int(a[1]) >> int(b[0]))


def _split_multiples(base: sympy.Expr, divisor: sympy.Expr) -> tuple[list[sympy.Expr], list[sympy.Expr]]:
    """The terms of `base` that are integer multiples of `divisor` by construction, and the rest.
    A term holding a FloorDiv stays in the rest (taking it out would only trade one floor for
    another) unless its numeric coefficient is itself a multiple of a numeric divisor
    (2*FloorDiv(s0, 2) // 2 is FloorDiv(s0, 2): no floor is added)."""
    whole, rest = [], []
    for term in sympy.Add.make_args(base):
        q = term / divisor
        clean = not term.has(FloorDiv) or (divisor.is_Integer and (term.as_coeff_Mul()[0] / divisor).is_Integer)
        if clean and (q.is_Integer or (not q.is_number and is_integral(q))):
            whole.append(term)
        else:
            rest.append(term)
    return whole, rest


def adopt_torch_functions(expr: sympy.Expr) -> sympy.Expr:
    """expr with PyTorch's own sympy functions (torch.utils._sympy.functions, found in the sizes of
    graphs that the real torch.compile hands to Kiln's lowering) replaced by this vocabulary's, so
    that one printer and one simplifier serve every size expression."""
    # torch's Min/Max are sympy Applications but not Functions: ask for every application
    if not any(type(f).__module__ == _TORCH_FUNCTIONS for f in expr.atoms(sympy.core.function.Application)):
        return expr
    from torch.utils._sympy import functions as tf

    rules: dict[type, Callable[..., sympy.Basic]] = {
        tf.FloorDiv: lambda a, b: FloorDiv(a, b),  # CleanDiv is a FloorDiv known to be exact
        tf.PythonMod: lambda a, b: ModularIndexing(a, b),
        tf.Mod: lambda a, b: ModularIndexing(a, b),
        tf.ModularIndexing: lambda a, d, m: ModularIndexing(FloorDiv(a, d), m),
        tf.CeilDiv: lambda a, b: -FloorDiv(-a, b),
        tf.Max: lambda *a: sympy.Max(*a),
        tf.Min: lambda *a: sympy.Min(*a),
        tf.PowByNatural: lambda a, b: sympy.Pow(a, b),
        # torch's float operations (its + and * of floats are sympy's own, as it computes them)
        tf.IntTrueDiv: lambda a, b: FloatTrueDiv(a, b),
        tf.FloatTrueDiv: lambda a, b: FloatTrueDiv(a, b),
        tf.ToFloat: lambda a: ToFloat(a),
        tf.FloatPow: lambda a, b: FloatPow(a, b),
        tf.OpaqueUnaryFn_sqrt: lambda a: FloatSqrt(a),
        tf.OpaqueUnaryFn_log2: lambda a: FloatLog2(a),
        tf.RoundToInt: lambda a: RoundHalfEven(a),
        tf.TruncToInt: lambda a: TruncToInt(a),
        tf.FloorToInt: lambda a: sympy.floor(a),
        tf.BitwiseFn_bitwise_and: lambda a, b: BitwiseAnd(a, b),
        tf.BitwiseFn_bitwise_or: lambda a, b: BitwiseOr(a, b),
        tf.BitwiseFn_bitwise_xor: lambda a, b: BitwiseXor(a, b),
        tf.LShift: lambda a, b: LShift(a, b),
        tf.RShift: lambda a, b: RShift(a, b),
        tf.CeilToInt: lambda a: sympy.ceiling(a),
    }

    def convert(e: sympy.Basic) -> sympy.Basic:
        if not e.args:
            return e
        args = [convert(a) for a in e.args]
        for cls, make in rules.items():
            if isinstance(e, cls):
                return make(*args)
        return e.func(*args) if args != list(e.args) else e

    return convert(expr)


_TORCH_FUNCTIONS = "torch.utils._sympy.functions"


def int_symbol(name: str, *, size: bool) -> sympy.Symbol:
    """A symbol for an integer; a size is also nonnegative (the >= 2 of backed sizes is a value
    range kept by the ShapeEnv, not a sympy assumption, so that it can be narrowed and guarded)."""
    if size:
        return sympy.Symbol(name, integer=True, nonnegative=True)
    return sympy.Symbol(name, integer=True)


def surely_positive(size: sympy.Expr) -> bool:
    """Whether a size is > 0 wherever code compiled for it runs: a positive number, or a positive
    multiple of a product of backed size symbols (`s<N>`, nonnegative: each is >= 2 under its guard,
    as sizes 0 and 1 are specialized; torch.compile's own are `positive`). Unbacked sizes (`u<N>`,
    a count known only at run time) and int arguments (`s<N>` without the assumption) may be 0."""
    size = sympy.sympify(size)
    if size.is_number:
        return bool(size > 0)
    for factor in sympy.Mul.make_args(size):
        if factor.is_number:
            if not factor > 0:
                return False
            continue
        base = factor.base if isinstance(factor, sympy.Pow) and factor.exp.is_Integer and factor.exp > 0 else factor
        if not (isinstance(base, sympy.Symbol) and str(base).startswith("s")
                and (base.is_nonnegative or base.is_positive)):
            return False
    return True


FLOAT_SYMBOL_PREFIX = "zf"


def float_symbol(name: str) -> sympy.Symbol:
    """A symbol for a Python float argument: real, never integral. Its name starts with `zf`, which
    is how kiln.lower tells it from a size when it declares a kernel argument (double, not int64)."""
    if not name.startswith(FLOAT_SYMBOL_PREFIX):
        raise ValueError(f"float_symbol({name!r}): a float symbol's name starts with {FLOAT_SYMBOL_PREFIX!r}")
    return sympy.Symbol(name, real=True)


def is_float_symbol(name: str) -> bool:
    """Whether the symbol called `name` stands for a float argument (see float_symbol)."""
    return name.startswith(FLOAT_SYMBOL_PREFIX)


def relation(kind: str, a: sympy.Expr, b: sympy.Expr) -> sympy.Basic:
    """A relation built without sympy's automatic evaluation (which asks slow assumption queries)."""
    if a.is_number and b.is_number:
        value = {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[kind]
        return sympy.true if bool(value) else sympy.false
    cls = {"eq": sympy.Eq, "ne": sympy.Ne, "lt": sympy.Lt, "le": sympy.Le, "gt": sympy.Gt, "ge": sympy.Ge}[kind]
    return cls(a, b, evaluate=False)


def negate(cond: sympy.Basic) -> sympy.Basic:
    """`not cond`, as a relation when cond is one (Eq -> Ne, Lt -> Ge, ...)."""
    if cond is sympy.true:
        return sympy.false
    if cond is sympy.false:
        return sympy.true
    if isinstance(cond, sympy.core.relational.Relational):
        return cond.negated
    # De Morgan, so that a negation always ends on relations and never wraps And/Or
    if isinstance(cond, sympy.And):
        return sympy.Or(*[negate(a) for a in cond.args])
    if isinstance(cond, sympy.Or):
        return sympy.And(*[negate(a) for a in cond.args])
    if isinstance(cond, sympy.Not):
        return cond.args[0]
    return sympy.Not(cond)


def is_truth_value(expr: sympy.Basic) -> bool:
    """Whether expr is a truth value (a comparison, And/Or/Not, true/false) rather than a number.
    Not `isinstance(expr, sympy.logic.boolalg.Boolean)`: sympy's Symbol derives from Boolean too,
    so that test calls a plain size symbol a bool."""
    return isinstance(expr, (sympy.core.relational.Relational, sympy.logic.boolalg.BooleanFunction,
                             sympy.logic.boolalg.BooleanAtom))


def is_integral(expr: sympy.Expr) -> bool:
    """Whether expr is integer-valued by construction: integer atoms, + - *, FloorDiv, Mod, Min, Max."""
    if expr.is_Integer or (expr.is_Symbol and expr.is_integer):
        return True
    if isinstance(expr, (sympy.Add, sympy.Mul, sympy.Mod, sympy.Min, sympy.Max, FloorDiv, ModularIndexing)):
        return all(is_integral(a) for a in expr.args)
    if isinstance(expr, sympy.Pow):
        return is_integral(expr.args[0]) and expr.args[1].is_Integer and expr.args[1] >= 0
    return isinstance(expr, (sympy.floor, sympy.ceiling))


def canonical(cond: sympy.Basic) -> sympy.Basic:
    """One spelling per fact, so that `a < b`, `b > a` and `a + 1 <= b` deduplicate to one guard.

    Every relation becomes `d == 0`, `d != 0`, `d >= 0` (integers: `a < b` is `b - a - 1 >= 0`) or
    `d > 0` (floats), with `d = lhs - rhs` signed so that its leading term is positive for == / !=.
    """
    if isinstance(cond, sympy.Not):
        inner = cond.args[0]
        if isinstance(inner, (sympy.core.relational.Relational, sympy.And, sympy.Or, sympy.Not)):
            return canonical(negate(inner))
        return cond
    if isinstance(cond, (sympy.And, sympy.Or)):
        return cond.func(*[canonical(a) for a in cond.args])
    if not isinstance(cond, sympy.core.relational.Relational):
        return cond
    lhs, rhs = cond.args
    if isinstance(cond, (sympy.Eq, sympy.Ne)):
        d = lhs - rhs
        if d.could_extract_minus_sign():
            d = -d
        if not d.is_number and not is_float_valued(d):
            # 4*s0 - 6 == 0 is 2*s0 - 3 == 0: a common factor says nothing (and hides duplicates);
            # a float expression is compared as it is (scaling it would round again)
            content, primitive = d.as_content_primitive()
            if content.is_Rational and content > 0:
                d = primitive
        return cond.func(d, 0, evaluate=False) if not d.is_number else relation(
            "eq" if isinstance(cond, sympy.Eq) else "ne", d, sympy.Integer(0))
    # Normalize to "big - small (>= or >) 0".
    if isinstance(cond, (sympy.Lt, sympy.Le)):
        big, small, strict = rhs, lhs, isinstance(cond, sympy.Lt)
    else:
        big, small, strict = lhs, rhs, isinstance(cond, sympy.Gt)
    d = big - small
    if d.is_number:
        return sympy.true if (d > 0 if strict else d >= 0) else sympy.false
    if strict and is_integral(d):
        d, strict = d - 1, False
    return sympy.Gt(d, 0, evaluate=False) if strict else sympy.Ge(d, 0, evaluate=False)


# ---------------------------------------------------------------------------------------------
# Interval evaluation: a sound over-approximation of the values an expression can take.


def _mul(a: float, b: float) -> float:
    if a == 0 or b == 0:
        return 0  # 0 * inf is 0 here: a zero factor makes the product zero whatever the other is
    return a * b


def _floordiv(a: float, b: float) -> float:
    if math.isinf(a):
        return a if b > 0 else -a
    if math.isinf(b):
        return 0 if a >= 0 else -1
    return math.floor(a / b) if isinstance(a, float) or isinstance(b, float) else a // b


def _as_number(x: sympy.Expr) -> float:
    return int(x) if x.is_Integer else float(x)


def bounds(expr: sympy.Expr, symbol_range: Callable[[sympy.Symbol], Interval],
           memo: dict[sympy.Expr, Interval]) -> Interval:
    """The interval expr lies in when each symbol lies in `symbol_range(symbol)`."""
    hit = memo.get(expr)
    if hit is not None:
        return hit
    result = _bounds(expr, symbol_range, memo)
    memo[expr] = result
    return result


def _bounds(expr: sympy.Expr, rng: Callable[[sympy.Symbol], Interval],
            memo: dict[sympy.Expr, Interval]) -> Interval:
    if expr.is_Number:
        if expr in (sympy.oo, -sympy.oo, sympy.nan, sympy.zoo):
            return UNKNOWN
        v = _as_number(expr)
        return (v, v)
    if expr.is_Symbol:
        return rng(expr)
    # a Pow's exponent is read as a number below, never bounded
    args: list[Interval] = [] if isinstance(expr, sympy.Pow) else [bounds(a, rng, memo) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return (sum(a[0] for a in args), sum(a[1] for a in args))
    if isinstance(expr, FloatOp):
        return _float_bounds(expr, args)
    if isinstance(expr, RoundHalfEven):  # monotone
        (lo, hi), = args
        return (lo if math.isinf(lo) else round(lo), hi if math.isinf(hi) else round(hi))
    if isinstance(expr, TruncToInt):  # monotone
        (lo, hi), = args
        return (lo if math.isinf(lo) else math.trunc(lo), hi if math.isinf(hi) else math.trunc(hi))
    if isinstance(expr, sympy.Mul):
        lo, hi = args[0]
        for a_lo, a_hi in args[1:]:
            corners = [_mul(lo, a_lo), _mul(lo, a_hi), _mul(hi, a_lo), _mul(hi, a_hi)]
            lo, hi = min(corners), max(corners)
        return (lo, hi)
    if isinstance(expr, FloorDiv):
        (a_lo, a_hi), (b_lo, b_hi) = args
        if b_lo <= 0:
            return UNKNOWN
        corners = [_floordiv(x, y) for x in (a_lo, a_hi) for y in (b_lo, b_hi)]
        return (min(corners), max(corners))
    if isinstance(expr, (sympy.Mod, ModularIndexing)):
        (a_lo, a_hi), (b_lo, b_hi) = args
        if b_lo <= 0:
            return UNKNOWN
        if a_lo >= 0 and a_hi < b_lo:
            return (a_lo, a_hi)  # the modulus never wraps
        return (0, b_hi - 1)
    if isinstance(expr, sympy.Min):
        return (min(a[0] for a in args), min(a[1] for a in args))
    if isinstance(expr, sympy.Max):
        return (max(a[0] for a in args), max(a[1] for a in args))
    if isinstance(expr, (sympy.floor, sympy.ceiling)):
        lo, hi = args[0]
        f = math.floor if isinstance(expr, sympy.floor) else math.ceil
        return (lo if math.isinf(lo) else f(lo), hi if math.isinf(hi) else f(hi))
    if isinstance(expr, sympy.Abs):
        lo, hi = args[0]
        if lo >= 0:
            return (lo, hi)
        if hi <= 0:
            return (-hi, -lo)
        return (0, max(-lo, hi))
    if isinstance(expr, sympy.Pow):
        base, exp = expr.args
        lo, hi = bounds(base, rng, memo)
        if exp.is_Integer and exp > 0 and lo >= 0:
            e = int(exp)
            return (lo ** e, hi ** e if not math.isinf(hi) else INF)
        if exp == -1 and lo > 0:
            return (0 if math.isinf(hi) else 1 / hi, 1 / lo)
        return UNKNOWN
    if isinstance(expr, BitwiseOp):
        return _bitwise_bounds(expr, args[0], args[1])
    return UNKNOWN


def _float_bounds(expr: FloatOp, args: list[Interval]) -> Interval:
    """Bounds of one IEEE operation: each is monotone in every argument (where it is defined), and
    so is its rounding, so the operation on the ends, in Python's doubles, bounds every result."""
    try:
        if isinstance(expr, ToFloat):
            (lo, hi), = args
            return (float(lo), float(hi))
        if isinstance(expr, FloatAdd):
            (a_lo, a_hi), (b_lo, b_hi) = args
            found = (float(a_lo) + float(b_lo), float(a_hi) + float(b_hi))
        elif isinstance(expr, FloatMul):
            (a_lo, a_hi), (b_lo, b_hi) = args
            corners = [float(_mul(x, y)) for x in (a_lo, a_hi) for y in (b_lo, b_hi)]
            found = (min(corners), max(corners))
        elif isinstance(expr, FloatTrueDiv):
            (a_lo, a_hi), (b_lo, b_hi) = args
            if b_lo <= 0 <= b_hi:
                return UNKNOWN
            corners = [float(x) / float(y) for x in (a_lo, a_hi) for y in (b_lo, b_hi)]
            found = (min(corners), max(corners))
        elif isinstance(expr, FloatSqrt):
            (lo, hi), = args
            if lo < 0:
                return UNKNOWN
            found = (math.sqrt(lo), math.sqrt(hi))
        elif isinstance(expr, FloatLog2):
            (lo, hi), = args
            if lo <= 0:
                return UNKNOWN
            found = (math.log2(lo), math.inf if math.isinf(hi) else math.log2(hi))
        elif isinstance(expr, FloatPow):
            (lo, hi), (e_lo, e_hi) = args
            if lo < 0 or e_lo != e_hi or e_lo <= 0 or math.isinf(e_lo):
                return UNKNOWN
            found = (float(lo) ** e_lo, float(hi) ** e_lo)  # increasing in a base >= 0
        else:
            return UNKNOWN
    except (OverflowError, ValueError, ZeroDivisionError):
        return UNKNOWN
    return UNKNOWN if any(math.isnan(v) for v in found) else found


def decide(cond: sympy.Basic, symbol_range: Callable[[sympy.Symbol], Interval],
           memo: dict[sympy.Expr, Interval], facts: dict[sympy.Basic, bool] | None = None) -> bool | None:
    """True/False when the ranges (and the canonical `facts` already known) settle cond, else None."""
    if cond is sympy.true:
        return True
    if cond is sympy.false:
        return False
    if isinstance(cond, sympy.Not):
        inner = decide(cond.args[0], symbol_range, memo, facts)
        return None if inner is None else not inner
    if isinstance(cond, sympy.And):
        parts = [decide(a, symbol_range, memo, facts) for a in cond.args]
        return False if False in parts else (True if all(p is True for p in parts) else None)
    if isinstance(cond, sympy.Or):
        parts = [decide(a, symbol_range, memo, facts) for a in cond.args]
        return True if True in parts else (False if all(p is False for p in parts) else None)
    if not isinstance(cond, sympy.core.relational.Relational):
        return None
    if facts:
        known = facts.get(canonical(cond))
        if known is not None:
            return known
    lhs, rhs = cond.args
    d = lhs - rhs if rhs != 0 else lhs
    lo, hi = bounds(d, symbol_range, memo)
    if lo == -INF and hi == INF and isinstance(d, sympy.Add):
        # s0*s1 - s1 has unbounded terms of both signs; as s1*(s0 - 1) its sign is plain.
        # factor_terms only pulls out common factors, so it stays cheap (unlike simplify).
        const, rest = d.as_coeff_Add()
        factored = sympy.factor_terms(rest)
        if factored != rest:
            f_lo, f_hi = bounds(factored, symbol_range, memo)
            lo, hi = f_lo + const, f_hi + const
    if isinstance(cond, sympy.Eq):
        return True if lo == hi == 0 else (False if lo > 0 or hi < 0 else None)
    if isinstance(cond, sympy.Ne):
        return False if lo == hi == 0 else (True if lo > 0 or hi < 0 else None)
    if isinstance(cond, sympy.Ge):
        return True if lo >= 0 else (False if hi < 0 else None)
    if isinstance(cond, sympy.Gt):
        return True if lo > 0 else (False if hi <= 0 else None)
    if isinstance(cond, sympy.Le):
        return True if hi <= 0 else (False if lo > 0 else None)
    if isinstance(cond, sympy.Lt):
        return True if hi < 0 else (False if lo >= 0 else None)
    return None


def evaluate_at(expr: sympy.Basic, values: Mapping[sympy.Symbol, int | float]) -> int | float | bool:
    """The Python value of expr with each symbol replaced by its value (used for hints)."""
    result = expr.xreplace({s: sympy.sympify(values[s]) for s in expr.free_symbols})
    if result is sympy.true or result is sympy.false:
        return bool(result)
    if isinstance(result, sympy.core.relational.Relational):
        return bool(result.doit())
    if result.is_Integer:
        return int(result)
    if result.is_Boolean:
        return bool(result)
    return float(result)
