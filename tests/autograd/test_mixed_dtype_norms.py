"""Group and layer norm with a float16/bfloat16 input and float32 parameters (what autocast gives a
model's norm layers on CPU), compiled by the default backend against eager: outputs, gradients
and their dtypes, static and dynamic shapes, parameters trainable or frozen.

Found by the grad-modes sweep (tests/runtime/test_grad_modes_x_externs.py): ATen's CPU kernels keep
the saved mean and rstd of this mixed type in float32 and return the input's gradient in the
input's dtype, where the meta kernels say the input's dtype and float32. So a frozen model's
compiled backward handed native_group_norm_backward statistics in the wrong dtype ("expected scalar
type BFloat16 but found Float"), the kernel after it read its bfloat16 gradient as float32, and
under dynamic=True the decomposed backward's float32 gradient reached a bfloat16 convolution
(kiln.fake.impls.native_group_norm and native_group_norm_backward, kiln.lower.decompose).
"""
from __future__ import annotations

from typing import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln

aten = torch.ops.aten

MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "conv_group_norm": (lambda: nn.Sequential(nn.Conv2d(4, 8, 3), nn.GroupNorm(2, 8)), (2, 4, 8, 8)),
    "linear_layer_norm": (lambda: nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8)), (3, 5, 6)),
}


def _run(model: nn.Module, x: torch.Tensor, dtype: torch.dtype,
         compiled: Callable[[torch.Tensor], torch.Tensor] | None) -> list[torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    for p in model.parameters():
        p.grad = None
    with torch.autocast("cpu", dtype=dtype):
        y = (compiled or model)(x)
    y.float().square().sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in model.parameters() if p.requires_grad]


def _assert_matches(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    """Same dtypes; values within half-precision rounding of each tensor's scale (a gradient summed
    in bfloat16 in another order differs by a few units in the last place of its largest term)."""
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype
        scale = max(1.0, e.float().abs().max().item())
        torch.testing.assert_close(g.float(), e.float(), rtol=2e-2, atol=1e-2 * scale)


@pytest.mark.cpp
# CI: the star around conv_group_norm in bf16, trainable, static sizes (each axis's other value
# with the rest at base: 5 of 16); the other combinations `-m slow`
@pytest.mark.ci_slice({"name": "conv_group_norm", "dtype": torch.bfloat16, "frozen": False, "dynamic": False})
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("frozen", [True, False], ids=["frozen", "trainable"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_norm_under_autocast_matches_eager(name: str, dtype: torch.dtype, frozen: bool, dynamic: bool) -> None:
    kiln.reset()
    make, shape = MODELS[name]
    torch.manual_seed(0)
    model = make().requires_grad_(not frozen)
    x = torch.randn(shape)
    expected = _run(model, x, dtype, None)
    got = _run(model, x, dtype, kiln.compile(model, dynamic=dynamic))
    _assert_matches(got, expected)
    assert kiln.stats()["fallbacks"] == 0


@pytest.mark.cpp
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("op", ["group_norm", "layer_norm"])
def test_mixed_norm_statistics_keep_eagers_dtype(op: str, dynamic: bool) -> None:
    """The ATen ops themselves, without autocast: a bfloat16 input with a float32 weight (and with
    a float32 bias only, also mixed for ATen); the saved statistics come back float32 as eager's."""
    def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> list[torch.Tensor]:
        if op == "group_norm":
            with_both = aten.native_group_norm(x, weight, bias, x.shape[0], 8, x.shape[2] * x.shape[3], 2, 1e-5)
            bias_only = aten.native_group_norm(x, None, bias, x.shape[0], 8, x.shape[2] * x.shape[3], 2, 1e-5)
        else:
            with_both = aten.native_layer_norm(x, [x.shape[-1]], weight[:x.shape[-1]], bias[:x.shape[-1]], 1e-5)
            bias_only = aten.native_layer_norm(x, [x.shape[-1]], None, bias[:x.shape[-1]], 1e-5)
        return [*with_both, *bias_only]

    kiln.reset()
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6, dtype=torch.bfloat16)
    weight, bias = torch.randn(8), torch.randn(8)
    expected = norm(x, weight, bias)
    assert expected[1].dtype == torch.float32  # what the test is about: eager's mixed-type statistics
    got = kiln.compile(norm, dynamic=dynamic)(x, weight, bias)
    _assert_matches(got, expected)
    assert kiln.stats()["fallbacks"] == 0


@pytest.mark.cpp
def test_group_norm_backward_gradient_dtypes() -> None:
    """native_group_norm_backward called directly on a bfloat16 input with float32 statistics and
    weight: the input's gradient bfloat16, the weight's and bias's float32, as eager's kernel."""
    def backward(grad: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                 weight: torch.Tensor) -> list[torch.Tensor]:
        grads = aten.native_group_norm_backward(grad, x, mean, rstd, weight, 2, 8, 36, 2, [True, True, True])
        return [grads[0] * 2, grads[1] + 1, grads[2]]  # each read by a kernel of Kiln's after the call

    kiln.reset()
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6, dtype=torch.bfloat16)
    _, mean, rstd = aten.native_group_norm(x, torch.ones(8), None, 2, 8, 36, 2, 1e-5)
    args = (torch.randn_like(x), x, mean, rstd, torch.randn(8))
    expected = backward(*args)
    got = kiln.compile(backward)(*args)
    _assert_matches(got, expected)
    assert kiln.stats()["fallbacks"] == 0


def test_functional_layer_norm_mixed_backward() -> None:
    """F.layer_norm of a bfloat16 input with float32 parameters outside autocast, trained: the
    gradients and their dtypes are eager's (layer norm's backward reads the float32 statistics)."""
    kiln.reset()
    torch.manual_seed(0)
    x0, w0, b0 = torch.randn(4, 7, dtype=torch.bfloat16), torch.randn(7), torch.randn(7)

    def run(fn: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        x, w, b = (t.clone().requires_grad_(True) for t in (x0, w0, b0))
        y = fn(x, w, b)
        y.float().sum().backward()
        return [y.detach(), x.grad, w.grad, b.grad]

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (7,), w, b) * 3

    expected = run(fn)
    got = run(kiln.compile(fn))
    _assert_matches(got, expected)
    assert kiln.stats()["fallbacks"] == 0


@pytest.mark.cpp
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("params", ["both", "none", "weight_only"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_layer_norm_same_half_dtype_backward(dtype: torch.dtype, params: str, dynamic: bool) -> None:
    """A bfloat16/float16 LayerNorm whose parameters have the input's dtype (no mixed type): CPU's
    kernel keeps the saved statistics in that dtype, where the meta kernel says float32, so the
    compiled backward handed native_layer_norm_backward float32 statistics and raised "expected
    scalar type BFloat16 but found Float" (found by probe round 10, g_bf16_layernorm_grad)."""
    kiln.reset()
    torch.manual_seed(0)
    x0, w0, b0 = torch.randn(3, 6, dtype=dtype), torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype)

    def run(fn: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        x, w, b = (t.clone().requires_grad_(True) for t in (x0, w0, b0))
        y = fn(x, w, b)
        (y.float() * torch.linspace(-1, 2, y.numel()).view(y.shape)).sum().backward()
        return [y.detach(), x.grad] + [p.grad for p in (w, b) if p.grad is not None]

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        weight = None if params == "none" else w
        bias = b if params == "both" else None
        return F.layer_norm(x, (6,), weight, bias).float().sin()

    expected = run(fn)
    got = run(kiln.compile(fn, dynamic=dynamic))
    _assert_matches(got, expected)
    assert kiln.stats()["fallbacks"] == 0
