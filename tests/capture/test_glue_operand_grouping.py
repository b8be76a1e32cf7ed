"""The glue runs the instruction a graph break stops at on its operands' reconstructed
expressions (kiln/capture/glue.py, NATIVE_INSTRUCTIONS): each operand is written as an atom, so
the statement groups as the bytecode did. A constant -2 raised to an opaque value is
`(-2) ** d` (without the parentheses Python reads `-(2 ** d)`: a wrong answer), and an
attribute read on an int constant is `(5).foo`, not the float literal `5.foo` (a SyntaxError in
the glue, an internal error)."""
from __future__ import annotations

import decimal

import pytest
import torch

import kiln

D = decimal.Decimal(2)  # a C type: its operators are run by the glue, not traced


def _negative_base(x, d):
    return x + float((-2) ** d)


def _negative_base_times(x, d):
    return x + float(-(3 - 1) * d)


def _subtracted_power(x, d):
    return x + float((1 - 3) ** d)


def _negated_power(x, d):
    return x + float(-2 ** d)


@pytest.mark.parametrize("fn", [_negative_base, _negative_base_times, _subtracted_power, _negated_power])
def test_operator_on_an_opaque_value_keeps_its_grouping(fn) -> None:
    kiln.reset()
    expected = fn(torch.ones(2), D)
    got = kiln.compile(fn, backend="eager")(torch.ones(2), D)
    assert torch.equal(got, expected), (got, expected)
    assert kiln.stats()["fallbacks"] == 0


def test_attribute_of_an_int_constant_raised_from_the_frame() -> None:
    def f(x):
        y = x + 1
        return y, (5).foo

    kiln.reset()
    with _no_kiln_warning():
        with pytest.raises(AttributeError, match="'int' object has no attribute 'foo'"):
            kiln.compile(f, backend="eager")(torch.ones(2))
    assert kiln.stats()["fallbacks"] == 0


def _no_kiln_warning():
    import contextlib
    import warnings

    from kiln.log import KilnWarning

    @contextlib.contextmanager
    def check():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        assert not [w for w in caught if issubclass(w.category, KilnWarning)], [str(w.message) for w in caught]
    return check()
