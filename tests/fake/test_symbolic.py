"""FakeTensorMode with a ShapeEnv: dynamic dims from from_real, ops on symbolic sizes."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln.symbolic as symbolic
from kiln.fake import FakeTensorMode, is_fake


def make(shape, dims, source="L['x']", layout=None):
    env = symbolic.ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    real = torch.randn(*shape)
    if layout is not None:
        real = layout(real)
    return env, mode, mode.from_real(real, source=source, dynamic_dims=dims)


def test_dynamic_dims_become_symbols_named_by_source():
    env, mode, x = make((5, 8), (0,))
    s0 = x.shape[0]
    assert symbolic.is_symbolic(s0) and x.shape[1] == 8
    assert env.size_hint(s0) == 5
    assert list(env.symbol_sources().values()) == ["L['x'].size()[0]"]
    assert x.stride() == (8, 1)


def test_contiguous_strides_are_products_of_symbolic_sizes():
    env, mode, x = make((5, 6, 7), (0, 1, 2))
    s0, s1, s2 = x.shape
    assert x.stride()[2] == 1
    assert symbolic.expr_of(x.stride()[1]) == symbolic.expr_of(s2)
    assert symbolic.expr_of(x.stride()[0]) == symbolic.expr_of(s1 * s2)
    assert x.is_contiguous()


def test_transposed_and_channels_last_layouts_survive():
    env, mode, x = make((6, 5), (0, 1), layout=lambda t: t.t().contiguous().t())
    assert x.stride()[0] == 1 and symbolic.expr_of(x.stride()[1]) == symbolic.expr_of(x.shape[0])
    env, mode, y = make((2, 3, 4, 5), (0, 2, 3), layout=lambda t: t.to(memory_format=torch.channels_last))
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_same_source_same_symbol_and_memo():
    env = symbolic.ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    t = torch.randn(4, 3)
    a = mode.from_real(t, source="L['x']", dynamic_dims=(0,))
    assert mode.from_real(t, source="L['x']", dynamic_dims=(0,)) is a


OPS = {
    "add_broadcast": (lambda x: x + torch.ones(8), ("s0", 8)),
    "matmul": (lambda x: x @ torch.randn(8, 3), ("s0", 3)),
    "view_flat": (lambda x: x.view(-1), ("8*s0",)),
    "reshape": (lambda x: x.reshape(-1, 4), ("2*s0", 4)),
    "sum": (lambda x: x.sum(0), (8,)),
    "mean_keepdim": (lambda x: x.mean(1, keepdim=True), ("s0", 1)),
    "cat": (lambda x: torch.cat([x, x]), ("2*s0", 8)),
    "slice": (lambda x: x[1:], ("s0 - 1", 8)),
    "softmax": (lambda x: x.softmax(-1), ("s0", 8)),
    "layer_norm": (lambda x: F.layer_norm(x, (8,)), ("s0", 8)),
    "linear": (lambda x: nn.Linear(8, 4)(x), ("s0", 4)),
    "factory": (lambda x: torch.zeros(x.shape[0], 2), ("s0", 2)),
    "new_empty": (lambda x: x.new_empty(x.shape[0] * 2), ("2*s0",)),
    "transpose_contig": (lambda x: x.t().contiguous(), (8, "s0")),
    "unsqueeze_expand": (lambda x: x.unsqueeze(0).expand(3, -1, -1), (3, "s0", 8)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_ops_on_symbolic_sizes(name):
    env, mode, x = make((5, 8), (0,))
    fn, expected = OPS[name]
    with mode:
        out = fn(x)
    assert is_fake(out)
    got = tuple(str(symbolic.expr_of(s)) if isinstance(s, torch.SymInt) else s for s in out.shape)
    assert got == expected


def test_conv_with_symbolic_spatial_sizes():
    env, mode, x = make((1, 3, 16, 16), (2, 3))
    with mode:
        out = nn.Conv2d(3, 4, 3, stride=2)(x)
    assert out.shape[1] == 4 and all(isinstance(s, torch.SymInt) for s in out.shape[2:])
    assert env.size_hint(out.shape[2]) == 7


def test_symbolic_autograd():
    env, mode, x = make((5, 8), (0,))
    with mode:
        w = torch.randn(8, 3, requires_grad=True)
        (x @ w).relu().sum().backward()
    assert w.grad.shape == (8, 3)


def test_guards_are_recorded():
    env, mode, x = make((5, 8), (0,))
    y = FakeTensorMode.from_real(mode, torch.randn(5, 8), source="L['y']", dynamic_dims=(0,))
    with mode:
        (x + y).sum()
    text = " ".join(g.python for g in env.guards)
    assert "L['x'].size()[0]" in text and "L['y'].size()[0]" in text


def test_transformer_layer_forward_backward_with_dynamic_batch_and_sequence():
    env = symbolic.ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    params = {n: mode.from_real(p, source=f"L['self'].{n}") for n, p in layer.named_parameters()}
    x = mode.from_real(torch.randn(3, 7, 16), source="L['x']", dynamic_dims=(0, 1))
    with mode:
        out = torch.func.functional_call(layer, params, (x,))
        out.sum().backward()
    assert [str(symbolic.expr_of(s)) if isinstance(s, torch.SymInt) else s for s in out.shape] == ["s0", "s1", 16]
    assert params["linear1.weight"].grad.shape == (32, 16)
    # Nothing about the symbols was assumed beyond the backed-size default.
    assert sorted(g.python for g in env.guards) == ["L['x'].size()[0] >= 2", "L['x'].size()[1] >= 2"]


def test_size_one_dynamic_dim_is_specialized():
    env, mode, x = make((1, 8), (0, 1))
    assert x.shape[0] == 1 and not isinstance(x.shape[0], torch.SymInt)
    assert symbolic.is_symbolic(x.shape[1])
    assert x.stride()[1] == 1 and symbolic.expr_of(x.stride()[0]) == symbolic.expr_of(x.shape[1])
