"""A custom Function whose backward is `@once_differentiable`, differentiated with create_graph=True.

Eager runs that backward under no_grad, so a gradient only it computes has no history: its
requires_grad is False, and a gradient penalty built from it adds nothing to a later backward.
The compiled backward gave every gradient the history that refuses a second backward, so such a
penalty raised where eager trains. Gradients that eager does differentiate keep that history.
"""
from __future__ import annotations

import pytest
import torch
from torch.autograd.function import once_differentiable

import kiln

BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]


class _SquareOnce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 2

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * x


class _ExpOnce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.exp()

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.exp()


def only_the_function(x):
    return _ExpOnce.apply(x)


def function_between_kernels(x):
    return (_SquareOnce.apply(x * 3) + 1).sum() * 2


def one_input_through_the_function(x, w):
    return _SquareOnce.apply(x) + w.sin()  # w's gradient (cos w) is differentiable in eager


def _grads(fn, inputs, create_graph=True):
    return torch.autograd.grad(fn(*inputs).sum(), inputs, create_graph=create_graph)


def _leaves(*shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen).requires_grad_() for s in shapes]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [only_the_function, function_between_kernels])
def test_gradient_without_history_as_eager(backend, fn) -> None:
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    for seed in range(2):  # the first call compiles, the second runs the cached graph
        expected = _grads(fn, _leaves((4,), seed=seed))
        got = _grads(compiled, _leaves((4,), seed=seed))
        torch.testing.assert_close(got, expected)
        assert [g.requires_grad for g in got] == [g.requires_grad for g in expected] == [False]
        assert got[0].grad_fn is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_penalty_from_it_trains_as_eager(backend) -> None:
    kiln.reset()
    compiled = kiln.compile(function_between_kernels, backend=backend)
    results = []
    for fn in (function_between_kernels, compiled):
        (x,) = _leaves((5,), seed=3)
        out = fn(x)
        (g,) = torch.autograd.grad(out, x, create_graph=True)
        (out + g.pow(2).sum()).backward()  # the penalty has no history in eager: only `out` counts
        results.append((out.detach(), g, x.grad))
    torch.testing.assert_close(results[1], results[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_the_gradients_eager_differentiates_keep_a_history(backend) -> None:
    kiln.reset()
    compiled = kiln.compile(one_input_through_the_function, backend=backend)
    expected = _grads(one_input_through_the_function, _leaves((3,), (3,)))
    got = _grads(compiled, _leaves((3,), (3,)))
    torch.testing.assert_close(got, expected)
    assert [g.requires_grad for g in got] == [g.requires_grad for g in expected] == [False, True]


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_create_graph_unchanged(backend) -> None:
    kiln.reset()
    compiled = kiln.compile(function_between_kernels, backend=backend)
    expected = _grads(function_between_kernels, _leaves((4,)), create_graph=False)
    got = _grads(compiled, _leaves((4,)), create_graph=False)
    torch.testing.assert_close(got, expected)
    assert not got[0].requires_grad


def test_tangent_requiring_grad_keeps_the_refusing_history() -> None:
    """A grad_output that requires grad: eager's once_differentiable gradient gets a node whose
    backward raises; the compiled one keeps its own refusing node (no silent zero)."""
    kiln.reset()
    compiled = kiln.compile(only_the_function, backend="aot_eager")
    for fn in (only_the_function, compiled):
        (x,) = _leaves((3,))
        v = torch.ones(3, requires_grad=True)
        (g,) = torch.autograd.grad(fn(x), x, v, create_graph=True)
        assert g.requires_grad
        with pytest.raises(RuntimeError):
            g.sum().backward()
