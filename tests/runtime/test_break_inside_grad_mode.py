"""A graph break inside a grad-mode context: the graph before it is compiled for the mode on entry.

The trace stops inside `with torch.no_grad()` (or enable_grad, inference_mode) with the process in
that mode; the backend must still see the mode the graph is entered with, which its guard holds.
Compiled under the break's mode, AOT autograd made an inference graph that ran with the caller's
grad on, and an extern's out= overload refused parameters requiring grad ("functions with out=...
arguments don't support automatic differentiation"), or a graph needing a backward made none.
The frame also leaves grad mode as eager does: each glue re-enters the open blocks from their own
outer mode, not the break's.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn as nn

import kiln

pytestmark = pytest.mark.cpp


class _Layers(nn.Module):
    """One extern of each kind before the break."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.linear = nn.Linear(6, 6)
        self.conv = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.w = nn.Parameter(torch.randn(6, 6))

    def apply(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self.kind == "linear":
            return self.linear(x)
        if self.kind == "mm":
            return x @ self.w
        if self.kind == "bmm":
            return torch.bmm(x.unsqueeze(0), self.w.unsqueeze(0))[0]
        if self.kind == "addmm":
            return torch.addmm(self.linear.bias, x, self.w)
        return self.conv(x.reshape(2, 3, 2, 3)).flatten(1)[:, :6]


def _broken(layers: _Layers, context: Callable[[], Any], x: torch.Tensor, outer: Callable[[], Any]) -> Any:
    with outer():
        with context():
            y = layers.apply(x)
            s = float(y.sum())  # graph break inside the context
            return y * 2 + s, layers.apply(x).relu()


CONTEXTS = {"no_grad": torch.no_grad, "enable_grad": torch.enable_grad, "inference_mode": torch.inference_mode}
OUTER = {"grad": torch.enable_grad, "no_grad": torch.no_grad}
KINDS = ["linear", "mm", "bmm", "addmm", "conv"]


# an internal failure falls back to eager with a KilnWarning: here it fails the case
@pytest.mark.filterwarnings("error::kiln.log.KilnWarning")
# CI: every context inside every outer mode on a linear, and each kind in no_grad under grad (the rest -m slow)
@pytest.mark.ci_slice({"kind": "linear", "context,outer": ("no_grad", "grad")})
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("context", list(CONTEXTS))
@pytest.mark.parametrize("outer", list(OUTER))
def test_break_inside_a_grad_mode_context(kind: str, context: str, outer: str) -> None:
    kiln.reset()  # one function for every case: each gets its own compiled versions
    torch.manual_seed(0)
    eager_layers = _Layers(kind)
    kiln_layers = _Layers(kind)
    kiln_layers.load_state_dict(eager_layers.state_dict())
    compiled = kiln.compile(_broken)
    for step in range(2):
        x = torch.randn(4, 6) if kind != "conv" else torch.randn(2, 18)
        want = _broken(eager_layers, CONTEXTS[context], x, OUTER[outer])
        modes_after_eager = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
        got = compiled(kiln_layers, CONTEXTS[context], x, OUTER[outer])
        # the modes the frame leaves behind are eager's (a resumed outer no_grad restored the
        # mode of the break, grad off, after an inner block broke)
        assert (torch.is_grad_enabled(), torch.is_inference_mode_enabled()) == modes_after_eager, step
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
            assert g.requires_grad == w.requires_grad, (step, g.requires_grad, w.requires_grad)
        if want[0].requires_grad:  # enable_grad inside: gradients flow through the compiled graph
            sum(w.sum() for w in want).backward()
            sum(g.sum() for g in got).backward()
            for (name, p), q in zip(eager_layers.named_parameters(), kiln_layers.parameters()):
                if p.grad is None:
                    assert q.grad is None, name
                else:
                    torch.testing.assert_close(q.grad, p.grad, msg=name)
