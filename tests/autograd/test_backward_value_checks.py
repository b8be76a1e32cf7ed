"""A custom autograd.Function whose backward computes a value-checked op (an index out of range,
an integer division by zero, a singular inverse) and never reads its result: eager's forward
runs and its backward raises. The joint graph's partitioner kept the check out of the backward (it
read no tangent, so it went to the forward and raised there; or it read one, and was dropped as
dead code, so the backward returned grads). Both backends: aot_eager and the full stack.
"""
from __future__ import annotations

import pytest
import torch

import kiln


class _IndexTangent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, idx):
        ctx.save_for_backward(idx)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        g[idx]  # noqa: B018 - checked, never read
        return g * 2, None


class _IndexSaved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, idx):
        ctx.save_for_backward(x, idx)
        return x * 3

    @staticmethod
    def backward(ctx, g):
        x, idx = ctx.saved_tensors
        x[idx]  # noqa: B018 - reads no tangent
        return g * 3, None


class _DivideSaved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, d):
        ctx.save_for_backward(d)
        return x.exp()

    @staticmethod
    def backward(ctx, g):
        (d,) = ctx.saved_tensors
        torch.ones_like(d) // d
        return g * 3, None


class _ScatterTangent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, idx):
        ctx.save_for_backward(idx)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        torch.zeros(3).scatter_add(0, idx, g[:idx.numel()])
        return g, None


class _InverseSaved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, m, unused):
        ctx.save_for_backward(m)
        return m * 2

    @staticmethod
    def backward(ctx, g):
        (m,) = ctx.saved_tensors
        torch.linalg.inv(m)
        return g * 2, None


CASES = {
    "index_of_tangent": (_IndexTangent, lambda: torch.randn(4), torch.tensor([7]), torch.tensor([1])),
    "index_of_saved": (_IndexSaved, lambda: torch.randn(4), torch.tensor([0, 4]), torch.tensor([0, 3])),
    "int_division_by_zero": (_DivideSaved, lambda: torch.randn(3), torch.tensor([1, 0, 2]), torch.tensor([1, 3, 2])),
    "scatter_of_tangent": (_ScatterTangent, lambda: torch.randn(3), torch.tensor([0, 7]), torch.tensor([0, 2])),
    "singular_inverse": (_InverseSaved, lambda: torch.zeros(3, 3), torch.tensor(0), torch.tensor(0)),
}


def _run(fn, x, extra):
    """('forward', error type) / ('backward', error type, out) / ('ok', out, grad)."""
    x = x.detach().requires_grad_(True)
    try:
        out = fn(x, extra)
    except Exception as error:  # noqa: BLE001 - the phase is what is compared
        return ("forward", type(error))
    try:
        out.sum().backward()
    except Exception as error:  # noqa: BLE001
        return ("backward", type(error), out.detach())
    return ("ok", out.detach(), x.grad)


def _compare(got, expected):
    assert got[0] == expected[0], (got, expected)
    values = 1
    if got[0] != "ok":  # the phase and the error's type, then the forward's output if it ran
        assert got[1] is expected[1], (got, expected)
        values = 2
    for a, b in zip(got[values:], expected[values:], strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", list(CASES))
def test_backward_check_raises_in_backward_as_eager(name) -> None:
    function, make, bad, good = CASES[name]

    def program(x, extra):
        return function.apply(x.sin() if x.dim() == 1 else x, extra) + 1

    x = make()
    kiln.reset()
    compiled = kiln.compile(program, backend="aot_eager", fullgraph=True)
    for extra in (bad, good):
        expected = _run(program, x, extra)
        if extra is bad:
            assert expected[0] == "backward"
        _compare(_run(compiled, x, extra), expected)


@pytest.mark.cpp
@pytest.mark.parametrize("name", ["index_of_tangent", "int_division_by_zero"])
def test_backward_check_survives_lowering(name) -> None:
    function, make, bad, good = CASES[name]

    def program(x, extra):
        return function.apply(x.sin(), extra) * 2

    x = make()
    kiln.reset()
    compiled = kiln.compile(program, fullgraph=True)
    for extra in (bad, good):
        _compare(_run(compiled, x, extra), _run(program, x, extra))
