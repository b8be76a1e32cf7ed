"""Iterators during capture: a list of the items still to come, consumed by FOR_ITER and next().

Every loop the tracer sees is unrolled, so an iterator is just its remaining items (each a tracked
value). After a graph break inside a loop the glue rebuilds it as `iter((item, item, ...))`, and the
resume function's capture reads such a tuple iterator back through `__reduce__`; an iterator over a
list is rebuilt as a LiveListIterator over the same list at its index (later mutations are seen),
reversed(list) as a LiveReversedIterator (enumerate, zip and the iterators of dicts, sets and
deques: live_iterators.py).
Corresponds to torch/_dynamo/variables/iter.py.
"""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from kiln.capture.sources import ItemSource
from kiln.capture.trace_rules import builtin_rule
from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.sequence import ListVariable, TupleVariable
from kiln.capture.variables.symint import SymIntVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


_ITERATOR_TYPE: type = type(iter([]))


class IteratorVariable(Variable):
    """An iterator over known items; `position` is how many were consumed. `made_as` is the type
    of the object eager's code would hold (a module's parameters() generator), when known."""

    made_as: type | None = None

    def __init__(self, items: list[Variable]) -> None:
        self.items = items
        self.position = 0

    def python_type(self) -> type:
        if self.made_as is not None:
            return self.made_as
        return super().python_type()

    def describe(self) -> str:
        return f"iterator ({len(self.items) - self.position} left)"

    def remaining(self) -> list[Variable]:
        return self.items[self.position:]

    def next_item(self) -> Variable | None:
        """The next item, or None when exhausted."""
        if self.position >= len(self.items):
            return None
        item = self.items[self.position]
        self.position += 1
        return item

    def open_iterator(self, tx: "Tracer") -> "IteratorVariable":
        return self  # iter() of an iterator is itself

    def next_traced(self, tx: "Tracer") -> Variable | None:
        """`next_item` where the tracer is at hand (FOR_ITER, next(), a zip's row): an iterator
        whose items need traced arithmetic (an enumerate's symbolic count) uses it."""
        return self.next_item()

    def iterate(self, tx: "Tracer") -> list[Variable]:
        rest = self.remaining()
        self.position = len(self.items)
        return rest

    def step_to_the_end(self) -> list[Variable]:
        """The items left, made one `next_item` at a time: the `iterate` of iterators whose items
        are made on demand (itertools models, a Python `__next__`)."""
        rest = []
        item = self.next_item()
        while item is not None:
            rest.append(item)
            item = self.next_item()
        return rest

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__next__":
            item = self.next_item()
            if item is None:
                raise Unsupported("StopIteration (raised natively)", kind="unsupported")
            return item
        if name == "__iter__":
            return self
        raise Unsupported(f"iterator.{name}", kind="unsupported_call")

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.exception import no_attribute

        if not hasattr(_ITERATOR_TYPE, name):  # every iterator the trace models has these methods
            if self.made_as is not None and hasattr(self.made_as, name):  # a generator's send(), gi_frame
                raise Unsupported(f"{self.made_as.__name__}.{name} of {self.describe()}", kind="unsupported_call")
            raise no_attribute(self.made_as or _ITERATOR_TYPE, name)
        return BoundMethodVariable(self, name)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        parts = [glue.reconstruct(i) for i in self.remaining()]
        return "iter((" + "".join(p + ", " for p in parts) + "))"


class _Replayed:
    """An iterator object from outside the frame (an argument, a global, an attribute): each step
    the trace takes is replayed on the real one after the graph (side_effects.advance_iterator),
    so that whoever else holds it sees it advanced as in eager. `record(self)` is called at the
    first step; `steps()` is how many times eager's code called next() on it."""

    record: Callable[[Any], None] | None = None
    recorded = False
    ended = False  # the trace called next() past the last item (eager's iterator is exhausted)
    origin: str | None = None  # where the glue reads the real iterator
    real_type: type | None = None  # the real iterator's type, where its wrapping guards it
    position: int

    def python_type(self) -> type:
        if self.real_type is not None:
            return self.real_type
        return super().python_type()  # type: ignore[misc]

    def _step(self) -> None:
        if self.record is not None and not self.recorded:
            self.recorded = True
            self.record(self)

    def steps(self) -> int:
        return self.position + int(self.ended)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        # the real iterator itself: the replay leaves it where the trace's steps left this one
        if self.origin is not None:
            return self.origin
        return super().reconstruct(glue)  # type: ignore[misc]


