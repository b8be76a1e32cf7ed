"""Functions defined inside the compiled function, traced whole by Kiln as torch.compile traces them.

Their attributes (`__name__`, `__qualname__`, `__module__`, `__doc__`, `__defaults__`,
`__annotations__`, attributes set on them), what `functools.wraps` copies onto a wrapper,
`@contextlib.contextmanager` on an inner generator, and such a function returned from the frame
with what was set on it. Each program is compared with eager and with torch._dynamo.explain
(tests/capture/trace_oracle.py).
"""
from __future__ import annotations

import contextlib
import functools

import pytest
import torch

import kiln
from tests.capture.trace_oracle import check_traced, fresh

X = torch.randn(3)


def _x() -> tuple:
    return fresh(X)()


def inner_attributes(x):
    def helper(y):
        "doc of helper"
        return y + 1

    return helper(x), helper.__name__, helper.__qualname__, helper.__module__, helper.__doc__


def lambda_attributes(x):
    f = lambda y: y * 2  # noqa: E731
    return f(x), f.__name__, f.__module__, f.__doc__


def inner_without_docstring(x):
    def helper(y):
        return y - 1

    return helper(x), helper.__doc__


def inner_contextmanager(x):
    @contextlib.contextmanager
    def scaled():
        yield 3

    with scaled() as s:
        return x * s


def inner_contextmanager_with_arguments(x):
    @contextlib.contextmanager
    def offset(v):
        try:
            yield v + 1
        finally:
            pass

    with offset(x) as y:
        z = y * 2
    return z


def inner_wraps(x):
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*a):
            return fn(*a) + 1
        return wrapper

    @deco
    def g(y):
        "the doc of g"
        return y * 3

    return g(x), g.__name__, g.__doc__, g.__qualname__, g.__wrapped__(x)


def inner_attribute_set(x):
    def h(y):
        return y

    h.tag = 5
    h.scale = x * 2
    return x + h.tag, h.scale, h.__dict__["tag"]


def name_changed(x):
    def h(y):
        return y

    h.__name__ = "renamed"
    h.__doc__ = "set later"
    return h.__name__, h.__doc__, h(x)


def hasattr_on_inner(x):
    def h(y):
        return y

    h.marker = True
    return hasattr(h, "marker"), hasattr(h, "missing"), getattr(h, "missing", 7), x


TRACED = [inner_attributes, lambda_attributes, inner_without_docstring, inner_contextmanager,
          inner_contextmanager_with_arguments, inner_wraps, inner_attribute_set, name_changed, hasattr_on_inner]


@pytest.mark.parametrize("fn", TRACED, ids=lambda f: f.__name__)
def test_traced_whole_like_torch_compile(fn) -> None:
    check_traced(fn, _x)


def inner_defaults_and_annotations(x):
    def h(y, k: int = 2, *, m: float = 1.0) -> torch.Tensor:
        return y * k * m

    return h(x), h.__defaults__, h.__kwdefaults__, h.__annotations__, h.__code__.co_name


def test_defaults_and_annotations_where_torch_compile_breaks() -> None:
    check_traced(inner_defaults_and_annotations, _x, oracle=False)


def test_an_inner_function_returned_keeps_what_was_set_on_it() -> None:
    def f(x):
        def h(y):
            return y + 1

        h.tag = "t"
        h.__qualname__ = "outer.h"
        return h, x * 2

    h, _ = kiln.compile(f, backend="eager", fullgraph=True)(X)
    expected, _ = f(X)
    assert h.tag == expected.tag and h.__qualname__ == expected.__qualname__ == "outer.h"
    torch.testing.assert_close(h(X), expected(X))


def test_a_missing_attribute_of_an_inner_function_raises_as_in_eager() -> None:
    def f(x):
        def h(y):
            return y

        try:
            return h.nothing
        except AttributeError:
            return x + 1

    check_traced(f, _x)
