"""Corpus: user classes: properties and descriptors, __getattr__/__getattribute__ fallbacks,
classmethod/staticmethod, super() chains, dunder operators, __eq__/__hash__, __str__/__repr__,
__call__, class attributes changed between calls, and objects made in the frame and returned.

Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import abc
import dataclasses
import enum
import inspect
import sys

import torch
from torch import nn

from .program import Program, case, fn_program, t


class Doubler:
    """A data descriptor: wins over the instance __dict__."""

    def __set_name__(self, owner, name):
        self.slot = "_" + name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return getattr(obj, self.slot) * 2

    def __set__(self, obj, value):
        setattr(obj, self.slot, value)


class Constant:
    """A non-data descriptor: the instance __dict__ wins over it."""

    def __init__(self, value):
        self.value = value

    def __get__(self, obj, owner=None):
        return self.value


class Model:
    scale = Doubler()
    offset = Constant(5)
    registry = {"a": 1}

    def __init__(self, w):
        self.w = w
        self.scale = 3

    @property
    def weight(self):
        return self.w * self.scale

    @weight.setter
    def weight(self, value):
        self.w = value

    @classmethod
    def build(cls, w):
        return cls(w)

    @staticmethod
    def helper(v):
        return v + 1

    def apply(self, x):
        return x * self.weight + self.offset


class Vec:
    def __init__(self, data):
        self.data = data

    def __add__(self, other):
        return Vec(self.data + (other.data if isinstance(other, Vec) else other))

    def __radd__(self, other):
        return Vec(self.data + other)

    def __mul__(self, k):
        return Vec(self.data * k)

    def __neg__(self):
        return Vec(-self.data)

    def __getitem__(self, i):
        return self.data[i]

    def __len__(self):
        return self.data.shape[0]

    def __contains__(self, v):
        return v < len(self)

    def __bool__(self):
        return len(self) > 0

    def __iadd__(self, other):
        self.data = self.data + other
        return self


class Base:
    factor = 1

    def __init__(self, x):
        self.x = x

    def forward(self, v):
        return v * self.factor

    @classmethod
    def make(cls, x):
        return cls(x)

    @classmethod
    def describe(cls):
        return cls.__name__


class Middle(Base):
    factor = 2

    def forward(self, v):
        return super().forward(v) + 1

    @classmethod
    def describe(cls):
        return "middle:" + super().describe()


class Leaf(Middle):
    def forward(self, v):
        return super().forward(v) * 10

    @classmethod
    def describe(cls):
        return "leaf:" + super().describe()


class Lazy:
    """__getattr__ answers names missing from the instance and the class."""

    def __init__(self):
        self.real = 1

    def __getattr__(self, name):
        if name.startswith("w_"):
            return int(name[2:])
        raise AttributeError(name)


class Key:
    def __init__(self, k):
        self.k = k

    def __eq__(self, other):
        return isinstance(other, Key) and self.k == other.k

    def __hash__(self):
        return hash(self.k)


class Pretty:
    def __init__(self, n):
        self.n = n

    def __str__(self):
        return f"Pretty({self.n})"

    def __repr__(self):
        return f"<Pretty {self.n}>"


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Shape(abc.ABC):
    @abc.abstractmethod
    def area(self, x): ...


class Square(Shape):
    def area(self, x):
        return x * x


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b


@case("classes")
def property_getter_and_setter():
    def f(x):
        m = Model(x)
        before = m.weight
        m.weight = x + 1
        return before, m.weight
    return fn_program(f, (t(2),))


@case("classes")
def data_descriptor_wins_over_instance_dict():
    def f(x):
        m = Model(x)
        m.scale = 4
        return x * m.scale, m._scale
    return fn_program(f, (t(2),))


@case("classes")
def non_data_descriptor_shadowed_by_instance():
    def f(x):
        m = Model(x)
        a = m.offset
        m.offset = 100
        return x + a + m.offset
    return fn_program(f, (t(2),))


@case("classes")
def classmethod_and_staticmethod_calls():
    def f(x):
        m = Model.build(x)
        return m.apply(x), Model.helper(x), m.helper(x)
    return fn_program(f, (t(2),))


@case("classes")
def method_on_input_object():
    def f(x, m):
        return m.apply(x)
    return fn_program(f, (t(2), Model(t(2))))


@case("classes")
def object_attribute_written_on_input():
    def f(x, m):
        m.w = m.w + x
        m.count = getattr(m, "count", 0) + 1
        return m.weight
    m = Model(t(2))
    return Program(f, ((t(2), m), (t(2), m)), observe=lambda: (m.w, m.count))


@case("classes")
def super_chain_of_methods():
    def f(x):
        return Leaf(x).forward(x), Middle(x).forward(x)
    return fn_program(f, (t(2),))


@case("classes")
def super_classmethod_chain():
    def f(x):
        return x + len(Leaf.describe()), Leaf.describe(), Leaf.make(x).forward(x)
    return fn_program(f, (t(2),))


@case("classes")
def super_with_explicit_arguments():
    class A:
        def value(self):
            return 1

    class B(A):
        def value(self):
            return super(B, self).value() + 10

    def f(x):
        return x * B().value()
    return fn_program(f, (t(2),))


@case("classes")
def super_init_in_frame():
    class A:
        def __init__(self, v):
            self.v = v

    class B(A):
        def __init__(self, v):
            super().__init__(v * 2)
            self.extra = 1

    def f(x):
        b = B(x)
        return b.v + b.extra
    return fn_program(f, (t(2),))


@case("classes")
def dunder_arithmetic_operators():
    def f(x):
        v = Vec(x)
        w = (v + Vec(x)) * 3
        u = 1 + (-w)
        return u.data, w[0], len(w)
    return fn_program(f, (t(3),))


@case("classes")
def dunder_inplace_contains_bool():
    def f(x):
        v = Vec(x)
        v += 5
        out = v.data
        if 1 in v and v:
            out = out * 2
        return out
    return fn_program(f, (t(3),))


@case("classes")
def getattr_fallback_on_user_class():
    def f(x):
        lazy = Lazy()
        return x * lazy.w_3 + lazy.real, hasattr(lazy, "w_1"), hasattr(lazy, "zzz")
    return fn_program(f, (t(2),))


@case("classes")
def getattr_fallback_input_object():
    def f(x, lazy):
        return x + lazy.w_7
    return fn_program(f, (t(2), Lazy()))


@case("classes", fullgraph=False)
def eq_and_hash_as_dict_keys():
    def f(x):
        table = {Key(1): x, Key(2): x * 2}
        return table[Key(2)], Key(1) == Key(1), Key(1) in table
    return fn_program(f, (t(2),))


@case("classes")
def str_and_repr_of_user_object():
    def f(x):
        p = Pretty(3)
        return x + 1, str(p), repr(p), f"{p}", f"{p!r}"
    return fn_program(f, (t(2),))


@case("classes")
def call_dunder_on_object():
    class Scale:
        def __init__(self, k):
            self.k = k

        def __call__(self, v):
            return v * self.k

    def f(x):
        s = Scale(3)
        return s(x), Scale(2)(x)
    return fn_program(f, (t(2),))


@case("classes")
def class_attribute_changed_between_calls():
    class Config:
        depth = 2

    def f(x):
        for _ in range(Config.depth):
            x = x * 2
        return x

    def deepen(_, i):
        Config.depth = 3
    return Program(f, ((t(2),), (t(2),)), between=deepen)


@case("classes")
def class_dict_membership():
    def f(x):
        if "registry" in type(Model(x)).__dict__:
            return x + 1
        return x - 1
    return fn_program(f, (t(2),))


@case("classes")
def class_level_dict_mutated():
    class Cache:
        store = {}

    def f(x):
        Cache.store["k"] = x.shape[0]
        return x + len(Cache.store)
    return Program(f, ((t(2),),), observe=lambda: dict(Cache.store))


@case("classes")
def enum_members_and_values():
    def f(x, color):
        if color == Color.RED:
            return x + color.value
        return x - Color.BLUE.value, color.name
    return fn_program(f, (t(2), Color.RED), (t(2), Color.BLUE))


@case("classes")
def abstract_base_class_method():
    def f(x):
        s = Square()
        return s.area(x), isinstance(s, Shape)
    return fn_program(f, (t(2),))


@case("classes")
def slotted_object_attributes():
    def f(x):
        s = Slotted(x, 2)
        s.b = 5
        return s.a * s.b
    return fn_program(f, (t(2),))


@case("classes")
def object_made_in_frame_returned():
    def f(x):
        m = Model(x + 1)
        m.note = "made"
        return m
    return fn_program(f, (t(2),))


@case("classes")
def isinstance_of_user_class_hierarchy():
    def f(x, obj):
        out = x
        if isinstance(obj, Base):
            out = out + 1
        if isinstance(obj, Middle):
            out = out + 10
        if type(obj) is Leaf:
            out = out + 100
        return out
    return fn_program(f, (t(2), Leaf(1)), (t(2), Base(1)))


@case("classes")
def method_bound_and_passed():
    def f(x):
        m = Model(x)
        method = m.apply
        return method(x), method.__self__ is m, method.__func__ is Model.apply
    return fn_program(f, (t(2),))


@case("classes", fullgraph=False)
def dynamic_class_made_with_type():
    def f(x):
        Kind = type("Kind", (object,), {"k": 3, "run": lambda self, v: v * self.k})
        return Kind().run(x)
    return fn_program(f, (t(2),))


@case("classes", fullgraph=False)
def class_defined_inside_frame():
    def f(x):
        class Local:
            def __init__(self, v):
                self.v = v

            def twice(self):
                return self.v * 2

        return Local(x).twice()
    return fn_program(f, (t(2),))


@case("classes", fullgraph=False)
def getattribute_override():
    class Counting:
        def __init__(self):
            self.value = 2

        def __getattribute__(self, name):
            if name == "virtual":
                return 40
            return object.__getattribute__(self, name)

    def f(x):
        c = Counting()
        return x * c.value + c.virtual
    return fn_program(f, (t(2),))


@case("classes")
def setattr_override_records_writes():
    class Recorder:
        def __init__(self):
            object.__setattr__(self, "log", [])

        def __setattr__(self, name, value):
            self.log.append(name)
            object.__setattr__(self, name, value)

    def f(x, r):
        r.a = x + 1
        r.b = 2
        return r.a * r.b
    r = Recorder()
    return Program(f, ((t(2), r),), observe=lambda: list(r.log))


@case("classes", fullgraph=False)
def object_comparison_dunders():
    class Weight:
        def __init__(self, v):
            self.v = v

        def __lt__(self, other):
            return self.v < other.v

    def f(x):
        items = [Weight(3), Weight(1), Weight(2)]
        ordered = sorted(items)
        return x * ordered[0].v + max(items).v
    return fn_program(f, (t(2),))


@case("classes")
def instance_dict_update_and_vars():
    class Bag:
        pass

    def f(x):
        b = Bag()
        b.__dict__.update(a=1, b=x)
        return b.b * b.a, sorted(vars(b))
    return fn_program(f, (t(2),))


@case("classes")
def mixin_method_resolution():
    class ScaleMixin:
        def scale(self, v):
            return v * 2

    class ShiftMixin:
        def scale(self, v):
            return v + 100

        def shift(self, v):
            return v + 1

    class Both(ScaleMixin, ShiftMixin):
        pass

    def f(x):
        b = Both()
        return b.scale(x), b.shift(x), [c.__name__ for c in Both.__mro__]
    return fn_program(f, (t(2),))


@case("classes", fullgraph=False)
def property_raising_attribute_error_falls_to_getattr():
    class Tricky:
        @property
        def missing(self):
            raise AttributeError("no")

        def __getattr__(self, name):
            return 7

    def f(x):
        return x + Tricky().missing
    return fn_program(f, (t(2),))


@case("classes")
def class_variable_via_instance_and_shadowing():
    class Counter:
        total = 0

    def f(x):
        c = Counter()
        c.total += 5
        return x + c.total + Counter.total
    return fn_program(f, (t(2),))


@case("classes")
def object_with_tensor_attribute_list():
    class Holder2:
        def __init__(self):
            self.items = []

        def add(self, v):
            self.items.append(v)
            return self

    def f(x):
        h = Holder2().add(x).add(x * 2)
        return torch.stack(h.items).sum(0)
    return fn_program(f, (t(3),))


@case("classes")
def property_with_c_function_getter():
    class Wrap:
        def __init__(self, v):
            self._v = v

        size_of = property(len)

        def __len__(self):
            return 4

    def f(x):
        return x + Wrap(x).size_of
    return fn_program(f, (t(2),))


class Clamped:
    """A data descriptor written in Python: its __set__ clamps and counts writes."""

    def __set_name__(self, owner, name):
        self.slot = "_" + name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        return getattr(obj, self.slot)

    def __set__(self, obj, value):
        obj.writes = getattr(obj, "writes", 0) + 1
        setattr(obj, self.slot, min(value, 10))


class Knob:
    level = Clamped()

    def __init__(self, level):
        self.level = level

    @property
    def double(self):
        return self.level * 2

    @property
    def positive(self):
        return self._positive

    @positive.setter
    def positive(self, value):
        if value < 0:
            raise ValueError("negative")
        self._positive = value


@case("classes")
def data_descriptor_set_on_input_object():
    def f(x, k):
        k.level = 50
        return x * k.level, k.double, k.writes
    k = Knob(3)
    return Program(f, ((t(2), k),), observe=lambda: dict(vars(k)))


@case("classes")
def data_descriptor_set_in_init_of_object_made_in_frame():
    def f(x):
        k = Knob(99)
        k.level = 4
        return x + k.level, k.writes, k._level
    return fn_program(f, (t(2),))


@case("classes")
def property_setter_raises_and_is_caught():
    def f(x):
        k = Knob(1)
        k.positive = 2
        try:
            k.positive = -1
        except ValueError as err:
            return x * k.positive, str(err)
        return x, "no error"
    return fn_program(f, (t(2),))


@case("classes")
def property_without_setter_assignment_caught():
    def f(x):
        k = Knob(1)
        try:
            k.double = 5
        except AttributeError:
            return x + k.double
        return x
    return fn_program(f, (t(2),))


@case("classes")
def setattr_override_on_object_made_in_frame():
    class Tracked:
        def __init__(self):
            object.__setattr__(self, "names", [])

        def __setattr__(self, name, value):
            self.names.append(name)
            object.__setattr__(self, name, value * 2 if isinstance(value, int) else value)

    def f(x):
        obj = Tracked()
        obj.a = 3
        obj.t = x + 1
        return obj.t * obj.a, obj.names
    return fn_program(f, (t(2),))


@case("classes")
def setattr_override_redirects_writes_of_input():
    class Prefixed:
        def __setattr__(self, name, value):
            object.__setattr__(self, "p_" + name, value)

    def f(x, p):
        p.w = x * 2
        p.n = 4
        return p.p_w + p.p_n
    p = Prefixed()
    return Program(f, ((t(2), p),), observe=lambda: sorted(vars(p)))


@case("classes", fullgraph=False)
def class_made_natively_takes_frame_module():
    def f(x):
        Kind = type("Kind", (), {"k": 2})
        return x * Kind.k, Kind.__module__, Kind.__qualname__
    return fn_program(f, (t(2),))


@case("classes", fullgraph=False)
def namedtuple_made_in_frame_module():
    import collections

    def f(x):
        Pair = collections.namedtuple("Pair", ["a", "b"])
        p = Pair(x, 3)
        return p.a * p.b, Pair.__module__, p._fields
    return fn_program(f, (t(2),))


@case("classes", fullgraph=False)
def enum_made_by_functional_api_in_frame():
    def f(x):
        Level = enum.Enum("Level", "LOW HIGH")
        return x + Level.HIGH.value, Level.__module__, Level.LOW.name
    return fn_program(f, (t(2),))


def _caller_module():
    return sys._getframe(1).f_globals.get("__name__")


@case("classes", fullgraph=False)
def frame_read_in_frame_and_by_callee():
    def f(x):
        here = sys._getframe(0).f_code.co_name
        return x + 1, here, _caller_module(), inspect.currentframe().f_code.co_name
    return fn_program(f, (t(2),))


@case("classes", fullgraph=False)
def frame_read_by_callee_after_break():
    def f(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1, _caller_module()
    return fn_program(f, (t(2),))


class Money:
    """Binary dunders written in Python: NotImplemented for what they do not take."""

    def __init__(self, cents):
        self.cents = cents

    def __add__(self, other):
        if isinstance(other, Money):
            return Money(self.cents + other.cents)
        if isinstance(other, int):
            return Money(self.cents + other)
        return NotImplemented

    def __radd__(self, other):
        return self.__add__(other)

    def __mul__(self, k):
        return Money(self.cents * k) if isinstance(k, (int, torch.Tensor)) else NotImplemented

    def __invert__(self):
        return Money(-self.cents)


class Euro(Money):
    def __radd__(self, other):
        return Euro(1000 + (other.cents if isinstance(other, Money) else other))


@case("classes")
def binary_dunders_reflected_and_subclass_first():
    def f(x):
        a = Money(5) + Euro(7)   # Euro overrides __radd__: it runs first
        b = 3 + Money(4)         # int gives NotImplemented: Money.__radd__
        c = Money(2) * x         # a tensor operand handled by the user's method
        total = Money(1)
        total += Money(9)        # no __iadd__: `total = total + ...`
        return type(a).__name__, a.cents, b.cents, c.cents, total.cents, (~Money(3)).cents
    return fn_program(f, (t(2),))


@case("classes")
def binary_dunder_not_implemented_raises_type_error():
    def f(x):
        try:
            Money(1) + "text"
        except TypeError:
            x = x + 1
        try:
            Money(1) * 2.5
        except TypeError:
            x = x * 2
        return x
    return fn_program(f, (t(2),))


@case("classes")
def inplace_dunder_on_input_object_mutates_it():
    class Acc:
        def __init__(self):
            self.items = []

        def __iadd__(self, other):
            self.items.append(other)
            return self

        def __len__(self):
            return len(self.items)

    def f(x, acc):
        acc += x * 2
        acc += 3
        return len(acc), x + 1
    acc = Acc()
    return Program(f, ((t(2), acc),), observe=lambda: len(acc.items))


@case("classes")
def module_property_setter_in_forward():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self._k = 2

        @property
        def k(self):
            return self._k + 1

        @k.setter
        def k(self, v):
            self._k = v

        def forward(self, x):
            self.k = 5
            return self.lin(x) * self.k
    return Program(M(), ((t(1, 2),),))


@case("classes")
def module_setattr_override_and_data_descriptor_in_forward():
    class Tenfold:
        def __set_name__(self, owner, name):
            self.slot = "_" + name

        def __get__(self, obj, cls):
            return self if obj is None else getattr(obj, self.slot, 0)

        def __set__(self, obj, value):
            setattr(obj, self.slot, value * 10)

    class M(nn.Module):
        d = Tenfold()

        def __setattr__(self, name, value):
            if name == "z":
                value = value + 1000
            super().__setattr__(name, value)

        def forward(self, x):
            self.z = 5
            self.d = 2
            return x * self.z + self.d
    return Program(M(), ((t(2),), (t(2),)))


@case("classes", fullgraph=False)
def getattr_fallback_raising_key_error_changes_between_calls():
    class G:
        def __init__(self):
            self.tbl = {"k": 1}

        def __getattr__(self, n):
            return self.tbl[n]
    g = G()

    def mutate(i):
        g.tbl["k"] = i * 7
    return fn_program(lambda x: x * g.k, (t(2),), (t(2),), (t(2),), between=lambda s, i: mutate(i))


@case("classes", fullgraph=False)
def abc_register_between_calls_changes_isinstance():
    class B(abc.ABC):
        pass

    class X:
        pass
    x_ = X()

    def f(x):
        return x + 1 if isinstance(x_, B) else x - 1

    def mutate(i):
        if i == 1:
            B.register(X)
    return fn_program(f, (t(2),), (t(2),), (t(2),), between=lambda s, i: mutate(i))


@case("classes")
def isinstance_with_metaclass_instancecheck():
    class HasScale(type):
        def __instancecheck__(cls, obj):
            return hasattr(obj, "scale")

    class Scalable(metaclass=HasScale):
        pass

    class A:
        scale = 3

    a, b = A(), object()

    def f(x):
        if isinstance(a, Scalable) and not isinstance(b, (int, Scalable)):
            return x * a.scale
        return x
    return fn_program(f, (t(2),))


@case("classes")
def setattr_override_on_global_object_records_names():
    class Rec:
        def __init__(self):
            object.__setattr__(self, "log", [])

        def __setattr__(self, name, value):
            self.log.append(name)
            object.__setattr__(self, name, value * 2)
    r = Rec()

    def f(x):
        r.a = 3
        r.b = 4
        return x * r.a + r.b
    return fn_program(f, (t(2),), observe=lambda: (list(r.log), r.a, r.b))


@case("classes")
def super_chain_through_diamond_mixins():
    class Base:
        def go(self, x):
            return x + 1

    class MixA(Base):
        def go(self, x):
            return super().go(x) * 2

    class MixB(Base):
        def go(self, x):
            return super().go(x) - 3

    class D(MixA, MixB):
        def go(self, x):
            return super().go(x) + 100

    def f(x):
        return D().go(x), [c.__name__ for c in D.__mro__]
    return fn_program(f, (t(2),))


@case("classes")
def dataclass_post_init_with_init_false_field():
    @dataclasses.dataclass
    class Cfg:
        a: int
        b: int = 2
        c: int = dataclasses.field(init=False)

        def __post_init__(self):
            self.c = self.a * self.b

    def f(x):
        c = Cfg(3)
        return x * c.c, dataclasses.astuple(c), c == Cfg(3, 2)
    return fn_program(f, (t(2),))


@case("classes")
def init_subclass_registry_with_class_keyword():
    registry = {}

    class Base:
        def __init_subclass__(cls, key=None, **kw_):
            super().__init_subclass__(**kw_)
            registry[key] = cls

    class A(Base, key="a"):
        k = 2

    class B(Base, key="b"):
        k = 3

    def f(x, name):
        return x * registry[name].k
    return fn_program(f, (t(2), "a"), (t(2), "b"))


@case("classes")
def frozen_dataclass_assignment_raises_and_is_caught():
    # a frozen dataclass's generated __setattr__ is traced: its FrozenInstanceError is caught in the frame
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        a: int

        def __post_init__(self):
            object.__setattr__(self, "b", self.a * 2)

    outside = Frozen(5)

    def f(x):
        o = Frozen(2)
        hits = 0
        for target in (o, outside):
            try:
                target.a = 3
            except dataclasses.FrozenInstanceError:
                hits += 1
        return x * o.a + o.b + outside.b, hits
    return fn_program(f, (t(2),))


@case("classes")
def property_and_descriptor_deleters():
    # `del obj.name` through a property's deleter or a descriptor's __delete__ is traced
    log = []

    class Slot:
        def __set_name__(self, owner, name):
            self.key = "_" + name

        def __get__(self, obj, owner=None):
            return getattr(obj, self.key, 0) if obj is not None else self

        def __delete__(self, obj):
            log.append(("delete", self.key))
            obj.__dict__.pop(self.key, None)

    class C:
        w = Slot()

        def __init__(self):
            self._v = 3
            self._w = 4

        @property
        def v(self):
            return getattr(self, "_v", -1)

        @v.deleter
        def v(self):
            log.append("v")
            del self._v

    c = C()

    def f(x):
        a = c.v
        del c.v
        fresh = C()
        del fresh.w
        return x * a + c.v + fresh.w
    return fn_program(f, (t(2),), observe=lambda: (list(log), sorted(c.__dict__)))


@case("classes")
def runtime_protocol_with_data_members_isinstance():
    # typing answers isinstance against a data protocol by the object's attributes (duck typing),
    # traced with guarded lookups: the answer changes with the object passed (it was a graph break)
    import typing

    @typing.runtime_checkable
    class HasScale(typing.Protocol):
        scale: float

        def apply(self, v): ...

    class Good:
        def __init__(self):
            self.scale = 2.0

        def apply(self, v):
            return v * self.scale

    class NoneApply(Good):
        apply = None

    class Nominal(HasScale):
        pass

    def f(x, o):
        if isinstance(o, HasScale):
            return x * getattr(o, "scale", 5.0)
        return x - 1
    return fn_program(f, (t(2), Good()), (t(2), object()), (t(2), NoneApply()), (t(2), Nominal()))


@case("classes")
def attribute_reads_after_the_trace_wrote_the_instance_dict():
    # after vars(obj) / obj.__dict__ was written in the trace, a read follows object's order: a
    # data descriptor's __get__ (reading the written dict), then the dict, then the class (a
    # non-data descriptor caching into the dict is read back from it): they were graph breaks
    class Lazy:
        def __get__(self, obj, cls):
            if obj is None:
                return self
            obj.__dict__["val"] = 7
            return 5

    class Typed:
        def __get__(self, obj, cls):
            return obj.__dict__.get("n", 0) * 10

        def __set__(self, obj, v):
            obj.__dict__["n"] = int(v)

    class H:
        val = Lazy()
        n = Typed()
        k = 3

    h = H()

    def f(x):
        a = h.val
        b = h.val
        h.n = 2.7
        h.__dict__["n"] = 4
        return x * a + b + h.n + h.k
    return fn_program(f, (t(2),), observe=lambda: dict(h.__dict__))
