"""int() of a symbolic int, and int's methods that return the int itself (`__index__`,
`__int__`, `__floor__` ...), keep the symbol: `int(x.shape[0])`, `int(n)` of a dynamic int
argument, and `int(t.item())` (whose value reaches a resume function as a dynamic int) must not
guard the value, which made one graph per length. Oracle for the counts: the real
torch.compile(backend="eager") on the same calls.
"""
from __future__ import annotations

import math

import pytest
import torch

import kiln
from torch_oracle import torch_graph_count

CALLS = ((4, 2), (6, 2), (8, 4), (5, 3), (9, 5))


def int_of_int_argument(x, n):
    return x[: int(n) + 1]


def int_of_size(x, n):
    return x[: int(x.size(0)) // 2] + n


def int_of_int_product(x, n):
    return x * int(n * 2)


def index_of_int_argument(x, n):
    return x[: n.__index__()] * n.__int__()


def floor_of_int_argument(x, n):
    return x * math.floor(n) + math.ceil(x.size(0))


def _kiln_graphs(fn, dynamic):
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager", dynamic=dynamic)
    for size, n in CALLS:
        x = torch.randn(size)
        torch.testing.assert_close(compiled(x, n), fn(x, n))
    return kiln.stats()["graphs"]


def _torch_graphs(fn, dynamic):
    return torch_graph_count(fn, [(torch.randn(size), n) for size, n in CALLS], dynamic)


@pytest.mark.parametrize("fn", [int_of_int_argument, int_of_size, int_of_int_product, floor_of_int_argument])
@pytest.mark.parametrize("dynamic", [None, True])
def test_int_of_a_symbolic_int_keeps_the_symbol(fn, dynamic):
    assert _kiln_graphs(fn, dynamic) == _torch_graphs(fn, dynamic)


def test_index_and_int_methods_of_a_symbolic_int():
    # torch.SymInt has no __index__ method to call by name (Dynamo breaks), so no oracle count:
    # Kiln traces it as the int itself, one graph, nothing run eagerly
    assert _kiln_graphs(index_of_int_argument, True) == 1
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["fallbacks"] == 0


def test_int_of_item_in_the_resume_function():
    # .item() breaks the graph (capture_scalar_outputs is off); int() of its value in the resume
    # function is a dynamic int there, so new counts reuse the resume graph
    def f(x):
        return x[: int((x > 0).sum().item()) + 1]

    kiln.reset()
    compiled = kiln.compile(f, backend="eager", dynamic=True)
    for x in (torch.tensor([1.0, -1, 1, -1]), torch.tensor([1.0, 1, -1, -1, 1, -1]),
              torch.tensor([1.0, 1, 1, 1, -1, -1, -1, -1]), torch.tensor([1.0, 1, 1, -1, -1])):
        torch.testing.assert_close(compiled(x), f(x))
    assert kiln.stats()["graphs"] == 2
