"""`seq[a:b]` of an nn.Sequential during capture: eager builds a new Sequential of those children,
whose forward calls each in turn. Here it is the list of the children's Variables: calling it
inlines each child's call in order (with their hooks, as the children's own calls have), iterating,
len() and indexing answer from the list, and the glue rebuilds it as the same slice of the real
Sequential (a new module, as eager's is).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


class SequentialSliceVariable(Variable):
    """`parent[part]` for an nn.Sequential `parent`; `children` are the Variables of its modules."""

    def __init__(self, parent: Variable, part: slice, children: list[Variable]) -> None:
        self.parent = parent
        self.part = part
        self.children = children
        self.source = None

    def describe(self) -> str:
        return f"slice {self.part.start}:{self.part.stop}:{self.part.step} of {self.parent.describe()}"

    def python_type(self) -> type:
        return torch.nn.Sequential

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if len(args) != 1 or kwargs:
            raise Unsupported("calling a slice of an nn.Sequential with other than one input", kind="unsupported_call")
        value = args[0]
        for child in self.children:
            value = child.call(tx, [value], {})
        return value

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name in ("__call__", "forward"):
            return self.call(tx, args, kwargs)
        if name == "__len__" and not args:
            return ConstantVariable(len(self.children))
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        raise Unsupported(f"Sequential.{name} on {self.describe()}", kind="unsupported_call")

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.functions import BoundMethodVariable

        if name in ("__call__", "forward", "__len__", "__getitem__"):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of {self.describe()}", kind="unsupported_attribute")

    def getitem(self, tx: "Tracer", key: Variable) -> Variable:
        index: Any = key.as_constant() if key.is_constant() else tx.as_int(key)
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self.children))
            return SequentialSliceVariable(self, slice(start, stop, step), self.children[index])
        return self.children[index]

    def length(self, tx: "Tracer") -> Variable:
        return ConstantVariable(len(self.children))

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return list(self.children)

    def truth(self, tx: "Tracer") -> bool:
        return True  # a module, whatever its length

    def reconstruct(self, glue: "GlueBuilder") -> str:
        part = self.part
        return f"{glue.reconstruct(self.parent)}[{part.start}:{part.stop}:{part.step}]"
