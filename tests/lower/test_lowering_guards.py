"""A guard that the lowering itself records (a decomposition reading a symbol's value) specializes
the compiled program to that capture's values: the compiled-graph cache must not hand that program
to a later capture with other values. Found with linspace(0, f, 5) for a dynamic float f: its
decomposition compares and folds f, and the second value's program was reused for every later one."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln

pytestmark = pytest.mark.cpp


def test_linspace_to_a_dynamic_float_follows_each_value() -> None:
    def fn(x: torch.Tensor, f: float) -> torch.Tensor:
        return torch.linspace(0, f, 5) + x

    kiln.reset()
    compiled = kiln.compile(fn)
    x = torch.zeros(5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for f in (0.5, 0.25, 0.75, 0.1, 0.75):
            torch.testing.assert_close(compiled(x, f), fn(x, f), rtol=0, atol=0)
    # the decomposition's symbolic scalars are Kiln's business, not a warning for the user
    assert not [w for w in seen if "Raw Sym" in str(w.message)], [str(w.message) for w in seen]


def test_linspace_with_a_dynamic_step_count() -> None:
    def fn(x: torch.Tensor, n: int) -> torch.Tensor:
        return torch.linspace(0, 1, n) * x.sum()

    kiln.reset()
    compiled = kiln.compile(fn)
    x = torch.ones(3)
    for n in (4, 5, 1, 7, 2, 9):
        torch.testing.assert_close(compiled(x, n), fn(x, n), rtol=0, atol=0)
