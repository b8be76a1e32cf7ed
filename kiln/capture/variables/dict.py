"""Dicts (and OrderedDicts) and sets with constant keys, whose values are tracked values.

Keys must be known at trace time (strings, ints, tuples of them, ..., or objects compared by
identity such as classes and functions); values may be anything. A
dict from the caller that the frame mutates is reported to the side-effect log, so the glue rewrites
its contents after the graph has run. Corresponds to torch/_dynamo/variables/dicts.py.
"""
from __future__ import annotations

import types
import typing
from typing import TYPE_CHECKING, Any, Sequence

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.sources import Source
    from kiln.capture.tracer import Tracer


def is_identity_key(value: Any) -> bool:
    """True for objects that hash and compare by identity and whose identity the builder guards:
    classes (with a metaclass that keeps identity equality), functions, modules and typing's
    special forms (`typing.Union`). They may key a traced dict next to literal keys."""
    kind = type(value)
    if kind.__hash__ is not object.__hash__ or kind.__eq__ is not object.__eq__:
        return False
    return isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType,
                              typing._SpecialForm))


def key_of(var: Variable) -> Any:
    """The hashable trace-time value of a dict key or set element."""
    if var.is_constant():
        value = var.as_constant()
        try:
            hash(value)
        except TypeError as exc:
            raise Unsupported(f"unhashable dict key {value!r}", kind="unsupported") from exc
        return value
    try:
        value = var.as_python_value()
    except Unsupported:
        value = None
    if value is not None and is_identity_key(value):
        return value
    raise Unsupported(f"dict key {var.describe()} is not a constant", kind="unsupported")


class DictVariable(Variable):
    """A dict whose keys are trace-time constants; `dict_type` is dict or OrderedDict."""

    def __init__(self, items: dict[Any, Variable], dict_type: type = dict, source: "Source | None" = None) -> None:
        self.items = dict(items)
        self.dict_type = dict_type
        self.source = source

    def describe(self) -> str:
        return f"{self.dict_type.__name__} with keys {list(self.items)}"

    def python_type(self) -> type:
        return self.dict_type

    def is_constant(self) -> bool:
        return all(v.is_constant() for v in self.items.values())

    def as_constant(self) -> Any:
        return self.dict_type((k, v.as_constant()) for k, v in self.items.items())

    def truth(self, tx: "Tracer") -> bool:
        return bool(self.items)

    def length(self, tx: "Tracer") -> Variable:
        return ConstantVariable(len(self.items))

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return [tx.wrap_result(k) for k in self.items]

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.exception import no_attribute
        from kiln.capture.variables.functions import BoundMethodVariable

        if not hasattr(self.python_type(), name):
            raise no_attribute(self.python_type(), name)
        return BoundMethodVariable(self, name)

    def _mutated(self, tx: "Tracer") -> None:
        tx.side_effects.mutate(self)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.sequence import TupleVariable

        none = ConstantVariable(None)
        if name == "__getitem__" and len(args) == 1:
            key = key_of(args[0])
            if key not in self.items:
                from kiln.capture.variables.exception import raise_in_trace
                raise raise_in_trace(KeyError(key), f"KeyError: {key!r} (raised natively)")
            return self.items[key]
        if name == "get" and 1 <= len(args) <= 2:
            return self.items.get(key_of(args[0]), args[1] if len(args) == 2 else none)
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(key_of(args[0]) in self.items)
        if name == "__len__":
            return self.length(tx)
        if name in ("keys", "values", "items") and not args and not kwargs:
            from kiln.capture.variables.dict_view import DictViewVariable
            return DictViewVariable(self, name)  # live: it sees later changes to the dict
        if name == "copy":
            return DictVariable(self.items, self.dict_type)
        if name == "__setitem__" and len(args) == 2:
            self._mutated(tx)
            self.items[key_of(args[0])] = args[1]
            return none
        if name == "__delitem__" and len(args) == 1:
            self._mutated(tx)
            del self.items[key_of(args[0])]
            return none
        if name == "pop" and 1 <= len(args) <= 2:
            key = key_of(args[0])
            if key not in self.items and len(args) == 1:
                from kiln.capture.variables.exception import raise_in_trace
                raise raise_in_trace(KeyError(key), f"KeyError: {key!r} (raised natively)")
            self._mutated(tx)
            return self.items.pop(key, args[1] if len(args) == 2 else none)
        if name == "setdefault" and 1 <= len(args) <= 2:
            key = key_of(args[0])
            if key not in self.items:
                self._mutated(tx)
                self.items[key] = args[1] if len(args) == 2 else none
            return self.items[key]
        if name == "update":
            self._mutated(tx)
            for arg in args:
                self.items.update(pairs_of(tx, arg))
            for key, value in kwargs.items():
                self.items[key] = value
            return none
        if name == "clear":
            self._mutated(tx)
            self.items.clear()
            return none
        if name == "popitem" and not args:
            # dict pops the newest entry; OrderedDict.popitem(last=False) the oldest
            last = kwargs["last"].as_constant() if "last" in kwargs else True
            if not self.items or (not last and self.dict_type is dict):
                raise Unsupported(f"{self.dict_type.__name__}.popitem() on {self.describe()} (raised natively)",
                                  kind="unsupported")
            self._mutated(tx)
            key = next(reversed(self.items)) if last else next(iter(self.items))
            return TupleVariable([tx.wrap_result(key), self.items.pop(key)])
        if name == "move_to_end" and len(args) == 1 and self.dict_type is not dict:
            key = key_of(args[0])
            last = kwargs["last"].as_constant() if "last" in kwargs else True
            if key not in self.items:
                from kiln.capture.variables.exception import raise_in_trace
                raise raise_in_trace(KeyError(key), f"KeyError: {key!r} (raised natively)")
            self._mutated(tx)
            value = self.items.pop(key)
            self.items = {key: value, **self.items} if not last else {**self.items, key: value}
            return none
        raise Unsupported(f"{self.dict_type.__name__}.{name}", kind="unsupported_call")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()
        body = "{" + ", ".join(f"{glue.constant(k)}: {glue.reconstruct(v)}" for k, v in self.items.items()) + "}"
        if self.dict_type is dict:
            return body
        return f"{glue.constant(self.dict_type)}({body})"


