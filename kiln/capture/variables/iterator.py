"""Iterators during capture: a list of the items still to come, consumed by FOR_ITER and next().

Every loop the tracer sees is unrolled, so an iterator is just its remaining items (each a tracked
value). After a graph break inside a loop the glue rebuilds it as `iter((item, item, ...))`, and the
resume function's capture reads such a tuple iterator back through `__reduce__`.
Corresponds to torch/_dynamo/variables/iter.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from kiln.capture.variables.base import Variable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


_ITERATOR_TYPE: type = type(iter([]))


class IteratorVariable(Variable):
    """An iterator over known items; `position` is how many were consumed."""

    def __init__(self, items: list[Variable]) -> None:
        self.items = items
        self.position = 0

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

    def iterate(self, tx: "Tracer") -> list[Variable]:
        rest = self.remaining()
        self.position = len(self.items)
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
        from kiln.capture.variables.functions import BoundMethodVariable

        if not hasattr(_ITERATOR_TYPE, name):  # every iterator the trace models has these methods
            raise no_attribute(_ITERATOR_TYPE, name)
        return BoundMethodVariable(self, name)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        parts = [glue.reconstruct(i) for i in self.remaining()]
        return "iter((" + "".join(p + ", " for p in parts) + "))"


class PassedIteratorVariable(IteratorVariable):
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
        if self.position < len(self.items):
            return super().next_item()
        index = self.start + self.position
        if index >= len(self.seq):
            self.guard("check_len", len(self.seq))
            return None
        self.guard("check_min_len", index + 1)
        self.items.append(self.read(index))
        self.position += 1
        return self.items[-1]

    def remaining(self) -> list[Variable]:
        rest = []
        position = self.position
        item = self.next_item()
        while item is not None:
            rest.append(item)
            item = self.next_item()
        self.position = position
        return rest

    def iterate(self, tx: "Tracer") -> list[Variable]:
        rest = self.remaining()
        self.position = len(self.items)
        return rest

    def reconstruct(self, glue: "GlueBuilder") -> str:
        # Items read but not consumed (a peek) are rebuilt; the unread rest is sliced from the same
        # (immutable) tuple at run time, so its length needs no guard.
        peeked = [glue.reconstruct(i) for i in self.items[self.position:]]
        rest = f"{self.seq_expr}[{self.start + len(self.items)}:]"
        if not peeked:
            return f"iter({rest})"
        return "iter((" + "".join(p + ", " for p in peeked) + f") + {rest})"
