"""An in-place op on a tensor the backward needs: the forward runs, the backward raises eager's
error, and no internal error (fallback warning) is reported.

Eager raises autograd's version-counter error only when the backward runs. Tracing the joint graph
ran that backward at compile time, so the frame failed to compile (a fallback warning) although
the program is fine as long as no backward is asked for.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln.log import KilnWarning


def _sigmoid_then_scaled_in_place(x):
    y = (x * 2).sigmoid()  # sigmoid saves its output for the backward
    y.mul_(2)
    return y + 1


def _exp_of_view_then_write(x):
    y = x * 1
    z = y[1:].exp()
    z[0] = 0.0  # exp saved z
    return z.sum() + y.sum()


@pytest.mark.parametrize("fn", [_sigmoid_then_scaled_in_place, _exp_of_view_then_write])
def test_forward_runs_and_backward_raises_eagers_error(fn) -> None:
    x = torch.randn(4, requires_grad=True)
    expected = fn(x)
    with pytest.raises(RuntimeError) as eager_error:
        expected.sum().backward()
    kiln.reset()
    compiled = kiln.compile(fn, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        got = compiled(x)
    torch.testing.assert_close(got, expected)
    with pytest.raises(RuntimeError) as error:
        got.sum().backward()
    assert "modified by an inplace operation" in str(error.value)
    assert str(error.value).split(":")[0] == str(eager_error.value).split(":")[0]
    with torch.no_grad():  # no backward: the same values, compiled
        torch.testing.assert_close(compiled(x), fn(x))