class OutsideIteratorVariable(_Replayed, IteratorVariable):
    """A list or range iterator from outside the frame, over the items it had left."""

    def __init__(self, items: list[Variable], record: Callable[[Any], None]) -> None:
        super().__init__(items)
        self.record = record

    def next_item(self) -> Variable | None:
        self._step()
        item = super().next_item()
        self.ended = self.ended or item is None
        return item

    def iterate(self, tx: "Tracer") -> list[Variable]:
        self._step()
        self.ended = True  # list(it), a for loop: stepped until StopIteration
        return super().iterate(tx)


class PassedIteratorVariable(_Replayed, IteratorVariable):
    """An iterator over a real tuple passed into the frame (`iter(seq)` from `start`).

    `read(k)` wraps `seq[k]` with its source and guard; `guard(kind, n)` guards `len(seq)`. The
    trace relies on at least `start + consumed` items while it has not run to the end, and on
    exactly `len(seq)` once it saw the end: nothing more is guarded.
    """

    def __init__(self, seq: tuple, seq_expr: str, start: int, read: Callable[[int], Variable],
                 guard: Callable[[str, int], Any]) -> None:
        super().__init__([])
        self.seq = seq
        self.seq_expr = seq_expr
        self.start = start
        self.read = read
        self.guard = guard

    def describe(self) -> str:
        return f"iterator ({len(self.seq) - self.start - self.position} left)"

    def next_item(self) -> Variable | None:
        self._step()
        if self.position < len(self.items):
            return super().next_item()
        index = self.start + self.position
        if index >= len(self.seq):
            self.guard("check_len", len(self.seq))
            self.ended = True
            return None
        self.guard("check_min_len", index + 1)
        self.items.append(self.read(index))
        self.position += 1
        return self.items[-1]

    def remaining(self) -> list[Variable]:
        rest = []
        position, ended, recorded = self.position, self.ended, self.recorded
        item = self.next_item()
        while item is not None:
            rest.append(item)
            item = self.next_item()
        self.position, self.ended, self.recorded = position, ended, recorded  # a peek steps nothing
        return rest

    def iterate(self, tx: "Tracer") -> list[Variable]:
        rest = self.remaining()
        self._step()
        self.position = len(self.items)
        self.ended = True
        return rest

    def reconstruct(self, glue: "GlueBuilder") -> str:
        # Items read but not consumed (a peek) are rebuilt; the unread rest is sliced from the same
        # (immutable) tuple at run time, so its length needs no guard.
        peeked = [glue.reconstruct(i) for i in self.items[self.position:]]
        rest = f"{self.seq_expr}[{self.start + len(self.items)}:]"
        if not peeked:
            return f"iter({rest})"
        return "iter((" + "".join(p + ", " for p in peeked) + f") + {rest})"


class ListIteratorVariable(IteratorVariable):
    """`iter(lst)`: reads the list's items as they are at each step, as CPython's list iterator
    does by index: an item appended in the loop body is reached, one removed shifts the rest;
    once it reached the end it stays exhausted (a later append is not seen)."""

    def __init__(self, seq: ListVariable) -> None:
        self.seq = seq
        self.position = 0
        self.done = False

    @property  # type: ignore[override]
    def items(self) -> list[Variable]:
        return [] if self.done else self.seq.items

    @items.setter
    def items(self, value: list[Variable]) -> None:
        self.seq.items = value

    def python_type(self) -> type:
        return _ITERATOR_TYPE

    def next_item(self) -> Variable | None:
        item = super().next_item()
        self.done = item is None
        return item

    def iterate(self, tx: "Tracer") -> list[Variable]:
        rest = super().iterate(tx)
        self.done = True
        return rest

    def reconstruct(self, glue: "GlueBuilder") -> str:
        # Across a graph break: an iterator over the same list at its index (what the resume
        # function reads relative to that index, so it compiles once per loop, not per position).
        if self.done:
            return "iter([])"
        return f"{glue.iterator_maker('live_iter', LiveListIterator)}({glue.reconstruct(self.seq)}, {self.position})"


