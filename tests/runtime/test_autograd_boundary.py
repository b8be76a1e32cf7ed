"""The autograd boundary of a compiled training graph (kiln.runtime.aot.make_autograd_function).

The shortcuts pinned here: a forward made of Kiln's kernels and ATen externs that read neither grad
mode nor requires_grad (mm, addmm, bmm, convolution, embedding, ...) runs on the caller's tensors with
grad mode off (`forward_grad_free`: no detached copies, no grad-mode switch); one whose externs may
(the RNNs) runs on detached inputs with grad mode on (`forward_on_node`). Either records its backward
as one C++ node of the boundary extension (`apply_node`, "node" below) once the extension is
loaded, else applies the Python autograd.Function ("function"), whose node calls the compiled
backward straight from `apply` (not through torch's BackwardCFunction.apply). Each behaviour autograd gives a custom Function's node
(retain_graph, create_graph, saved-tensor hooks, version counters, gradients of unused outputs and
of inputs that need none, size symbols saved for the backward, hooks on outputs) is compared with
eager's on both paths. The grad-mode matrix over the tiers is tests/runtime/test_grad_modes_x_externs.py
(its EXTERN_FREE models).
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Callable

import pytest
import torch
from torch.autograd.function import BackwardCFunction

import kiln
from kiln.capture.entry import frames_of
from kiln.runtime import aot, boundary
from kiln.runtime.aot import DOUBLE_BACKWARD_ERROR, AotRuntime

pytestmark = pytest.mark.cpp


@pytest.fixture(params=["node", "function"])
def path(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The C++ node of the boundary extension, or the Python autograd.Function."""
    if request.param == "node":
        boundary.load()  # built once per torch and Python (make venv builds it), then cached
        assert aot.node_module
    else:
        monkeypatch.setattr(aot, "node_module", [])
    return request.param


def _runtimes(compiled: Callable[..., Any]) -> list[AotRuntime]:
    return [v for entry in frames_of(compiled).entries for k, v in entry.glue.__globals__.items()  # type: ignore[attr-defined]
            if k.startswith("__graph") and isinstance(v, AotRuntime)]


def _training_function(compiled: Callable[..., Any]) -> Any:
    (function,) = [rt.function for rt in _runtimes(compiled) if rt.function is not None]
    return function


def _leaves(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def _copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


def softmax_scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * w, -1)


def linear_tanh(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w)


LSTM = torch.nn.LSTM(4, 6, batch_first=True)  # oneDNN's RNN layer, an extern that reads grad mode


def lstm_out(x: torch.Tensor) -> torch.Tensor:
    return LSTM(x)[0]


def test_forward_modes_by_extern() -> None:
    """Kernels only and grad-mode-blind externs: grad free; an LSTM (its workspace needs grad mode
    on): detached inputs on the node; both on the node path."""
    kiln.reset()
    cases = {"softmax": (softmax_scaled, _leaves((4, 8), (8,)), True),
             "mm": (linear_tanh, _leaves((4, 8), (8, 3)), True),
             "lstm": (lstm_out, [torch.randn(2, 5, 4, requires_grad=True)], False)}
    for name, (fn, inputs, grad_free) in cases.items():
        compiled = kiln.compile(fn)
        compiled(*inputs).sum().backward()
        recipe = _training_function(compiled).recipe
        assert recipe["forward_grad_free"] is grad_free, name
        assert recipe["forward_on_node"] is True, name


def test_backward_node_calls_the_compiled_backward_directly(path: str) -> None:
    kiln.reset()
    compiled = kiln.compile(softmax_scaled)
    out = compiled(*_leaves((4, 8), (8,)))
    assert out.grad_fn.name() == "CompiledFunctionBackward"
    if path == "node":
        assert not hasattr(out.grad_fn, "_forward_cls")  # no Python Function's context
        return
    node = type(out.grad_fn)
    assert node.apply is not BackwardCFunction.apply
    assert node.apply is _training_function(compiled).backward


def _grads_of(fn: Callable[..., Any], inputs: list[torch.Tensor], run: Callable[[Any, list[torch.Tensor]], Any]) -> Any:
    out = fn(*inputs)
    extra = run(out, inputs)
    return [None if t.grad is None else t.grad.clone() for t in inputs], extra


