"""Helpers for lowering tests: build ATen graphs with make_fx (a test-only oracle) and compile them."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.lower import CompiledGraph, compile_graph


def aten_graph(fn: Callable[..., Any], *args: Any, dynamic: bool = False) -> tuple[torch.fx.GraphModule, list[Any]]:
    """fn traced to an ATen graph; with dynamic=True sizes are symbols and the example inputs fake."""
    gm = make_fx(fn, tracing_mode="symbolic" if dynamic else "real")(*args)
    if dynamic:
        return gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    return gm, list(args)


def compile_fn(fn: Callable[..., Any], *args: Any, dynamic: bool = False) -> CompiledGraph:
    gm, examples = aten_graph(fn, *args, dynamic=dynamic)
    return compile_graph(gm, examples)


def raises_as_eager(error: type[BaseException], fn: Callable[..., Any], *args: Any, first_line: bool = False) -> None:
    """fn(*args) raises `error` eagerly and under kiln.compile's default backend, with eager's
    message (its first line only with `first_line`, where ATen appends a location)."""
    with pytest.raises(error) as eager:
        fn(*args)
    kiln.reset()
    with pytest.raises(error) as compiled:
        kiln.compile(fn)(*args)
    got, want = str(compiled.value), str(eager.value)
    if first_line:
        got, want = got.splitlines()[0], want.splitlines()[0]
    assert got == want


def check(fn: Callable[..., Any], *args: Any, atol: float = 1e-5, rtol: float = 1.3e-6, **kw: Any) -> CompiledGraph:
    """Compile fn, run it on args and compare every output (values, dtypes, shapes) with eager."""
    compiled = compile_fn(fn, *args, **kw)
    got = compiled(*args)
    expected = fn(*args)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, e.dtype, g.shape, e.shape)
        torch.testing.assert_close(g, e, equal_nan=True, atol=atol, rtol=rtol)
    return compiled


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
