"""A query the lowering computes (a rotary embedding of heads split off a projection) is stored in
the layout its trace gave it before ATen's CPU flash attention reads it (kiln/lower/graph.py,
_LAYOUT_FOLLOWS_INPUTS): that kernel returns its output in its query's stride order, so the result
has the layout the node's meta declares and no call re-lays it out (before: stored contiguous, the
result came [B, H, L, D] and the wrapper copied it into [B, L, H, D] on every call)."""
from __future__ import annotations

import gc
import types

import pytest
import torch
import torch.nn as nn

import kiln
from kiln import config
from kiln.runtime import kernel_wrapper

pytestmark = pytest.mark.cpp


class _RotaryAttention(nn.Module):
    def __init__(self, heads: int, dim: int, kv_from_query: bool) -> None:
        super().__init__()
        self.heads, self.dim, self.kv_from_query = heads, dim, kv_from_query
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)

    def _rotate(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = t.shape[-1] // 2
        return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        split = (b, n, self.heads, self.dim // self.heads)
        q = self._rotate(self.q(x).view(split).transpose(1, 2), cos, sin)
        k = self.k(x).view(split).transpose(1, 2)
        k = self._rotate(k, cos, sin) if not self.kv_from_query else q * 0.5
        v = self.v(x).view(split).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-2, -1) * (self.dim // self.heads) ** -0.5, dim=-1) @ v
        return self.o(att.transpose(1, 2).reshape(b, n, self.dim))


def _flash_wrappers(before: set[int]) -> list[dict]:
    found = [f.__globals__ for f in gc.get_objects() if type(f) is types.FunctionType and f.__name__ == "call"
             and f.__code__.co_filename == "<kiln wrapper>" and id(f.__globals__) not in before]
    return [g for g in found if torch._scaled_dot_product_flash_attention_for_cpu in g.values()]


def _all_wrapper_globals() -> set[int]:
    return {id(f.__globals__) for f in gc.get_objects() if type(f) is types.FunctionType and f.__name__ == "call"
            and f.__code__.co_filename == "<kiln wrapper>"}


@pytest.mark.parametrize("wrapper", ["python", "native"])
@pytest.mark.parametrize("shape", [(2, 8, 4, 32), (1, 16, 2, 16), (3, 5, 4, 32)])
@pytest.mark.parametrize("kv_from_query", [False, True])
def test_rotary_query_is_not_relaid_out(monkeypatch, wrapper, shape, kv_from_query):
    b, n, heads, dim = shape
    monkeypatch.setattr(config, "cpu_wrapper", wrapper)
    kiln.reset()
    copies = []
    real_copy = kernel_wrapper.strided_copy
    monkeypatch.setattr(kernel_wrapper, "strided_copy", lambda t, s: copies.append(s) or real_copy(t, s))
    torch.manual_seed(0)
    model = _RotaryAttention(heads, dim, kv_from_query).eval()
    x = torch.randn(b, n, dim)
    angles = torch.randn(n, dim // heads)
    cos, sin = angles.cos(), angles.sin()
    before = _all_wrapper_globals()
    compiled = kiln.compile(model)
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            want = model(x, cos, sin)
            for _ in range(2):
                got = compiled(x, cos, sin)
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if wrapper == "python":
        assert _flash_wrappers(before), "the attention was not fused into ATen's CPU flash attention"
        assert copies == []
