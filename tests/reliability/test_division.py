"""Integer division by zero in compiled code raises `RuntimeError: ZeroDivisionError`, as eager does.

`//`, `%`, torch.div with rounding_mode "floor" and "trunc", remainder and fmod on integer tensors of
every integer dtype, with a zero divisor as a tensor element or as a Python scalar, compiled with
kiln.compile(backend="inductor") against eager; non-zero divisors (negative ones included) give
eager's values, and float division by zero stays inf/nan without an error.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln

DIVISIONS = {
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": lambda a, b: torch.remainder(a, b),
    "fmod": lambda a, b: torch.fmod(a, b),
    "fused": lambda a, b: (a * 2 + 1) // (b - 0) + a,  # the division inside a fused chain
}
INT_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


def _outcome(fn, *args):
    try:
        return fn(*args), None
    except Exception as exc:  # the test compares what eager and compiled code raise
        return None, exc


def _compare(fn, *args) -> None:
    expected, eager_error = _outcome(fn, *args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to eager would warn: the kernels must answer
        got, error = _outcome(kiln.compile(fn, backend="inductor"), *args)
    assert kiln.stats()["fallbacks"] == 0
    if eager_error is None:
        assert error is None, f"compiled code raised {error!r} where eager returned"
        torch.testing.assert_close(got, expected, equal_nan=True)
    else:
        assert type(error) is type(eager_error) and str(error) == str(eager_error), (eager_error, error)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kiln.reset()


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(DIVISIONS))
def test_zero_divisor_in_a_tensor(name, dtype) -> None:
    a = torch.tensor([7, 3, 9, 100], dtype=dtype)
    b = torch.tensor([2, 1, 0, 3], dtype=dtype)
    _compare(DIVISIONS[name], a, b)


@pytest.mark.parametrize("name", list(DIVISIONS))
def test_zero_python_scalar_divisor(name) -> None:
    fn = DIVISIONS[name]
    _compare(lambda a: fn(a, 0), torch.tensor([5, -3, 8]))


@pytest.mark.parametrize("name", list(DIVISIONS))
def test_non_zero_divisors_of_both_signs(name) -> None:
    a = torch.tensor([7, -7, 9, -9, 0, 100, -100])
    b = torch.tensor([2, 2, -4, -4, 5, -7, 3])
    _compare(DIVISIONS[name], a, b)


@pytest.mark.parametrize("name", ["floordiv", "mod", "div_floor", "div_trunc", "fmod"])
def test_float_division_by_zero_is_not_an_error(name) -> None:
    a = torch.tensor([1.0, -1.0, 0.0, 2.5])
    b = torch.tensor([0.0, 0.0, 0.0, -0.0])
    _compare(DIVISIONS[name], a, b)


def test_zero_divisor_in_a_reduction_body() -> None:
    _compare(lambda a, b: (a // b).sum(), torch.arange(12).reshape(3, 4), torch.tensor([1, 2, 0, 3]))


IN_PLACE = {
    "remainder_scalar": lambda a, b: a.remainder_(0),
    "floordiv_scalar": lambda a, b: a.floor_divide_(0),
    "ifloordiv_python_int": lambda a, b: a.__ifloordiv__(0),
    "div_trunc_zero_tensor": lambda a, b: a.div_(b * 0, rounding_mode="trunc"),
    "fused_chain_then_floordiv": lambda a, b: a.floor_divide_(b).mul_(3).add_(1),
    "first_divisor_zero": lambda a, b: a.floor_divide_(b),
    "scatter_first_index_bad": lambda a, b: a.scatter_(0, (b - 1) + 9 * (b == 0), b),
}


@pytest.mark.cpp
@pytest.mark.parametrize("name", list(IN_PLACE))
def test_failed_check_leaves_the_callers_tensor_as_eager_does(name) -> None:
    """An in-place op whose check fails (eager tests the first element, or a scalar divisor, before
    it stores) raises without overwriting the caller's tensor: a new value computed in the input's
    own storage must not come from a kernel that fails. The bad call comes after a good one (a
    cached kernel meets it)."""
    fn = IN_PLACE[name]
    compiled = kiln.compile(fn, backend="inductor")
    for b in (torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3]), torch.tensor([3, 1, 2])):
        a_eager, a_compiled = torch.tensor([7, 8, 9]), torch.tensor([7, 8, 9])
        try:
            expected, eager_error = fn(a_eager, b), None
        except RuntimeError as exc:
            expected, eager_error = None, exc
        try:
            got, error = compiled(a_compiled, b), None
        except RuntimeError as exc:
            got, error = None, exc
        assert type(error) is type(eager_error), (eager_error, error)
        assert torch.equal(a_compiled, a_eager), (a_compiled, a_eager)
        if eager_error is None:
            assert torch.equal(got, expected)
    assert kiln.stats()["fallbacks"] == 0
