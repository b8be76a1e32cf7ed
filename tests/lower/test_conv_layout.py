"""Where a convolution runs NHWC (kiln.lower.conv_layout, kiln.lower.lowerings.convolution): a
result the graph both returns and reads (a training forward's convolution before a train-mode
BatchNorm, saved for the backward) stays NCHW, since graph outputs keep eager's layout and each NHWC
one would be copied back by a transposing pass; a result that is only returned still runs NHWC."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.lower.conv_layout import channels_last_eligible
from kiln.lower.schedule import ExternCall

from .conftest import check

pytestmark = [pytest.mark.cpp, pytest.mark.skipif(not channels_last_eligible(torch.float32, torch.device("cpu"), 4),
                                                  reason="NHWC convolutions need oneDNN")]
aten = torch.ops.aten


def _conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)


def _conv_layouts(compiled) -> list:
    return [s.node.layout for s in compiled.program.steps
            if isinstance(s, ExternCall) and s.node.op is aten.convolution.default]


def _bn_train(y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple:
    mean, var = torch.zeros(y.shape[1]), torch.ones(y.shape[1])
    return aten._native_batch_norm_legit_functional(y, weight, bias, mean, var, True, 0.1, 1e-5)


def test_saved_result_runs_nchw() -> None:
    def fn(x, w, weight, bias):
        y = _conv(torch.relu(x), w)  # the input is computed here: NHWC would cost it nothing
        out, save_mean, save_invstd, _, _ = _bn_train(y, weight, bias)
        return torch.nn.functional.silu(out), y, out, save_mean, save_invstd  # y and out saved

    # 2.4 M multiply-adds: oneDNN's convolution, not Kiln's small-convolution GEMM
    args = (torch.randn(2, 16, 16, 16), torch.randn(32, 16, 3, 3), torch.randn(32), torch.randn(32))
    compiled = check(fn, *args, atol=1e-4, rtol=1e-4)
    layouts = _conv_layouts(compiled)
    assert len(layouts) == 1 and int(layouts[0].strides[3]) == 1  # NCHW
    # relu before the convolution; BatchNorm's statistics, running statistics' update, normalize and
    # the silu after it (one kernel per channel); no copy of y or out back to NCHW
    assert compiled.kernel_count == 2
    assert all(t.is_contiguous() for t in compiled(*args))


def test_result_only_returned_still_runs_nhwc() -> None:
    def fn(x, w1, w2):
        return _conv(torch.relu(_conv(x, w1)) + 1, w2)

    compiled = check(fn, torch.randn(2, 16, 16, 16), torch.randn(32, 16, 3, 3), torch.randn(32, 32, 3, 3),
                     atol=1e-3, rtol=1e-4)
    layouts = _conv_layouts(compiled)
    assert len(layouts) == 2 and all(int(lay.strides[1]) == 1 for lay in layouts)


class _Block(nn.Module):
    """An inverted-residual block as EfficientNet's: 1x1 expansion, depthwise 3x3, squeeze-excitation,
    1x1 projection, each convolution followed by a train-mode BatchNorm."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(c, 4 * c, 1, bias=False), nn.BatchNorm2d(4 * c), nn.SiLU())
        self.depthwise = nn.Sequential(nn.Conv2d(4 * c, 4 * c, 3, 1, 1, groups=4 * c, bias=False),
                                       nn.BatchNorm2d(4 * c), nn.SiLU())
        self.reduce, self.gate = nn.Conv2d(4 * c, c, 1), nn.Conv2d(c, 4 * c, 1)
        self.project = nn.Sequential(nn.Conv2d(4 * c, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.depthwise(self.expand(x))
        h = h * self.gate(nn.functional.silu(self.reduce(h.mean((2, 3), keepdim=True)))).sigmoid()
        return self.project(h) + x


@pytest.mark.parametrize("size", [16, 20])
def test_training_block_matches_eager(size: int) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.SiLU(), _Block(16)).train()
    ref = copy.deepcopy(net)
    x = torch.randn(2, 3, size, size)
    compiled = kiln.compile(net)
    for _ in range(2):
        net.zero_grad()
        ref.zero_grad()
        out, want = compiled(x), ref(x)
        torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
        out.square().mean().backward()
        want.square().mean().backward()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-3, msg=name)
    for b, c in zip(net.buffers(), ref.buffers()):
        torch.testing.assert_close(b, c)


def test_value_computed_from_nhwc_data_is_stored_nhwc() -> None:
    """A value computed from NHWC data and stored for several readers (a depthwise convolution's
    BatchNorm and SiLU, read by a squeeze-excite block's mean and its product) is stored NHWC, as
    eager's pointwise ops keep their input's memory format: its kernel and the mean run along the
    channels. Stored NCHW, the block transposed it twice and the loops ran scalar."""
    def fn(x, s, b):
        h = torch.nn.functional.silu(x * s.view(1, -1, 1, 1) + b.view(1, -1, 1, 1))  # stored: two readers
        gate = h.mean((2, 3), keepdim=True).sigmoid()
        return _conv(h * gate, torch.ones(8, 48, 3, 3))

    x = torch.randn(2, 48, 16, 16).contiguous(memory_format=torch.channels_last)
    compiled = check(fn, x, torch.randn(48), torch.randn(48), atol=1e-3, rtol=1e-4)
    kernels = compiled.cpp_source.split("// kernel")[1:]  # each from its "N: fused from ..." line
    silu = [k for k in kernels if "silu" in k.split("\n", 1)[0] and "mean" not in k.split("\n", 1)[0]]
    assert silu, compiled.cpp_source
    for kernel in silu:  # written along the channels: the vectorized loop runs over the 48 channels
        assert "y0 < 48; y0++" in kernel, kernel
