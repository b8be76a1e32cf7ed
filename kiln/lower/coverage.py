"""Every element a value-checking op computes in eager is checked by a kernel, even when its value
is dead, read only in part, or folded away by the C++ compiler.

Lazy values compose: an indexing or integer-division node is inlined into the loads of its readers
(kiln.lower.graph), so its checks (kiln.lower.checks: `index_ok`, a divisor's zero test) run only
at the positions those readers load, and only where the compiled code still needs the value. Eager
checks every element the op computes, read or not. Three ways a check is lost:
- the node is dead (kept by every dead-code pass, kiln.fake.value_checks, but nothing loads it);
- its readers load part of it (`embedding(i, w)[0]`, `(a // b)[:1]`, an empty slice);
- its value reaches nothing the compiler must compute: `(a // b) * 0` or `where(true, a, a // b)` in
  C++ (the recorder `kiln_record` is declared const so that GCC hoists an embedding row's check out
  of the vectorized loop, which also lets it drop a call whose result is unused), or a branch of a
  `where` the compiler computes only where it is taken.

So the lowering tags, per FX node with checks of its own, each load of its lazy value (`track`):
at which index it was loaded and which check ops that load made. After the graph is lowered
(`add_check_passes`), a node is covered when some buffer that is computed for sure (a graph output,
a buffer nothing reads, one an extern or scatter reads, or one read through a strict use by such a
buffer) holds all of one load's checks where the compiler cannot drop them (reached from the stored
value through ops whose result depends on them: `strict_values`) and that load runs over the node's
whole domain (each dim of it a distinct loop variable of the buffer over the same size). Every other
checked node gets a check-only pass: a sum over its whole domain of its value (and of any own check
the value does not depend on), into a one-element buffer nothing reads. The common case, a node
read whole by a kernel that stores what it computes, gets none, also where one part of a
concatenation reads it (`_regions`: that part's branch is computed over the part's whole range).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import sympy
import torch
from torch.utils import _pytree as pytree

from kiln.lower import ops
from kiln.lower.checks import needs_divisor_check
from kiln.lower.ir import (Buffer, BufferRef, Const, Extern, Index, Layout, Load, Masked, Op, Pointwise, Reduction,
                           Scan, Scatter, Value, contiguous_strides, index_vars, simplify_index, walk)
from kiln.lower.lowerings import LoweringContext, TensorValue


def is_check(v: Value) -> bool:
    """An op that records a failure in the kernel's error record (kiln.lower.checks)."""
    return isinstance(v, Op) and (v.name == "index_ok" or needs_divisor_check(v))


def _checks_in(body: Value) -> frozenset[Value]:
    return frozenset(v for v in walk(body) if is_check(v))


@dataclass(frozen=True)
class _Load:
    """One load of a checked node's lazy value: where, and the check ops of its own it made."""

    node: str
    idx: tuple[sympy.Expr, ...]
    own: frozenset[Value]


@dataclass(frozen=True)
class _Tracked:
    value: TensorValue
    own_count: int  # own checks of a load at the node's own index


class CheckTracker:
    """The loads of every checked node's lazy value during one graph's lowering."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Tracked] = {}
        self.by_check: dict[Value, list[_Load]] = {}
        self._frames: list[set[Value]] = []  # per load in progress: checks its inner loads made

    def track(self, name: str, tv: TensorValue) -> None:
        """Wrap `tv`'s loader (in place) to record each load, if its body has checks of its own."""
        if tv.view is not None or name in self.nodes:
            return
        inner = tv.loader

        def loader(idx: Sequence[sympy.Expr]) -> Value:
            frame: set[Value] = set()
            self._frames.append(frame)
            try:
                body = inner(idx)
            finally:
                self._frames.pop()
            checks = _checks_in(body)
            if self._frames:
                self._frames[-1].update(checks)
            own = checks - frame
            if own:
                load = _Load(name, tuple(sympy.sympify(i) for i in idx), own)
                for c in own:
                    self.by_check.setdefault(c, []).append(load)
            return body

        self._frames.append(set())
        try:
            upstream_checks = self._frames[-1]
            body = inner(index_vars("i", tv.ndim))
        finally:
            self._frames.pop()
        own_count = len(_checks_in(body) - upstream_checks)
        if own_count == 0:
            return
        self.nodes[name] = _Tracked(tv, own_count)
        tv.loader = loader


# ----------------------------------------------------------------------------- what the compiler keeps

