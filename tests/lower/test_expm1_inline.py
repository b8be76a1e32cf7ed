"""Float expm1 in kernels is the prelude's inline kiln_expm1f_inline (a series near zero, exp - 1
beyond), not libmvec's expm1f, which ran an ELU (a GAT layer's activation) 1.7x longer than eager:
within a few ulp of the correctly rounded result, zeros keep their sign, infinities and NaN as
eager, and one result per input in a vector lane, a remainder and a scalar loop."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .conftest import check
from .ulp_check import check_float_fn

pytestmark = pytest.mark.cpp


def test_inline_float_expm1_is_close_and_the_same_in_every_loop() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.cat([torch.rand(200_003, generator=gen) * 40 - 30, torch.rand(50_000, generator=gen) * 2 - 1,
                   torch.rand(10_000, generator=gen) * 2e-3 - 1e-3,
                   torch.tensor([float("-inf"), float("inf"), float("nan"), 0.0, -0.0, 0.5, -0.5, 0.49999997,
                                 -0.49999997, 1e-30, -1e-30, 1e-40, 88.72, 89.0, -104.0, -1e30])])
    # correctly rounded (double expm1 is far more precise); zeros keep their sign
    check_float_fn("kiln_expm1f_inline", a, a.double().expm1().float(), max_ulps=3, signs=True)


@pytest.mark.parametrize("fn", [torch.expm1, lambda x: F.elu(x), lambda x: F.selu(x), lambda x: F.celu(x),
                                lambda x: F.elu(x, alpha=0.5)],
                         ids=["expm1", "elu", "selu", "celu", "elu_alpha"])
def test_expm1_activations_match_eager_and_call_no_libmvec_expm1(fn) -> None:
    x = torch.cat([torch.randn(7, 67) * 3, torch.tensor([[0.0, -0.0, float("-inf"), float("inf"), float("nan")] * 13
                                                         + [0.5, -0.5]])])
    c = check(fn, x)
    assert "kiln_expm1f_inline(" in c.cpp_source and "kiln_expm1f(" not in c.cpp_source.split("// kernel0")[1]


def test_double_expm1_keeps_libm() -> None:
    check(torch.expm1, torch.randn(5, 33, dtype=torch.float64))
