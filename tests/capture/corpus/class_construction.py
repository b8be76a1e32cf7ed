"""Corpus: classes that take over their own construction with a Python `__new__`: instance caches
and singletons kept on the class, a `__new__` that returns another type (no `__init__` then) or an
instance of a subclass (whose `__init__` runs), tuple and namedtuple subclasses mapping their
arguments to items. type.__call__'s order is what must hold: `__new__(cls, ...)`, then `__init__`
only on an instance of cls, and an object the trace built is never passed through `__new__` again
when it is handed back (the namedtuple subclass's fields were doubled twice: a wrong answer).
"""
from __future__ import annotations

import collections

from .program import fn_program, case, t


@case("classes")
def new_keeps_an_instance_cache_on_the_class():
    class Interned:
        table = {}

        def __new__(cls, key):
            if key not in cls.table:
                made = super().__new__(cls)
                made.key = key
                made.uses = 0
                cls.table[key] = made
            return cls.table[key]

        def __init__(self, key):
            self.uses += 1

    def f(x):
        a, b, again = Interned("w"), Interned("b"), Interned("w")
        return x * a.uses + b.uses, a is again, sorted(Interned.table)
    return fn_program(f, (t(3),), (t(3),), observe=lambda: {k: v.uses for k, v in Interned.table.items()})


@case("classes")
def new_makes_a_singleton_counted_across_calls():
    class Registry:
        only = None

        def __new__(cls):
            if cls.only is None:
                cls.only = object.__new__(cls)
                cls.only.calls = []
            return cls.only

    def f(x):
        reg = Registry()
        reg.calls.append(x.shape[0])
        return x + len(reg.calls), Registry() is reg
    return fn_program(f, (t(2),), (t(3),), (t(2),), observe=lambda: list(Registry.only.calls))


@case("classes")
def new_returning_another_type_skips_init():
    made = []

    class Clamped:
        def __new__(cls, v):
            if v > 10:
                return 10
            return super().__new__(cls)

        def __init__(self, v):
            made.append(v)
            self.v = v

    def f(x):
        small, big = Clamped(4), Clamped(40)
        return x * small.v + big, type(big).__name__
    return fn_program(f, (t(3),), observe=lambda: list(made))


@case("classes")
def new_returns_a_subclass_whose_init_runs():
    class Shape:
        def __new__(cls, sides):
            kind = Triangle if sides == 3 else Square
            return super().__new__(kind)

        def __init__(self, sides):
            self.sides = sides

    class Triangle(Shape):
        def __init__(self, sides):
            super().__init__(sides)
            self.scale = 0.5

    class Square(Shape):
        def __init__(self, sides):
            super().__init__(sides)
            self.scale = 2.0

    def f(x):
        a, b = Shape(3), Shape(4)
        return x * a.scale + b.scale * b.sides, type(a).__name__, isinstance(b, Shape)
    return fn_program(f, (t(3),))


@case("classes")
def tuple_subclass_new_maps_arguments_to_items():
    class Extent(tuple):
        def __new__(cls, lo, hi):
            return super().__new__(cls, (min(lo, hi), max(lo, hi)))

        @property
        def width(self):
            return self[1] - self[0]

    def f(x):
        e = Extent(5, 1)
        return x[e[0]:e[1]] * e.width, e, len(e)
    return fn_program(f, (t(6),))


@case("classes")
def namedtuple_subclass_new_transforms_fields_and_is_returned():
    Base = collections.namedtuple("Base", "scale shift", defaults=[0])

    class Doubled(Base):
        def __new__(cls, scale, shift=0):
            return super().__new__(cls, scale * 2, shift - 1)

    def f(x):
        d = Doubled(3)
        e = d._replace(shift=5)
        return x * d.scale + d.shift, d, e
    return fn_program(f, (t(3),), (t(3),))


@case("classes")
def new_and_init_both_take_arguments():
    class Tagged:
        created = 0

        def __new__(cls, *args, **kwargs):
            cls.created += 1
            inst = super().__new__(cls)
            inst.order = cls.created
            return inst

        def __init__(self, value, *, label="v"):
            self.value = value
            self.label = label

    def f(x):
        p, q = Tagged(2), Tagged(x, label="t")
        return q.value * p.value + p.order, q.label, Tagged.created
    return fn_program(f, (t(3),), (t(3),))
