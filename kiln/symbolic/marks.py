"""User marks on input tensors: which dimensions must be dynamic, may be dynamic, or stay static.

`kiln.mark_dynamic(x, 0)` before calling a compiled function makes dim 0 of x symbolic from the
first capture (and any specialization of it an error); `maybe_mark_dynamic` makes it symbolic
without that promise; `mark_static` keeps it static even under dynamic=True. The marks live on
the tensor object itself, as attributes, and DynamicPolicy reads them with the getters below.
PyTorch counterpart: torch/_dynamo/decorators.py (mark_dynamic, mark_static, maybe_mark_dynamic).
"""
from __future__ import annotations

from typing import Iterable

import torch

_DYNAMIC = "_kiln_dynamic_dims"
DYNAMIC_ATTR = _DYNAMIC  # the guards of a cache entry read it: a new mark on a static dim recompiles
_MAYBE_DYNAMIC = "_kiln_maybe_dynamic_dims"
_STATIC = "_kiln_static_dims"
_RANGES = "_kiln_dynamic_ranges"  # dim -> (min, max) given to mark_dynamic, either end None


def _dims(t: torch.Tensor, dim: int | Iterable[int] | None, who: str) -> list[int]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{who} expects a tensor, got {type(t).__name__}")
    if dim is None:
        return list(range(t.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    out = []
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool):
            raise TypeError(f"{who}: dim must be an int, got {d!r}")
        if not -t.dim() <= d < t.dim():
            raise IndexError(f"{who}: dim {d} is out of range for a tensor of {t.dim()} dims")
        out.append(d % t.dim())
    return out


def _add(t: torch.Tensor, attr: str, dims: list[int]) -> None:
    setattr(t, attr, frozenset(getattr(t, attr, frozenset())) | frozenset(dims))


def _check_conflict(t: torch.Tensor, dims: list[int], other_attr: str, who: str, other: str) -> None:
    clash = sorted(set(dims) & getattr(t, other_attr, frozenset()))
    if clash:
        raise ValueError(f"{who}: dim {clash[0]} is already marked with {other}")


def mark_dynamic(t: torch.Tensor, dim: int | Iterable[int], *, min: int | None = None,
                 max: int | None = None) -> None:
    """Make `dim` of t symbolic from the first capture; specializing it raises ConstraintViolation.
    With `min`/`max` (as torch._dynamo.mark_dynamic) the size is promised to lie in [min, max]:
    the graph is guarded to that range, a size outside it raises ConstraintViolation when it is
    captured, and so does a program whose guards do not hold across the whole range (when both
    ends are given; torch checks only then too)."""
    for name, bound in (("min", min), ("max", max)):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 0):
            raise TypeError(f"mark_dynamic: {name} must be an int >= 0 or None, got {bound!r}")
    if min is not None and max is not None and min > max:
        raise ValueError(f"mark_dynamic: min {min} is larger than max {max}")
    dims = _dims(t, dim, "mark_dynamic")
    _check_conflict(t, dims, _STATIC, "mark_dynamic", "mark_static")
    _add(t, _DYNAMIC, dims)
    ranges = dict(getattr(t, _RANGES, {}))
    for d in dims:
        if min is None and max is None:
            ranges.pop(d, None)
        else:
            ranges[d] = (min, max)
    setattr(t, _RANGES, ranges)


def maybe_mark_dynamic(t: torch.Tensor, dim: int | Iterable[int]) -> None:
    """Make `dim` of t symbolic from the first capture, but let the program specialize it quietly."""
    dims = _dims(t, dim, "maybe_mark_dynamic")
    _check_conflict(t, dims, _STATIC, "maybe_mark_dynamic", "mark_static")
    _add(t, _MAYBE_DYNAMIC, dims)


def mark_static(t: torch.Tensor, dim: int | Iterable[int] | None = None) -> None:
    """Keep `dim` of t (every dim when None) static, even under dynamic=True or after it changed."""
    dims = _dims(t, dim, "mark_static")
    _check_conflict(t, dims, _DYNAMIC, "mark_static", "mark_dynamic")
    _add(t, _STATIC, dims)


def marked_dynamic(t: torch.Tensor) -> frozenset[int]:
    """Dims given to mark_dynamic (symbolic, and must stay so)."""
    return getattr(t, _DYNAMIC, frozenset())


def marked_range(t: torch.Tensor, dim: int) -> tuple[int | None, int | None] | None:
    """The (min, max) that mark_dynamic gave `dim` of t, or None."""
    return getattr(t, _RANGES, {}).get(dim)


def marked_maybe_dynamic(t: torch.Tensor) -> frozenset[int]:
    """Dims given to maybe_mark_dynamic (symbolic, may be specialized)."""
    return getattr(t, _MAYBE_DYNAMIC, frozenset())


def marked_static(t: torch.Tensor) -> frozenset[int]:
    """Dims given to mark_static (never symbolic)."""
    return getattr(t, _STATIC, frozenset())
