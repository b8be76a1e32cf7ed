"""Attribute lookup as CPython does it, on values made in the frame and read from outside.

hasattr/getattr on functools.partial, functions, tuples, exceptions and objects made during the
trace answer what eager answers (a failed lookup inside the trace is an AttributeError the program
sees, never a silent False); nn.Module attributes follow CPython's order (class data descriptors,
then the instance dict, then class attributes, then Module.__getattr__'s _parameters, _buffers and
_modules). Compared with eager under fullgraph=False and fullgraph=True.
"""
from __future__ import annotations

import collections
import functools
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import kiln

sys.path.insert(0, str(Path(__file__).parent))
from semantics_oracle import check_calls  # noqa: E402

Point = collections.namedtuple("Point", ["x", "y"])


def _scale(t, k=2):
    return t * k


class Plain:
    K = 3

    def __init__(self, v):
        self.v = v

    def method(self):
        return self.v


# ---------------------------------------------------------------------------------- hasattr


def partial_made_in_frame(x):
    p = functools.partial(torch.add, other=1)
    if hasattr(p, "func") and hasattr(p, "args") and hasattr(p, "keywords"):
        return p(x) + len(p.args) + len(p.keywords)
    return x - 1


def partial_fields(x):
    p = functools.partial(_scale, k=3)
    q = functools.partial(p, x)  # CPython flattens: q.func is _scale
    return q(), q.func is _scale, len(q.args), sorted(q.keywords), hasattr(q, "nope"), hasattr(q, "__call__")


def partial_passed_in(p, x):
    if hasattr(p, "func") and not hasattr(p, "missing"):
        return p(x) + len(p.args)
    return x - 1


def partial_with_attributes(p, x):
    return x + (10 if hasattr(p, "tag") else 0) + (1 if hasattr(p, "other") else 0)


def function_made_in_frame(x):
    f = lambda t: t + 1  # noqa: E731
    return f(x), hasattr(f, "__code__"), hasattr(f, "__name__"), hasattr(f, "not_there")


def namedtuple_fields(x):
    p = Point(x, 2)
    return p.x + p.y, hasattr(p, "x"), hasattr(p, "z"), hasattr(p, "_fields"), hasattr(p, "count")


def builtin_containers(x):
    items = [x, 1]
    d = {"a": x}
    return (x + 1, hasattr(items, "append"), hasattr(items, "nope"), hasattr(d, "keys"),
            hasattr((1, 2), "index"), hasattr((1, 2), "append"), hasattr(3, "real"), hasattr("s", "nope"))


def object_made_in_frame(x):
    o = Plain(x)
    return o.method() + 1, hasattr(o, "v"), hasattr(o, "K"), hasattr(o, "method"), hasattr(o, "w")


def getattr_default(x):
    p = functools.partial(torch.mul, 2)
    o = Plain(x)
    return getattr(p, "missing", 5), getattr(o, "w", 7), getattr(Point(1, 2), "z", x + 1)


def exception_made_in_frame(x):
    e = ValueError("bad", 3)
    return x + 1, hasattr(e, "args"), hasattr(e, "with_traceback"), len(e.args)


def tensor_attributes(x):
    return x + 1, hasattr(x, "grad"), hasattr(x, "shape"), hasattr(x, "not_a_tensor_attribute")


CASES = [
    (partial_made_in_frame, lambda: (torch.ones(3),)),
    (partial_fields, lambda: (torch.ones(3),)),
    (partial_passed_in, lambda: (functools.partial(torch.mul, 2), torch.ones(3))),
    (function_made_in_frame, lambda: (torch.ones(3),)),
    (namedtuple_fields, lambda: (torch.ones(3),)),
    (builtin_containers, lambda: (torch.ones(3),)),
    (object_made_in_frame, lambda: (torch.ones(3),)),
    (getattr_default, lambda: (torch.ones(3),)),
    (exception_made_in_frame, lambda: (torch.ones(3),)),
    (tensor_attributes, lambda: (torch.ones(3),)),
]


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("fn, make", CASES, ids=[c[0].__name__ for c in CASES])
def test_hasattr_answers_as_eager(fn, make, fullgraph: bool) -> None:
    check_calls(fn, [make(), make()], fullgraph=fullgraph)


def test_hasattr_on_a_partial_sees_its_attributes_change() -> None:
    p = functools.partial(torch.add, other=1)
    x = torch.ones(2)

    def tag(i: int) -> None:
        if i == 1:
            p.tag = "x"
        if i == 2:
            del p.tag

    check_calls(partial_with_attributes, [(p, x), (p, x), (p, x)], between=tag)
