"""A plain convolution's weight packed once for oneDNN in inference graphs (kiln.lower.pack_convolution,
kiln::pack_conv_weight): compiled == eager, the packed weight reused across calls, and packed again
after any in-place change of the weight or bias that eager sees, under no_grad, inference_mode and
with parameters that require no grad; a training graph keeps ATen's convolution."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.runtime.folded_weights import FOLD_CACHE

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _no_small_convolutions(monkeypatch):
    """Convolutions small enough to keep these tests quick would be computed without oneDNN."""
    import kiln.lower.conv_layout as conv_layout

    monkeypatch.setattr(conv_layout, "SMALL_CONV_GEMM_MACS", 0)
    monkeypatch.setattr(conv_layout, "SMALL_CONV_DEPTHWISE_MACS", 0)
    monkeypatch.setattr(conv_layout, "SMALL_CONV_BACKWARD_MACS", 0)


@pytest.fixture
def pack_calls(monkeypatch):
    """How many times kiln::pack_conv_weight's Python implementation ran (a native wrapper's memo
    answers a hit without calling it)."""
    calls = []
    original = FOLD_CACHE.packed
    monkeypatch.setattr(FOLD_CACHE, "packed", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, bias=False)
        self.dw = nn.Conv2d(8, 8, 5, padding=2, groups=8)
        self.head = nn.Conv2d(8, 4, 2, stride=2)

    def forward(self, x):
        y = torch.relu(self.conv1(x))
        y = self.conv2(y) + y
        return self.head(torch.nn.functional.silu(self.dw(y)))


def _net(requires_grad: bool = True) -> Net:
    torch.manual_seed(0)
    return Net().eval().requires_grad_(requires_grad)


def _close(a, b):
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


_GRAD_MODES = {"no_grad": (torch.no_grad, True), "inference_mode": (torch.inference_mode, True),
               "params_without_grad": (torch.enable_grad, False)}


def _changes(net: Net) -> list:
    """In-place changes eager sees, made where the test runs them (under no_grad)."""
    return [
        lambda: net.conv1.weight.mul_(-2.0),
        lambda: net.conv1.bias.add_(1.0),
        lambda: net.dw.weight[0].zero_(),  # through a view: the version counter is shared
        lambda: net.head.weight.copy_(torch.randn_like(net.head.weight)),
        lambda: net.load_state_dict({k: v * 0.5 for k, v in _net().state_dict().items()}),
    ]


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("grad_mode", list(_GRAD_MODES))
def test_packed_once_and_repacked_after_in_place_change(grad_mode, mode, pack_calls):
    """Every convolution of an inference graph runs on a packed weight, packed on the first call only;
    each in-place change of a weight or bias (also through a view, and load_state_dict) gives eager's
    new values. Under reduce-overhead the native wrapper's memo answers without calling the op."""
    context, requires_grad = _GRAD_MODES[grad_mode]
    net = _net(requires_grad)
    compiled = kiln.compile(net, mode=mode)
    x = torch.randn(2, 3, 12, 12)
    folds = FOLD_CACHE.folds
    with context():
        _close(compiled(x), net(x))
    assert FOLD_CACHE.folds - folds == 4, "each of the four convolutions' weights is packed"
    calls = len(pack_calls)
    for _ in range(3):
        with context():
            _close(compiled(x), net(x))
    assert FOLD_CACHE.folds - folds == 4, "unchanged weights are not packed again"
    if mode == "reduce-overhead":
        assert len(pack_calls) == calls, "the native wrapper's memo reuses the packed weights"
    for change in _changes(net):
        with torch.no_grad():
            change()
        with context():
            _close(compiled(x), net(x))
            _close(compiled(x), net(x))
    assert kiln.stats()["fallbacks"] == 0


def test_new_parameter_and_second_model():
    """A Parameter put in place of the weight, and a second model of the same code: each call packs
    the weight it is given, never another one's."""
    a, b = _net(), _net()
    with torch.no_grad():
        b.conv1.weight.mul_(3.0)
    ca, cb = kiln.compile(a), kiln.compile(b)
    x = torch.randn(1, 3, 10, 10)
    with torch.no_grad():
        _close(ca(x), a(x))
        _close(cb(x), b(x))
        a.conv2.weight = nn.Parameter(torch.randn_like(a.conv2.weight))
        _close(ca(x), a(x))
        _close(cb(x), b(x))


