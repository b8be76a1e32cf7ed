"""The weight of a convolution that runs NHWC is passed NHWC too (kiln.lower.conv_layout
NHWC_WEIGHT_COPY, applied in kiln.lower.lowerings.convolution): given an NCHW weight with an NHWC
input, ATen's oneDNN path copies the weight to NHWC itself on every call (a clone through the
dispatcher), which was slower than a copy in a kernel of the graph, as Inductor does it. Values
stay eager's in every grad mode, for a weight that is a view with an offset, a grouped convolution,
a 1x1 kernel (already NHWC: no copy), and a transposed convolution (left as it was)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.lower.conv_layout import channels_last_eligible
from kiln.lower.ir import BufferRef
from kiln.lower.lowerings.convolution import channels_last_strides
from kiln.lower.schedule import ExternCall

from .conftest import check

pytestmark = [pytest.mark.cpp, pytest.mark.skipif(not channels_last_eligible(torch.float32, torch.device("cpu"), 4),
                                                  reason="NHWC convolutions need oneDNN")]
aten = torch.ops.aten


def _conv_args(compiled) -> list[tuple]:
    return [s.node.args for s in compiled.program.steps
            if isinstance(s, ExternCall) and s.node.op is aten.convolution.default]


def _nhwc(ref: object) -> bool:
    assert isinstance(ref, BufferRef)
    lay = ref.layout
    want = channels_last_strides(lay.sizes)
    return all(int(s) == 1 or int(a) == int(b) for s, a, b in zip(lay.sizes, lay.strides, want))


@pytest.mark.parametrize("groups", [1, 2])
def test_nhwc_convolution_gets_nhwc_weight(groups: int) -> None:
    def fn(x, w, b):
        return aten.convolution(torch.relu(x), w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], groups) * 2

    # 16x16 pixels, 4.7 M multiply-adds: oneDNN, NHWC
    compiled = check(fn, torch.randn(2, 32, 16, 16), torch.randn(32, 32 // groups, 3, 3), torch.randn(32),
                     atol=1e-4, rtol=1e-4)
    (args,) = _conv_args(compiled)
    assert _nhwc(args[0]) and _nhwc(args[1])


def test_weight_view_with_offset() -> None:
    def fn(x, w_all):
        w = w_all[1:]  # a view at an offset of one weight
        return aten.convolution(torch.relu(x), w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)

    compiled = check(fn, torch.randn(2, 16, 16, 16), torch.randn(33, 16, 3, 3), atol=1e-4, rtol=1e-4)
    (args,) = _conv_args(compiled)
    assert _nhwc(args[1]) and args[1].layout.offset == 0


def test_one_by_one_kernel_needs_no_copy() -> None:
    def fn(x, w):
        return aten.convolution(torch.relu(x), w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1) + 1

    compiled = check(fn, torch.randn(2, 64, 16, 16), torch.randn(64, 64, 1, 1), atol=1e-4, rtol=1e-4)
    (args,) = _conv_args(compiled)
    assert _nhwc(args[1])
    assert compiled.kernel_count == 2  # relu into NHWC, the add after: no kernel copies the weight


def test_nchw_convolution_keeps_its_weight() -> None:
    def fn(x, w):  # 4x4 pixels: NCHW (kiln.lower.conv_layout)
        return aten.convolution(torch.relu(x), w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)

    compiled = check(fn, torch.randn(2, 128, 4, 4), torch.randn(128, 128, 3, 3), atol=1e-3, rtol=1e-4)
    (args,) = _conv_args(compiled)
    assert not _nhwc(args[0]) and not _nhwc(args[1])


def test_transposed_convolution_values() -> None:
    def fn(x, w):
        return aten.convolution(torch.relu(x), w, None, [2, 2], [1, 1], [1, 1], True, [1, 1], 1)

    check(fn, torch.randn(2, 16, 16, 16), torch.randn(16, 8, 3, 3), atol=1e-4, rtol=1e-4)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(8, 32, 3, padding=1), nn.Conv2d(32, 32, 3, padding=1)
        self.n = nn.GroupNorm(4, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(F.silu(self.n(self.c1(x)))) + x.mean()


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "train"])
def test_module_in_every_grad_mode(mode: str) -> None:
    kiln.reset()
    model = _Net()
    x = torch.randn(2, 8, 16, 16)
    compiled = kiln.compile(model)
    if mode == "train":
        got = compiled(x)
        got.square().mean().backward()
        got_grads = [p.grad.clone() for p in model.parameters()]
        for p in model.parameters():
            p.grad = None
        want = model(x)
        want.square().mean().backward()
        for g, p in zip(got_grads, model.parameters()):
            torch.testing.assert_close(g, p.grad, atol=1e-4, rtol=1e-3)
    else:
        ctx = torch.no_grad if mode == "no_grad" else torch.inference_mode
        with ctx():
            got, want = compiled(x), model(x)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert got.is_contiguous()


def _backward_args(compiled) -> list[tuple]:
    return [s.node.args for s in compiled.program.steps
            if isinstance(s, ExternCall) and s.node.op is aten.convolution_backward.default]


def _conv_backward(grad, x, w, groups, mask=(True, True, True)):
    k = w.shape[-1]
    return aten.convolution_backward(grad, x, w, [w.shape[0]], [1, 1], [k // 2, k // 2], [1, 1], False, [0, 0],
                                     groups, list(mask))


@pytest.mark.parametrize("case", ["stored_x", "computed_x", "nhwc_grad", "multiplier", "no_bias_grad"])
def test_depthwise_backward_runs_nhwc(case: str) -> None:
    """A depthwise convolution's backward (oneDNN's, 2.4 M multiply-adds) is given x and the
    gradient NHWC: ATen runs it in x's layout, 3x slower in NCHW (kiln.lower.conv_layout)."""
    c, mult = 48, 2 if case == "multiplier" else 1
    mask = (True, True, case != "no_bias_grad")

    def fn(grad, x, w):
        if case == "computed_x":
            x = torch.relu(x) * 2
        if case == "nhwc_grad":
            grad = grad.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2) + 1
        outs = _conv_backward(grad, x, w, c, mask)
        return tuple(o * 1 for o in outs if o is not None)

    args = (torch.randn(4, c * mult, 16, 16), torch.randn(4, c, 16, 16), torch.randn(c * mult, 1, 7, 7))
    compiled = check(fn, *args, atol=1e-3, rtol=1e-4)
    (bargs,) = _backward_args(compiled)
    assert _nhwc(bargs[0]) and _nhwc(bargs[1])
    assert all(t.is_contiguous() for t in compiled(*args))


