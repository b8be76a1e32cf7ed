"""A view output made with grad mode off is a leaf without history, as eager's.

`with torch.no_grad(): v = x[1:]; return v` gives in eager a view that requires grad (as its base)
but has no grad_fn: a backward through it stops there (v.grad fills, x.grad stays None) and an
in-place op on it with grad mode on raises. The runtime rebuilt such an output by replaying its view
ops under the caller's grad mode, which recorded a SliceBackward: the gradient reached x and the
in-place op was allowed. Each case compares requires_grad, is_leaf, the gradients of input and
output after a backward, and whether a later in-place op raises, with eager's.
"""
from __future__ import annotations

import pytest
import torch

import kiln


def _slice_of_leaf(a):
    with torch.no_grad():
        v = a[1:]
    return v


def _slice_of_intermediate_with_base(a):
    y = a * 2
    with torch.no_grad():
        v = y[1:]
    return v, y


def _diagonal_under_set_grad_enabled(a):
    torch.set_grad_enabled(False)
    v = a.diagonal()
    torch.set_grad_enabled(True)
    return v


def _no_grad_view_beside_grad_view(a):
    with torch.no_grad():
        v = a.t()
    return a[0], v


def _no_grad_view_after_mutation(a, b):
    b.add_(1)
    with torch.no_grad():
        v = b[:, 1]
    return v * a, v


CASES = [_slice_of_leaf, _slice_of_intermediate_with_base, _diagonal_under_set_grad_enabled,
         _no_grad_view_beside_grad_view, _no_grad_view_after_mutation]


def _inputs(fn):
    torch.manual_seed(0)
    a = torch.randn(3, 3, requires_grad=True)
    if fn is _no_grad_view_after_mutation:
        return [a[:, 0].detach().requires_grad_(), torch.randn(3, 3, requires_grad=True) * 1]
    return [a]


def _observe(fn, inputs):
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    seen = [(o.requires_grad, o.is_leaf) for o in outs]
    loss = sum((o * torch.arange(o.numel(), dtype=o.dtype).view(o.shape)).sum() for o in outs if o.requires_grad)
    loss.backward()
    grads = [None if not x.is_leaf or x.grad is None else x.grad.clone() for x in inputs]
    out_grads = [None if not o.is_leaf or o.grad is None else o.grad.clone() for o in outs]
    raised = []
    for o in outs:
        try:
            o.mul_(2)
            raised.append(False)
        except RuntimeError:
            raised.append(True)
    return seen, grads, out_grads, raised


def _same(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.allclose(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_view_made_under_no_grad_is_a_leaf(fn, backend):
    expected = _observe(fn, _inputs(fn))
    kiln.reset()
    got = _observe(kiln.compile(fn, backend=backend), _inputs(fn))
    assert _same(got, expected), f"{got}\n!=\n{expected}"
