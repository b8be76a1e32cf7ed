"""Tensor metadata of compiled outputs as eager's: strides of size-1 dims kept by a reduction.

A reduction with keepdim=True re-inserted each reduced dim with stride 1, where eager (and the meta
functions) give it the stride a contiguous layout has: `sum(1, keepdim=True)` of a (3, 4, 5) tensor
has strides (5, 5, 1), Kiln returned (5, 1, 1). Code that reads strides (`is_contiguous` with a
memory format, `as_strided`, a C++ extension) saw a different tensor. Each case compares sizes,
strides, storage offset and values with eager's.
"""
from __future__ import annotations

import pytest
import torch

import kiln

KEEPDIM = {
    "sum_middle": (lambda a: a.sum(1, keepdim=True), lambda: torch.randn(3, 4, 5)),
    "sum_two_dims": (lambda a: a.sum((0, 1), keepdim=True), lambda: torch.randn(3, 4, 2)),
    "amax_first_transposed_input": (lambda a: a.amax(0, keepdim=True), lambda: torch.randn(4, 3).t()),
    "argmax_first": (lambda a: a.argmax(0, keepdim=True), lambda: torch.randn(3, 4)),
    "max_dim_values_indices": (lambda a: tuple(a.max(0, keepdim=True)), lambda: torch.randn(3, 4)),
    "any_first_of_permuted": (lambda a: (a > 0).any(0, keepdim=True), lambda: torch.randn(5, 4, 3).permute(2, 1, 0)),
    "amin_middle": (lambda a: a.amin(1, keepdim=True), lambda: torch.randn(2, 3, 4)),
    "all_middle": (lambda a: (a > -1).all(1, keepdim=True), lambda: torch.randn(2, 3, 4)),
    "sum_of_exp_first": (lambda a: a.exp().sum(0, keepdim=True), lambda: torch.randn(3, 4, 5)),
}


def _meta(v):
    return [(tuple(t.shape), t.stride(), t.storage_offset(), t.dtype) for t in (v if isinstance(v, tuple) else (v,))]


@pytest.mark.parametrize("name", sorted(KEEPDIM))
def test_keepdim_reduction_strides_match_eager(name):
    fn, make = KEEPDIM[name]
    x = make()
    expected = fn(x)
    got = kiln.compile(fn)(x)
    assert _meta(got) == _meta(expected)
    for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(g, e)


# An intermediate updated in place, itself or through a view, keeps its strides in eager; the
# functionalized graph gave it the layout of the out-of-place op's result (masked_fill of a
# transposed tensor is contiguous, so y.t().masked_fill_(...) left y transposed), and the
# lowering's scatter/index_put/index_fill/index_add copied their input contiguously where eager's
# clone keeps its strides.
def _updated(update, make=lambda x: x.t() * 2):
    def fn(x):
        y = make(x)
        update(y)
        return y
    return fn


_IDX = torch.tensor([1])
LAYOUT_KEPT = {
    "masked_fill_through_transpose": _updated(lambda y: y.t().masked_fill_(y.t() > 0, 0.0), lambda x: x * 2),
    "masked_fill_of_transposed": _updated(lambda y: y.masked_fill_(y > 0, 0.0)),
    "masked_fill_of_permuted_3d": _updated(lambda y: y.masked_fill_(y > 0, 1.0),
                                           lambda x: x.view(2, 2, 4).permute(2, 0, 1) * 2),
    "tril_of_transposed": _updated(lambda y: y.tril_()),
    "scatter_of_transposed": _updated(lambda y: y.scatter_(0, torch.tensor([[1, 0, 0, 1]]), 3.0)),
    "scatter_add_of_transposed": _updated(lambda y: y.scatter_add_(0, torch.tensor([[1, 0, 0, 1]]), torch.ones(1, 4))),
    "index_fill_of_transposed": _updated(lambda y: y.index_fill_(0, _IDX, 0.0)),
    "index_put_accumulate_of_transposed": _updated(
        lambda y: y.index_put_((torch.tensor([1, 1]),), torch.tensor(1.0), accumulate=True)),
    "setitem_rows_of_transposed": _updated(lambda y: y.__setitem__(torch.tensor([0, 2]), 1.0)),
    "index_add_of_transposed": _updated(lambda y: y.index_add_(0, _IDX, torch.ones(1, 4))),
    "index_copy_of_transposed": _updated(lambda y: y.index_copy_(0, _IDX, torch.ones(1, 4))),
    "masked_scatter_of_transposed": _updated(lambda y: y.masked_scatter_(y > 0, torch.ones(16))),
    "index_fill_out_of_place_of_transposed_input": lambda x: x.t().index_fill(1, torch.tensor([0]), 3.0),
    "index_put_out_of_place_of_transposed_input": lambda x: x.t().index_put((torch.tensor([0, 0]),), torch.ones(4),
                                                                             accumulate=True),
}


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("name", sorted(LAYOUT_KEPT))
def test_updated_intermediate_keeps_eager_strides(name, requires_grad):
    fn = LAYOUT_KEPT[name]
    torch.manual_seed(0)
    x = torch.randn(4, 4)
    xe = x.clone().requires_grad_(requires_grad)
    xc = x.clone().requires_grad_(requires_grad)
    expected = fn(xe)
    kiln.reset()
    got = kiln.compile(fn)(xc)
    assert _meta(got) == _meta(expected)
    torch.testing.assert_close(got, expected)
    if requires_grad:
        w = torch.arange(float(expected.numel())).view(expected.shape)
        (expected * w).sum().backward()
        (got * w).sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad)
