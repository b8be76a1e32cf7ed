"""What a `with` block's exception handler hands a Python `__exit__` (WITH_EXCEPT_START in
kiln/capture/opcodes/exceptions.py): the exception's type, the exception, and its traceback, which
is not None and is the exception's own `__traceback__`, as CPython passes it."""
from __future__ import annotations

import contextlib

import torch

from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


class _Seen:
    def __init__(self, swallow=True):
        self.swallow = swallow
        self.seen = None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        self.seen = (kind, value is not None, tb is not None, tb is None)
        return self.swallow


def test_exit_gets_a_traceback_for_an_exception() -> None:
    def f(x):
        m = _Seen()
        with m:
            raise IndexError("in the block")
        return x + 1, m.seen
    check_traced(f, fresh(X))


def test_the_traceback_is_the_exceptions_own() -> None:
    class Same:
        def __enter__(self):
            return self

        def __exit__(self, kind, value, tb):
            self.same = tb is value.__traceback__
            return True

    def f(x):
        m = Same()
        with m:
            raise KeyError("k")
        return x + 1, m.same
    check_traced(f, fresh(X))


def test_exit_that_swallows_only_with_a_traceback() -> None:
    class OnlyRaised:
        def __enter__(self):
            return self

        def __exit__(self, kind, value, tb):
            return tb is not None

    def f(x):
        try:
            with OnlyRaised():
                x = x * 2
                raise ValueError("v")
        except ValueError:
            return x - 100
        return x + 1
    check_traced(f, fresh(X))


def test_exit_stack_push_sees_the_traceback() -> None:
    def f(x):
        seen = []

        def exit_(kind, value, tb):
            seen.append(tb is not None)
            return True
        with contextlib.ExitStack() as stack:
            stack.push(exit_)
            raise KeyError("gone")
        return x + 1, seen
    check_traced(f, fresh(X), oracle=False)
