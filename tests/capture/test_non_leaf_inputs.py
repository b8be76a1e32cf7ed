"""Tensor inputs that are not leaves (an activation passed to a resume function) are faked as
non-leaves, so in-place ops on them trace as they run in eager; and an in-place functional whose
result is unused (`F.relu(h, inplace=True)`) stays in the graph."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln


def inplace_after_break(x, w):
    h = x @ w
    print("break")
    F.relu(h, inplace=True)
    return h * 2


def test_inplace_on_non_leaf_after_break_is_traced(capsys):
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    w = torch.randn(4, 4, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_()
    kiln.reset()
    with kiln.config.patch(suppress_errors=False):
        out = kiln.compile(inplace_after_break, backend="eager")(x, w)
    expected = inplace_after_break(x, w_eager)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(w.grad, w_eager.grad)
    stats = kiln.stats()
    assert stats["graph_breaks"] == 1 and stats["fallbacks"] == 0, stats  # only the print


@pytest.mark.parametrize("call", [lambda h: F.relu(h, inplace=True), lambda h: F.relu(h, True),
                                  lambda h: F.leaky_relu(h, 0.1, inplace=True)])
def test_inplace_functional_with_unused_result_stays_in_graph(call):
    def f(x):
        h = x * 1
        call(h)
        return h + 1

    x = torch.randn(8)
    kiln.reset()
    with kiln.config.patch(suppress_errors=False):
        torch.testing.assert_close(kiln.compile(f, backend="eager")(x), f(x))


def test_graph_for_non_leaf_is_not_reused_for_a_leaf():
    def g(h):
        F.relu(h, inplace=True)
        return h * 2

    kiln.reset()
    compiled = kiln.compile(g, backend="eager")
    w = torch.randn(4, requires_grad=True)
    torch.testing.assert_close(compiled(w * 1), g(w * 1))
    from kiln.capture.entry import frames_of

    guards = frames_of(compiled).entries[0].check.guards
    assert any(gd.source == "L['h'].is_leaf" and gd.expected is False for gd in guards)
    leaf = torch.randn(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        g(leaf)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        compiled(leaf)
