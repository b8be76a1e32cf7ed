"""Cumulative sums and products (Scan nodes): results against eager over dims, dtypes, layouts and
sizes, the work before them fused in, and no ATen fallback left."""
from __future__ import annotations

import pytest
import torch

from .conftest import check

pytestmark = pytest.mark.cpp


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_cumsum_and_cumprod_over_each_dim(dim: int) -> None:
    x = torch.rand(3, 4, 5) + 0.5
    c = check(lambda x: (torch.cumsum(x, dim), torch.cumprod(x, dim)), x, atol=1e-5, rtol=1e-5)
    assert c.extern_count == 0 and not c.perf_hints and c.kernel_count == 2


def test_pointwise_work_before_a_scan_is_fused_into_it() -> None:
    c = check(lambda x: torch.cumsum(x.exp() * 2, 1), torch.randn(5, 8), atol=1e-5, rtol=1e-5)
    assert c.kernel_count == 1 and c.extern_count == 0
    assert "exp, mul, cumsum" in c.cpp_source


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64, torch.uint8, torch.bool,
                                   torch.bfloat16, torch.float16])
def test_scan_dtypes_follow_aten(dtype: torch.dtype) -> None:
    x = (torch.rand(4, 9) * 3).to(dtype) if dtype != torch.bool else torch.rand(4, 9) > 0.5
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype in (torch.bfloat16, torch.float16) else {}
    check(lambda x: (torch.cumsum(x, 1), torch.cumprod(x, 0)), x, **tol)
    # the dtype argument casts before accumulating
    check(lambda x: torch.cumsum(x, 1, dtype=torch.float64), x)


def test_integer_cumprod_wraps_like_aten() -> None:
    x = torch.full((2, 40), 7, dtype=torch.int32)
    check(lambda x: (torch.cumprod(x, 1), torch.cumsum(x, 1, dtype=torch.int32) * 1000000), x)


def test_float32_sum_accumulates_in_double_like_aten() -> None:
    # 1 + many tiny values: a float accumulator would lose them, ATen's double accumulator does not
    x = torch.full((1, 4096), 1e-8)
    x[0, 0] = 1.0
    c = check(lambda x: torch.cumsum(x, 1), x, atol=0, rtol=0)
    assert "double acc" in c.cpp_source


def test_scan_of_non_contiguous_inputs() -> None:
    x = torch.randn(6, 10)
    check(lambda x: torch.cumsum(x.t(), 1), x, atol=1e-5, rtol=1e-5)
    check(lambda x: torch.cumsum(x[::2, 1:], 0), x, atol=1e-5, rtol=1e-5)
    check(lambda x: torch.cumprod(x.t()[:, ::3], 0), x, atol=1e-5, rtol=1e-5)
    check(lambda x: torch.cumsum(x.expand(3, 6, 10), 0), x, atol=1e-5, rtol=1e-5)


def test_scan_edge_sizes_and_special_values() -> None:
    check(lambda x: torch.cumsum(x, 0), torch.tensor(2.5))  # 0-d
    check(lambda x: torch.cumsum(x, 0), torch.randn(17), atol=1e-5, rtol=1e-5)  # 1-d, no outer loop
    check(lambda x: torch.cumsum(x, 1), torch.randn(3, 0))  # nothing to scan
    x = torch.tensor([[1.0, float("nan"), 2.0], [float("inf"), -float("inf"), 1.0], [0.0, -0.0, 3.0]])
    check(lambda x: (torch.cumsum(x, 1), torch.cumprod(x, 1), torch.cumprod(x, 0)), x)


def test_large_scan_runs_parallel_over_the_other_dims() -> None:
    c = check(lambda x: torch.cumsum(x, 1), torch.randn(512, 128), atol=1e-4, rtol=1e-5)
    assert "#pragma omp parallel for" in c.cpp_source.split("kiln_float_to_bf16")[-1]