_RANGE_LIMITING = frozenset({"abs", "sign", "relu", "bitwise_and", "bitwise_or", "rshift", "lshift", "mod", "fmod",
                             "floordiv", "truncdiv", "truediv", "maximum", "minimum", "isnan", "isinf", "isfinite",
                             "signbit", "logical_not", "logical_and", "logical_or", "logical_xor", "eq", "ne", "lt",
                             "le", "gt", "ge", "index_ok"})
# integer ops with a constant operand that can make the result constant whatever the other is
# (x & 0, x | -1, x % 1, min(x, INT_MIN), x >> 63 of a known sign): the other operand is not strict
_FOLDABLE_WITH_CONSTANT = frozenset({"bitwise_and", "bitwise_or", "mod", "fmod", "floordiv", "truncdiv", "truediv",
                                     "lshift", "rshift", "maximum", "minimum", "fmax", "fmin"})
_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
# x - x, x ^ x, x < x, min(x, x), x // x: equal operands fold
_FOLDABLE_WITH_ITSELF = _COMPARISONS | _FOLDABLE_WITH_CONSTANT | frozenset({"sub", "bitwise_xor", "logical_and",
                                                                             "logical_or", "logical_xor"})


def _constant(v: Value) -> int | float | bool | None:
    """The number a value is for sure (a constant, a numeric index, a cast of one), else None."""
    if isinstance(v, Const):
        return v.value
    if isinstance(v, Index) and v.expr.is_number:
        return int(v.expr)
    if isinstance(v, Op) and v.name == "to_dtype":
        return _constant(v.args[0])
    return None


def _strict_args(v: Value) -> tuple[Value, ...]:
    """The operands a computed `v` needs computed everywhere: not folded away by what the compiler
    knows of the others, nor computed only where a branch is taken."""
    if isinstance(v, Load):
        return () if v.extra is None else (v.extra,)
    if isinstance(v, Masked):
        return (v.mask,) if v.body != v.other else ()
    if not isinstance(v, Op):
        return ()
    if v.name == "where":
        return (v.args[0],) if v.args[1] != v.args[2] else ()
    if v.name in ("logical_or",):  # `||` may skip its second operand
        return v.args[:1]
    if len(v.args) == 2 and v.args[0] == v.args[1] and v.name in _FOLDABLE_WITH_ITSELF:
        return ()
    if v.name == "to_dtype" and v.args and _narrowing(v.args[0].dtype, v.dtype):
        return ()  # (x * 256).to(uint8) is 0
    integer = bool(v.args) and not v.args[0].dtype.is_floating_point
    if integer and len(v.args) == 2:
        kept = []
        for k, a in enumerate(v.args):
            other = _constant(v.args[1 - k])
            if other is None:
                kept.append(a)
            elif v.name == "mul" and other != 0:
                kept.append(a)
            elif v.name in _COMPARISONS and _inside_range(other, a.dtype) and not _range_limited(a):
                kept.append(a)
            elif v.name not in _FOLDABLE_WITH_CONSTANT and v.name not in _COMPARISONS and v.name != "mul":
                kept.append(a)
        return tuple(kept)
    return v.args


def _narrowing(source: torch.dtype, target: torch.dtype) -> bool:
    if source.is_floating_point or target.is_floating_point or target == torch.bool:
        return False
    bits = {torch.bool: 1, torch.uint8: 8, torch.int8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}
    return bits.get(target, 64) < bits.get(source, 64)


def _inside_range(c: Any, dtype: torch.dtype) -> bool:
    if dtype == torch.bool or isinstance(c, float):
        return False
    info = torch.iinfo(dtype)
    return info.min < int(c) < info.max


def _range_limited(v: Value) -> bool:
    return isinstance(v, Op) and (v.name in _RANGE_LIMITING or v.name == "to_dtype" and v.dtype != torch.int64)


def strict_values(roots: Iterable[Value]) -> set[Value]:
    """The values a kernel computes at every point of its loops whatever the compiler folds: those
    reached from the stored roots through strict operands only."""
    seen: set[Value] = set()
    todo = list(roots)
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        todo.extend(_strict_args(v))
    return seen


# ----------------------------------------------------------------------------- which buffers are computed

def _bodies(b: Buffer) -> list[Value]:
    if isinstance(b, (Pointwise, Reduction, Scan)):
        return [b.body]
    if isinstance(b, Scatter):
        return [v for v in (b.body, b.extra, b.mask) if v is not None]
    return []


