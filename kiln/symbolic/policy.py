"""DynamicPolicy: which input dimensions (and int arguments) a capture makes symbolic.

The entry keeps one policy per code object. Before a capture it asks `dynamic_dims(source, t,
dynamic)` for each tensor input and `int_is_dynamic` / `float_is_dynamic(source, value, dynamic)` for
each int and float argument; after the capture it calls `note_sizes` with what it saw. The rules are torch.compile's: dynamic=False never,
dynamic=True every dim, dynamic=None static first and then, after a recompile, the dims that changed
(config.automatic_dynamic_shapes); mark_dynamic/maybe_mark_dynamic dims always (under dynamic=False
too, as torch.compile, whose dynamic=False only turns automatic dynamic off), mark_static never.
PyTorch counterpart: automatic_dynamic in torch/_dynamo/variables/builder.py and pgo.py.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch

from kiln import config
from kiln import log
from kiln.errors import KilnError
from kiln.symbolic.marks import marked_dynamic, marked_maybe_dynamic, marked_static


@dataclasses.dataclass
class _SeenTensor:
    sizes: tuple[int, ...]
    changed: set[int]  # dims that have taken more than one value: dynamic from now on


@dataclasses.dataclass
class _SeenInt:
    value: int | float
    changed: bool


class DynamicPolicy:
    """Sizes seen per input source of one code object, and the decisions they lead to.
    nn.Parameters are static whatever `dynamic` says, unless a dim of theirs is marked."""

    def __init__(self) -> None:
        self._tensors: dict[str, _SeenTensor] = {}
        self._ints: dict[str, _SeenInt] = {}
        self._floats: dict[str, _SeenInt] = {}
        # What explain_change needs to say what the next capture does: the `dynamic` setting the
        # entry asks with (one policy per code object and options, so it does not change) and the
        # dims kept static per source (mark_static, parameters).
        self._dynamic: bool | None = None
        self._kept_static: dict[str, dict[int, str]] = {}

    # -- tensors ----------------------------------------------------------------------------------

    def dynamic_dims(self, source: str, t: torch.Tensor, dynamic: bool | None) -> tuple[int, ...]:
        """The dims of t (the input at `source`) to capture as symbols this time."""
        self._dynamic = dynamic
        ndim = t.dim()
        kept = {d: "mark_static" for d in marked_static(t)}
        if isinstance(t, torch.nn.Parameter):
            # Weights keep their shapes from call to call; torch.compile keeps them static too
            # (force_parameter_static_shapes) unless the user marks a dim explicitly.
            for d in range(ndim):
                if d not in marked_dynamic(t) and d not in marked_maybe_dynamic(t):
                    kept.setdefault(d, "a parameter")
        self._kept_static[source] = kept
        if dynamic is True or (dynamic is None and not config.assume_static_by_default):
            dims = [d for d in range(ndim) if d not in kept]
            why = "dynamic=True" if dynamic is True else "assume_static_by_default is off"
            self._log(source, dims, why)
            return tuple(dims)
        chosen: dict[int, str] = {}
        for d in sorted(marked_dynamic(t)):
            chosen[d] = "mark_dynamic"
        for d in sorted(marked_maybe_dynamic(t)):
            chosen.setdefault(d, "maybe_mark_dynamic")
        # dynamic=False is torch.compile's "no automatic dynamic": the user's marks still count.
        if dynamic is None and config.automatic_dynamic_shapes:
            for d in sorted(self._changed_dims(source, t)):
                chosen.setdefault(d, "its size changed since an earlier capture")
        dims = sorted(d for d in chosen if d not in kept and d < ndim)
        for d in dims:
            def words(d: int = d) -> str:
                return f"{user_words(source)} dim {d} is dynamic: {chosen[d]}"
            log.artifact("dynamic", words)
        return tuple(dims)

    def _changed_dims(self, source: str, t: torch.Tensor) -> set[int]:
        seen = self._tensors.get(source)
        sizes = tuple(int(s) for s in t.shape)
        if seen is None or len(seen.sizes) != len(sizes):
            # a new rank is a new specialization, not a changed size
            return set()
        return seen.changed | {d for d, (a, b) in enumerate(zip(seen.sizes, sizes)) if a != b}

    def note_sizes(self, source: str, t: torch.Tensor | int) -> None:
        """Remember what a capture saw at `source` (a tensor's sizes, or an int's value)."""
        if not isinstance(t, torch.Tensor):
            self.note_int(source, t)
            return
        sizes = tuple(int(s) for s in t.shape)
        seen = self._tensors.get(source)
        if seen is None or len(seen.sizes) != len(sizes):
            self._tensors[source] = _SeenTensor(sizes, set())
            return
        seen.changed |= {d for d, (a, b) in enumerate(zip(seen.sizes, sizes)) if a != b}
        seen.sizes = sizes

    def explain_change(self, source: str, old: Sequence[int] | int | float, new: Sequence[int] | int | float) -> str:
        """Why a recompile happened, in the user's words: `x dim 0: 8 -> 9, now dynamic`."""
        name = user_words(source)
        if type(old) is float and type(new) is float:
            if old == new:
                return f"{name}: {old!r} (unchanged)"
            return f"{name}: {old!r} -> {new!r}, {self._float_outcome(new)}"
        if isinstance(old, int) and isinstance(new, int):
            if old == new:
                return f"{name}: {old} (unchanged)"
            if source.endswith(".storage_offset()") and self._int_outcome(new) == "now dynamic":
                # read as a symbol from now on (CaptureState.symbolic_storage_offset), unless
                # another input holds the same storage: then the offsets stay guarded by value
                return f"{name}: {old} -> {new}, now dynamic (unless another input shares its storage)"
            return f"{name}: {old} -> {new}, {self._int_outcome(new)}"
        if isinstance(old, (int, float)) or isinstance(new, (int, float)):
            raise KilnError(f"kiln.symbolic: explain_change at {source} compares an int with sizes")
        old, new = tuple(int(s) for s in old), tuple(int(s) for s in new)
        if len(old) != len(new):
            return f"{name}: rank {len(old)} -> {len(new)} ({list(old)} -> {list(new)}), a new static capture"
        parts = [f"{name} dim {d}: {a} -> {b}, {self._dim_outcome(source, d, b)}"
                 for d, (a, b) in enumerate(zip(old, new)) if a != b]
        return "; ".join(parts) if parts else f"{name}: sizes {list(new)} unchanged"

    def _dim_outcome(self, source: str, dim: int, new: int) -> str:
        kept = self._kept_static.get(source, {}).get(dim)
        if kept is not None:
            return f"recompiled with a static size ({kept})"
        if self._dynamic is False:
            return "recompiled with a static size (dynamic=False)"
        if new in (0, 1):
            return "recompiled with a static size (sizes 0 and 1 are always specialized)"
        if self._dynamic is True or not config.assume_static_by_default:
            return "recompiled, dynamic as before"
        if not config.automatic_dynamic_shapes:
            return "recompiled with a static size (automatic_dynamic_shapes is off)"
        return "now dynamic"

    # -- int arguments ----------------------------------------------------------------------------

    def int_is_dynamic(self, source: str, value: int, dynamic: bool | None) -> bool:
        """Whether the int argument at `source` is captured as a symbol this time."""
        if isinstance(value, bool) or not isinstance(value, int):
            return False
        # Unlike sizes, a dynamic int stays symbolic at 0 and 1 (as in torch.compile): a loop
        # index passed to a resume function or a helper takes those values on every run, and
        # a branch on one is a guard on the symbol anyway.
        return self._scalar_is_dynamic(source, value, dynamic, config.specialize_int, self._ints, "int")

    def _scalar_is_dynamic(self, source: str, value: int | float, dynamic: bool | None, specialize: bool,
                           seen_values: dict[str, _SeenInt], kind: str) -> bool:
        """The automatic-dynamic rule for a number argument: never under dynamic=False or when
        `specialize` is set, always under dynamic=True, else once its value has changed."""
        self._dynamic = dynamic
        if dynamic is False or specialize:
            return False
        if dynamic is True or not config.assume_static_by_default:
            return True
        seen = seen_values.get(source)
        changed = seen is not None and (seen.changed or seen.value != value)
        if changed and config.automatic_dynamic_shapes:
            log.artifact("dynamic", lambda: f"{user_words(source)} is a dynamic {kind}: its value changed")
            return True
        return False

    def note_int(self, source: str, value: int) -> None:
        """Remember the value an int argument had at a capture."""
        seen = self._ints.get(source)
        if seen is None:
            self._ints[source] = _SeenInt(int(value), False)
        else:
            seen.changed = seen.changed or seen.value != value
            seen.value = int(value)

    def _int_outcome(self, new: int) -> str:
        if config.specialize_int:
            return "recompiled with the new constant (specialize_int is on)"
        if self._dynamic is False:
            return "recompiled with the new constant (dynamic=False)"
        if not config.automatic_dynamic_shapes:
            return "recompiled with the new constant (automatic_dynamic_shapes is off)"
        return "now dynamic"

    # -- float arguments --------------------------------------------------------------------------

    def float_is_dynamic(self, source: str, value: float, dynamic: bool | None) -> bool:
        """Whether the float argument at `source` is captured as a symbol this time: the int rules
        (torch.compile's specialize_float=False), except that inf and nan stay constants."""
        if type(value) is not float or not math.isfinite(value):
            return False
        return self._scalar_is_dynamic(source, value, dynamic, config.specialize_float, self._floats, "float")

    def note_float(self, source: str, value: float, symbolic: bool = False) -> None:
        """Remember the value a float argument had at a capture (`symbolic`: it was a symbol there,
        so it stays dynamic, as when an entry read from the disk cache made it one)."""
        seen = self._floats.get(source)
        if seen is None:
            self._floats[source] = _SeenInt(float(value), symbolic)
        else:
            seen.changed = seen.changed or symbolic or seen.value != value
            seen.value = float(value)

    def _float_outcome(self, new: float) -> str:
        if config.specialize_float:
            return "recompiled with the new constant (specialize_float is on)"
        if self._dynamic is False:
            return "recompiled with the new constant (dynamic=False)"
        if not math.isfinite(new):
            return "recompiled with the new constant (inf and nan are not made symbolic)"
        if not config.automatic_dynamic_shapes:
            return "recompiled with the new constant (automatic_dynamic_shapes is off)"
        return "now dynamic"

    def _log(self, source: str, dims: list[int], why: str) -> None:
        log.artifact("dynamic", lambda: f"{user_words(source)} dims {dims} are dynamic: {why}")


_POLICIES: dict[object, DynamicPolicy] = {}


def policy_for(code: object) -> DynamicPolicy:
    """The policy of one code object (created on first use); kiln.reset() calls reset_policies."""
    policy = _POLICIES.get(code)
    if policy is None:
        policy = _POLICIES[code] = DynamicPolicy()
    return policy


def reset_policies() -> None:
    """Forget every size seen (part of kiln.reset())."""
    _POLICIES.clear()


def user_words(source: str) -> str:
    """kiln.symbolic.render.user_words, imported when a message is made: render needs sympy, and a
    policy is made (and fed the sizes of each entry) even when the entry came from the disk cache."""
    from kiln.symbolic.render import user_words as words

    return words(source)
