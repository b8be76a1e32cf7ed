"""Backward-pass fusions: a sum over the rows of what a kernel makes (a linear layer's bias gradient,
a layer norm's weight and bias gradients) is accumulated per thread inside that kernel
(schedule.column_substitution) instead of reading the gradient back in a kernel of its own."""
from __future__ import annotations

import pytest
import torch

from kiln.lower.schedule import Kernel, format_program

from .conftest import check

pytestmark = pytest.mark.cpp

aten = torch.ops.aten
DTYPES = [torch.float32, torch.float64]


def _tol(dtype: torch.dtype) -> dict:
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-10, "rtol": 1e-10}


def _columns(c) -> set[str]:  # type: ignore[no-untyped-def]
    return {name for s in c.program.steps if isinstance(s, Kernel) for name in s.columns}


def gelu_backward_with_bias_grad(g: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gx = aten.gelu_backward(g, x)
    return gx, gx.sum(0)


def layer_norm_backward(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                        residual: torch.Tensor) -> tuple[torch.Tensor, ...]:
    c = x.shape[-1]
    _, mean, rstd = aten.native_layer_norm(x, [c], w, b, 1e-5)
    dx, dw, db = aten.native_layer_norm_backward(g, x, [c], mean, rstd, w, b, [True, True, True])
    grad = dx + residual  # the residual stream's gradient, and the bias gradient of the layer before
    return grad, dw, db, grad.sum(0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 53), (1, 29), (300, 129), (5, 1)])
def test_bias_gradient_sums_inside_the_kernel_that_makes_the_gradient(dtype: torch.dtype, shape: tuple) -> None:
    # (300, 129): enough work for the parallel loop, each thread summing its rows
    g, x = torch.randn(*shape, dtype=dtype), torch.randn(*shape, dtype=dtype)
    c = check(gelu_backward_with_bias_grad, g, x, **_tol(dtype))
    assert c.kernel_count == 1, format_program(c.program)
    assert len(_columns(c)) == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 53), (1, 64), (300, 129)])
def test_layer_norm_backward_is_one_kernel(dtype: torch.dtype, shape: tuple) -> None:
    g, x, r = (torch.randn(*shape, dtype=dtype) for _ in range(3))
    w, b = torch.randn(shape[-1], dtype=dtype), torch.randn(shape[-1], dtype=dtype)
    c = check(layer_norm_backward, g, x, w, b, r, **_tol(dtype))
    # row sums of g*w and g*w*xhat, the input gradient, and three column sums: one pass over the rows
    assert c.kernel_count == 1, format_program(c.program)
    assert len(_columns(c)) == 3


def test_layer_norm_backward_over_batch_and_time_sums_both_dims() -> None:
    # a [B, T, C] gradient: the weight gradient sums over B and T, which are the kernel's outer dims
    g, x, r = (torch.randn(3, 7, 24) for _ in range(3))
    w, b = torch.randn(24), torch.randn(24)

    def fn(g, x, w, b, r):  # type: ignore[no-untyped-def]
        _, mean, rstd = aten.native_layer_norm(x, [24], w, b, 1e-5)
        dx, dw, db = aten.native_layer_norm_backward(g, x, [24], mean, rstd, w, b, [True, True, True])
        return dx + r, dw, db, (dx + r).sum((0, 1))

    c = check(fn, g, x, w, b, r, atol=1e-4, rtol=1e-4)
    assert c.kernel_count == 1, format_program(c.program)


@pytest.mark.parametrize("dtype", DTYPES)
def test_column_sums_with_dynamic_shapes(dtype: torch.dtype) -> None:
    g, x = torch.randn(41, 19, dtype=dtype), torch.randn(41, 19, dtype=dtype)
    c = check(gelu_backward_with_bias_grad, g, x, dynamic=True, **_tol(dtype))
    assert c.kernel_count == 1 and len(_columns(c)) == 1
    for shape in [(7, 19), (1, 19), (300, 131)]:  # the same compiled graph at other sizes
        g, x = torch.randn(*shape, dtype=dtype), torch.randn(*shape, dtype=dtype)
        for got, want in zip(c(g, x), gelu_backward_with_bias_grad(g, x)):
            torch.testing.assert_close(got, want, **_tol(dtype))


