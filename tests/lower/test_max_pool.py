"""max_pool2d whose indices nobody reads (inference) is a lazy value in the loop IR
(kiln.lower.lowerings.convolution._max_pool_value), fused with the ReLU/BatchNorm before it and the
reader after it, not ATen's extern: values equal eager's bit for bit (NaN wins, -inf and -0.0 as
ATen), for padding, ceil_mode windows past the edge, dilation, odd sizes, float dtypes and both
memory formats; with the indices read (training) it stays ATen's."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from tests.lower.conftest import check

aten = torch.ops.aten

pytestmark = pytest.mark.cpp

CASES = [  # (input size, kernel, stride, padding, dilation, ceil_mode)
    ((2, 5, 9, 11), 3, 2, 1, 1, False),
    ((1, 3, 10, 7), 3, 2, 0, 1, True),  # the last window runs past the edge
    ((2, 4, 8, 8), 2, 2, 0, 1, False),
    ((1, 6, 13, 9), (3, 2), (1, 2), (1, 0), 1, False),
    ((1, 2, 12, 12), 5, 1, 2, 2, True),
    ((3, 1, 5, 5), 5, 3, 2, 1, True),
    ((1, 3, 1, 1), 1, 1, 0, 1, False),
]


def _values(x, k, s, p, d, c):
    return F.max_pool2d(torch.relu(x) * 2.0 - 1.0, k, s, p, d, ceil_mode=c) + 1.0


# CI: the star around (CASES[0], float32, contiguous): every case, dtype and layout once; `-m slow` the rest
@pytest.mark.ci_slice({"case": CASES[0], "dtype": torch.float32, "channels_last": False})
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_pooled_values_fused(case, dtype, channels_last):
    size, k, s, p, d, c = case
    x = torch.randn(size).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    # bfloat16: the fused ReLU and scaling round once, eager rounds after each op (the pooled values
    # themselves are exact either way)
    tol = {"atol": 1e-2, "rtol": 1.6e-2} if dtype == torch.bfloat16 else {"atol": 0, "rtol": 0}
    with torch.no_grad():
        compiled = check(lambda t: _values(t, k, s, p, d, c), x, **tol)
    assert "extern_aten_max_pool2d" not in compiled.wrapper_source


def test_nan_inf_and_signed_zero_as_eager():
    x = torch.randn(2, 3, 7, 9)
    x[0, 0, 1, 1] = float("nan")
    x[0, 1] = float("-inf")  # a whole channel: the padding's -inf must not change the result
    x[1, 2] = -0.0
    x[1, 2, 3, 3] = 0.0
    x[1, 0, 6, 8] = float("nan")  # in the ceil_mode window past the edge
    with torch.no_grad():
        for c in (False, True):
            fn = lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=c)
            got = kiln.compile(fn)(x)
            want = fn(x)
            torch.testing.assert_close(got, want, equal_nan=True, atol=0, rtol=0)
            assert torch.equal(torch.signbit(got), torch.signbit(want))
            kiln.reset()


def test_indices_read_stay_aten():
    x = torch.randn(2, 3, 9, 9)
    compiled = check(lambda t: aten.max_pool2d_with_indices(t, [3, 3], [2, 2], [1, 1]), x, atol=0, rtol=0)
    assert "extern_aten_max_pool2d_with_indices" in compiled.wrapper_source


def test_training_gradient():
    x = torch.randn(2, 4, 10, 10, requires_grad=True)
    fn = lambda t: F.max_pool2d(torch.relu(t), 3, 2, 1).sum()
    fn(x).backward()
    want = x.grad.clone()
    x.grad = None
    kiln.compile(fn)(x).backward()
    torch.testing.assert_close(x.grad, want)


def test_pooling_runs_along_the_channels():
    """An input computed here (a ReLU of NCHW data) is stored NHWC for the taps, so the maximum's
    loop runs along the channels, not along a row of few columns at a stride of 2."""
    x = torch.randn(2, 16, 8, 8)
    with torch.no_grad():
        compiled = check(lambda t: F.max_pool2d(torch.relu(t), 2, 2) * 3.0, x, atol=0, rtol=0)
    assert "torch.empty_strided((2, 16, 8, 8), (1024, 1, 128, 16)" in compiled.wrapper_source, compiled.wrapper_source
