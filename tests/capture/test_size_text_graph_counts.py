"""Sizes made text (`f"{x.shape}"`, `str(x.shape[0])`) in a dynamic frame keep one graph for every size.

A text the trace never reads but the program returns or stores is formatted by the glue after the
graph, from the sizes the graph returns, as torch.compile formats its lazily made strings: no size
is guarded by value. Kiln used to make the text during the trace, which guarded each size it
formatted (one graph per size), and str()/repr() of a Size were graph breaks. Each case runs over several sizes, compares every result with
eager's and the number of graphs with torch.compile(backend="eager")'s (the oracle): Kiln's is never
more. A text the trace itself reads (its length, a comparison) still needs the values, in both.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import kiln

_LOG: list[str] = []


class _Holder:
    last = ""


_HOLDER = _Holder()


def _shape_fstring(x):
    return x * 2, f"{x.shape}"


def _dim_fstring(x):
    return x * 2, f"n={x.shape[0]}"


def _str_of_dim(x):
    return x.sum(), str(x.shape[0])


def _spec_and_conversion(x):
    return x + 1, f"[{x.shape[0]:>6}] {x.shape!r} {x.size(1)!s}"


def _expression(x):
    return x.relu(), f"{x.shape[0] * 2 + 1} rows, {x.numel()} items"


def _two_inputs(x, y):
    return x.sum() + y.sum(), f"{x.shape[0]}x{y.shape[1]}"


def _appended(x):
    _LOG.append(f"batch {x.size(0)}")
    return x.cos()


def _attribute(x):
    _HOLDER.last = "rows: " + str(x.shape[0])
    return x.sin()


def _in_a_dict(x):
    return {"out": x * 3, "msg": f"{tuple(x.shape)}"}


def _str_and_repr_of_sizes(x):
    return x - 1, str(x.size()), repr(x.shape), str([x.shape[0], x.shape[1] - 1])


def _read_by_trace(x):
    return x * 2 + len(f"{x.shape}")  # the text's length is a graph constant: needs the sizes


CASES: list[Callable] = [_shape_fstring, _dim_fstring, _str_of_dim, _spec_and_conversion, _expression,
                         _two_inputs, _appended, _attribute, _in_a_dict, _str_and_repr_of_sizes, _read_by_trace]


def _args(fn: Callable, n: int) -> list[torch.Tensor]:
    torch.manual_seed(n)
    return [torch.randn(n, n + 1) for _ in range(fn.__code__.co_argcount)]


def _same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b)
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    else:
        assert a == b


def _kiln_graphs(fn: Callable, sizes: tuple[int, ...]) -> int:
    kiln.reset()
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        graphs.append(gm)
        return gm

    compiled = kiln.compile(fn, backend=backend, dynamic=True)
    for n in sizes:
        _LOG.clear()
        _HOLDER.last = ""
        expected = fn(*_args(fn, n))
        expected_side = (list(_LOG), _HOLDER.last)
        _LOG.clear()
        _HOLDER.last = ""
        _same(compiled(*_args(fn, n)), expected)
        assert (list(_LOG), _HOLDER.last) == expected_side
    assert kiln.stats()["fallbacks"] == 0
    return len(graphs)


def _torch_graphs(fn: Callable, sizes: tuple[int, ...]) -> int:
    import torch._dynamo

    torch._dynamo.reset()
    count = 0

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        nonlocal count
        count += 1
        return gm.forward

    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for n in sizes:
        compiled(*_args(fn, n))
    return count


@pytest.mark.parametrize("fn", CASES, ids=[fn.__name__.strip("_") for fn in CASES])
def test_no_more_graphs_than_torch_compile(fn: Callable) -> None:
    sizes = (3, 4, 5, 7)
    ours = _kiln_graphs(fn, sizes)
    theirs = _torch_graphs(fn, sizes)
    # torch.compile runs some of these frames eagerly (no graph at all): compared where it made one
    assert theirs == 0 or ours <= theirs, f"Kiln made {ours} graphs, torch.compile {theirs}"
    assert ours == (len(sizes) if fn is _read_by_trace else 1)


def test_text_read_later_in_the_trace_is_guarded() -> None:
    """The deferred text made for the glue and then read by the trace (a branch on it) is the
    same text, and the branch's sizes are guarded: a new size recompiles, never reuses."""
    def fn(x):
        msg = f"{x.shape[0]}"
        if msg.startswith("4"):
            return x * 4, msg
        return x, msg

    kiln.reset()
    compiled = kiln.compile(fn, backend="eager", dynamic=True)
    for n in (3, 4, 5, 40, 4):
        _same(compiled(torch.ones(n)), fn(torch.ones(n)))


def test_format_of_a_size_is_one_graph() -> None:
    """format(n, spec) of a size (torch.compile 2.13 raises an internal error on it: no oracle)."""
    def fn(x):
        return x * 2, format(x.shape[0], ">4"), format(x.shape[1] * 3, "03d")

    assert _kiln_graphs(fn, (3, 4, 5, 12)) == 1
