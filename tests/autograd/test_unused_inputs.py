"""A graph input the graph never reads, that requires grad and carries an autograd history (an
earlier step's activation, a buffer about to be rebound): the compiled Function is not tied to it,
so a backward never walks into that history (freed by an earlier backward: eager never touches it)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import kiln


class _KeepsLast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("last", torch.zeros(1, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.last = y  # a buffer rebound to an activation: read by the trace, unused by the graph
        return y.sum()


def _ignores_second(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    return (x * 2).sum() + h.shape[0]


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_backward_skips_an_unused_input_with_a_freed_history(backend: str) -> None:
    kiln.reset()
    compiled = kiln.compile(_ignores_second, backend=backend)
    w = torch.ones(3, requires_grad=True)
    h = w * 3
    h.sum().backward()  # h's history is freed
    x = torch.ones(3, requires_grad=True)
    compiled(x, h).backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    assert torch.equal(w.grad, torch.full((3,), 3.0))  # untouched by the second backward


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_buffer_rebound_to_an_activation_trains_like_eager(backend: str) -> None:
    kiln.reset()
    torch.manual_seed(0)
    model = _KeepsLast()
    reference = _KeepsLast()
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, backend=backend)
    for _ in range(3):
        compiled(torch.ones(1, 2)).backward()
        reference(torch.ones(1, 2)).backward()
    assert torch.allclose(model.lin.weight.grad, reference.lin.weight.grad)
    assert model.last.requires_grad and torch.allclose(model.last, reference.last)
    assert kiln.stats()["graph_breaks"] == 0


class _TwoNamesForOneWeight(nn.Module):
    """A parameter reached under two names, one read only for its size (as nn.LSTM reads its
    weights as attributes and through its flat weight list): two graph inputs, one tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 3))
        self.flat = [self.weight]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.weight.shape[0]
        return (x[:, :rows] @ self.flat[0]).tanh().sum()


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_a_tensor_passed_under_two_names_keeps_its_gradient(backend: str, dynamic: bool) -> None:
    kiln.reset()
    torch.manual_seed(0)
    model = _TwoNamesForOneWeight()
    compiled = kiln.compile(model, backend=backend, dynamic=dynamic)
    for batch in (2, 4):
        x = torch.randn(batch, 5)
        model.zero_grad(set_to_none=True)
        model(x).backward()
        expected = model.weight.grad.clone()
        model.zero_grad(set_to_none=True)
        compiled(x).backward()
        assert model.weight.grad is not None
        torch.testing.assert_close(model.weight.grad, expected)
