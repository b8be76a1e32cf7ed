"""Python operators on sizes that torch.compile keeps symbolic: `>>`/`<<` by a known count and
divmod. Each must give eager's values and leave the size a symbol (one graph under dynamic=True,
a second one only for the automatic-dynamic recompile), not specialize it to a graph per length.
Oracle for the graph counts: the real torch.compile(backend="eager") on the same calls, where it
keeps the size symbolic; divmod on a SymInt breaks there (torch.SymInt has no __divmod__), so Kiln's
count is checked against the plain `//` and `%` program.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from torch_oracle import torch_graph_count

LENGTHS = (4, 6, 8, 5, 12)


def _graphs(fn, dynamic):
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager", dynamic=dynamic)
    for n in LENGTHS:
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), fn(x))
    stats = kiln.stats()
    assert stats["graph_breaks"] == 0
    return stats["graphs"]


def _torch_graphs(fn, dynamic):
    return torch_graph_count(fn, [(torch.randn(n),) for n in LENGTHS], dynamic)


def right_shift_half(x):
    return x[: x.size(0) >> 1] * (x.size(0) << 1)


def shift_of_negative(x):
    # Python's >> floors: (5 - 7) >> 1 is -1, not 0
    return x * ((x.size(0) - 7) >> 1) + ((x.size(0) - 9) << 2)


@pytest.mark.parametrize("fn", [right_shift_half, shift_of_negative])
@pytest.mark.parametrize("dynamic", [None, True])
def test_shifts_keep_the_size_symbolic(fn, dynamic):
    assert _graphs(fn, dynamic) == _torch_graphs(fn, dynamic)


def test_shift_by_a_symbolic_count_stays_symbolic():
    # an opaque LShift of the count (kiln.symbolic.expr.BitwiseOp), as torch's LShift: one graph
    # for every value n % 3 takes, its sign guarded (a negative count raises, below)
    def f(x):
        return x * (1 << (x.size(0) % 3))

    assert _graphs(f, True) == 1 <= _torch_graphs(f, True)


def test_negative_shift_count_raises_as_eager():
    def f(x):
        return x * (x.size(0) >> (x.size(0) - 10))

    compiled = kiln.compile(f, backend="eager", dynamic=True)
    with pytest.raises(ValueError, match="negative shift count"):
        f(torch.randn(4))
    with pytest.raises(ValueError, match="negative shift count"):
        compiled(torch.randn(4))


def divmod_of_size(x):
    q, r = divmod(x.size(0), 3)
    return x * q + r


def floordiv_and_mod_of_size(x):
    return x * (x.size(0) // 3) + x.size(0) % 3


@pytest.mark.parametrize("dynamic", [None, True])
def test_divmod_of_a_size_is_floordiv_and_mod(dynamic):
    assert _graphs(divmod_of_size, dynamic) == _torch_graphs(floordiv_and_mod_of_size, dynamic)


def test_divmod_of_constants_and_float_arguments():
    # a float argument is symbolic too (specialize_float is off): its divmod must not break
    def f(x, s, n):
        q, r = divmod(7, 2)
        fq, fr = divmod(s, 0.5)
        mq, mr = divmod(n, 0.75)
        return x * q + r + fq + fr + mq * mr

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    for s, n in ((1.25, 3), (2.75, 5), (-1.5, -4)):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, s, n), f(x, s, n))
