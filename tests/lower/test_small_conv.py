"""Small convolutions computed without oneDNN (kiln.lower.lowerings.convolution): a dense one as one
GEMM over its input patches, a depthwise one as a loop with its taps unrolled, and the inference
BatchNorm after them as its affine map fused into the kernel that reads the result (not folded).
Compiled == eager for every stride, padding, dilation, kernel shape, bias, dtype and layout kind,
forward and backward; larger or symbolic-size convolutions keep oneDNN."""
from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.lower.conv_layout import small_conv_kind
from tests.lower.conftest import check

aten = torch.ops.aten

# (input size, weight size, stride, padding, dilation, groups)
GEMM_CASES = {
    "1x1": ((2, 8, 6, 6), (12, 8, 1, 1), 1, 0, 1, 1),
    "1x1-stride2": ((2, 8, 7, 7), (12, 8, 1, 1), 2, 0, 1, 1),
    "1x1-one-pixel": ((2, 16, 1, 1), (96, 16, 1, 1), 1, 0, 1, 1),
    "3x3-pad1": ((2, 8, 4, 4), (8, 8, 3, 3), 1, 1, 1, 1),
    "3x3-stride2-pad1": ((2, 8, 5, 5), (16, 8, 3, 3), 2, 1, 1, 1),
    "2x2-stride2-patches": ((2, 8, 8, 8), (8, 8, 2, 2), 2, 0, 1, 1),
    "7x7-stride2-pad3": ((2, 3, 16, 16), (8, 3, 7, 7), 2, 3, 1, 1),
    "3x3-dilation2": ((1, 4, 9, 9), (6, 4, 3, 3), 1, 2, 2, 1),
    "1x3-uneven": ((2, 4, 5, 7), (6, 4, 1, 3), (1, 2), (0, 1), 1, 1),
}
DEPTHWISE_CASES = {
    "3x3-pad1": ((2, 16, 8, 8), (16, 1, 3, 3), 1, 1, 1, 16),
    "3x3-stride2-unpadded": ((2, 48, 9, 9), (48, 1, 3, 3), 2, 0, 1, 48),
    "7x7-pad3": ((2, 8, 4, 4), (8, 1, 7, 7), 1, 3, 1, 8),
    "multiplier2": ((2, 6, 5, 5), (12, 1, 3, 3), 1, 1, 1, 6),
    "dilation2-stride2": ((1, 8, 11, 11), (8, 1, 3, 3), 2, 2, 2, 8),
}


def _conv_fn(stride, padding, dilation, groups, with_bias):
    pair = lambda v: list(v) if isinstance(v, tuple) else [v, v]  # noqa: E731

    def fn(x, w, b):
        y = aten.convolution(x, w, b if with_bias else None, pair(stride), pair(padding), pair(dilation), False,
                             [0, 0], groups)
        return (y * 0.5).relu()  # an epilogue that reads the result

    return fn


def _kind(xs, ws, stride, padding, dilation, groups, dtype=torch.float32):
    out = torch.nn.functional.conv2d(torch.empty(xs, device="meta"), torch.empty(ws, device="meta"), None, stride,
                                     padding, dilation, groups).shape
    return small_conv_kind(xs, ws, tuple(out), groups, False, dtype, torch.device("cpu"))


def _compiled_case(kind, case, with_bias, dtype):
    """Compile the case's convolution (with an epilogue), check it against eager; the wrapper source."""
    xs, ws, stride, padding, dilation, groups = (GEMM_CASES if kind == "gemm" else DEPTHWISE_CASES)[case]
    assert _kind(xs, ws, stride, padding, dilation, groups) == kind
    x, w, b = torch.randn(xs, dtype=dtype), torch.randn(ws, dtype=dtype), torch.randn(ws[0], dtype=dtype)
    return check(_conv_fn(stride, padding, dilation, groups, with_bias), x, w, b, atol=2e-5, rtol=1e-5).wrapper_source


# CI: the star around the first
@pytest.mark.ci_slice({"case": list(GEMM_CASES)[0], "with_bias": True, "dtype": torch.float32})
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("case", list(GEMM_CASES), ids=str)
def test_dense_small_convolution_is_one_gemm(case, with_bias, dtype):
    source = _compiled_case("gemm", case, with_bias, dtype)
    assert ("extern_aten_addmm_out" if with_bias else "extern_aten_mm_out") in source
    assert "extern_aten_convolution" not in source and "mkldnn" not in source  # no ATen/oneDNN convolution


