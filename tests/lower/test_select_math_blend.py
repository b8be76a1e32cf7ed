"""A float select whose arm calls a vector math function (softplus: x > 20 ? x : log1p(exp(x)))
renders as kiln_blend, a bit blend of the two computed values: from `?:` GCC sank the call into a
branch, the loop stopped vectorizing and every element ran a whole libmvec call (softplus over 16K
floats at 4x eager's time). Selects without such a call keep `?:`."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .conftest import check

pytestmark = pytest.mark.cpp


def _inputs(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    specials = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 20.0, 20.000002, 1e30, -1e30, -104.0]
    return torch.cat([torch.randn(601, dtype=dtype) * 12, torch.tensor(specials, dtype=dtype)])


def _body(compiled) -> str:
    return compiled.cpp_source.split("// kernel0")[1]


CASES = {
    "softplus": lambda x: F.softplus(x),
    "softplus_beta": lambda x: F.softplus(x, beta=2.0, threshold=5.0),
    "where_log1p": lambda x: torch.where(x > 0, x, torch.log1p(x.abs())),
    "where_log_both_arms": lambda x: torch.where(x > 1, torch.log(x), torch.sin(x)),
    "where_tanh_right": lambda x: torch.where(x < 0, torch.tanh(x) * 2, x),
    "xlogy": lambda x: torch.xlogy(x.abs() - 1, x.abs()),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(CASES))
def test_select_with_a_math_call_is_a_blend_and_matches_eager(name, dtype) -> None:
    c = check(CASES[name], _inputs(dtype))
    assert "kiln_blend<" in _body(c)


def test_softplus_of_a_transposed_input_matches_eager() -> None:
    x, b = torch.randn(4, 32, 128) * 8, torch.randn(128)
    c = check(lambda x, b: F.softplus(x.transpose(1, 2) + b[:, None]), x, b)
    assert "kiln_blend<" in _body(c)


def test_blend_keeps_signed_zero_and_nan_bits() -> None:
    def fn(x):
        return torch.where(x.signbit(), -torch.log1p(x.abs()), x)
    x = torch.tensor([-0.0, 0.0, float("nan"), -float("nan"), -1.0, 2.0, float("-inf")] * 7)
    got = check(fn, x)(x)[0]
    assert torch.equal(got.view(torch.int32), fn(x).view(torch.int32))


@pytest.mark.parametrize("fn", [lambda x: torch.where(x > 0, x, x * 2), lambda x: F.relu(x) + F.elu(x),
                                lambda x: torch.where(x > 0, x, torch.exp(x))],
                         ids=["plain", "elu_inline_expm1", "inline_exp"])
def test_selects_without_a_library_call_keep_the_conditional(fn) -> None:
    c = check(fn, _inputs())
    assert "kiln_blend<" not in _body(c)
