"""The fold memo of the native tiers (aten_helpers.cpp's KilnFoldMemo; a plan's FOLD instruction, a
compiled wrapper's function-local static): a call of kiln::fold_conv_bn* whose six inputs are the
tensors of the last call, unchanged, takes the remembered results without the dispatcher and the
Python cache check; any change eager would see (in-place writes, a new Parameter, load_state_dict,
a train-mode step of the statistics) reaches the Python cache, and the memo keeps nothing alive."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.runtime import native
from kiln.runtime.folded_weights import FOLD_CACHE

pytestmark = pytest.mark.cpp


@pytest.fixture(autouse=True)
def _onednn_convolutions(monkeypatch):
    """Sizes that keep the test quick would run without oneDNN (and without a fold to pack)."""
    import kiln.lower.conv_layout as conv_layout

    monkeypatch.setattr(conv_layout, "SMALL_CONV_GEMM_MACS", 0)
    monkeypatch.setattr(conv_layout, "SMALL_CONV_DEPTHWISE_MACS", 0)
    kiln.reset()  # a graph compiled by an earlier test under another tier would answer


class Net(nn.Module):
    """Two conv+BN pairs: a bias-less convolution and an affine BN, a biased convolution and a BN
    without affine parameters (None inputs of the fold), a depthwise one in between."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.bn_dw = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 6, 1)
        self.bn2 = nn.BatchNorm2d(6, affine=False)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn_dw(self.dw(y)))
        return self.bn2(self.conv2(y))


def _net(dtype: torch.dtype) -> Net:
    torch.manual_seed(0)
    net = Net().to(dtype).eval()
    with torch.no_grad():
        for bn in (net.bn1, net.bn_dw, net.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
    return net


def _counting(monkeypatch) -> list:
    calls: list = []
    original = FOLD_CACHE.get
    monkeypatch.setattr(FOLD_CACHE, "get", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


TIERS = {"plan": {"native_plan": True}, "compiled": {"native_plan": False}}


@pytest.mark.parametrize("tier", list(TIERS))
@pytest.mark.parametrize("dtype,memory_format", [(torch.float32, torch.contiguous_format),
                                                 (torch.float32, torch.channels_last),
                                                 (torch.float64, torch.contiguous_format)])
def test_unchanged_weights_skip_the_python_fold(tier, dtype, memory_format, monkeypatch):
    made: list = []
    for name in ("make_native", "bind_plan"):
        original = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *a, _o=original, _n=name, **k: made.append(_n) or _o(*a, **k))
    calls = _counting(monkeypatch)
    net = _net(dtype)
    x = torch.randn(2, 3, 11, 13, dtype=dtype).to(memory_format=memory_format)
    tol = {"atol": 2e-5, "rtol": 1e-5} if dtype == torch.float32 else {}
    with kiln.config.patch(cpu_wrapper="auto", **TIERS[tier]), torch.no_grad():
        compiled = kiln.compile(net, mode="reduce-overhead")
        torch.testing.assert_close(compiled(x), net(x), **tol)
        native.wait_for_tier_up(600)  # the compiled wrapper is built in the background
        torch.testing.assert_close(compiled(x), net(x), **tol)
        assert made == ["bind_plan" if tier == "plan" else "make_native"]
        calls.clear()
        for _ in range(3):
            torch.testing.assert_close(compiled(x), net(x), **tol)
        assert calls == [], "an unchanged fold went back to Python"
        changes = [
            lambda: net.conv1.weight.mul_(-2.0),
            lambda: net.bn_dw.running_mean.add_(0.3),
            lambda: net.bn2.running_var.mul_(3.0),
            lambda: net.bn1.bias.sub_(0.5),
            lambda: net.conv2.bias.add_(1.0),
            lambda: setattr(net.conv2, "weight", nn.Parameter(torch.randn_like(net.conv2.weight))),
            lambda: net.bn1.running_var.set_(net.bn1.running_var.clone() * 2.0),  # another storage
        ]
        for change in changes:
            change()
            calls.clear()
            torch.testing.assert_close(compiled(x), net(x), **tol)
            assert len(calls) == 1, "the changed fold, and only it, is recomputed"
            calls.clear()
            torch.testing.assert_close(compiled(x), net(x), **tol)
            assert calls == []
        net.load_state_dict(_net(dtype).state_dict())
        torch.testing.assert_close(compiled(x), net(x), **tol)
    net.train()  # a train-mode step (another graph) moves the running statistics in place
    net(x)
    net.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), net(x), **tol)


@pytest.mark.parametrize("tier", list(TIERS))
def test_memo_keeps_nothing_alive(tier, monkeypatch):
    """The memo holds the results weakly: once the Python cache lets them go, the next call folds
    again; and a freed model's weights are freed."""
    calls = _counting(monkeypatch)
    net = _net(torch.float32)
    x = torch.randn(1, 3, 9, 9)
    with kiln.config.patch(cpu_wrapper="auto", **TIERS[tier]), torch.no_grad():
        compiled = kiln.compile(net, mode="reduce-overhead")
        compiled(x)
        native.wait_for_tier_up(600)
        compiled(x)
        compiled(x)
        FOLD_CACHE.entries.clear()
        calls.clear()
        torch.testing.assert_close(compiled(x), net(x), atol=2e-5, rtol=1e-5)
        assert len(calls) == 3
    weight = weakref.ref(net.conv1.weight)
    del net, compiled
    kiln.reset()
    gc.collect()
    assert weight() is None


@pytest.mark.parametrize("settings", [{"cpu_wrapper": "python"}, {"cpu_wrapper": "auto", "native_plan": True}])
def test_eager_train_step_refolds(settings):
    """Eager BatchNorm's train-mode call moves the running statistics without moving their version
    counters: the Python cache and the memo compare the statistics' values."""
    net = _net(torch.float32)
    x = torch.randn(2, 3, 10, 10)
    with kiln.config.patch(**settings), torch.no_grad():
        compiled = kiln.compile(net)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), net(x), atol=2e-5, rtol=1e-5)
        version = net.bn1.running_mean._version
        net.train()
        net(x * 3.0 + 1.0)
        net.eval()
        assert net.bn1.running_mean._version == version  # (what makes this case)
        torch.testing.assert_close(compiled(x), net(x), atol=2e-5, rtol=1e-5)
