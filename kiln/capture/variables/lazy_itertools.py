"""itertools iterators whose items are made on demand: `count`, `cycle`, `repeat`, `tee`, `islice`, `pairwise`,
`zip_longest`, `accumulate`, `zip` / `map` / `enumerate` over an iterator, and `iter(fn, sentinel)`.

`count()`, `cycle()` and `repeat(obj)` never end, and `islice`, `zip` and `tee` consume their source only as far as
eager's would: an iterator shared with other code (`islice(it, 2)` then `list(it)`) keeps the items
they did not take. Each is a LazyIteratorVariable stepping a Python generator of Variables, so a loop
that stops early pulls no more items than eager does. A `count` rebuilds itself after a graph break
from the number it reached; the others cannot cross a break (a clean break, never a wrong answer).
Corresponds to the itertools part of torch/_dynamo/variables/iter.py.
"""
from __future__ import annotations

import itertools
import types
from typing import TYPE_CHECKING, Iterator

from kiln.capture.variables.base import Variable
from kiln.capture.variables.builtin import builtin_rule
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.generator import GeneratorVariable
from kiln.capture.variables.iterator import IteratorVariable, LazyIteratorVariable, open_iterator
from kiln.capture.variables.sequence import TupleVariable
from kiln.capture.variables.user_object import NewObjectVariable, ObjectVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


def _number(tx: "Tracer", value: Variable, what: str) -> int | float:
    if not value.is_constant() or not isinstance(value.as_constant(), (int, float)):
        raise Unsupported(f"itertools.count with a {what} not known at trace time ({value.describe()})",
                          kind="unsupported_call")
    number: int | float = value.as_constant()
    return number


class CountVariable(LazyIteratorVariable):
    """`itertools.count(start, step)`: the next number is known at trace time, so after a graph
    break the glue rebuilds the counter where the trace left it."""

    def __init__(self, start: int | float, step: int | float) -> None:
        self.next_value = start
        self.step = step
        super().__init__(self._numbers(), "count")

    def _numbers(self) -> Iterator[Variable]:
        while True:
            value = self.next_value
            self.next_value = value + self.step
            yield ConstantVariable(value)

    def next_item(self) -> Variable | None:
        # the items handed out are not kept: a counter runs for ever
        return next(self.make)

    def iterate(self, tx: "Tracer") -> list[Variable]:
        raise Unsupported("iterating itertools.count() to its end (it has none)", kind="unsupported_iter")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.constant(itertools.count)}({glue.constant(self.next_value)}, {glue.constant(self.step)})"


class CycleVariable(LazyIteratorVariable):
    """`itertools.cycle(iterable)`: its first pass reads the source item by item, as eager's does;
    after that it repeats the saved items for ever (none kept per step). Running it to its end
    is refused once it repeats, rather than looping for ever at trace time."""

    def __init__(self, source: IteratorVariable) -> None:
        self.cycled_from = source
        self.saved: list[Variable] = []
        self.repeating = False
        super().__init__(self._cycled(), "cycle")

    def _cycled(self) -> Iterator[Variable]:
        item = self.cycled_from.next_item()
        while item is not None:
            self.saved.append(item)
            yield item
            item = self.cycled_from.next_item()
        self.repeating = bool(self.saved)
        while self.saved:
            yield from self.saved

    def next_item(self) -> Variable | None:
        return next(self.make, None)

    def iterate(self, tx: "Tracer") -> list[Variable]:
        items: list[Variable] = []
        while not self.repeating:
            item = self.next_item()
            if item is None:
                return items
            items.append(item)
        raise Unsupported("iterating itertools.cycle() of a non-empty iterable to its end (it has none)",
                          kind="unsupported_iter")


def _kwarg_or_arg(args: list[Variable], kwargs: dict[str, Variable], index: int, name: str,
                  default: object) -> Variable:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, ConstantVariable(default))


@builtin_rule(iter)
def iter_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    if len(args) == 2 and not kwargs:
        return _call_until(tx, args[0], args[1])
    return open_iterator(tx, args[0])


def _call_until(tx: "Tracer", fn: Variable, sentinel: Variable) -> Variable:
    """`iter(fn, sentinel)`: fn() called for each item as it is read, until one equals the
    sentinel (`item == sentinel`, as eager compares); then it is spent."""

    def calls() -> Iterator[Variable]:
        while True:
            item = fn.call(tx, [], {})
            if tx.compare_op("==", item, sentinel).truth(tx):
                return
            yield item
    return LazyIteratorVariable(calls(), "callable_iterator")


@builtin_rule(itertools.count)
def count_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    start = _number(tx, _kwarg_or_arg(args, kwargs, 0, "start", 0), "start")
    step = _number(tx, _kwarg_or_arg(args, kwargs, 1, "step", 1), "step")
    return CountVariable(start, step)


@builtin_rule(itertools.cycle)
def cycle_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    return CycleVariable(open_iterator(tx, args[0]))


