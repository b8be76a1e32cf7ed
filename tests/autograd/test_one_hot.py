"""F.one_hot with a class count compiles into the graph (as torch.compile's) and keeps eager's errors.

ATen's one_hot checks its values' range with `.item()`, which a traced tensor cannot answer: the whole
frame used to run eagerly (0 graphs where torch.compile makes 1). The AOT tracer now writes it as
eager's CPU kernel computes it, zeros and a scatter, whose index check raises on the same inputs.
torch.compile itself returns a row of zeros for an out-of-range value; Kiln raises, as eager.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln

BACKENDS = ["inductor", "aot_eager", "eager"]


def _labels(x, y):
    return F.one_hot(y, 5).float() * x.sum(-1, keepdim=True)


def _loss(x, y):
    return F.cross_entropy(x, y, label_smoothing=0.1) + F.one_hot(y, 5).float().sum(0).max()


def _view_with_offset(x, y):
    return F.one_hot(y[1:4], 5) + F.one_hot(y.view(2, 3).t(), 5).sum(1)


def _scalar_index(x, y):
    return F.one_hot(y[2], 5) * 2


CASES = [_labels, _loss, _view_with_offset, _scalar_index]


def _args():
    torch.manual_seed(0)
    return torch.randn(6, 5), torch.tensor([0, 1, 4, 3, 4, 2])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_one_graph_eager_values(fn, backend):
    kiln.reset()
    x, y = _args()
    got = kiln.compile(fn, backend=backend, fullgraph=True)(x, y)
    torch.testing.assert_close(got, fn(x, y))
    assert kiln.stats()["graphs"] == 1 and kiln.stats()["fallbacks"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_through_one_hot_labels(backend):
    kiln.reset()
    torch.manual_seed(0)
    w = torch.randn(5, 5, requires_grad=True)
    w2 = w.detach().clone().requires_grad_()

    def step(w, x, y):
        target = F.one_hot(y, 5).float() * 0.9 + 0.02
        return -(target * (x @ w).log_softmax(-1)).sum()

    x, y = _args()
    compiled = kiln.compile(step, backend=backend, fullgraph=True)
    compiled(w, x, y).backward()
    step(w2, x, y).backward()
    torch.testing.assert_close(w.grad, w2.grad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [[0, 5, 1], [0, -1, 2], [7, 0, 0]])
def test_out_of_range_raises_as_eager(backend, bad):
    kiln.reset()

    def f(y):
        return F.one_hot(y, 5) + 1

    y = torch.tensor(bad)
    with pytest.raises(RuntimeError):
        f(y)
    compiled = kiln.compile(f, backend=backend)
    compiled(torch.tensor([0, 1, 2]))  # compiled first with good values, then called with bad ones
    with pytest.raises(RuntimeError):
        compiled(y)


def test_dynamic_lengths_one_graph():
    kiln.reset()

    def f(y):
        return F.one_hot(y, 7).sum(0)

    compiled = kiln.compile(f, dynamic=True, fullgraph=True)
    for n in (3, 5, 9):
        y = torch.arange(n) % 7
        torch.testing.assert_close(compiled(y), f(y))
    assert kiln.stats()["graphs"] == 1


@pytest.mark.parametrize("make", [
    lambda: (torch.tensor([0, 2, 1]), -1),               # class count from the data: eager still right
    lambda: (torch.zeros(0, dtype=torch.long), 4),      # empty: a (0, 4) result
    lambda: (torch.tensor([0, 1], dtype=torch.int32), 3),  # eager's dtype error
    lambda: (torch.tensor([0, 1]), 0),                   # eager's range error with no classes
])
def test_other_inputs_as_eager(make):
    kiln.reset()
    y, n = make()

    def f(y):
        return F.one_hot(y, n) * 3

    try:
        expected = f(y)
    except RuntimeError as e:
        with pytest.raises(RuntimeError, match=str(e)[:30].replace(".", r"\.")):
            kiln.compile(f)(y)
        return
    torch.testing.assert_close(kiln.compile(f)(y), expected)
