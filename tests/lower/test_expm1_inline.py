"""Float expm1 in kernels is the prelude's inline kiln_expm1f_inline (a series near zero, exp - 1
beyond), not libmvec's expm1f, which ran an ELU (a GAT layer's activation) 1.7x longer than eager:
within a few ulp of the correctly rounded result, zeros keep their sign, infinities and NaN as
eager, and one result per input in a vector lane, a remainder and a scalar loop."""
from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F

from kiln.lower.codegen.cpp import prelude
from kiln.runtime import build

from .conftest import check
from .test_exp_underflow import _LOOPS

pytestmark = pytest.mark.cpp


def _ptr(x: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(x.data_ptr())


def test_inline_float_expm1_is_close_and_the_same_in_every_loop() -> None:
    body = _LOOPS.format(t="float", fn="kiln_expm1f_inline")
    lib = build.load(prelude(body) + body)
    gen = torch.Generator().manual_seed(0)
    a = torch.cat([torch.rand(200_003, generator=gen) * 40 - 30, torch.rand(50_000, generator=gen) * 2 - 1,
                   torch.rand(10_000, generator=gen) * 2e-3 - 1e-3,
                   torch.tensor([float("-inf"), float("inf"), float("nan"), 0.0, -0.0, 0.5, -0.5, 0.49999997,
                                 -0.49999997, 1e-30, -1e-30, 1e-40, 88.72, 89.0, -104.0, -1e30])])
    whole, alone = torch.empty_like(a), torch.empty_like(a)
    lib.vector_loop(_ptr(a), _ptr(whole), ctypes.c_int64(a.numel()))
    lib.scalar_loop(_ptr(a), _ptr(alone), ctypes.c_int64(a.numel()))
    assert torch.equal(whole.view(torch.int32), alone.view(torch.int32))
    exact = a.double().expm1().float()  # correctly rounded (double expm1 is far more precise)
    finite = torch.isfinite(exact) & (exact != 0)
    ulps = (whole.view(torch.int32).long() - exact.view(torch.int32).long()).abs()
    assert ulps[finite].max().item() <= 3
    zero_or_special = ~finite
    assert torch.equal(whole[zero_or_special].nan_to_num(), exact[zero_or_special].nan_to_num())
    assert torch.equal(whole[zero_or_special].signbit(), exact[zero_or_special].signbit())  # -0.0 stays -0.0


@pytest.mark.parametrize("fn", [torch.expm1, lambda x: F.elu(x), lambda x: F.selu(x), lambda x: F.celu(x),
                                lambda x: F.elu(x, alpha=0.5)],
                         ids=["expm1", "elu", "selu", "celu", "elu_alpha"])
def test_expm1_activations_match_eager_and_call_no_libmvec_expm1(fn) -> None:
    x = torch.cat([torch.randn(7, 67) * 3, torch.tensor([[0.0, -0.0, float("-inf"), float("inf"), float("nan")] * 13
                                                         + [0.5, -0.5]])])
    c = check(fn, x)
    assert "kiln_expm1f_inline(" in c.cpp_source and "kiln_expm1f(" not in c.cpp_source.split("// kernel0")[1]


def test_double_expm1_keeps_libm() -> None:
    check(torch.expm1, torch.randn(5, 33, dtype=torch.float64))
