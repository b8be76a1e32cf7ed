"""Iterators that keep eager's state across a graph break: enumerate, zip and reversed over a list,
and the iterators of dicts, dict views and sets.

During the trace each reads its container as it is at each step (a list appended to in the loop
body is seen; a dict or set whose size changed raises eager's RuntimeError). At a graph break the
glue rebuilds each as an object with eager's semantics over the same container: `LiveEnumerate`
and `LiveZip` are the real enumerate and zip over rebuilt iterators, `LiveReversedIterator` steps
a list down by index, and `LiveDictIterator` (forwards or reversed) and `LiveSetIterator` are real
dict and set iterators advanced to the same place (eager's errors and same-size changes theirs). The resume
function reads each back relative to its position (builder.py), so a loop compiles once, not once
per position. The counterparts of the iterator variables of torch/_dynamo/variables/iter.py.
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Callable

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.deque import DequeVariable
from kiln.capture.variables.dict import DictVariable
from kiln.capture.variables.iterator import IteratorVariable, ListIteratorVariable, LiveListIterator, \
    LiveListIteratorVariable, LiveReversedIterator
from kiln.capture.variables.sequence import ListVariable, TupleVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer

DICT_CHANGED = "dictionary changed size during iteration"
SET_CHANGED = "Set changed size during iteration"
DEQUE_CHANGED = "deque mutated during iteration"
ODICT_CHANGED = "OrderedDict mutated during iteration"


# ------------------------------------------------------------------ what the glue passes a resume

class LiveEnumerate(enumerate):
    """The real enumerate over `inner` from `count`; the two kept readable for the resume's capture."""

    def __init__(self, inner: Any, count: int) -> None:
        self.inner = inner
        self.count = count


class LiveZip(zip):
    """The real zip over `columns`, kept readable for the resume's capture."""

    def __init__(self, *columns: Any) -> None:
        self.columns = columns


class LiveDictIterator:
    """A real iterator over `d.items()` (`reversed(d.items())` when `reverse`) advanced by `skip`
    (eager's order, holes and errors its own), giving keys, values or items as `kind` says. `ahead`
    is the items (key, value) still to come."""

    __slots__ = ("dict", "kind", "it", "done", "reverse")

    def __init__(self, d: dict, kind: str, skip: int, reverse: bool = False) -> None:
        self.dict, self.kind, self.done, self.reverse = d, kind, 0, reverse
        self.it = reversed(d.items()) if reverse else iter(d.items())
        for _ in range(skip):
            next(self.it)
            self.done += 1

    def __iter__(self) -> "LiveDictIterator":
        return self

    def __next__(self) -> Any:
        key, value = next(self.it)
        self.done += 1
        return key if self.kind == "keys" else value if self.kind == "values" else (key, value)

    def __length_hint__(self) -> int:
        return self.it.__length_hint__()  # type: ignore[attr-defined]

    @property
    def ahead(self) -> tuple:
        # a copy of the iterator read to its end (eager's own error if the dict changed size)
        return tuple(self.it.__reduce__()[1][0])  # type: ignore[attr-defined]


class LiveSetIterator:
    """A real iterator over the set advanced by `skip`: eager's own steps through the set's table,
    so a same-size change (discard then add) is followed as eager follows it, and eager's
    RuntimeError once the set's size differs from `size`, its size when the iteration started.
    `ahead` is the items still to come."""

    __slots__ = ("set", "it", "size", "done")

    def __init__(self, s: Any, skip: int) -> None:
        self.set, self.it, self.size, self.done = s, iter(s), len(s), 0
        for _ in range(skip):
            next(self.it)
            self.done += 1

    def __iter__(self) -> "LiveSetIterator":
        return self

    def __next__(self) -> Any:
        item = next(self.it)
        self.done += 1
        return item

    def __length_hint__(self) -> int:
        return self.it.__length_hint__()  # type: ignore[attr-defined]

    @property
    def ahead(self) -> tuple:
        # a copy of the iterator read to its end (eager's own error if the set changed size)
        return tuple(self.it.__reduce__()[1][0])  # type: ignore[attr-defined]


