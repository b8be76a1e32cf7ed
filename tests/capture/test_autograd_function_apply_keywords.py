"""`Function.apply` called with keyword arguments, and a setup_context Function's defaults
(kiln/capture/variables/autograd_function.py). apply hands keywords on to the forward, so the
graph's node does too and the speculative forward sees them; a Function with setup_context has
apply bind its arguments to the forward's signature, defaults filled in, and setup_context's
`inputs` holds them. A break on the forward (a print in it) calls the glue's InferenceApply,
which takes the keywords as apply does."""
from __future__ import annotations

import pytest
import torch

import kiln


class Scaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k=1.0, bias=0.0):
        ctx.k = k
        return x * k + bias

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k * 10, None, None  # not autograd's formula: a matching grad proves it ran


class PrintsInForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k=1.0):
        print("forward")
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k * 10, None


class WithSetupContext(torch.autograd.Function):
    @staticmethod
    def forward(x, k=3.0, shift=0.0):
        return x * k + shift

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.n = len(inputs)  # the defaults are among the inputs
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k + ctx.n, None, None


def _outputs_and_grads(fn, grad=True):
    x = torch.linspace(-1.0, 1.0, 5, requires_grad=True)
    with torch.set_grad_enabled(grad):
        out = fn(x)
    if grad:
        out.sum().backward()
    return out.detach(), x.grad


def _same(fn, *, fullgraph=True, grad=True):
    kiln.reset()
    want = _outputs_and_grads(fn, grad)
    got = _outputs_and_grads(kiln.compile(fn, backend="eager", fullgraph=fullgraph), grad)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    return kiln.stats()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_keywords_reach_the_forward_in_one_graph(backend) -> None:
    def f(x):
        return Scaled.apply(x, k=2.0) + Scaled.apply(x, 3.0, bias=1.0)
    kiln.reset()
    x = torch.linspace(-1.0, 1.0, 5, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    counter = kiln.backends.CountingBackend() if backend == "eager" else backend
    got = kiln.compile(f, backend=counter, fullgraph=True)(x)
    want = f(x2)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x.grad, x2.grad)


@pytest.mark.parametrize("grad", [True, False])
def test_keywords_through_a_break_on_the_forward(grad, capsys) -> None:
    def f(x):
        return PrintsInForward.apply(x, k=2.0) + 1
    stats = _same(f, fullgraph=False, grad=grad)
    assert stats["fallbacks"] == 0, stats


def test_setup_context_inputs_hold_the_defaults() -> None:
    def f(x):
        return WithSetupContext.apply(x)
    _same(f)


def test_setup_context_with_keywords() -> None:
    def f(x):
        return WithSetupContext.apply(x, shift=1.0, k=5.0)
    _same(f)


class TensorByKeyword(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w=None):
        ctx.save_for_backward(w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        w, = ctx.saved_tensors
        return g * w * 10, g * 3


def test_a_tensor_by_keyword_keeps_eagers_apply() -> None:
    w = torch.linspace(1.0, 2.0, 5)

    def f(x):
        return TensorByKeyword.apply(x, w=w) + 1
    stats = _same(f, fullgraph=False)
    assert stats["fallbacks"] == 0, stats