@builtin_rule(itertools.repeat)
def repeat_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`repeat(obj, times)` is a list of known length; `repeat(obj)` never ends, so it is made on
    demand (a `map` or `zip` beside a finite column stops it, as eager's does)."""
    item = _kwarg_or_arg(args, kwargs, 0, "object", None)
    times = _kwarg_or_arg(args, kwargs, 1, "times", None)
    if not (times.is_constant() and times.as_constant() is None):
        return IteratorVariable([item] * max(tx.as_int(times), 0))

    def forever() -> Iterator[Variable]:
        while True:
            yield item
    return _EndlessVariable(forever(), "repeat")


class _EndlessVariable(LazyIteratorVariable):
    """An iterator without an end (`repeat(obj)`): read item by item; running it out is refused."""

    def next_item(self) -> Variable | None:
        return next(self.make)  # the items are not kept: there is no end to keep them to

    def iterate(self, tx: "Tracer") -> list[Variable]:
        raise Unsupported(f"iterating itertools.{self.what}() to its end (it has none)", kind="unsupported_iter")


@builtin_rule(itertools.tee)
def tee_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    copies = tx.as_int(_kwarg_or_arg(args, kwargs, 1, "n", 2))
    source = open_iterator(tx, args[0])
    buffer: list[Variable] = []  # every item read from the source, shared by the copies

    def copy() -> Iterator[Variable]:
        index = 0
        while True:
            if index == len(buffer):
                item = source.next_item()
                if item is None:
                    return
                buffer.append(item)
            yield buffer[index]
            index += 1

    return TupleVariable([LazyIteratorVariable(copy(), "tee") for _ in range(copies)])


@builtin_rule(itertools.islice)
def islice_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    bounds = [a.as_constant() if a.is_constant() else tx.as_int(a) for a in args[1:]]
    try:
        itertools.islice((), *bounds)  # eager's checks of the bounds, made before the source is read
    except (TypeError, ValueError) as exc:
        from kiln.capture.variables.exception import raise_in_trace
        raise raise_in_trace(exc, f"itertools.islice bounds {bounds}: {exc} (raised natively)") from None
    if not isinstance(args[0], IteratorVariable):
        # a fresh iterator over a sequence nobody else steps: its items are known now
        return IteratorVariable(list(itertools.islice(tx.iterate(args[0]), *bounds)))
    source = args[0]
    start, stop, step = (0, bounds[0], 1) if len(bounds) == 1 else (bounds + [None])[:3]
    start, step = start or 0, step or 1

    def sliced() -> Iterator[Variable]:
        # eager's islice skips the source up to the next index it keeps (or to `stop` once none is
        # left) only when asked for an item, so the source is read exactly as far as eager's
        read, wanted = 0, start
        while True:
            while read < wanted:
                if source.next_item() is None:
                    return
                read += 1
            if stop is not None and read >= stop:
                return
            item = source.next_item()
            if item is None:
                return
            read += 1
            wanted = wanted + step if stop is None else min(wanted + step, stop)
            yield item

    return LazyIteratorVariable(sliced(), "islice")


@builtin_rule(itertools.pairwise)
def pairwise_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    def pairs() -> Iterator[Variable]:
        column = open_iterator(tx, args[0])
        before = column.next_item()
        item = None if before is None else column.next_item()
        while before is not None and item is not None:
            yield TupleVariable([before, item])
            before, item = item, column.next_item()
    return LazyIteratorVariable(pairs(), "pairwise")


@builtin_rule(itertools.zip_longest)
def zip_longest_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """Rows read when asked for; an exhausted column is not read again, and the row in which the
    last one ends is not made, as in eager."""
    fill = kwargs.get("fillvalue", ConstantVariable(None))
    columns: list[IteratorVariable | None] = [open_iterator(tx, a) for a in args]

    def rows() -> Iterator[Variable]:
        while True:
            row = []
            for index, column in enumerate(columns):
                item = None if column is None else column.next_item()
                if item is None:
                    columns[index] = None
                    item = fill
                row.append(item)
            if all(column is None for column in columns):
                return
            yield TupleVariable(row)
    return LazyIteratorVariable(rows(), "zip_longest")


@builtin_rule(itertools.accumulate)
def accumulate_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """Each total made when it is read (the function, a user one maybe, runs then), from
    `initial` when given."""
    func = _kwarg_or_arg(args, kwargs, 1, "func", None)
    initial = kwargs.get("initial", ConstantVariable(None))
    column = open_iterator(tx, args[0])

    def totals() -> Iterator[Variable]:
        total = initial if not (initial.is_constant() and initial.as_constant() is None) else column.next_item()
        if total is None:
            return
        yield total
        item = column.next_item()
        while item is not None:
            if func.is_constant() and func.as_constant() is None:
                total = tx.binary_op("+", total, item)
            else:
                total = func.call(tx, [total, item], {})
            yield total
            item = column.next_item()
    return LazyIteratorVariable(totals(), "accumulate")


def lazy_zip(tx: "Tracer", columns: list[IteratorVariable]) -> Variable:
    """`zip` over iterators made on demand: each row reads one item of each column in order and
    stops at the first that ends, as eager's zip does."""

    def rows() -> Iterator[Variable]:
        while True:
            row = []
            for column in columns:
                item = column.next_item()
                if item is None:
                    return
                row.append(item)
            yield TupleVariable(row)

    return LazyIteratorVariable(rows(), "zip")


def lazy_map(tx: "Tracer", fn: Variable, columns: list[IteratorVariable]) -> Variable:
    """`map` over iterators made on demand: the function runs once per row, when the row is read."""
    rows = lazy_zip(tx, columns)
    assert isinstance(rows, LazyIteratorVariable)
    return LazyIteratorVariable((fn.call(tx, tx.iterate(row), {}) for row in rows.make), "map")


def is_made_on_demand(value: Variable) -> bool:
    """True for an iterator whose items are made as they are read (the zip, map and enumerate
    over it must read it lazily too): an itertools model, a generator stepped one yield at a time,
    or a user object (its Python `__next__` runs when eager's would)."""
    return isinstance(value, (LazyIteratorVariable, GeneratorVariable)) or _is_user_object(value)


def _is_user_object(value: Variable) -> bool:
    if isinstance(value, NewObjectVariable):
        return True
    return isinstance(value, ObjectVariable) and not isinstance(value.value, (type, types.ModuleType))
