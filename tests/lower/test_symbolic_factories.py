"""A decomposition that builds tensors of a symbolic size (torch.eye(n) is two aranges of n and a
comparison) keeps the size symbolic under the default backend.

The lowering records a decomposition's ops on meta tensors, but a factory inside it named the
graph's device (cpu): its CPU kernel turned the symbolic n into its example value, a guard that
specialized the graph, so under dynamic=True every new size compiled again (4 graphs where the
eager backend and torch.compile make 1). Oracle for the count: torch.compile(backend="eager").
"""
from __future__ import annotations

import pytest
import torch

import kiln
from torch_oracle import torch_graph_count

SHAPES = ((4, 3), (6, 5), (8, 7), (5, 6))


def eye_square(x):
    return torch.eye(x.size(0)) @ x


def eye_rectangular(x):
    return torch.eye(x.size(0), x.size(1), dtype=torch.float64) * x


def eye_of_int_argument(x, n):
    return torch.eye(n)[: x.size(0)].sum(0) + x.sum()


def _torch_graphs(fn, calls, dynamic):
    return torch_graph_count(fn, calls, dynamic)


@pytest.mark.cpp
@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("fn", [eye_square, eye_rectangular, eye_of_int_argument])
def test_eye_of_a_symbolic_size_keeps_it_symbolic(fn, dynamic):
    takes_int = fn.__code__.co_argcount == 2
    calls = [((torch.randn(*s), s[0] + 2) if takes_int else (torch.randn(*s),)) for s in SHAPES]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=dynamic)
    for args in calls:
        torch.testing.assert_close(compiled(*args), fn(*args))
    assert kiln.stats()["fallbacks"] == 0
    assert kiln.stats()["graphs"] == _torch_graphs(fn, calls, dynamic)
