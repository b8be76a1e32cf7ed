"""An op whose eager CPU kernel refuses its inputs' dtypes raises eager's error when compiled too,
instead of a value computed by a kernel Kiln wrote (kiln/lower/eager_dtypes.py); ops eager accepts
(integer indices, bool masks, half inputs) are still lowered."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.lower.eager_dtypes import EAGER_REFUSES, mark_refused

pytestmark = pytest.mark.cpp

BOOL = torch.tensor([True, False, True, True])
LONG = torch.tensor([3, -1, 4, 1])
CPLX = torch.randn(4, dtype=torch.complex64)

REFUSED = [
    ("argmax_bool", lambda x: x.argmax(), BOOL),
    ("relu_bool", lambda x: torch.relu(x), BOOL),
    ("abs_bool", lambda x: torch.abs(x), BOOL),
    ("softmax_long", lambda x: torch.softmax(x, 0), LONG),
    ("hardswish_long", F.hardswish, LONG),
    ("logaddexp_long", lambda x: torch.logaddexp(x, x), LONG),
    ("fused_then_refused", lambda x: torch.softmax(x * 2 + 1, 0), LONG),
    ("clamp_complex", lambda x: x.clamp(-1, 1), CPLX),
    ("pow_long_negative_int", lambda x: (x + 1) ** -1, LONG),  # an int tensor to a negative int power
    ("pow_int32_negative_fused", lambda x: (x.int() * 2).pow(-2) + 1, LONG),
]


@pytest.mark.parametrize("name,fn,x", REFUSED, ids=[r[0] for r in REFUSED])
def test_compiled_raises_what_eager_raises(name, fn, x):
    with pytest.raises(Exception) as eager:
        fn(x)
    kiln.reset()
    with pytest.raises(type(eager.value)) as compiled:
        kiln.compile(fn)(x)
    assert str(compiled.value).splitlines()[0] == str(eager.value).splitlines()[0]


ACCEPTED = [
    ("embedding", lambda w, i: F.embedding(i, w).sum(), (torch.randn(10, 3), torch.tensor([[1, 2], [0, 9]]))),
    ("gather", lambda x, i: x.gather(1, i) * 2, (torch.randn(3, 4), torch.zeros(3, 2, dtype=torch.long))),
    ("masked_fill", lambda x, m: x.masked_fill(m, 0.0).relu(), (torch.randn(4), BOOL)),
    ("int_arith", lambda a, b: (a * 3 + b) // 2, (LONG, LONG.flip(0))),
    ("int_pow_positive", lambda a, b: (a * 3) ** 2 + b.pow(0), (LONG, LONG.flip(0))),
    ("bool_ops", lambda a, b: (a & b) | ~a, (BOOL, BOOL.flip(0))),
    ("half", lambda a, b: (a * b).sum(-1), (torch.randn(4, 4).half(), torch.randn(4, 4).half())),
    ("cross_entropy", lambda x, t: F.cross_entropy(x, t), (torch.randn(4, 5), torch.tensor([0, 4, 2, 1]))),
]


@pytest.mark.parametrize("name,fn,args", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_accepted_dtypes_are_lowered_not_refused(name, fn, args):
    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(*args)
    metas = {n: n.meta.get("val") for n in gm.graph.nodes}
    assert mark_refused(gm, metas, lambda target: True) == 0, [n.meta[EAGER_REFUSES] for n in gm.graph.nodes if EAGER_REFUSES in n.meta]
    kiln.reset()
    got, expected = kiln.compile(fn)(*args), fn(*args)
    torch.testing.assert_close(got, expected, atol=1e-2, rtol=1e-2)
