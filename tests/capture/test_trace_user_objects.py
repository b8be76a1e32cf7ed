"""User objects torch.compile traces whole, traced whole by Kiln (fullgraph=True).

`==` / `is` on objects made in the frame (object's identity, a Python `__eq__` and its reflected and
NotImplemented rules), str()/repr()/format()/f-strings through Python `__str__`/`__repr__`/
`__format__`, staticmethods and classmethods on namedtuple subclasses, torch.distributions objects,
exceptions with a Python `__init__`, classes defining `__getattr__`, properties with C getters,
function-valued module attributes, len() of a ModuleList subclass with its own `__getitem__`, and
Tensor.item() under capture_scalar_outputs. Where torch.compile breaks (nn.Parameter made in the
frame), Kiln breaks too, with a reason. Compared with eager and torch._dynamo.explain
(tests/capture/trace_oracle.py).
"""
from __future__ import annotations

import collections
import functools
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
from tests.capture.trace_oracle import check_breaks, check_traced, fresh

X = torch.randn(3)


def _x() -> tuple:
    return fresh(X)()


# --------------------------------------------------------------------------- == and is on objects
class Plain:
    def __init__(self, v):
        self.v = v


class Valued:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        if not isinstance(other, Valued):
            return NotImplemented
        return self.v == other.v


class Ordered:
    def __init__(self, v):
        self.v = v

    def __lt__(self, other):
        return self.v < other.v


def identity_of_new_objects(x):
    a, b = Plain(1), Plain(1)
    return x + 1, a == a, a is a, a == b, a is b, a != b, a is not b


def python_eq(x):
    a, b, c = Valued(1), Valued(1), Valued(2)
    return x * (a == b), a == c, a != c, a != b, a == 1, 1 == a


def python_lt_and_reflection(x):
    a, b = Ordered(1), Ordered(2)
    return x + 1, a < b, b > a, a > b  # `b > a` runs a.__lt__(b) reflected


def objects_in_a_list(x):
    a, b = Plain(1), Plain(2)
    items = [a, b]
    return x + 1, a in items, Plain(3) in items, items.index(b)


# ------------------------------------------------------------------------------ str / repr / format
class Named:
    def __init__(self, v):
        self.v = v

    def __str__(self):
        return f"Named({self.v})"


class Shown:
    def __repr__(self):
        return "Shown!"


class Formatted:
    def __format__(self, spec):
        return f"<{spec}>"


def str_and_repr(x):
    p = Named(3)
    return x + 1, str(p), repr(Shown()), str(Shown()), f"{p}", f"{p!s}|{Shown()!r}", f"{Formatted():>4}"


def format_builtin(x):
    return x + 1, format(Named(2)), format(Formatted(), "x")


# ---------------------------------------------------------------------------------- namedtuples
class Point(collections.namedtuple("Point", "a b")):
    @staticmethod
    def make(v):
        return Point(v, v + 1)

    @classmethod
    def zero(cls, v):
        return cls(v * 0, v * 0)

    def total(self):
        return self.a + self.b


def namedtuple_staticmethod(x):
    p = Point.make(x)
    return p.total(), p.make(x).a, Point.zero(x).b, p.zero(x)


# -------------------------------------------------------------------------------- distributions
def normal_log_prob(x):
    d = torch.distributions.Normal(x, 1.0)
    return d.log_prob(x * 2), d.mean, d.stddev, d.entropy()


def normal_sample_shapes(x):
    d = torch.distributions.Normal(x, torch.ones_like(x))
    return d.sample().shape, d.rsample((2,)).shape


# ---------------------------------------------------------------------------- exceptions
class CodedError(Exception):
    def __init__(self, msg, code):
        super().__init__(msg)
        self.code = code


class BareInit(ValueError):
    def __init__(self, code):
        self.code = code


class Described(Exception):
    def __init__(self, what):
        super().__init__(what)
        self.what = what

    def __str__(self):
        return f"described: {self.what}"


def exception_with_init(x):
    try:
        raise CodedError("bad", 3)
    except CodedError as e:
        return x * e.code, str(e), e.args, repr(e)


def exception_init_without_super(x):
    try:
        raise BareInit(7)
    except ValueError as e:
        return x + e.code, e.args


def exception_with_str(x):
    try:
        raise Described("thing")
    except Exception as e:
        return x - 1, str(e), e.what


# ---------------------------------------------------------------------------------- __getattr__
class Fallback:
    def __init__(self):
        self.d = {"a": 2}

    def __getattr__(self, name):
        return self.d[name] if name in self.__dict__["d"] else 7


def getattr_fallback_new(x):
    g = Fallback()
    return x * g.a + g.zzz, g.d["a"]


GLOBAL_FALLBACK = Fallback()


def getattr_fallback_global(x):
    return x * GLOBAL_FALLBACK.a + GLOBAL_FALLBACK.missing


