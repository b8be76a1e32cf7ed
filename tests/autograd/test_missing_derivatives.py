"""Ops without a derivative under autograd (floor_divide on floats): eager computes the forward and
raises "derivative for aten::floor_divide is not implemented" only when a backward reaches the op.
AOT autograd traces every backward path at compile time, so those outputs are traced without a
tangent and carry eager's error; other outputs differentiate as usual, and nothing falls back.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln


def program(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    q = torch.floor_divide(x, 2)  # no derivative
    return q, x * w, (x // 3) * w, torch.remainder(x, 2) * w  # remainder has one: it is fine


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_outputs_without_a_derivative_raise_eagers_error_only_when_reached(backend: str) -> None:
    kiln.reset()
    compiled = kiln.compile(program, backend=backend)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, generator=gen, requires_grad=True)
    w = torch.randn(5, 3, generator=gen, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to eager warns
        got, want = compiled(x, w), program(x, w)
    assert kiln.stats()["fallbacks"] == 0
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
        assert g.requires_grad == e.requires_grad
    # outputs 1 and 3 have a gradient: the same as eager's
    for k in (1, 3):
        for g, e in zip(torch.autograd.grad(got[k].sum(), (x, w), retain_graph=True),
                        torch.autograd.grad(want[k].sum(), (x, w), retain_graph=True)):
            torch.testing.assert_close(g, e)
    # outputs 0 and 2 reach floor_divide: eager's error, at backward time
    for k in (0, 2):
        with pytest.raises(RuntimeError, match="derivative for aten::floor_divide is not implemented"):
            want[k].sum().backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="derivative for aten::floor_divide is not implemented"):
            got[k].sum().backward(retain_graph=True)


def test_no_grad_calls_have_no_error_to_carry() -> None:
    kiln.reset()
    compiled = kiln.compile(program, backend="aot_eager")
    x, w = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    compiled(x, w)  # compiles the training graph
    with torch.no_grad():
        got = compiled(x, w)
    assert not any(t.requires_grad for t in got)
    for g, e in zip(got, program(x, w)):
        torch.testing.assert_close(g, e.detach())
