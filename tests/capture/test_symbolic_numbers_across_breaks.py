"""Symbolic numbers read off a dynamic tensor (numel, stride, sizes) after a graph break must be the
values of each call, never the traced call's: the glue once kept `rows.numel() + 1` of the first
dynamic trace as a constant (a trace-time SymInt), and every later call divided by it."""
from __future__ import annotations

import pytest
import torch

import kiln


def _after_argwhere(x):
    rows = torch.argwhere(x > 0)
    print("a break")  # noqa: T201 - the break under test
    return rows.float() / (rows.numel() + 1)


def _numel_and_stride(x):
    y = x.t()
    print("a break")  # noqa: T201
    return y * y.numel() + y.stride(0) - y.stride()[1] + y.nelement()


def _stride_only(x):
    print("a break")  # noqa: T201
    return x.sum() * x.stride(0) + x.size(0)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("fn", [_after_argwhere, _numel_and_stride, _stride_only])
def test_values_follow_each_call(fn, backend, capsys):
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    torch.manual_seed(0)
    for n in (5, 9, 6, 12, 9, 3):  # the second size makes the frames dynamic
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), fn(x))
    assert kiln.stats()["fallbacks"] == 0


def test_numel_of_a_dynamic_tensor_stays_in_the_graph():
    kiln.reset()

    def f(x):
        return x / (x.numel() + 1) + x.stride(0)

    compiled = kiln.compile(f, backend="eager", dynamic=True)
    for n in (4, 7, 10):
        x = torch.randn(n, 2)
        torch.testing.assert_close(compiled(x), f(x))
    stats = kiln.stats()
    assert stats["graph_breaks"] == 0 and stats["graphs"] == 1, stats