class OutsideListIteratorVariable(_Replayed, ListIteratorVariable):
    """A list iterator from outside the frame, at index `start` of its (tracked) list: steps by
    index as `iter(lst)` does (an item the trace appends is reached); its steps are replayed on the
    real iterator after the graph, and across a break the glue passes the real one (`origin`)."""

    def __init__(self, seq: ListVariable, start: int, record: Callable[[Any], None]) -> None:
        super().__init__(seq)
        self.start = start
        self.position = start
        self.record = record

    def next_item(self) -> Variable | None:
        self._step()
        return super().next_item()

    def iterate(self, tx: "Tracer") -> list[Variable]:
        self._step()
        return super().iterate(tx)

    def steps(self) -> int:
        return self.position - self.start + int(self.done)


class LiveListIterator:
    """What the glue passes a resume function for `iter(lst)` at index `pos`: steps by index over
    the list itself, as CPython's list iterator does (items appended or removed after the break
    are seen). `ahead` is a snapshot of the items from `pos` on, read by relative index, so the
    resume's guards do not name the position."""

    __slots__ = ("list", "pos")

    def __init__(self, seq: list, pos: int) -> None:
        self.list = seq
        self.pos = pos

    def __iter__(self) -> "LiveListIterator":
        return self

    def __next__(self) -> Any:
        if self.pos < len(self.list):
            self.pos += 1
            return self.list[self.pos - 1]
        self.list = []  # exhausted stays exhausted, as CPython's
        raise StopIteration

    def __length_hint__(self) -> int:
        return max(0, len(self.list) - self.pos)

    @property
    def ahead(self) -> tuple:
        return tuple(self.list[self.pos:])


class LiveReversedIterator(LiveListIterator):
    """`reversed(lst)` at index `pos`: steps down by index over the list itself, and ends (for
    good) once the index is outside the list, as CPython's list_reverseiterator does."""

    __slots__ = ()

    def __next__(self) -> Any:
        if 0 <= self.pos < len(self.list):
            self.pos -= 1
            return self.list[self.pos + 1]
        self.pos, self.list = -1, []
        raise StopIteration

    def __length_hint__(self) -> int:
        return self.pos + 1 if 0 <= self.pos < len(self.list) else 0

    @property
    def ahead(self) -> tuple:
        return tuple(self.list[self.pos::-1]) if 0 <= self.pos < len(self.list) else ()


class LiveListIteratorVariable(PassedIteratorVariable):
    """A LiveListIterator passed into the frame: items are read relative to its index (`ahead`)
    while the trace leaves the list as it found it. The list becomes a Variable only when the
    trace reached it another way (`find_list`, the same Variable): once the trace changed it, the
    index is guarded and items are read from the list by absolute index, as the real iterator will."""

    def __init__(self, source_name: str, pos: int, ahead: tuple, read: Callable[[int], Variable],
                 guard: Callable[[str, int], Any], guard_pos: Callable[[], Any],
                 find_list: Callable[[], "ListVariable | None"], length: int, reverse: bool = False) -> None:
        super().__init__(ahead, f"{source_name}.ahead", 0, read, guard)
        self.source_name = source_name
        self.pos = pos
        self.guard_pos = guard_pos
        self.find_list = find_list
        self.passed_len = length  # the list's length when passed
        self.absolute = False
        self.reverse = reverse  # a LiveReversedIterator: the index falls
        self.done = False

    def python_type(self) -> type:
        return type(reversed([])) if self.reverse else _ITERATOR_TYPE

    def _changed_list(self) -> "ListVariable | None":
        """The list's Variable when the trace changed the list (else None)."""
        seq = self.find_list()
        if seq is None or seq.source is None:
            return seq
        unchanged = len(seq.items) == self.passed_len and all(
            getattr(item, "source", None) == ItemSource(seq.source, i) for i, item in enumerate(seq.items))
        return None if unchanged else seq

    def _index(self) -> int:
        return self.pos - self.position if self.reverse else self.pos + self.position

    def next_item(self) -> Variable | None:
        if self.done:
            return None
        seq = self._changed_list()
        if seq is None and not self.absolute:
            item = super().next_item()
            self.done = item is None
            return item
        if not self.absolute:
            self.guard_pos()
            self.absolute = True
        items = seq.items if seq is not None else self.find_list().items  # type: ignore[union-attr]
        index = self._index()
        if not 0 <= index < len(items):
            self.done = True  # exhausted stays exhausted, as CPython's list iterators
            return None
        self.position += 1
        return items[index]

    def remaining(self) -> list[Variable]:
        if self.done:
            return []
        seq = self._changed_list()
        if seq is None and not self.absolute:
            return super().remaining()
        items = seq.items if seq is not None else self.find_list().items  # type: ignore[union-attr]
        index = self._index()
        if not 0 <= index < len(items):
            return []
        return list(items[index::-1]) if self.reverse else list(items[index:])

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return self.step_to_the_end()

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.done:
            return "iter([])"
        seq = self.find_list()
        sign = "-" if self.reverse else "+"
        at = str(self._index()) if self.absolute else f"{self.source_name}.pos {sign} {self.position}"
        listed = glue.reconstruct(seq) if seq is not None else f"{self.source_name}.list"
        made = glue.iterator_maker("live_rev", LiveReversedIterator) if self.reverse else \
            glue.iterator_maker("live_iter", LiveListIterator)
        return f"{made}({listed}, {at})"


