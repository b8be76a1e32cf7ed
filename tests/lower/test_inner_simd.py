"""The simd pragma of a kernel's inner loop nest sits on its innermost loop (no `omp simd collapse`):
GCC vectorized neither loop of a collapsed nest (a squeeze-excitation mean over H and W of an NCHW
activation, a loop over two inner dims, ran scalar). Checked on the kernel source, on the built
library's instructions where the machine has AVX-512, and on the values against eager."""
from __future__ import annotations

import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

from .conftest import check

pytestmark = pytest.mark.cpp


def _inner_pragmas(source: str) -> list[tuple[str, str]]:
    """(pragma, the loop line after it) for every `omp simd` pragma of the source."""
    lines = [line.strip() for line in source.splitlines()]
    return [(line, lines[i + 1]) for i, line in enumerate(lines) if line.startswith("#pragma omp simd")]


def _se_gate(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x).mean((2, 3), keepdim=True)


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512f" in f.read()
    except OSError:
        return False


def test_mean_over_hw_has_no_collapsed_simd_loop() -> None:
    c = check(_se_gate, torch.randn(2, 8, 16, 16))
    pragmas = _inner_pragmas(c.cpp_source)
    assert pragmas and not any("collapse" in p for p, _ in pragmas), c.cpp_source
    # the pragma opens the loop over W (the stride-1 dim), inside the loop over H
    assert all(re.match(r"for \(int64_t y1 = 0; y1 < 16;", loop) for _, loop in pragmas), pragmas
    assert "reduction(+:" in pragmas[0][0]


@pytest.mark.skipif(not _has_avx512(), reason="the vector instructions checked are AVX-512's")
def test_mean_over_hw_is_vectorized() -> None:
    c = check(_se_gate, torch.randn(2, 8, 32, 32), atol=1e-5, rtol=1e-5)
    path = c._lib._name
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True).stdout
    kernel = "".join(part.split("\n\n", 1)[0] for part in re.split(r"<kernel0(?:\._omp_fn\.\d+)?>:", dump)[1:])
    assert kernel and "zmm" in kernel  # 16 lanes; the collapsed nest had only scalar (xmm, ss) instructions


@pytest.mark.parametrize("shape", [(2, 8, 16, 16), (3, 5, 7, 9), (1, 3, 1, 33), (2, 4, 5, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_mean_over_hw_matches_eager(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    check(_se_gate, torch.randn(shape, dtype=dtype), **tol)


def test_strided_and_offset_views_match_eager() -> None:
    base = torch.randn(3, 6, 12, 20)
    check(lambda x: _se_gate(x[:, 1:5, 2:, 3:17]), base)  # offset and strided dims
    check(lambda x: _se_gate(x.transpose(2, 3)), base)  # the inner loop walks a strided dim
    check(lambda x: _se_gate(x.permute(0, 3, 1, 2)), base)  # NHWC storage


def test_pointwise_over_two_inner_dims_matches_eager() -> None:
    # a sum over H and W followed by a pointwise use of it over the same rows: both loops of the
    # kernel run over (H, W), the second one pointwise
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x.sum((2, 3), keepdim=True)) + x.exp()

    c = check(fn, torch.randn(2, 6, 9, 13), atol=1e-5, rtol=1e-5)
    assert not any("collapse" in p for p, _ in _inner_pragmas(c.cpp_source))


def test_max_and_var_over_hw_match_eager() -> None:
    x = torch.randn(2, 5, 11, 7)
    x[0, 1, 3, 4] = float("nan")
    check(lambda x: x.amax((2, 3)), x)
    check(lambda x: torch.var_mean(x, (2, 3)), x, atol=1e-5, rtol=1e-5)
