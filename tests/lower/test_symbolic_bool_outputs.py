"""A graph whose outputs or operands include comparisons of unspecialized ints or sizes (SymBools):
the AOT tracer, the lowering and every wrapper (Python, a plan, a compiled native wrapper) give the
caller eager's True/False, not an internal error or 1/0."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln import config
from kiln.log import KilnWarning


def _comparisons(x: torch.Tensor, n: int) -> tuple:
    return x + n, n > 3, (n == 5) or (n < 1), n ** 2 > 2 ** 40, x * (n >= 4), x.shape[0] != n


@pytest.mark.cpp
@pytest.mark.parametrize("wrapper, plan", [("python", False), ("native", True), ("native", False)])
def test_symbolic_bools_returned_and_used_match_eager(wrapper: str, plan: bool) -> None:
    kiln.reset()
    with config.patch(cpu_wrapper=wrapper, native_plan=plan), warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # an internal error would run the frame eagerly
        compiled = kiln.compile(_comparisons)
        for n in (2, 5, 7, 0, 1000000, 6):
            x = torch.arange(3.0)
            got, expected = compiled(x, n), _comparisons(x, n)
            assert [type(v) for v in got] == [type(v) for v in expected], n
            assert repr(got) == repr(expected), n
    assert kiln.stats()["fallbacks"] == 0
