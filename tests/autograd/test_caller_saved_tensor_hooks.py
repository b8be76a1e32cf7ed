"""The caller's `torch.autograd.graph.saved_tensors_hooks` around a compiled call: they run on the
real tensors the compiled graph's autograd node saves, never on the trace's fakes. The joint trace
ran them on its fakes, so their pack function (with its side effects) ran at compile time and was
recorded into the graph, and later calls without the hooks still ran it (saving copies where eager
saves the input itself: no version-counter error where eager raises one).
"""
from __future__ import annotations

import pytest
import torch

import kiln


def _tanh_of_matmul(x, w):
    return torch.tanh(x @ w)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_pack_hook_sees_only_real_tensors(backend) -> None:
    kiln.reset()
    compiled = kiln.compile(_tanh_of_matmul, backend=backend)
    packed: list[type] = []

    def pack(t):
        packed.append(type(t))
        return t.detach().clone()

    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 3, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = compiled(x, w)
    assert packed and all(kind is torch.Tensor for kind in packed), packed
    out.sum().backward()
    xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    _tanh_of_matmul(xe, we).sum().backward()
    torch.testing.assert_close((x.grad, w.grad), (xe.grad, we.grad))


def test_graph_compiled_under_hooks_keeps_eagers_version_check_without_them() -> None:
    kiln.reset()
    compiled = kiln.compile(_tanh_of_matmul, backend="aot_eager")
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t * 1, lambda t: t):
        compiled(torch.randn(4, 8, requires_grad=True), torch.randn(8, 3, requires_grad=True))
    for run in (_tanh_of_matmul, compiled):
        x = torch.randn(4, 8, requires_grad=True) * 1
        out = run(x, torch.randn(8, 3, requires_grad=True))
        x.add_(1)  # matmul's backward reads x: eager refuses
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()

