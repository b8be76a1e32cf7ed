"""The min cut on CNN training graphs: what a convolution's backward reads is saved, not recomputed,
and ReLU6's backward reads its output, so conv -> BatchNorm -> ReLU6 -> conv saves the convolution's
result and the activation (as PyTorch's partitioner does), not the BatchNorm's output besides, and
the backward has no pass that computes the activation again."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.autograd.conftest import assert_same_state, compile_fx

BN_OUTPUT = "output 0 of aten._native_batch_norm_legit_functional.default"


class ConvBnAct(nn.Module):
    """An inverted residual's expansion and depthwise layers: conv, BatchNorm, ReLU6 (or a given
    clamp), twice, then a projection convolution."""

    def __init__(self, act, channels: int = 8) -> None:
        super().__init__()
        self.act = act
        self.conv1, self.bn1 = nn.Conv2d(4, channels, 1, bias=False), nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.conv3 = nn.Conv2d(channels, 4, 1, bias=False)

    def forward(self, x):
        return self.conv3(self.act(self.bn2(self.conv2(self.act(self.bn1(self.conv1(x)))))))


ACTS = {
    "relu6_inplace": lambda t: F.relu6(t, inplace=True),
    "relu6": F.relu6,
    "hardtanh_module_inplace": nn.Hardtanh(-1.0, 1.0, inplace=True),
    "hardtanh": lambda t: F.hardtanh(t, -0.5, 2.0),
}


def _train_step(model, x):
    model(x).square().sum().backward()


@pytest.mark.parametrize("act", sorted(ACTS))
def test_conv_bn_clamp_saves_the_activation_not_the_batch_norm_output(twin, act):
    torch.manual_seed(0)
    eager, model = twin(ConvBnAct(ACTS[act]))
    x = torch.randn(2, 4, 6, 6)
    compiled = compile_fx(model, x)
    report = compiled.aot_report
    saved = [s.produced_by for s in report.saved]
    assert BN_OUTPUT not in saved, str(report)
    assert saved.count("aten.hardtanh.default") == 2, str(report)  # each convolution's input
    assert "aten.hardtanh.default(" not in report.backward_code, report.backward_code  # not computed twice
    assert not [r for r in report.recomputed if "hardtanh" in str(r)]
    _train_step(compiled, x)
    _train_step(eager, x)
    assert_same_state(eager, model, atol=1e-5)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("bounds", [(0.0, 6.0), (-1.0, 1.0), (2.0, 2.0)])
def test_clamp_backward_from_its_output_matches_eager_at_the_bounds(inplace, bounds):
    """The mask of hardtanh's backward read off its output: equal to eager's at values exactly on the
    bounds, past them, inside them and at NaN; equal bounds (where the output does not tell the
    input's side) keep reading the input."""
    import kiln

    low, high = bounds

    def f(x, w):
        y = x * w
        z = F.hardtanh(y, low, high, inplace=inplace)
        return z * w

    values = torch.tensor([[-7.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 6.0],
                           [6.5, float("nan"), -0.0, 5.999, 1.0001, -0.999, 2.0, 4.0]])
    w = torch.ones(8, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    kiln.reset()
    out = kiln.compile(f)(values, w)
    expected = f(values, we)
    torch.testing.assert_close(out, expected, equal_nan=True)
    grad = torch.arange(out.numel(), dtype=out.dtype).view_as(out) + 1
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(w.grad, we.grad, equal_nan=True)
    assert kiln.stats()["fallbacks"] == 0
    kiln.reset()


class ConvReluConv(nn.Module):
    """A ResNet-style pair: the ReLU's output is the second convolution's input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)

    def forward(self, x):
        return self.conv2(F.relu(self.bn1(self.conv1(x)) + 1.0) * 0.5)


def test_a_pointwise_convolution_input_is_saved_not_recomputed(twin):
    """(relu(bn + 1) * 0.5) is what conv2's backward reads: stored in the forward anyway, so saved
    rather than computed again in a backward pass of its own from a saved BatchNorm output."""
    torch.manual_seed(0)
    eager, model = twin(ConvReluConv())
    x = torch.randn(2, 3, 8, 8)
    compiled = compile_fx(model, x)
    report = compiled.aot_report
    saved = [s.produced_by for s in report.saved]
    assert "aten.mul.Tensor" in saved, str(report)
    assert "mul" not in [str(r).split()[0] for r in report.recomputed], str(report)
    _train_step(compiled, x)
    _train_step(eager, x)
    assert_same_state(eager, model, atol=1e-5)


def test_checkpointed_convolution_inputs_are_still_recomputed(twin):
    """Inside torch.utils.checkpoint the region's values are recomputed whatever they cost: the
    rule that saves a convolution's input does not override it."""
    from torch.utils.checkpoint import checkpoint

    import kiln

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = ConvReluConv()

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False).sum(dim=1)

    torch.manual_seed(0)
    eager, model = twin(Checkpointed().eval())  # eval: a recomputed BatchNorm would update its stats twice
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    kiln.reset()
    kiln.compile(model)(x).square().sum().backward()
    eager(xe).square().sum().backward()
    torch.testing.assert_close(x.grad, xe.grad, atol=1e-5, rtol=1e-5)
    assert_same_state(eager, model, atol=1e-5)
    assert kiln.stats()["fallbacks"] == 0
    kiln.reset()


def test_the_channels_last_threshold_agrees_with_the_lowering():
    from kiln.autograd.partition import NHWC_CONV_MIN_PIXELS
    from kiln.lower.conv_layout import CHANNELS_LAST_MIN_PIXELS

    assert NHWC_CONV_MIN_PIXELS == CHANNELS_LAST_MIN_PIXELS


def test_a_large_convolution_input_is_left_to_the_cut(twin):
    """At 16x16 pixels and more the forward's convolution runs channels-last on an input that only it
    reads; saved (a graph output keeps eager's layout) it would run NCHW: measured on a ResNeXt-style
    training step, 7% slower than the backward's pass that computes the input again. So there the
    rule does not apply, and the cut saves the smaller BatchNorm-side values as before."""
    torch.manual_seed(0)
    eager, model = twin(ConvReluConv())
    x = torch.randn(2, 3, 16, 16)
    compiled = compile_fx(model, x)
    report = compiled.aot_report
    assert "aten.mul.Tensor" not in [s.produced_by for s in report.saved], str(report)
    _train_step(compiled, x)
    _train_step(eager, x)
    assert_same_state(eager, model, atol=1e-5)
