"""`collections.deque` during capture: a sequence of tracked values with both ends open and an
optional `maxlen`.

A deque made in the frame is rebuilt by the glue as `deque([...], maxlen)`; one from the caller
(guarded by type, length and `maxlen`) that the frame mutates is reported to the side-effect log,
whose replay clears it and extends it with the final items. `maxlen` drops items from the other end
as CPython does. Corresponds to the deque handling of torch/_dynamo/variables/lists.py.
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Callable, Sequence

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.sequence import BaseSequenceVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.variables.iterator import IteratorVariable
    from kiln.capture.sources import Source
    from kiln.capture.tracer import Tracer


def _raise_natively(error: Exception) -> Unsupported:
    from kiln.capture.variables.exception import raise_in_trace

    return raise_in_trace(error, f"{type(error).__name__}: {error} (raised natively)")


class DequeVariable(BaseSequenceVariable):
    """A deque; `maxlen` is its bound (None: unbounded)."""

    def __init__(self, items: Sequence[Variable], maxlen: int | None = None, source: "Source | None" = None) -> None:
        self.items = list(items)
        self.maxlen = maxlen
        self.source = source
        self.version = 0  # eager's deque `state`: what its iterators compare (bumped by what changes its layout)
        self._trim(from_left=True)

    @staticmethod
    def create(tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> "DequeVariable":
        """`deque(iterable=(), maxlen=None)`."""
        if len(args) > 2 or set(kwargs) - {"iterable", "maxlen"}:
            raise Unsupported("deque() with these arguments (raised natively)", kind="unsupported")
        iterable = args[0] if args else kwargs.get("iterable")
        bound = args[1] if len(args) > 1 else kwargs.get("maxlen")
        maxlen = None if bound is None or bound.as_constant() is None else tx.as_int(bound)
        if maxlen is not None and maxlen < 0:
            raise _raise_natively(ValueError("maxlen must be non-negative"))
        return DequeVariable([] if iterable is None else tx.iterate(iterable), maxlen)

    def describe(self) -> str:
        return f"deque of {len(self.items)}"

    def python_type(self) -> type:
        return collections.deque

    def identity(self) -> Any:
        return self

    def as_constant(self) -> Any:
        return collections.deque([i.as_constant() for i in self.items], self.maxlen)

    def rebuild(self, items: list[Variable]) -> Variable:
        return DequeVariable(items, self.maxlen)

    def _trim(self, from_left: bool) -> None:
        """Drop what no longer fits under maxlen, from the end opposite to the one just added to."""
        if self.maxlen is None or len(self.items) <= self.maxlen:
            return
        excess = len(self.items) - self.maxlen
        self.items = self.items[excess:] if from_left else self.items[:self.maxlen]

    def getitem(self, tx: "Tracer", key: Variable) -> Variable:
        if not (key.is_constant() and isinstance(key.as_constant(), int)):
            from kiln.capture.variables.symint import SymIntVariable
            if not isinstance(key, SymIntVariable):
                raise _raise_natively(TypeError("sequence index must be integer, not 'slice'"))
        return super().getitem(tx, key)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name == "maxlen":
            return ConstantVariable(self.maxlen)
        return super().getattr(tx, name)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        none = ConstantVariable(None)
        if kwargs:
            raise Unsupported(f"deque.{name} with keyword arguments (raised natively)", kind="unsupported")
        if name in ("append", "appendleft") and len(args) == 1:
            self._mutated(tx)
            self.items.insert(len(self.items) if name == "append" else 0, args[0])
            self._trim(from_left=name == "append")
            return none
        if name in ("extend", "extendleft", "__iadd__") and len(args) == 1:
            self._mutated(tx, bump=False)
            # one at a time: maxlen drops as each one arrives; an iterator that raises midway
            # leaves the items before it in the deque, as in eager
            source = list(self.items) if args[0] is self else args[0].each_item(tx)
            for item in source:
                self.version += 1
                self.items.insert(0 if name == "extendleft" else len(self.items), item)
                self._trim(from_left=name != "extendleft")
            return self if name == "__iadd__" else none
        if name in ("pop", "popleft") and not args:
            if not self.items:
                raise _raise_natively(IndexError(f"{name} from an empty deque"))
            self._mutated(tx)
            return self.items.pop() if name == "pop" else self.items.pop(0)
        if name == "rotate" and len(args) <= 1:
            steps = tx.as_int(args[0]) if args else 1
            if self.items:
                self._mutated(tx, bump=len(self.items) > 1)
                steps %= len(self.items)
                self.items = self.items[len(self.items) - steps:] + self.items[:len(self.items) - steps]
            return none
        if name == "insert" and len(args) == 2:
            if self.maxlen is not None and len(self.items) >= self.maxlen:
                raise _raise_natively(IndexError("deque already at its maximum size"))
            self._mutated(tx)
            self.items.insert(tx.as_int(args[0]), args[1])
            return none
        if name in ("clear", "reverse") and not args:
            self._mutated(tx, bump=name == "clear" and bool(self.items))
            if name == "clear":
                self.items = []
            else:
                self.items.reverse()
            return none
        if name in ("copy", "__copy__") and not args:
            return DequeVariable(self.items, self.maxlen)
        if name == "remove" and len(args) == 1 and self.is_constant() and args[0].is_constant():
            values = [i.as_constant() for i in self.items]
            if args[0].as_constant() not in values:
                raise _raise_natively(ValueError(f"{args[0].as_constant()!r} is not in deque"))
            self._mutated(tx)
            del self.items[values.index(args[0].as_constant())]
            return none
        if name == "__setitem__" and len(args) == 2:
            index = self._position(tx, args[0])
            self._mutated(tx, bump=False)
            self.items[index] = args[1]
            return none
        if name == "__delitem__" and len(args) == 1:
            index = self._position(tx, args[0])
            self._mutated(tx)
            del self.items[index]
            return none
        if name == "__iter__" and not args:
            return self.open_iterator(tx)
        return super().call_method(tx, name, args, kwargs)

    def open_iterator(self, tx: "Tracer") -> "IteratorVariable":
        """Reads the deque by index as it is at each step; eager's RuntimeError once it changed."""
        if DequeVariable.iterator_kind is None:
            from kiln.capture.variables.iterator import IteratorVariable
            return IteratorVariable(list(self.items))
        return DequeVariable.iterator_kind(self)

    # live_iterators.DequeIteratorVariable, set by that module (it imports this one)
    iterator_kind: "Callable[[DequeVariable], IteratorVariable] | None" = None

    def _position(self, tx: "Tracer", key: Variable) -> int:
        index = tx.as_int(key)
        if not -len(self.items) <= index < len(self.items):
            raise _raise_natively(IndexError("deque index out of range"))
        return index

    def _mutated(self, tx: "Tracer", bump: bool = True) -> None:
        tx.side_effects.mutate(self)
        self.version += bump

    def replay(self, glue: "GlueBuilder", target: str) -> None:
        """The glue lines that give the caller's deque `target` this deque's final items."""
        items = ", ".join(glue.reconstruct(i) for i in self.items)
        glue.line(f"{target}.clear()")
        glue.line(f"{target}.extend([{items}])")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()
        items = ", ".join(glue.reconstruct(i) for i in self.items)
        return f"{glue.constant(collections.deque)}([{items}], {self.maxlen!r})"
