"""kiln.symbolic: dynamic shapes. Symbolic sizes (torch.SymInt around a SymNode over sympy), the
ShapeEnv that answers every question about them and records the answers as guards, the marks a
user puts on tensors (mark_dynamic) and the policy that picks which dims are dynamic per capture.
The contract is in docs/seams.md; PyTorch counterpart: torch/fx/experimental/symbolic_shapes.py.

The names below load on first use (PEP 562): `import kiln` needs only the marks, and sympy (most of
a warm start's import time) loads with the first capture that makes a ShapeEnv, never when every
frame comes from the persistent cache.
"""
from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "FloorDiv": "expr",
    "mark_dynamic": "marks", "mark_static": "marks", "marked_dynamic": "marks",
    "marked_maybe_dynamic": "marks", "marked_static": "marks", "maybe_mark_dynamic": "marks",
    "SymNode": "node", "expr_of": "node", "is_symbolic": "node",
    "DynamicPolicy": "policy", "policy_for": "policy", "reset_policies": "policy",
    "ConstraintViolation": "shape_env", "GuardOnDataDependentSymNode": "shape_env",
    "RuntimeAssert": "shape_env", "ShapeEnv": "shape_env", "ShapeGuard": "shape_env",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'kiln.symbolic' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"kiln.symbolic.{module}"), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
