"""Float -> integer conversions of values the target type cannot hold give eager's results.

C++ leaves such a conversion undefined (`x.clamp(min=-100).to(torch.uint8)` gave 0 where eager gives
156); ATen's CPU kernels give, on x86-64: uint8 the low byte of the int64 conversion, int8 and int16
the low bits of the int32 one, and the type's minimum (of int32 or int64) for NaN, infinities and
values out of range. Checked bit for bit against eager: every float source (float64, float32,
float16, bfloat16) to every integer target and bool, on special values and random magnitudes up to
1e20 (long enough for the vectorized loop and its tail), fused after other ops, as constants, under
dynamic shapes, and through the Triton code generator; plus the rule for constants
(kiln.lower.ops.integer_value) against eager directly.
"""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import kiln
from kiln import config
from kiln.lower.ops import integer_value

FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
TARGETS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool]
SPECIAL = [float("nan"), float("inf"), -float("inf"), 2.0 ** 31, -2.0 ** 31, 2.0 ** 31 - 1, -2.0 ** 31 - 1,
           2.0 ** 63, -2.0 ** 63, 2.0 ** 32, 2.0 ** 64, 3000000007.0, -3000000007.0, 4294967297.0, -0.0, 0.99,
           -0.99, -100.0, -156.7, 300.5, 1e10 + 3, -1e10 - 3, 255.5, 256.0, -129.5, 40000.0, -70000.2]


def _values(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    magnitude = 10.0 ** torch.randint(0, 21, (n,), generator=g).double()
    random = torch.randn(n, generator=g, dtype=torch.float64) * magnitude
    return torch.cat([torch.tensor(SPECIAL, dtype=torch.float64), random, torch.tensor(SPECIAL, dtype=torch.float64)])


def _to_all(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(x.to(t) for t in TARGETS)


def _compare(fn, *args, dynamic=None) -> None:
    expected = fn(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to eager would warn: the kernels must answer
        got = kiln.compile(fn, dynamic=dynamic)(*args)
    assert kiln.stats()["fallbacks"] == 0
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    for target, g, e in zip(TARGETS, got, expected):
        assert g.dtype == e.dtype
        bad = (g != e).nonzero().flatten()[:5].tolist()
        assert not bad, [(target, args[0][k].item(), e[k].item(), g[k].item()) for k in bad]


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kiln.reset()


@pytest.mark.parametrize("source", FLOATS, ids=str)
def test_constant_rule_is_eagers(source) -> None:
    values = _values(300).to(source)
    for target in TARGETS[:-1]:
        eager = values.to(target).tolist()
        mine = [integer_value(float(v), target) for v in values.tolist()]
        assert mine == eager, target


@pytest.mark.cpp
@pytest.mark.parametrize("source", FLOATS, ids=str)
def test_every_float_to_every_integer(source) -> None:
    _compare(_to_all, _values(3000).to(source))


@pytest.mark.cpp
def test_the_issue_examples_and_fused_chains() -> None:
    x = _values(500).float()
    _compare(lambda x: x.clamp(min=-100).to(torch.uint8), x)
    _compare(lambda x: torch.where(x < -100, -100.0, x).to(torch.uint8), x)
    # exact arithmetic before the conversion: a last-bit difference (an FMA) would change the low bits
    _compare(lambda x: _to_all((x * 4).neg().abs() * -1), x)
    _compare(lambda x: _to_all(x.view(-1, 3).amax(1)), x[: len(x) // 3 * 3])  # a reduction's result converted
    _compare(lambda x: _to_all(x.double() * 1024), x)


@pytest.mark.cpp
def test_constants_converted_in_kernels() -> None:
    x = torch.zeros(37)
    for value in (float("nan"), float("inf"), -1e20, -100.0, 300.7, 3000000007.0):
        _compare(lambda x: _to_all(torch.full_like(x, value, dtype=torch.float64) + x), x)
        kiln.reset()


@pytest.mark.cpp
def test_dynamic_shapes() -> None:
    fn = lambda x: _to_all(x * 1)  # noqa: E731
    compiled = kiln.compile(fn, dynamic=True)
    for n in (100, 2000):
        x = _values(n).float()
        for g, e in zip(compiled(x), fn(x)):
            assert torch.equal(g, e)


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("source", FLOATS, ids=str)
def test_triton_converts_like_eager(source) -> None:
    pytest.importorskip("triton")
    with config.patch(cpu_backend="triton"):
        _compare(_to_all, _values(100).to(source))
        kiln.reset()
        _compare(lambda x: torch.where(x < -100, -100.0, x).to(torch.uint8), _values(100).to(source))
