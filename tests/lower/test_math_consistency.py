"""One input, one result: a math function gives the same bits in a vector lane, a loop remainder and
a scalar loop, so values recomputed in another kernel (or the backward graph) match the saved ones.

A max / amax backward finds the maximum again with eq(saved max, recomputed input): with glibc's
scalar expf in a loop's remainder and libmvec's vector expf in its body (each rounding differently
on some inputs), a column could hold no match, and its gradient became 0/0 = NaN.
"""
from __future__ import annotations

import ctypes

import pytest
import torch

import kiln
from kiln.lower.codegen.cpp import MATH, MATH2, prelude
from kiln.runtime import build

from .conftest import check

pytestmark = pytest.mark.cpp

_LOOPS = r"""
extern "C" void vector_loop(const {t}* a, const {t}* b, {t}* out, int64_t n) {{
  #pragma omp simd
  for (int64_t i = 0; i < n; i++) out[i] = {call};
}}
extern "C" void scalar_loop(const {t}* a, const {t}* b, {t}* out, int64_t n) {{
  for (int64_t i = 0; i < n; i++) {{ volatile {t} x = a[i], y = b[i]; out[i] = {scalar}; }}
}}
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_math_function_agrees_between_vector_lanes_remainders_and_scalar_loops(dtype: torch.dtype) -> None:
    t = "float" if dtype == torch.float32 else "double"
    names = [n for n in (*MATH, *MATH2) if not (n == "erf" and t == "float")]  # float erf is inline code
    kernels = []
    for k, name in enumerate(names):
        fn = f"kiln_{name}f" if t == "float" else f"kiln_{name}"
        args = "a[i], b[i]" if name in MATH2 else "a[i]"
        src = _LOOPS.format(t=t, call=f"{fn}({args})", scalar=f"{fn}({'x, y' if name in MATH2 else 'x'})")
        kernels.append(src.replace("vector_loop", f"vector_{k}").replace("scalar_loop", f"scalar_{k}"))
    body = "\n".join(kernels)
    lib = build.load(prelude(body) + body)
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(203, generator=gen, dtype=dtype) * 1.8 + 0.05  # inside every function's domain
    b = torch.rand(203, generator=gen, dtype=dtype) * 3 + 0.1
    a[::7] *= 40  # and large arguments (exp overflows, sin reduces its range)
    whole, alone = torch.empty_like(a), torch.empty_like(a)

    def ptr(x: torch.Tensor) -> ctypes.c_void_p:
        return ctypes.c_void_p(x.data_ptr())

    for k, name in enumerate(names):
        getattr(lib, f"scalar_{k}")(ptr(a), ptr(b), ptr(alone), ctypes.c_int64(a.numel()))
        for start, n in ((0, 203), (3, 1), (5, 7), (1, 17), (9, 33), (2, 100)):
            getattr(lib, f"vector_{k}")(ptr(a[start:]), ptr(b[start:]), ptr(whole[start:]), ctypes.c_int64(n))
            assert torch.equal(whole[start:start + n].view(torch.int32 if t == "float" else torch.int64),
                               alone[start:start + n].view(torch.int32 if t == "float" else torch.int64)), name
        expected = getattr(torch, {"pow": "pow", "atan2": "atan2", "hypot": "hypot"}.get(name, name))
        want = expected(a, b) if name in MATH2 else expected(a)
        torch.testing.assert_close(alone, want, equal_nan=True, rtol=1e-5 if t == "float" else 1e-12, atol=0)


def test_a_saved_exp_and_the_amax_over_it_agree_in_a_fused_kernel() -> None:
    # the saved exp (for the backward) and the value the amax reduces must be the same bits: the
    # pointwise node runs in the reduction's loop order (not transposed), so both come from one load
    x = torch.randn(7, 5, 5)
    c = check(lambda x: (x.exp(), (x.exp() * 3).amax(0)), x)
    e, m = c(x)
    assert torch.equal((e * 3).amax(0), m)
    assert "buf1[x0 + 5 * x1" not in c.cpp_source  # the store walks memory in the reduction's order


@pytest.mark.parametrize("shape", [(7, 5, 5), (3, 11, 17), (9, 13, 3)])
@pytest.mark.parametrize("case", ["saved", "recomputed"])
def test_amax_gradient_over_exp_has_no_nan(shape: tuple[int, ...], case: str) -> None:
    # "saved": exp is saved for the backward; "recomputed": the partitioner recomputes exp in the
    # backward, in two kernels with other loop shapes than the forward's
    def saved(x: torch.Tensor) -> torch.Tensor:
        return (x.exp() * 3).amax(0)

    def recomputed(x: torch.Tensor) -> torch.Tensor:
        return x.exp().amax(1) + x.sin().sum()

    fn = saved if case == "saved" else recomputed
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(590), requires_grad=True)
    (grad,) = torch.autograd.grad(fn(x).sum(), x)
    kiln.reset()
    compiled = kiln.compile(fn, backend="inductor", dynamic=False)
    x2 = x.detach().clone().requires_grad_()
    (got,) = torch.autograd.grad(compiled(x2).sum(), x2)
    assert not got.isnan().any()
    torch.testing.assert_close(got, grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_negative_zero_keeps_its_sign_through_the_scalar_math_functions(dynamic: bool) -> None:
    # a loop that does not vectorize (5 elements, or a symbolic length) calls each libmvec function
    # on its argument splat into a register: `0 + x` made -0.0 into +0.0, so pow(-0.0, -1) was +inf
    # (eager: -inf) and sin/tan/expm1/log1p/asinh/tanh/atan of -0.0 were +0.0
    x = torch.tensor([0.0, -0.0, 1.0, -0.0, -0.0])
    y = torch.tensor([0.0, -1.0, 2.0, 3.0, 2.0])

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x ** y, x.sin(), x.tan(), x.expm1(), x.log1p(), x.asinh(), x.tanh(), x.atan()

    kiln.reset()
    for got, want in zip(kiln.compile(fn, dynamic=dynamic)(x, y), fn(x, y)):
        # the values within an ulp (tan(1) differs by one between eager's AVX2 and AVX-512 kernels),
        # the signs exact
        torch.testing.assert_close(got, want, rtol=3e-7, atol=0)
        assert torch.equal(got.signbit(), want.signbit()), (got, want)
