"""SymNode: the object inside a torch.SymInt / SymFloat / SymBool, a sympy expression plus its hint.

Fake tensors carry SymInt sizes; every size arithmetic a meta kernel does (in C++ or in torch._refs)
calls a method of this node, which builds the sympy expression, computes the example value (the
hint) alongside with plain Python, and sends every yes/no question to the ShapeEnv, which answers
from the hint and records a guard. Input: nodes and Python numbers; output: new nodes or answers.
PyTorch counterpart: torch/fx/experimental/sym_node.py (the method names are the ones C++ calls).
"""
from __future__ import annotations

import builtins
import math
import operator
from typing import TYPE_CHECKING, Any, Callable

import sympy
import torch

from kiln.symbolic.expr import BitwiseAnd, BitwiseOr, BitwiseXor, FloorDiv, LShift, RShift, negate, relation
from kiln.symbolic.floats import (FloatAdd, FloatFloorDiv, FloatLog2, FloatMod, FloatMul, FloatPow, FloatSqrt,
                                  FloatTrueDiv, RoundHalfEven, ToFloat, TruncToInt, float_floor, float_sum)

if TYPE_CHECKING:
    from kiln.symbolic.shape_env import ShapeEnv

Hint = int | float | bool | None

# The graph op of math.log2 on a SymInt or SymFloat (torch.sym_sqrt's sibling, absent from torch's stubs).
sym_log2: Callable[[Any], Any] = getattr(torch, "_sym_log2")


def _py_floordiv(a: Any, b: Any) -> Any:
    return a // b


def sym_floordiv(a: Any, b: Any) -> Any:
    """Python's `a // b`, also where one operand is a float and one is symbolic: the graph op of a
    float floor division. torch.SymFloat's `//` (and SymInt's, beside a float) is floor(a / b), 10.0
    for 1.0 // 0.1 where Python's, through fmod, is 9.0; this one is SymNode.floordiv, Python's.
    On plain numbers (the graph run with real arguments) it is `//` itself."""
    symbolic = [x for x in (a, b) if isinstance(x, (torch.SymInt, torch.SymFloat))]
    floats = any(isinstance(x, (float, torch.SymFloat)) for x in (a, b))
    if not symbolic or not floats:
        return a // b
    node = symbolic[0].node
    left, right = (_node_of(x, node) for x in (a, b))
    return torch.SymFloat(left.floordiv(right))


def _node_of(x: Any, like: SymNode) -> SymNode:
    if isinstance(x, (torch.SymInt, torch.SymFloat)):
        return x.node
    return like.wrap_float(x) if isinstance(x, float) else like.wrap_int(int(x))


_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_WATCHED = 2 ** 31  # results this large (sizes never are) get a guard that keeps them within int64
_GROWING_OPS = frozenset({"add", "sub", "mul", "pow", "lshift"})


def _outside_int64(value: int) -> bool:
    return not _INT64_MIN <= value <= _INT64_MAX


