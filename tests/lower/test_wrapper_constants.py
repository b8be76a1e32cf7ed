"""Constants the Python wrapper passes to ATen calls or returns: non-finite floats and complex
numbers (`-inf`, `nan`) are bound as values, not printed as text no wrapper defines (a NameError
at the first call), on the Python wrapper and on the native tiers."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import kiln
from kiln.log import KilnWarning

pytestmark = pytest.mark.cpp

C = torch.randn(5, dtype=torch.complex64)
MASK = torch.tensor([True, False, True, False, True])


def fills(x, m):
    return x.masked_fill(m, float("-inf")) * 2, x.masked_fill(~m, float("nan")), x.masked_fill(m, float("inf"))


def full_like_nan(x, m):
    return torch.full_like(x, float("nan")) + x, torch.full_like(x, complex(math.inf, -math.inf))


def _same(got, expected):
    for g, e in zip(got, expected):
        assert torch.equal(torch.view_as_real(g).isnan(), torch.view_as_real(e).isnan())
        torch.testing.assert_close(torch.view_as_real(g).nan_to_num(), torch.view_as_real(e).nan_to_num())


@pytest.mark.parametrize("fn", [fills, full_like_nan])
@pytest.mark.parametrize("wrapper", ["python", "plan", "compiled"])
def test_non_finite_constants(fn, wrapper):
    kiln.reset()
    settings = {"python": dict(cpu_wrapper="python"), "plan": dict(cpu_wrapper="native", native_plan=True),
                "compiled": dict(cpu_wrapper="native", native_plan=False)}[wrapper]
    with kiln.config.patch(**settings), warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # compiled, not an internal error run eagerly
        got = kiln.compile(fn)(C, MASK)
    _same(got, fn(C, MASK))
    assert kiln.stats()["fallbacks"] == 0
