"""exp of arguments far below its underflow (a causal softmax's masked -inf lanes): every lane gets +0
without libmvec's slow path, and a vector lane, a remainder and a scalar call still agree bit for bit."""
from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F

from kiln.runtime import build

from .conftest import check
from .ulp_check import check_float_fn, loops_source, ptr

pytestmark = pytest.mark.cpp

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exp_of_underflowing_lanes_is_plus_zero_in_every_loop(dtype: torch.dtype) -> None:
    t, fn = ("float", "kiln_expf") if dtype == torch.float32 else ("double", "kiln_exp")
    source = loops_source(t, fn)
    assert f"{fn}_w(" in source  # the vector variants go through the underflow guard
    lib = build.load(source)
    limit = -104.0 if dtype == torch.float32 else -746.0
    special = [float("-inf"), -1e30, limit - 0.5, limit, limit + 0.5, limit + 10, -1.0, 0.0, -0.0,
               float("nan"), float("inf"), 88.0]
    a = torch.tensor(special * 9, dtype=dtype)[:101]  # 101: vector body and a remainder both see each
    whole, alone = torch.empty_like(a), torch.empty_like(a)
    lib.scalar_loop(ptr(a), ptr(alone), ctypes.c_int64(a.numel()))
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    for start, n in ((0, 101), (1, 17), (5, 33), (7, 3)):
        lib.vector_loop(ptr(a[start:]), ptr(whole[start:]), ctypes.c_int64(n))
        assert torch.equal(whole[start:start + n].view(bits), alone[start:start + n].view(bits))
    low = a < limit
    assert torch.equal(alone[low].view(bits), torch.zeros_like(alone[low]).view(bits))  # +0, not -0
    torch.testing.assert_close(alone, a.exp(), equal_nan=True, rtol=1e-5 if t == "float" else 1e-12, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_softmax_values(dtype: torch.dtype) -> None:
    x = torch.randn(3, 37, 37, dtype=dtype)
    mask = torch.tril(torch.ones(37, 37, dtype=torch.bool))
    check(lambda x, m: F.softmax(x.masked_fill(~m, float("-inf")), -1), x, mask)
    check(lambda x, m: F.softmax(x.masked_fill(~m, torch.finfo(x.dtype).min), -1), x, mask)


def test_inline_float_exp_is_within_one_ulp_and_the_same_in_every_loop() -> None:
    # kernels compute float exp with kiln_expf_inline (no libmvec call): at most 1 ulp from the
    # correctly rounded result, denormal results included, and one result per input in a vector
    # lane, a remainder and a scalar loop
    gen = torch.Generator().manual_seed(0)
    a = torch.cat([torch.rand(200_003, generator=gen) * 193 - 104, torch.rand(50_000, generator=gen) * 20 - 104,
                   torch.tensor([float("-inf"), float("inf"), float("nan"), 0.0, -0.0, 88.72, 88.73, 89.0,
                                 -103.97, -104.0, -104.1, -1e30, 1e-30])])
    # correctly rounded (double exp is far more precise); 0, inf, NaN as exp
    check_float_fn("kiln_expf_inline", a, a.double().exp().float(), max_ulps=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_exp_and_sigmoid_values(dtype: torch.dtype) -> None:
    x = torch.randn(5, 67, dtype=dtype) * 30
    tol = {"atol": 1e-3, "rtol": 1e-3} if dtype == torch.float16 else {}
    c = check(lambda x: (x.exp(), torch.sigmoid(x), torch.softmax(x, -1)), x, **tol)
    if dtype == torch.float32:
        assert "kiln_expf_inline(" in c.cpp_source and "kiln_expf(" not in c.cpp_source.split("// kernel0")[1]
