"""Ops whose eager kernels check their arguments' values raise eager's error when compiled (they run
as ATen's call, kiln/lower/decompose.py): bernoulli of a tensor of probabilities outside [0, 1]
(drawing from the global generator as eager does), max_unpool with an index outside the output
(a negative one was wrapped to the last element). Valid arguments still agree with eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln

from .conftest import raises_as_eager

pytestmark = pytest.mark.cpp


@pytest.mark.parametrize("p", [[0.2, 1.5, 0.3], [-0.1, 0.5, 0.5]], ids=["above_one", "negative"])
def test_bernoulli_of_probabilities_out_of_range_raises_eagers_error(p):
    def fn(p):
        return torch.bernoulli(p * 1) * 2

    probabilities = torch.tensor(p)
    raises_as_eager(RuntimeError, fn, probabilities, first_line=True)


def test_bernoulli_of_valid_probabilities_draws_zeros_and_ones_reproducibly():
    kiln.reset()
    compiled = kiln.compile(lambda p: torch.bernoulli(p) + p * 0)
    p = torch.rand(4, 500)
    torch.manual_seed(1)
    first = compiled(p)
    torch.manual_seed(1)
    second = compiled(p)
    assert first.shape == p.shape and torch.equal(first, second)
    assert ((first == 0) | (first == 1)).all() and 0.3 < first.mean() < 0.7


@pytest.mark.parametrize("bad", [40, 16, -1], ids=["far", "just_past", "negative"])
def test_max_unpool_with_an_index_outside_the_output_raises_eagers_error(bad):
    def fn(x, i):
        return F.max_unpool2d(x * 1, i, 2) + 1

    x = torch.randn(1, 1, 2, 2)
    indices = torch.tensor([[[[0, 3], [bad, 15]]]])
    raises_as_eager(RuntimeError, fn, x, indices)


def test_max_unpool_of_max_pool_indices_agrees_with_eager():
    def fn(x):
        y, i = F.max_pool2d(x, 2, return_indices=True)
        z, j = F.max_pool3d(x[None], 2, return_indices=True)
        return F.max_unpool2d(y, i, 2) * 2, F.max_unpool3d(z, j, 2)

    x = torch.randn(2, 3, 4, 6)
    kiln.reset()
    for got, want in zip(kiln.compile(fn)(x), fn(x)):
        torch.testing.assert_close(got, want)
