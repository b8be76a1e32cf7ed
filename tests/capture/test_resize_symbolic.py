"""Tensor.resize_/resize_as_ to sizes known only at run time: a graph break (as in torch.compile),
not a graph the AOT trace fails on (ATen's resize_ takes plain ints there: an internal error and
an eager fallback of the whole frame under the default backend)."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln.log import KilnWarning

pytestmark = pytest.mark.cpp


def _resize_to_shape(x):
    y = torch.empty(0)
    y.resize_(x.shape)
    y.copy_(x)
    return y * 2


def _resize_as(x):
    y = torch.empty(0)
    y.resize_as_(x)
    return y.copy_(x).sin()


def _resize_static_size(x):
    y = torch.empty(0)
    y.resize_(2, 3)
    return y.copy_(x) + 1


@pytest.mark.parametrize("fn", [_resize_to_shape, _resize_as, _resize_static_size])
def test_resize_under_dynamic_shapes_matches_eager_without_fallback(fn) -> None:
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        for shape in ((2, 3), (2, 3), (4, 5)) if fn is not _resize_static_size else ((2, 3), (2, 3)):
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), fn(x))
    assert kiln.stats()["fallbacks"] == 0


def test_resize_to_symbolic_sizes_is_a_named_break() -> None:
    kiln.reset()
    with pytest.raises(kiln.errors.GraphBreakError, match="resize_.*run time"):
        kiln.compile(_resize_to_shape, dynamic=True, fullgraph=True, backend="eager")(torch.randn(2, 3))
