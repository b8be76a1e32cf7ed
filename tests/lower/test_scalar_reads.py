"""Graphs that read a tensor's value as a number (`.item()` under capture_scalar_outputs) run as
ATen calls under the default backend, with a perf hint, instead of failing to lower.

The number is an unbacked symbol: no input gives it, and the wrappers bind only the sizes an extern
returns (nonzero's count), so a kernel scaled by it (`x * s.item()`), a buffer sized by it
(`torch.arange(n.item())`) or an output that is the number itself named a symbol nothing defines:
an internal error (the frame ran eagerly, with a warning) or a crash in the glue.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln.log import KilnWarning


def scaled_by_item(x, s):
    return x * s.item() + 1


def arange_of_item(x, n):
    k = n.item()
    torch._check(k >= 0)
    return torch.arange(k) * 2 + x.sum()


def returns_item(x):
    return x.sum().item(), x * 2


CASES = [
    (scaled_by_item, [(torch.randn(3), torch.tensor(0.5)), (torch.randn(4), torch.tensor(1.5)),
                      (torch.randn(5), torch.tensor(-2.0))]),
    (arange_of_item, [(torch.randn(3), torch.tensor(3)), (torch.randn(3), torch.tensor(5))]),
    (returns_item, [(torch.randn(3),), (torch.randn(5),)]),
]


@pytest.mark.cpp
@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("fn,calls", CASES, ids=[c[0].__name__ for c in CASES])
def test_item_graphs_run_under_the_default_backend(fn, calls, dynamic):
    graphs = {}
    for backend in ("eager", "inductor"):
        kiln.reset()
        with kiln.config.patch(capture_scalar_outputs=True), warnings.catch_warnings():
            warnings.simplefilter("error", KilnWarning)  # an internal error falls back with a warning
            compiled = kiln.compile(fn, dynamic=dynamic, backend=backend)
            for args in calls:
                torch.testing.assert_close(compiled(*args), fn(*args))
        assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["graph_breaks"] == 0
        graphs[backend] = kiln.stats()["graphs"]
    assert graphs["inductor"] == graphs["eager"]
