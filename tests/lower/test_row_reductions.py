"""Row kernels (softmax, log_softmax, a scaled and masked softmax, layer norm, sum and mean over the
last dim, the softmax backward) against eager with torch.testing.assert_close's default tolerances:
rows shorter than a vector, odd lengths, vocabulary-sized rows, fully masked rows (eager: NaN), large
magnitudes, and the floating dtypes. Speed is measured by the `softmax` bench workload, not here."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import kiln

from .conftest import check, compile_fn

pytestmark = pytest.mark.cpp

DEFAULT = {"atol": None, "rtol": None}  # assert_close's own tolerances for each dtype
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
SHAPES = [(5, 1), (4, 3), (3, 7), (6, 15), (2, 16), (3, 17), (2, 33), (4, 255), (2, 1001), (2, 5, 3, 19), (2, 32000)]


def _rows(shape: tuple[int, ...], dtype: torch.dtype, scale: float = 3.0) -> torch.Tensor:
    return (torch.randn(shape, dtype=torch.float32) * scale).to(dtype)


def _check_softmaxes(x: torch.Tensor) -> None:
    """softmax and log_softmax over the last dim as eager computes them, bfloat16 and half
    included (their log_softmax rounds its sum of exponentials where ATen's does:
    tests/lower/test_softmax_half.py)."""
    check(lambda x: torch.softmax(x, -1), x, **DEFAULT)
    check(lambda x: torch.log_softmax(x, -1), x, **DEFAULT)


# CI: every shape in float32, every dtype at (4, 255)
@pytest.mark.ci_slice({"shape": (4, 255), "dtype": torch.float32})
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_softmax_and_log_softmax(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    _check_softmaxes(_rows(shape, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1e-3, 30.0, 1e4, 1e30])
def test_softmax_of_large_and_tiny_magnitudes(scale: float, dtype: torch.dtype) -> None:
    x = _rows((6, 37), dtype, scale)
    x[0, 3] = torch.finfo(dtype).max
    x[1, 5] = torch.finfo(dtype).min
    x[2] = torch.finfo(dtype).min  # a whole row at the lowest finite value: exp(0) everywhere
    _check_softmaxes(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [3, 16, 37, 1024])
def test_fully_masked_rows_are_nan_as_in_eager(n: int, dtype: torch.dtype) -> None:
    x = _rows((5, n), dtype)
    x[1] = float("-inf")          # every lane masked: eager's 0/0
    x[2, : n // 2 + 1] = float("-inf")
    x[3, 0] = float("nan")
    x[4, n - 1] = float("inf")
    _check_softmaxes(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 3, 9, 9), (1, 2, 64, 64), (2, 1, 5, 130)], ids=str)
def test_scaled_and_masked_attention_softmax(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    scores = _rows(shape, dtype)
    causal = torch.ones(shape[-2], shape[-1], dtype=torch.bool).triu(1)
    mask = torch.zeros(shape[-2], shape[-1], dtype=dtype).masked_fill(causal, float("-inf"))
    mask[0] = float("-inf")  # the first query sees nothing: a NaN row
    check(lambda s, m: torch.softmax(s * 0.125 + m, -1), scores, mask, **DEFAULT)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 3), (3, 17), (4, 256), (2, 1001), (2, 4, 128)], ids=str)
def test_layer_norm_sum_and_mean_over_the_last_dim(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = _rows(shape, dtype)
    w, b = _rows(shape[-1:], dtype), _rows(shape[-1:], dtype)
    check(lambda x, w, b: F.layer_norm(x, shape[-1:], w, b), x, w, b, **DEFAULT)
    # a sum's rounding depends on its order (ATen and Kiln add in different orders): the tolerance
    # is the sum's own scale, not that of its (possibly cancelled) value
    tol = {"atol": 1e-5 * shape[-1] ** 0.5 * 3, "rtol": 1.3e-6} if dtype == torch.float32 else DEFAULT
    check(lambda x: (x.sum(-1), x.mean(-1)), x, **tol)


def test_a_half_precision_softmax_keeps_its_exponentials_in_float() -> None:
    # ATen's bfloat16 softmax keeps exp(x - max) in a float buffer and rounds once, at the end; a
    # bfloat16 row buffer rounded twice and disagreed with eager in a quarter of the elements
    x = _rows((64, 300), torch.bfloat16)
    compiled = check(lambda x: torch.softmax(x, -1), x, **DEFAULT)
    kernel = compiled.cpp_source.split("// kernel0")[1]
    assert "float buf" in kernel and "uint16_t buf1[" not in kernel
    got, expected = compiled(x)[0], torch.softmax(x, -1)
    assert (got != expected).float().mean().item() < 0.002


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 7), (4, 256), (2, 3, 33)], ids=str)
def test_softmax_backward_in_a_training_step(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = _rows(shape, dtype)
    x[0, 0] = float("-inf")  # a masked lane: its gradient is 0
    g = _rows(shape, dtype)

    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # log_softmax's half-precision forward is eager's own rounding (see _check_softmaxes)
        second = torch.log_softmax(x, -1) if dtype == torch.float32 else torch.softmax(x * 0.5, -1)
        return torch.softmax(x, -1), second

    results = []
    for fn in (kiln.compile(step), step):
        leaf = x.clone().requires_grad_()
        first, second = fn(leaf)
        (first * g + second * g).sum().backward()
        results.append((first.detach(), second.detach(), leaf.grad))
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected, equal_nan=True)


def test_a_row_kernel_source_is_one_kernel_per_softmax() -> None:
    compiled = compile_fn(lambda x: torch.softmax(x, -1), torch.randn(8, 40))
    assert compiled.cpp_source.count("extern \"C\" void kernel") == 1


@pytest.mark.parametrize("n", [7, 40, 1024, 5000])
def test_a_float_softmax_keeps_its_exponentials_in_its_output(n: int) -> None:
    # exp(x - max) is stored where the result goes and scaled there in place (no row buffer): the
    # pass that computes exp writes the output's cold lines (the last pass once waited on them)
    compiled = check(lambda x: torch.softmax(x, -1), _rows((6, n), torch.float32), **DEFAULT)
    kernel = compiled.cpp_source.split("// kernel0")[1]
    assert "alignas(64) float buf" not in kernel and "std::malloc" not in kernel
    out = re.search(r"return \((buf\d+),\)", compiled.wrapper_source)
    assert out is not None
    stores = re.findall(rf"{out.group(1)}\[[^\]]*\] = (t\d+);", kernel)
    exps = set(re.findall(r"float (t\d+) = kiln_expf", kernel))
    assert exps & set(stores) and len(stores) > len(exps & set(stores))  # exp stored there, then the scaled value
    compiled = compile_fn(lambda x: torch.softmax(x, -1), _rows((3, n), torch.float32), dynamic=True)
    assert "std::malloc" not in compiled.cpp_source.split("// kernel0")[1]
    x = _rows((5, n + 3), torch.float32)
    torch.testing.assert_close(compiled(x)[0], torch.softmax(x, -1))


@pytest.mark.parametrize("shape", [(2, 40, 40), (1, 128, 300)], ids=str)
def test_a_softmax_over_storage_it_may_take_over_is_as_eager(shape: tuple[int, ...]) -> None:
    # the matmul's result dies in the softmax, so the memory plan may give the softmax its storage:
    # read for good before the exponentials overwrite it, or (read again by the last pass) left alone
    q, k = torch.randn(shape), torch.randn(shape)
    check(lambda q, k: torch.softmax(q @ k.transpose(1, 2), -1), q, k, atol=1e-5, rtol=1e-4)
    check(lambda q, k: torch.softmax(q @ k.transpose(1, 2), -1) + q @ k.transpose(1, 2), q, k, atol=1e-4, rtol=1e-4)
    check(lambda q, k: torch.softmax(q @ k.transpose(1, 2) * 0.5, -1) * (q @ k.transpose(1, 2)), q, k,
          atol=1e-4, rtol=1e-4)


def test_a_row_reduction_prefetches_the_next_row_of_each_input_it_walks() -> None:
    # one prefetch loop per input that moves with the row (not the broadcast weight and bias), no
    # more than PREFETCH_ROW_BYTES of a long row; values as eager's
    x, w, b = torch.randn(6, 3000), torch.randn(3000), torch.randn(3000)
    compiled = check(lambda x, w, b: F.layer_norm(x, (3000,), w, b), x, w, b)
    prefetches = [line for line in compiled.cpp_source.splitlines() if "__builtin_prefetch" in line]
    assert len(prefetches) == 1 and "kiln_pf < 4096" in prefetches[0] and "+ 3000)" in prefetches[0]
    scores, mask = torch.randn(2, 40, 40), torch.randn(40, 40)
    compiled = check(lambda s, m: torch.softmax(s + m, -1), scores, mask)
    prefetches = [line for line in compiled.cpp_source.splitlines() if "__builtin_prefetch" in line]
    assert len(prefetches) == 2 and all("kiln_pf < 160" in line for line in prefetches)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_row_sums_add_in_lanes_then_as_a_tree_at_any_row_length(dtype: torch.dtype) -> None:
    # a row's float sum is added in SUM_LANES partial sums (GCC's simd reduction added its lanes one
    # by one after the loop) and a remainder loop; a dynamic row length decides both at run time
    compiled = compile_fn(lambda x: (x.sum(-1), torch.softmax(x, -1)), _rows((3, 40), dtype), dynamic=True)
    # two 512-bit registers of the narrowest type read: 64 lanes over bfloat16 (16 made GCC use
    # 256-bit vectors and keep the lanes in memory)
    lanes = 64 if dtype == torch.bfloat16 else 32
    assert re.search(rf"(float|double) lanes_acc_\w+\[{lanes}\] = ", compiled.cpp_source)
    for n in (1, 5, 16, 17, 37, 1000, 5000):  # 5000: chunks of blocks, then a remainder
        x = _rows((3, n), dtype)
        got = compiled(x)
        tol = {"atol": 1e-5 * n ** 0.5 * 3, "rtol": 1.3e-6} if dtype == torch.float32 else DEFAULT
        torch.testing.assert_close(got[0], x.sum(-1), **tol)
        torch.testing.assert_close(got[1], torch.softmax(x, -1))
    static = check(lambda x: x.sum(-1), _rows((4, 37), dtype), **DEFAULT)
    assert "kiln_lane < 37 - kiln_full" in static.cpp_source  # a remainder after the blocks


def test_a_long_row_sum_is_about_as_accurate_as_eager() -> None:
    # each lane adds the sums of chunks of blocks, not 2000 elements in one chain: over rows of
    # 32000 that lost 7x more than ATen's cascade sum (now within 2x of it)
    x = _rows((64, 32000), torch.float32)
    exact = x.double().sum(-1)
    got = compile_fn(lambda x: x.sum(-1), x)(x)[0]
    kiln_error = (got.double() - exact).abs().max().item()
    eager_error = (x.sum(-1).double() - exact).abs().max().item()
    assert kiln_error <= 3 * eager_error, (kiln_error, eager_error)


# CI: every dtype over the last dim of (5, 7), every shape and dim in float32 (tests/conftest.py)
@pytest.mark.ci_slice({"shape,dim": ((5, 7), -1), "dtype": torch.float32})
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.uint8])
@pytest.mark.parametrize("shape,dim", [((5, 7), -1), ((5, 7), 0), ((3, 4, 5), 1), ((6, 3000), -1), ((4, 1), -1),
                                       ((3,), 0)], ids=str)
def test_argmax_argmin_and_max_min_with_indices_are_eager_first_occurrences(shape: tuple[int, ...], dim: int,
                                                                           dtype: torch.dtype) -> None:
    # two vectorized passes (the extreme, then the least position holding it), no serial
    # (value, position) loop: ties, NaN (its first position wins), a row all -inf, whole-tensor forms
    x = _rows(shape, torch.float32).to(dtype) if dtype != torch.uint8 else (torch.rand(shape) * 5).to(dtype)
    if dtype.is_floating_point and x.numel() > 6:
        x.view(-1)[3] = float("nan")
        x.view(-1)[-1] = float("inf")
    ties = torch.randint(0, 3, shape).to(dtype)
    low = torch.full(shape, float("-inf")).to(dtype) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype)
    for fn in (lambda x: x.argmax(dim), lambda x: x.argmin(dim), lambda x: x.max(dim), lambda x: x.min(dim),
               lambda x: x.argmax(), lambda x: x.argmax(dim, keepdim=True), lambda x: x.argmin(None, keepdim=True)):
        for value in (x, ties, low):
            compiled = check(fn, value, atol=0, rtol=0)
            assert "best_" not in compiled.cpp_source


def test_a_max_with_its_index_over_a_computed_row_is_one_kernel() -> None:
    x = _rows((8, 300), torch.float32)
    compiled = check(lambda x: (x * 2 + 1).max(-1), x, atol=0, rtol=0)
    assert compiled.kernel_count == 1
