"""`Tensor.item()` of a floating tensor under capture_scalar_outputs=True is an unbacked symbolic
float (kiln.symbolic.ShapeEnv.create_unbacked_symfloat), as torch.compile traces it: arithmetic on
it and tensors made from it stay in the graph, its value is never specialized (new values reuse the
graph), and a branch on it breaks cleanly with eager's answer. (backend="eager": kiln.lower does not
yet bind unbacked scalars, int or float, inside kernels; that path falls back with a warning.)"""
from __future__ import annotations

import torch

import kiln
from semantics_oracle import check_calls
from trace_oracle import check_traced, configured, fresh


def test_float_item_in_arithmetic_and_factories() -> None:
    def f(x):
        s = x.sum().item()
        m = x.max().item()
        return x * s + m, s + 1, s * m, torch.full((2,), s)
    check_traced(f, fresh(torch.arange(3.0)), settings={"capture_scalar_outputs": True})


def test_new_values_reuse_the_graph() -> None:
    def f(x):
        return x * x.mean().item()
    with configured({"capture_scalar_outputs": True}):
        calls = [(torch.arange(3.0),), (torch.arange(3.0) * 2,), (torch.ones(3) * 7,)]
        check_calls(f, calls, fullgraph=True)
        assert kiln.stats()["graphs"] == 1


def test_branch_on_a_float_item_breaks_and_matches_eager() -> None:
    def f(x):
        if x.mean().item() > 1:
            return x * 2
        return x - 1
    with configured({"capture_scalar_outputs": True}):
        check_calls(f, [(torch.arange(3.0),), (torch.zeros(3),)])
