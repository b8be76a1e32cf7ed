"""BatchNorm folded into the convolution before it (kiln.lower.fold_batch_norm), convolutions and max
pooling on channels-last activations (kiln.lower.lowerings.convolution), and the ReLU/add epilogue
after a convolution: compiled == eager, also after the weights or BatchNorm statistics change."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.lower.fold_batch_norm import FOLD_CACHE, fold_conv_bn, fold_conv_bn_packed
from tests.lower.conftest import aten_graph, check

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _no_small_convolutions(monkeypatch):
    """These tests are about oneDNN's convolutions (folded, packed, channels-last): the sizes that keep
    them quick would be computed without oneDNN (tests/lower/test_small_conv.py covers that path)."""
    import kiln.lower.conv_layout as conv_layout

    monkeypatch.setattr(conv_layout, "SMALL_CONV_GEMM_MACS", 0)
    monkeypatch.setattr(conv_layout, "SMALL_CONV_DEPTHWISE_MACS", 0)
    monkeypatch.setattr(conv_layout, "SMALL_CONV_BACKWARD_MACS", 0)


def _bn_args(c: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.rand(c, dtype=dtype) + 0.5, torch.randn(c, dtype=dtype), torch.randn(c, dtype=dtype),
            torch.rand(c, dtype=dtype) + 0.5]


def conv_bn_relu(x, w, g, b, mean, var):
    y = aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return torch.relu(aten._native_batch_norm_legit_no_training(y, g, b, mean, var, 0.1, 1e-5)[0])


def conv_bias_bn_legit(x, w, cb, g, b, mean, var):
    y = aten.convolution(x, w, cb, [2, 2], [0, 0], [1, 1], False, [0, 0], 1)
    return aten._native_batch_norm_legit(y, g, b, mean, var, False, 0.1, 1e-3)[0] + x[:, :, ::2, ::2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_conv_bn_relu_folded(dtype):
    x, w = torch.randn(2, 4, 9, 9, dtype=dtype), torch.randn(6, 4, 3, 3, dtype=dtype)
    args = (x, w, *_bn_args(6, dtype))
    tol = {} if dtype == torch.float64 else {"atol": 2e-5, "rtol": 1e-5}  # float64: assert_close's defaults
    compiled = check(conv_bn_relu, *args, **tol)
    assert "extern_kiln_fold_conv_bn" in compiled.wrapper_source
    assert "extern_aten__native_batch_norm" not in compiled.wrapper_source


def test_conv_bias_bn_legit_folded_with_residual():
    x, w, cb = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 1, 1), torch.randn(4)
    compiled = check(conv_bias_bn_legit, x, w, cb, *_bn_args(4), atol=2e-5, rtol=1e-5)
    assert "fold_conv_bn" in compiled.wrapper_source


def test_not_folded_when_conv_output_is_used_twice():
    def fn(x, w, g, b, mean, var):
        y = aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return aten._native_batch_norm_legit_no_training(y, g, b, mean, var, 0.1, 1e-5)[0], y

    compiled = check(fn, torch.randn(2, 3, 6, 6), torch.randn(5, 3, 3, 3), *_bn_args(5))
    assert "fold_conv_bn" not in compiled.wrapper_source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fold_rewrites_graph(dtype):
    from kiln.lower.fold_batch_norm import fold_batch_norm
    gm, _ = aten_graph(conv_bn_relu, torch.randn(1, 2, 5, 5, dtype=dtype), torch.randn(3, 2, 3, 3, dtype=dtype),
                       *_bn_args(3, dtype))
    gm = fold_batch_norm(gm)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten._native_batch_norm_legit_no_training.default not in targets
    if dtype == torch.float32:  # on CPU the folded weight is also packed for oneDNN, which runs the conv
        assert fold_conv_bn_packed in targets and torch.ops.mkldnn._convolution_pointwise.default in targets
        assert aten.convolution.default not in targets
    else:  # float64: ATen's convolution on the folded weight
        assert fold_conv_bn in targets and aten.convolution.default in targets


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(3, 2, 1)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn1(self.conv1(x))))
        return torch.relu(self.bn2(self.conv2(y)) + y).mean((2, 3))


def _net() -> ConvNet:
    torch.manual_seed(0)
    net = ConvNet().eval()
    for bn in (net.bn1, net.bn2):
        nn.init.uniform_(bn.weight, 0.5, 1.5)
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
    return net


def _close(a, b):
    torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_weights_changed_after_compile_refold(mode, monkeypatch):
    """The folded weights follow every change eager sees: in-place updates of a weight, a BatchNorm
    statistic or affine parameter, load_state_dict, a new Parameter, a train-mode call moving the
    running statistics. Under reduce-overhead the native wrapper calls the fold (kiln's own op)
    and oneDNN's convolutions through the dispatcher."""
    from kiln.runtime import native

    made: list = []
    original, original_plan = native.make_native, native.bind_plan  # the compiled wrapper, or a plan
    monkeypatch.setattr(native, "make_native", lambda *a, **k: made.append(1) or original(*a, **k))
    monkeypatch.setattr(native, "bind_plan", lambda *a, **k: made.append(1) or original_plan(*a, **k))
    net = _net()
    compiled = kiln.compile(net, mode=mode)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        _close(compiled(x), net(x))
        if mode == "reduce-overhead":  # (the default mode may run a plan from the first call too)
            assert made
        folds = FOLD_CACHE.folds
        _close(compiled(x), net(x))
        assert FOLD_CACHE.folds == folds, "unchanged weights are not folded again"
        changes = [
            lambda: net.conv1.weight.mul_(-2.0),
            lambda: net.bn1.running_mean.add_(0.3),
            lambda: net.bn2.running_var.mul_(3.0),
            lambda: net.bn2.weight.add_(1.0),
            lambda: net.bn1.bias.sub_(0.5),
            lambda: net.conv2.bias.add_(1.0),
            lambda: net.load_state_dict({k: v * 0.5 if v.is_floating_point() else v
                                         for k, v in _net().state_dict().items()}),
            lambda: setattr(net.conv2, "weight", nn.Parameter(torch.randn_like(net.conv2.weight))),
        ]
        for change in changes:
            change()
            _close(compiled(x), net(x))
    # train-mode calls (another graph) update the running statistics in place; back in eval mode
    # the folded graph sees them
    net.train()
    compiled(x)
    net(x)
    net.eval()
    with torch.no_grad():
        _close(compiled(x), net(x))


def test_weights_changed_float64():
    net = _net().double()
    compiled = kiln.compile(net)
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), net(x))
        net.bn2.running_mean.add_(1.0)
        net.conv1.weight.mul_(0.5)
        torch.testing.assert_close(compiled(x), net(x))


