"""ShapeEnv: the symbols of one capture and every decision made about them, kept as guards.

Capture (through kiln.fake) asks for a symbol per dynamic dimension; meta kernels then ask yes/no
and which-int questions through SymNode. The environment answers statically when value ranges
settle the question (backed sizes are >= 2), otherwise from the example value (hint), and records
that answer as a canonical, deduplicated guard rendered over sources (`L['x'].size()[0] >= 2`).
Equalities it learns become substitutions (s1 -> s0, s0 -> 5). Output: `guards`, `runtime_asserts`.
PyTorch counterpart: ShapeEnv in torch/fx/experimental/symbolic_shapes.py.
"""
from __future__ import annotations

import builtins
import contextlib
import dataclasses
import re
from typing import Any, Callable, Iterator

import sympy
import torch

from kiln import log
from kiln.errors import DataDependentOutputError, KilnError
from kiln.symbolic.expr import (FLOAT_SYMBOL_PREFIX, INF, Interval, UNKNOWN, canonical, decide, evaluate_at,
                                float_symbol, int_symbol, negate)
from kiln.symbolic.node import SymNode
from kiln.symbolic.render import render_python, render_words, user_words


class _AskProvider:
    """The type of _record's default location: ask location_provider."""


_ASK_PROVIDER = _AskProvider()


@dataclasses.dataclass(frozen=True)
class ShapeGuard:
    """One decision about sizes: `expr` (canonical sympy), `python` (evaluable with `L`), and the
    user's `file:line` that made it (None when it comes from how inputs were wrapped)."""

    expr: sympy.Basic
    python: str
    location: str | None

    def words(self) -> str:
        """The guard as the user would write it: `x.size()[0] >= 2`."""
        return user_words(self.python)


@dataclasses.dataclass(frozen=True)
class RuntimeAssert:
    """A fact about unbacked symbols that capture assumed (torch._check on .item()); it cannot be
    a guard because the values do not exist before the graph runs."""

    expr: sympy.Basic
    words: str
    location: str | None


class ConstraintViolation(KilnError):
    """A dimension marked dynamic (mark_dynamic) was specialized by the program."""

    def __init__(self, message: str, *, source: str, location: str | None) -> None:
        super().__init__(message)
        self.source = source
        self.location = location


class GuardOnDataDependentSymNode(DataDependentOutputError):
    """A branch on a size that depends on tensor data (an unbacked symbol) with no static answer."""

    def __init__(self, expr: sympy.Basic, origins: str, location: str | None) -> None:
        self.expr = expr
        where = f" at {location}" if location else ""
        super().__init__(
            origins,
            f"could not decide {expr}{where}: it depends on the data-dependent size(s) {origins}, "
            f"which have no example value. Add torch._check(...) to state what holds, or move the "
            f"data-dependent branch out of the compiled region",
        )


