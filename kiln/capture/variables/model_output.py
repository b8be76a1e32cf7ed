"""Output records of `transformers` models (`ModelOutput`: a dataclass that is also an ordered dict
of its non-None fields) built during the trace.

Every model's forward ends in `return SomethingOutput(logits=..., ...)`. The record is kept as its
field values; attribute reads, `out["key"]`, `out[0]`, `to_tuple()`, `keys()` and `get` answer from
them, and the glue builds the real object by calling the class with the fields when it is returned
or live at a break (its constructor only stores them). Corresponds to the ModelOutput support of
torch/_dynamo/variables/dicts.py (HFPretrainedConfigVariable's sibling for outputs).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


def is_model_output_class(cls: Any) -> bool:
    """A dataclass deriving from transformers' ModelOutput (recognised by name: capture never
    imports transformers)."""
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls) or not issubclass(cls, dict):
        return False
    for base in cls.__mro__:
        if base.__name__ == "ModelOutput" and base.__module__.startswith("transformers."):
            return True
        if "__post_init__" in base.__dict__ or "__setitem__" in base.__dict__:
            return False  # a subclass that changes how fields become items: build it for real
    return False


class ModelOutputVariable(Variable):
    """A ModelOutput made during the trace: its fields in declaration order (None when unset)."""

    def __init__(self, cls: type, fields: dict[str, Variable]) -> None:
        self.cls = cls
        self.fields = fields

    @classmethod
    def create(cls, tx: "Tracer", kind: type, args: Sequence[Variable],
               kwargs: dict[str, Variable]) -> "ModelOutputVariable":
        names = [f.name for f in dataclasses.fields(kind)]
        if len(args) > len(names) or set(kwargs) - set(names):
            raise Unsupported(f"{kind.__name__}() with these arguments (raised natively)", kind="unsupported")
        fields = {name: ConstantVariable(None) for name in names}
        fields.update(zip(names, args))
        fields.update(kwargs)
        out = cls(kind, fields)
        first, *rest = out.fields.values()
        if all(_is_none(v) for v in rest) and not _is_tensor(first):
            # ModelOutput.__post_init__ reads a lone non-tensor first field as key/value pairs.
            raise Unsupported(f"{kind.__name__}() with only a non-tensor first field", kind="unsupported")
        return out

    def describe(self) -> str:
        return f"new {self.cls.__qualname__}"

    def python_type(self) -> type:
        return self.cls

    def _items(self) -> dict[str, Variable]:
        return {k: v for k, v in self.fields.items() if not _is_none(v)}

    def truth(self, tx: "Tracer") -> bool:
        return bool(self._items())

    def length(self, tx: "Tracer") -> Variable:
        return ConstantVariable(len(self._items()))

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return [ConstantVariable(k) for k in self._items()]

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name in self.fields:
            return self.fields[name]
        if name in ("to_tuple", "keys", "values", "items", "get", "__getitem__"):
            return _BoundMethod(self, name)
        if name == "__class__":
            return tx.wrap(self.cls, None)
        raise Unsupported(f"{self.describe()} has no attribute {name!r} here", kind="unsupported_attribute")

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        return self.getattr(tx, name).call(tx, args, kwargs)

    def getitem(self, tx: "Tracer", key: Variable) -> Variable:
        from kiln.capture.variables.sequence import TupleVariable

        k = key.as_constant()
        items = self._items()
        if isinstance(k, str):
            if k not in items:
                raise Unsupported(f"KeyError {k!r} (raised natively)", kind="unsupported")
            return items[k]
        return TupleVariable(list(items.values())).getitem(tx, key)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        args = ", ".join(f"{k}={v.reconstruct(glue)}" for k, v in self._items().items())
        return f"{glue.constant(self.cls)}({args})"


class _BoundMethod(Variable):
    """`out.to_tuple`, `out.keys`, `out.get`...: dict methods answered from the fields."""

    def __init__(self, out: ModelOutputVariable, name: str) -> None:
        self.out = out
        self.name = name

    def describe(self) -> str:
        return f"{self.out.describe()}.{self.name}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.sequence import ListVariable, TupleVariable

        items = self.out._items()
        if self.name == "to_tuple":
            return TupleVariable(list(items.values()))
        if self.name == "keys":
            return ListVariable([ConstantVariable(k) for k in items])
        if self.name == "values":
            return ListVariable(list(items.values()))
        if self.name == "items":
            return ListVariable([TupleVariable([ConstantVariable(k), v]) for k, v in items.items()])
        if self.name == "__getitem__":
            return self.out.getitem(tx, args[0])
        key = args[0].as_constant()
        return items.get(key, args[1] if len(args) > 1 else ConstantVariable(None))

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{self.out.reconstruct(glue)}.{self.name}"


def _is_none(v: Variable) -> bool:
    return v.is_constant() and v.as_constant() is None


def _is_tensor(v: Variable) -> bool:
    from kiln.capture.variables.tensor import TensorVariable

    return isinstance(v, TensorVariable)
