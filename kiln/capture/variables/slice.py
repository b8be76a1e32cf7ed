"""Slices (`x[1:n]`, `t[:, ::2]`) whose bounds may be constants, symbolic sizes or None.

A slice is built by BUILD_SLICE and consumed by subscripting: on a tensor it goes into the graph as
a Python `slice` of node arguments; on a list or tuple it must be a constant (symbolic bounds are
specialized there, which the ShapeEnv guards). Corresponds to torch/_dynamo's SliceVariable.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.capture.variables.base import Variable

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

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return "slice(" + ", ".join(glue.reconstruct(p) for p in self.parts()) + ")"
