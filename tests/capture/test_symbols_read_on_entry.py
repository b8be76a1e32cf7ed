"""Sizes the glue returns or passes on are the values of the frame's symbols on entry, even when
the graph changed an input's sizes in place (x.t_(), x.unsqueeze_(0)).

The glue read a symbol input by its source (`L['x'].size()[1]`) after the graph ran: for a graph
that re-strided x, that was the new size, and `x.t_(); return x.shape` returned the old shape.
"""
from __future__ import annotations

import pytest
import torch

import kiln


def _transpose_then_shape(x):
    x.t_()
    return x + 1, x.shape


def _unsqueeze_then_sizes(x):
    x.unsqueeze_(0)
    return x * 2, x.shape[1] * 10 + x.shape[2], x.size()


def _squeeze_then_reshape_by_size(x):
    n, m = x.shape
    x.t_()
    return x.reshape(m, n), [n, m], x.shape


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", [_transpose_then_shape, _unsqueeze_then_sizes, _squeeze_then_reshape_by_size])
def test_sizes_after_an_input_metadata_change(backend: str, fn) -> None:
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend, dynamic=True)
    for shape in ((2, 3), (4, 5)):
        x = torch.randn(*shape)
        expected_x = x.clone()
        expected = fn(expected_x)
        got = compiled(x)
        assert x.shape == expected_x.shape
        for g, e in zip(got, expected):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(g, e)
            else:
                assert g == e
