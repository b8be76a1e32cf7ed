"""Python int and float arguments: how many graphs Kiln makes as they change (the real
torch.compile's count is the oracle: a changed int or float becomes a symbol at the first
recompile, bools stay constants), and that every call returns what eager returns, with negative
values and zero divisors (eager's ZeroDivisionError) on every backend. Under the default backend a
`//`, `%` or `/` by an int or float argument is computed in a kernel or a size, which raises
nothing of itself: the wrapper tests the divisor first (kiln.lower LoopIR.divisors), on the Python
wrapper, the compiled native wrapper and the plan alike."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import kiln
from kiln import config
from eager_compare import dynamo_graphs, outcome, same_outcome

X = torch.arange(4.0) - 1.5
PAIRS = [(-7, 2), (9, -4), (5, 3), (-8, 3), (7, 0), (100, 7), (-9, -4), (0, 5), (1, -1)]
FLOAT_PAIRS = [(0.5, 2.0), (-1.5, 0.25), (3.0, -7.5), (2.0, 0.0), (1e10, 3.0)]


def _floordiv(x, a, b):
    return x + a // b


def _mod(x, a, b):
    return x + a % b


def _truediv(x, a, b):
    return x * (a / b)


def _full_of_quotient(x, a, b):
    return torch.full((3,), a % b) + x[:3]


def _size_from_quotient(x, a, b):
    return x.new_ones(abs(a // b) + 1).sum() + x


def _float_scale(x, a, b):
    return x * (a / b) + a * b


def _compare(fn: Callable[..., Any], calls: list[tuple], backend: Any = "eager", options: dict | None = None) -> int:
    """Each call eager and compiled (under config `options`: the CPU wrapper tier): the same value
    or exception type; returns Kiln's graph count."""
    kiln.reset()
    counter = kiln.backends.CountingBackend(kiln.backends.lookup(backend))
    with config.patch(**(options or {})):
        compiled = kiln.compile(fn, backend=counter)
        for args in calls:
            want = outcome(fn, *args)
            got = outcome(compiled, *args)
            assert same_outcome(got, want, text=True), (args, got, want)
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["graph_breaks"] == 0, kiln.stats()
    return counter.frame_count


def _torch_count(fn: Callable[..., Any], calls: list[tuple]) -> int:
    def run(compiled: Callable[..., Any]) -> None:
        for args in calls:
            outcome(compiled, *args)
    return dynamo_graphs(fn, run)


INT_PROGRAMS = [_floordiv, _mod, _truediv, _full_of_quotient, _size_from_quotient]


@pytest.mark.parametrize("fn", INT_PROGRAMS, ids=lambda f: f.__name__)
def test_int_arguments_recompile_as_torch_compile(fn):
    calls = [(X, a, b) for a, b in PAIRS]
    assert _compare(fn, calls) == _torch_count(fn, calls)


def test_float_arguments_recompile_as_torch_compile():
    calls = [(X, a, b) for a, b in FLOAT_PAIRS]
    assert _compare(_float_scale, calls) == _torch_count(_float_scale, calls)


def test_bools_stay_constants():
    def fn(x, flag, n):
        return x + n if flag else x - n
    calls = [(X, True, 2), (X, False, 3), (X, True, 4), (X, False, 5)]
    assert _compare(fn, calls) == _torch_count(fn, calls)


def test_ints_inside_containers():
    def fn(x, pair, table):
        return x * pair[0] + pair[1] // table["d"]
    calls = [(X, [a, b], {"d": d}) for a, b, d in [(1, 2, 3), (-4, 5, -6), (7, -8, 9), (2, 2, 0)]]
    assert _compare(fn, calls) == _torch_count(fn, calls)


@pytest.mark.cpp
@pytest.mark.parametrize("wrapper", [{"cpu_wrapper": "python"},
                                     {"cpu_wrapper": "native", "native_plan": False},
                                     {"cpu_wrapper": "native", "native_plan": True}],
                         ids=["python", "compiled", "plan"])
@pytest.mark.parametrize("fn", INT_PROGRAMS, ids=lambda f: f.__name__)
def test_zero_divisor_raises_under_the_lowering(fn, wrapper):
    _compare(fn, [(X, a, b) for a, b in PAIRS], backend="inductor", options=wrapper)


@pytest.mark.cpp
def test_zero_float_divisor_raises_under_the_lowering():
    def fn(x, a, b):
        return x * (a / b)
    _compare(fn, [(X, a, b) for a, b in FLOAT_PAIRS], backend="inductor")


def test_zero_divisor_raises_under_aot_eager():
    _compare(_mod, [(X, a, b) for a, b in PAIRS], backend="aot_eager")


@pytest.mark.cpp
@pytest.mark.parametrize("wrapper", [{"cpu_wrapper": "python"}, {"cpu_wrapper": "native", "native_plan": False}],
                         ids=["python", "compiled"])
def test_float_divisor_below_one_is_not_zero(wrapper):
    # the compiled native wrapper once tested the divisor cast to int64: 0.25 read as 0 raised
    def fn(x, s):
        return x * s + 1.0 / s
    _compare(fn, [(X, s) for s in (0.5, 0.25, 0.75, -0.5, 0.0, 3.5)], backend="inductor", options=wrapper)