def _loop_ranges(b: Buffer) -> dict[sympy.Symbol, sympy.Expr]:
    if isinstance(b, Scatter):
        return dict(zip(index_vars("i", len(b.ranges)), b.ranges))
    out = dict(zip(index_vars("i", len(b.layout.sizes)), b.layout.sizes))
    if isinstance(b, Reduction):
        out.update(zip(index_vars("r", len(b.reduction_ranges)), b.reduction_ranges))
    return out


def _observable(buffers: Sequence[Buffer], strict: dict[str, set[Value]], outputs: set[str]) -> set[str]:
    """The buffers whose every element the compiled code computes for sure."""
    readers: dict[str, list[tuple[str, bool]]] = {}
    sure: set[str] = set(outputs)
    for b in buffers:
        if isinstance(b, Extern):
            sure.update(a.name for a in _refs(b))
        if isinstance(b, Scatter):
            sure.add(b.target)
            sure.add(b.name)
        for body in _bodies(b):
            for v in walk(body):
                if isinstance(v, Load):
                    readers.setdefault(v.buffer, []).append((b.name, v in strict[b.name]))
    for b in reversed(buffers):  # readers come after what they read
        if b.name in sure or isinstance(b, Extern):
            continue
        read = readers.get(b.name)
        if not read or any(is_strict and reader in sure for reader, is_strict in read):
            sure.add(b.name)
    return sure


def _refs(b: Extern) -> list[BufferRef]:
    return [a for a in pytree.tree_leaves((b.args, b.kwargs)) if isinstance(a, BufferRef)]


def _covers(idx: Sequence[sympy.Expr], sizes: Sequence[sympy.Expr], ranges: dict[sympy.Symbol, sympy.Expr]) -> bool:
    """Whether loading at `idx` inside loops over `ranges` reaches every element of a value of `sizes`:
    the row-major position the load reads is a mixed-radix number over distinct loop variables
    (each the next digit: its coefficient the product of the ranges below it) covering the value's
    element count. So a transposed read, a view that splits or joins dims, and a broadcast
    (a variable the load does not use) all cover it; a slice, a single row or a diagonal do not."""
    position = simplify_index(sum((e * s for e, s in zip(idx, contiguous_strides(sizes))), sympy.Integer(0)))
    position = sympy.expand(position.xreplace({v: sympy.Integer(0) for v, r in ranges.items() if r == 1}))
    digits: dict[sympy.Symbol, sympy.Expr] = {}
    for term in sympy.Add.make_args(position):
        if term == 0:
            continue
        coefficient, variable = term.as_independent(*ranges)
        if not isinstance(variable, sympy.Symbol) or variable not in ranges or coefficient.free_symbols & set(ranges):
            return False  # an offset (a slice), a product of variables, a floor division left over
        digits[variable] = coefficient
    place: sympy.Expr = sympy.Integer(1)
    while digits:
        nxt = next((v for v, c in digits.items() if sympy.expand(c - place) == 0), None)
        if nxt is None:
            return False
        place = place * ranges[nxt]
        del digits[nxt]
    return sympy.expand(place - sympy.Mul(*sizes)) == 0


def uncovered(tracker: CheckTracker, buffers: Sequence[Buffer], outputs: Sequence[Any]) -> list[str]:
    """The checked nodes that no computed buffer checks over their whole domain, in lowering order."""
    if not tracker.nodes:
        return []
    strict = {b.name: strict_values(_bodies(b)) for b in buffers}
    sure = _observable(buffers, strict, {o.name for o in outputs if isinstance(o, BufferRef)})
    covered: set[str] = set()
    for b in buffers:
        if b.name not in sure:
            continue
        for values, ranges, shift in _regions(strict[b.name], _loop_ranges(b)):
            for v in values:
                for load in tracker.by_check.get(v, ()):
                    tracked = tracker.nodes[load.node]
                    if load.node in covered or len(load.own) != tracked.own_count:
                        continue
                    idx = [sympy.sympify(i).xreplace(shift) for i in load.idx] if shift else load.idx
                    if load.own <= values and _covers(idx, tracked.value.sizes, ranges):
                        covered.add(load.node)
    return [name for name, t in tracker.nodes.items() if name not in covered and _nonempty(t.value.sizes)]


_Region = tuple[set[Value], dict[sympy.Symbol, sympy.Expr], dict[sympy.Symbol, sympy.Expr]]


