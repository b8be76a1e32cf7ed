"""Slices (`x[1:n]`, `t[:, ::2]`) whose bounds may be constants, symbolic sizes or None.

A slice is built by BUILD_SLICE and consumed by subscripting: on a tensor it goes into the graph as
a Python `slice` of node arguments; on a list or tuple it must be a constant (symbolic bounds are
specialized there, which the ShapeEnv guards). Corresponds to torch/_dynamo's SliceVariable.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from kiln.capture.variables.base import BoundMethodVariable, Variable

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


class SliceVariable(Variable):
    """`slice(start, stop, step)` of tracked values."""

    def __init__(self, start: Variable, stop: Variable, step: Variable) -> None:
        self.start, self.stop, self.step = start, stop, step

    def describe(self) -> str:
        return "slice"

    def python_type(self) -> type:
        return slice

    def parts(self) -> tuple[Variable, Variable, Variable]:
        return self.start, self.stop, self.step

    def is_constant(self) -> bool:
        return all(p.is_constant() for p in self.parts())

    def as_constant(self) -> Any:
        return slice(*(p.as_constant() for p in self.parts()))

    def as_slice(self, tx: "Tracer") -> slice:
        """A concrete slice for indexing Python sequences (symbolic bounds specialized)."""
        from kiln.capture.variables.symint import SymIntVariable

        values = [p.specialize() if isinstance(p, SymIntVariable) else p.as_constant() for p in self.parts()]
        return slice(*values)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name in ("start", "stop", "step"):
            return getattr(self, name)  # a user __getitem__ reading `key.start` of the slice it got
        if name == "indices":
            return BoundMethodVariable(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        if name == "indices" and len(args) == 1 and not kwargs:
            # the bounds for a length: a symbolic one is specialized, as the result's numbers are
            return tx.wrap_result(self.as_slice(tx).indices(tx.as_int(args[0])))
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return "slice(" + ", ".join(glue.reconstruct(p) for p in self.parts()) + ")"
