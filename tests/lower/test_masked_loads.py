"""A masked value of plain loads and floating-point arithmetic (a zero-padded SiLU output, as a
depthwise convolution reads its input) is computed on every lane with its loads guarded by the mask,
so the loop vectorizes; one with error checks, integer arithmetic or indirect loads keeps its
conditional lambda (work runs only where the mask holds). Checked on the kernel source, the built
library's instructions (AVX-512 machines) and the values against eager."""
from __future__ import annotations

import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

from .conftest import check

pytestmark = pytest.mark.cpp


def _padded_silu(x: torch.Tensor) -> torch.Tensor:
    return F.pad(F.silu(x), (1, 1, 1, 1))


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512f" in f.read()
    except OSError:
        return False


def test_padded_silu_guards_its_load_not_its_math() -> None:
    c = check(_padded_silu, torch.randn(2, 4, 9, 12))
    assert "[&]()" not in c.cpp_source  # no lambda called under the mask
    assert re.search(r"\? arg0\[[^\]]*\] : 0\)", c.cpp_source), c.cpp_source  # the load tests the mask


@pytest.mark.skipif(not _has_avx512(), reason="the vector instructions checked are AVX-512's")
def test_padded_silu_is_vectorized() -> None:
    c = check(_padded_silu, torch.randn(2, 16, 32, 32))
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", c._lib._name], capture_output=True, text=True).stdout
    kernel = "".join(part.split("\n\n", 1)[0] for part in re.split(r"<kernel0(?:\._omp_fn\.\d+)?>:", dump)[1:])
    assert kernel and "zmm" in kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 4, 9, 12), (1, 3, 1, 1), (3, 1, 17, 5)])
def test_padded_values_match_eager(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    tol = {"atol": 1e-2, "rtol": 1e-2} if dtype in (torch.bfloat16, torch.float16) else {}
    x = torch.randn(shape, dtype=dtype)
    x.view(-1)[0] = float("nan")  # a NaN inside stays, the padding stays 0
    check(_padded_silu, x, **tol)


def test_padded_views_match_eager() -> None:
    base = torch.randn(3, 6, 14, 20)
    check(lambda x: _padded_silu(x[1:, 2:5, 3:, 1:19:2]), base)  # offset and strided
    check(lambda x: _padded_silu(x.permute(0, 3, 1, 2)), base)  # NHWC storage
    check(lambda x: F.pad(x.exp() * 2, (2, 0, 0, 3), value=1.5), base)  # a non-zero pad value


def test_cat_of_computed_parts_matches_eager() -> None:
    a, b = torch.randn(4, 7), torch.randn(4, 9)
    check(lambda a, b: torch.cat([a.sin(), b.exp() + 1], 1), a, b)


def test_integer_masked_value_keeps_its_lambda() -> None:
    # integer floor division checks its divisor: run only where the mask holds (the padding's
    # lanes would divide a made-up 0 by a made-up 0 and record a ZeroDivisionError)
    x, d = torch.randint(-20, 20, (3, 5)), torch.randint(1, 4, (3, 5))
    c = check(lambda x, d: F.pad(x // d, (1, 1)), x, d)
    assert "[&]()" in c.cpp_source


def test_indirect_load_under_a_mask_matches_eager() -> None:
    table, idx = torch.randn(10, 6), torch.randint(0, 10, (5,))
    check(lambda t, i: F.pad(t[i].exp(), (0, 0, 2, 1)), table, idx)


def _padded_affine_silu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # an inference BatchNorm's affine map and SiLU, zero-padded for a depthwise convolution
    return F.pad(F.silu(x * w.view(1, -1, 1, 1) + b.view(1, -1, 1, 1)), (1, 1, 1, 1))


def test_loads_the_mask_does_not_depend_on_are_not_guarded() -> None:
    """On NCHW input the padding mask is over rows and columns: the per-channel weight and bias
    loads read where they read inside the image, so they load unguarded (GCC vectorizes no loop
    whose masked load has one mask for every lane); the input's load keeps its guard. On NHWC
    input the mask is the same along a row of channels: the row runs one of two plain loops
    (the image's values, or the padding's zeros), with no guard at all."""
    x = torch.randn(2, 16, 7, 5)
    c = check(_padded_affine_silu, x, torch.randn(16), torch.randn(16))
    assert re.search(r"\? arg0\[[^\]]*\] : 0\)", c.cpp_source), c.cpp_source
    assert not re.search(r"\? arg[12]\[", c.cpp_source), c.cpp_source
    c = check(_padded_affine_silu, x.contiguous(memory_format=torch.channels_last), torch.randn(16), torch.randn(16))
    assert not re.search(r"\? arg[012]\[", c.cpp_source) and "} else {" in c.cpp_source, c.cpp_source


@pytest.mark.skipif(not _has_avx512(), reason="the vector instructions checked are AVX-512's")
def test_padded_nhwc_affine_silu_is_vectorized() -> None:
    x = torch.randn(2, 32, 16, 16).contiguous(memory_format=torch.channels_last)
    c = check(_padded_affine_silu, x, torch.randn(32), torch.randn(32))
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", c._lib._name], capture_output=True, text=True).stdout
    kernels = [part.split("\n\n", 1)[0] for part in re.split(r"<kernel\d+(?:\._omp_fn\.\d+)?>:", dump)[1:]]
    assert any("vexp" in k or ("zmm" in k and "vfmadd" in k) for k in kernels), dump[-3000:]


@pytest.mark.parametrize("shape", [(2, 16, 7, 5), (1, 8, 1, 1), (3, 9, 4, 6)])
def test_padded_nhwc_affine_values_match_eager(shape: tuple[int, ...]) -> None:
    x = torch.randn(shape)
    x[0, 0, 0, 0] = float("nan")  # a NaN inside stays, the padding stays 0
    x = x.contiguous(memory_format=torch.channels_last)
    check(_padded_affine_silu, x, torch.randn(shape[1]), torch.randn(shape[1]))
