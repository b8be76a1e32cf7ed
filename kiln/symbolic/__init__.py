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
import sys
from typing import Any, Iterable

_WHERE = {
    "FloorDiv": "expr",
    "mark_dynamic": "marks", "mark_static": "marks", "marked_dynamic": "marks",
    "marked_maybe_dynamic": "marks", "marked_range": "marks", "marked_static": "marks", "maybe_mark_dynamic": "marks",
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
    value = getattr(_import_whole(f"kiln.symbolic.{module}"), name)
    globals()[name] = value  # later reads skip this function
    return value


# What an import cut short here may leave half built (a torch module is never forgotten: the
# dispatcher registrations of its C code would be made twice)
_UNDONE = ("sympy", "mpmath", "kiln")


def _import_whole(module: str) -> Any:
    """`module`, imported whole or not at all. The first capture imports sympy here: a second or
    more, the longest import Kiln makes on first use, so where a Ctrl-C most likely lands. An import
    cut short leaves the submodules that finished in sys.modules, bound to half-built ones that the
    next import builds again: every later capture then failed (`module 'sympy' has no attribute
    'core'`). So an import that raises (KeyboardInterrupt included) forgets every module it added,
    and the next capture imports afresh; leftovers of a sympy import cut short elsewhere (sympy's
    submodules without sympy) are forgotten first. Importing sympy with `import kiln` instead would
    cost every process about 1 s (a warm start served from the disk cache never loads it)."""
    for package in ("sympy", "mpmath"):
        if package not in sys.modules:
            _forget(name for name in sys.modules if name.startswith(package + "."))
    before = set(sys.modules)
    try:
        return importlib.import_module(module)
    except BaseException:
        _forget(name for name in set(sys.modules) - before if name.split(".")[0] in _UNDONE)
        raise


def _forget(names: Iterable[str]) -> None:
    """Drop modules from sys.modules and from their parent packages' attributes, so that the next
    import runs them again."""
    for name in list(names):
        gone = sys.modules.pop(name, None)
        parent, _, child = name.rpartition(".")
        if gone is not None and parent in sys.modules and getattr(sys.modules[parent], child, None) is gone:
            delattr(sys.modules[parent], child)
        for cached, value in list(globals().items()):  # a name this package cached from it
            if gone is not None and getattr(value, "__module__", None) == name:
                del globals()[cached]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
