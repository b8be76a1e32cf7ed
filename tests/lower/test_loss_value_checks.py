"""Losses whose eager kernels check their inputs' values raise eager's error when compiled (their
forward runs as ATen's call, kiln/lower/decompose.py): nll_loss / cross_entropy with a target out of
range (IndexError), binary_cross_entropy with an input or target outside [0, 1]; valid inputs,
ignore_index, class weights and the 2-d (image) form still agree with eager, gradients included."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln

from .conftest import raises_as_eager

pytestmark = pytest.mark.cpp

BAD_TARGETS = [
    ("past_the_end", lambda x, c: F.cross_entropy(x, c), torch.tensor([0, 3, 1, 1])),
    ("negative", lambda x, c: F.cross_entropy(x, c), torch.tensor([0, -1, 1, 1])),
    ("no_reduction", lambda x, c: F.nll_loss(x.log_softmax(1), c, reduction="none") * 2, torch.tensor([0, 2, 7, 1])),
    ("image", lambda x, c: F.cross_entropy(x.view(2, 3, 2, 1), c.view(2, 2, 1)), torch.tensor([0, 1, 2, 5])),
]


@pytest.mark.parametrize("name,fn,target", BAD_TARGETS, ids=[b[0] for b in BAD_TARGETS])
def test_a_target_out_of_range_raises_eagers_index_error(name, fn, target):
    x = torch.randn(4, 3)
    raises_as_eager(IndexError, fn, x, target)


def test_valid_targets_agree_with_eager_forward_and_backward():
    torch.manual_seed(0)
    weight = torch.tensor([1.0, 2.0, 0.5])

    def loss(x, c, c4):
        return (F.cross_entropy(x, c, weight=weight) + F.cross_entropy(x, c, ignore_index=-1, label_smoothing=0.1)
                + F.cross_entropy(x.view(2, 2, 3).transpose(1, 2), c4))

    x = torch.randn(4, 3, requires_grad=True)
    c, c4 = torch.tensor([0, -1, 2, 1]).clamp(min=0), torch.tensor([[0, 2], [1, 1]])
    c_ignored = torch.tensor([0, -1, 2, 1])
    kiln.reset()
    compiled = kiln.compile(lambda x, c, c4, ci: loss(x, c, c4) + F.cross_entropy(x, ci, ignore_index=-1))
    got = compiled(x, c, c4, c_ignored)
    (gx,) = torch.autograd.grad(got, x)
    want = loss(x, c, c4) + F.cross_entropy(x, c_ignored, ignore_index=-1)
    (wx,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(gx, wx)


BCE_OUT_OF_RANGE = [
    ("input_above_one", torch.tensor([0.2, 1.5, 0.3]), torch.tensor([0.0, 1.0, 1.0])),
    ("input_negative", torch.tensor([0.2, -0.1, 0.3]), torch.tensor([0.0, 1.0, 1.0])),
    ("target_above_one", torch.tensor([0.2, 0.5, 0.3]), torch.tensor([0.0, 2.0, 1.0])),
]


@pytest.mark.parametrize("name,x,y", BCE_OUT_OF_RANGE, ids=[b[0] for b in BCE_OUT_OF_RANGE])
def test_binary_cross_entropy_out_of_range_raises_eagers_error(name, x, y):
    def fn(x, y):
        return F.binary_cross_entropy(x * 1, y) * 2

    raises_as_eager(RuntimeError, fn, x, y)


def test_binary_cross_entropy_in_range_agrees_forward_and_backward():
    torch.manual_seed(0)
    x = torch.randn(4, 5, requires_grad=True)
    y, w = torch.rand(4, 5), torch.rand(5)

    def fn(x, y, w):
        return F.binary_cross_entropy(x.sigmoid(), y, weight=w) + F.binary_cross_entropy(x.sigmoid(), y, reduction="sum")

    kiln.reset()
    got = kiln.compile(fn)(x, y, w)
    (gx,) = torch.autograd.grad(got, x)
    want = fn(x, y, w)
    (wx,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(gx, wx)
