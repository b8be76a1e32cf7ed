"""The backward of a dense convolution whose weight is large against its output pixels (ResNet's last
stages on small images: 512 channels at 2x2 pixels, batch 2) is computed as GEMMs over the input's
patches (kiln.lower.lowerings.convolution._gemm_convolution_backward), not by oneDNN's
convolution_backward, whose weight gradient is several times slower there (conv_layout's
SMALL_CONV_BACKWARD_ROWS_PER_CHANNEL). Checked: which backward is chosen (no convolution_backward
extern where rows per output channel are few, oneDNN kept where they are many), and that the
gradients equal eager's in every grad mode (input, weight, bias each required or not), dtype, stride
and kernel shape, alone and in a train-mode ResNet block with BatchNorm."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.autograd import aot_autograd
from kiln.lower import compile_graph
from kiln.lower import conv_layout
from kiln.lower.conv_layout import small_conv_kind
from tests.lower.conftest import check

aten = torch.ops.aten

# (input size, weight size, stride, padding): each over the old size limit of a computed backward
# (2 ** 16 multiply-adds) and with at most a quarter output row (N * Ho * Wo) per output channel
WIDE = {
    "3x3-2x2": ((2, 64, 2, 2), (64, 64, 3, 3), 1, 1),
    "3x3-stride2": ((2, 32, 4, 4), (64, 32, 3, 3), 2, 1),
    "1x1-downsample": ((2, 128, 4, 4), (256, 128, 1, 1), 2, 0),
    "1x1": ((2, 128, 2, 2), (128, 128, 1, 1), 1, 0),
    "3x3-one-pixel": ((2, 64, 1, 1), (64, 64, 3, 3), 1, 1),
    "3x3-unpadded": ((2, 32, 4, 4), (64, 32, 3, 3), 1, 0),
}
# many output pixels per channel: oneDNN's backward is as fast or faster there (kept)
NARROW = {
    "3x3-6x6": ((2, 64, 6, 6), (64, 64, 3, 3), 1, 1),
    "3x3-16x16": ((8, 64, 16, 16), (64, 64, 3, 3), 1, 1),
    "1x1-4x4-batch8": ((8, 64, 4, 4), (256, 64, 1, 1), 1, 0),
}


def _out(xs, ws, stride, padding):
    return tuple(torch.nn.functional.conv2d(torch.empty(xs, device="meta"), torch.empty(ws, device="meta"), None,
                                            stride, padding).shape)


def _backward_fn(stride, padding, mask):
    def fn(g, x, w):
        grads = aten.convolution_backward(g * 1.5, x, w, [w.shape[0]] if mask[2] else None, [stride, stride],
                                          [padding, padding], [1, 1], False, [0, 0], 1, mask)
        return tuple(t for t in grads if t is not None)

    return fn


@pytest.mark.parametrize("case", list(WIDE), ids=str)
def test_wide_weight_backward_is_gemm(case):
    xs, ws, stride, padding = WIDE[case]
    out = _out(xs, ws, stride, padding)
    assert out[0] * out[2] * out[3] * ws[0] * ws[1] * ws[2] * ws[3] > conv_layout.SMALL_CONV_BACKWARD_MACS
    assert small_conv_kind(xs, ws, out, 1, False, torch.float32, torch.device("cpu"), backward=True) == "gemm"
    assert small_conv_kind(xs, ws, out, 1, False, torch.float16, torch.device("cpu"), backward=True) is None


@pytest.mark.parametrize("case", list(NARROW), ids=str)
def test_many_pixels_per_channel_keep_onednn_backward(case):
    xs, ws, stride, padding = NARROW[case]
    out = _out(xs, ws, stride, padding)
    assert small_conv_kind(xs, ws, out, 1, False, torch.float32, torch.device("cpu"), backward=True) is None
    g, x, w = torch.randn(out), torch.randn(xs), torch.randn(ws)
    compiled = check(_backward_fn(stride, padding, [True, True, False]), g, x, w, atol=1e-4, rtol=1e-4)
    assert compiled.extern_ops == (aten.convolution_backward.default,)


def test_grouped_and_transposed_keep_onednn_backward():
    assert small_conv_kind((2, 64, 2, 2), (64, 32, 3, 3), (2, 64, 2, 2), 2, False, torch.float32,
                           torch.device("cpu"), backward=True) is None
    assert small_conv_kind((2, 64, 2, 2), (64, 64, 3, 3), (2, 64, 4, 4), 1, True, torch.float32,
                           torch.device("cpu"), backward=True) is None


MASKS = [[True, True, True], [True, True, False], [False, True, False], [True, False, False], [False, True, True]]


@pytest.mark.parametrize("case,mask,dtype", [(c, m, torch.float32) for c in WIDE for m in MASKS]
                         + [(c, [True, True, True], torch.float64) for c in WIDE], ids=str)
def test_wide_weight_backward_matches_eager(case, mask, dtype):
    xs, ws, stride, padding = WIDE[case]
    out = _out(xs, ws, stride, padding)
    g, x, w = (torch.randn(s, dtype=dtype) for s in (out, xs, ws))
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else {}
    compiled = check(_backward_fn(stride, padding, mask), g, x, w, **tol)
    assert aten.convolution_backward.default not in compiled.extern_ops
    assert all(op is aten.mm.default for op in compiled.extern_ops)  # one GEMM per gradient asked for
    assert len(compiled.extern_ops) == int(mask[0]) + int(mask[1])


@pytest.mark.parametrize("case", ["3x3-2x2", "1x1-downsample", "3x3-unpadded", "small-3x3"], ids=str)
def test_wide_weight_backward_on_channels_last_matches_eager(case):
    """NHWC gradient and input (a channels-last model): the same values and eager's output strides
    (oneDNN gives the weight's gradient NHWC there; so does a small convolution's computed backward)."""
    xs, ws, stride, padding = {**WIDE, "small-3x3": ((2, 8, 4, 4), (8, 8, 3, 3), 1, 1)}[case]
    out = _out(xs, ws, stride, padding)
    cl = torch.channels_last
    g, x, w = torch.randn(out).contiguous(memory_format=cl), torch.randn(xs).contiguous(memory_format=cl), torch.randn(ws)
    fn = _backward_fn(stride, padding, [True, True, False])
    compiled = check(fn, g, x, w, atol=1e-4, rtol=1e-4)
    assert aten.convolution_backward.default not in compiled.extern_ops
    for got, want in zip(compiled(g, x, w), fn(g, x, w)):
        assert got.stride() == want.stride()


class LastStage(nn.Module):
    """ResNet-18's last stage in small: a strided basic block with a 1x1 downsample, then one more."""

    def __init__(self, cin: int = 32, cout: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, 2, bias=False), nn.BatchNorm2d(cout))
        self.conv3 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.head = nn.Linear(cout, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + self.down(x))
        y = torch.relu(self.conv3(y))
        return self.head(y.mean((2, 3)))


