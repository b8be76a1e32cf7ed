"""A training graph's two C++ builds overlap (kiln.autograd.backend.compile_with_aot with
kiln.lower.prepare_graph): the forward's kernels start compiling before the backward is lowered,
and the two compilers run side by side, each graph still one compiler invocation; while a graph's
kernels compile, its Python wrapper is written and its program stored in the disk cache. A compiler
without `prepare` keeps running forward, then backward. What comes out is what a sequential
compile gives: the same values and gradients, the build's error where a build fails."""
from __future__ import annotations

import threading
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.autograd import aot_autograd
from kiln.lower import LoweringCompiler, compile_graph
from kiln.lower.codegen.wrapper import WrapperWriter
from kiln.runtime import build, cache

pytestmark = pytest.mark.cpp  # kernels compiled with the system compiler

WAIT_S = 30.0  # how long the first kernel compiler waits for the second to start


@pytest.fixture
def fresh_cache(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty cache (every kernel library is compiled) and the Python wrapper (no native build)."""
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(kiln.config, "cpu_wrapper", "python")
    kiln.reset()


def _kernel_build(cmd: list[str]) -> bool:
    return list(cmd[1:1 + len(build.DEFAULT_FLAGS)]) == list(build.DEFAULT_FLAGS)


class CompilerSpy:
    """build.run_compiler, recording each kernel compiler invocation; the first one waits (up to
    WAIT_S) until a second one has started, so a sequential compile shows as `overlapped == False`."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.lock = threading.Lock()
        self.kernel_calls: list[list[str]] = []
        self.second_started = threading.Event()
        self.overlapped: bool | None = None

    def __call__(self, cmd: list[str], cwd: str) -> Any:
        if not _kernel_build(cmd):
            return self.real(cmd, cwd)
        with self.lock:
            self.kernel_calls.append(list(cmd))
            first = len(self.kernel_calls) == 1
        if first:
            self.overlapped = self.second_started.wait(WAIT_S)
            return self.real(cmd, cwd)
        self.second_started.set()
        return self.real(cmd, cwd)


class MLP(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(12, 20), nn.Linear(20, 6)
        self.scale = scale

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.b(F.gelu(self.a(x)) * self.scale), target)


def _step(model: Callable[..., torch.Tensor], params: list[torch.Tensor], x: torch.Tensor,
          target: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss = model(x, target)
    grads = torch.autograd.grad(loss, params)
    return loss.detach(), list(grads)


@pytest.mark.parametrize("scale", [1.5, -0.25, 3.0])
def test_forward_and_backward_kernels_compile_side_by_side(fresh_cache: None, monkeypatch: pytest.MonkeyPatch,
                                                           scale: float) -> None:
    spy = CompilerSpy(build.run_compiler)
    monkeypatch.setattr(build, "run_compiler", spy)
    eager = MLP(scale)
    model = MLP(scale)
    x, target = torch.randn(5, 12), torch.randn(5, 6)
    expected = _step(eager, list(eager.parameters()), x, target)
    got = _step(kiln.compile(model), list(model.parameters()), x, target)
    assert len(spy.kernel_calls) == 2, "one compiler invocation per graph (forward, backward)"
    assert spy.overlapped, "the backward's kernels did not start compiling while the forward's compiled"
    torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-5)
    for g, e in zip(got[1], expected[1]):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_forward_build_starts_before_backward_is_lowered(fresh_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """prepare_graph returns with the compiler running: what runs before finish() overlaps it."""
    events: list[str] = []
    started = threading.Event()
    real = build.run_compiler

    def spy(cmd: list[str], cwd: str) -> Any:
        if _kernel_build(cmd):
            events.append("compiler started")
            started.set()
        return real(cmd, cwd)

    monkeypatch.setattr(build, "run_compiler", spy)
    gm = torch.fx.symbolic_trace(lambda a, b: torch.ops.aten.mul.Tensor(torch.ops.aten.sin.default(a), b))
    inputs = [torch.randn(7, 3), torch.randn(7, 3)]
    finish = LoweringCompiler(None).prepare(gm, inputs)
    assert started.wait(WAIT_S), "prepare returned before the kernels' compiler started"
    events.append("prepare returned")
    compiled = finish()
    torch.testing.assert_close(compiled(*inputs)[0], torch.sin(inputs[0]) * inputs[1])
    assert events == ["compiler started", "prepare returned"]


def test_wrapper_written_and_program_stored_while_kernels_compile(fresh_cache: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels' compiler waits (up to WAIT_S) for the wrapper's source and the stored program:
    both come before the build pass waits for it, not after."""
    written, stored = threading.Event(), threading.Event()
    real_write, real_store, real_compiler = WrapperWriter.write, cache.store_graph, build.run_compiler

    def write(self: WrapperWriter) -> str:
        source = real_write(self)
        written.set()
        return source

    def store(*args: Any, **kwargs: Any) -> Any:
        out = real_store(*args, **kwargs)
        stored.set()
        return out

    seen: list[tuple[bool, bool]] = []

    def compiler(cmd: list[str], cwd: str) -> Any:
        if _kernel_build(cmd):
            seen.append((written.wait(WAIT_S), stored.wait(WAIT_S)))
        return real_compiler(cmd, cwd)

    monkeypatch.setattr(WrapperWriter, "write", write)
    monkeypatch.setattr(cache, "store_graph", store)
    monkeypatch.setattr(build, "run_compiler", compiler)
    gm = torch.fx.symbolic_trace(lambda a: torch.ops.aten.exp.default(torch.ops.aten.neg.default(a)))
    x = torch.randn(6, 9)
    compiled = compile_graph(gm, [x])
    torch.testing.assert_close(compiled(x)[0], torch.exp(-x))
    assert seen == [(True, True)]


def test_build_error_comes_out_of_finish(fresh_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing kernel build raises build.BuildError from compile_graph, as a sequential build did."""
    def failing(cmd: list[str], cwd: str) -> Any:
        import subprocess

        return subprocess.CompletedProcess(cmd, 1, "", "kernel.cpp:1: error: made to fail")

    monkeypatch.setattr(build, "run_compiler", failing)
    gm = torch.fx.symbolic_trace(lambda a: torch.ops.aten.cos.default(a))
    with pytest.raises(build.BuildError, match="made to fail"):
        compile_graph(gm, [torch.randn(4, 5)])


def test_compiler_without_prepare_runs_forward_then_backward(fresh_cache: None) -> None:
    """aot_autograd with a plain compiler: each graph compiled whole, forward first, as before."""
    order: list[str] = []

    def named(which: str) -> Callable[..., Any]:
        def compiler(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
            order.append(which)
            return compile_graph(gm, example_inputs)
        return compiler

    model = MLP(0.5)
    eager = MLP(0.5)
    x, target = torch.randn(3, 12), torch.randn(3, 6)
    compiled = kiln.compile(model, backend=aot_autograd(named("forward"), named("backward")))
    got = _step(compiled, list(model.parameters()), x, target)
    expected = _step(eager, list(eager.parameters()), x, target)
    assert order == ["forward", "backward"]
    for g, e in zip(got[1], expected[1]):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
