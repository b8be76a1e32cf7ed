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
    it = iter([x])
    return (x + 1, hasattr(items, "append"), hasattr(items, "nope"), hasattr(d, "keys"), hasattr(d, "nope"),
            hasattr((1, 2), "index"), hasattr((1, 2), "append"), hasattr(3, "real"), hasattr("s", "nope"),
            hasattr({x: 1} if False else {1, 2}, "nope"), hasattr(it, "nope"), hasattr(it, "__next__"),
            hasattr(d.keys(), "isdisjoint"), hasattr(d.values(), "nope"))


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


# ------------------------------------------------------------ nn.Module attribute lookup order


class MethodShadowsSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self._modules["helper"] = nn.Linear(2, 2)  # registered under a name the class also defines

    def helper(self, x):
        return x * 100

    def forward(self, x):
        return self.helper(x)


class PropertyShadowsParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self._parameters["w"] = nn.Parameter(torch.ones(2))

    @property
    def w(self):
        return torch.full((2,), 5.0)

    def forward(self, x):
        return x * self.w


class ClassValueShadowsBuffer(nn.Module):
    offset = 10.0

    def __init__(self):
        super().__init__()
        self._buffers["offset"] = torch.ones(2)

    def forward(self, x):
        return x + self.offset


class InstanceDictShadowsClassValue(nn.Module):
    scale = 2.0

    def __init__(self):
        super().__init__()
        self.__dict__["scale"] = 7.0

    def forward(self, x):
        return x * self.scale


class PropertyBeatsInstanceDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.__dict__["k"] = 11.0

    @property
    def k(self):
        return 3.0

    def forward(self, x):
        return x * self.k


class InstanceDictShadowsSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.__dict__["lin"] = nn.Identity()

    def forward(self, x):
        return self.lin(x)


class Delegating(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(2, 2)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, x):
        return x @ self.weight.t() + self.bias


class CustomGetattribute(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def __getattribute__(self, name):
        if name == "special":
            return 4.0
        return super().__getattribute__(name)

    def forward(self, x):
        return self.lin(x) * self.special


class Constant:
    """A non-data descriptor written in Python."""

    def __init__(self, value):
        self.value = value

    def __get__(self, obj, owner):
        return self.value if obj is None else self.value * 2


class Checked:
    """A data descriptor written in Python: it wins over the instance dict."""

    def __get__(self, obj, owner):
        return 8.0

    def __set__(self, obj, value):
        raise AttributeError("read-only")


class WithDescriptors(nn.Module):
    nd = Constant(4.0)
    dd = Checked()

    def __init__(self):
        super().__init__()
        self.__dict__["dd"] = 100.0

    def forward(self, x):
        return x * self.nd + self.dd


class StaticAndClassMethods(nn.Module):
    @staticmethod
    def act(t):
        return t * 3

    @classmethod
    def k(cls):
        return 2.0

    def forward(self, x):
        return self.act(x) * self.k()


class Slotted:
    __slots__ = ("a",)

    def __init__(self, a):
        self.a = a


class UserObject:
    cls_value = 3.0
    nd = Constant(1.5)
    dd = Checked()

    def __init__(self):
        self.__dict__["dd"] = 50.0
        self.cls_value_shadow = 1.0

    @property
    def prop(self):
        return self.cls_value * 2


USER = UserObject()
USER.__dict__["cls_value"] = 9.0
SLOTTED = Slotted(6.0)


def user_object_lookup_order(x):
    return x * USER.cls_value + USER.nd + USER.dd + USER.prop + SLOTTED.a


MODULES = [MethodShadowsSubmodule, PropertyShadowsParameter, ClassValueShadowsBuffer, InstanceDictShadowsClassValue,
           PropertyBeatsInstanceDict, InstanceDictShadowsSubmodule, Delegating, CustomGetattribute, WithDescriptors,
           StaticAndClassMethods]


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("make", MODULES, ids=[m.__name__ for m in MODULES])
def test_module_attribute_lookup_order(make, fullgraph: bool) -> None:
    torch.manual_seed(0)
    module = make()
    x = torch.randn(3, 2)
    kiln.reset()
    compiled = kiln.compile(module, backend="eager", fullgraph=fullgraph)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), module(x))


def test_class_attribute_added_after_construction_wins_over_the_submodule() -> None:
    class Late(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x)

    module = Late()
    Late.lin = property(lambda self: (lambda t: t * 50))
    x = torch.randn(3, 2)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(module, backend="eager", fullgraph=True)(x), module(x))


@pytest.mark.parametrize("fullgraph", [False, True])
def test_user_object_lookup_order(fullgraph: bool) -> None:
    check_calls(user_object_lookup_order, [(torch.ones(2),)] * 2, fullgraph=fullgraph)
