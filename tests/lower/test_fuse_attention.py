"""Attention written out by hand (q @ k.transpose(-2, -1), a scale, softmax, @ v) runs as one call of ATen's fused CPU attention kernel (kiln/lower/fuse_attention.py), as
torch.compile's pattern matcher does: no bmm, no [B, H, L, S] scores in memory, values as eager's.

Not fused: attention with an additive mask (slower end to end on a CLIP text encoder), a training forward (the softmax is saved for the backward, so it has two readers), a
single-row query (a decode step: Kiln's vector_bmm), a half-precision softmax, a value whose width
differs from the query's, a softmax over another dim. A key and value broadcast over heads by the
caller's expand (grouped-query attention) are passed to the fused kernel as the expanded views.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kiln

from .conftest import check

pytestmark = pytest.mark.cpp

aten = torch.ops.aten
FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default


def _vit_attention(x, w):
    b, n, d = x.shape
    q, k, v = (x @ w).reshape(b, n, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
    a = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // 4))
    return (a.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, d)


def _divided_scale(q, k, v):
    return ((q @ k.transpose(-2, -1)) / 4.0).softmax(-1) @ v


def _no_scale(q, k, v):
    return torch.matmul(q, k.transpose(-1, -2)).softmax(-1) @ v


def _additive_mask(q, k, v, m):
    return ((q @ k.transpose(-2, -1)) * 0.25 + m).softmax(-1) @ v


def _mask_first(q, k, v, m):
    return (m + (q @ k.transpose(-2, -1)) * 0.25).softmax(-1) @ v


def _attention_then_more(q, k, v):
    return (((q @ k.transpose(-2, -1)) * 0.3).softmax(-1) @ v).relu() + q


def _gqa(q, k, v):
    k, v = k.expand(2, 4, 6, 8), v.expand(2, 4, 6, 8)
    return ((q @ k.transpose(-2, -1)) * 0.25).softmax(-1) @ v


_QKV = lambda *s: tuple(torch.randn(*s) for _ in range(3))  # noqa: E731

_FUSED = {
    "vit": (_vit_attention, lambda: (torch.randn(2, 9, 32), torch.randn(32, 96) / math.sqrt(32))),
    "divided_scale": (_divided_scale, lambda: _QKV(2, 3, 7, 8)),
    "no_scale": (_no_scale, lambda: _QKV(1, 2, 5, 4)),
    "mask_2d": (_additive_mask, lambda: (*_QKV(2, 3, 6, 8), torch.randn(6, 6))),
    "mask_4d": (_additive_mask, lambda: (*_QKV(2, 3, 6, 8), torch.randn(2, 3, 6, 6))),
    "mask_broadcast_rows": (_additive_mask, lambda: (*_QKV(2, 3, 6, 8), torch.randn(2, 1, 1, 6))),
    "causal_mask_first": (_mask_first, lambda: (*_QKV(2, 2, 5, 4), torch.full((5, 5), float("-inf")).triu(1))),
    "then_more": (_attention_then_more, lambda: _QKV(2, 2, 6, 4)),
    "float64": (_divided_scale, lambda: tuple(t.double() for t in _QKV(2, 2, 5, 4))),
    "longer_keys": (lambda q, k, v: ((q @ k.transpose(-2, -1)) * 0.5).softmax(-1) @ v,
                    lambda: (torch.randn(2, 2, 3, 4), torch.randn(2, 2, 9, 4), torch.randn(2, 2, 9, 4))),
    "heads_expanded_by_the_caller": (lambda q, k, v: _gqa(q, k, v),
                                     lambda: (torch.randn(2, 4, 6, 8), torch.randn(2, 1, 6, 8), torch.randn(2, 1, 6, 8))),
    # q, k, v as views with storage offsets: sliced from one input inside the graph, or passed in as slices
    "sliced_inside_from_one_input": (lambda x: _divided_scale(x[..., 1:9], x[..., 9:17], x[..., 17:25]),
                                     lambda: (torch.randn(2, 3, 7, 26),)),
    "offset_views_passed_in": (_divided_scale,
                               lambda: (lambda b: (b[:, :, 2:8, :8], b[:, :, 1:, 3:11], b[:, :, 1:, 12:20]))(torch.randn(2, 3, 9, 20))),
}


_MASKED = ("mask_2d", "mask_4d", "mask_broadcast_rows", "causal_mask_first")


@pytest.mark.parametrize("name", [n for n in _FUSED if n not in _MASKED])
def test_written_out_attention_is_one_fused_call(name) -> None:
    fn, make = _FUSED[name]
    c = check(fn, *make(), atol=1e-5, rtol=1e-5)
    assert c.extern_ops.count(FLASH) == 1, c.wrapper_source
    assert aten.bmm.default not in c.extern_ops, c.wrapper_source


@pytest.mark.parametrize("name", _MASKED)
def test_masked_attention_stays_as_written(name) -> None:
    fn, make = _FUSED[name]
    c = check(fn, *make(), atol=1e-5, rtol=1e-5)
    assert FLASH not in c.extern_ops, c.wrapper_source


def _probs_returned(q, k, v):
    p = ((q @ k.transpose(-2, -1)) * 0.25).softmax(-1)
    return p @ v, p


def _softmax_other_dim(q, k, v):
    return ((q @ k.transpose(-2, -1)) * 0.25).softmax(-2) @ v


_NOT_FUSED = {
    "single_query_row": (_divided_scale, lambda: (torch.randn(2, 3, 1, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8))),
    "half": (_divided_scale, lambda: tuple(t.half() for t in _QKV(1, 2, 5, 8))),
    "value_of_another_width": (lambda q, k, v: ((q @ k.transpose(-2, -1)) * 0.5).softmax(-1) @ v,
                               lambda: (torch.randn(2, 2, 3, 4), torch.randn(2, 2, 9, 4), torch.randn(2, 2, 9, 6))),
    "probabilities_read_twice": (_probs_returned, lambda: _QKV(2, 2, 5, 4)),
    "softmax_other_dim": (_softmax_other_dim, lambda: _QKV(2, 2, 5, 5)),
}


@pytest.mark.parametrize("name", list(_NOT_FUSED))
def test_attention_the_fused_kernel_cannot_take_stays_as_written(name) -> None:
    fn, make = _NOT_FUSED[name]
    args = make()
    tol = {"atol": 1e-2, "rtol": 1e-2} if args[0].dtype == torch.half else {}
    c = check(fn, *args, **tol)
    assert FLASH not in c.extern_ops, c.wrapper_source


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x):
        return _vit_attention_linear(x, self.qkv)


def _vit_attention_linear(x, qkv):
    b, n, d = x.shape
    q, k, v = qkv(x).reshape(b, n, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
    return (((q @ k.transpose(-2, -1)) * 0.35).softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)


def test_training_keeps_the_softmax_for_the_backward() -> None:
    kiln.reset()
    torch.manual_seed(0)
    m = _Block()
    ref = _Block()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 5, 16)
    out = kiln.compile(m)(x)
    out.pow(2).sum().backward()
    want = ref(x)
    want.pow(2).sum().backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(m.qkv.weight.grad, ref.qkv.weight.grad)


def test_inference_module_end_to_end_matches_eager() -> None:
    kiln.reset()
    m = _Block().eval()
    x = torch.randn(3, 7, 16)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(m)(x), m(x), atol=1e-5, rtol=1e-5)


def test_dynamic_shapes_match_eager_at_every_length() -> None:
    """Under dynamic=True the scores' sizes are symbols: the pass leaves the graph as written (it matches static
    sizes only), and every sequence length gives eager's values from one graph."""
    kiln.reset()
    f = kiln.compile(_divided_scale, dynamic=True)
    with torch.no_grad():
        for n in (5, 8, 13):
            args = _QKV(2, 3, n, 8)
            torch.testing.assert_close(f(*args), _divided_scale(*args), atol=1e-5, rtol=1e-5)
    assert kiln.stats()["compiles"] == 1
