"""Random ops whose eager kernels check their arguments' values raise eager's error when compiled:
bernoulli of a tensor of probabilities outside [0, 1] (it runs as ATen's call, kiln/lower/decompose.py,
drawing from the global generator as eager does); valid probabilities still give 0/1 draws in the
probabilities' shape, reproducible under manual_seed."""
from __future__ import annotations

import pytest
import torch

import kiln

pytestmark = pytest.mark.cpp


@pytest.mark.parametrize("p", [[0.2, 1.5, 0.3], [-0.1, 0.5, 0.5]], ids=["above_one", "negative"])
def test_bernoulli_of_probabilities_out_of_range_raises_eagers_error(p):
    def fn(p):
        return torch.bernoulli(p * 1) * 2

    probabilities = torch.tensor(p)
    with pytest.raises(RuntimeError) as eager:
        fn(probabilities)
    kiln.reset()
    with pytest.raises(RuntimeError) as compiled:
        kiln.compile(fn)(probabilities)
    assert str(compiled.value).splitlines()[0] == str(eager.value).splitlines()[0]


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
