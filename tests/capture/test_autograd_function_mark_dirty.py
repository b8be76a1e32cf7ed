"""A custom Function whose forward writes a tensor in place and says so with `ctx.mark_dirty`.

On a tensor the graph computes, the Function is one node of the graph, as torch.compile makes it
(capture broke on it, and then twice more on the `dirty_tensors` store inside apply: 3 graphs).
Outputs, input gradients (the user's backward, with a formula autograd would not derive) and the
inputs' version counters are eager's, including eager's error when the backward needs a value the
Function overwrote. On a graph input (or a view of one) it still breaks, with that reason: eager
bumps the input's version counter once more for mark_dirty, a compiled graph once per input it
writes.
"""
from __future__ import annotations

import pytest
import torch

import kiln

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]


class DoubleInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2 + 0.25  # not autograd's formula: the user's backward ran


class AddInPlaceSaving(torch.autograd.Function):
    """Marks its first input dirty, saves the second, returns the dirty one and a new tensor."""

    @staticmethod
    def forward(ctx, x, w):
        x.add_(w)
        ctx.mark_dirty(x)
        ctx.save_for_backward(w)
        return x, w * 3

    @staticmethod
    def backward(ctx, g, g_new):
        (w,) = ctx.saved_tensors
        return g, g * w + g_new * 3


def scaled_intermediate(x):
    y = x * 1.5
    z = DoubleInPlace.apply(y)
    return z * 3


def dirty_returned(x):
    return DoubleInPlace.apply(x.sin())


def two_outputs(x, w):
    y = x.sin()
    z, extra = AddInPlaceSaving.apply(y, w)
    return z.cos() + extra, y


def overwrites_what_backward_needs(x):
    y = x.exp()  # exp's backward reads its output, which the Function then doubles
    z = DoubleInPlace.apply(y)
    return z * y


def dirties_graph_input(x, buffer):
    return x * DoubleInPlace.apply(buffer)


CASES = {
    "scaled_intermediate": (scaled_intermediate, [(3,)]),
    "dirty_returned": (dirty_returned, [(4,)]),
    "two_outputs": (two_outputs, [(3,), (3,)]),
    "overwrites_what_backward_needs": (overwrites_what_backward_needs, [(3,)]),
}


def _leaves(shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen).requires_grad_() for s in shapes]


def _run(fn, inputs):
    """Outputs, then gradients and versions of the inputs, or the error the backward raised."""
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    try:
        sum(o.sum() for o in outs).backward()
    except RuntimeError as exc:
        return "raised", str(exc).split(". Hint")[0]
    return [o.detach() for o in outs], [i.grad for i in inputs], [i._version for i in inputs]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CASES)
def test_values_grads_and_versions_as_eager(name, backend) -> None:
    fn, shapes = CASES[name]
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    for seed in range(2):
        expected = _run(fn, _leaves(shapes, seed))
        got = _run(compiled, _leaves(shapes, seed))
        if expected[0] == "raised":
            assert got == expected
        else:
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", CASES)
def test_one_graph_as_torch_compile(name) -> None:
    fn, shapes = CASES[name]
    oracle = torch._dynamo.explain(fn)(*_leaves(shapes))
    ours = kiln.explain(fn)(*_leaves(shapes))
    assert ours.graph_count == oracle.graph_count == 1, [str(b) for b in ours.break_reasons]


def test_dirty_graph_input_breaks_with_its_reason_and_keeps_eagers_versions() -> None:
    report = kiln.explain(dirties_graph_input)(torch.randn(3, requires_grad=True), torch.randn(3))
    reasons = " ".join(str(b) for b in report.break_reasons)
    assert "mark_dirty on a graph input" in reasons
    assert "getset_descriptor" not in reasons
    kiln.reset()
    compiled = kiln.compile(dirties_graph_input, backend="aot_eager")
    results = []
    for fn in (dirties_graph_input, compiled):
        x, buffer = torch.linspace(-1, 1, 3, requires_grad=True), torch.arange(3.0)
        out = fn(x, buffer)
        out.sum().backward()
        results.append((out.detach(), x.grad, buffer.clone(), buffer._version))
    torch.testing.assert_close(results[1], results[0])