def test_a_column_sum_is_not_read_inside_its_own_kernel() -> None:
    # the sum is complete only after every row: what reads it runs in a later kernel
    def fn(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = g * g.sum(1, keepdim=True)  # a row kernel makes h, and sums it over the rows
        s = h.sum(0)
        return h, h + s

    c = check(fn, torch.randn(33, 17), atol=1e-4, rtol=1e-5)
    assert c.kernel_count == 2 and len(_columns(c)) == 1, format_program(c.program)


def test_column_sums_are_the_same_every_run_on_two_threads() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g, x = torch.randn(500, 257), torch.randn(500, 257)
        c = check(gelu_backward_with_bias_grad, g, x, atol=1e-4, rtol=1e-4)
        first = c(g, x)[1]
        for _ in range(5):
            assert torch.equal(c(g, x)[1], first)  # threads' rows are added in thread order
    finally:
        torch.set_num_threads(threads)


def embedding_backward(g: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return aten.embedding_dense_backward(g, idx, 50, -1, False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_serial_embedding_backward_adds_without_atomics(dtype: torch.dtype) -> None:
    idx = torch.randint(0, 50, (3, 37))
    idx[0, :5] = 7  # repeated rows accumulate
    g = torch.randn(3, 37, 19, dtype=dtype)
    c = check(embedding_backward, g, idx, **_tol(dtype))
    assert "+=" in c.cpp_source and "omp atomic" not in c.cpp_source


def test_parallel_embedding_backward_adds_atomically() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        idx = torch.randint(0, 50, (8, 64))  # 8 * 64 * 80 elements: the parallel loop
        g = torch.randn(8, 64, 80)
        c = check(embedding_backward, g, idx, atol=1e-4, rtol=1e-4)
        assert "omp atomic" in c.cpp_source
        torch.set_num_threads(1)  # the same kernel on one thread takes its loop without atomics
        torch.testing.assert_close(c(g, idx)[0], embedding_backward(g, idx), atol=1e-4, rtol=1e-4)
    finally:
        torch.set_num_threads(threads)
    scatter = next(part for part in c.cpp_source.split("\n// ") if "omp atomic" in part)
    plain = scatter.split("} else {")[1]
    assert "+=" in plain and "omp atomic" not in plain


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_recomputed_beside_its_backward_computes_erf_once(dtype: torch.dtype) -> None:
    # the backward recomputes the GELU output (for the next weight gradient) in the kernel of the
    # GELU gradient; both need erf(x / sqrt(2)) at the same element
    def fn(g: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return aten.gelu(x), aten.gelu_backward(g, x)

    g, x = torch.randn(13, 67, dtype=dtype), torch.randn(13, 67, dtype=dtype)
    c = check(fn, g, x, **_tol(dtype))
    assert c.kernel_count == 1
    kernels = c.cpp_source.split("// kernel0")[1]
    assert kernels.count("kiln_erf") == 1, kernels


def cross_entropy_backward(logp: torch.Tensor, target: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    total = (target != -100).sum().to(logp.dtype)
    grad = aten.nll_loss_backward(g, logp, target, None, 1, -100, total)
    return aten._log_softmax_backward_data(grad, logp, 1, logp.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [7, 300])
def test_row_invariant_values_are_computed_before_the_inner_loop(dtype: torch.dtype, rows: int) -> None:
    # 300 x 129: the parallel loop, where GCC left the simd loop scalar when it tested each row's
    # target (and the loss scale read through a pointer) inside it
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        logp = torch.log_softmax(torch.randn(rows, 129, dtype=dtype), 1)
        target = torch.randint(0, 129, (rows,))
        target[::5] = -100
        c = check(cross_entropy_backward, logp, target, torch.tensor(1.5, dtype=dtype), **_tol(dtype))
    finally:
        torch.set_num_threads(threads)
    kernel = next(part for part in c.cpp_source.split("\n// ") if "exp" in part and "omp simd" in part)
    assert kernel.index("!= int64_t(-100LL)") < kernel.index("#pragma omp simd"), kernel


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_backward_values(dtype: torch.dtype, reduction: int, weighted: bool) -> None:
    logp = torch.log_softmax(torch.randn(13, 7, dtype=dtype), 1)
    target = torch.randint(0, 7, (13,))
    target[::4] = -100
    weight = torch.rand(7, dtype=dtype) + 0.5 if weighted else None
    g = torch.randn(13, dtype=dtype) if reduction == 0 else torch.tensor(0.7, dtype=dtype)
    total = (weight[target.clamp(min=0)] * (target != -100)).sum() if weighted else (target != -100).sum().to(dtype)

    def fn(g, logp, target, total, *w):  # type: ignore[no-untyped-def]
        return aten.nll_loss_backward(g, logp, target, w[0] if w else None, reduction, -100, total)

    check(fn, g, logp, target, total, *([weight] if weighted else []), **_tol(dtype))


def test_nll_loss_backward_of_one_sample() -> None:
    logp = torch.log_softmax(torch.randn(9), 0)

    def fn(g: torch.Tensor, logp: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return aten.nll_loss_backward(g, logp, target, None, 1, -100, torch.tensor(1.0))

    check(fn, torch.tensor(1.3), logp, torch.tensor(4))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_backward_is_one_kernel(dtype: torch.dtype) -> None:
    # no zero-filled [rows, classes] buffer scattered into and read back: one pass over the rows
    logp = torch.log_softmax(torch.randn(37, 29, dtype=dtype), 1)
    target = torch.randint(0, 29, (37,))
    target[3] = -100
    c = check(cross_entropy_backward, logp, target, torch.tensor(1.5, dtype=dtype), **_tol(dtype))
    assert c.kernel_count == 2, format_program(c.program)  # the count of kept rows, and the gradient


def test_cross_entropy_backward_with_dynamic_shapes() -> None:
    logp = torch.log_softmax(torch.randn(37, 29), 1)
    target = torch.randint(0, 29, (37,))
    c = check(cross_entropy_backward, logp, target, torch.tensor(1.5), dynamic=True, atol=1e-5, rtol=1e-5)
    logp, target = torch.log_softmax(torch.randn(5, 11), 1), torch.randint(0, 11, (5,))
    torch.testing.assert_close(c(logp, target, torch.tensor(1.5))[0], cross_entropy_backward(logp, target, torch.tensor(1.5)))


@pytest.mark.parametrize("shape", [(37, 53), (300, 129), (3, 20000)])
def test_column_sums_beside_a_row_buffer(shape: tuple) -> None:
    # softmax keeps its exponentials in a per-thread row buffer (read again by its last loop);
    # (3, 20000): a row buffer too large for the stack, allocated per thread in the parallel region
    def fn(g: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.softmax(g, 1) * x
        return out, out.sum(0)

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        c = check(fn, torch.randn(*shape), torch.rand(*shape) + 0.5, atol=1e-5, rtol=1e-4)
    finally:
        torch.set_num_threads(threads)
    assert c.kernel_count == 1 and len(_columns(c)) == 1, format_program(c.program)
    assert any(s.scratch for s in c.program.steps if isinstance(s, Kernel))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_column_sums_accumulate_in_float(dtype: torch.dtype) -> None:
    def fn(g: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.softmax(g, 1) * x
        return out, out.sum(0)

    g, x = torch.randn(65, 33, dtype=dtype), torch.randn(65, 33, dtype=dtype)
    c = check(fn, g, x, atol=3e-2, rtol=2e-2)
    assert len(_columns(c)) == 1, format_program(c.program)
    assert "float* __restrict__ col_" in c.cpp_source  # float accumulators, as a row sum's


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 7, 24), (1, 5, 9), (8, 67, 65), (4, 1, 33)])
def test_sum_over_the_batch_only_keeps_the_other_outer_dims(dtype: torch.dtype, shape: tuple) -> None:
    # a position embedding's gradient: the [B, T, C] gradient summed over B, kept per (T, C); each
    # thread keeps a T x C row of accumulators. (8, 67, 65): the parallel loop
    def fn(g: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.softmax(g, -1) * x
        return out, out.sum(0)

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        c = check(fn, torch.randn(*shape, dtype=dtype), torch.randn(*shape, dtype=dtype), **_tol(dtype))
    finally:
        torch.set_num_threads(threads)
    assert c.kernel_count == 1 and len(_columns(c)) == 1, format_program(c.program)


def test_sum_over_the_batch_only_with_dynamic_shapes() -> None:
    def fn(g: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.softmax(g, -1) * x
        return out, out.sum(0)

    c = check(fn, torch.randn(3, 7, 24), torch.randn(3, 7, 24), dynamic=True, atol=1e-5, rtol=1e-5)
    for shape in [(2, 9, 5), (5, 3, 24)]:
        g, x = torch.randn(*shape), torch.randn(*shape)
        for got, want in zip(c(g, x), fn(g, x)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
