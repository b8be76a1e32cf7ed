"""An operand of another dtype of a half/bfloat16 op is rounded to that dtype first, as eager converts it.

ATen's TensorIterator converts every operand to the common dtype (float16 for `int64 / half`)
before the kernel computes in float32; the lowering cast an integer load straight to float32, so
70000 stayed finite where eager's is inf (`y / x` gave 46656 for inf, `remainder` 1 for nan), 2049
compared greater than 2048 where eager's half 2049 is 2048, and a bfloat16 quotient of 70001 kept
bits eager's 70144 lost; the same for a Python scalar or float 0-d tensor (`half + 70000.0` is inf,
`half - 3.3333` subtracts 3.334), except where ATen's mul/div/floor_divide read it unrounded. Each case compares the inductor backend's result with eager's, dtype and
values (NaN and inf included).
"""
from __future__ import annotations

import pytest
import torch

import kiln


def _h(*v):
    return torch.tensor(v, dtype=torch.float16)


def _b(*v):
    return torch.tensor(v, dtype=torch.bfloat16)


CASES = {
    "int64_div_half": (lambda y, x: y / x, torch.tensor([70000, -3]), _h(1.5, 2.5)),
    # mul/div read a 0-d second operand unrounded (ATen's scalar path), a 1-d one rounded
    "int64_0d_scalar_mul_div_half": (lambda y, x: (x * y[0], x / y[1], x * y, x / y[2:]),
                                     torch.tensor([2049, 4099, 70001]), _h(33.3, -7.1, 0.3)),
    "half_div_int64": (lambda y, x: x / y, torch.tensor([70000, -3]), _h(1.5, 2.5)),
    "int32_div_half": (lambda y, x: y / x, torch.tensor([70000, 7], dtype=torch.int32), _h(1.5, 2.5)),
    "int64_floor_div_half": (lambda y, x: torch.div(y, x, rounding_mode="floor"), torch.tensor([70000, -3]), _h(1.5, 2.5)),
    "int64_remainder_half": (lambda y, x: torch.remainder(y, x), torch.tensor([70000, -3]), _h(1.5, 2.5)),
    "int64_gt_half": (lambda y, x: y > x, torch.tensor([2049, 4097, 3]), _h(2048.0, 4096.0, 3.0)),
    "int64_eq_half": (lambda y, x: y == x, torch.tensor([2049, 70000]), _h(2048.0, float("inf"))),
    "int64_div_bf16": (lambda y, x: y / x, torch.tensor([70001, 1001 * 70000]), _b(1.5, 3.0)),
    "int64_sub_bf16": (lambda y, x: y - x, torch.tensor([259, 1]), _b(2.0, 0.5)),
    "int16_div_half": (lambda y, x: y / x, torch.tensor([2049, -7], dtype=torch.int16), _h(3.0, 3.0)),
    # a Python scalar or a float 0-d tensor converts to the half dtype first too (add, sub, remainder,
    # comparisons, atan2, pow); mul/div/floor_divide read it unrounded
    "half_add_python_scalar": (lambda y, x: (x + 70000.0, x - 3.3333, x.bfloat16() + 3.3333,
                                             x * 3.3333, x / 0.1001, x // 3.3333),
                               torch.tensor(0), _h(-65504.0, 7.1, 300.3)),
    # lerp's weight is read unrounded: 0.7, not half's 0.7002
    "half_remainder_fmod_scalar": (lambda y, x: (torch.remainder(x, 0.1001), torch.fmod(x, 3.3333),
                                                 torch.lerp(x, -x, 0.7)), torch.tensor(0), _h(-65504.0, 7.1, 300.3)),
    "half_eq_atan2_float_0d": (lambda y, x: (x.bfloat16() == torch.tensor(-259.7), torch.atan2(x, torch.tensor(3.3333)),
                                             torch.pow(x.abs(), torch.tensor(0.1001, dtype=torch.float64))),
                               torch.tensor(0), _h(-260.0, 7.1, 300.3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_integer_operand_rounds_to_half_dtype(name):
    fn, y, x = CASES[name]
    expected = fn(y, x)
    kiln.reset()
    got = kiln.compile(fn, backend="inductor")(y, x)
    if isinstance(expected, tuple):
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype
            assert torch.equal(g.float().nan_to_num(0.5), e.float().nan_to_num(0.5)), (got, expected)
        return
    assert got.dtype == expected.dtype
    if expected.dtype.is_floating_point:
        assert torch.equal(got.isnan(), expected.isnan())
        # one op on exactly rounded operands: eager's result to the bit
        assert torch.equal(got.float().nan_to_num(0.5), expected.float().nan_to_num(0.5)), (got, expected)
    else:
        assert torch.equal(got, expected), (got, expected)
