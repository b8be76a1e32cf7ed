""".grad of what an in-place op on a leaf input returns: `p -= lr * p.grad` rebinds p to the op's
result, `q = w.mul_(0.5)` names it; either is the input itself in eager, with the input's .grad.
Capture gave the result no source, so reading (`p.grad.zero_()`) or assigning (`p.grad = None`) its
.grad was a graph break ("reading .grad of a tensor inside a compiled region"): a hand-written SGD
step in the compiled function split in two. Now it is the input's .grad (one graph per guarded
case of p.grad, as torch.compile). Oracle: eager for losses, parameters and their .grad."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import nn

import kiln


def _sgd_isub(m: nn.Module) -> Callable:
    def step(x):
        with torch.no_grad():
            for p in m.parameters():
                if p.grad is not None:
                    p -= 0.1 * p.grad
                    p.grad.zero_()
        return m(x).pow(2).mean()
    return step


def _sgd_named_result(m: nn.Module) -> Callable:
    def step(x):
        with torch.no_grad():
            for p in m.parameters():
                if p.grad is not None:
                    q = p.add_(p.grad, alpha=-0.1)
                    q.grad.mul_(0.5)  # momentum-like decay of the stored gradient
        return m(x).tanh().sum()
    return step


def _sgd_grad_set_none(m: nn.Module) -> Callable:
    def step(x):
        with torch.no_grad():
            for p in m.parameters():
                if p.grad is not None:
                    p *= 0.9
                    p -= 0.05 * p.grad
                    p.grad = None
        return (m(x) * 2).sum()
    return step


def _sgd_read_after_write(m: nn.Module) -> Callable:
    def step(x):
        total = 0.0
        with torch.no_grad():
            for p in m.parameters():
                if p.grad is not None:
                    p -= 0.1 * p.grad
                    total = total + p.grad.abs().sum()
        return m(x).sum() + total
    return step


STEPS = [_sgd_isub, _sgd_named_result, _sgd_grad_set_none, _sgd_read_after_write]


def _train(make: Callable, backend: str | None) -> list[Any]:
    torch.manual_seed(0)
    m = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    step = make(m)
    if backend is not None:
        kiln.reset()
        step = kiln.compile(step, backend=backend)
    seen: list[Any] = []
    for _ in range(3):
        loss = step(x)
        loss.backward()
        seen += [loss.detach(), m.weight.detach().clone(), m.bias.detach().clone(),
                 None if m.weight.grad is None else m.weight.grad.clone()]
    return seen


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("make", STEPS, ids=lambda f: f.__name__)
def test_manual_update_without_a_break(make: Callable, backend: str) -> None:
    want = _train(make, None)
    got = _train(make, backend)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if w is None:
            assert g is None
        else:
            torch.testing.assert_close(g, w)
    assert kiln.stats()["graph_breaks"] == 0


def test_the_result_of_an_out_variant_on_a_leaf() -> None:
    w = torch.ones(3, requires_grad=True)
    w.grad = torch.full((3,), 2.0)

    def f(x):
        with torch.no_grad():
            r = torch.mul(w, 0.5, out=w)
        return r.grad + x

    kiln.reset()
    got = kiln.compile(f, backend="eager", fullgraph=True)(torch.ones(3))
    torch.testing.assert_close(got, torch.full((3,), 3.0))
    torch.testing.assert_close(w.detach(), torch.full((3,), 0.5))


def test_a_computed_tensor_written_in_place_still_breaks_as_before() -> None:
    def f(x):
        y = x * 2
        return y.add_(1).grad

    kiln.reset()
    with pytest.raises(kiln.errors.GraphBreakError, match="reading .grad"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.ones(3, requires_grad=True))