def open_iterator(tx: "Tracer", value: Variable) -> IteratorVariable:
    """`iter(value)`: an iterator as it is, a user object's own (its Python `__iter__`, maybe
    stepped lazily), else an iterator over every item `value` yields."""
    if isinstance(value, IteratorVariable):
        return value
    if type(value) is ListVariable:
        return ListIteratorVariable(value)
    opened = value.open_iterator(tx)
    return opened if opened is not None else IteratorVariable(tx.iterate(value))



class LazyIteratorVariable(IteratorVariable):
    """An itertools iterator over traced values whose items are made on demand (a Python generator
    of Variables): a predicate or function it calls runs when eager's would, item by item, so a
    loop that stops early calls it no more often than eager does."""

    def __init__(self, make: Iterator[Variable], what: str) -> None:
        super().__init__([])
        self.make = make
        self.what = what
        self.exhausted = False

    def describe(self) -> str:
        return f"{self.what} iterator"

    def next_item(self) -> Variable | None:
        if self.exhausted:
            return None
        item = next(self.make, None)
        if item is None:
            self.exhausted = True
            return None
        self.items.append(item)
        self.position += 1
        return item

    def remaining(self) -> list[Variable]:
        raise Unsupported(f"the items left in {self.describe()} (made on demand)", kind="unsupported_iter")

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return self.step_to_the_end()

    def reconstruct(self, glue: "GlueBuilder") -> str:
        raise Unsupported(f"{self.describe()} live across a graph break", kind="unsupported_iter")


def _pull(tx: "Tracer", iterable: Variable) -> Iterator[Variable]:
    """The items of `iter(iterable)`, read one at a time."""
    source = open_iterator(tx, iterable)
    item = source.next_item()
    while item is not None:
        yield item
        item = source.next_item()


def _holds(tx: "Tracer", predicate: Variable, item: Variable) -> bool:
    if predicate.is_constant() and predicate.as_constant() is None:
        return item.truth(tx)
    return predicate.call(tx, [item], {}).truth(tx)


def lazy_filter(tx: "Tracer", predicate: Variable, iterable: Variable) -> Variable:
    """`filter`: each item read and tested when the consumer asks for the next one, as in eager."""
    return LazyIteratorVariable((i for i in _pull(tx, iterable) if _holds(tx, predicate, i)), "filter")


@builtin_rule(itertools.chain)
def chain_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """Each iterable opened when the one before it ends, its items read as they are asked for."""
    return LazyIteratorVariable((i for a in args for i in _pull(tx, a)), "chain")


@builtin_rule(itertools.chain.from_iterable)
def from_iterable_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    return LazyIteratorVariable((i for a in _pull(tx, args[0]) for i in _pull(tx, a)), "chain")


