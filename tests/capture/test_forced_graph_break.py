"""`kiln.graph_break()` and `torch._dynamo.graph_break()` (PyTorch's own tests force breaks with it):
a break where the program asks, with torch.compile's graph counts, eager's values, and under
fullgraph=True an error naming the line."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

import kiln
from kiln.errors import GraphBreakError


def straight(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y * 2


def twice_in_a_loop(x):
    for i in range(3):
        x = x + i
        if i < 2:
            torch._dynamo.graph_break()
    return x


def in_a_callee(x):
    def inner(v):
        v = v * 3
        torch._dynamo.graph_break()
        return v + 1
    return inner(x).cos()


def with_kiln_spelling(x):
    y = x.exp()
    kiln.graph_break()
    return y - 1


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x).relu()
        torch._dynamo.graph_break()
        return self.b(h)


@pytest.mark.parametrize("fn", [straight, twice_in_a_loop, in_a_callee, with_kiln_spelling, Block()],
                         ids=["straight", "loop", "callee", "kiln", "module"])
def test_graph_counts_and_values_as_torch_compile(fn):
    x = torch.randn(2, 4)
    kiln.reset()
    got = kiln.compile(fn, backend="eager")(x)
    torch.testing.assert_close(got, fn(x))
    stats = kiln.stats()
    assert stats["graph_breaks"] >= 1
    # torch.compile does not know kiln's spelling; it skips a frame with a break inside a loop (0
    # graphs) where Kiln compiles around it, and counts a callee's break apart (3 graphs, Kiln 1)
    if fn not in (with_kiln_spelling, twice_in_a_loop, in_a_callee):
        torch._dynamo.reset()
        counter = CompileCounter()
        torch.compile(fn, backend=counter)(x)
        assert stats["graphs"] == counter.frame_count


def test_fullgraph_names_the_line():
    with pytest.raises(GraphBreakError, match="test_forced_graph_break.py"):
        kiln.compile(straight, backend="eager", fullgraph=True)(torch.randn(3))


def test_default_backend_values():
    kiln.reset()
    x = torch.randn(5)
    torch.testing.assert_close(kiln.compile(twice_in_a_loop)(x), twice_in_a_loop(x))