def test_two_models_share_nothing():
    a, b = _net(), _net()
    with torch.no_grad():
        b.conv1.weight.mul_(2.0)
        ca, cb = kiln.compile(a), kiln.compile(b)
        x = torch.randn(1, 3, 8, 8)
        _close(ca(x), a(x))
        _close(cb(x), b(x))
        _close(ca(x), a(x))


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_channels_last_keeps_eager_strides(memory_format):
    """Inside the graph activations are NHWC; what comes out has eager's strides either way."""
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 6, 3, padding=1)
            self.pool = nn.MaxPool2d(2)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            return self.pool(y), y + 1

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 4, 16, 16).contiguous(memory_format=memory_format)
    with torch.no_grad():
        got, want = kiln.compile(net)(x), net(x)
    for g, w in zip(got, want):
        _close(g, w)
        assert g.stride() == w.stride()


@pytest.mark.parametrize("returned", ["result", "result_and_a_view"])
def test_packed_fold_returns_eager_strides(returned):
    """A folded conv -> BatchNorm whose result is returned: oneDNN's packed convolution gives NHWC,
    the program saw BatchNorm's NCHW result. It comes back in eager's strides, and a view of it
    (replayed on the real result by the runtime) works as eager's does; before, the result was NHWC
    and `y.view(-1)` raised "view size is not compatible" (found by tests/runtime/test_grad_modes_x_externs.py)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)).eval().requires_grad_(False)
    x = torch.randn(2, 8, 12, 12)

    def fn(t):
        y = model(t)
        return (y, y.view(-1)) if returned == "result_and_a_view" else y

    kiln.reset()
    want = fn(x)
    got = kiln.compile(fn)(x)
    for g, w in zip(*((got, want) if isinstance(want, tuple) else ((got,), (want,)))):
        _close(g, w)
        assert g.stride() == w.stride()


def test_training_step_with_channels_last_and_pooling():
    torch.manual_seed(0)
    net = ConvNet().train()
    ref = copy.deepcopy(net)
    x = torch.randn(2, 3, 12, 12)
    compiled = kiln.compile(net)
    compiled(x).sum().backward()
    ref(x).sum().backward()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)
    for b, c in zip(net.buffers(), ref.buffers()):
        torch.testing.assert_close(b, c)


def _extern_layouts(compiled, op):
    from kiln.lower.schedule import ExternCall
    return [s.node.layout for s in compiled.program.steps if isinstance(s, ExternCall) and s.node.op is op]


def test_conv_relu_conv_runs_channels_last_inside():
    """The ReLU between two convolutions is one kernel that reads the first one's NHWC output and
    writes the second one's NHWC input; the graph's output still has eager's (NCHW) strides."""
    def fn(x, w1, w2):
        y = torch.relu(aten.convolution(x, w1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
        return aten.convolution(y + 1, w2, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)

    compiled = check(fn, torch.randn(2, 4, 16, 16), torch.randn(8, 4, 3, 3), torch.randn(8, 8, 3, 3),
                     atol=1e-4, rtol=1e-5)
    layouts = _extern_layouts(compiled, aten.convolution.default)
    assert len(layouts) == 2 and all(int(lay.strides[1]) == 1 for lay in layouts)
    # x to NHWC, each weight to NHWC (kiln.lower.conv_layout NHWC_WEIGHT_COPY), relu + 1 between the
    # convolutions, output to NCHW
    assert compiled.kernel_count == 5
    out = compiled(torch.randn(2, 4, 16, 16), torch.randn(8, 4, 3, 3), torch.randn(8, 8, 3, 3))[0]
    assert out.is_contiguous()


def test_small_images_stay_nchw():
    def fn(x, w):
        return aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)

    compiled = check(fn, torch.randn(2, 8, 4, 4), torch.randn(8, 8, 3, 3), atol=1e-4, rtol=1e-5)
    assert all(int(lay.strides[3]) == 1 for lay in _extern_layouts(compiled, aten.convolution.default))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batch_norm_training(dtype):
    """BatchNorm's training forward and backward after a convolution (Kiln's kernels,
    tests/lower/test_batch_norm_train.py): gradients, running statistics and outputs match eager
    (float64: to assert_close's float64 defaults)."""
    torch.manual_seed(0)
    net = ConvNet().train().to(dtype)
    ref = copy.deepcopy(net)
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    tol = {} if dtype == torch.float64 else {"atol": 1e-4, "rtol": 1e-4}
    compiled = kiln.compile(net)
    for _ in range(2):
        for m in (net, ref):
            m.zero_grad()
        out, want = compiled(x), ref(x)
        torch.testing.assert_close(out, want, **tol)
        out.square().sum().backward()
        want.square().sum().backward()
        for (name, p), q in zip(net.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name, **tol)
        for b, c in zip(net.buffers(), ref.buffers()):
            torch.testing.assert_close(b, c, **tol)


_WARM_SCRIPT = """
import sys, torch, kiln
from torch import nn
torch.manual_seed(0)
# sizes above the small-convolution thresholds (kiln.lower.conv_layout), so that both fold
net = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 16, 1),
                    nn.BatchNorm2d(16)).eval()
with torch.no_grad():
    for bn in (net[1], net[4]):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
x = torch.randn(1, 16, 64, 64, generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    compiled = kiln.compile(net)
    torch.testing.assert_close(compiled(x), net(x), atol=2e-5, rtol=1e-5)
    net[1].running_var.mul_(2.0)
    torch.testing.assert_close(compiled(x), net(x), atol=2e-5, rtol=1e-5)
from kiln.runtime.folded_weights import FOLD_CACHE
assert FOLD_CACHE.folds == 3, FOLD_CACHE.folds  # both convolutions folded, then the changed one again
print(kiln.stats()["disk_hits"], "kiln.lower" in sys.modules)
"""


def test_folded_graph_warm_start(tmp_path):
    """A second process reads the folded graph back from the disk cache (the wrapper names
    kiln::fold_conv_bn, defined by the runtime, so the lowering need not be imported) and still
    refolds when a statistic changes."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", _WARM_SCRIPT], env=env, capture_output=True, text=True,
                           cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__)))) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    assert runs[1].stdout.split()[-2:] == ["1", "False"], runs[1].stdout + runs[1].stderr[-2000:]


def test_inference_tensor_weights_fold_every_call():
    """A model made under inference_mode has inference tensors for weights, which have no version
    counter (reading `_version` raises): the folded weights are computed on every call, never kept,
    so an in-place change inside inference_mode is seen. Before, the fold's cache raised
    "Inference tensors do not track version counter" on the first call."""
    with torch.inference_mode():
        net = _net()
        compiled = kiln.compile(net)
        x = torch.randn(2, 3, 12, 12)
        _close(compiled(x), net(x))
        net.conv1.weight.mul_(-1.0)
        net.bn2.running_mean.add_(0.5)
        _close(compiled(x), net(x))
