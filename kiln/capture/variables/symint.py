"""Symbolic Python numbers: sizes read from tensors with dynamic dims, and arithmetic on them.

A `SymIntVariable` holds a torch.SymInt / SymFloat / SymBool (kiln.symbolic's node inside) and the
FX node computing it, so that `x.shape[0] * 2` is recorded in the graph. Turning one into a plain
Python value (a branch on it, `range` of it) asks the ShapeEnv, which records a guard.
Corresponds to torch/_dynamo/variables/tensor.py (SymNodeVariable).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from kiln.capture.variables.base import Variable

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


class SymIntVariable(Variable):
    """A symbolic int, float or bool with the node that computes it."""

    def __init__(self, node: torch.fx.Node, example: Any) -> None:
        self.node = node
        self.example = example

    def describe(self) -> str:
        return f"symbolic {self.example}"

    def python_type(self) -> type:
        if isinstance(self.example, torch.SymBool):
            return bool
        if isinstance(self.example, torch.SymFloat):
            return float
        return int

    def truth(self, tx: "Tracer") -> bool:
        return bool(self.example)  # the ShapeEnv guards the branch taken

    def specialize(self) -> Any:
        """The value as a plain Python number (the ShapeEnv guards it equal to its hint)."""
        return self.python_type()(self.example)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return glue.graph_value(self)