class LiveDequeIterator:
    """A real iterator over the deque advanced by `pos` (eager's RuntimeError its own once the
    deque changes); `changed`: the deque changed since eager's iterator was made, which raises
    at its next step (an iterator over a stand-in deque changed the same way)."""

    __slots__ = ("deque", "it", "pos")

    def __init__(self, q: Any, pos: int, changed: bool = False) -> None:
        self.deque, self.pos = q, pos
        if changed:
            stale = collections.deque([None])
            self.it = iter(stale)
            stale.append(None)
            return
        self.it = iter(q)
        for _ in range(pos):
            next(self.it)

    def __iter__(self) -> "LiveDequeIterator":
        return self

    def __next__(self) -> Any:
        item = next(self.it)
        self.pos += 1
        return item

    def __length_hint__(self) -> int:
        return self.it.__length_hint__()  # type: ignore[attr-defined]

    @property
    def list(self) -> Any:
        return self.deque

    @property
    def ahead(self) -> tuple:
        if self.it.__reduce__()[1][0] is not self.deque:  # type: ignore[attr-defined]
            raise RuntimeError(DEQUE_CHANGED)
        return tuple(self.deque)[self.pos:]


def _real_list_iterator(seq: Any, pos: int) -> Any:
    it = iter(seq)
    it.__setstate__(pos)  # type: ignore[attr-defined]
    return it


def _real_reversed_iterator(seq: Any, pos: int) -> Any:
    it = reversed(seq)
    it.__setstate__(pos if 0 <= pos < len(seq) else -1)  # type: ignore[attr-defined]  # -1: exhausted
    return it


def _advanced(it: Any, skip: int) -> Any:
    for _ in range(skip):
        next(it)
    return it


def _real_dict_iterator(d: dict, kind: str, skip: int, reverse: bool = False) -> Any:
    view = d.keys() if kind == "keys" else d.values() if kind == "values" else d.items()
    return _advanced(reversed(view) if reverse else iter(view), skip)


def _real_deque_iterator(q: Any, pos: int, changed: bool = False) -> Any:
    return LiveDequeIterator(q, pos, changed).it


def real_iterator_maker(live: type) -> Callable[..., Any]:
    """What builds the real iterator (eager's type) that a Live* stand-in of `live`'s class
    would, from the same arguments: for a value the frame returns or stores outside."""
    makers: dict[type, Callable[..., Any]] = {
        LiveListIterator: _real_list_iterator, LiveReversedIterator: _real_reversed_iterator,
        LiveEnumerate: enumerate, LiveZip: zip, LiveDictIterator: _real_dict_iterator,
        LiveSetIterator: lambda s, skip: _advanced(iter(s), skip), LiveDequeIterator: _real_deque_iterator}
    return makers[live]


# ------------------------------------------------------------------ during the trace

class ReversedListIteratorVariable(IteratorVariable):
    """`reversed(lst)`: reads the list by a falling index as it is at each step."""

    def __init__(self, seq: ListVariable) -> None:
        self.seq = seq
        self.index = len(seq.items) - 1
        self.items, self.position = [], 0

    def describe(self) -> str:
        return f"reversed list iterator ({len(self.remaining())} left)"

    def python_type(self) -> type:
        return type(reversed([]))

    def next_item(self) -> Variable | None:
        if 0 <= self.index < len(self.seq.items):
            self.index -= 1
            return self.seq.items[self.index + 1]
        self.index = -1
        return None

    def remaining(self) -> list[Variable]:
        items = self.seq.items
        return list(items[self.index::-1]) if 0 <= self.index < len(items) else []

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return self.step_to_the_end()

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.iterator_maker('live_rev', LiveReversedIterator)}({glue.reconstruct(self.seq)}, {self.index})"