def _lowered_backend(sink: list):
    def compiler(gm, example_inputs):
        compiled = compile_graph(gm, example_inputs)
        sink.append(compiled)
        return compiled

    return aot_autograd(compiler, compiler)


@pytest.mark.parametrize("grads", ["all", "frozen-first-conv", "input-grad", "frozen-bn"], ids=str)
def test_train_mode_last_stage_matches_eager(grads):
    torch.manual_seed(0)
    model = LastStage().train()
    if grads == "frozen-first-conv":
        model.conv1.weight.requires_grad_(False)
    if grads == "frozen-bn":
        for bn in (model.bn1, model.bn2):
            bn.requires_grad_(False)
    twin = copy.deepcopy(model)
    x = torch.randn(2, 32, 4, 4, requires_grad=grads == "input-grad")
    x_twin = x.detach().clone().requires_grad_(x.requires_grad)
    lowered: list = []
    compiled = kiln.compile(model, backend=_lowered_backend(lowered))
    for _ in range(2):  # the second step runs on updated running statistics
        loss = compiled(x).square().sum()
        loss.backward()
        expected = twin(x_twin).square().sum()
        expected.backward()
        torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-4)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)
    if x.requires_grad:
        torch.testing.assert_close(x.grad, x_twin.grad, atol=1e-4, rtol=1e-4)
    for a, b in zip(model.buffers(), twin.buffers()):
        torch.testing.assert_close(a, b)
    backward = lowered[-1]
    assert aten.convolution_backward.default not in backward.extern_ops, backward.wrapper_source