def getattr_fallback_hasattr(x):
    g = Fallback()
    return x + 1, hasattr(g, "anything"), getattr(g, "a")


# --------------------------------------------------------------------- properties with C getters
class Sized:
    count = property(len)

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


class Picked:
    first = property(operator.itemgetter(0))
    inner = property(operator.attrgetter("box.value"))

    def __init__(self, box):
        self.box = box

    def __getitem__(self, i):
        return self.box.value * (i + 1)


class Box:
    def __init__(self, value):
        self.value = value


def builtin_property(x):
    s = Sized(4)
    return x * s.count


SIZED = Sized(5)


def builtin_property_global(x):
    return x * SIZED.count


def getter_objects(x):
    p = Picked(Box(x))
    return p.first, p.inner, sorted([(2, "b"), (1, "a")], key=operator.itemgetter(0))


SCHEMA = torch.ops.aten.add.Tensor._schema


def pybind_property(x):
    return x + 1, SCHEMA.name, SCHEMA.overload_name


# -------------------------------------------------------------------------- modules and item()
class WithActivation(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.act = act
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.act(self.lin(x))


class ListWithGetitem(nn.ModuleList):
    def __getitem__(self, i):
        return super().__getitem__(i)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = ListWithGetitem([nn.Linear(3, 3), nn.Linear(3, 3)])

    def forward(self, x):
        for i in range(len(self.layers)):
            x = self.layers[i](x)
        return x


def _module_call(module):
    def call(x):
        return module(x)
    call.__name__ = f"calls_{type(module).__name__}"
    return call


MODULE_CASES = [WithActivation(F.relu), WithActivation(torch.tanh), WithActivation(lambda t: t * 2),
                WithActivation(functools.partial(F.leaky_relu, negative_slope=0.2)), Stack()]


def item_of_an_int_tensor(x):
    n = (x > 0).sum().item()
    return x * n


TRACED = [identity_of_new_objects, python_eq, python_lt_and_reflection, objects_in_a_list, namedtuple_staticmethod, normal_log_prob, normal_sample_shapes, getattr_fallback_new,
          getattr_fallback_global, getattr_fallback_hasattr, builtin_property, pybind_property]
# torch.compile breaks on these (its attribute lookup fails inside __str__, super().__init__ of an
# exception, C getters it cannot call); Kiln traces them and matches eager
BEYOND_TORCH = [str_and_repr, format_builtin, exception_with_init, exception_init_without_super, exception_with_str,
                builtin_property_global, getter_objects]


@pytest.mark.parametrize("fn", TRACED, ids=lambda f: f.__name__)
def test_traced_whole_like_torch_compile(fn) -> None:
    check_traced(fn, _x)


@pytest.mark.parametrize("fn", BEYOND_TORCH, ids=lambda f: f.__name__)
def test_traced_whole_where_torch_compile_breaks(fn) -> None:
    check_traced(fn, _x, oracle=False)


@pytest.mark.parametrize("module", MODULE_CASES, ids=["relu", "tanh", "lambda", "partial", "module_list_subclass"])
def test_module_attributes_and_module_list_subclasses(module) -> None:
    check_traced(_module_call(module), _x)


def test_a_function_valued_attribute_swapped_is_guarded() -> None:
    module = WithActivation(F.relu)
    compiled = kiln.compile(module, backend="eager", fullgraph=True)
    x = torch.randn(4, 3)
    torch.testing.assert_close(compiled(x), module(x))
    module.act = torch.sigmoid
    torch.testing.assert_close(compiled(x), module(x))


def test_item_of_an_int_tensor_under_capture_scalar_outputs() -> None:
    check_traced(item_of_an_int_tensor, _x, settings={"capture_scalar_outputs": True})


def test_item_of_a_float_tensor_is_an_unbacked_float() -> None:
    # traced as torch.compile traces it: an unbacked symbolic float (test_float_item_capture.py)
    def f(x):
        return x * x.sum().item()
    check_traced(f, _x, settings={"capture_scalar_outputs": True})


def test_a_parameter_made_in_the_frame_breaks_as_in_torch_compile() -> None:
    def f(x):
        p = nn.Parameter(torch.ones(3))
        return x * p

    check_breaks(f, _x, "Parameter")


def test_an_exception_with_init_raised_out_of_the_frame_is_eagers() -> None:
    def f(x):
        raise CodedError(f"bad {x.shape[0]}", 5)

    with pytest.raises(CodedError) as raised:
        kiln.compile(f, backend="eager")(X)
    assert raised.value.code == 5 and raised.value.args == ("bad 3",)


def test_a_python_eq_that_reads_tensors_breaks() -> None:
    class Holder:
        def __init__(self, t):
            self.t = t

        def __eq__(self, other):
            return bool((self.t == other.t).all())

    def f(x):
        return Holder(x) == Holder(x + 0), x

    with pytest.raises(kiln.errors.GraphBreakError):
        kiln.compile(f, backend="eager", fullgraph=True)(X)
