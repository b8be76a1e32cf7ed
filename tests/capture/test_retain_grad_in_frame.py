"""`t.retain_grad()` inside the compiled frame (kiln/capture/variables/tensor_hooks.py): a no-op on a
leaf input (whole graph under fullgraph), replayed after the graph on a non-leaf input (its .grad is
eager's, the graph's part included), eager's RuntimeError without requires_grad, and a clean break
naming the reason on a tensor the graph computes (it broke as "reads the tensor's data" before).
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.errors import GraphBreakError


def _square_sum(x):
    x.retain_grad()
    return (x * x).sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_leaf_input_is_a_noop_in_one_graph(backend) -> None:
    kiln.reset()
    compiled = kiln.compile(_square_sum, backend=backend, fullgraph=True)
    x = torch.randn(3, requires_grad=True)
    compiled(x).backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())
    assert not x.retains_grad


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_non_leaf_input_keeps_its_grad(backend) -> None:
    kiln.reset()
    compiled = kiln.compile(_square_sum, backend=backend, fullgraph=True)
    for run in (compiled, compiled):  # a leaf first, then a non-leaf: the leafness is guarded
        a = torch.randn(3, requires_grad=True)
        run(a).backward()
        assert not a.retains_grad
        leaf = torch.randn(3, requires_grad=True)
        b = leaf * 2
        run(b).backward()
        assert b.retains_grad
        torch.testing.assert_close(b.grad, 2 * b.detach())
        torch.testing.assert_close(leaf.grad, 4 * b.detach())


def test_without_grad_raises_as_eager() -> None:
    kiln.reset()
    compiled = kiln.compile(_square_sum, backend="eager")
    with pytest.raises(RuntimeError, match="can't retain_grad on Tensor that has requires_grad=False"):
        compiled(torch.randn(3))


def test_intermediate_breaks_with_its_reason_and_matches_eager() -> None:
    box = {}

    def f(x):
        y = x * 3
        y.retain_grad()
        box["y"] = y
        return (y * y).sum()

    kiln.reset()
    with pytest.raises(GraphBreakError, match="retain_grad.. on a tensor the graph computes"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(3, requires_grad=True))
    kiln.reset()
    x = torch.randn(3, requires_grad=True)
    kiln.compile(f, backend="aot_eager")(x).backward()
    torch.testing.assert_close(box["y"].grad, 2 * box["y"].detach())
    torch.testing.assert_close(x.grad, 18 * x.detach())
