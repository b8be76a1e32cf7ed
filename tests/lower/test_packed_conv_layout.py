"""Where a convolution on a packed folded weight (mkldnn::_convolution_pointwise, whose result is
NHWC always) takes its input NHWC: at 16 pixels and below NCHW pays for ATen's convolutions, but an
input computed from NHWC data (the ReLU6 of a depthwise convolution's result in MobileNetV2's last
stages) is then written NHWC by the kernel that computes it, vectorized along the channels; stored
NCHW, that kernel ran with its inner loop over 4 columns at a stride of C elements."""
from __future__ import annotations

import re

import pytest
import torch

from tests.lower.conftest import check

aten = torch.ops.aten

pytestmark = pytest.mark.cpp


@pytest.fixture(autouse=True)
def _onednn_dense_convolutions(monkeypatch):
    """The 1x1 convolutions run on oneDNN (at these sizes they would be GEMMs); the depthwise one
    stays Kiln's loop, a lazy value read from NHWC data."""
    import kiln.lower.conv_layout as conv_layout

    monkeypatch.setattr(conv_layout, "SMALL_CONV_GEMM_MACS", 0)


def _bn(y, p):
    return aten._native_batch_norm_legit_no_training(y, p[0], p[1], p[2], p[3], 0.1, 1e-5)[0]


def block(x, w1, g1, b1, m1, v1, wd, gd, bd, md, vd, w2, g2, b2, m2, v2):
    """1x1 conv + BN + ReLU6, depthwise 3x3 + BN + ReLU6, 1x1 conv + BN (an inverted residual)."""
    p1, pd, p2 = (g1, b1, m1, v1), (gd, bd, md, vd), (g2, b2, m2, v2)
    y = torch.clamp(_bn(aten.convolution(x, w1, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), p1), 0, 6)
    c = wd.shape[0]
    y = torch.clamp(_bn(aten.convolution(y, wd, None, [1, 1], [1, 1], [1, 1], False, [0, 0], c), pd), 0, 6)
    return _bn(aten.convolution(y, w2, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), p2)


def _params(c):
    return [torch.rand(c) + 0.5, torch.randn(c), torch.randn(c) * 0.1, torch.rand(c) + 0.5]


@pytest.mark.parametrize("hw", [(4, 4), (3, 5), (2, 2)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_small_image_packed_conv_reads_nhwc(hw, channels_last):
    c_in, c_mid, c_out = 24, 96, 40
    x = torch.randn(2, c_in, *hw)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    args = (x, torch.randn(c_mid, c_in, 1, 1) * 0.2, *_params(c_mid), torch.randn(c_mid, 1, 3, 3) * 0.3,
            *_params(c_mid), torch.randn(c_out, c_mid, 1, 1) * 0.1, *_params(c_out))
    with torch.no_grad():
        compiled = check(block, *args, atol=2e-4, rtol=1e-4)
    src = compiled.wrapper_source
    convs = re.findall(r"extern_mkldnn__convolution_pointwise_default\((\w+),", src)
    assert len(convs) == 2, src
    h, w = hw
    nhwc = f"({c_mid * h * w}, 1, {w * c_mid}, {c_mid})"
    assert nhwc in _made(src, convs[1])


def _made(src: str, name: str) -> str:
    """The wrapper lines that make buffer `name` (an allocation, a view, an extern's result and its
    strides check), through reuses of another buffer."""
    lines = [ln for ln in src.splitlines() if re.match(rf"\s*(if )?{name}( = |\.dtype)", ln)]
    same = re.match(rf"\s*{name} = (buf\d+)(;|\s*#|$)", lines[0])
    return _made(src, same.group(1)) if same else "\n".join(lines)
