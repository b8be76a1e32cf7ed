"""Shared by the tests of the prelude's elementwise math (test_exp_underflow, test_expm1_inline): one
function run over an array in a vectorized loop and in a scalar loop, the two compared bit for bit,
and its float results compared in ulps with the double-precision result."""
from __future__ import annotations

import ctypes

import torch

from kiln.lower.codegen.cpp import prelude
from kiln.runtime import build

_LOOPS = r"""
extern "C" void vector_loop(const {t}* a, {t}* out, int64_t n) {{
  #pragma omp simd
  for (int64_t i = 0; i < n; i++) out[i] = {fn}(a[i]);
}}
extern "C" void scalar_loop(const {t}* a, {t}* out, int64_t n) {{
  for (int64_t i = 0; i < n; i++) {{ volatile {t} x = a[i]; out[i] = {fn}(x); }}
}}
"""


def loops_source(t: str, fn: str) -> str:
    """C++ with the prelude and `vector_loop`/`scalar_loop(a, out, n)`: out[i] = fn(a[i]) over the
    C type `t`, the first as the kernels' `omp simd` loop, the second one call at a time."""
    body = _LOOPS.format(t=t, fn=fn)
    return prelude(body) + body


def ptr(x: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(x.data_ptr())


def check_float_fn(fn: str, a: torch.Tensor, exact: torch.Tensor, max_ulps: int, signs: bool = False) -> None:
    """The prelude's float `fn` over `a` (float32): the vector and the scalar loop give the same bits,
    each finite nonzero result is within `max_ulps` of `exact` (the double result rounded to float),
    zeros, infinities and NaN are exact's (after nan_to_num), and with `signs` so are their signs."""
    lib = build.load(loops_source("float", fn))
    whole, alone = torch.empty_like(a), torch.empty_like(a)
    lib.vector_loop(ptr(a), ptr(whole), ctypes.c_int64(a.numel()))
    lib.scalar_loop(ptr(a), ptr(alone), ctypes.c_int64(a.numel()))
    assert torch.equal(whole.view(torch.int32), alone.view(torch.int32))
    finite = torch.isfinite(exact) & (exact != 0)
    ulps = (whole.view(torch.int32).long() - exact.view(torch.int32).long()).abs()
    assert ulps[finite].max().item() <= max_ulps
    zero_or_special = ~finite
    assert torch.equal(whole[zero_or_special].nan_to_num(), exact[zero_or_special].nan_to_num())
    if signs:
        assert torch.equal(whole[zero_or_special].signbit(), exact[zero_or_special].signbit())  # -0.0 stays -0.0