# CI: the star around the first
@pytest.mark.ci_slice({"case": list(DEPTHWISE_CASES)[0], "with_bias": True, "dtype": torch.float32})
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("case", list(DEPTHWISE_CASES), ids=str)
def test_depthwise_small_convolution_is_a_fused_loop(case, with_bias, dtype):
    # the taps and the epilogue are one kernel
    assert "extern_" not in _compiled_case("depthwise", case, with_bias, dtype)


def test_nhwc_input_is_read_in_place_for_a_1x1_gemm():
    x = torch.randn(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    compiled = check(_conv_fn(1, 0, 1, 1, True), x, torch.randn(12, 8, 1, 1), torch.randn(12), atol=2e-5, rtol=1e-5)
    assert "kernel" not in compiled.wrapper_source.split("extern_aten_addmm_out")[0].split("args.clear()")[1]


def test_graph_output_keeps_eager_strides():
    def fn(x, w):
        return aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)

    x, w = torch.randn(2, 8, 4, 4), torch.randn(8, 8, 3, 3)
    compiled = check(fn, x, w, atol=2e-5, rtol=1e-5)
    assert compiled(x, w)[0].stride() == fn(x, w).stride()


def test_backward_limit_is_lower_than_the_forward_one():
    xs, ws = (2, 8, 8, 8), (16, 8, 3, 3)  # 0.15 M multiply-adds
    out = (2, 16, 8, 8)
    assert small_conv_kind(xs, ws, out, 1, False, torch.float32, torch.device("cpu")) == "gemm"
    assert small_conv_kind(xs, ws, out, 1, False, torch.float32, torch.device("cpu"), backward=True) is None


def test_large_convolutions_keep_onednn():
    assert _kind((8, 64, 32, 32), (64, 64, 3, 3), 1, 1, 1, 1) is None
    assert _kind((8, 256, 32, 32), (256, 1, 3, 3), 1, 1, 1, 256) is None
    assert _kind((2, 8, 4, 4), (8, 2, 3, 3), 1, 1, 1, 4) is None  # grouped, not depthwise
    assert _kind((2, 8, 4, 4), (8, 8, 3, 3), 1, 1, 1, 1, torch.float16) is None
    x, w = torch.randn(2, 32, 24, 24), torch.randn(64, 32, 3, 3)
    compiled = check(_conv_fn(1, 1, 1, 1, False), x, w, torch.zeros(64), atol=1e-4, rtol=1e-4)
    assert "extern_aten_convolution" in compiled.wrapper_source


class MobileBlock(nn.Module):
    """MobileNetV2's inverted residual at a small image: 1x1 expand, depthwise 3x3, 1x1 project."""

    def __init__(self, c: int = 8, expand: int = 6) -> None:
        super().__init__()
        hidden = c * expand
        self.expand = nn.Sequential(nn.Conv2d(c, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6())
        self.depthwise = nn.Sequential(nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False),
                                       nn.BatchNorm2d(hidden), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(hidden, c, 1, bias=False), nn.BatchNorm2d(c))
        self.head = nn.Conv2d(c, 4, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x + self.project(self.depthwise(self.expand(x))))