class ShapeEnv:
    """Every symbol of one capture; see docs/seams.md (kiln.symbolic) for the contract."""

    def __init__(self) -> None:
        self.guards: list[ShapeGuard] = []
        self.runtime_asserts: list[RuntimeAssert] = []
        self.location_provider: Callable[[], str | None] = lambda: None
        self._reason: str | None = None  # why the guards recorded now are needed (`because`)
        self._count = 0
        self._hints: dict[sympy.Symbol, int | float] = {}  # floats: float arguments
        self._sources: dict[sympy.Symbol, str] = {}
        self._by_source: dict[str, sympy.Symbol] = {}
        self._origins: dict[sympy.Symbol, str] = {}  # unbacked symbol -> what produced it
        self._order: dict[sympy.Symbol, int] = {}
        self._constraints: dict[sympy.Symbol, str] = {}
        self._pending_constraints: dict[str, str] = {}  # source -> constraint, before its symbol exists
        self._pending_bounds: dict[str, tuple[int | None, int | None]] = {}  # source -> mark_dynamic's min, max
        self._promised: dict[sympy.Symbol, Interval] = {}  # mark_dynamic(min=, max=): every guard must hold on it
        self._ranges: dict[sympy.Symbol, Interval] = {}
        self._replacements: dict[sympy.Symbol, sympy.Expr] = {}
        self._replace_version = 0
        self._version = 0  # bumps whenever ranges, facts or replacements change
        self._facts: dict[sympy.Basic, bool] = {}
        self._op_cache: dict[tuple, sympy.Basic] = {}
        self._int_nodes: dict[int, SymNode] = {}
        self._canonical: dict[sympy.Basic, sympy.Basic] = {}
        self._static_cache: dict[tuple[sympy.Basic, bool], tuple[bool | None, int]] = {}
        self._bounds_memo: dict[sympy.Expr, Interval] = {}
        self._oblivious_memo: dict[sympy.Expr, Interval] = {}

    # -- creating symbols ---------------------------------------------------------------------------

    def _new_symbol(self, prefix: str, *, size: bool) -> sympy.Symbol:
        symbol = int_symbol(f"{prefix}{self._count}", size=size)
        self._order[symbol] = self._count
        self._count += 1
        return symbol

    def create_symbol(self, hint: int, source: str, *, constraint: str | None = None) -> int | torch.SymInt:
        """A size symbol for the dimension `source`; sizes 0 and 1 come back as plain ints."""
        if isinstance(hint, bool) or not isinstance(hint, int) or hint < 0:
            raise ValueError(f"create_symbol({hint!r}, {source!r}): a size hint must be an int >= 0")
        constraint = constraint or self._pending_constraints.get(source)
        lo, hi = self._pending_bounds.get(source, (None, None))
        if (lo is not None and hint < lo) or (hi is not None and hint > hi):
            # torch.compile raises here too (the guard on the range sent this size to a new capture)
            raise ConstraintViolation(
                f"{user_words(source)} is {hint}, not in the range [{lo}, {hi}] given to mark_dynamic",
                source=source, location=None)
        if constraint not in (None, "dynamic"):
            raise ValueError(f"create_symbol: unknown constraint {constraint!r}")
        known = self._by_source.get(source)
        if known is not None:
            if self._hints.get(known) != hint:
                raise ValueError(f"{source} was given two hints: {self._hints.get(known)} and {hint}")
            return torch.SymInt(SymNode(known, self, int, hint))
        if hint in (0, 1):
            # Even a mark_dynamic dim is specialized quietly at 0/1, as torch.compile does: the
            # example cannot stand for sizes >= 2 (broadcasting, contiguity differ at 0 and 1).
            log.artifact("dynamic", lambda: f"{source} = {hint}: sizes 0 and 1 are specialized, no symbol"
                         + (" (despite mark_dynamic)" if constraint else ""))
            return hint
        symbol = self._new_symbol("s", size=True)
        self._register(symbol, hint, source, (2, INF))
        if constraint is not None:
            self._constraints[symbol] = constraint
        log.artifact("dynamic", lambda: f"create_symbol {symbol} = {hint} for {source} ({_input_dim(source)})"
                     + (" (marked dynamic)" if constraint else ""))
        # The >= 2 assumption is what lets broadcasting and contiguity checks fold; a size-1 input
        # must fail a guard rather than reuse a graph built on it.
        self._record(sympy.Ge(symbol, 2), location=None)
        # mark_dynamic's range is guarded (a size outside it captures anew, and raises above)
        if lo is not None and lo > 2:
            self._record(sympy.Ge(symbol, lo), location=None)
        if hi is not None:
            self._record(sympy.Le(symbol, hi), location=None)
        if lo is not None and hi is not None:
            self._promised[symbol] = (builtins.max(lo, 2), hi)
        return torch.SymInt(SymNode(symbol, self, int, hint))

    def constrain(self, source: str, constraint: str = "dynamic",
                  bounds: tuple[int | None, int | None] | None = None) -> None:
        """Attach `constraint` to the symbol that `source` will get (capture calls this for
        mark_dynamic dims before kiln.fake's from_real creates their symbols); `bounds`: the
        (min, max) given to mark_dynamic, either end None."""
        if constraint != "dynamic":
            raise ValueError(f"constrain: unknown constraint {constraint!r}")
        self._pending_constraints[source] = constraint
        if bounds is not None:
            self._pending_bounds[source] = bounds
        known = self._by_source.get(source)
        if known is not None:
            self._constraints[known] = constraint

    def create_symbolic_int(self, hint: int, source: str) -> torch.SymInt:
        """A Python int argument made symbolic; ints may be any value, so no range is assumed."""
        if isinstance(hint, bool) or not isinstance(hint, int):
            raise ValueError(f"create_symbolic_int({hint!r}, {source!r}): the hint must be an int")
        known = self._by_source.get(source)
        if known is not None:
            return torch.SymInt(SymNode(known, self, int, self._hints[known]))
        symbol = self._new_symbol("s", size=False)
        self._register(symbol, hint, source, UNKNOWN)
        log.artifact("dynamic", lambda: f"create_symbol {symbol} = {hint} for int {source}")
        return torch.SymInt(SymNode(symbol, self, int, hint))

    def create_symbolic_float(self, hint: float, source: str) -> torch.SymFloat:
        """A Python float argument made symbolic (torch.compile's specialize_float=False). Its symbol
        is real, not integer, so nothing integral is assumed; kiln.lower passes it to kernels as a
        double. Comparisons on it become guards in the user's words (`f > 0.5`), and what needs its
        exact value (math.exp, round, Python's float // and %) guards it equal to the hint."""
        if type(hint) is not float:
            raise ValueError(f"create_symbolic_float({hint!r}, {source!r}): the hint must be a float")
        known = self._by_source.get(source)
        if known is not None:
            return torch.SymFloat(SymNode(known, self, float, self._hints[known]))
        symbol = float_symbol(f"{FLOAT_SYMBOL_PREFIX}{self._count}")
        self._order[symbol] = self._count
        self._count += 1
        self._register(symbol, hint, source, UNKNOWN)
        log.artifact("dynamic", lambda: f"create_symbol {symbol} = {hint!r} for float {source}")
        return torch.SymFloat(SymNode(symbol, self, float, hint))

    def create_unbacked_symint(self, origin: str, *, size: bool = False) -> torch.SymInt:
        """A value known only when the graph runs (nonzero's length, .item()). Nothing is assumed
        about it unless `size=True`; a tensor made with it as a size records `u >= 0` (a runtime
        assert, as torch._check_is_size does), which is all the meta kernels need."""
        symbol = self._new_symbol("u", size=size)
        self._origins[symbol] = origin
        self._ranges[symbol] = (0, INF) if size else UNKNOWN
        log.artifact("dynamic", lambda: f"create_unbacked_symint {symbol} from {origin}")
        return torch.SymInt(SymNode(symbol, self, int, None))

    def create_unbacked_symfloat(self, origin: str) -> torch.SymFloat:
        """A float known only when the graph runs (`.item()` of a floating tensor under
        capture_scalar_outputs): arithmetic on it stays symbolic; what needs its value (a branch,
        a comparison) is refused as for an unbacked int."""
        symbol = float_symbol(f"{FLOAT_SYMBOL_PREFIX}u{self._count}")
        self._order[symbol] = self._count
        self._count += 1
        self._origins[symbol] = origin
        self._ranges[symbol] = UNKNOWN
        log.artifact("dynamic", lambda: f"create_unbacked_symfloat {symbol} from {origin}")
        return torch.SymFloat(SymNode(symbol, self, float, None))

    def _register(self, symbol: sympy.Symbol, hint: int | float, source: str, rng: Interval) -> None:
        self._hints[symbol] = hint
        self._sources[symbol] = source
        self._by_source[source] = symbol
        self._ranges[symbol] = rng

    # -- reading -------------------------------------------------------------------------------

    def size_hint(self, x: int | torch.SymInt) -> int:
        """The example value of x (raises for sizes that depend on tensor data)."""
        if not isinstance(x, torch.SymInt):
            return int(x)
        node = x.node
        if node._hint is not None:
            return int(node._hint)
        value = self._hint_of(node.expr)
        if value is None:
            raise GuardOnDataDependentSymNode(node.expr, self._unbacked_in(node.expr), self.location_provider())
        return int(value)

    def symbol_sources(self) -> dict[str, str]:
        """Each backed symbol's name -> the source expression it stands for."""
        return {str(s): src for s, src in self._sources.items()}

    def symbol_values(self, L: dict[str, Any], G: dict[str, Any] | None = None) -> dict[sympy.Symbol, int | float]:
        """Each backed symbol's value for the inputs in L (evaluating its source)."""
        scope = {"L": L, "G": G or {}}
        return {s: (int if s.is_integer else float)(eval(src, scope)) for s, src in self._sources.items()}

    def failing_guard(self, L: dict[str, Any], G: dict[str, Any] | None = None) -> ShapeGuard | None:
        """The first guard that does not hold for the inputs in L, or None (a debugging aid)."""
        scope = {"L": L, "G": G or {}}
        for guard in self.guards:
            if not eval(guard.python, scope):
                return guard
        return None

    def describe(self) -> str:
        """Readable state for logs and the debug dump: symbols, what was learnt, guards, asserts."""
        lines = ["symbols:"]
        for symbol in sorted(self._order, key=lambda s: self._order[s]):
            lo, hi = self._ranges.get(symbol, UNKNOWN)
            what = self._sources.get(symbol) or f"unbacked, from {self._origins.get(symbol)}"
            hint = self._hints.get(symbol)
            line = f"  {symbol} = {what}  hint={hint}  range=[{lo}, {hi}]"
            if symbol in self._replacements:
                line += f"  -> {self._replacements[symbol]}"
            if symbol in self._constraints:
                line += f"  ({self._constraints[symbol]})"
            lines.append(line)
        lines.append("guards:")
        lines += [f"  {g.python}" + (f"  # {g.location}" if g.location else "") for g in self.guards]
        if self.runtime_asserts:
            lines.append("runtime asserts:")
            lines += [f"  {a.words}" + (f"  # {a.location}" if a.location else "") for a in self.runtime_asserts]
        return "\n".join(lines)

    def replace(self, expr: sympy.Basic) -> sympy.Basic:
        """expr with the substitutions learnt from equalities applied."""
        if not self._replacements or expr.is_number or expr is sympy.true or expr is sympy.false:
            return expr
        if self._replacements.keys().isdisjoint(expr.free_symbols):
            return expr
        return expr.xreplace(self._replacements)

    def render(self, expr: sympy.Basic) -> str:
        """Python source of expr over sources (raises for unbacked symbols)."""
        return render_python(expr, self._sources)

    def words(self, expr: sympy.Basic) -> str:
        """expr in the user's words; unbacked symbols keep their names (u0)."""
        names = dict(self._sources)
        names.update({s: str(s) for s in self._origins})
        return render_words(expr, names)

    # -- deciding ------------------------------------------------------------------------------

    def _range(self, symbol: sympy.Symbol) -> Interval:
        return self._ranges.get(symbol, UNKNOWN)

    def _oblivious_range(self, symbol: sympy.Symbol) -> Interval:
        lo, hi = self._ranges.get(symbol, UNKNOWN)
        # size-oblivious reasoning: an unbacked size is treated like a backed one, never 0 or 1
        if symbol in self._origins and lo >= 0:
            return (max(lo, 2), hi)
        return (lo, hi)

    def _static_value(self, expr: sympy.Basic, size_oblivious: bool = False) -> bool | None:
        """True/False when known without a new guard (ranges and recorded facts), else None."""
        if expr is sympy.true:
            return True
        if expr is sympy.false:
            return False
        key = (expr, size_oblivious)
        hit = self._static_cache.get(key)
        # A decided answer stays decided (knowledge only grows); an unknown one is retried later.
        if hit is not None and (hit[0] is not None or hit[1] == self._version):
            return hit[0]
        e = self.replace(expr)
        value: bool | None
        if e is sympy.true or e is sympy.false:
            value = e is sympy.true
        else:
            canon = self._canonical.get(e)
            if canon is None:
                canon = self._canonical[e] = canonical(e)  # pure, so memoized for good
            value = self._facts.get(canon)
            if value is None:
                if size_oblivious:
                    value = decide(canon, self._oblivious_range, self._oblivious_memo, self._facts)
                else:
                    value = decide(canon, self._range, self._bounds_memo, self._facts)
        self._static_cache[key] = (value, self._version)
        return value

    def _hint_of(self, expr: sympy.Basic) -> int | float | bool | None:
        e = self.replace(expr)
        if any(s not in self._hints for s in e.free_symbols):
            return None
        return evaluate_at(e, self._hints)

    def _unbacked_in(self, expr: sympy.Basic) -> str:
        found = [s for s in self.replace(expr).free_symbols if s in self._origins]
        return ", ".join(f"{s} (from {self._origins[s]})" for s in sorted(found, key=str)) or str(expr)

    def evaluate(self, node: SymNode, *, size_oblivious: bool = False,
                 fallback_value: bool | None = None) -> bool | int | float:
        """The value of node at the example inputs, recording the guard that keeps it true."""
        expr = node.expr
        if node.pytype is bool:
            static = self._static_value(expr, size_oblivious)
            if static is not None:
                return static
        elif expr.is_number:
            return node.pytype(expr)
        hint = node._hint if node._hint is not None else self._hint_of(expr)
        if hint is None:
            if fallback_value is not None:
                return fallback_value
            raise GuardOnDataDependentSymNode(self.words(expr), self._unbacked_in(expr), self.location_provider())
        if node.pytype is bool:
            self._record(expr if hint else negate(expr))
        else:
            self._record(sympy.Eq(expr, hint, evaluate=False) if not expr.is_number else sympy.true)
        return hint

    def expect_true(self, node: SymNode) -> bool:
        """torch._check(cond): a backed cond is guarded like any branch; an unbacked one is assumed
        true (recorded as a runtime assert), since nothing can be checked before the graph runs."""
        expr = node.expr
        static = self._static_value(expr)
        if static is not None:
            return static
        hint = node._hint if node._hint is not None else self._hint_of(expr)
        if hint is not None:
            return bool(self.evaluate(node))
        self._record(expr)
        return True

    # Duck-typed entry points of torch's own helpers (guard_or_false, statically_known_true),
    # which torch._refs and the meta kernels call with our nodes.
    def evaluate_sym_node(self, sym_node: SymNode, size_oblivious: bool = False,
                          fallback_value: bool | None = None) -> sympy.Basic:
        value = self.evaluate(sym_node, size_oblivious=size_oblivious, fallback_value=fallback_value)
        return sympy.true if value is True else (sympy.false if value is False else sympy.sympify(value))

    def _maybe_evaluate_static(self, expr: sympy.Basic, **_: Any) -> sympy.Basic | None:
        if expr.is_number:
            return expr
        value = self._static_value(expr)
        return None if value is None else (sympy.true if value else sympy.false)

    # -- recording -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def because(self, reason: str) -> Iterator[None]:
        """Guards recorded inside say why, after their file:line (`str() of a size needs its
        value`), for the recompile log and explain()."""
        saved, self._reason = self._reason, reason
        try:
            yield
        finally:
            self._reason = saved

    def _record(self, fact: sympy.Basic, location: str | None | _AskProvider = _ASK_PROVIDER) -> None:
        canon = canonical(self.replace(fact))
        if isinstance(canon, sympy.And):
            for part in canon.args:  # one guard per conjunct: each reads (and fails) on its own
                self._record(part, location)
            return
        if canon is sympy.true or canon in self._facts:
            return
        if canon is sympy.false:
            raise AssertionError(f"kiln.symbolic: recording a guard that is false at the example: {fact}")
        where = self.location_provider() if isinstance(location, _AskProvider) else location
        if where is not None and self._reason is not None:
            where = f"{where}: {self._reason}"
        self._check_promise(canon, where)
        self._learn(canon, where)
        self._facts[canon] = True
        self._facts[canonical(negate(canon))] = False
        self._version += 1
        if all(s in self._sources for s in canon.free_symbols):
            guard = ShapeGuard(canon, render_python(canon, self._sources), where)
            self.guards.append(guard)
            log.artifact("dynamic", lambda: f"guard {guard.words()}" + (f"  [{where}]" if where else ""))
        else:
            words = self.words(canon)
            self.runtime_asserts.append(RuntimeAssert(canon, words, where))
            log.artifact("dynamic", lambda: f"runtime assert {words}" + (f"  [{where}]" if where else ""))

    def _check_promise(self, canon: sympy.Basic, where: str | None) -> None:
        """A guard on a size given a range by mark_dynamic(min=, max=) must hold across that whole
        range (torch.compile's StrictMinMaxConstraint); ConstraintViolation otherwise."""
        promised = [s for s in canon.free_symbols if s in self._promised]
        if not promised:
            return
        def declared(symbol: sympy.Symbol) -> Interval:
            return self._promised.get(symbol) or self._ranges.get(symbol, UNKNOWN)
        if decide(canon, declared, {}) is True:
            return
        source = self._sources[promised[0]]
        lo, hi = self._promised[promised[0]]
        raise ConstraintViolation(
            f"not every size of {user_words(source)} in the range [{lo}, {hi}] given to mark_dynamic passes "
            f"the guard {self.words(canon)} the program needs" + (f" at {where}" if where else ""),
            source=source, location=where)

    def _learn(self, canon: sympy.Basic, where: str | None) -> None:
        """Turn a new fact into substitutions (equalities) or narrower ranges (bounds)."""
        if isinstance(canon, sympy.And):
            for part in canon.args:
                self._learn(part, where)
            return
        if not isinstance(canon, (sympy.Eq, sympy.Ge, sympy.Ne)):
            return
        d = canon.args[0]
        if isinstance(canon, sympy.Eq):
            self._learn_equality(d, where)
            return
        const, rest = d.as_coeff_Add()
        linear = _linear(rest)
        if linear is None or not const.is_Integer:
            return
        symbol, c = linear
        k = int(const)
        lo, hi = self._ranges.get(symbol, UNKNOWN)
        if isinstance(canon, sympy.Ge):  # c*x + k >= 0
            lo, hi = (max(lo, -(k // c)), hi) if c > 0 else (lo, min(hi, k // -c))
        elif c == 1 and lo == -k:  # x + k != 0 with x >= -k: x >= -k + 1
            lo = lo + 1
        else:
            return
        self._set_range(symbol, (lo, hi))

    def _set_range(self, symbol: sympy.Symbol, rng: Interval) -> None:
        self._ranges[symbol] = rng
        self._bounds_memo.clear()
        self._oblivious_memo.clear()
        self._version += 1

    def _learn_equality(self, d: sympy.Expr, where: str | None) -> None:
        # Solve d == 0 for a symbol that appears in one linear term (+-x, or c*x with an integer
        # answer); replace the newest such symbol (unbacked ones first), so that older,
        # input-backed symbols survive in the graph.
        terms = sympy.Add.make_args(d)
        candidates = []
        for term in terms:
            linear = _linear(term)
            if linear is None or sum(1 for t in terms if linear[0] in t.free_symbols) != 1:
                continue
            symbol, c = linear
            rest = d - term
            if c in (1, -1):
                value = -rest * c
            elif rest.is_Integer and int(rest) % c == 0:  # 3*s0 - 15 == 0: s0 is 5
                value = sympy.Integer(-int(rest) // c)
            else:
                continue
            candidates.append((symbol in self._origins, self._order.get(symbol, -1), symbol, value))
        if not candidates:
            return
        _, _, symbol, value = max(candidates, key=lambda c: (c[0], c[1]))
        if value.is_number and self._constraints.get(symbol) == "dynamic" \
                and self._promised.get(symbol) != (value, value):  # mark_dynamic(min=5, max=5) allows 5
            source = self._sources[symbol]
            raise ConstraintViolation(
                f"{user_words(source)} was marked dynamic (mark_dynamic), but the program specialized it "
                f"to {value}" + (f" at {where}" if where else "")
                + "; remove mark_dynamic for this dim or avoid code that needs its exact value",
                source=source, location=where)
        lo, hi = self._ranges.get(symbol, UNKNOWN)
        if value.is_Symbol and value in self._ranges:
            v_lo, v_hi = self._ranges[value]
            self._ranges[value] = (max(lo, v_lo), min(hi, v_hi))
        self._replacements = {k: v.xreplace({symbol: value}) for k, v in self._replacements.items()}
        self._replacements[symbol] = value
        if value.is_number:
            self._ranges[symbol] = (int(value), int(value)) if value.is_Integer else self._ranges.get(symbol, UNKNOWN)
        if symbol in self._origins and symbol not in self._hints:
            hint = self._hint_of(value)
            if isinstance(hint, int):
                self._hints[symbol] = hint
        self._replace_version += 1
        self._bounds_memo.clear()
        self._oblivious_memo.clear()
        self._version += 1
        log.artifact("dynamic", lambda: f"learnt {symbol} = {value}" + (f"  [{where}]" if where else ""))


def _input_dim(source: str) -> str:
    """`L['x'].size()[0]` -> `x dim 0`: which input and which dim a size symbol stands for."""
    match = re.fullmatch(r"(.*)\.size\(\)\[(\d+)\]", source)
    return f"{user_words(match[1])} dim {match[2]}" if match else user_words(source)


def _linear(term: sympy.Expr) -> tuple[sympy.Symbol, int] | None:
    """(x, c) when term is c*x for a symbol x and a nonzero integer c, else None."""
    coeff, rest = term.as_coeff_Mul()
    if rest.is_Symbol and coeff.is_Integer and coeff != 0:
        return rest, int(coeff)
    return None
