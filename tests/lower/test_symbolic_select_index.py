"""A select index that is an int argument of a dynamic graph (a symbol once it changed) may be
negative: the capture guards its sign, so a negative one gets a graph of its own, but the graph holds
the raw value, which the lowering wraps as ATen does (kiln.lower.lowerings.wrapped_index). A raw -1
read before the tensor (garbage values) and made in-place writes and select_scatter write nothing."""
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


@pytest.mark.parametrize("wrapper", ["auto", "python"])
@pytest.mark.parametrize("fn", [_read, _returned_view, _inplace, _setitem, _scatter], ids=lambda f: f.__name__)
def test_a_symbolic_negative_select_index_counts_from_the_end(fn, wrapper):
    kiln.reset()
    with config.patch(cpu_wrapper=wrapper):
        compiled = kiln.compile(fn)
        for k in [0, 1, 3, -1, -4, 2, -2]:
            mine, theirs = torch.arange(12.0).view(3, 4), torch.arange(12.0).view(3, 4)
            got, want = compiled(mine, k), fn(theirs, k)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert torch.equal(g, w), (k, g, w)
            assert torch.equal(mine, theirs), k
