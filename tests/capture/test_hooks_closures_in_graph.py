"""A pure gradient hook on a tensor the graph computes that closes over tensors or constants of the
frame (`y.register_hook(lambda g: g * s)`, `lambda g: g * scale` with a float made in the frame):
kept in the graph as torch.compile keeps it (one graph), the closed-over tensors handed to the hook
by the graph on each run. Was: any closure made the hook impure, a break and a second graph. A cell
rebound, or a captured tensor written in place, after the registration is seen by eager's hook when
backward runs: the registration then breaks (values as eager). Oracle: eager for outputs and the
gradients of every leaf; torch.compile's graph count (1) for the kept cases."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import kiln


def closes_over_input(x, s):
    y = x * 2
    y.register_hook(lambda g: g * s)
    return (y * y).sum()


def closes_over_intermediate(x, s):
    y = x.sin()
    z = x.detach() + s
    y.register_hook(lambda g: g * z)
    return y.sum()


def closes_over_constant(x, s):
    k = 3
    y = x * s
    scale = k * 0.5
    y.register_hook(lambda g: g * scale + 1.0)
    return y.exp().sum()


def closes_over_tensor_and_constant(x, s):
    y = x.tanh()
    shift = -2.0
    y.register_hook(lambda g: (g + shift) * s.sigmoid())
    return (y * s).sum()


def two_hooks_chained_with_closures(x, s):
    y = x * s
    a, b = s + 1, 0.25
    y.register_hook(lambda g: g * a)
    y.register_hook(lambda g: g - b)
    return y.pow(2).sum()


KEPT = [closes_over_input, closes_over_intermediate, closes_over_constant, closes_over_tensor_and_constant,
        two_hooks_chained_with_closures]


def rebound_after_registration(x, s):
    y = x * 2
    z = s + 1
    y.register_hook(lambda g: g * z)
    z = s * 10  # eager's hook reads the cell when backward runs: this value
    return y.sum() + z.sum()


def written_after_registration(x, s):
    y = x * 2
    z = s.detach() + 1  # (an s that gets no gradient: AOT's zeros for it are another matter)
    y.register_hook(lambda g: g * z)
    z.mul_(3)  # eager's hook sees the written tensor
    return y.sum()


def closes_over_a_list(x, s):
    y = x * 2
    box = [s]
    y.register_hook(lambda g: g * box[0])
    return y.sum()


LATER = [rebound_after_registration, written_after_registration, closes_over_a_list]


def _train(fn: Callable, backend: str | None) -> tuple[Any, ...]:
    torch.manual_seed(0)
    x = torch.randn(4, requires_grad=True)
    s = torch.randn(4, requires_grad=True)
    if backend is not None:
        kiln.reset()
        fn = kiln.compile(fn, backend=backend)
    out = fn(x, s)
    out.backward()
    return out.detach(), x.grad, s.grad


def _same(fn: Callable, backend: str) -> None:
    want = _train(fn, None)
    got = _train(fn, backend)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", KEPT, ids=lambda f: f.__name__)
def test_kept_in_one_graph_with_eagers_gradients(fn: Callable, backend: str) -> None:
    _same(fn, backend)
    assert kiln.stats()["graphs"] == 1
    assert kiln.stats()["graph_breaks"] == 0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", LATER, ids=lambda f: f.__name__)
def test_cells_changed_later_give_eagers_gradients(fn: Callable, backend: str) -> None:
    _same(fn, backend)


def test_called_again_hands_the_hook_the_new_tensors() -> None:
    kiln.reset()
    compiled = kiln.compile(closes_over_input, backend="aot_eager")
    for k in range(3):
        x = torch.randn(4, requires_grad=True)
        s = torch.full((4,), float(k + 1))
        compiled(x, s).backward()
        torch.testing.assert_close(x.grad, 8 * x.detach() * s)
    assert kiln.stats()["graphs"] == 1


def test_fullgraph_accepts_a_closure_over_a_tensor() -> None:
    kiln.reset()
    x = torch.randn(4, requires_grad=True)
    kiln.compile(closes_over_intermediate, backend="aot_eager", fullgraph=True)(x, torch.ones(4)).backward()
    torch.testing.assert_close(x.grad, x.detach().cos() * (x.detach() + 1))