def _split_point(mask: Value, ranges: dict[sympy.Symbol, sympy.Expr]) -> tuple[sympy.Symbol, sympy.Expr] | None:
    """(i, c) of a mask `i < c` over a loop variable i and a bound free of loop variables: a
    concatenation's test of which part an element is in (kiln.lower.lowerings.views.cat)."""
    if not (isinstance(mask, Op) and mask.name == "lt" and len(mask.args) == 2
            and all(isinstance(a, Index) for a in mask.args)):
        return None
    var, bound = (a.expr for a in mask.args)  # type: ignore[attr-defined]
    if not isinstance(var, sympy.Symbol) or var not in ranges or bound.free_symbols & set(ranges):
        return None
    return var, bound


def _nonnegative(e: sympy.Expr) -> bool:
    e = sympy.expand(e)
    return bool(e.is_number and e >= 0) or e.is_nonnegative is True


def _lesser(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
    return a if _nonnegative(b - a) else b if _nonnegative(a - b) else None


def _greater(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
    return a if _nonnegative(a - b) else b if _nonnegative(b - a) else None


def _regions(values: set[Value], ranges: dict[sympy.Symbol, sympy.Expr]) -> list[_Region]:
    """The strict values of a kernel, then, for each branch of a part test `i < c` it computes for
    sure, the values that branch computes at every point of its part of i's range: (values, the
    ranges with i's range that part's length, i -> i + the part's start). A concatenation stores every
    element of each part, so a checked value read whole by one part is checked whole, as where it is
    read unmasked. Other masks (a pad's in-bounds test) give no region."""
    out: list[_Region] = []
    todo: list[tuple[set[Value], dict[sympy.Symbol, sympy.Expr], dict[sympy.Symbol, sympy.Expr],
                     dict[sympy.Symbol, sympy.Expr]]] = [(values, ranges, {}, {})]
    while todo:
        vals, rngs, shift, starts = todo.pop()
        out.append((vals, rngs, shift))
        for v in vals:
            if not isinstance(v, Masked) or v.body == v.other:
                continue
            split = _split_point(v.mask, ranges)
            if split is None:
                continue
            var, bound = split
            lo = starts.get(var, sympy.Integer(0))
            hi = lo + rngs[var]
            # the loop may run over less than the whole concatenation (cat(...)[:k]): each part's
            # region is clipped to the loop's range, and a clip not decidable from the sizes gives none
            for body, start, end in ((v.body, lo, _lesser(bound, hi)), (v.other, _greater(bound, lo), hi)):
                if start is None or end is None:
                    continue
                length = sympy.expand(end - start)
                if length.is_number and length <= 0:
                    continue
                todo.append((strict_values([body]), {**rngs, var: length}, {**shift, var: var + start},
                             {**starts, var: start}))
    return out


def _nonempty(sizes: Sequence[sympy.Expr]) -> bool:
    return not any(s == 0 for s in sizes)


def add_check_passes(ctx: LoweringContext, tracker: CheckTracker, outputs: Sequence[Any]) -> None:
    """A check-only pass for each checked node that no computed buffer checks whole: the float64 sum
    over its domain of its value and of the own checks its value does not need, into a buffer
    nothing reads (so the compiler must compute every term)."""
    for name in uncovered(tracker, ctx.buffers, outputs):
        tv = tracker.nodes[name].value
        saved = ctx.origins, ctx.pending_origins
        ctx.origins, ctx.pending_origins = (name,), ()
        try:
            _check_pass(ctx, tv)
        finally:
            ctx.origins, ctx.pending_origins = saved


def _check_pass(ctx: LoweringContext, tv: TensorValue) -> None:
    r = index_vars("r", tv.ndim)
    body = tv.load(r)
    computed = strict_values([body])
    conditional = _under_branches(body)
    terms = [body] + [c for c in sorted(_checks_in(body), key=str) if c not in computed and c not in conditional]
    total = ops.cast(terms[0], torch.float64)
    for t in terms[1:]:
        total = ops.op("add", total, ops.cast(t, torch.float64))
    if tv.ndim == 0:
        ctx.add(Pointwise(ctx.new_name(), Layout.contiguous(torch.float64, ()), ctx.origins, total))
        return
    ctx.reduction(torch.float64, (), tv.sizes, "sum", lambda i, rr: total)


def _under_branches(body: Value) -> set[Value]:
    """Values computed only where a masked value's mask holds (a part of a concatenation)."""
    out: set[Value] = set()
    for v in walk(body):
        if isinstance(v, Masked):
            out.update(walk(v.body))
            out.update(walk(v.other))
    return out - strict_values([body])
