"""`register_hook` called inside the compiled frame (kiln/capture/variables/tensor_hooks.py): on an
input or a parameter the registration is replayed after the graph (the hook fires in backward as
eager's does, once per call), traced whole as torch.compile traces it; on a tensor the graph
computes, a pure hook is registered by a node of the graph (one graph), any other hook, or the
handle used, breaks cleanly and still matches eager; on a tensor without grad it raises eager's
RuntimeError."""
from __future__ import annotations

import pytest
import torch

import kiln


def _backward_through(fn, make_x):
    x = make_x()
    out = fn(x)
    out.backward()
    return x.grad


def _compare(f, make_x, *, fullgraph: bool, log: list | None = None):
    kiln.reset()
    want = _backward_through(f, make_x)
    want_log = list(log) if log is not None else None
    if log is not None:
        log.clear()
    got = _backward_through(kiln.compile(f, backend="eager", fullgraph=fullgraph), make_x)
    assert torch.equal(got, want)
    if log is not None:
        assert len(log) == len(want_log) and all(torch.equal(a, b) for a, b in zip(log, want_log))


def test_hook_on_an_input_records_its_gradient() -> None:
    grads: list = []

    def f(x):
        x.register_hook(lambda g: grads.append(g.clone()))
        return (x * x).sum()
    _compare(f, lambda: torch.ones(2, requires_grad=True), fullgraph=True, log=grads)


def test_hook_on_an_input_replaces_its_gradient_and_two_hooks_chain() -> None:
    def f(x):
        x.register_hook(lambda g: g * 3)
        x.register_hook(lambda g: g + 1)
        return (x * 2).sum()
    _compare(f, lambda: torch.ones(3, requires_grad=True), fullgraph=True)


def test_hook_on_a_parameter_each_call() -> None:
    lin = torch.nn.Linear(2, 1)
    seen: list = []

    def f(x):
        lin.weight.register_hook(lambda g: seen.append(1))
        return lin(x).sum()
    kiln.reset()
    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    for _ in range(2):
        compiled(torch.ones(1, 2)).backward()
    assert len(seen) == 3  # one hook per call, each firing in every later backward: 1 then 2


def test_hook_on_an_intermediate_reading_python_state_breaks_and_matches_eager() -> None:
    grads: list = []

    def f(x):
        y = x * 2
        y.register_hook(lambda g: grads.append(g.clone()) or g * 3)
        return (y * y).sum()
    _compare(f, lambda: torch.ones(3, requires_grad=True), fullgraph=False, log=grads)
    with pytest.raises(kiln.errors.GraphBreakError, match="not a pure function of the gradient"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.ones(3, requires_grad=True))


def _scaled_then_squared(x):
    y = x.exp()
    y.register_hook(lambda g: g.clamp(-1.0, 1.0) * 3)
    y.register_hook(lambda g: -g)  # hooks chain in registration order
    return (y * y).sum() + y[1:].sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_pure_hook_on_an_intermediate_stays_in_the_graph(backend) -> None:
    """A pure function of the gradient is registered by a node of the graph: one graph (as
    torch.compile makes), and under AOT autograd its ops are in the compiled backward."""
    kiln.reset()
    x = torch.randn(4, requires_grad=True)
    _scaled_then_squared(x).backward()
    want = x.grad.clone()
    explained = kiln.explain(_scaled_then_squared)(torch.randn(4, requires_grad=True))
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    kiln.reset()
    compiled = kiln.compile(_scaled_then_squared, backend=backend, fullgraph=True)
    for _ in range(2):  # registered again on each call's fresh tensor
        x.grad = None
        compiled(x).backward()
        torch.testing.assert_close(x.grad, want)


def test_hook_on_a_tensor_without_grad_raises_as_eager() -> None:
    def f(x):
        x.register_hook(lambda g: g)
        return x + 1
    kiln.reset()
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        kiln.compile(f, backend="eager")(torch.ones(2))
