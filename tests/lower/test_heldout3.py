"""Patterns of held-out models (a GNN's message passing, DLRM's interaction, embeddings joined by
a concatenation) that the lowering must compute as fast as they are written, and still check.

A gather (index_select, indexing, embedding) read whole by one part of a concatenation is checked
by the kernel that stores the concatenation, so it gets no check-only pass of its own
(kiln/lower/coverage.py `_regions`); read in part (a slice of the concatenation, a slice of the
gather) it still does, and an index out of range raises eager's error either way.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .conftest import check, compile_fn, raises_as_eager

pytestmark = pytest.mark.cpp


def _gnn_message(h, src, dst):
    return torch.cat([h.index_select(0, src), h.index_select(0, dst)], dim=1)


def _rows_then_tensor(x, i, y):
    return torch.cat([x[i], y], dim=0)


def _middle_part(x, i, y):
    return torch.cat([y, x.index_select(0, i), y], dim=1) * 2


def _embeddings(w, i, j):
    return torch.cat([F.embedding(i, w), F.embedding(j, w)], dim=-1).relu()


def _three_gathers_dim0(x, i, j):
    return torch.cat([x[i], x[j], x[i]], dim=0)


def _pairwise_interaction(t, li, lj):
    z = torch.bmm(t, t.transpose(1, 2))
    return torch.cat([t[:, 0], z[:, li, lj]], dim=1)


_CASES = {
    "gnn_message": (_gnn_message, lambda: (torch.randn(7, 4), torch.tensor([0, 6, 3, 3, 1]), torch.tensor([2, 2, 5, 0, 6]))),
    "rows_then_tensor": (_rows_then_tensor, lambda: (torch.randn(5, 3), torch.tensor([4, 0, 2]), torch.randn(2, 3))),
    "middle_part": (_middle_part, lambda: (torch.randn(6, 3), torch.tensor([5, 1, 1, 0]), torch.randn(4, 2))),
    "embeddings": (_embeddings, lambda: (torch.randn(9, 4), torch.tensor([[1, 8], [0, 3]]), torch.tensor([[2, 2], [7, 5]]))),
    "three_gathers_dim0": (_three_gathers_dim0, lambda: (torch.randn(6, 5), torch.tensor([5, 0]), torch.tensor([1, 2, 3]))),
    "pairwise_interaction": (_pairwise_interaction, lambda: (torch.randn(3, 4, 5), *torch.tril_indices(4, 4, -1))),
}


@pytest.mark.parametrize("name", list(_CASES))
def test_a_gather_read_whole_by_a_concatenation_gets_no_check_pass(name) -> None:
    fn, make = _CASES[name]
    args = make()
    c = check(fn, *args)
    assert c.kernel_count == 1, c.cpp_source  # the concatenation's; a check pass would be a second


@pytest.mark.parametrize("name", ["gnn_message", "rows_then_tensor", "middle_part", "embeddings", "three_gathers_dim0"])
def test_a_gather_read_by_a_concatenation_still_raises_out_of_range(name) -> None:
    fn, make = _CASES[name]
    args = list(make())
    big = args[0].shape[0] + 3
    for k, a in enumerate(args):
        if k > 0 and a.dtype == torch.int64:
            bad = a.clone()
            bad.view(-1)[-1] = big  # the gather's last element: the end of its part
            raises_as_eager(IndexError, fn, *[bad if m == k else b for m, b in enumerate(args)], first_line=True)


def _cat_sliced(x, i, y):
    return torch.cat([x[i], y], dim=0)[:2]


def _cat_sliced_past_first_part(x, i, y):
    return torch.cat([y, x[i]], dim=0)[:3]


def _gather_sliced(x, i, y):
    return torch.cat([x[i][:2], y], dim=0)


@pytest.mark.parametrize("fn", [_cat_sliced, _cat_sliced_past_first_part, _gather_sliced],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_gather_read_in_part_through_a_concatenation_is_checked_whole(fn) -> None:
    x, y = torch.randn(5, 3), torch.randn(2, 3)
    good = torch.tensor([4, 0, 2])
    check(fn, x, good, y)
    bad = torch.tensor([4, 0, 9])  # the row no reader computes
    with pytest.raises(IndexError):
        fn(x, bad, y)
    with pytest.raises((IndexError, RuntimeError)):
        compile_fn(fn, x, good, y)(x, bad, y)


def test_dynamic_sizes_gather_through_a_concatenation() -> None:
    h, src, dst = torch.randn(7, 4), torch.tensor([0, 6, 3, 3, 1]), torch.tensor([2, 2, 5, 0, 6])
    c = compile_fn(_gnn_message, h, src, dst, dynamic=True)
    torch.testing.assert_close(c(h, src, dst)[0], _gnn_message(h, src, dst))
    assert c.kernel_count == 1, c.cpp_source
    bad = dst.clone()
    bad[-1] = 40
    with pytest.raises((IndexError, RuntimeError)):
        c(h, src, bad)


# ----------------------------------------------------------------------------- max.dim / min.dim

def _max_values(x):
    return torch.max(x, 2)[0]


def _min_values_keepdim(x):
    return torch.min(x, 1, keepdim=True)[0] * 2


def _max_values_last_dim_relu(x):
    return torch.max(x.relu(), -1).values + 1


def _max_pair_whole(x):
    return torch.max(x, 1)


def _min_indices_only(x):
    return torch.min(x, 2)[1]


@pytest.mark.parametrize("fn", [_max_values, _min_values_keepdim, _max_values_last_dim_relu],
                         ids=lambda f: f.__name__.strip("_"))
def test_max_dim_values_alone_are_one_reduction(fn) -> None:
    x = torch.randn(3, 5, 7)
    x[1, 2, 3] = float("nan")
    c = check(fn, x)
    assert "int64_t acc_" not in c.cpp_source, c.cpp_source  # no position pass
    assert c.cpp_source.count("acc_buf") <= 8, c.cpp_source  # one float accumulator (and its NaN flag)


@pytest.mark.parametrize("fn", [_max_pair_whole, _min_indices_only], ids=lambda f: f.__name__.strip("_"))
def test_max_dim_positions_when_read(fn) -> None:
    x = torch.randn(3, 5, 7)
    x[0, :, 1] = x[0, 0, 1]  # ties: the first position
    x[2, 3, 4] = float("nan")
    check(fn, x)


def test_max_dim_values_dynamic_sizes() -> None:
    x = torch.randn(2, 4, 6)
    c = compile_fn(_max_values, x, dynamic=True)
    torch.testing.assert_close(c(x)[0], _max_values(x))
    assert "int64_t acc_" not in c.cpp_source
