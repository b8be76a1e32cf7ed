"""Shared by the Python-semantics tests of capture: run a program eagerly and compiled, compare.

`same` compares results structurally (tensors by value, containers item by item, anything else
with ==); `check_calls` runs a list of calls through eager and through kiln.compile(backend="eager")
(optionally with a mutation of the program's state between calls) and asserts equal results;
`torch_frame_count` runs the same calls under the real torch.compile(backend="eager") with
torch._dynamo.testing.CompileCounter, the oracle for graph and recompile counts.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import kiln
from torch_oracle import torch_graph_count


_VIEW_TYPES = (type({}.keys()), type({}.values()), type({}.items()))


def same(got: Any, want: Any) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype \
            and torch.allclose(got, want, equal_nan=True)
    if isinstance(want, (list, tuple)):
        return type(got) is type(want) and len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    if type(want) in _VIEW_TYPES:
        return type(got) is type(want) and same(list(got), list(want))
    if isinstance(want, dict):
        return type(got) is type(want) and list(got) == list(want) and all(same(got[k], want[k]) for k in want)
    return bool(got == want)


def check_calls(fn: Callable[..., Any], calls: Sequence[tuple], *, fullgraph: bool = False,
                between: Callable[[int], None] | None = None) -> Callable[..., Any]:
    """Each call's args run eagerly and then compiled (state shared, so `fn` must not mutate it);
    `between(i)` runs before call i > 0 (a change to a global, a closure, an attribute).
    Returns the compiled function."""
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager", fullgraph=fullgraph)
    for i, args in enumerate(calls):
        if i and between is not None:
            between(i)
        want = fn(*args)
        got = compiled(*args)
        assert same(got, want), f"call {i}: compiled gave {got!r}, eager {want!r}"
    return compiled


def torch_frame_count(fn: Callable[..., Any], calls: Sequence[tuple],
                      between: Callable[[int], None] | None = None) -> int:
    """How many graphs the real torch.compile(backend="eager") compiles over these calls."""
    return torch_graph_count(fn, calls, between=between)
