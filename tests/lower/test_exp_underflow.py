"""exp of arguments far below its underflow (a causal softmax's masked -inf lanes): every lane gets +0
without libmvec's slow path, and a vector lane, a remainder and a scalar call still agree bit for bit."""
from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F

from kiln.lower.codegen.cpp import prelude
from kiln.runtime import build

from .conftest import check

pytestmark = pytest.mark.cpp

_LOOPS = r"""
extern "C" void vector_loop(const {t}* a, {t}* out, int64_t n) {{
  #pragma omp simd
  for (int64_t i = 0; i < n; i++) out[i] = {fn}(a[i]);
}}
extern "C" void scalar_loop(const {t}* a, {t}* out, int64_t n) {{
  for (int64_t i = 0; i < n; i++) {{ volatile {t} x = a[i]; out[i] = {fn}(x); }}
}}
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exp_of_underflowing_lanes_is_plus_zero_in_every_loop(dtype: torch.dtype) -> None:
    t, fn = ("float", "kiln_expf") if dtype == torch.float32 else ("double", "kiln_exp")
    body = _LOOPS.format(t=t, fn=fn)
    source = prelude(body) + body
    assert f"{fn}_w(" in source  # the vector variants go through the underflow guard
    lib = build.load(source)
    limit = -104.0 if dtype == torch.float32 else -746.0
    special = [float("-inf"), -1e30, limit - 0.5, limit, limit + 0.5, limit + 10, -1.0, 0.0, -0.0,
               float("nan"), float("inf"), 88.0]
    a = torch.tensor(special * 9, dtype=dtype)[:101]  # 101: vector body and a remainder both see each
    whole, alone = torch.empty_like(a), torch.empty_like(a)

    def ptr(x: torch.Tensor) -> ctypes.c_void_p:
        return ctypes.c_void_p(x.data_ptr())

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