def _randomize_statistics(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
    return model


def test_inference_block_matches_eager_and_follows_weight_changes():
    torch.manual_seed(0)
    model = _randomize_statistics(MobileBlock()).eval()
    compiled = kiln.compile(model)
    x = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
        model.depthwise[1].running_var.mul_(2.0)  # nothing is folded: the next call reads the new values
        model.expand[0].weight.mul_(-1.0)
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


def test_training_step_matches_eager_gradients():
    torch.manual_seed(0)
    model = _randomize_statistics(MobileBlock()).train()
    twin = copy.deepcopy(model)
    compiled = kiln.compile(twin)
    x = torch.randn(2, 8, 6, 6)
    model(x).square().sum().backward()
    compiled(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-4, rtol=1e-4, msg=name)
    for a, b in zip(model.buffers(), twin.buffers()):
        torch.testing.assert_close(b, a)


def test_symbolic_sizes_keep_onednn_and_match_eager():
    torch.manual_seed(0)
    model = _randomize_statistics(MobileBlock()).eval()
    compiled = kiln.compile(model, dynamic=True)
    with torch.no_grad():
        for size in (6, 7):
            x = torch.randn(2, 8, size, size)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


def _backward_fn(stride, padding, dilation, groups, mask):
    pair = lambda v: list(v) if isinstance(v, tuple) else [v, v]  # noqa: E731

    def fn(g, x, w):
        grads = aten.convolution_backward(g * 1.5, x, w, [w.shape[0]] if mask[2] else None, pair(stride),
                                          pair(padding), pair(dilation), False, [0, 0], groups, mask)
        return tuple(t for t in grads if t is not None)

    return fn


@pytest.mark.parametrize("mask", [[True, True, True], [True, False, False], [False, True, True]], ids=str)
@pytest.mark.parametrize("case", [f"gemm-{c}" for c in GEMM_CASES] + [f"depthwise-{c}" for c in DEPTHWISE_CASES],
                         ids=str)
def test_small_convolution_backward_is_computed(case, mask, monkeypatch):
    import kiln.lower.conv_layout as conv_layout

    monkeypatch.setattr(conv_layout, "SMALL_CONV_BACKWARD_MACS", 1 << 20)  # every case's backward computed
    kind, name = case.split("-", 1)
    xs, ws, stride, padding, dilation, groups = (GEMM_CASES if kind == "gemm" else DEPTHWISE_CASES)[name]
    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    out = torch.nn.functional.conv2d(torch.empty(xs), torch.empty(ws), None, pair(stride), pair(padding),
                                     pair(dilation), groups).shape
    g, x, w = torch.randn(out, dtype=torch.float64), torch.randn(xs, dtype=torch.float64), torch.randn(ws, dtype=torch.float64)
    compiled = check(_backward_fn(stride, padding, dilation, groups, mask), g, x, w)
    assert "extern_aten_convolution_backward" not in compiled.wrapper_source


@pytest.mark.parametrize("case", list(DEPTHWISE_CASES), ids=str)
def test_depthwise_on_nhwc_input_reads_unmasked_along_channels(case):
    """On NHWC input the taps read a zero-padded copy of the input and (kh, kw, C) weights along the
    vectorized channel loop: the kernel computing the convolution has no bounds-tested load."""
    xs, ws, stride, padding, dilation, groups = DEPTHWISE_CASES[case]
    x = torch.randn(xs).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(ws), torch.randn(ws[0])
    compiled = check(_conv_fn(stride, padding, dilation, groups, True), x, w, b, atol=2e-5, rtol=1e-5)
    assert "extern_" not in compiled.wrapper_source
    kernels = compiled.cpp_source.split('extern "C" void kernel')[1:]
    convolution = [k for k in kernels if re.search(r"// buf\d+ <- [^\n]*relu", k)]  # taps fused with the epilogue
    assert len(convolution) == 1, compiled.cpp_source
    assert "? [&]" not in convolution[0], convolution[0]
    if ws[0] == xs[1]:  # one output channel per input channel: the channel loop is the vectorized one
        assert f"y0 < {ws[0]}; y0++" in convolution[0], convolution[0]


@pytest.mark.parametrize("case", ["3x3-pad1", "7x7-pad3", "3x3-stride2-unpadded"], ids=str)
def test_depthwise_on_a_value_computed_from_nhwc_input_runs_along_channels(case):
    """The input is not stored but computed from NHWC data (a ReLU6 of an NHWC activation, as after
    MobileNetV2's expanding 1x1 convolution): the padded (or stored) copy is written NHWC too, so
    both it and the taps run along the channels. In NCHW order every load of the depthwise kernel
    jumped H * W elements (10x slower on MobileNetV2's layers)."""
    xs, ws, stride, padding, dilation, groups = DEPTHWISE_CASES[case]
    conv = _conv_fn(stride, padding, dilation, groups, True)

    def fn(x, w, b):
        return conv((x * 3.0).clamp(0.0, 6.0).exp(), w, b)

    x = torch.randn(xs).contiguous(memory_format=torch.channels_last)
    compiled = check(fn, x, torch.randn(ws), torch.randn(ws[0]), atol=1e-4, rtol=1e-4)
    kernels = compiled.cpp_source.split('extern "C" void kernel')[1:]
    assert kernels and all(f"y0 < {xs[1]}; y0++" in k for k in kernels if "convolution" in k), compiled.cpp_source