def pairs_of(tx: "Tracer", arg: Variable) -> dict[Any, Variable]:
    """The (key, value) pairs of a dict or of an iterable of pairs, as a dict."""
    if isinstance(arg, DictVariable):
        return dict(arg.items)
    out: dict[Any, Variable] = {}
    for pair in tx.iterate(arg):
        key, value = tx.iterate(pair)
        out[key_of(key)] = value
    return out


class SetVariable(Variable):
    """A set (or frozenset) of constant elements."""

    def __init__(self, items: Sequence[Variable], set_type: type = set, source: "Source | None" = None) -> None:
        self.items = {key_of(i): i for i in items}
        self.set_type = set_type
        self.source = source

    def describe(self) -> str:
        return f"{self.set_type.__name__} of {len(self.items)}"

    def python_type(self) -> type:
        return self.set_type

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.set_type(self.items)

    def truth(self, tx: "Tracer") -> bool:
        return bool(self.items)

    def length(self, tx: "Tracer") -> Variable:
        return ConstantVariable(len(self.items))

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return list(self.items.values())

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.exception import no_attribute
        from kiln.capture.variables.functions import BoundMethodVariable

        if not hasattr(self.python_type(), name):
            raise no_attribute(self.python_type(), name)
        return BoundMethodVariable(self, name)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        if name == "add" and len(args) == 1 and self.set_type is set:
            tx.side_effects.mutate(self)
            self.items[key_of(args[0])] = args[0]
            return ConstantVariable(None)
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(key_of(args[0]) in self.items)
        consts = [a.as_constant() for a in args]
        result = getattr(self.as_constant(), name)(*consts)
        if name in ("update", "discard", "remove", "clear", "pop", "intersection_update",
                    "difference_update", "symmetric_difference_update"):
            raise Unsupported(f"set.{name}", kind="unsupported_call")
        return tx.wrap_result(result)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()
        return glue.constant(self.as_constant())

