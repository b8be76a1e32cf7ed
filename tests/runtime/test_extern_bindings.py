"""The Python wrapper calls its matmul, convolution and CPU attention externs through torch's
generated Python bindings (kiln.runtime.kernel_wrapper.EXTERN_BINDINGS), not OpOverload._op.

Each binding must select the very overload the lowering chose for the arguments a wrapper passes
(out= and keyword-only scalars by keyword): a dispatch mode records the overload each call reaches.
The wrapper of a compiled graph, made now or rebuilt from its recipe, holds the bindings, and its
values are eager's under the grad modes (the grad-mode sweep of every extern on every tier is
tests/runtime/test_grad_modes_x_externs.py).
"""
from __future__ import annotations

import gc
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kiln
from kiln import config
from kiln.runtime.kernel_wrapper import EXTERN_BINDINGS, bind_overloads

aten = torch.ops.aten


class _Record(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _calls() -> list[tuple]:
    """(overload, positional args, keyword args) as the wrapper writes each extern."""
    a, b, bias = torch.randn(4, 3), torch.randn(3, 5), torch.randn(5)
    ba, bb, bbias = torch.randn(2, 4, 3), torch.randn(2, 3, 5), torch.randn(2, 4, 5)
    q, mask = torch.randn(2, 4, 8, 8), torch.zeros(2, 1, 8, 8)
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    return [
        (aten.mm.out, (a, b), {"out": torch.empty(4, 5)}),
        (aten.mm.default, (a, b), {}),
        (aten.addmm.out, (bias, a, b), {"beta": 0.5, "alpha": 2, "out": torch.empty(4, 5)}),
        (aten.addmm.out, (bias, a, b), {"out": torch.empty(4, 5)}),
        (aten.addmm.default, (bias, a, b), {"alpha": 0.25}),
        (aten.bmm.out, (ba, bb), {"out": torch.empty(2, 4, 5)}),
        (aten.bmm.default, (ba, bb), {}),
        (aten.baddbmm.out, (bbias, ba, bb), {"beta": 2.0, "alpha": 0.5, "out": torch.empty(2, 4, 5)}),
        (aten.baddbmm.default, (bbias, ba, bb), {}),
        (aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q, 0.0, False),
         {"attn_mask": mask, "scale": 0.3}),
        (aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q, 0.0, True), {"scale": None}),
        (aten.convolution.default, (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), {}),
        (aten.convolution.default, (x, w, torch.randn(3), [2, 1], [1, 0], [1, 2], False, [0, 0], 1), {}),
    ]


@pytest.mark.parametrize("case", range(len(_calls())))
def test_binding_reaches_the_overload(case):
    op, args, kwargs = _calls()[case]
    binding = EXTERN_BINDINGS[op]
    with _Record() as record:
        got = binding(*args, **kwargs)
    assert record.ops == [op]
    want = op(*args, **kwargs)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(g, w)


def test_every_binding_covered():
    assert {op for op, _, _ in _calls()} == set(EXTERN_BINDINGS)


def test_bind_overloads_prefers_the_binding():
    other = aten.sort.default  # an extern without a binding in the table: its C++ callable
    env = {"extern_aten_mm_out": aten.mm.out, "extern_aten_sort_default": other, "n": 3}
    bind_overloads(env)
    assert env["extern_aten_mm_out"] is torch.mm
    assert env["extern_aten_sort_default"] is other._op
    assert env["n"] == 3


def _wrapper_globals() -> list[dict]:
    return [f.__globals__ for f in gc.get_objects() if type(f) is types.FunctionType
            and f.__name__ == "call" and f.__code__.co_filename == "<kiln wrapper>"]


class _Block(torch.nn.Module):
    """A linear (addmm), a matmul (mm) and a batched matmul (bmm) around pointwise kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.lin(x)) @ self.w
        return torch.bmm(h.view(2, 3, 8), h.view(2, 3, 8).transpose(1, 2)).sin()


_MODES = {
    "no_grad": torch.no_grad,
    "enable_grad": torch.enable_grad,
    "inference_mode": torch.inference_mode,
}


@pytest.mark.cpp
@pytest.mark.parametrize("mode", sorted(_MODES))
@pytest.mark.parametrize("params_grad", [True, False])
def test_python_wrapper_runs_bindings_with_eager_values(monkeypatch, mode, params_grad):
    monkeypatch.setattr(config, "cpu_wrapper", "python")
    kiln.reset()
    torch.manual_seed(0)
    model = _Block()
    model.requires_grad_(params_grad)
    x = torch.randn(6, 8)
    compiled = kiln.compile(model)
    before = {id(g) for g in _wrapper_globals()}
    with _MODES[mode]():
        want = model(x)
        got = compiled(x)
        got2 = compiled(x)
    for out in (got, got2):
        assert torch.allclose(out, want, atol=1e-5, rtol=1e-5)
        assert out.requires_grad == want.requires_grad
    bound = [g for g in _wrapper_globals() if id(g) not in before]
    externs = {v for g in bound for k, v in g.items() if k.startswith("extern_")}
    assert externs and externs <= set(EXTERN_BINDINGS.values()), externs
    if want.requires_grad:
        (got.sum() + got2.sum()).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        (want.sum() * 2).backward()
        for g, w in zip(grads, [p.grad for p in model.parameters()]):
            assert torch.allclose(g, w, atol=1e-4, rtol=1e-4)


@pytest.mark.cpp
def test_attention_extern_bound(monkeypatch):
    monkeypatch.setattr(config, "cpu_wrapper", "python")
    kiln.reset()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 8) for _ in range(3))

    def attend(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.35, dim=-1) @ v

    before = {id(g) for g in _wrapper_globals()}
    with torch.no_grad():
        got = kiln.compile(attend)(q, k, v)
    assert torch.allclose(got, attend(q, k, v), atol=1e-5, rtol=1e-5)
    bound = [g for g in _wrapper_globals() if id(g) not in before]
    externs = {v for g in bound for k_, v in g.items() if k_.startswith("extern_")}
    assert torch._scaled_dot_product_flash_attention_for_cpu in externs, externs
