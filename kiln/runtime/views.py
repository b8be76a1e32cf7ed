"""Outputs that alias an input or another output, rebuilt at run time by replaying their view ops.

A compiled graph returns no aliases: an output that is a view of an input, or of an intermediate
another output shares, leaves the graph as its base (the input itself, or the intermediate as an
extra graph output), and the runtime makes the view again. It does so by running the same view
ops eager ran (`slice`, `t`, `view`, `unbind`, `view_as_real` ...) on the real base, not by
`as_strided` with the traced sizes and strides: the traced layout is the one of the functional
value (a mutated input's new value is a fresh contiguous tensor at offset 0) and of the example
(an offset is not a symbol under dynamic shapes), while replaying the ops gives eager's storage,
strides and offset for whatever layout the real base has. Trace time: `view_steps` reads the
chain functionalization kept for a view (its ViewMeta sequence) as data. Run time: `ViewReplay`.
PyTorch counterpart: gen_alias_from_base in torch/_functorch/_aot_autograd/functional_utils.py.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from kiln.errors import Unsupported
from kiln.runtime.overlap import may_overlap
from kiln.runtime.records import record_type

_functionalization = torch._C._functionalization
# torch's stubs declare neither the mode enum nor ViewMeta.as_tuple (both are bound in C++)
_InverseReturnMode: Any = _functionalization.InverseReturnMode  # type: ignore[attr-defined]
_SUFFIX = "_ViewMeta"


@record_type
@dataclasses.dataclass(frozen=True)
class ViewStep:
    """One view op of a chain: the ViewMeta class of torch._C._functionalization that replays it
    (`slice_Tensor_ViewMeta`) and the fields of its `as_tuple()` (the op's arguments, with the
    flags functionalization keeps; the inverse-return mode as an InverseMode). Fields may hold SymInts
    after a trace under dynamic shapes; a persisted step holds plain values only."""

    meta: str
    fields: tuple[Any, ...]


@record_type
@dataclasses.dataclass(frozen=True)
class InverseMode:
    """A step's InverseReturnMode (how functionalization inverts the view), as plain data."""

    value: int


def _field(x: Any) -> Any:
    if isinstance(x, _InverseReturnMode):
        return InverseMode(int(x.value))
    if isinstance(x, (list, tuple)):
        return tuple(_field(v) for v in x)
    return x


# ViewMetas whose as_tuple() hands back a reference to a temporary in torch 2.13 (their sizes come
# out as raw numbers read from freed memory, and now and then the read crashes the process): they
# are recorded by name only, never replayed, and match any step of their kind (see functionalize).
UNREADABLE = frozenset({"_unsafe_view_ViewMeta", "resize__ViewMeta"})


def view_steps(view: torch.Tensor) -> tuple[ViewStep, ...]:
    """The view ops from a functional tensor's base to it (trace time, on a FunctionalTensorWrapper)."""
    steps = []
    for m in _functionalization.get_view_meta_sequence(view):
        name = type(m).__name__
        # torch's stubs do not declare as_tuple (bound in C++)
        steps.append(ViewStep(name, () if name in UNREADABLE else _field(m.as_tuple())))  # type: ignore[attr-defined]
    return tuple(steps)


def meta_class(name: str) -> type:
    """The ViewMeta class a step names; only a ViewMeta subclass of torch's functionalization
    module is accepted (a persisted step is data read from disk)."""
    cls = getattr(_functionalization, name, None) if name.endswith(_SUFFIX) else None
    if not (isinstance(cls, type) and issubclass(cls, _functionalization.ViewMeta)):
        raise ValueError(f"{name!r} is not a view op of torch's functionalization")
    return cls


def _meta(step: ViewStep, fields: tuple[Any, ...]) -> Any:
    """The ViewMeta object of a step, over `fields` (the step's own, or their values in a call):
    the C++ constructor takes the mode as its enum and size arguments as lists."""
    if step.meta in UNREADABLE:
        raise ValueError(f"{step.meta} was recorded without its arguments; it cannot be replayed")
    args = [_InverseReturnMode(v.value) if isinstance(v, InverseMode) else
            (list(v) if isinstance(v, tuple) else v) for v in fields]
    return meta_class(step.meta)(tuple(args))


def is_plain(steps: Sequence[ViewStep]) -> bool:
    """Whether a chain holds only values a cache record can store (no SymInt)."""
    return all(_plain(f) for step in steps for f in step.fields)


def _plain(x: Any) -> bool:
    if isinstance(x, tuple):
        return all(_plain(v) for v in x)
    return type(x) in (int, float, bool, str, type(None), InverseMode) or isinstance(x, torch.dtype)


def symbols_of(steps: Sequence[ViewStep]) -> set:
    """The size symbols the fields of a chain read."""
    found: set = set()

    def visit(x: Any) -> None:
        if isinstance(x, tuple):
            for v in x:
                visit(v)
        elif isinstance(x, (torch.SymInt, torch.SymFloat)):
            found.update(_expr(x).free_symbols)

    for step in steps:
        visit(step.fields)
    return found


