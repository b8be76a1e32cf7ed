"""Methods of symbolic ints and floats (`is_integer`, `as_integer_ratio`, `bit_length`, `conjugate`,
`hex`, `real`, `imag`, ...) traced whole, as torch.compile traces them.

An int or float argument becomes symbolic once it changes (automatic dynamic) or from the start
under dynamic=True; a size read from a dynamic tensor is one too. Each program runs over several
values and is compared with eager every call; Kiln compiles the frame no more often than
torch.compile does (torch._dynamo.testing.CompileCounter).
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

import kiln
from tests.capture.trace_oracle import same


def float_is_integer(x, f):
    return x * f, f.is_integer(), (f * 2).is_integer()


def float_integer_ratio(x, f):
    a, b = f.as_integer_ratio()
    return x * a / b, a, b


def int_bit_length(x, n):
    return x * n.bit_length(), n.bit_length(), (n * 3).bit_length()


def int_parts(x, n):
    return x * n.conjugate(), n.real, n.imag, n.numerator, n.denominator, n.as_integer_ratio()[1]


def float_parts(x, f):
    return x * f.conjugate(), f.hex(), f.real, f.imag


def branch_on_is_integer(x, f):
    if f.is_integer():
        return x * f
    return x - f


CASES = [(float_is_integer, (2.0, 2.5, 3.0)), (float_integer_ratio, (0.5, 0.25, 0.75)),
         (int_bit_length, (5, 9, 300)), (int_parts, (3, 7, 11)), (float_parts, (1.5, 2.5, 0.125)),
         (branch_on_is_integer, (2.0, 2.5, 4.0))]


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("fn,values", CASES, ids=[c[0].__name__ for c in CASES])
def test_matches_eager_in_no_more_compiles_than_torch(fn, values, dynamic) -> None:
    x = torch.randn(3)
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager", fullgraph=True, dynamic=dynamic)
    for v in values:
        same(compiled(x, v), fn(x, v))
    ours = kiln.stats()["compiles"]
    counter = CompileCounter()
    torch._dynamo.reset()
    theirs = torch.compile(fn, backend=counter, fullgraph=True, dynamic=dynamic)
    for v in values:
        theirs(x, v)
    assert ours <= counter.frame_count, (ours, counter.frame_count)


def size_methods(x):
    n = x.shape[0]
    return x * n.bit_length(), n.as_integer_ratio(), n.conjugate(), n.real, n.imag, n.denominator


def test_methods_of_a_dynamic_size() -> None:
    kiln.reset()
    compiled = kiln.compile(size_methods, backend="eager", fullgraph=True, dynamic=True)
    for n in (3, 5, 9, 17):
        x = torch.randn(n)
        same(compiled(x), size_methods(x))
    assert kiln.stats()["graph_breaks"] == 0


def test_a_method_int_lacks_is_an_attribute_error_as_in_eager() -> None:
    def f(x, n):
        try:
            return n.is_integer()  # int has no is_integer before Python 3.12
        except AttributeError:
            return x + n

    kiln.reset()
    compiled = kiln.compile(f, backend="eager", fullgraph=True, dynamic=True)
    for n in (2, 3):
        same(compiled(torch.ones(1), n), f(torch.ones(1), n))
