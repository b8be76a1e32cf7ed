"""Short rows and short contiguous dims in the C++ row and column kernels, against eager.

A row kernel over a short row whose length is no multiple of the vector runs it padded to whole
vectors, the lanes past the row's end masked (cpp_kernel._padded_row), and in tiles of rows whose
per-row scalar steps run in vector lanes (cpp_row_tiles.py); a sum across an NHWC layout runs with
its reduced rows outer only when each reduced point's kept values side by side fill a vector
(schedule.kept_inside), and a column kernel's tile narrower than TILE is its exact width.
These check the values (dtypes, NaN and infinities in the masked max, non-contiguous inputs, empty
and size-1 dims) and the shape of the generated loops; speed is measured by benchmarks, not here."""
from __future__ import annotations

import re

import pytest
import torch

from .conftest import check, compile_fn

pytestmark = pytest.mark.cpp

DEFAULT = {"atol": None, "rtol": None}  # assert_close's own tolerances for each dtype
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SHORT = [2, 3, 5, 7, 10, 12, 15, 17, 20, 31]


def _rows(shape: tuple[int, ...], dtype: torch.dtype, scale: float = 3.0) -> torch.Tensor:
    return (torch.randn(shape, dtype=torch.float32) * scale).to(dtype)


def _tol(dtype: torch.dtype) -> dict:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else DEFAULT


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SHORT)
def test_softmaxes_over_short_rows_are_as_eager(n: int, dtype: torch.dtype) -> None:
    x = _rows((9, n), dtype)
    check(lambda x: torch.softmax(x, -1), x, **DEFAULT)
    check(lambda x: torch.log_softmax(x, -1), x, **DEFAULT)
    check(lambda x: torch.softmax(x, -1), _rows((2, 3, 4, n), dtype), **DEFAULT)  # attention's (B, H, L, L)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("n", [3, 5, 10, 17])
def test_reductions_over_short_rows_are_as_eager(n: int, dtype: torch.dtype) -> None:
    x = _rows((11, n), dtype)
    check(lambda x: (x.sum(-1), x.amax(-1), x.amin(-1), x.mean(-1)), x, **_tol(dtype))
    check(lambda x: (x.var(-1), x.norm(dim=-1), (x * 0.25 + 1).prod(-1)), x, **_tol(dtype))


