"""callable() during capture answers what CPython's does, from the type's MRO (never its
metaclass): a functools.partial passed in or made in the frame, objects with and without
`__call__`, classes, constants, tensors, containers and builtins; traced whole as torch.compile
traces them."""
from __future__ import annotations

import functools

import torch

from trace_oracle import check_traced, fresh

X = torch.arange(2.0)


class WithCall:
    def __call__(self):
        return 1


class Plain:
    pass


def test_partial_passed_in_isinstance_and_callable() -> None:
    def f(x, p):
        out = x
        if isinstance(p, functools.partial):
            out = out * 2
        if callable(p):
            out = out + 1
        return out, callable(p.func)
    check_traced(f, fresh(X, functools.partial(torch.sin)))


def test_callable_of_many_kinds() -> None:
    def f(x):
        q = functools.partial(torch.add, x)
        return (x, callable(q), callable(WithCall()), callable(Plain()), callable(Plain), callable(3),
                callable(x), callable([1]), callable(len), callable(Plain.__init__))
    check_traced(f, fresh(X))
