"""An extern whose CPU kernel leaves a result undefined (Python sees None) where its meta kernel says
an empty tensor: nn.MultiheadAttention's fast path (`_native_multi_head_attention` with
need_weights=False, what a TransformerDecoderLayer runs in inference after a graph break) returns no
attention weights. The compiled graph returns None there, as eager does, on each wrapper tier; it
crashed reading the missing tensor's dtype."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln import config

pytestmark = pytest.mark.cpp

WRAPPERS = {
    "python": {"cpu_wrapper": "python"},
    "compiled": {"cpu_wrapper": "native", "native_plan": False},
    "plan": {"cpu_wrapper": "native", "native_plan": True},
}

torch.manual_seed(0)
W, B, OW, OB = torch.randn(48, 16), torch.randn(48), torch.randn(16, 16), torch.randn(16)


def _mha(q, need_weights):
    return torch._native_multi_head_attention(q, q, q, 16, 4, W, B, OW, OB, None, need_weights)


def both_results(q):
    return _mha(q, False)


def weights_after_a_view(q):
    out, weights = _mha(q, False)
    return out.transpose(0, 1), weights


def weights_and_a_kernel(q):
    out, weights = _mha(q * 2, False)
    return (out + 1).relu(), weights


def weights_asked_for(q):
    out, weights = _mha(q, True)
    return out, weights * 2


def weights_asked_for_returned(q):
    return _mha(q, True)


PROGRAMS = [both_results, weights_after_a_view, weights_and_a_kernel, weights_asked_for, weights_asked_for_returned]


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_an_undefined_extern_result_is_returned_as_none(fn, wrapper):
    kiln.reset()
    try:
        with config.patch(**WRAPPERS[wrapper]), torch.no_grad():
            compiled = kiln.compile(fn, fullgraph=True)
            for _ in range(2):
                q = torch.randn(2, 5, 16)
                got, want = compiled(q), fn(q)
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    if w is None:
                        assert g is None
                    else:
                        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    finally:
        kiln.reset()
