"""kiln.symbolic: dynamic shapes. Symbolic sizes (torch.SymInt around a SymNode over sympy), the
ShapeEnv that answers every question about them and records the answers as guards, the marks a
user puts on tensors (mark_dynamic) and the policy that picks which dims are dynamic per capture.
The contract is in docs/seams.md; PyTorch counterpart: torch/fx/experimental/symbolic_shapes.py.
"""
from kiln.symbolic.expr import FloorDiv
from kiln.symbolic.marks import (mark_dynamic, mark_static, marked_dynamic, marked_maybe_dynamic,
                                 marked_static, maybe_mark_dynamic)
from kiln.symbolic.node import SymNode, expr_of, is_symbolic
from kiln.symbolic.policy import DynamicPolicy, policy_for, reset_policies
from kiln.symbolic.shape_env import (ConstraintViolation, GuardOnDataDependentSymNode, RuntimeAssert,
                                     ShapeEnv, ShapeGuard)

__all__ = [
    "ConstraintViolation", "DynamicPolicy", "FloorDiv", "GuardOnDataDependentSymNode", "RuntimeAssert",
    "ShapeEnv", "ShapeGuard", "SymNode", "expr_of", "is_symbolic", "mark_dynamic", "mark_static",
    "marked_dynamic", "marked_maybe_dynamic", "marked_static", "maybe_mark_dynamic", "policy_for",
    "reset_policies",
]
