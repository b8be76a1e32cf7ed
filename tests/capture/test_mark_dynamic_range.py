"""`kiln.mark_dynamic(t, dim, min=..., max=...)` as torch._dynamo.mark_dynamic: the range is guarded
(a size outside it fails the guard; captured again, a size outside a range it is still marked with
raises ConstraintViolation, as torch's "20 not in range [2, 10]"), and when both ends are given
every guard the program needs on the size must hold across the range (torch's
StrictMinMaxConstraint). The real torch.compile is the oracle for which calls raise and for the
graph counts."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import kiln
from kiln.symbolic import ConstraintViolation


def _calls(compile_fn: Callable[..., Any], mark: Callable[..., None], fn: Callable[..., Any],
           calls: list[tuple[int, tuple[int | None, int | None] | None]]) -> list[Any]:
    """For each (size, range or None for no mark): 'raised' or the graph count after the call."""
    from kiln.backends import CountingBackend
    counter = CountingBackend()
    compiled = compile_fn(fn, backend=counter)
    out: list[Any] = []
    for size, rng in calls:
        x = torch.arange(float(size))
        if rng is not None:
            mark(x, 0, min=rng[0], max=rng[1])
        try:
            got = compiled(x)
        except Exception as exc:  # noqa: BLE001 - the kind is compared with torch's
            out.append(("raised", "Constraint" in type(exc).__name__))
            continue
        assert torch.equal(got, fn(x))
        out.append(counter.frame_count)
    return out


def _both(fn: Callable[..., Any], calls: list) -> tuple[list[Any], list[Any]]:
    import torch._dynamo
    torch._dynamo.reset()
    want = _calls(torch.compile, torch._dynamo.mark_dynamic, fn, calls)
    kiln.reset()
    got = _calls(kiln.compile, kiln.mark_dynamic, fn, calls)
    return got, want


def _double(x):
    return x * 2


def _first_four(x):
    return x[:4] * 2


def _five_or_not(x):
    return x * 2 if x.shape[0] == 5 else x - 1


CASES = {
    # in range, in range, out of range (raises when captured again), unmarked, marked again
    "range_guarded": (_double, [(5, (2, 10)), (7, (2, 10)), (20, (2, 10)), (30, None), (3, (2, 10))]),
    "below_min": (_double, [(5, (4, 10)), (3, (4, 10))]),
    "size_one_outside": (_double, [(1, (2, 10))]),
    "slice_needs_4": (_first_four, [(6, (2, 10))]),
    "slice_within": (_first_four, [(6, (5, 10)), (9, (5, 10))]),
    "specialized_in_range": (_five_or_not, [(5, (2, 10))]),
    "single_value_range": (_five_or_not, [(5, (5, 5))]),
    "excluded_by_range": (_five_or_not, [(6, (6, 10)), (8, (6, 10))]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_mark_dynamic_range_as_torch_compile(name):
    fn, calls = CASES[name]
    got, want = _both(fn, calls)
    assert got == want


def test_one_sided_range():
    # torch 2.13 cannot capture a range with one end None (an internal AssertionError, "not simple
    # sympy type NoneType"): Kiln reads the missing end as unbounded, guards the given one, and, as
    # torch's check needs both ends, does not ask that guards hold across a half-open range.
    kiln.reset()
    got = _calls(kiln.compile, kiln.mark_dynamic, _double, [(5, (None, 6)), (6, (None, 6)), (9, (None, 6)), (9, None)])
    assert got == [1, 1, ("raised", True), 2]
    kiln.reset()
    got = _calls(kiln.compile, kiln.mark_dynamic, _first_four, [(6, (None, 10)), (7, (2, None)), (3, (3, None))])
    assert got == [1, 1, 2]


def test_mark_dynamic_range_arguments_are_checked():
    x = torch.ones(4)
    with pytest.raises(ValueError):
        kiln.mark_dynamic(x, 0, min=5, max=3)
    with pytest.raises(TypeError):
        kiln.mark_dynamic(x, 0, min=1.5)


def test_out_of_range_error_names_the_size_and_range():
    kiln.reset()
    compiled = kiln.compile(_double, backend="eager")
    x = torch.ones(20)
    kiln.mark_dynamic(x, 0, min=2, max=10)
    with pytest.raises(ConstraintViolation, match=r"x.size\(\)\[0\] is 20, not in the range \[2, 10\]"):
        compiled(x)