class SymNode:
    """One symbolic int, float or bool. `pytype` says which; `_hint` is its example value (None when
    an unbacked symbol is involved). The attribute names `expr`, `_hint`, `shape_env` and the
    method names below are read by torch's own helpers (guard_or_false, statically_known_true)."""

    __slots__ = ("_expr", "_rv", "shape_env", "pytype", "_hint")

    def __init__(self, expr: sympy.Basic, shape_env: ShapeEnv, pytype: type, hint: Hint) -> None:
        self._expr = expr
        self._rv = shape_env._replace_version
        self.shape_env = shape_env
        self.pytype = pytype
        self._hint = hint

    # -- what the node stands for ---------------------------------------------------------------

    @property
    def expr(self) -> sympy.Basic:
        """The expression with every equality learnt so far applied (s1 -> s0, s2 -> 5)."""
        env = self.shape_env
        if self._rv != env._replace_version:
            self._expr = env.replace(self._expr)
            self._rv = env._replace_version
        return self._expr

    @property
    def hint(self) -> Hint:
        return self._hint

    def has_hint(self) -> bool:
        return self._hint is not None

    def is_int(self) -> bool:
        return self.pytype is int

    def is_float(self) -> bool:
        return self.pytype is float

    def is_bool(self) -> bool:
        return self.pytype is bool

    def is_nested_int(self) -> bool:
        return False

    def nested_int(self) -> None:
        return None

    def nested_int_coeff(self) -> None:
        return None

    def is_constant(self) -> bool:
        # torch's magic methods turn a "constant" node back into a Python number through
        # guard_int/guard_bool; they have no path for floats (get_constant asserts), so a float
        # node never claims to be constant.
        if self.pytype is float:
            return False
        e = self._expr
        if e.is_Integer or e is sympy.true or e is sympy.false:
            return True
        e = self.expr  # a learnt equality may have made it constant (s0 -> 5)
        return e is sympy.true or e is sympy.false or bool(e.is_Integer)

    def is_symbolic(self) -> bool:
        return not self.is_constant()

    def maybe_as_int(self) -> int | None:
        e = self.expr
        return int(e) if self.pytype is int and e.is_Integer else None

    def maybe_as_float(self) -> float | None:
        e = self.expr
        return float(e) if self.pytype is float and e.is_Number else None

    def maybe_as_bool(self) -> bool | None:
        e = self.expr
        return True if e is sympy.true else (False if e is sympy.false else None)

    def wrap_int(self, num: int) -> SymNode:
        # torch wraps every int operand (strides, 1, 0) in a node; small ones are shared
        cache = self.shape_env._int_nodes
        node = cache.get(num)
        if node is None:
            node = SymNode(sympy.Integer(num), self.shape_env, int, num)
            if -1024 <= num <= 1024:
                cache[num] = node
        return node

    def wrap_float(self, num: float) -> SymNode:
        return SymNode(sympy.Float(num), self.shape_env, float, num)

    def wrap_bool(self, num: bool) -> SymNode:
        return SymNode(sympy.true if num else sympy.false, self.shape_env, bool, num)

    def with_shape_env(self, shape_env: ShapeEnv) -> SymNode:
        return SymNode(self._expr, shape_env, self.pytype, self._hint)

    def clone(self) -> SymNode:
        return self

    def __deepcopy__(self, memo: dict) -> SymNode:
        # A node is a value (an expression in its ShapeEnv); copying a graph whose meta holds
        # SymInts must not fork the environment that its guards are recorded in.
        return self

    def __copy__(self) -> SymNode:
        return self

    def str(self) -> builtins.str:
        return builtins.str(self.expr)

    def _graph_repr(self) -> builtins.str:
        return builtins.str(self.expr)

    def __str__(self) -> builtins.str:
        return builtins.str(self.expr)

    def __repr__(self) -> builtins.str:
        return f"SymNode({self.expr}, hint={self._hint})"

    # -- building new nodes -----------------------------------------------------------------------

    def _make(self, op: builtins.str, args: tuple[SymNode, ...], build: Callable[..., sympy.Basic],
              py: Callable[..., Any], pytype: type) -> SymNode:
        env = self.shape_env
        rv = env._replace_version
        exprs = []
        hints = []
        constant = pytype is not float
        for a in args:  # a plain loop: this is the hottest function of shape propagation
            e = a._expr if a._rv == rv else a.expr
            exprs.append(e)
            hints.append(a._hint)
            if constant and not (e.is_Number or e is sympy.true or e is sympy.false):
                constant = False
        hint = None if None in hints else pytype(py(*hints))
        if constant:
            # constants in, constant out: no sympy, no cache (C++ often multiplies plain strides)
            const = sympy.Integer(hint) if pytype is int else (sympy.true if hint else sympy.false)
            return SymNode(const, env, pytype, hint)
        if pytype is int and op in _GROWING_OPS and hint is not None:
            wide = _outside_int64(hint) or any(e.is_Integer and _outside_int64(int(e)) for e in exprs)
            if wide:
                # Python's ints have no width, but the lowered code computes sizes in int64: a value
                # (or constant) past it is decided here, each operand guarded equal to its hint.
                for a in args:
                    if not a.is_constant():
                        a.guard_int("", 0)
                return SymNode(sympy.Integer(hint), env, int, hint)
        key = (op, *exprs)
        expr = env._op_cache.get(key)
        if expr is None:
            expr = build(*exprs)
            env._op_cache[key] = expr
        if pytype is int and op in _GROWING_OPS and hint is not None and (op in ("pow", "lshift") or abs(hint) >= _WATCHED):
            # a power or a shift, or a product already this large, can leave int64 for other values of its
            # symbols: the graph is kept to the values for which it does not
            for bound in (relation("ge", expr, sympy.Integer(_INT64_MIN)), relation("le", expr, sympy.Integer(_INT64_MAX))):
                if env._static_value(bound) is None:
                    env._record(bound)
        if pytype is bool and expr is not sympy.true and expr is not sympy.false:
            # Fold what is known (s0 == 1 with s0 >= 2, or a fact learnt since the expression was
            # cached): the answer needs no guard, and a constant node lets torch's magic methods
            # hand back a plain bool. _static_value is memoized, so this stays a dict lookup.
            known = env._static_value(expr)
            if known is not None:
                expr = sympy.true if known else sympy.false
        return SymNode(expr, env, pytype, hint)

    def _num(self, other: SymNode) -> type:
        return float if float in (self.pytype, other.pytype) else int

    # A float result is one IEEE operation (kiln.symbolic.floats), which sympy never folds into
    # its neighbours: (s0 / 3) * 2 stays two roundings, as eager computes it.
    def add(self, other: SymNode) -> SymNode:
        if self._num(other) is float:
            return self._make("fadd", (self, other), FloatAdd, operator.add, float)
        return self._make("add", (self, other), operator.add, operator.add, int)

    def sub(self, other: SymNode) -> SymNode:
        if self._num(other) is float:
            return self._make("fsub", (self, other), lambda a, b: FloatAdd(a, -b), operator.sub, float)
        return self._make("sub", (self, other), operator.sub, operator.sub, int)

    def mul(self, other: SymNode) -> SymNode:
        if self._num(other) is float:
            return self._make("fmul", (self, other), FloatMul, operator.mul, float)
        return self._make("mul", (self, other), operator.mul, operator.mul, int)

    def mod(self, other: SymNode) -> SymNode:
        if self._num(other) is float:
            return self._make("fmod", (self, other), FloatMod, FloatMod.python, float)
        return self._make("mod", (self, other), sympy.Mod, operator.mod, self._num(other))

    def int_floordiv(self, other: SymNode) -> SymNode:
        return self._make("floordiv", (self, other), FloorDiv, _py_floordiv, int)

    def floordiv(self, other: SymNode) -> SymNode:
        if self._num(other) is int:
            return self.int_floordiv(other)
        return self._make("ffloordiv", (self, other), FloatFloorDiv, FloatFloorDiv.python, float)

    def int_truediv(self, other: SymNode) -> SymNode:
        return self._make("truediv", (self, other), FloatTrueDiv, operator.truediv, float)

    def float_truediv(self, other: SymNode) -> SymNode:
        return self._make("truediv", (self, other), FloatTrueDiv, operator.truediv, float)

    def truediv(self, other: SymNode) -> SymNode:
        return self.float_truediv(other)

    def pow_by_natural(self, other: SymNode) -> SymNode:
        return self._make("pow", (self, other), sympy.Pow, operator.pow, int)

    def float_pow(self, other: SymNode) -> SymNode:
        return self._make("fpow", (self, other), FloatPow, operator.pow, float)

    def pow(self, other: SymNode) -> SymNode:
        if self._num(other) is float:
            return self.float_pow(other)
        # Python: int ** negative int is a float, so the exponent's sign is a decision
        if other.ge(self.wrap_int(0)).guard_bool("", 0):
            return self.pow_by_natural(other)
        return self.sym_float().float_pow(other.sym_float())

    def _statically_ge(self, other: SymNode) -> bool | None:
        return self.shape_env._static_value(relation("ge", self.expr, other.expr))

    def sym_max(self, other: SymNode) -> SymNode:
        # max(1, s0) is s0 when s0 >= 2: settle it from the ranges instead of keeping a Max
        # that every later comparison would have to see through.
        ge = self._statically_ge(other)
        if ge is not None and self.pytype is other.pytype:
            return self if ge else other
        return self._make("max", (self, other), sympy.Max, max, self._num(other))

    def sym_min(self, other: SymNode) -> SymNode:
        ge = self._statically_ge(other)
        if ge is not None and self.pytype is other.pytype:
            return other if ge else self
        return self._make("min", (self, other), sympy.Min, min, self._num(other))

    def sym_sum(self, args: tuple[SymNode, ...]) -> SymNode:
        if any(a.pytype is float for a in args):
            return self._make("fsum", tuple(args), lambda *xs: float_sum(list(xs)), lambda *xs: sum(xs), float)
        return self._make("sum", tuple(args), lambda *xs: sympy.Add(*xs), lambda *xs: sum(xs), int)

    def neg(self) -> SymNode:
        return self._make("neg", (self,), operator.neg, operator.neg, self.pytype)

    def pos(self) -> SymNode:
        return self

    def abs(self) -> SymNode:
        return self._make("abs", (self,), sympy.Abs, builtins.abs, self.pytype)

    def sym_float(self) -> SymNode:
        hint = None if self._hint is None else float(self._hint)
        if self.pytype is int:
            return self._make("float", (self,), ToFloat, float, float)
        return SymNode(self.expr, self.shape_env, float, hint)

    def sym_int(self) -> SymNode:
        return self.trunc()

    def floor(self) -> SymNode:
        return self._make("floor", (self,), float_floor, math.floor, int)

    def ceil(self) -> SymNode:
        return self._make("ceil", (self,), lambda e: float_floor(e, ceiling=True), math.ceil, int)

    def trunc(self) -> SymNode:
        if self.pytype is int:
            return self
        # toward zero in one function: floor or ceiling by the sign would guard the sign
        return self._make("trunc", (self,), TruncToInt, math.trunc, int)

    def round(self, ndigits: int | None = None) -> SymNode:
        if ndigits is None:
            if self.pytype is int:
                return self
            # round-half-even to an int, kept symbolic (`round(n / 4)`): C's nearbyint is the same rule
            return self._make("round", (self,), RoundHalfEven, builtins.round, int)
        # round(f, n) rounds the exact decimal expansion, which no C or Triton form computes
        # bit-exactly: the value is specialized (guarded)
        value = self.guard_float("", 0)
        return self.wrap_float(builtins.round(value, ndigits))

    def is_integer(self) -> SymNode:
        return self.wrap_bool(float(self.guard_float("", 0)).is_integer())

    # comparisons give bool nodes
    def eq(self, other: SymNode) -> SymNode:
        return self._make("eq", (self, other), lambda a, b: relation("eq", a, b), operator.eq, bool)

    def ne(self, other: SymNode) -> SymNode:
        return self._make("ne", (self, other), lambda a, b: relation("ne", a, b), operator.ne, bool)

    def lt(self, other: SymNode) -> SymNode:
        return self._make("lt", (self, other), lambda a, b: relation("lt", a, b), operator.lt, bool)

    def le(self, other: SymNode) -> SymNode:
        return self._make("le", (self, other), lambda a, b: relation("le", a, b), operator.le, bool)

    def gt(self, other: SymNode) -> SymNode:
        return self._make("gt", (self, other), lambda a, b: relation("gt", a, b), operator.gt, bool)

    def ge(self, other: SymNode) -> SymNode:
        return self._make("ge", (self, other), lambda a, b: relation("ge", a, b), operator.ge, bool)

    def sym_and(self, other: SymNode) -> SymNode:
        return self._make("and", (self, other), sympy.And, lambda a, b: a and b, bool)

    def sym_or(self, other: SymNode) -> SymNode:
        return self._make("or", (self, other), sympy.Or, lambda a, b: a or b, bool)

    and_ = sym_and
    or_ = sym_or

    def sym_not(self) -> SymNode:
        return self._make("not", (self,), negate, operator.not_, bool)

    def sym_ite(self, then_node: SymNode, else_node: SymNode) -> SymNode:
        return self._make("ite", (self, then_node, else_node),
                          lambda c, t, e: sympy.Piecewise((t, c), (e, True)),
                          lambda c, t, e: t if c else e, then_node.pytype)

    # Operations sympy cannot keep exact for sizes: decide the operands, return a constant.
    def _specialized(self, other: SymNode, fn: Callable[[int, int], int]) -> SymNode:
        return self.wrap_int(fn(self.guard_int("", 0), other.guard_int("", 0)))

    # A bitwise op with a constant low-bit mask is modular arithmetic, exact for every int in
    # Python's two's-complement semantics: with p = 2**k, `n & (p - 1)` is n % p, `n & -p` is
    # n - n % p, `n | (p - 1)` is n - n % p + p - 1 and `n ^ (p - 1)` is n + p - 1 - 2 * (n % p).
    # torch.compile keeps `n & 1` or `(n + 7) & -8` symbolic; deciding n instead would recompile
    # for every size (and break mark_dynamic). Any other pair of ints (`n | 8`, `a & b` of two
    # sizes) is an opaque BitwiseOp of the expression, symbolic as torch's BitwiseFn_* are.
    def _masked(self, other: SymNode) -> tuple[SymNode, int, int] | None:
        if self.pytype is not int or other.pytype is not int:
            return None
        for value, mask in ((self, other.maybe_as_int()), (other, self.maybe_as_int())):
            if mask is None:
                continue
            low = mask if mask >= 0 else -mask - 1  # -p is ~(p - 1): the same low bits, inverted
            if low & (low + 1) == 0:
                return value, low + 1, mask
        return None

    def _opaque(self, other: SymNode, op: builtins.str, build: Callable[..., sympy.Basic],
                fn: Callable[[int, int], int]) -> SymNode:
        if self.pytype is not int or other.pytype is not int:
            return self._specialized(other, fn)
        return self._make(op, (self, other), build, fn, int)

    def bitwise_and(self, other: SymNode) -> SymNode:
        masked = self._masked(other)
        if masked is None:
            return self._opaque(other, "bitwise_and", BitwiseAnd, operator.and_)
        value, p, mask = masked
        low = value.mod(value.wrap_int(p))
        return low if mask >= 0 else value.sub(low)

    def bitwise_or(self, other: SymNode) -> SymNode:
        masked = self._masked(other)
        if masked is None:
            return self._opaque(other, "bitwise_or", BitwiseOr, operator.or_)
        value, p, mask = masked
        low = value.mod(value.wrap_int(p))
        if mask >= 0:
            return value.sub(low).add(value.wrap_int(p - 1))
        return low.add(value.wrap_int(mask))

    def bitwise_xor(self, other: SymNode) -> SymNode:
        masked = self._masked(other)
        if masked is None or masked[2] < 0:
            return self._opaque(other, "bitwise_xor", BitwiseXor, operator.xor)
        value, p, _ = masked
        low = value.mod(value.wrap_int(p))
        return value.add(value.wrap_int(p - 1)).sub(low.mul(value.wrap_int(2)))

    # A shift by a known count is a product or a floor division by a power of two, which stay
    # symbolic in the size (`n >> 1` of a length is n // 2); a symbolic count (`1 << n`) is an
    # opaque shift, its sign guarded (Python raises for a negative count).
    def _shift_count(self, other: SymNode) -> int | None:
        if other.maybe_as_int() is None and self.pytype is int and other.pytype is int:
            if not other.ge(other.wrap_int(0)).guard_bool("", 0):
                raise ValueError("negative shift count")
            return None
        count = other.guard_int("", 0)
        if count < 0:
            raise ValueError("negative shift count")
        return count

    def lshift(self, other: SymNode) -> SymNode:
        if self.pytype is not int:
            return self._specialized(other, operator.lshift)
        count = self._shift_count(other)
        if count is None:
            return self._make("lshift", (self, other), LShift, operator.lshift, int)
        return self.mul(self.wrap_int(2 ** count))

    def rshift(self, other: SymNode) -> SymNode:
        if self.pytype is not int:
            return self._specialized(other, operator.rshift)
        count = self._shift_count(other)
        if count is None:
            return self._make("rshift", (self, other), RShift, operator.rshift, int)
        return self.int_floordiv(self.wrap_int(2 ** count))

    def _math(self, fn: Callable[[float], float]) -> SymNode:
        return self.wrap_float(fn(self.guard_float("", 0)))

    def sym_sqrt(self) -> SymNode:
        # Kept symbolic (a temperature's sqrt, an attention scale): a graph input `f` computes
        # sqrt(f) at run time. Python's math.sqrt raises below 0 where a kernel's would give nan,
        # so the graph assumes (guards) the sign its example had; a negative example specializes.
        if self.pytype is bool or not self.ge(self.wrap_float(0.0)).guard_bool("", 0):
            return self._math(math.sqrt)
        return self._make("sqrt", (self,), FloatSqrt, math.sqrt, float)

    def sym_log2(self) -> SymNode:
        # Kept symbolic as torch.compile keeps it (`int(math.log2(n))` levels of a pyramid). Python's
        # math.log2 raises at 0 and below, a kernel's gives -inf or nan: the graph assumes (guards)
        # the example's sign, and a non-positive example specializes.
        if self.pytype is bool or not self.gt(self.wrap_float(0.0)).guard_bool("", 0):
            return self._math(math.log2)
        return self._make("log2", (self,), FloatLog2, math.log2, float)

    def sym_cos(self) -> SymNode:
        return self._math(math.cos)

    def sym_sin(self) -> SymNode:
        return self._math(math.sin)

    def sym_tan(self) -> SymNode:
        return self._math(math.tan)

    def sym_cosh(self) -> SymNode:
        return self._math(math.cosh)

    def sym_sinh(self) -> SymNode:
        return self._math(math.sinh)

    def sym_tanh(self) -> SymNode:
        return self._math(math.tanh)

    def sym_asin(self) -> SymNode:
        return self._math(math.asin)

    def sym_acos(self) -> SymNode:
        return self._math(math.acos)

    def sym_atan(self) -> SymNode:
        return self._math(math.atan)

    # Layout predicates C++ declares; built from the same eq/mul nodes so they fold the same way.
    def _contiguous_in_order(self, sizes: list[SymNode], strides: list[SymNode], order: list[int]) -> SymNode:
        expected = self.wrap_int(1)
        ok = self.wrap_bool(True)
        any_zero = self.wrap_bool(False)
        for d in order:
            size, stride = sizes[d], strides[d]
            ok = ok.sym_and(size.eq(self.wrap_int(1)).sym_or(stride.eq(expected)))
            any_zero = any_zero.sym_or(size.eq(self.wrap_int(0)))
            expected = expected.mul(size)
        return any_zero.sym_or(ok)

    def is_contiguous(self, sizes: list[SymNode], strides: list[SymNode]) -> SymNode:
        return self._contiguous_in_order(sizes, strides, list(reversed(range(len(sizes)))))

    def is_channels_last_contiguous_2d(self, sizes: list[SymNode], strides: list[SymNode]) -> SymNode:
        return self._contiguous_in_order(sizes, strides, [1, 3, 2, 0])

    def is_channels_last_contiguous_3d(self, sizes: list[SymNode], strides: list[SymNode]) -> SymNode:
        return self._contiguous_in_order(sizes, strides, [1, 4, 3, 2, 0])

    def is_channels_last_strides_2d(self, sizes: list[SymNode], strides: list[SymNode]) -> SymNode:
        raise NotImplementedError("kiln SymNode: is_channels_last_strides_2d on symbolic sizes is not supported")

    def is_channels_last_strides_3d(self, sizes: list[SymNode], strides: list[SymNode]) -> SymNode:
        raise NotImplementedError("kiln SymNode: is_channels_last_strides_3d on symbolic sizes is not supported")

    def is_non_overlapping_and_dense(self, sizes: list[SymNode], strides: list[SymNode]) -> SymNode:
        # Dense in the order of the strides' example values; the order itself is decided (guarded)
        # by comparing the strides, so a different order at run time fails a guard.
        hints = [0 if s._hint is None else s._hint for s in strides]
        order = sorted(range(len(sizes)), key=lambda d: hints[d])
        for a, b in zip(order, order[1:]):
            strides[a].le(strides[b]).guard_bool("", 0)
        return self._contiguous_in_order(sizes, strides, order)

    def is_non_overlapping_and_dense_indicator(self, sizes: list[SymNode], strides: list[SymNode]) -> SymNode:
        flag = self.is_non_overlapping_and_dense(sizes, strides)
        return self.wrap_int(1 if flag.guard_bool("", 0) else 0)

    # -- questions: each goes to the ShapeEnv, which answers and records a guard ----------------

    # A constant stays constant whatever is learnt later, so `_expr` answers without the env: torch's
    # magic methods call guard_int/guard_bool on every constant result to unwrap it.
    def guard_bool(self, file: builtins.str, line: int) -> bool:
        e = self._expr
        if e is sympy.true or e is sympy.false:
            return e is sympy.true
        return bool(self.shape_env.evaluate(self))

    def guard_int(self, file: builtins.str, line: int) -> int:
        e = self._expr
        if e.is_Integer:
            return int(e)
        return int(self.shape_env.evaluate(self))

    def guard_float(self, file: builtins.str, line: int) -> float:
        return float(self.shape_env.evaluate(self))

    def bool_(self) -> bool:
        return self.guard_bool("", 0)

    def int_(self) -> int:
        return self.guard_int("", 0)

    def expect_true(self, file: builtins.str, line: int) -> bool:
        return self.shape_env.expect_true(self)

    def expect_size(self, file: builtins.str, line: int) -> bool:
        return self.ge(self.wrap_int(0)).expect_true(file, line)

    def guard_size_oblivious(self, file: builtins.str, line: int) -> bool:
        return bool(self.shape_env.evaluate(self, size_oblivious=True))

    def guard_or_false(self, file: builtins.str, line: int) -> bool:
        return bool(self.shape_env.evaluate(self, fallback_value=False))

    def guard_or_true(self, file: builtins.str, line: int) -> bool:
        return bool(self.shape_env.evaluate(self, fallback_value=True))

    def statically_known_true(self, file: builtins.str, line: int) -> bool:
        return self.shape_env._static_value(self.expr) is True


def wrap(node: SymNode) -> torch.SymInt | torch.SymFloat | torch.SymBool:
    """The torch scalar type that carries this node."""
    if node.pytype is int:
        return torch.SymInt(node)
    if node.pytype is float:
        return torch.SymFloat(node)
    return torch.SymBool(node)


_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic(x: object) -> bool:
    """Whether x is a SymInt/SymFloat/SymBool whose value is not a known constant."""
    return isinstance(x, _SYM_TYPES) and x.node.is_symbolic()


def expr_of(x: int | float | bool | torch.SymInt | torch.SymFloat | torch.SymBool) -> sympy.Basic:
    """The sympy expression x stands for (a number for plain Python values)."""
    if isinstance(x, _SYM_TYPES):
        return x.node.expr
    if isinstance(x, bool):
        return sympy.true if x else sympy.false
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, float):
        return sympy.Float(x)
    raise TypeError(f"expr_of: expected an int, float, bool or torch.Sym*, got {type(x).__name__}")
