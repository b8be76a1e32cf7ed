"""Output records of `transformers` models (`ModelOutput`: a dataclass that is also an ordered dict
of its non-None fields) built during the trace.

Every model's forward ends in `return SomethingOutput(logits=..., ...)`. The record is kept as its
field values; attribute reads, `out["key"]`, `out[0]`, `to_tuple()`, `keys()` and `get` answer from
them, and the glue builds the real object by calling the class with the fields when it is returned
or live at a break (its constructor only stores them). A record from outside the frame (returned
by a callee that ran natively) is read the same way, field by field through its source.
Corresponds to the ModelOutput support of torch/_dynamo/variables/dicts.py
(HFPretrainedConfigVariable's sibling for outputs).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Sequence

from kiln.capture.sources import AttrSource
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.sources import Source
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
    """A ModelOutput: its fields in declaration order (None when unset), and `order`, its items'
    keys in dict order. The constructor makes the non-None fields items in declaration order; a
    field set later (`out.x = v`, `out["x"] = v`) that was not an item yet goes to the end."""

    def __init__(self, cls: type, fields: dict[str, Variable], source: "Source | None" = None,
                 order: list[str] | None = None) -> None:
        self.cls = cls
        self.fields = fields
        self.source = source
        self.order = [k for k, v in fields.items() if not _is_none(v)] if order is None else order
        self.built = len(self.order)  # the first `built` keys are what the constructor made

    @classmethod
    def wrap(cls, value: Any, source: "Source", read: Callable[[Any, "Source"], Variable]
             ) -> "ModelOutputVariable | None":
        """A record from outside the frame (a callee that ran natively after a break returned it),
        its fields read through `read(field value, AttrSource)`, which guards them (the caller
        guards the keys). None when its items are not exactly its non-None fields (a field set back
        to None keeps its item)."""
        names = [f.name for f in dataclasses.fields(value)]
        attrs = {name: getattr(value, name, None) for name in names}
        keys = list(value.keys())
        if sorted(keys) != sorted(n for n in names if attrs[n] is not None):
            return None
        if any(dict.__getitem__(value, n) is not attrs[n] for n in keys):
            return None
        return cls(type(value), {n: read(attrs[n], AttrSource(source, n)) for n in names}, source, keys)

    @classmethod
    def create(cls, tx: "Tracer", kind: type, args: Sequence[Variable],
               kwargs: dict[str, Variable]) -> "ModelOutputVariable":
        names = [f.name for f in dataclasses.fields(kind)]
        if len(args) > len(names) or set(kwargs) - set(names):
            raise Unsupported(f"{kind.__name__}() with these arguments (raised natively)", kind="unsupported")
        fields: dict[str, Variable] = {name: ConstantVariable(None) for name in names}
        fields.update(zip(names, args))
        fields.update(kwargs)
        out = cls(kind, fields)
        first, *rest = out.fields.values()
        if all(_is_none(v) for v in rest) and not _is_tensor(first) and not _first_not_a_pair(first):
            # ModelOutput.__post_init__ reads a lone non-tensor first field as key/value pairs;
            # a tuple or list whose first element cannot be a pair (transformers' backbones make
            # BackboneOutput(feature_maps=(...))) stays the field's value and item, as here.
            raise Unsupported(f"{kind.__name__}() with only a non-tensor first field", kind="unsupported")
        return out

    def describe(self) -> str:
        return f"{'new ' if self.source is None else ''}{self.cls.__qualname__}"

    def python_type(self) -> type:
        return self.cls

    def _items(self) -> dict[str, Variable]:
        return {k: self.fields[k] for k in self.order}

    def truth(self, tx: "Tracer") -> bool:
        return bool(self._items())

    def length(self, tx: "Tracer") -> Variable:
        return ConstantVariable(len(self._items()))

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return [ConstantVariable(k) for k in self._items()]

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name in self.fields:
            return self.fields[name]
        if name in ("to_tuple", "keys", "values", "items", "get", "__getitem__", "__setitem__"):
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

    def set_field(self, name: str, value: Variable) -> None:
        """`out.name = value` or `out["name"] = value` on a record made during the trace: both keep
        the attribute and the item in step (ModelOutput.__setattr__ / __setitem__). A None value
        is left to run natively: __setattr__ then sets only the attribute, __setitem__ makes a
        None item, and this record keeps neither apart from the fields."""
        if name not in self.fields:
            raise Unsupported(f"setting {name!r}, not a field of {self.describe()}", kind="unsupported")
        if self.source is not None:
            raise Unsupported(f"setting the field {name!r} of a {self.cls.__qualname__} from outside the frame",
                              kind="unsupported")
        if _is_none(value):
            raise Unsupported(f"setting the field {name!r} of {self.describe()} to None", kind="unsupported")
        if name not in self.order:
            self.order.append(name)
        self.fields[name] = value

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()  # never mutated (set_field refuses): the object itself
        # Bound to a name: the record is mutable, and each place that holds it (a local, a stack
        # slot, a container) must get the same object. Keys set after construction are stored
        # after it, so that the dict order is the traced one.
        built = self.order[:self.built]
        args = ", ".join(f"{k}={glue.reconstruct(self.fields[k])}" for k in built)
        name = glue.fresh("out")
        glue.line(f"{name} = {glue.constant(self.cls)}({args})")
        for key in self.order[self.built:]:
            glue.line(f"{name}[{key!r}] = {glue.reconstruct(self.fields[key])}")
        return name


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
        if self.name == "__setitem__" and len(args) == 2 and not kwargs:
            key = args[0].as_constant()
            if not isinstance(key, str):
                raise Unsupported(f"{self.out.describe()}[{key!r}] = ...", kind="unsupported")
            self.out.set_field(key, args[1])
            return ConstantVariable(None)
        key = args[0].as_constant()
        return items.get(key, args[1] if len(args) > 1 else ConstantVariable(None))

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.reconstruct(self.out)}.{self.name}"


def _is_none(v: Variable) -> bool:
    return v.is_constant() and v.as_constant() is None


def _first_not_a_pair(v: Variable) -> bool:
    """A tuple or list whose first element is not itself a tuple or list (a tensor, a number)."""
    from kiln.capture.variables.sequence import BaseSequenceVariable

    if not isinstance(v, BaseSequenceVariable) or v.python_type() not in (tuple, list) or not v.items:
        return False
    head = v.items[0]
    return _is_tensor(head) or head.is_constant() and not isinstance(head.as_constant(), (tuple, list))


def _is_tensor(v: Variable) -> bool:
    from kiln.capture.variables.tensor import TensorVariable

    return isinstance(v, TensorVariable)
