"""What a call did, beyond values: outputs' strides and offsets, and which tensors share memory.

`outcome(fn, inputs)` runs `fn` and records, for eager and a compiled run alike: each output's
dtype, shape, strides and storage offset (where they address elements) and values; which inputs and
which earlier outputs share its storage; whether it is a view (`_base`) where it aliases an input;
the inputs afterwards (values and metadata, for in-place updates); and the inputs after writing a
marker through each output that aliases one (a returned view of an input must write into the
input, as in eager).
`differences(expected, got)` lists what a compiled run got wrong, in words.
Used by tests/autograd/test_output_views.py and tests/fuzz/view_programs.py.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import torch


@dataclasses.dataclass
class Outcome:
    error: str | None = None  # the exception type's name when the call raised
    outputs: list[Any] = dataclasses.field(default_factory=list)  # detached clones (or non-tensors)
    layouts: list[Any] = dataclasses.field(default_factory=list)  # (dtype, shape, stride, offset)
    aliases: list[Any] = dataclasses.field(default_factory=list)  # (inputs shared, outputs shared, view)
    inputs: list[Any] = dataclasses.field(default_factory=list)  # values and layouts afterwards
    written: list[Any] = dataclasses.field(default_factory=list)  # inputs after writes through outputs
    grads: list[Any] | None = None


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _layout(t: torch.Tensor) -> tuple:
    """dtype, shape, and the strides and offset that matter: an empty tensor's and a size-1 dim's
    are arbitrary (eager and the lowering may pick different ones; no element is at stake)."""
    if t.numel() == 0:
        return (t.dtype, tuple(t.shape))
    strides = tuple(st if size > 1 else None for size, st in zip(t.shape, t.stride()))
    return (t.dtype, tuple(t.shape), strides, t.storage_offset())


def _snapshot(inputs: Sequence[Any]) -> list[Any]:
    return [(x.detach().clone(), _layout(x)) if isinstance(x, torch.Tensor) else x for x in inputs]


def _flat(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [leaf for item in out for leaf in _flat(item)]
    return [out]


def outcome(fn: Callable[..., Any], inputs: Sequence[Any], *, grad: bool = False) -> Outcome:
    """Run `fn(*inputs)` and record what it returned and did (see the module docstring)."""
    try:
        outs = _flat(fn(*inputs))
    except Exception as exc:  # eager's exception type is part of what must match
        return Outcome(error=type(exc).__name__)
    result = Outcome()
    storages = [(i, _storage(x)) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    seen: list[tuple[int, int]] = []
    for k, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            result.outputs.append(o)
            result.layouts.append(None)
            result.aliases.append(None)
            continue
        result.outputs.append(o.detach().clone())
        result.layouts.append(_layout(o))
        shared_inputs = frozenset(i for i, s in storages if s == _storage(o))
        shared_outputs = frozenset(j for j, s in seen if s == _storage(o))
        result.aliases.append((shared_inputs, shared_outputs, bool(shared_inputs) and o._base is not None))
        seen.append((k, _storage(o)))
    result.inputs = _snapshot(inputs)
    if grad:
        terms = [(o.to(torch.float64) * (k + 1)).sum() for k, o in enumerate(outs)
                 if isinstance(o, torch.Tensor) and o.requires_grad]
        leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad and x.is_leaf]
        if terms and leaves:
            result.grads = list(torch.autograd.grad(torch.stack(terms).sum(), leaves, allow_unused=True))
    with torch.no_grad():
        for k, o in enumerate(outs):
            if isinstance(o, torch.Tensor) and o.numel() and result.aliases[k][0]:
                # one element through the output: it must land where eager's lands in the input
                o.detach()[(0,) * o.dim()].fill_(100 + k if not o.dtype.is_complex else complex(100 + k, 1))
    result.written = _snapshot(inputs)
    return result


def _same_values(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.is_floating_point or a.dtype.is_complex:
            low = a.dtype in (torch.float16, torch.bfloat16)
            return torch.allclose(a, b, atol=1e-2 if low else 1e-5, rtol=1e-2 if low else 1e-5, equal_nan=True)
        return torch.equal(a, b)
    return a == b


def differences(expected: Outcome, got: Outcome, *, strides: bool = True) -> list[str]:
    """What `got` (a compiled run) did differently from `expected` (eager), in words; empty if nothing."""
    if expected.error or got.error:
        return [] if expected.error == got.error else [f"raised {got.error}, eager {expected.error}"]
    found: list[str] = []
    if len(got.outputs) != len(expected.outputs):
        return [f"{len(got.outputs)} outputs, eager {len(expected.outputs)}"]
    for k, (e, g) in enumerate(zip(expected.outputs, got.outputs)):
        if not _same_values(e, g):
            found.append(f"output {k}: values {g!r} != eager {e!r}")
        el, gl = expected.layouts[k], got.layouts[k]
        if el is not None and gl is not None and not strides:
            el, gl = el[:2], gl[:2]
        if el != gl:
            found.append(f"output {k}: (dtype, shape, stride, offset) {gl} != eager {el}")
        if expected.aliases[k] != got.aliases[k]:
            found.append(f"output {k}: (inputs, outputs, view) it shares memory with {got.aliases[k]} "
                         f"!= eager {expected.aliases[k]}")
    for name, e_list, g_list in (("input", expected.inputs, got.inputs),
                                 ("after writing through the outputs, input", expected.written, got.written)):
        for i, (e, g) in enumerate(zip(e_list, g_list)):
            if isinstance(e, tuple):
                if not _same_values(e[0], g[0]):
                    found.append(f"{name} {i}: values {g[0]!r} != eager {e[0]!r}")
                if e[1] != g[1]:
                    found.append(f"{name} {i}: layout {g[1]} != eager {e[1]}")
    if (expected.grads is None) != (got.grads is None):
        found.append(f"gradients: {got.grads is not None}, eager {expected.grads is not None}")
    elif expected.grads is not None and got.grads is not None:
        for i, (e, g) in enumerate(zip(expected.grads, got.grads)):
            if (e is None) != (g is None) or (e is not None and not _same_values(e, g)):
                found.append(f"gradient {i}: {g!r} != eager {e!r}")
    return found