def test_scan_with_symbolic_sizes() -> None:
    c = check(lambda x: torch.cumsum(x * 2, 0), torch.randn(5, 7), dynamic=True, atol=1e-5, rtol=1e-5)
    for shape in [(3, 4), (9, 2)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(c(x)[0], torch.cumsum(x * 2, 0), atol=1e-5, rtol=1e-5)


def test_scan_along_strided_rows_is_tiled_over_the_contiguous_dim() -> None:
    # a cumsum over dim 0 of a row-major matrix scans a tile of columns at once (a simd loop across
    # the tile inside the loop down the rows), each column's adds in eager's order: equal bits
    x = torch.randn(300, 256)
    c = check(lambda x: torch.cumsum(x, 0), x, atol=0, rtol=0)
    kernel = c.cpp_source.split("// kernel0")[1]
    assert "xt += 16" in kernel and "double acc[16]" in kernel, kernel
    wide = check(lambda x: torch.cumsum(x, 0), torch.randn(40, 4096), atol=0, rtol=0)
    assert "xt += 64" in wide.cpp_source.split("// kernel0")[1]  # 64 tiles of 64 columns
    rows = check(lambda x: torch.cumsum(x, 1), torch.randn(300, 256), atol=0, rtol=0)
    assert "xt +=" not in rows.cpp_source.split("// kernel0")[1]  # along rows: no tile


def test_scans_along_rows_run_four_rows_side_by_side() -> None:
    # four independent chains of adds interleaved in one loop, then the rows left over one by one;
    # each row's adds in eager's order: equal bits
    c = check(lambda x: torch.cumsum(x, 1), torch.randn(7, 300), atol=0, rtol=0)
    kernel = c.cpp_source.split("// kernel0")[1]
    assert "xg += 4" in kernel and "acc3 +=" in kernel, kernel
    assert "for (int64_t x0 = 4; x0 < 7; x0++)" in kernel, kernel  # the three rows left over
    even = check(lambda x: torch.cumsum(x, -1), torch.randn(8, 33), atol=0, rtol=0)
    assert "acc +=" not in even.cpp_source.split("// kernel0")[1]  # no rows left over: no second loop
    few = check(lambda x: torch.cumsum(x, 1), torch.randn(3, 40), atol=0, rtol=0)
    assert "xg +=" not in few.cpp_source.split("// kernel0")[1]  # fewer rows than a group


@pytest.mark.parametrize("shape,dim", [((5, 9), 1), ((2, 3, 11), 2), ((6, 4, 3), 1), ((9, 2, 5), -1), ((13, 1), 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.bfloat16])
def test_scans_along_rows_match_eager(shape: tuple[int, ...], dim: int, dtype: torch.dtype) -> None:
    x = (torch.randn(shape) * 3).to(dtype)
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 0, "rtol": 0}
    check(lambda x: torch.cumsum(x, dim), x, **tol)
    if dtype in (torch.float32, torch.float64):
        check(lambda x: torch.cumprod(x.sigmoid() + 0.5, dim), x, atol=1e-5, rtol=1e-5)


def test_scans_along_rows_of_symbolic_sizes_match_eager() -> None:
    c = check(lambda x: torch.cumsum(x[1:, ::2] * 2, -1), torch.randn(11, 30), dynamic=True, atol=1e-5, rtol=1e-5)
    assert "xg +=" in c.cpp_source.split("// kernel0")[1]
    for rows, cols in [(3, 8), (10, 31), (2, 2), (6, 17)]:
        y = torch.randn(rows, cols)
        torch.testing.assert_close(c(y)[0], torch.cumsum(y[1:, ::2] * 2, -1), atol=1e-5, rtol=1e-5)


# CI: every shape in float32, every dtype at (40, 17)
@pytest.mark.ci_slice({"shape,dim": ((40, 17), 0), "dtype": torch.float32})
@pytest.mark.parametrize("shape,dim", [((3, 5), 0), ((40, 17), 0), ((7, 100), 0), ((4, 6, 33), 0),
                                       ((4, 6, 33), 1), ((2, 70, 3, 20), 1), ((1, 1), 0), ((33, 1), 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.bool])
def test_tiled_scans_match_eager(shape: tuple[int, ...], dim: int, dtype: torch.dtype) -> None:
    x = (torch.randn(shape) * 3).to(dtype) if dtype != torch.bool else torch.rand(shape) > 0.5
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {"atol": 0, "rtol": 0}
    check(lambda x: torch.cumsum(x, dim), x, **tol)
    if dtype in (torch.float32, torch.float64):
        check(lambda x: torch.cumprod(x.sigmoid() + 0.5, dim), x, atol=1e-5, rtol=1e-5)


def test_tiled_scans_of_views_and_symbolic_sizes_match_eager() -> None:
    base = torch.randn(50, 90)
    check(lambda x: torch.cumsum(x[3:, 5:70:2], 0), base, atol=0, rtol=0)  # offset, strided columns
    check(lambda x: torch.cumsum(x.t().contiguous().t()[:, 1:], 0), base, atol=0, rtol=0)
    check(lambda x: torch.cumsum(x.exp() * 2, 0), base, atol=1e-4, rtol=1e-5)  # a fused producer
    c = check(lambda x: torch.cumsum(x, 0), torch.randn(6, 21), dynamic=True, atol=0, rtol=0)
    assert "xt +=" in c.cpp_source.split("// kernel0")[1]
    for shape in [(3, 4), (9, 37), (1, 80), (70, 16)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(c(x)[0], torch.cumsum(x, 0), atol=0, rtol=0)
