"""In-place arithmetic that cannot write its promoted result type into self raises as in eager.
Eager's `x.mul_(1.5)` on an integer tensor, `b.mul_(2)` on a bool tensor, `f.add_(1j)` on a float
tensor and `i.addcmul_(i, f)` raise "result type Float can't be cast to the desired output type
Long". ATen's meta kernels of mul_/add_/sub_/addcmul_/addcdiv_ skip that check, so a functionalized
graph (aot_eager, inductor) computed the promoted result out of place and copied it back with a
silent cast. Each case runs eagerly and through every backend and compares outcome and message.
"""
from __future__ import annotations

import pytest
import torch

import kiln




def _int_mul_float(x):
    x.mul_(1.5)
    return x


def _int_imul_float(x):
    x *= 0.5
    return x + 1


def _bool_mul_int(b):
    return b.mul_(2)


def _bool_mul_int_tensor(b):
    b.mul_(torch.tensor([2, 3]))
    return b


def _float_add_complex(f):
    f.add_(torch.ones(2, dtype=torch.complex64))
    return f


def _int_addcmul_float(x):
    x.addcmul_(x, torch.full((2,), 0.5))
    return x


def _int_mul_int(x):
    x.mul_(3)
    return x


def _float_mul_double_0dim(x):
    x.mul_(torch.tensor(1.5, dtype=torch.float64))
    return x


def _int8_mul_bool(x):
    x.mul_(torch.tensor([True, False]))
    return x


def _complex_add_float(c):
    c.add_(torch.ones(2))
    return c


def _half_addcmul_float(x):
    x.addcmul_(torch.ones(2), torch.ones(2), value=2)
    return x


# (raises in eager, a castable sibling that must still compute, input)
CASES = [
    (_int_mul_float, _int_mul_int, lambda: torch.tensor([1, 2])),
    (_int_imul_float, _int_mul_int, lambda: torch.tensor([4, 2])),
    (_bool_mul_int, _float_mul_double_0dim, lambda: torch.tensor([True, False])),
    (_bool_mul_int_tensor, _int8_mul_bool, lambda: torch.tensor([True, False])),
    (_float_add_complex, _complex_add_float, lambda: torch.ones(2)),
    (_int_addcmul_float, _half_addcmul_float, lambda: torch.tensor([1, 2])),
]
SIBLING_INPUTS = {
    _int_mul_int: lambda: torch.tensor([1, 2]), _float_mul_double_0dim: lambda: torch.ones(2),
    _int8_mul_bool: lambda: torch.tensor([1, 2], dtype=torch.int8),
    _complex_add_float: lambda: torch.ones(2, dtype=torch.complex64),
    _half_addcmul_float: lambda: torch.ones(2, dtype=torch.float16),
}


def _outcome(fn, x):
    try:
        return ("value", fn(x), x)
    except RuntimeError as e:
        return ("raised", str(e).splitlines()[0], x)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn,sibling,make", CASES, ids=[c[0].__name__ for c in CASES])
def test_inplace_result_type_cast_raises_as_eager(fn, sibling, make, backend):
    expected = _outcome(fn, make())
    assert expected[0] == "raised"
    kiln.reset()
    got = _outcome(kiln.compile(fn, backend=backend), make())
    assert got[0] == "raised", f"no error; returned {got[1]}"
    assert got[1] == expected[1]
    assert torch.equal(got[2], make())  # the input is left as it was
    # a result type that casts still computes, with eager's dtype
    want = sibling(SIBLING_INPUTS[sibling]())
    have = kiln.compile(sibling, backend=backend)(SIBLING_INPUTS[sibling]())
    assert have.dtype == want.dtype and torch.equal(have, want)