class EnumerateVariable(IteratorVariable):
    """`enumerate(it, start)` over an iterator read one step at a time; `count` is the number the
    next item gets (a constant, or a symbol once the resume's count became dynamic)."""

    def __init__(self, inner: IteratorVariable, count: Variable) -> None:
        super().__init__([])
        self.inner = inner
        self.count = count
        self.tx: "Tracer | None" = None

    def describe(self) -> str:
        return f"enumerate of {self.inner.describe()}"

    def python_type(self) -> type:
        return enumerate

    def next_traced(self, tx: "Tracer") -> Variable | None:
        self.tx = tx
        return self.next_item()

    def next_item(self) -> Variable | None:
        item = self.inner.next_traced(self.tx) if self.tx is not None else self.inner.next_item()
        if item is None:
            return None
        index = self.count
        if index.is_constant():
            self.count = ConstantVariable(index.as_constant() + 1)
        elif self.tx is None:
            raise Unsupported("enumerate with a symbolic count stepped outside a loop or next()",
                              kind="unsupported_iter")
        else:
            self.count = self.tx.binary_op("+", index, ConstantVariable(1))
        return TupleVariable([index, item])

    def remaining(self) -> list[Variable]:
        raise Unsupported("the items left in an enumerate (read one step at a time)", kind="unsupported_iter")

    def iterate(self, tx: "Tracer") -> list[Variable]:
        self.tx = tx
        return self.step_to_the_end()

    def reconstruct(self, glue: "GlueBuilder") -> str:
        count = str(self.count.as_constant()) if self.count.is_constant() else glue.reconstruct(self.count)
        return f"{glue.iterator_maker('live_enumerate', LiveEnumerate)}({glue.reconstruct(self.inner)}, {count})"


class ZipVariable(IteratorVariable):
    """`zip(a, b, ...)`: each row reads one item of each column in order, and ends at the first
    column that ends (the items read from the columns before it are lost, as in eager)."""

    def __init__(self, columns: list[IteratorVariable]) -> None:
        super().__init__([])
        self.columns = columns
        self.tx: "Tracer | None" = None

    def describe(self) -> str:
        return f"zip of {len(self.columns)}"

    def python_type(self) -> type:
        return zip

    def next_traced(self, tx: "Tracer") -> Variable | None:
        self.tx = tx
        return self.next_item()

    def next_item(self) -> Variable | None:
        if not self.columns:
            return None
        row = []
        for column in self.columns:
            item = column.next_traced(self.tx) if self.tx is not None else column.next_item()
            if item is None:
                return None
            row.append(item)
        return TupleVariable(row)

    def remaining(self) -> list[Variable]:
        raise Unsupported("the items left in a zip (read one step at a time)", kind="unsupported_iter")

    def iterate(self, tx: "Tracer") -> list[Variable]:
        self.tx = tx
        return self.step_to_the_end()

    def reconstruct(self, glue: "GlueBuilder") -> str:
        columns = "".join(glue.reconstruct(c) + ", " for c in self.columns)
        return f"{glue.iterator_maker('live_zip', LiveZip)}({columns})"


