"""Every grad mode x every kind of extern call: compiled code gives eager's values and autograd facts.

The lowering runs matmuls, convolutions, attention, pooling and ops without a lowering as ATen calls
("externs"); the matmuls write into planned buffers through their out= overloads, which autograd
refuses whenever an argument requires grad and grad mode is on. So a compiled graph must run under
the grad mode it was traced for, whatever the caller's: an evaluation loop (`torch.no_grad()` inside
the compiled function, module parameters requiring grad) was the first report. For each grad mode
(default, no_grad inside and outside, enable_grad inside no_grad, inference_mode outside and inside,
set_grad_enabled(False)), with parameters and inputs requiring grad or not, each model runs on the
Python wrapper and on the native C++ wrapper; its outputs are compared with eager's: values,
requires_grad, whether a grad_fn is there, is_inference, and where a gradient flows, the gradients of
the inputs and parameters after a backward. The backward with create_graph=True (gradient penalties)
either gives eager's first-order gradients with a history, or raises a clear error at the second
backward, never a silently partial one. CI runs a slice; the whole matrix is marked slow.
"""
from __future__ import annotations

import contextlib
import itertools
import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln import config
from kiln.log import KilnWarning
from kiln.runtime import native

pytestmark = pytest.mark.cpp


# ------------------------------------------------------------------------------ models, one per extern
# Each factory returns (module, inputs). Sizes keep every matmul and convolution an ATen call (large
# enough for the convolution to use oneDNN, not the small-convolution kernels).

class _Bmm(nn.Module):
    def __init__(self, baddbmm: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 8, 5))
        self.b = nn.Parameter(torch.randn(3, 4, 5))
        self.baddbmm = baddbmm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.baddbmm:
            return torch.baddbmm(self.b, x, self.w)
        return torch.bmm(x, self.w).relu()


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(2, 12, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum(1)


class _Embedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb((x.abs() * 3).long() % 10)) + x.sum()


class _ConvPool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(self.conv(x).relu(), 2)
        return self.fc(y.mean((2, 3)))


def _conv_bn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()).eval()


def _lstm() -> nn.Module:
    class Lstm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.LSTM(4, 6, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.rnn(x)[0]
    return Lstm()


MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "addmm": lambda: (nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)), torch.randn(5, 8)),
    "mm": lambda: (nn.Linear(8, 6, bias=False), torch.randn(5, 8)),
    "bmm": lambda: (_Bmm(False), torch.randn(3, 4, 8)),
    "baddbmm": lambda: (_Bmm(True), torch.randn(3, 4, 8)),
    "conv_pool": lambda: (_ConvPool(), torch.randn(2, 8, 20, 20)),
    "conv_bn_eval": lambda: (_conv_bn(), torch.randn(2, 8, 20, 20)),
    "batch_norm_train": lambda: (nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6)), torch.randn(7, 6)),
    "sdpa": lambda: (_Attention(), torch.randn(2, 12, 16)),
    "embedding": lambda: (_Embedding(), torch.randn(6)),
    "lstm": lambda: (_lstm(), torch.randn(2, 5, 4)),
}


# ------------------------------------------------------------------------------ grad modes
# (context around the call, context inside the compiled function)