@builtin_rule(itertools.filterfalse)
def filterfalse_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    return LazyIteratorVariable((i for i in _pull(tx, args[1]) if not _holds(tx, args[0], i)), "filterfalse")


@builtin_rule(itertools.takewhile)
def takewhile_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    def taken() -> Iterator[Variable]:
        for item in _pull(tx, args[1]):
            if not _holds(tx, args[0], item):
                return
            yield item
    return LazyIteratorVariable(taken(), "takewhile")


@builtin_rule(itertools.dropwhile)
def dropwhile_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    def kept() -> Iterator[Variable]:
        dropping = True
        for item in _pull(tx, args[1]):
            if dropping and _holds(tx, args[0], item):
                continue
            dropping = False
            yield item
    return LazyIteratorVariable(kept(), "dropwhile")


@builtin_rule(itertools.compress)
def compress_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    pairs = zip(_pull(tx, args[0]), _pull(tx, args[1]))
    return LazyIteratorVariable((item for item, keep in pairs if keep.truth(tx)), "compress")


@builtin_rule(itertools.starmap)
def starmap_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    calls = (args[0].call(tx, tx.iterate(row), {}) for row in _pull(tx, args[1]))
    return LazyIteratorVariable(calls, "starmap")


@builtin_rule(itertools.permutations)
def permutations_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    # by position only: the real itertools arranges the traced values themselves
    items = tx.iterate(args[0])
    size = args[1] if len(args) > 1 else kwargs.get("r", ConstantVariable(None))
    rows = itertools.permutations(items, None if size.is_constant() and size.as_constant() is None else tx.as_int(size))
    return IteratorVariable([TupleVariable(list(row)) for row in rows])


@builtin_rule(itertools.combinations_with_replacement)
def combinations_with_replacement_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    items = tx.iterate(args[0])
    rows = itertools.combinations_with_replacement(items, tx.as_int(args[1] if len(args) > 1 else kwargs["r"]))
    return IteratorVariable([TupleVariable(list(row)) for row in rows])


@builtin_rule(itertools.groupby)
def groupby_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """groupby read as eager's reads it: the next group's first item (and its key) when the outer
    iterator is advanced, a group's items as the group is read, and a group left unread skipped
    by the outer iterator; keys are compared at trace time (constants, or a key function's
    constant results)."""
    key = args[1] if len(args) > 1 else kwargs.get("key", ConstantVariable(None))
    grouping = _Grouping(tx, open_iterator(tx, args[0]), key)
    return LazyIteratorVariable(grouping.groups(), "groupby")


class _Grouping:
    """The state eager's groupby keeps: the item read last, its key, the key of the group the outer
    iterator gave last, and which group is current (an older group reads nothing more)."""

    _NOTHING = object()

    def __init__(self, tx: "Tracer", source: IteratorVariable, key: Variable) -> None:
        self.tx, self.source, self.key = tx, source, key
        self.current: Variable | None = None
        self.current_key: object = self._NOTHING
        self.target_key: object = self._NOTHING
        self.generation = 0

    def _read(self) -> bool:
        item = self.source.next_item()
        if item is None:
            return False
        keyed = item if self.key.is_constant() and self.key.as_constant() is None else self.key.call(self.tx, [item], {})
        if isinstance(keyed, SymIntVariable) and keyed.python_type() is int:
            keyed = ConstantVariable(self.tx.as_int(keyed))  # a size as the key: specialized (guarded)
        if not keyed.is_constant():
            raise Unsupported("itertools.groupby with keys unknown at trace time", kind="unsupported_call")
        self.current, self.current_key = item, keyed.as_constant()
        return True

    def groups(self) -> Iterator[Variable]:
        while True:
            self.generation += 1
            while self.current_key is self._NOTHING or self.current_key == self.target_key:
                if not self._read():
                    return
            self.target_key = self.current_key
            group = LazyIteratorVariable(self._members(self.target_key, self.generation), "groupby group")
            yield TupleVariable([self.tx.wrap_result(self.target_key), group])

    def _members(self, key: object, generation: int) -> Iterator[Variable]:
        while self.generation == generation and self.current_key == key:
            assert self.current is not None
            yield self.current
            if not self._read():
                return