def _same_as_eager(fn: Callable[..., Any], inputs: list[torch.Tensor],
                   run: Callable[[Any, list[torch.Tensor]], Any], **options: Any) -> Any:
    kiln.reset()
    expected = _grads_of(fn, _copies(inputs), run)
    got = _grads_of(kiln.compile(fn, **options), _copies(inputs), run)
    for e, g in zip(expected[0], got[0]):
        assert (e is None) == (g is None)
        if e is not None:
            torch.testing.assert_close(g, e)
    return expected[1], got[1]


def test_retain_graph_backward_twice_accumulates_as_eager(path: str) -> None:
    def twice(out: torch.Tensor, inputs: list[torch.Tensor]) -> None:
        loss = out.sin().sum()
        loss.backward(retain_graph=True)
        loss.backward()

    _same_as_eager(softmax_scaled, _leaves((4, 8), (8,)), twice)


def test_backward_twice_without_retain_graph_raises_eagers_error(path: str) -> None:
    """The saved tensors are released by the first backward: a second one raises eager's error
    (the node once cleared its list and the compiled backward failed to unpack its arguments)."""
    x, b = _leaves((4, 8), (8,))
    compiled = kiln.compile(softmax_scaled)
    for fn in (softmax_scaled, compiled):
        loss = fn(x, b).sum()
        loss.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()


def test_create_graph_gives_gradients_whose_second_backward_raises(path: str) -> None:
    kiln.reset()
    compiled = kiln.compile(softmax_scaled)
    x, w = _leaves((4, 8), (8,))
    (gx,) = torch.autograd.grad(compiled(x, w).sin().sum(), [x], create_graph=True)
    assert gx.requires_grad and gx.grad_fn is not None
    ex, ew = _copies([x, w])
    (expected,) = torch.autograd.grad(softmax_scaled(ex, ew).sin().sum(), [ex])
    torch.testing.assert_close(gx, expected)
    with pytest.raises(RuntimeError, match="second-order gradients"):
        gx.sum().backward()
    assert "create_graph=True" in DOUBLE_BACKWARD_ERROR


def _cube_then_grad(x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(x.pow(3).sum(), x, create_graph=True)  # a break: the cube is a compiled graph
    return g


def test_a_gradient_of_a_compiled_gradient_with_respect_to_an_input_raises_kilns_error(path: str) -> None:
    """grad(grad(f(x), x, create_graph=True).sum(), x) (a Hessian-vector product): the first gradient's
    history must reach x, so the second meets Kiln's error (torch.compile's default backend refuses
    double backward too), not autograd's "appears to not have been used in the graph"."""
    kiln.reset()
    compiled = kiln.compile(_cube_then_grad)
    x = torch.randn(5, requires_grad=True)
    g = compiled(x)
    torch.testing.assert_close(g, 3 * x.detach() ** 2)
    with pytest.raises(RuntimeError, match="second-order gradients"):
        torch.autograd.grad(g.sum(), x)
    (h,) = torch.autograd.grad(kiln.compile(_cube_then_grad, backend="eager")(x).sum(), x)
    torch.testing.assert_close(h, 6 * x.detach())


def test_saved_tensor_hooks_see_the_saved_tensors(path: str) -> None:
    packed: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append(t)
        return t * 1  # a copy: the unpacked tensor is what the hooks hand back

    def run(out_fn: Callable[..., Any], inputs: list[torch.Tensor]) -> None:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = out_fn(*inputs)
        out.sin().sum().backward()

    kiln.reset()
    compiled = kiln.compile(softmax_scaled)
    for fn in (softmax_scaled, compiled):
        packed.clear()
        inputs = _leaves((4, 8), (8,))
        run(fn, inputs)
        assert packed, "no saved tensor went through the hooks"
        ex = _copies(_leaves((4, 8), (8,)))
        softmax_scaled(*ex).sin().sum().backward()
        for a, b in zip(inputs, ex):
            torch.testing.assert_close(a.grad, b.grad)


def pointwise_saving_input(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * w) * x  # the backward reads x itself


def test_input_changed_in_place_after_forward_raises_as_eager(path: str) -> None:
    for fn in (pointwise_saving_input, kiln.compile(pointwise_saving_input)):
        x, w = _leaves((4, 8), (8,))
        inner = x * 1  # not a leaf: an in-place op on it is allowed until the backward reads it
        out = fn(inner, w)
        inner.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def two_outputs(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.softmax(x * w, -1)
    return y, (y * x).tanh()


def test_gradient_through_one_of_two_outputs(path: str) -> None:
    _same_as_eager(two_outputs, _leaves((4, 8), (8,)), lambda out, _: out[1].sum().backward())
    _same_as_eager(two_outputs, _leaves((4, 8), (8,)), lambda out, _: out[0].pow(2).sum().backward())


def test_only_some_inputs_require_grad(path: str) -> None:
    x, w = _leaves((4, 8), (8,))
    w.requires_grad_(False)
    _same_as_eager(softmax_scaled, [x, w], lambda out, _: out.sin().sum().backward())
    x.requires_grad_(False)
    w.requires_grad_(True)
    _same_as_eager(softmax_scaled, [x, w], lambda out, _: out.sin().sum().backward())


def test_dynamic_sizes_saved_for_the_backward(path: str) -> None:
    kiln.reset()
    compiled = kiln.compile(pointwise_saving_input, dynamic=True)
    for rows in (3, 5, 7):
        x, w = _leaves((rows, 8), (8,), seed=rows)
        ex, ew = _copies([x, w])
        compiled(x, w).sin().sum().backward()
        pointwise_saving_input(ex, ew).sin().sum().backward()
        torch.testing.assert_close(x.grad, ex.grad)
        torch.testing.assert_close(w.grad, ew.grad)


def test_output_hooks_and_retain_grad(path: str) -> None:
    def run(out: torch.Tensor, inputs: list[torch.Tensor]) -> Any:
        seen: list[torch.Tensor] = []
        out.register_hook(lambda g: seen.append(g.clone()))
        out.retain_grad()
        (out * out).sum().backward()
        return seen[0], out.grad

    expected, got = _same_as_eager(softmax_scaled, _leaves((4, 8), (8,)), run)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])


