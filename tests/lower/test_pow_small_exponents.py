"""x ** e for e in (3, -1, -2, -0.5) on float32/float64 lowers to multiplications, a reciprocal or
1/sqrt, as eager's pow kernel computes them, instead of a libm pow call per element (slow on a
negative base: GELU-tanh's x ** 3 made FNet's two GELU kernels 40% of its kernel time)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .conftest import check

pytestmark = pytest.mark.cpp


def _inputs(dtype: torch.dtype) -> torch.Tensor:
    specials = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-30, -1e-30, 1e30, -1e30, 1e-40, -3.0]
    return torch.cat([torch.randn(517, dtype=dtype) * 10, torch.tensor(specials, dtype=dtype)])


def _body(compiled) -> str:
    return compiled.cpp_source.split("// kernel0")[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("e", [3, 3.0, -1, -2, -0.5, -1.0])
def test_small_exponents_are_eager_bits_without_a_pow_call(e, dtype) -> None:
    c = check(lambda x: x ** e, _inputs(dtype), atol=0, rtol=0)
    assert "kiln_pow" not in _body(c)


def test_gelu_tanh_written_out_matches_eager_without_a_pow_call() -> None:
    def gelu_new(x):  # transformers' NewGELUActivation
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))
    c = check(gelu_new, torch.randn(64, 128) * 4)
    assert "kiln_pow" not in _body(c) and "kiln_tanhf(" in _body(c)


@pytest.mark.parametrize("fn", [lambda x: x ** 3, lambda x: x ** 2.5, lambda x: torch.pow(x, 3) + 1],
                         ids=["int_cube", "float_exponent_of_int", "int_pow_add"])
def test_integer_bases_keep_their_rules(fn) -> None:
    check(fn, torch.arange(-20, 20))


def test_other_exponents_keep_the_pow_call() -> None:
    c = check(lambda x: x ** 2.5, _inputs(torch.float32).abs())
    assert "kiln_powf(" in _body(c)
