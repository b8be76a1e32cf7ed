"""isinstance/issubclass where the answer is not the object's type alone, and user classes whose
`__getattr__` raises something other than AttributeError.

A metaclass's own `__instancecheck__` (duck typing: "has attribute x") decides, inlined; an
abstract base class answers from its registry, which `register()` changes after the first call:
abc's cache token is guarded, so the call recompiles. Wrapping an object whose class's
`__getattr__` raises KeyError for names it lacks (Kiln's wrapping asks values for `__objclass__`,
`__qualname__`, ...) is no internal error. A class whose metaclass has its own `__call__` is not
built attribute by attribute (the override was skipped: a wrong answer); it runs natively. Compared
with eager.
"""
from __future__ import annotations

import abc
import warnings

import torch

import kiln
from kiln.log import KilnWarning


class HasX(type):
    def __instancecheck__(cls, obj):
        return hasattr(obj, "x")


class Duck(metaclass=HasX):
    pass


class WithX:
    x = 1


def _compiled_equals_eager(f, *inputs):
    compiled = kiln.compile(f, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # a fallback to eager is a failure here
        for x in inputs:
            torch.testing.assert_close(compiled(x), f(x))


def test_metaclass_instancecheck_decides():
    with_x, plain = WithX(), object()

    def f(x):
        return x + 10 * isinstance(with_x, Duck) + isinstance(plain, (int, Duck)) + isinstance(with_x, (int, Duck))

    _compiled_equals_eager(f, torch.zeros(2))


def test_abc_registered_after_the_first_call_recompiles():
    class Base(abc.ABC):
        pass

    class Later:
        pass

    obj = Later()

    def f(x):
        return x + 1 if isinstance(obj, Base) else x - 1

    def g(x):
        return x * 2 if issubclass(Later, Base) else x * 3

    compiled_f, compiled_g = kiln.compile(f, backend="eager"), kiln.compile(g, backend="eager")
    x = torch.zeros(2)
    torch.testing.assert_close(compiled_f(x), x - 1)
    torch.testing.assert_close(compiled_g(x + 1), (x + 1) * 3)
    Base.register(Later)
    torch.testing.assert_close(compiled_f(x), x + 1)
    torch.testing.assert_close(compiled_g(x + 1), (x + 1) * 2)


def test_getattr_raising_key_error_is_no_internal_error():
    class Table:
        def __init__(self):
            self.tbl = {"k": 3}

        def __getattr__(self, name):
            return self.tbl[name]  # KeyError, not AttributeError, for any other name

    table = Table()
    _compiled_equals_eager(lambda x: x * table.k, torch.ones(2))


def test_metaclass_call_override_runs():
    class Counted(type):
        made = 0

        def __call__(cls, *args, **kwargs):
            Counted.made += 1
            return super().__call__(*args, **kwargs)

    class A(metaclass=Counted):
        def __init__(self, v):
            self.v = v

    def f(x):
        return x * A(3).v + Counted.made

    compiled = kiln.compile(f, backend="eager")
    for made in (1, 3):
        torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 3.0 + made))
        torch.testing.assert_close(f(torch.ones(2)), torch.full((2,), 3.0 + made + 1))
