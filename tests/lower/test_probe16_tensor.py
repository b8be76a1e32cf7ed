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