class ContainerIteratorVariable(IteratorVariable):
    """An iterator over a dict (its keys, values or items; `reversed` of them when `reverse`) or a
    set, made during the trace: the keys left are those of the container when it was made, and a
    step raises eager's RuntimeError once the container's size differs from its size then. A
    same-size change of the keys (one removed and one added) moves eager's iterator in ways a
    snapshot cannot follow: refused. An OrderedDict's iterator raises once any key was added,
    removed or moved, and then ends."""

    stopped = False
    reverse = False

    def __init__(self, container: Variable, kind: str, make_key: Callable[[Any], Variable],
                 reverse: bool = False) -> None:
        super().__init__([])
        self.container: Variable | None = container
        self.kind = kind  # "keys", "values", "items" (a dict) or "set"
        self.make_key = make_key
        self.reverse = reverse
        self.original = _keys(container)  # in the container's order, what a change is checked against
        self.order = self.original[::-1] if reverse else self.original  # in the order given
        self.size = len(self.original)
        self.consumed = 0
        self.layout = getattr(container, "layout", 0)
        self.ordered = getattr(container, "dict_type", None) is collections.OrderedDict

    def find(self) -> Variable | None:
        """The container's Variable (None: the trace has not reached it, so has not changed it)."""
        return self.container

    def describe(self) -> str:
        return f"{self.kind} iterator"

    def python_type(self) -> type:
        if self.kind == "set":
            return type(iter(set()))
        view = getattr(collections.OrderedDict() if self.ordered else {}, self.kind)()
        return type(reversed(view) if self.reverse else iter(view))

    def _check(self) -> None:
        from kiln.capture.variables.exception import raise_in_trace

        container = self.find()
        if container is None:
            return
        if self.ordered and container.layout != self.layout:  # type: ignore[attr-defined]
            self.stopped = True  # eager's iterator ends after it raised
            raise raise_in_trace(RuntimeError(ODICT_CHANGED), f"RuntimeError: {ODICT_CHANGED} (raised natively)")
        if self.size >= 0 and len(container.items) != self.size:  # type: ignore[attr-defined]
            self.size = -1  # eager's iterator keeps raising once it raised
        if self.size < 0:
            message = SET_CHANGED if self.kind == "set" else DICT_CHANGED
            raise raise_in_trace(RuntimeError(message), f"RuntimeError: {message} (raised natively)")
        if _keys(container) != self.original:
            raise Unsupported("the keys of a dict or set changed during its iteration at the same size "
                              "(eager's iterator position is not a snapshot)", kind="unsupported_iter")

    def next_item(self) -> Variable | None:
        if self.stopped:
            return None
        self._check()
        if self.consumed >= len(self.order):
            return None
        key = self.order[self.consumed]
        self.consumed += 1
        items = self.container.items  # type: ignore[union-attr]
        if self.kind == "set":
            return items[key]
        if self.kind == "keys":
            return self.make_key(key)
        if self.kind == "values":
            return items[key]
        return TupleVariable([self.make_key(key), items[key]])

    def remaining(self) -> list[Variable]:
        raise Unsupported("the items left in a dict or set iterator", kind="unsupported_iter")

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return self.step_to_the_end()

    def _container_expr(self, glue: "GlueBuilder") -> str:
        container = self.find()
        if self.size < 0 or self.stopped or container is not None and (
                _keys(container) != self.original or getattr(container, "layout", 0) != self.layout):
            raise Unsupported(f"{self.describe()} live across a graph break after its container changed",
                              kind="unsupported_iter")
        return glue.reconstruct(container)  # type: ignore[arg-type]

    def _skip_expr(self) -> str:
        """The number of items eager's iterator has given, as the glue's expression."""
        return str(self.consumed)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        # the container is as the iteration found it (_container_expr), so eager's iterator over
        # it advanced by the items given is where eager's would be
        container = self._container_expr(glue)
        if self.kind != "set":
            made = glue.iterator_maker('live_dict_iter', LiveDictIterator)
            return f"{made}({container}, {self.kind!r}, {self._skip_expr()}, {self.reverse})"
        return f"{glue.iterator_maker('live_set_iter', LiveSetIterator)}({container}, {self._skip_expr()})"


def _keys(container: Variable) -> list[Any]:
    ordered_keys = getattr(container, "ordered_keys", None)  # a set: in eager's iteration order
    return list(ordered_keys() if ordered_keys is not None else container.items)  # type: ignore[attr-defined]