def _expr(x: torch.SymInt | torch.SymFloat) -> Any:
    from kiln.symbolic.node import expr_of  # only symbolic chains get here, from a capture (sympy loaded)

    return expr_of(x)


def evaluate(x: Any, binding: dict, args: Sequence[Any]) -> Any:
    """A size expression's value for this call: each symbol read from the input `binding` names
    (flat input index, dim), or from the input itself where dim is None (an int or float argument)."""
    if not isinstance(x, (torch.SymInt, torch.SymFloat)):
        return x
    import sympy  # only symbolic chains get here, and they come from a capture (sympy loaded)

    expr = _expr(x)
    values = {}
    for sym in expr.free_symbols:
        index, dim = binding[sym]
        if dim is None and type(args[index]) is float:  # a float argument: sympy's Float is exact
            values[sym] = sympy.Float(args[index])
        else:
            values[sym] = sympy.Integer(args[index] if dim is None else args[index].shape[dim])
    value = expr.xreplace(values)
    return int(value) if isinstance(x, torch.SymInt) else float(value)


def _evaluated(x: Any, binding: dict, args: Sequence[Any]) -> Any:
    if isinstance(x, tuple):
        return tuple(_evaluated(v, binding, args) for v in x)
    return evaluate(x, binding, args)


class ViewReplay:
    """A chain ready to run on a real base: the ViewMeta objects are built once when every field is
    a plain value, else for each call from the fields' values in that call's inputs."""

    def __init__(self, steps: Sequence[ViewStep], binding: dict, *, what: str = "an output") -> None:
        self.steps = tuple(steps)
        self.binding = binding
        unbound = symbols_of(self.steps) - binding.keys()
        if unbound:
            raise Unsupported(f"{what} is a view whose arguments depend on tensor data "
                              f"({', '.join(sorted(map(str, unbound)))}, an unbacked size)",
                              kind="unbacked_view_output")
        self._metas = [_meta(s, s.fields) for s in self.steps] if is_plain(self.steps) else None

    def __call__(self, base: torch.Tensor, args: Sequence[Any]) -> torch.Tensor:
        metas = self._metas
        if metas is None:
            metas = [_meta(s, _evaluated(s.fields, self.binding, args)) for s in self.steps]
        return _functionalization.apply_view_meta_sequence(base, metas)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes a tensor's elements occupy, [start, end) (empty for an empty tensor)."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


_storage_id = torch._C._storage_id  # type: ignore[attr-defined]  # bound in C++, not in the stubs


def storage_groups(tensors: Sequence[Any]) -> tuple[dict[int, int], dict[int, list[int]]]:
    """(argument index -> its storage's id, storage id -> the indices on it) over the tensors of
    `tensors`: one pass, shared by the runtime's checks before a call that updates inputs (an
    optimizer step updates hundreds of them)."""
    ids: dict[int, int] = {}
    groups: dict[int, list[int]] = {}
    for index, arg in enumerate(tensors):
        if isinstance(arg, torch.Tensor):
            try:
                ids[index] = key = _storage_id(arg)
            except RuntimeError:  # no storage (sparse, nested): nothing another input can share
                continue
            groups.setdefault(key, []).append(index)
    return ids, groups


def overlapping(args: Sequence[Any], updated: Sequence[int],
                groups: tuple[dict[int, int], dict[int, list[int]]] | None = None) -> bool:
    """Whether an argument updated in place shares memory with another tensor argument (not the
    same object: the capture's aliasing guard covers that), or with itself (an expanded input, whose
    elements share addresses: the real torch.compile hands Kiln such graphs). The graph was traced
    with each input its own tensor of distinct elements, so an update of one would not show through
    the other; by address ranges, so slices of one buffer that do not meet are not counted.
    `groups`: storage_groups(args), when the caller has it already."""
    ids, storages = groups if groups is not None else storage_groups(args)
    for i in updated:
        key = ids.get(i)
        if key is None:
            continue
        mine = args[i]
        if not mine.is_contiguous() and may_overlap(tuple(mine.shape), mine.stride()):
            return True
        sharing = storages[key]
        if len(sharing) < 2:
            continue
        start, end = _span(mine)
        for j in sharing:
            other = args[j]
            if other is mine:
                continue
            other_start, other_end = _span(other)
            if start < other_end and other_start < end:
                return True
    return False


def apply_chain(base: torch.Tensor, steps: Sequence[ViewStep]) -> torch.Tensor:
    """The chain run on `base` as it is (trace time, on a fake: its fields may be SymInts)."""
    return _functionalization.apply_view_meta_sequence(base, [_meta(s, s.fields) for s in steps])


def replays_on(base: torch.Tensor, steps: Sequence[ViewStep]) -> bool:
    """Whether the chain runs on `base` (trace time, on the fake of the real input): a `view`
    recorded on a mutated input's fresh contiguous value may not fit the input's own strides, and
    eager's reshape then copied instead."""
    try:
        apply_chain(base, steps)
    except (RuntimeError, ValueError):
        return False
    return True
