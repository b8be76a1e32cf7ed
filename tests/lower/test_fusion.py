"""Fusion: the number of kernels the scheduler makes for the classic patterns, and their results."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from .conftest import check

pytestmark = pytest.mark.cpp


def test_pointwise_chain_is_one_kernel() -> None:
    c = check(lambda x, y: ((x.sin() + y.cos()) * x).relu() + 1, torch.randn(64, 33), torch.randn(64, 33))
    assert c.kernel_count == 1 and c.extern_count == 0
    assert "sin, cos, add, mul, relu, add_1" in c.cpp_source  # kernels name the FX nodes they came from


def test_softmax_is_one_kernel() -> None:
    c = check(lambda x: torch.softmax(x, -1), torch.randn(37, 129))
    assert c.kernel_count == 1


def test_log_softmax_over_middle_dim() -> None:
    c = check(lambda x: torch.log_softmax(x, 1), torch.randn(4, 9, 5))
    assert c.kernel_count == 1


def test_layer_norm_is_one_kernel() -> None:
    x, w, b = torch.randn(16, 48), torch.randn(48), torch.randn(48)
    c = check(lambda x, w, b: F.layer_norm(x, (48,), w, b), x, w, b, atol=1e-5, rtol=1e-4)
    assert c.kernel_count == 1


def test_layer_norm_then_gelu_is_one_kernel() -> None:
    x, w, b = torch.randn(16, 48), torch.randn(48), torch.randn(48)
    c = check(lambda x, w, b: F.gelu(F.layer_norm(x, (48,), w, b)), x, w, b, atol=1e-5, rtol=1e-4)
    assert c.kernel_count == 1


def test_gelu_bias_chain_after_matmul() -> None:
    x, w, b = torch.randn(8, 16), torch.randn(16, 32), torch.randn(32)
    c = check(lambda x, w, b: F.gelu(x @ w + b, approximate="tanh") * 2, x, w, b, atol=1e-5, rtol=1e-4)
    assert c.extern_count == 1 and c.kernel_count == 1


def test_siblings_share_a_loop() -> None:
    c = check(lambda x: (x.exp(), x.sin() * 2, x + 1), torch.randn(10, 20))
    assert c.kernel_count == 1
    assert c.cpp_source.count("for (int64_t y0") == 1


def test_var_mean_is_one_kernel() -> None:
    c = check(lambda x: torch.var_mean(x, -1), torch.randn(12, 40), atol=1e-5, rtol=1e-5)
    assert c.kernel_count == 1


def test_reduction_result_used_only_inside_stays_in_registers() -> None:
    c = check(lambda x: x - x.amax(-1, keepdim=True), torch.randn(6, 7))
    assert c.kernel_count == 1
    assert "buf0[" not in c.cpp_source and "torch.empty_strided((6,)" not in c.wrapper_source


def test_multi_use_expensive_value_is_stored_once() -> None:
    def fn(x: torch.Tensor) -> tuple:
        e = torch.exp(torch.tanh(x) * torch.sigmoid(x)).log1p()
        return e + 1, e * 2, e.sum()
    c = check(fn, torch.randn(9, 11), atol=1e-5, rtol=1e-5)
    kernels = c.cpp_source.split("// kernel0")[1]
    assert kernels.count("tanhf(") == 1  # computed once, kept in a register for its three users
    assert c.kernel_count == 1 and "buf0 =" not in c.wrapper_source


# a bfloat16 softmax keeps its exponentials in float, in a row buffer (a float32 one keeps them in
# its output: tests/lower/test_row_reductions.py)
def test_softmax_row_buffer_lives_on_the_stack() -> None:
    c = check(lambda x: torch.softmax(x, -1), torch.randn(64, 1024).bfloat16(), atol=None, rtol=None)
    assert "alignas(64) float" in c.cpp_source and "std::malloc" not in c.cpp_source.split("kiln_float_to_bf16")[-1]


def test_softmax_row_buffer_of_symbolic_size_is_allocated() -> None:
    c = check(lambda x: torch.softmax(x, -1), torch.randn(64, 1024).bfloat16(), dynamic=True, atol=None, rtol=None)
    assert "std::malloc" in c.cpp_source


def test_matmul_input_is_stored_once_and_shared_with_its_transpose() -> None:
    # the weight gradient pattern: mm(g, w) and mm(g.t(), x) with g a pointwise value
    def f(a, b, w, x):
        g = a * b + 1
        return g @ w, g.t() @ x
    c = check(f, torch.randn(64, 32), torch.randn(64, 32), torch.randn(32, 16), torch.randn(64, 8),
              atol=1e-4, rtol=1e-4)
    assert c.kernel_count == 1 and c.extern_count == 2
    assert "buf0.t()" in c.wrapper_source  # the transpose is a view of the one stored buffer


def test_parallel_loops_ask_kiln_threads_at_call_time() -> None:
    from kiln.lower.codegen.cpp import PRELUDE
    from kiln.runtime import build
    import ctypes

    c = check(lambda x: x.exp() + 1, torch.randn(256, 1024))
    assert "#pragma omp parallel for num_threads(kiln_threads())" in c.cpp_source
    lib = build.load(PRELUDE + 'extern "C" int probe() { return kiln_threads(); }')
    lib.probe.restype = ctypes.c_int
    assert 1 <= lib.probe() <= max(torch.get_num_threads(), 1)


def test_layer_norm_then_view_is_one_kernel() -> None:
    # the stats run over (B, T) and the normalized output over (B*T, C): one kernel, stats in registers
    x, w, b = torch.randn(3, 5, 24), torch.randn(24), torch.randn(24)
    c = check(lambda x, w, b: F.layer_norm(x, (24,), w, b).view(15, 24) * 2, x, w, b, atol=1e-5, rtol=1e-4)
    assert c.kernel_count == 1
    assert c.wrapper_source.count("torch.empty_strided") == 1


def test_attention_softmax_then_view_is_one_kernel() -> None:
    def f(s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        att = torch.softmax((s * 0.25).masked_fill(mask == 0, float("-inf")), -1)
        return att.view(6, 7, 7) + 1
    mask = torch.tril(torch.ones(7, 7))
    c = check(f, torch.randn(2, 3, 7, 7), mask)
    assert c.kernel_count == 1


def test_view_fusion_keeps_dims_that_do_not_group_apart() -> None:
    # (4, 6) x (5) cannot be regrouped as (6, 20): the pointwise part after the reduction is its own kernel
    def f(x: torch.Tensor) -> torch.Tensor:
        m = x.amax(-1, keepdim=True)
        return (x - m).view(6, 20) * 3
    c = check(f, torch.randn(4, 6, 5))
    assert c.kernel_count == 2
    # a symbolic batch: the regrouped index must hold for any size
    check(lambda x, w, b: F.layer_norm(x, (16,), w, b).view(-1, 16) + 1,
          torch.randn(4, 3, 16), torch.randn(16), torch.randn(16), dynamic=True, atol=1e-5, rtol=1e-4)


def test_copies_on_both_sides_of_a_bmm_share_a_kernel() -> None:
    # q and k are copied for the first bmm, v only after it: v's copy joins the earlier kernel
    def attention(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        q, k, v = (x @ w).split(8, dim=1)
        q, k, v = (t.view(6, 2, 4).transpose(0, 1) for t in (q, k, v))
        att = torch.softmax(q.contiguous() @ k.transpose(-2, -1).contiguous(), dim=-1)
        return att @ v.contiguous()
    c = check(attention, torch.randn(6, 5), torch.randn(5, 24), atol=1e-5, rtol=1e-5)
    assert c.extern_count == 3 and c.kernel_count == 2
    first = c.cpp_source.split("// kernel0: fused from ")[1].splitlines()[0]
    assert first.count("clone") == 3, first


def test_a_matmul_reading_a_transpose_of_a_lazy_value_reads_it_stored_once() -> None:
    """A weight gradient's mm(t(g), h) beside the input gradient's mm(g, w): g is stored once, in
    its own layout, and the first matmul takes its transpose as a strided view (BLAS reads it as
    is), instead of one kernel writing g and a transposed copy of it."""
    def grads(g, h, w):
        a = g.relu() * 2
        return a.t() @ h, a @ w

    g, h, w = torch.randn(16, 32), torch.randn(16, 8), torch.randn(32, 8)
    c = check(grads, g, h, w, atol=1e-5, rtol=1e-5)
    assert c.kernel_count == 1
    stores = re.findall(r"^\s+buf\d+\[[^\]]*\] = ", c.cpp_source, re.M)
    assert len(stores) == 1, c.cpp_source
    assert re.search(r"extern_aten_mm_\w+\(buf\d+\.t\(\), arg1", c.wrapper_source), c.wrapper_source


def _stores(c) -> list[str]:
    return re.findall(r"^\s+buf\d+\[[^\]]*\] = ", c.cpp_source, re.M)


def test_reshapes_of_a_lazy_value_read_by_several_matmuls_read_it_stored_once() -> None:
    """An attention's q, k and v projections (and a gated MLP's gate and up) each reshape the same
    normalized input, one view node per projection: the input is stored once and every matmul
    reads a view of it (three reshapes stored three copies of an RMSNorm in one kernel)."""
    def qkv(x, w, wq, wk, wv):
        h = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        return tuple(torch.mm(h.view(-1, 16), m.t()) for m in (wq, wk, wv))

    def gated(x, wg, wu):
        h = torch.nn.functional.layer_norm(x, (16,)) * 3
        return torch.nn.functional.silu(h.reshape(-1, 16) @ wg) * (h.reshape(-1, 16) @ wu)

    c = check(qkv, torch.randn(2, 5, 16), torch.randn(16), *(torch.randn(8, 16) for _ in range(3)), atol=1e-5)
    assert c.kernel_count == 1 and len(_stores(c)) == 1, c.cpp_source
    g = check(gated, torch.randn(3, 4, 16), torch.randn(16, 8), torch.randn(16, 8), atol=1e-5)
    assert g.kernel_count == 2 and len(_stores(g)) == 2, g.cpp_source  # the norm once, the product once
    reads = re.findall(r"extern_aten_mm_out\((buf\d+)\.view\(12, 16\)", g.wrapper_source)
    assert len(reads) == 2 and len(set(reads)) == 1, g.wrapper_source  # both products read one stored value


def test_channels_last_pointwise_loops_in_storage_order() -> None:
    """A kernel writing an NHWC tensor runs its vectorized loop along the channels (stride 1), also
    when the channel count equals another dim's size, so loads and stores are contiguous."""
    for sizes in [(2, 32, 16, 16), (8, 8, 8, 8), (2, 16, 16, 16)]:
        x = torch.randn(sizes).contiguous(memory_format=torch.channels_last)
        c = check(lambda t: (t.relu() * 2 + t.sin(),), x)
        assert c.kernel_count == 1
        inner = re.findall(r"for \(int64_t y0 = 0; y0 < (\d+); y0\+\+\)", c.cpp_source)
        assert inner == [str(sizes[1])], c.cpp_source
        stores = re.findall(r"buf\d+\[([^\]]*)\] =", c.cpp_source)
        assert stores and all(s.endswith("+ y0") for s in stores), stores


def test_narrow_channels_keep_the_logical_order() -> None:
    """Three channels (an image) are no loop to vectorize: the kernel keeps W innermost."""
    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    c = check(lambda t: (t * 2,), x)
    assert re.findall(r"for \(int64_t y0 = 0; y0 < (\d+); y0\+\+\)", c.cpp_source) == ["16"]