def test_parameters_requiring_grad_under_no_grad_inside(path: str) -> None:
    """no_grad inside the compiled function around the kernels, with parameters requiring grad: the
    result has no history (eager's), and a later call with grad on trains again."""
    w = torch.randn(8, requires_grad=True)

    def frozen_then_trained(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            frozen = torch.softmax(x * w, -1)
        return frozen, torch.softmax(x * w, -1) * frozen

    kiln.reset()
    compiled = kiln.compile(frozen_then_trained)
    x = torch.randn(4, 8)
    for fn in (frozen_then_trained, compiled):
        w.grad = None
        frozen, trained = fn(x)
        assert not frozen.requires_grad and frozen.grad_fn is None
        trained.sum().backward()
        if fn is frozen_then_trained:
            expected = w.grad.clone()
    torch.testing.assert_close(w.grad, expected)


def test_node_called_directly(path: str) -> None:
    """grad_fn(grad) outside a backward (no graph task: the saved tensors stay for a later backward)."""
    kiln.reset()
    compiled = kiln.compile(softmax_scaled)
    x, w = _leaves((4, 8), (8,))
    out = compiled(x, w)
    g = torch.randn(4, 8)
    direct = out.grad_fn(g) if path == "node" else out.grad_fn.apply(g)  # a Python node is called by apply
    ex, ew = _copies([x, w])
    expected = torch.autograd.grad(softmax_scaled(ex, ew), [ex, ew], g)
    torch.testing.assert_close(direct[0], expected[0])
    torch.testing.assert_close(direct[1], expected[1])
    out.backward(g)  # the saved tensors are still there
    torch.testing.assert_close(x.grad, expected[0])


def test_graph_alive_at_interpreter_exit(path: str, tmp_path: Any) -> None:
    """A process that exits holding a compiled graph's outputs (their nodes freed at shutdown) exits cleanly."""
    if path != "node":
        pytest.skip("the C++ node's teardown")
    script = (
        "import torch, kiln\n"
        "from kiln.runtime import boundary\n"
        "boundary.load()\n"
        "f = kiln.compile(lambda x, w: torch.softmax(x * w, -1))\n"
        "keep = [f(torch.randn(4, 8, requires_grad=True), torch.randn(8, requires_grad=True)) for _ in range(3)]\n"
        "assert keep[0].grad_fn.name() == 'CompiledFunctionBackward'\n"
        "print('done')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr[-2000:]


# ---------------------------------------------------------------------------------------------------
# Graphs with externs on the node path: every extern kind x what autograd gives a node

def addmm_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, w, b).relu()


def bmm_sigmoid(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.bmm(x, w).sigmoid() * x.sum()


def conv_tanh(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.conv2d(x, w, b, padding=1).tanh()


def embedding_scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    rows = (x.detach().abs() * 3).long() % 6  # indices: an integer input of the embedding
    return torch.nn.functional.embedding(rows, w) * x[:, None]


# name -> (function, the shapes of its inputs); each input a leaf that requires grad
EXTERNS: dict[str, tuple[Callable[..., Any], tuple[tuple[int, ...], ...]]] = {
    "mm": (linear_tanh, ((4, 8), (8, 3))),
    "addmm": (addmm_relu, ((5, 8), (6, 8), (6,))),
    "bmm": (bmm_sigmoid, ((2, 3, 4), (2, 4, 5))),
    "conv": (conv_tanh, ((2, 3, 6, 6), (4, 3, 3, 3), (4,))),
    "embedding": (embedding_scaled, ((5,), (6, 4))),
    "lstm": (lstm_out, ((2, 5, 4),)),
}


# the node path in CI; the Function path (the same checks, the path graphs with externs took before
# the node did) in the slow sweep
NODE_IN_CI = pytest.mark.parametrize("path", ["node", pytest.param("function", marks=pytest.mark.slow)],
                                     indirect=True)


def _extern_leaves(kind: str, seed: int = 0) -> list[torch.Tensor]:
    return _leaves(*EXTERNS[kind][1], seed=seed)


@NODE_IN_CI
@pytest.mark.parametrize("kind", EXTERNS)
def test_extern_graph_records_the_node_and_trains_as_eager(kind: str, path: str) -> None:
    """Gradients, retain_graph, a second backward without it, create_graph's refusing history: eager's."""
    fn = EXTERNS[kind][0]

    def twice(out: torch.Tensor, inputs: list[torch.Tensor]) -> Any:
        loss = out.sin().sum()
        loss.backward(retain_graph=True)
        loss.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()
        return type(out.grad_fn).__name__, hasattr(out.grad_fn, "_forward_cls")

    _, (node_type, python_node) = _same_as_eager(fn, _extern_leaves(kind), twice)
    assert python_node is (path == "function"), node_type  # the node path records the C++ node
    compiled = kiln.compile(fn)
    inputs = _extern_leaves(kind, seed=1)
    grads = torch.autograd.grad(compiled(*inputs).sin().sum(), inputs, create_graph=True)
    copies = _copies(inputs)
    expected = torch.autograd.grad(fn(*copies).sin().sum(), copies)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)
    with pytest.raises(RuntimeError, match="second-order gradients"):
        sum(g.sum() for g in grads).backward()


@NODE_IN_CI
@pytest.mark.parametrize("kind", EXTERNS)
def test_extern_graph_saved_tensor_hooks_and_versions(kind: str, path: str) -> None:
    """The saved tensors go through saved-tensor hooks, and an input changed in place before the
    backward is refused exactly where eager refuses it."""
    fn = EXTERNS[kind][0]
    compiled = kiln.compile(fn)
    outcomes = []
    for run in (fn, compiled):
        packed: list[torch.Tensor] = []
        inputs = _extern_leaves(kind)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t * 1, lambda t: t):
            out = run(*inputs)
        assert packed, "no saved tensor went through the hooks"
        out.sin().sum().backward()
        torch.testing.assert_close(inputs[0].grad, _grads_of(fn, _copies(_extern_leaves(kind)),
                                                             lambda o, _: o.sin().sum().backward())[0][0])
        inner = [t * 1 for t in _extern_leaves(kind)]  # not leaves: changed in place after the forward
        out = run(*inner)
        inner[0].add_(1)
        try:
            out.sum().backward()
            outcomes.append(None)
        except RuntimeError as exc:
            outcomes.append(str(exc).split(";")[0][:60])
    assert outcomes[:1] == outcomes[1:]


def _grad_mode_program(mode: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def under(*inputs: torch.Tensor) -> Any:
        if mode == "no_grad":
            with torch.no_grad():
                return fn(*inputs)
        if mode == "enable_grad_inside_no_grad":
            with torch.no_grad():
                with torch.enable_grad():
                    return fn(*inputs)
        if mode == "set_grad_enabled_false":
            with torch.set_grad_enabled(False):
                return fn(*inputs) * 2
        return fn(*inputs)
    return under


@pytest.mark.parametrize("mode", ["no_grad", "enable_grad_inside_no_grad", "set_grad_enabled_false",
                                  "inference_mode_around", "first_input_only"])
@NODE_IN_CI
@pytest.mark.parametrize("kind", EXTERNS)
def test_extern_graph_under_grad_modes(kind: str, mode: str, path: str) -> None:
    """Each grad mode around or inside the compiled function: values, requires_grad, grad_fn and the
    gradients that reach the inputs are eager's."""
    fn = _grad_mode_program(mode, EXTERNS[kind][0])
    kiln.reset()
    compiled = kiln.compile(fn)
    seen = []
    for run in (fn, compiled):
        inputs = _extern_leaves(kind)
        if mode == "first_input_only":
            for t in inputs[1:]:
                t.requires_grad_(False)
        if mode == "inference_mode_around":
            with torch.inference_mode():
                out = run(*inputs)
            assert out.is_inference()
        else:
            out = run(*inputs)
        if out.requires_grad:
            out.sin().sum().backward()
        seen.append((out.detach(), out.requires_grad, out.grad_fn is None,
                     [None if t.grad is None else t.grad.clone() for t in inputs]))
    (value, requires, no_fn, grads), (got_value, got_requires, got_no_fn, got_grads) = seen
    torch.testing.assert_close(got_value, value)
    assert (got_requires, got_no_fn) == (requires, no_fn)
    for g, e in zip(got_grads, grads):
        assert (g is None) == (e is None)
        if e is not None:
            torch.testing.assert_close(g, e)


def views_and_aliases(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x @ w
    return y.tanh(), x.view(-1), y.argmax(-1), y > 0, w.t()


def test_extern_graph_with_input_views_aliased_and_non_differentiable_outputs(path: str) -> None:
    """Inputs that are views with offsets and transposes; outputs that are views of inputs, integer
    and bool outputs (no gradient), beside the differentiable one: eager's values, histories and grads."""
    kiln.reset()
    compiled = kiln.compile(views_and_aliases)
    seen = []
    for run in (views_and_aliases, compiled):
        xb, wb = _leaves((5, 8), (3, 8))
        outs = run(xb[1:], wb.t())
        assert [o.requires_grad for o in outs] == [True, True, False, False, True]
        assert outs[1]._base is not None and outs[4]._base is not None  # views of the inputs
        (outs[0].sin().sum() + outs[1].sum() * 2 + outs[4].pow(2).sum()).backward()
        seen.append(([o.detach() for o in outs], xb.grad.clone(), wb.grad.clone()))
    for e, g in zip(seen[0][0], seen[1][0]):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(seen[1][1], seen[0][1])
    torch.testing.assert_close(seen[1][2], seen[0][2])


def test_extern_graph_output_hooks_and_direct_node_call(path: str) -> None:
    def run(out: torch.Tensor, inputs: list[torch.Tensor]) -> Any:
        seen: list[torch.Tensor] = []
        out.register_hook(lambda g: seen.append(g.clone()))
        out.retain_grad()
        direct = out.grad_fn(torch.ones_like(out)) if path == "node" else out.grad_fn.apply(torch.ones_like(out))
        (out * out).sum().backward()
        return seen[0], out.grad, [d for d in direct if d is not None]

    kiln.reset()
    inputs = _extern_leaves("addmm")
    got = run(kiln.compile(addmm_relu)(*inputs), inputs)
    ex = _copies(_extern_leaves("addmm"))
    out = addmm_relu(*ex)
    direct = torch.autograd.grad(out, ex, torch.ones_like(out), retain_graph=True)
    seen: list[torch.Tensor] = []
    out.register_hook(lambda g: seen.append(g.clone()))
    out.retain_grad()
    (out * out).sum().backward()
    torch.testing.assert_close(got[0], seen[0])
    torch.testing.assert_close(got[1], out.grad)
    for g, e in zip(got[2], direct):
        torch.testing.assert_close(g, e)
    for t, e in zip(inputs, ex):
        torch.testing.assert_close(t.grad, e.grad)