def test_two_input_sizes_keep_their_own_packs():
    """A weight packed for two input sizes (two graphs) keeps both: calls alternating between them
    pack nothing more."""
    net = _net()
    compiled = kiln.compile(net, dynamic=False)
    xs = [torch.randn(1, 3, 12, 12), torch.randn(2, 3, 16, 16)]
    with torch.no_grad():
        for x in xs:
            _close(compiled(x), net(x))
        folds = FOLD_CACHE.folds
        for x in xs * 2:
            _close(compiled(x), net(x))
    assert FOLD_CACHE.folds == folds


def test_weight_mutated_by_the_graph_is_not_packed():
    """A forward that scales its own weight in place: the convolution reads the new value each call
    (a packed copy would be made anew every call, so the weight is left to ATen)."""
    class Scaling(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 6, 3, padding=1)

        def forward(self, x):
            self.conv.weight.mul_(0.5)
            return self.conv(x)

    torch.manual_seed(0)
    net = Scaling().eval()
    ref = copy.deepcopy(net)
    compiled = kiln.compile(net)
    x = torch.randn(2, 3, 10, 10)
    folds = FOLD_CACHE.folds
    with torch.no_grad():
        for _ in range(3):
            _close(compiled(x), ref(x))
    _close(net.conv.weight, ref.conv.weight)
    assert FOLD_CACHE.folds == folds


def test_inference_tensor_weights_are_packed_every_call():
    """Parameters made under inference_mode have no version counter: an in-place change inside
    inference_mode cannot be seen, so their packed copy is never kept."""
    with torch.inference_mode():
        net = _net()
        compiled = kiln.compile(net)
        x = torch.randn(2, 3, 12, 12)
        _close(compiled(x), net(x))
        net.conv1.weight.mul_(-1.0)
        net.dw.bias.add_(2.0)
        _close(compiled(x), net(x))


def test_training_keeps_aten_convolution():
    """Weights that require grad, under grad mode: the graph is a training one; nothing is packed,
    and gradients and an optimizer step match eager's; the eval graph afterwards sees the new weights."""
    net = _net().train()
    ref = copy.deepcopy(net)
    compiled = kiln.compile(net)
    x = torch.randn(2, 3, 12, 12)
    folds = FOLD_CACHE.folds
    for _ in range(2):
        for m, fn in ((net, compiled), (ref, ref)):
            m.zero_grad()
            fn(x).square().sum().backward()
            with torch.no_grad():
                for p in m.parameters():
                    p.sub_(0.01 * p.grad)
        for (name, p), q in zip(net.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)
    assert FOLD_CACHE.folds == folds
    net.eval()
    ref.eval()
    with torch.no_grad():
        _close(compiled(x), ref(x))
        assert FOLD_CACHE.folds > folds  # the inference graph packs
        for p in net.parameters():
            p.mul_(1.5)
        for p in ref.parameters():
            p.mul_(1.5)
        _close(compiled(x), ref(x))


def test_pass_rewrites_only_module_state():
    """The pass itself: a convolution whose weight is a module's parameter becomes pack + oneDNN's
    convolution; one whose weight is a plain input stays ATen's."""
    from kiln.lower.pack_convolution import mkldnn_convolution, pack_conv_weight, pack_convolutions
    from tests.lower.conftest import aten_graph

    def fn(x, w1, b1, w2):
        y = aten.convolution(x, w1, b1, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return aten.convolution(y, w2, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)

    gm, _ = aten_graph(fn, torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4), torch.randn(4, 4, 3, 3))
    gm = pack_convolutions(gm, module_state=(1, 2), mutated=())
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(pack_conv_weight) == 1 and targets.count(mkldnn_convolution) == 1
    assert targets.count(aten.convolution.default) == 1
    gm2, _ = aten_graph(fn, torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4), torch.randn(4, 4, 3, 3))
    gm2 = pack_convolutions(gm2, module_state=(1, 2, 3), mutated=(3,))
    assert [n.target for n in gm2.graph.nodes if n.op == "call_function"].count(pack_conv_weight) == 1
