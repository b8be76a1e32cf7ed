"""Sizes and strides asked of a fake through the dispatcher (aten.size/stride/dim) are
answered from its metadata.

C++ asks `aten.size.default` of an unbind output when an in-place op updates it under AOT
autograd with symbolic sizes; run as a kernel under the Python dispatcher, the question came back
to the fake, without end (a RecursionError, the frame failing to compile).
"""
from __future__ import annotations

import pytest
import torch

import kiln
import kiln.symbolic as symbolic
from kiln.fake import FakeTensorMode


def _unbind_update(x):
    a, b = x.unbind(0)
    a.add_(b)
    b.mul_(2)
    return x


def _select_update(x):
    for row in x.unbind(1):
        row.add_(1)
    return x.sum(0)


@pytest.mark.parametrize("fn, shape", [(_unbind_update, (2, 3)), (_select_update, (4, 3))])
def test_inplace_on_unbind_outputs_with_symbolic_sizes(fn, shape) -> None:
    for n in (shape[-1], shape[-1] + 2):
        x = torch.randn(shape[0], n)
        want_x = x.clone()
        want = fn(want_x)
        kiln.reset()
        got_x = x.clone()
        got = kiln.compile(fn, backend="aot_eager", dynamic=True, fullgraph=True)(got_x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_x, want_x)


def test_layout_queries_answer_from_metadata() -> None:
    env = symbolic.ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    fake = mode.from_real(torch.randn(3, 4), source="x", dynamic_dims=[0, 1])
    with mode:
        view = fake.t()
    aten = torch.ops.aten
    assert aten.size.default(view) == list(view.shape)
    assert aten.stride.default(view) == list(view.stride())
    assert aten.dim.default(view) == 2
