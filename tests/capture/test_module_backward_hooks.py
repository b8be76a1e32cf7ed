"""Module full backward hooks (register_full_backward_hook, register_full_backward_pre_hook) on the
submodules of a compiled model: the hooks are called as in eager (order, gradients given, gradients
they return replacing eager's), and the graphs are no more than torch.compile(backend="eager") makes.

Why a hooked module is a graph break, in Kiln as in torch.compile (without compiled autograd): eager
calls the module's hooks in the middle of the backward pass, when autograd reaches the identity
nodes Module.__call__ puts around the module's inputs and outputs, and a hook's returned gradients
are what the rest of the backward consumes. One compiled graph has one backward node for all of it
(AOT autograd's CompiledFunctionBackward): there is no point inside it where autograd could call a
hook, nor a way for the hook's result to feed the fused backward after it, unless the backward
graph itself calls the hook (torch's compiled autograd). So the hooked call runs natively between
two graphs, its hooks set up by Module.__call__ as in eager. A hooked built-in layer with no
children (Linear, Conv, LayerNorm) runs as it is there, as torch.compile runs it (torch.nn's frames
are not compiled): its forward compiled alone would be a graph of one op.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn as nn

import kiln


def _grads(gs: Any) -> list[Any]:
    return [None if g is None else (tuple(g.shape), round(float(g.double().sum()), 4)) for g in gs]


class _Log:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def full(self, name: str, scale: float | None = None) -> Callable:
        def hook(module, grad_input, grad_output):
            self.calls.append((name, type(module).__name__, _grads(grad_input), _grads(grad_output)))
            if scale is None:
                return None
            return tuple(None if g is None else g * scale for g in grad_input)
        return hook

    def pre(self, name: str, scale: float | None = None) -> Callable:
        def hook(module, grad_output):
            self.calls.append((name, "pre", _grads(grad_output)))
            if scale is None:
                return None
            return tuple(None if g is None else g * scale for g in grad_output)
        return hook


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        return self.norm(torch.relu(self.fc(x)))


class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y.sin(), y.cos()


class WithCount(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * 2, 3  # a non-tensor output beside the tensor


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.block = Block()
        self.pair = TwoOutputs()
        self.counted = WithCount()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        h = torch.tanh(self.first(x))
        h = self.block(h) + h
        a, b = self.pair(h)
        c, n = self.counted(a * b)
        return self.head(c * n).sum(-1)


def _first_full(m: Model, log: _Log) -> None:
    m.first.register_full_backward_hook(log.full("first"))


def _first_replaces(m: Model, log: _Log) -> None:
    m.first.register_full_backward_hook(log.full("first", 3.0))


def _head_pre_replaces(m: Model, log: _Log) -> None:
    m.head.register_full_backward_pre_hook(log.pre("head", 0.5))


def _nested_leaf(m: Model, log: _Log) -> None:
    m.block.fc.register_full_backward_hook(log.full("block.fc"))
    m.block.norm.register_full_backward_pre_hook(log.pre("block.norm", 2.0))


def _user_module(m: Model, log: _Log) -> None:
    m.block.register_full_backward_hook(log.full("block", 0.25))
    m.block.register_full_backward_pre_hook(log.pre("block"))


def _two_outputs(m: Model, log: _Log) -> None:
    m.pair.register_full_backward_pre_hook(log.pre("pair"))
    m.pair.register_full_backward_hook(log.full("pair", -1.0))


def _non_tensor_output(m: Model, log: _Log) -> None:
    m.counted.register_full_backward_hook(log.full("counted"))


def _everywhere(m: Model, log: _Log) -> None:
    for name, sub in m.named_modules():
        if name:
            sub.register_full_backward_pre_hook(log.pre(name))
            sub.register_full_backward_hook(log.full(name))


def _several_on_one(m: Model, log: _Log) -> None:
    m.head.register_full_backward_hook(log.full("head.1", 2.0))
    m.head.register_full_backward_hook(log.full("head.2"))
    m.head.register_full_backward_pre_hook(log.pre("head.1"))
    m.head.register_full_backward_pre_hook(log.pre("head.2", 3.0))


SETUPS = [_first_full, _first_replaces, _head_pre_replaces, _nested_leaf, _user_module, _two_outputs,
          _non_tensor_output, _everywhere, _several_on_one]


def _run(setup: Callable, wrap: Callable[[nn.Module], Callable], x_grad: bool = True,
         no_grad: bool = False) -> tuple[list[Any], torch.Tensor, dict[str, Any], Any]:
    torch.manual_seed(0)
    model = Model()
    log = _Log()
    setup(model, log)
    fn = wrap(model)
    results = []
    for step in range(2):  # the second call runs the cached graphs
        torch.manual_seed(step)
        x = torch.randn(3, 4, requires_grad=x_grad)
        if no_grad:
            with torch.no_grad():
                out = fn(x)
        else:
            out = fn(x)
            out.sum().backward()
        results.append((out.detach(), None if x.grad is None else x.grad.clone()))
    grads = {k: None if p.grad is None else p.grad.clone() for k, p in model.named_parameters()}
    return log.calls, results, grads, model


def _compare(setup: Callable, backend: str, **kw: Any) -> int:
    expected_calls, expected, expected_grads, _ = _run(setup, lambda m: m, **kw)
    kiln.reset()
    graphs: list[Any] = []

    def count(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        graphs.append(gm)
        return kiln.backends.lookup(backend)(gm, example_inputs) if backend != "eager" else gm

    calls, results, grads, _ = _run(setup, lambda m: kiln.compile(m, backend=count), **kw)
    assert calls == expected_calls
    for (out, g), (want, want_g) in zip(results, expected):
        torch.testing.assert_close(out, want)
        if want_g is None:
            assert g is None
        else:
            torch.testing.assert_close(g, want_g)
    assert grads.keys() == expected_grads.keys()
    for k in grads:
        if expected_grads[k] is None:
            assert grads[k] is None, k
        else:
            torch.testing.assert_close(grads[k], expected_grads[k], msg=k)
    assert kiln.stats()["fallbacks"] == 0
    return len(graphs)


def _torch_graphs(setup: Callable) -> int:
    import torch._dynamo

    torch._dynamo.reset()
    count = 0

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        nonlocal count
        count += 1
        return gm.forward

    _run(setup, lambda m: torch.compile(m, backend=backend))
    return count


@pytest.mark.parametrize("setup", SETUPS, ids=[s.__name__.strip("_") for s in SETUPS])
def test_hooks_as_in_eager_and_graphs_as_torch_compile(setup: Callable) -> None:
    ours = _compare(setup, "eager")
    theirs = _torch_graphs(setup)
    assert ours <= theirs, f"Kiln made {ours} graphs, torch.compile {theirs}"


@pytest.mark.parametrize("setup", [_first_replaces, _user_module, _two_outputs, _several_on_one],
                         ids=["first_replaces", "user_module", "two_outputs", "several_on_one"])
def test_hooks_with_aot_graphs(setup: Callable) -> None:
    _compare(setup, "aot_eager")


@pytest.mark.parametrize("setup", [_first_replaces, _everywhere], ids=["first_replaces", "everywhere"])
def test_hooks_under_no_grad_are_not_called(setup: Callable) -> None:
    _compare(setup, "aot_eager", no_grad=True)


@pytest.mark.parametrize("setup", [_first_full, _nested_leaf, _several_on_one],
                         ids=["first_full", "nested_leaf", "several_on_one"])
def test_input_without_grad(setup: Callable) -> None:
    """The model's input needs no gradient: the first layer's hook gets None for grad_input."""
    _compare(setup, "aot_eager", x_grad=False)


def test_a_hook_added_after_compiling_is_called() -> None:
    """A hook registered on a layer after the model ran compiled recompiles (the hook tables are
    guarded): the new hook is called, as in eager."""
    torch.manual_seed(0)
    model = Model()
    compiled = kiln.compile(model, backend="aot_eager")
    compiled(torch.randn(3, 4)).sum().backward()
    log = _Log()
    model.head.register_full_backward_hook(log.full("head", 2.0))
    x = torch.randn(3, 4, requires_grad=True)
    compiled(x).sum().backward()
    got = x.grad.clone()
    assert [c[0] for c in log.calls] == ["head"]
    x.grad = None
    model(x).sum().backward()
    torch.testing.assert_close(got, x.grad)
