"""A conversion to float16 or bfloat16 rounds to that precision even when its reader is fused into
the same kernel (half types compute in float32 there): x.half().float() is not x, as in eager.
torch.compile skips this rounding by default (its emulate_precision_casts is off); Kiln does not.
Checked bit for bit on the C++ path and, under Triton's interpreter, on the Triton path."""
from __future__ import annotations

import os

import pytest
import torch

from kiln import config
from tests.lower.conftest import check

HALVES = [torch.float16, torch.bfloat16]


def _round_trip(dtype: torch.dtype):
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.to(dtype).float() * 3 + 1
    return fn


@pytest.mark.cpp
@pytest.mark.parametrize("dtype", HALVES)
def test_round_trip_through_a_half_type_rounds(dtype: torch.dtype) -> None:
    x = torch.randn(7, 33) * 100
    compiled = check(_round_trip(dtype), x, atol=0, rtol=0)
    assert compiled.kernel_count == 1  # fused: the rounding happens inside the kernel


@pytest.mark.cpp
@pytest.mark.parametrize("dtype", HALVES)
def test_from_double_and_from_large_ints(dtype: torch.dtype) -> None:
    def from_double(x: torch.Tensor) -> torch.Tensor:
        return x.to(dtype).double() - x

    def from_int(n: torch.Tensor) -> torch.Tensor:
        return n.to(dtype).float() + 0.5

    check(from_double, torch.randn(40, dtype=torch.float64) * 1e3, atol=0, rtol=0)
    check(from_int, torch.arange(2040, 2100) * 7, atol=0, rtol=0)


@pytest.mark.cpp
def test_between_half_types() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).to(torch.float16).float()

    check(fn, torch.randn(64) * 10, atol=0, rtol=0)


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", HALVES)
def test_round_trip_rounds_on_the_triton_path(dtype: torch.dtype) -> None:
    pytest.importorskip("triton")
    with config.patch(cpu_backend="triton"):
        compiled = check(_round_trip(dtype), torch.randn(7, 33) * 100, atol=0, rtol=0)
    assert compiled.codegen == "triton"


@pytest.mark.cpp
@pytest.mark.parametrize("dtype", HALVES)
def test_a_half_result_read_as_float_is_rounded_first(dtype: torch.dtype) -> None:
    # the product is a half tensor in eager: .float() reads it rounded, not the float32 product
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x.to(dtype) * 0.1).float() + 1

    compiled = check(fn, torch.randn(9, 31) * 10, atol=0, rtol=0)
    assert compiled.kernel_count == 1


@pytest.mark.cpp
def test_a_half_result_times_a_dynamic_float() -> None:
    import kiln

    def fn(x: torch.Tensor, f: float) -> torch.Tensor:
        return (x.half() * f).float()

    kiln.reset()
    compiled = kiln.compile(fn)
    x = torch.randn(4, 16)
    for f in (0.5, 0.1, 0.3, 0.7):  # symbolic after the first change
        torch.testing.assert_close(compiled(x, f), fn(x, f), rtol=0, atol=0)


@pytest.mark.cpp
@pytest.mark.parametrize("dtype", HALVES)
def test_a_half_result_promoted_by_a_wider_operand_is_rounded_first(dtype: torch.dtype) -> None:
    # no explicit cast: `(h + i) + d` promotes the half sum to d's type, and eager rounded the sum
    # to the half type when it made it; a comparison and a where read it the same way
    def fn(h: torch.Tensor, i: torch.Tensor, d: torch.Tensor, f: torch.Tensor) -> tuple:
        s = h + i
        return (s + d, (h * 3) * f, torch.where(s > d, s, f), (s - d).abs(),
                (h * 0.1).sum(1, dtype=torch.float32), (h * 0.1).sum(dtype=torch.float64), (h * 0.1).argmax(1))

    h = (torch.randn(9, 31) * 10).to(dtype)
    i = torch.randint(-50, 50, (9, 31))
    d = torch.randn(9, 31, dtype=torch.float64)
    f = torch.randn(9, 31)
    check(fn, h, i, d, f, atol=0, rtol=0)
