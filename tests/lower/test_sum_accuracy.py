"""Accuracy of float sums in the C++ kernels against a float64 reference: whole-tensor sums, row,
column and multi-dim sums, mean, var, std, norms, over 1 to 10^6 elements, contiguous and strided,
static and symbolic sizes, float32 and bfloat16/float16 inputs summed in float. ATen's cascade sum
keeps 10^5 copies of 0.1 within 1e-7 relative; one float accumulator per vector lane lost 1.3e-4.
The bound, REL, is what a two-level sum (float partials over chunks, joined in double) keeps; the
compiled result is compared with the exact sum, not with eager's (which rounds differently)."""
from __future__ import annotations

from typing import Callable

import pytest
import torch

from .conftest import compile_fn

pytestmark = pytest.mark.cpp

REL = 3e-6


def _error(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, dynamic: bool = False) -> float:
    """The largest relative error of the compiled fn(x) against fn over x in float64."""
    got = compile_fn(fn, x, dynamic=dynamic)(x)[0]
    want = fn(x.double())
    assert got.dtype == fn(x).dtype and got.shape == want.shape
    return ((got.double() - want).abs() / want.abs().clamp_min(1e-30)).max().item()


def _tenths(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.full(shape, 0.1, dtype=dtype)


def _positive(*shape: int) -> torch.Tensor:
    return torch.rand(shape) + 0.5


SIZES = [1, 7, 100, 1023, 1025, 4097, 10**5, 10**6]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_whole_tensor_sum(n: int, dynamic: bool) -> None:
    assert _error(lambda x: x.sum(), _tenths(n), dynamic) < REL
    assert _error(lambda x: x.sum(), _positive(n), dynamic) < REL


@pytest.mark.parametrize("n", [10**5, 10**6])
def test_mean_and_sum_of_squares(n: int) -> None:
    x = _tenths(n)
    assert _error(lambda x: x.mean(), x) < REL
    assert _error(lambda x: (x * x).sum(), x) < REL
    assert _error(lambda x: (x * 3.0 + 1.0).sum(), _positive(n)) < REL


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_norms(dynamic: bool) -> None:
    x = torch.full((10**5,), 0.3)
    assert _error(lambda x: torch.linalg.vector_norm(x), x, dynamic) < REL
    assert _error(lambda x: torch.linalg.norm(x), x, dynamic) < REL
    assert _error(lambda x: x.abs().sum(), -x, dynamic) < REL


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_var_and_std(dynamic: bool) -> None:
    x = torch.arange(10**5, dtype=torch.float32) % 7 + 0.1
    assert _error(lambda x: x.var(), x, dynamic) < REL
    assert _error(lambda x: x.std(), x, dynamic) < REL
    assert _error(lambda x: torch.var_mean(x)[1], x, dynamic) < REL


@pytest.mark.parametrize("shape", [(4, 10**5), (64, 20000), (3, 1025), (2, 10**6)], ids=str)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_row_sums(shape: tuple[int, int], dynamic: bool) -> None:
    assert _error(lambda x: x.sum(-1), _tenths(*shape), dynamic) < REL
    assert _error(lambda x: x.mean(-1), _positive(*shape), dynamic) < REL


@pytest.mark.parametrize("shape", [(10**5, 4), (20000, 64), (1025, 3), (10**5, 300)], ids=str)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_column_sums(shape: tuple[int, int], dynamic: bool) -> None:
    assert _error(lambda x: x.sum(0), _tenths(*shape), dynamic) < REL
    assert _error(lambda x: x.mean(0), _positive(*shape), dynamic) < REL


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_sums_over_several_dims(dynamic: bool) -> None:
    x = _tenths(4, 300, 400)
    assert _error(lambda x: x.sum((1, 2)), x, dynamic) < REL
    assert _error(lambda x: x.sum((0, 2)), x, dynamic) < REL
    assert _error(lambda x: x.mean((0, 1)), x, dynamic) < REL


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_strided_inputs(dynamic: bool) -> None:
    x = _tenths(1000, 300)
    assert _error(lambda x: x.sum(), x.t(), dynamic) < REL
    assert _error(lambda x: x.sum(), x[:, ::2], dynamic) < REL
    assert _error(lambda x: x.sum(-1), x.t(), dynamic) < REL
    assert _error(lambda x: x.sum(0), x.t(), dynamic) < REL
    assert _error(lambda x: x.sum(), _tenths(3 * 10**5)[::3], dynamic) < REL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_summed_in_float(dtype: torch.dtype) -> None:
    x = _tenths(10**5, dtype=dtype)
    assert _error(lambda x: x.sum(dtype=torch.float32), x) < REL
    assert _error(lambda x: x.float().sum(), x) < REL
    assert _error(lambda x: x.sum(0, dtype=torch.float32), x.view(1000, 100)) < REL


def test_integer_sums_stay_exact() -> None:
    x = torch.randint(-1000, 1000, (10**6,), dtype=torch.int32)
    got = compile_fn(lambda x: x.sum(), x)(x)[0]
    assert got.dtype == torch.int64 and got.item() == int(x.long().sum())
    y = x.view(1000, 1000)
    assert torch.equal(compile_fn(lambda x: x.sum(0), y)(y)[0], y.sum(0))


@pytest.mark.parametrize("inner", [3, 8])
def test_sums_with_a_short_contiguous_inner_dim(inner: int) -> None:
    # the lanes of a short stride-1 dim (a group norm's channels of a group, NHWC) each add every
    # pixel: over 65536 pixels a float lane lost 1e-4 relative; they add in double from SUM_CHUNK up
    x = _tenths(2, 65536, inner).transpose(1, 2)  # sizes (2, inner, 65536), the short dim stride 1
    assert _error(lambda x: x.sum((1, 2)), x) < REL


def _layouts(gen: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
    """10^6 elements each: contiguous, transposed, channels-last (a long and a short stride-1 dim),
    and a slice with an offset."""
    return [gen(1000, 1000), gen(200, 5000).t(), gen(20000, 50).t(),
            gen(4, 1000, 250, 1).contiguous(memory_format=torch.channels_last),
            gen(2, 4, 500, 250).contiguous(memory_format=torch.channels_last),
            gen(2, 50, 100, 100).contiguous(memory_format=torch.channels_last),
            gen(1003, 1005)[3:, 5:]]


LAYOUT_REL = 1e-6


@pytest.mark.parametrize("k", range(7))
def test_whole_sums_of_every_layout(k: int) -> None:
    # a chunk's sum over a strided or channels-last run was one chain of 1024 float adds (GCC left
    # the simd reduction in order, and a strided loop does not vectorize): 9.5e-6 relative over
    # copies of 0.1; in lanes of their own, 3e-7
    x = _layouts(lambda *s: torch.full(s, 0.1))[k]
    for fn in (lambda x: x.sum(), lambda x: x.mean(), lambda x: torch.linalg.vector_norm(x), lambda x: (x * x).sum()):
        assert _error(fn, x) < LAYOUT_REL, (k, x.shape, x.stride())
    y = _layouts(lambda *s: torch.arange(torch.Size(s).numel(), dtype=torch.float32).reshape(s) % 7 + 0.1)[k]
    for fn in (lambda x: x.sum(), lambda x: x.mean(), lambda x: x.var(), lambda x: x.std()):
        assert _error(fn, y) < LAYOUT_REL, (k, y.shape, y.stride())

    # normal samples (these held before): a sum of both signs cancels, so its error is measured
    # against the sum of magnitudes
    torch.manual_seed(k)
    z = _layouts(lambda *s: torch.randn(*s))[k]
    got = compile_fn(lambda x: x.sum(), z)(z)[0].double()
    assert (got - z.double().sum()).abs().item() / z.double().abs().sum().item() < LAYOUT_REL / 10
    for fn in (lambda x: x.var(), lambda x: torch.linalg.vector_norm(x)):
        assert _error(fn, z) < LAYOUT_REL, (k, z.shape, z.stride())


@pytest.mark.parametrize("shape", [(1000, 1000), (20000, 50), (5000, 200)], ids=str)
def test_column_sums_within_a_millionth(shape: tuple[int, int]) -> None:
    # column_kernel's float accumulators took 128 rows before joining their double ones: 1.2e-6
    # relative over values 0.1 to 6.1 (eager 3.6e-7); 32 rows: 3e-7
    x = torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape) % 7 + 0.1
    assert _error(lambda x: x.sum(0), x) < LAYOUT_REL
    assert _error(lambda x: x.sum(-1), x.t().contiguous().t()) < LAYOUT_REL
    assert _error(lambda x: x.mean(0), x) < LAYOUT_REL