class PassedContainerIteratorVariable(ContainerIteratorVariable):
    """A LiveDictIterator or LiveSetIterator passed into the frame. What is left is read relative
    to its position from `ahead` (a dict's (key, value) pairs, a set's items), guarded as it is
    read, so a loop compiles once, not once per position. The container becomes a Variable only
    when the trace reached it another way (`find`, the same Variable): then its size and keys are
    checked at each step, and a dict's values are read from it by key."""

    def __init__(self, kind: str, ahead: IteratorVariable, source_name: str, find: Callable[[], Variable | None],
                 key_of: Callable[[Variable], Any], original: list[Any], ordered: bool, reverse: bool = False) -> None:
        IteratorVariable.__init__(self, [])
        self.kind, self.ahead, self.source_name, self.key_of = kind, ahead, source_name, key_of
        self.reverse = reverse
        self.layout, self.ordered = 0, ordered  # the container as wrapped: no change yet
        self.find = find  # type: ignore[method-assign]
        self.container = None
        # the container as it was passed (the trace may have changed it before it read this iterator)
        self.original, self.size, self.consumed = original, len(original), 0

    def next_item(self) -> Variable | None:
        if self.stopped:
            return None
        self._check()
        entry = self.ahead.next_item()
        if entry is None:
            return None
        self.consumed += 1
        if self.kind == "set":
            return entry
        key_var, value = entry.iterate(None)  # type: ignore[arg-type]  # a tuple needs no tracer
        container = self.find()
        if container is not None:  # the value as the dict holds it now (its key specialized)
            value = container.items[self.key_of(key_var)]  # type: ignore[attr-defined]
        return key_var if self.kind == "keys" else value if self.kind == "values" else TupleVariable([key_var, value])

    def _container_expr(self, glue: "GlueBuilder") -> str:
        if self.find() is None:
            return f"{self.source_name}.{'set' if self.kind == 'set' else 'dict'}"
        return super()._container_expr(glue)

    def _skip_expr(self) -> str:
        return f"{self.source_name}.done + {self.consumed}"


def _deque_changed() -> Exception:
    from kiln.capture.variables.exception import raise_in_trace

    return raise_in_trace(RuntimeError(DEQUE_CHANGED), f"RuntimeError: {DEQUE_CHANGED} (raised natively)")


class DequeIteratorVariable(ListIteratorVariable):
    """`iter(deque)` made during the trace: the deque's items by index as they are at each step
    (an item replaced in place is seen); eager's RuntimeError at every step once the deque changed
    otherwise, even after its end."""

    def __init__(self, seq: "DequeVariable") -> None:
        super().__init__(seq)  # type: ignore[arg-type]
        self.deque = seq
        self.version = seq.version

    def python_type(self) -> type:
        return type(iter(collections.deque()))

    def next_item(self) -> Variable | None:
        if self.deque.version != self.version:
            raise _deque_changed()
        return super().next_item()

    def remaining(self) -> list[Variable]:
        raise Unsupported("the items left in a deque iterator", kind="unsupported_iter")

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return self.step_to_the_end()

    def reconstruct(self, glue: "GlueBuilder") -> str:
        made, deque = glue.iterator_maker("live_deque_iter", LiveDequeIterator), glue.reconstruct(self.deque)
        return f"{made}({deque}, {self.position}, {self.deque.version != self.version})"


class PassedDequeIteratorVariable(LiveListIteratorVariable):
    """A LiveDequeIterator passed into the frame: read as a list iterator over the deque (relative
    to its position), raising eager's RuntimeError once the trace changed the deque."""

    def python_type(self) -> type:
        return type(iter(collections.deque()))

    def _changed(self) -> bool:
        seq = self.find_list()
        return seq is not None and getattr(seq, "version", 0) != 0

    def next_item(self) -> Variable | None:
        if self._changed():
            raise _deque_changed()
        return super().next_item()

    def reconstruct(self, glue: "GlueBuilder") -> str:
        seq = self.find_list()
        listed = glue.reconstruct(seq) if seq is not None else f"{self.source_name}.list"
        at = str(self._index()) if self.absolute else f"{self.source_name}.pos + {self.position}"
        return f"{glue.iterator_maker('live_deque_iter', LiveDequeIterator)}({listed}, {at}, {self._changed()})"



# the containers' modules make their iterators through these (they sit below this module)
DictVariable.iterator_kind = ContainerIteratorVariable
DequeVariable.iterator_kind = DequeIteratorVariable