def _inference_inside(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(x)


GRAD_MODES: dict[str, tuple[Callable[[], Any], Callable[[], Any] | None]] = {
    "default": (contextlib.nullcontext, None),
    "no_grad_inside": (contextlib.nullcontext, torch.no_grad),
    "no_grad_outside": (torch.no_grad, None),
    "enable_grad_inside_no_grad": (torch.no_grad, torch.enable_grad),
    "set_grad_enabled_false_inside": (contextlib.nullcontext, lambda: torch.set_grad_enabled(False)),
    "inference_mode_outside": (torch.inference_mode, None),
    "inference_mode_inside": (contextlib.nullcontext, torch.inference_mode),
}


def _function(model: nn.Module, inside: Callable[[], Any] | None) -> Callable[[torch.Tensor], Any]:
    if inside is None:
        def f(x: torch.Tensor) -> Any:
            return model(x)
    else:
        def f(x: torch.Tensor) -> Any:
            with inside():
                return model(x)
    return f


def _facts(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.dtype, t.requires_grad, t.grad_fn is not None, t.is_inference())


def _run(fn: Callable, model: nn.Module, x: torch.Tensor, outside: Callable[[], Any]) -> tuple:
    """Two calls (the second runs the cached code), then the gradients where one flows."""
    outs = []
    for _ in range(2):
        with outside():
            outs.append(fn(x))
    out = outs[-1]
    grads: list[torch.Tensor | None] = []
    if out.requires_grad:
        for p in [x, *model.parameters()]:
            p.grad = None
        out.float().square().sum().backward()
        grads = [p.grad for p in [x, *model.parameters()]]
    return outs, grads


def _check(name: str, mode: str, params_grad: bool, input_grad: bool, wrapper: str) -> None:
    kiln.reset()
    torch.manual_seed(0)
    model, x = MODELS[name]()
    model.requires_grad_(params_grad)
    x = x.requires_grad_(input_grad)
    outside, inside = GRAD_MODES[mode]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    expected, expected_grads = _run(_function(model, inside), model, x, outside)
    after_eager = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    made = []
    # "native": each graph's own compiled C++ wrapper; "plan": its plan, run by the boundary extension
    spied = "bind_plan" if wrapper == "plan" else "make_native"
    real_make = getattr(native, spied)

    def counting(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return real_make(*args, **kwargs)

    knobs = {"cpu_wrapper": "python"} if wrapper == "python" else {"cpu_wrapper": "native",
                                                                  "native_plan": wrapper == "plan"}
    with config.patch(**knobs), warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # an internal error: the frame runs eagerly, with one
        setattr(native, spied, counting)
        try:
            got, got_grads = _run(kiln.compile(_function(model, inside)), model, x, outside)
        finally:
            setattr(native, spied, real_make)
    if mode != "inference_mode_inside":  # a graph break: inference_mode's __exit__ runs eagerly
        assert kiln.stats()["fallbacks"] == 0
    # a graph holding training BatchNorm's functional op keeps the Python wrapper (the op has no
    # C++ header: KILN_LOGS=perf_hints says so), and an inference graph of that model is only that
    if wrapper != "python" and kiln.stats()["compiles"] and name != "batch_norm_train":
        assert made, "no graph got the native wrapper"
    for e, g in zip(expected, got):
        assert _facts(g) == _facts(e), f"{name}/{mode}: compiled {_facts(g)}, eager {_facts(e)}"
        torch.testing.assert_close(g.detach(), e.detach(), rtol=1e-4, atol=1e-5)
    assert len(got_grads) == len(expected_grads)
    for e, g in zip(expected_grads, got_grads):
        assert (e is None) == (g is None)
        if e is not None:
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    for key, value in model.state_dict().items():  # running statistics updated as eager updates them
        torch.testing.assert_close(value, after_eager[key])


MATRIX = list(itertools.product(MODELS, GRAD_MODES, (True, False), (True, False), ("python", "native", "plan")))
# The CI slice: the first report, every grad mode on the matmul that hit it, and every extern kind
# under the modes that run an inference graph while parameters require grad.
# (A native wrapper is one more C++ build per graph: a few of them.)
CI = ([("addmm", mode, True, False, "python") for mode in GRAD_MODES]
      + [("addmm", mode, True, True, "native") for mode in ("no_grad_inside", "enable_grad_inside_no_grad")]
      + [(name, "no_grad_inside", True, False, "python") for name in MODELS if name != "addmm"]
      + [("conv_pool", "no_grad_inside", True, True, "native")]
      # a plan binds without a compile: every extern kind, under the modes that hit grad-mode bugs
      + [(name, mode, True, True, "plan") for name in MODELS
         for mode in ("no_grad_inside", "enable_grad_inside_no_grad")])


def _id(case: tuple) -> str:
    name, mode, params_grad, input_grad, wrapper = case
    return f"{name}-{mode}-{'params_grad' if params_grad else 'params_frozen'}-" \
           f"{'input_grad' if input_grad else 'input_plain'}-{wrapper}"


@pytest.mark.parametrize("case", CI, ids=_id)
def test_grad_mode_with_extern(case: tuple) -> None:
    _check(*case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in MATRIX if c not in CI], ids=_id)
def test_grad_mode_with_extern_full_matrix(case: tuple) -> None:
    _check(*case)


# ------------------------------------------------------------------------------ create_graph=True

def _create_graph_cases() -> list[Any]:
    cases = []
    for name in ("addmm", "bmm", "conv_pool", "sdpa"):
        for backend, wrapper in (("inductor", "python"), ("aot_eager", "python"), ("inductor", "native")):
            slow = name != "addmm" and backend != "inductor" or name != "addmm" and wrapper == "native"
            cases.append(pytest.param(name, backend, wrapper, id=f"{name}-{backend}-{wrapper}",
                                      marks=[pytest.mark.slow] if slow else []))
    return cases


@pytest.mark.parametrize("name, backend, wrapper", _create_graph_cases())
def test_backward_with_create_graph(name: str, backend: str, wrapper: str) -> None:
    """A gradient penalty's first step: autograd.grad(loss, x, create_graph=True) whose incoming
    gradient requires grad (loss = (f(x) ** 2).sum()). It gives eager's gradient, with a history;
    a backward through that history raises a clear error. Before: the matmul's out= raised on the
    first step (inductor), or the second backward silently missed the compiled part (aot_eager)."""
    kiln.reset()
    torch.manual_seed(0)
    model, x = MODELS[name]()
    x = x.requires_grad_()
    expected, = torch.autograd.grad(model(x).square().sum(), x, create_graph=True)
    assert expected.requires_grad
    with config.patch(cpu_wrapper=wrapper), warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        compiled = kiln.compile(model, backend=backend)
        for _ in range(2):
            got, = torch.autograd.grad(compiled(x).square().sum(), x, create_graph=True)
    torch.testing.assert_close(got.detach(), expected.detach(), rtol=1e-4, atol=1e-5)
    assert got.requires_grad and got.grad_fn is not None
    with pytest.raises(RuntimeError, match="kiln: a backward through gradients that a compiled graph computed"):
        got.square().sum().backward()
    # a plain backward afterwards is unaffected
    grads = []
    for fn in (model, compiled):
        for p in model.parameters():
            p.grad = None
        fn(x).sum().backward()
        grads.append([p.grad for p in model.parameters()])
    for e, g in zip(*grads):
        assert (e is None) == (g is None)
        if e is not None:
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_parameter_update_under_no_grad_in_a_training_step(backend: str) -> None:
    """An EMA update of another module's parameters (in place, under no_grad) beside a forward that
    needs a backward, and a forward of the updated module under no_grad: one graph with both."""
    def make() -> tuple[nn.Module, nn.Module]:
        torch.manual_seed(0)
        return nn.Linear(8, 4), nn.Linear(8, 4)

    def step(model: nn.Module, ema: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = model(x)
        with torch.no_grad():
            for p, q in zip(ema.parameters(), model.parameters()):
                p.mul_(0.9).add_(q, alpha=0.1)
            z = ema(x)
        return y, z

    x = torch.randn(3, 8)
    results = []
    for fn_of in (lambda f: f, lambda f: kiln.compile(f, backend=backend)):
        kiln.reset()
        model, ema = make()
        fn = fn_of(step)
        with warnings.catch_warnings():
            warnings.simplefilter("error", KilnWarning)
            for _ in range(2):
                y, z = fn(model, ema, x)
                y.sum().backward()
        results.append((y, z, ema.weight.detach().clone(), model.weight.grad.clone(), ema.weight.is_leaf))
    (y0, z0, e0, g0, leaf0), (y1, z1, e1, g1, leaf1) = results
    assert _facts(y1) == _facts(y0) and _facts(z1) == _facts(z0) and leaf1 == leaf0
    for a, b in ((y1, y0), (z1, z0), (e1, e0), (g1, g0)):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-4, atol=1e-5)


def _set_grad_enabled_calls(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    torch.set_grad_enabled(False)
    y = model(x)
    torch.set_grad_enabled(True)
    return y


def _no_grad_decorated(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    @torch.no_grad()
    def frozen(t: torch.Tensor) -> torch.Tensor:
        return model(t)
    return frozen(x) + model(x)


def _no_grad_result_fed_on(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        features = model[0](x)
    return model(features)


@pytest.mark.parametrize("spelling, wrapper", [
    pytest.param(spelling, wrapper, id=f"{spelling.__name__.strip('_')}-{wrapper}",
                 marks=[pytest.mark.slow] if wrapper == "native" and spelling is not _no_grad_result_fed_on else [])
    for spelling in (_set_grad_enabled_calls, _no_grad_decorated, _no_grad_result_fed_on)
    for wrapper in ("python", "native")])
def test_grad_mode_spellings(spelling: Callable, wrapper: str) -> None:
    """set_grad_enabled as calls, a no_grad-decorated helper, a no_grad result fed to layers that
    need a backward: values, autograd facts and the parameters' gradients are eager's."""
    kiln.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    x = torch.randn(5, 8)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return spelling(model, t)

    expected, expected_grads = _run(fn, model, x, contextlib.nullcontext)
    with config.patch(cpu_wrapper=wrapper), warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        got, got_grads = _run(kiln.compile(fn), model, x, contextlib.nullcontext)
    assert torch.is_grad_enabled()
    for e, g in zip(expected, got):
        assert _facts(g) == _facts(e)
        torch.testing.assert_close(g.detach(), e.detach(), rtol=1e-4, atol=1e-5)
    for e, g in zip(expected_grads, got_grads):
        assert (e is None) == (g is None)
        if e is not None:
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
