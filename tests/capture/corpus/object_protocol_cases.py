"""Corpus: the object protocol of user classes where the class decides more than usual: a Python
`__getattribute__` (on objects made in the frame and from outside), abstract classes instantiated,
an instance `__dict__` written after attribute writes, `object.__new__` with `__init__` called by
hand, `__slots__` deleted, `super().__setattr__`, and Enum classes iterated and used as dict keys.

Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import abc
import dataclasses
import enum
import functools

import torch

from .program import Program, case, fn_program, t


class Shade(enum.Enum):
    LIGHT = 1
    DARK = 2


@case("classes")
def getattribute_of_object_made_in_frame_runs():
    # the class's own __getattribute__ decides every read of an object built in the frame (it was
    # skipped: the reads it records were lost)
    class Spy:
        def __init__(self):
            object.__setattr__(self, "reads", [])
            object.__setattr__(self, "w", 3)

        def __getattribute__(self, name):
            if name != "reads":
                object.__getattribute__(self, "reads").append(name)
            return object.__getattribute__(self, name)

    def f(x):
        s = Spy()
        y = x * s.w + s.w
        return y, list(s.reads)
    return fn_program(f, (t(3),))


@case("classes")
def getattribute_super_on_object_made_in_frame():
    class Scaled:
        def __init__(self):
            self.k = 2

        def __getattribute__(self, name):
            value = super().__getattribute__(name)
            return value * 10 if name == "k" else value

    def f(x):
        return x * Scaled().k
    return fn_program(f, (t(3),))


@case("classes")
def getattribute_transforming_input_object_guards_the_stored_value():
    # the guard on what the generic lookup found reads obj.__dict__['scale'], not obj.scale (which
    # the class answers with 10x): a fresh capture failed its own guards
    class Cfg:
        def __init__(self):
            self.scale = 2

        def __getattribute__(self, name):
            value = super().__getattribute__(name)
            return value * 10 if name == "scale" else value

    cfg = Cfg()

    def f(x):
        return x * cfg.scale

    def between(subject, i):
        object.__setattr__(cfg, "scale", i + 3)
    return fn_program(f, (t(3),), (t(3),), (t(3),), between=between)


@case("classes")
def abstract_class_instantiated_raises_type_error():
    # object.__new__ refuses a class with abstract methods left; the trace built the object
    class Base(abc.ABC):
        @abc.abstractmethod
        def go(self):
            ...

    class Half(Base):
        @abc.abstractmethod
        def other(self):
            ...

        def go(self):
            return 1

    def f(x):
        caught = 0
        for cls in (Base, Half):
            try:
                cls()
            except TypeError:
                caught += 1
        return x + caught
    return fn_program(f, (t(3),))


@case("classes")
def instance_dict_written_after_attribute_write():
    # `d = obj.__dict__; obj.n += 1; d['m'] = 5`: the dict was replayed with `n` as read before the
    # attribute write, which was lost
    class K:
        def __init__(self):
            self.n = 0

    k = K()

    def f(x):
        d = k.__dict__
        k.n += 1
        d["m"] = 5
        return x + k.n
    return fn_program(f, (t(3),), (t(3),), observe=lambda: dict(k.__dict__))


@case("classes")
def cached_property_of_input_object_counts_its_computation():
    # functools.cached_property reads obj.__dict__, runs the getter (which writes obj.n), then
    # stores into the dict: the getter's write was lost
    class K:
        def __init__(self):
            self.n = 0

        @functools.cached_property
        def heavy(self):
            self.n += 1
            return torch.ones(3) * 5

    k = K()

    def f(x):
        return x + k.heavy
    return fn_program(f, (t(3),), (t(3),), observe=lambda: k.n)


@case("classes")
def object_new_then_init_called_by_hand():
    class K:
        def __init__(self, v):
            self.v = v

    def f(x):
        o = K.__new__(K)
        K.__init__(o, x)
        return o.v + 1
    return fn_program(f, (t(3),))


@case("classes")
def slot_deleted_on_object_made_in_frame():
    class S:
        __slots__ = ("a", "b")

    def f(x):
        s = S()
        s.a = x
        s.b = 2
        del s.a
        return x * s.b, hasattr(s, "a"), hasattr(s, "b")
    return fn_program(f, (t(3),))


@case("classes")
def setattr_override_calls_super_on_object_made_in_frame():
    class Doubling:
        def __setattr__(self, name, value):
            if isinstance(value, torch.Tensor):
                value = value * 2
            super().__setattr__(name, value)

    def f(x):
        o = Doubling()
        o.a = x
        o.b = 3
        return o.a + o.b
    return fn_program(f, (t(3),))


@case("classes")
def enum_class_iterated_and_measured():
    def f(x):
        names = [m.name for m in Shade]
        return x * len(Shade) + sum(m.value for m in Shade), names, list(Shade)[-1]
    return fn_program(f, (t(3),))


@case("classes")
def dict_keyed_by_enum_members_looked_up_and_changed():
    table = {Shade.LIGHT: 2.0, Shade.DARK: -1.0}

    def f(x, shade):
        table[Shade.DARK] = table[Shade.DARK] - 1
        return x * table[shade], shade in table

    return fn_program(f, (t(3), Shade.LIGHT), (t(3), Shade.DARK), observe=lambda: dict(table))


@case("classes")
def instance_dict_read_before_attribute_writes_sees_them():
    # a `vars(obj)` held across attribute writes and a delete is the same dict: it answered with
    # what it held when read
    class K:
        def __init__(self):
            self.n = 0
            self.gone = 1

    k = K()

    def f(x):
        d = vars(k)
        k.n = 3
        k.q = 4
        del k.gone
        return x + d["n"] + len(d), "q" in d, "gone" in d, list(d)
    return fn_program(f, (t(3),), observe=lambda: dict(k.__dict__))


@case("classes")
def frozen_dataclasses_made_in_frame_key_sets_and_dicts():
    # a frozen dataclass built from constants hashes and compares by its fields, as a tuple would
    # (it was a break: "dict key ... is not a constant")
    @dataclasses.dataclass(frozen=True)
    class Key:
        name: str
        level: int = 0

    def f(x):
        seen = {Key("a"), Key("a"), Key("b", 1)}
        table = {Key("a"): 2.0, Key("b", 1): 3.0}
        return x * table[Key("b", 1)] + len(seen), Key("a") in seen, Key("c") in table
    return fn_program(f, (t(3),))
