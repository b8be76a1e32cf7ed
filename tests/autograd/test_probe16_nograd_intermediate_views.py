"""A view of an intermediate made under no_grad, returned alone, is a leaf without history, as eager's.

`y = a * 2; with torch.no_grad(): v = y.t(); return v`: eager's v requires grad (as its base y) but
has no grad_fn, so a backward through it stops at v. When the view's layout is one a new buffer can
have (a transpose, a reshape) and no other output shares y's storage, the graph returned v as a
plain output that requires grad, and tracing the backward raised "element 0 of tensors does not
require grad" (an internal error: the function ran eagerly). Such a view is now made at run time on
the returned base with grad off. Each case compares requires_grad, is_leaf, the gradients of the
input and of the output after a backward, and whether a later in-place op raises, with eager's.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.log import KilnWarning


def _transpose(a):
    y = a * 2
    with torch.no_grad():
        v = y.t()
    return v


def _flat_view(a):
    y = a.sin()
    with torch.no_grad():
        v = y.view(-1)
    return v


def _permute_under_set_grad_enabled(a):
    y = a + 1
    torch.set_grad_enabled(False)
    v = y.unsqueeze(0).permute(2, 0, 1)
    torch.set_grad_enabled(True)
    return v


def _beside_a_grad_output(a):
    y = a * 3
    with torch.no_grad():
        v = y.reshape(4, 3)
    return v, a.cos()


CASES = [_transpose, _flat_view, _permute_under_set_grad_enabled, _beside_a_grad_output]


def _observe(fn, a):
    outs = fn(a)
    outs = outs if isinstance(outs, tuple) else (outs,)
    seen = [(o.requires_grad, o.is_leaf, o.grad_fn is None, tuple(o.shape), o.stride()) for o in outs]
    loss = sum((o * torch.arange(o.numel(), dtype=o.dtype).view(o.shape)).sum() for o in outs if o.requires_grad)
    loss.backward()
    grads = [None if a.grad is None else a.grad.clone()]
    out_grads = [None if not o.is_leaf or o.grad is None else o.grad.clone() for o in outs]
    raised = []
    for o in outs:
        try:
            o.mul_(2)
            raised.append(False)
        except RuntimeError:
            raised.append(True)
    return seen, [o.detach().clone() for o in outs], grads, out_grads, raised


def _same(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.allclose(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_no_grad_view_of_an_intermediate_is_a_leaf(fn, backend):
    torch.manual_seed(0)
    expected = _observe(fn, torch.randn(3, 4, requires_grad=True))
    kiln.reset()
    torch.manual_seed(0)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # an internal error's eager fallback warns
        got = _observe(kiln.compile(fn, backend=backend), torch.randn(3, 4, requires_grad=True))
    assert _same(got, expected), f"{got}\n!=\n{expected}"