def test_small_kernel_depthwise_backward_keeps_layout() -> None:
    def fn(grad, x, w):  # 3x3: NHWC gains nothing steady there (kiln.lower.conv_layout)
        return _conv_backward(grad, x, w, 96)

    args = (torch.randn(2, 96, 16, 16), torch.randn(2, 96, 16, 16), torch.randn(96, 1, 3, 3))
    compiled = check(fn, *args, atol=1e-3, rtol=1e-4)
    (bargs,) = _backward_args(compiled)
    assert not _nhwc(bargs[1])


def test_dense_backward_keeps_layout() -> None:
    def fn(grad, x, w):
        return _conv_backward(grad, x, w, 1)

    args = (torch.randn(2, 64, 8, 8), torch.randn(2, 64, 8, 8), torch.randn(64, 64, 3, 3))
    compiled = check(fn, *args, atol=1e-3, rtol=1e-4)
    (bargs,) = _backward_args(compiled)
    assert not _nhwc(bargs[1])


class _Depthwise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.dw = nn.Conv2d(3, 48, 4, stride=4), nn.Conv2d(48, 48, 7, padding=3, groups=48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return (h + self.dw(h).permute(0, 2, 3, 1).relu().permute(0, 3, 1, 2)).mean((2, 3))


def test_depthwise_training_step_matches_eager() -> None:
    kiln.reset()
    model = _Depthwise()
    x = torch.randn(4, 3, 64, 64)
    compiled = kiln.compile(model)
    compiled(x).square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    model(x).square().sum().backward()
    for g, p in zip(got, model.parameters()):
        # the same strides, but for a dimension of size 1 (the depthwise weight's input channel: ATen
        # returns NHWC's there for NHWC x, which no reader can tell apart)
        assert all(a == b for n, a, b in zip(g.shape, g.stride(), p.grad.stride()) if n != 1)
        torch.testing.assert_close(g, p.grad, atol=1e-4, rtol=1e-3)



def test_dynamic_sizes_keep_eager_values() -> None:
    """Symbolic sizes: the depthwise backward rule needs static ones (it stays ATen's NCHW call);
    values stay eager's."""
    def fn(grad, x, w):
        return _conv_backward(grad, x, w, 48)

    args = (torch.randn(4, 48, 16, 16), torch.randn(4, 48, 16, 16), torch.randn(48, 1, 7, 7))
    compiled = check(fn, *args, atol=1e-3, rtol=1e-4, dynamic=True)
    assert len(_backward_args(compiled)) == 1
