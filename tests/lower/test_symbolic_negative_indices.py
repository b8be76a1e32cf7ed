"""A select index or slice bound that is an int argument of a dynamic graph (a symbol once it
changed) may be negative: the capture guards its sign, so a negative one gets a graph of its own, but
the graph holds the raw value. The lowering wraps a select index as ATen does
(kiln.lower.lowerings.wrapped_index): a raw -1 read before the tensor (garbage values) and made
in-place writes and select_scatter write nothing. A slice starts where the trace's storage offset
says, which differs between the two signs' graphs although their code is the same: the compiled-graph
cache key holds each node's storage offset (kiln/lower/__init__.py), or the negative graph reused the
positive one's kernels and read before the tensor too."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln import config

pytestmark = pytest.mark.cpp


def _read(x, k):
    return x.select(1, k) + 1, x.select(0, k % 3 - 3) * 2


def _returned_view(x, k):
    return x.select(1, k), x.sum()


def _inplace(x, k):
    x.select(1, k).mul_(10)
    return x.sum(0)


def _setitem(x, k):
    x[:, k] = -1.0
    return x * 1


def _scatter(x, k):
    return torch.select_scatter(x, torch.zeros(3), 1, k) + 0


def _slice_both_bounds(x, k):
    return x[:, k:k + 2] * 1


@pytest.mark.parametrize("wrapper", ["auto", "python"])
@pytest.mark.parametrize("fn", [_read, _returned_view, _inplace, _setitem, _scatter, _slice_both_bounds],
                         ids=lambda f: f.__name__)
def test_a_symbolic_negative_index_counts_from_the_end(fn, wrapper):
    kiln.reset()
    with config.patch(cpu_wrapper=wrapper):
        compiled = kiln.compile(fn)
        for k in [0, 1, -3, -2, 2, -1, 3]:
            mine, theirs = torch.arange(12.0).view(3, 4), torch.arange(12.0).view(3, 4)
            got, want = compiled(mine, k), fn(theirs, k)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert torch.equal(g, w), (k, g, w)
            assert torch.equal(mine, theirs), k
