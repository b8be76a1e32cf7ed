"""softmax and log_softmax of float16/bfloat16 tensors round as eager's do: ATen's CPU kernels
round differently along the last dim (softmax rounds once; log_softmax keeps each row's sum and its
log in the half type) than along another (softmax rounds once in the vectors of ATen's kernel and stores exp(x - max)
in the half type in its scalar tails, see the last tests; log_softmax rounds once), and the lowering (kiln/lower/lowerings/reductions.py) does as each does. A 1-ulp
difference in an attention's probabilities under bf16 autocast was the symptom."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .conftest import compile_fn

pytestmark = pytest.mark.cpp

SHAPES = [((64, 37), -1), ((64, 37), 0), ((8, 300), 1), ((3, 5000), -1), ((5, 7, 9), 1), ((5, 7, 9), 2), ((2, 3, 4, 33), -1), ((11,), 0)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_softmax_and_log_softmax_round_as_eagers(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    for shape, dim in SHAPES:
        limit = 0.01
        x = (torch.randn(*shape) * 3).to(dtype)
        strided = (torch.randn(*shape[::-1]) * 3).to(dtype).permute(*reversed(range(len(shape))))

        def fn(x: torch.Tensor, strided: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (x.softmax(dim), F.log_softmax(x, dim), strided.softmax(dim), F.log_softmax(strided, dim),
                    (x * 2).softmax(dim))

        def fused(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            # another reduction of x splits the softmax in two kernels: its row sums go through a
            # buffer, which must be float as ATen's are (a half-type one rounded them)
            return x.softmax(dim), x.sum()

        for g, e in zip(compile_fn(fused, x)(x), fused(x)):
            assert g.dtype == e.dtype and (g != e).float().mean() < limit, (shape, dim, (g != e).sum().item())
            torch.testing.assert_close(g, e)

        got = compile_fn(fn, x, strided)(x, strided)
        for k, (g, e) in enumerate(zip(got, fn(x, strided))):
            assert g.dtype == e.dtype
            # a row summed in another order than ATen's may cross a rounding by a float ulp (a few
            # elements in a thousand); a rounding of its own differed in a fifth of them
            assert (g != e).float().mean() < limit, (shape, dim, k, (g != e).sum().item())
            torch.testing.assert_close(g, e)


# inner sizes around ATen's vector widths (16 lanes of a half type with AVX2, 32 with AVX-512): 24 is
# a vector and a tail with AVX2, all tail with AVX-512; 37 cut over 2 or 3 threads moves the tails
OTHER_DIMS = [((64, 37), 0), ((40, 24), 0), ((3, 50, 40), 0), ((4, 30, 70), 1), ((2, 20, 3), 1), ((6, 5, 48), 1),
              ((33, 16), 0)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_softmax_along_another_dim_rounds_as_eagers_vectors_and_tails(dtype: torch.dtype) -> None:
    """ATen's CPU softmax of a half type along another dim than the last cuts the outer x inner
    positions evenly over its threads and walks each share in vectors of the ISA's width (kept in
    float, rounded once) that stay within a row, the rest scalar (each exponential rounded to the half
    type first): which elements round twice depends on the CPU (torch.backends.cpu.get_cpu_capability())
    and on torch.get_num_threads() at the call. Kiln's kernel follows both, bit for bit."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    try:
        for shape, dim in OTHER_DIMS:
            x = (torch.randn(*shape) * 3).to(dtype)
            compiled = compile_fn(lambda x: x.softmax(dim), x)
            for n in (1, 2, 3, 5):
                torch.set_num_threads(n)
                got, want = compiled(x)[0], x.softmax(dim)
                assert (got != want).sum().item() == 0, (shape, dim, n, (got != want).sum().item())
        # sizes as symbols: the kernel reads the rows and the positions at run time
        dynamic = compile_fn(lambda x: x.softmax(0), (torch.randn(40, 24) * 3).to(dtype), dynamic=True)
        for shape in ((40, 24), (7, 37), (3, 50)):
            x = (torch.randn(*shape) * 3).to(dtype)
            for n in (1, 2, 3):
                torch.set_num_threads(n)
                assert (dynamic(x)[0] != x.softmax(0)).sum().item() == 0, (shape, n)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("shape,dim", [((64, 37), 0), ((4, 30, 70), 1), ((3, 50, 40), 1), ((40, 24), 0)])
def test_float_softmax_along_another_dim_divides_as_eager(shape: tuple[int, ...], dim: int) -> None:
    """Along another dim than the last ATen's CPU softmax divides by the sum (along the last it
    multiplies by the sum's reciprocal): a reciprocal there put a quarter of the float32 results an
    ulp from eager's."""
    torch.manual_seed(0)
    x = torch.randn(*shape) * 3
    threads = torch.get_num_threads()
    # on one thread: ATen's scalar tails (the positions a thread's share leaves out of its vectors)
    # take the C library's exp (Kiln: libmvec's, see codegen/cpp.py), an ulp from the vectors' (Sleef) at
    # times, which moves a whole row's sum
    torch.set_num_threads(1)
    try:
        got, want = compile_fn(lambda x: x.softmax(dim), x)(x)[0], x.softmax(dim)
    finally:
        torch.set_num_threads(threads)
    # 24-28% with a reciprocal; the exp tails alone gave up to 4% on one CPU and 6.7% of (40, 24) on a
    # Sapphire Rapids (AVX-512 ATen, all within 2 ulp): the bound tells the two apart on both
    assert (got != want).float().mean() < 0.12, (got != want).sum().item()
    torch.testing.assert_close(got, want)
