"""A class's `__dict__` (a read-only mappingproxy) read from outside the frame: `"k" in
type(obj).__dict__`, `cls.__dict__.get(name)`, its keys and length.

Its keys are guarded (check_keys: a class attribute added or removed later recompiles); a value
is wrapped, with its own guard, only when the trace reads it. Writes raise eager's TypeError.
A mappingproxy made in the frame (a class reached without a source) is a plain dict (builder.py).
"""
from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Sequence

from kiln.capture.sources import ItemSource, Source
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.exception import raise_in_trace
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


class ClassDictVariable(Variable):
    """`real` is the mappingproxy; its keys were guarded when it was wrapped."""

    def __init__(self, real: types.MappingProxyType, source: Source) -> None:
        self.real = real
        self.dict_source = source  # never None (`source` is typed for values made in the frame too)
        self.source = source

    def describe(self) -> str:
        return f"class __dict__ {self.dict_source.name()}"

    def python_type(self) -> type:
        return types.MappingProxyType

    def as_python_value(self) -> Any:
        return self.real

    def length(self, tx: "Tracer") -> Variable:
        return ConstantVariable(len(self.real))

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return [tx.wrap_result(k) for k in self.real]

    def _value(self, tx: "Tracer", key: Variable) -> Variable | None:
        if not key.is_constant():
            raise Unsupported(f"looking up {key.describe()} in {self.describe()}", kind="unsupported")
        name = key.as_constant()
        if name not in self.real:
            return None
        return tx.wrap(self.real[name], ItemSource(self.dict_source, name))

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__contains__" and len(args) == 1 and args[0].is_constant():
            return ConstantVariable(args[0].as_constant() in self.real)
        if name == "__getitem__" and len(args) == 1:
            found = self._value(tx, args[0])
            if found is None:
                key = args[0].as_constant()
                raise raise_in_trace(KeyError(key), f"KeyError: {key!r} (raised natively)")
            return found
        if name == "get" and len(args) in (1, 2) and not kwargs:
            found = self._value(tx, args[0])
            return found if found is not None else (args[1] if len(args) == 2 else ConstantVariable(None))
        if name == "keys" and not args and not kwargs:
            from kiln.capture.variables.sequence import ListVariable
            return ListVariable(self.iterate(tx))
        if name in ("__setitem__", "__delitem__", "setdefault", "pop", "update", "clear", "popitem"):
            error = TypeError("'mappingproxy' object does not support item assignment")
            raise raise_in_trace(error, f"TypeError: {error} (raised natively)")
        raise Unsupported(f"mappingproxy.{name} on {self.describe()}", kind="unsupported_call")

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.functions import BoundMethodVariable

        if not hasattr(types.MappingProxyType, name):
            raise Unsupported(f"{self.describe()} has no attribute {name!r}", kind="unsupported_attribute")
        return BoundMethodVariable(self, name)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return self.dict_source.name()