@pytest.mark.parametrize("n", [3, 10, 17])
def test_nan_and_infinities_in_a_padded_row_are_as_eager(n: int) -> None:
    # the lanes past the row's end add the reduction's identity: a NaN or an infinity in the row
    # still decides the max, a row of -inf is eager's NaN, the padded lanes never a NaN of their own
    x = _rows((6, n), torch.float32)
    x[0, n - 1] = float("nan")
    x[1] = float("-inf")
    x[2, 0] = float("inf")
    x[3, n // 2] = float("-inf")
    x[4] = -1e30
    for fn in (lambda x: torch.softmax(x, -1), lambda x: torch.log_softmax(x, -1),
               lambda x: (x.amax(-1), x.amin(-1), x.sum(-1))):
        check(fn, x, **DEFAULT)


def test_short_rows_of_non_contiguous_inputs_are_as_eager() -> None:
    base = _rows((20, 24), torch.float32)
    check(lambda x: torch.log_softmax(x[:, 3:13], -1), base, **DEFAULT)     # rows of 10, stride 24
    check(lambda x: torch.softmax(x.t()[:, :10], -1), base, **DEFAULT)      # transposed: rows strided
    check(lambda x: torch.softmax(x[::2, ::3], -1), base, **DEFAULT)        # rows of 8, every third
    check(lambda x: torch.log_softmax(x.view(20, 2, 12)[:, 1, :5] * 2, -1), base, **DEFAULT)


@pytest.mark.parametrize("shape", [(0, 10), (4, 0), (1, 10), (3, 1), (1, 1, 5), (2, 0, 7)], ids=str)
def test_empty_and_size_one_dims_are_as_eager(shape: tuple[int, ...]) -> None:
    x = _rows(shape, torch.float32)
    check(lambda x: torch.softmax(x, -1), x, **DEFAULT)
    check(lambda x: torch.log_softmax(x, -1), x, **DEFAULT)
    check(lambda x: x.sum(-1), x, **DEFAULT)


def test_a_short_row_loop_runs_whole_vectors_with_its_tail_masked() -> None:
    # 10 classes: one loop of 16 lanes per pass, loads and stores past the 10th lane masked (was a
    # loop of 10 that GCC finished with two scalar iterations, two scalar exps per row)
    compiled = check(lambda x: torch.log_softmax(x, -1), _rows((64, 10), torch.float32), **DEFAULT)
    kernel = compiled.cpp_source.split("// kernel0")[1]
    assert len(re.findall(r"for \(int64_t y0 = 0; y0 < 16; y0\+\+\)", kernel)) == 3
    assert "(y0 < 10 ? arg0[" in kernel and re.search(r"if \(y0 < 10\) buf\d+\[", kernel)
    # a row of a multiple of the vector, or long enough, keeps its own length
    for n in (16, 40):
        kernel = compile_fn(lambda x: torch.log_softmax(x, -1), _rows((64, n), torch.float32)).cpp_source
        assert f"y0 < {n}; y0++" in kernel and f"y0 < {n} ?" not in kernel


def _nhwc(n: int, c: int, h: int, w: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return _rows((n, c, h, w), dtype).contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("c", [1, 3, 4, 8, 24])
def test_reductions_of_nhwc_tensors_are_as_eager(c: int, dtype: torch.dtype) -> None:
    x = _nhwc(3, c, 9, 7, dtype)
    tol = {"atol": 1e-4, "rtol": 1e-5} if dtype == torch.float32 else DEFAULT
    check(lambda x: (x.sum((2, 3)), x.mean((2, 3), keepdim=True), x.amax((2, 3))), x, **tol)
    check(lambda x: (x.sum((0, 2, 3)), x.var((0, 2, 3)), x.mean((0, 2, 3), keepdim=True)), x, **tol)
    check(lambda x: (x.sum(1), x.mean(1, keepdim=True), x.amax(1), x.norm(dim=1)), x, **tol)
    if c > 1:  # a variance of one value: eager warns and gives NaN
        check(lambda x: x.var(1), x, **tol)


def test_a_sum_across_nhwc_with_fewer_channels_than_a_vector_runs_per_output() -> None:
    # 3 channels: rows outer (accumulators per thread over the whole [N, C] output) gave a row loop
    # of 3 lanes that visited all 16 images at each (h, w), 0.54x eager's speed; now per output
    compiled = check(lambda x: x.mean((2, 3)), _nhwc(16, 3, 20, 20), atol=1e-5, rtol=1e-5)
    assert "col_buf" not in compiled.cpp_source
    compiled = check(lambda x: x.sum((0, 2, 3)), _nhwc(4, 3, 10, 10), atol=1e-4, rtol=1e-5)
    assert "col_buf" not in compiled.cpp_source
    # a BatchNorm's statistics over 16 channels, and 8 channels per image, still run with rows outer
    compiled = check(lambda x: x.sum((0, 2, 3)), _nhwc(4, 16, 10, 10), atol=1e-4, rtol=1e-5)
    assert "col_buf" in compiled.cpp_source
    compiled = check(lambda x: x.sum((2, 3)), _nhwc(4, 8, 10, 10), atol=1e-4, rtol=1e-5)
    assert "col_buf" in compiled.cpp_source


def test_a_column_tile_narrower_than_a_full_tile_is_its_exact_width() -> None:
    # 4 channels per image summed over H and W: a tile of 4 outputs with a known trip count
    compiled = check(lambda x: x.sum((2, 3)), _nhwc(2, 4, 16, 16), atol=1e-4, rtol=1e-5)
    assert "const int64_t xn = 4;" in compiled.cpp_source and "[256]" not in compiled.cpp_source
    x = _rows((40, 300), torch.float32)
    compiled = check(lambda x: x.sum(0), x, atol=1e-4, rtol=1e-5)  # wider than a tile: tiles of 256
    assert "xt += 256" in compiled.cpp_source


@pytest.mark.parametrize("rows", [1, 15, 16, 37])
def test_a_log_softmax_over_short_rows_takes_its_logs_over_a_tile_of_rows(rows: int) -> None:
    # each row's log of its sum ran as one scalar libmvec call per row (a log_softmax over 512x16
    # floats at 0.82x eager's speed): now one simd loop over a tile of 16 rows, a partial last tile
    compiled = check(lambda x: torch.log_softmax(x, -1), _rows((rows, 12), torch.float32), **DEFAULT)
    kernel = compiled.cpp_source.split("// kernel0")[1]
    assert "xt += 16" in kernel and re.search(r"kiln_logf\(tile_\w+\[xi\]\)", kernel)
    dynamic = compile_fn(lambda x: torch.log_softmax(x, -1), _rows((rows + 2, 12), torch.float32), dynamic=True)
    for n in (1, 17, 40):
        x = _rows((n, 12), torch.float32)
        torch.testing.assert_close(dynamic(x)[0], torch.log_softmax(x, -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_row_tiles_of_other_row_kernels_are_as_eager(dtype: torch.dtype) -> None:
    # per-row scalar steps between passes: logsumexp's log, a layer norm's rsqrt, a scaled and
    # masked attention softmax over (B, H, L, L); rows of 3 to 100, outer dims several
    x = _rows((2, 3, 7, 20), dtype)
    check(lambda x: torch.logsumexp(x, -1), x, **DEFAULT)
    check(lambda x: torch.nn.functional.layer_norm(x, (20,)), x, **DEFAULT)
    check(lambda x: torch.softmax(x * 0.125 + torch.triu(torch.full((7, 20), -1e9), 1).to(x.dtype), -1), x, **DEFAULT)
    for n in (3, 100):
        y = _rows((33, n), dtype)
        check(lambda y: (torch.log_softmax(y, -1), y.amax(-1)), y, **DEFAULT)
        if dtype == torch.float32:  # half types: eager rounds the logsumexp first, Kiln does not (main too)
            check(lambda y: y - torch.logsumexp(y, -1, keepdim=True), y, **DEFAULT)
