"""`if fn:`, `fn or default`, `cb and cb(x)` on callables: always true, known at trace time.

A function made in the frame (a lambda, the wrapper torch.func.grad returns), a function or bound
method from outside, a functools.partial, a builtin and a torch function were not constants to the
tracer, so a jump on one broke the graph (an error under fullgraph=True).
"""
from __future__ import annotations

import functools

import pytest
import torch

import kiln


def _outside(y):
    return y + 1


class _Holder:
    def method(self, y):
        return y * 3


_HOLDER = _Holder()


def _program(x, cb=None):
    made = lambda y: y * 2  # noqa: E731
    chosen = made or (lambda y: y)
    if cb:
        x = cb(x)
    part = functools.partial(torch.add, other=1)
    x = part(x) if part else x
    x = _HOLDER.method(x) if _HOLDER.method else x
    x = _outside(x) if _outside and not (not made) else x
    x = x if not len else x + 1
    return chosen(x) if made else x


@pytest.mark.parametrize("cb", [None, torch.sin, _outside, _HOLDER.method, abs, functools.partial(torch.mul, other=2)],
                         ids=["none", "torch_fn", "function", "method", "builtin", "partial"])
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_truth_of_callables_in_one_graph(cb, backend):
    kiln.reset()
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(_program, backend=backend, fullgraph=True)(x, cb), _program(x, cb))
    assert kiln.stats()["graphs"] == 1


def test_grad_transform_chosen_by_truth():
    kiln.reset()

    def f(x):
        g = torch.func.grad(lambda a: (a ** 3).sum())
        return g(x) if g else x

    x = torch.randn(4)
    torch.testing.assert_close(kiln.compile(f, fullgraph=True)(x), f(x))
