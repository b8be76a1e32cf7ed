"""Objects of classes with __slots__ made in the frame: built attribute by attribute (slots set
through their descriptors when the object is rebuilt), a name outside the slots raises eager's
AttributeError, a subclass adding a __dict__ keeps both; traced whole as torch.compile traces them."""
from __future__ import annotations

import torch

import kiln
from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b


class WithDict(Slotted):
    def __init__(self, a, b):
        super().__init__(a, b)
        self.c = 4


class Half:
    __slots__ = ("a", "b")

    def __init__(self, a):
        self.a = a


class Point:
    __slots__ = ("x", "y")

    def __init__(self, x, y):
        self.x, self.y = x, y

    def norm2(self):
        return self.x * self.x + self.y * self.y


def test_slotted_object_read_and_written() -> None:
    def f(x):
        s = Slotted(x, 2)
        s.b = 5
        return s.a * s.b
    check_traced(f, fresh(X))


def test_name_outside_the_slots_raises_attribute_error() -> None:
    def f(x):
        s = Slotted(x, 2)
        try:
            s.c = 3
        except AttributeError:
            x = x + 1
        return x * s.b, hasattr(s, "__dict__"), hasattr(s, "c")
    check_traced(f, fresh(X))


def test_unset_slot_reads_as_missing() -> None:
    def f(x):
        s = Half(x)
        return s.a + 1, hasattr(s, "b")
    check_traced(f, fresh(X))


def test_slotted_objects_returned_are_rebuilt_through_their_slots() -> None:
    def f(x):
        p = Point(x, x + 1)
        m = WithDict(x * 2, 3)
        m.a = m.a + p.norm2()
        return p, m
    kiln.reset()
    p, m = kiln.compile(f, backend="eager", fullgraph=True)(X)
    want_p, want_m = f(X)
    assert torch.equal(p.x, want_p.x) and torch.equal(p.y, want_p.y)
    assert torch.equal(m.a, want_m.a) and m.b == 3 and vars(m) == {"c": 4}


def test_dict_of_a_class_with_slots_and_dict_breaks_and_matches_eager() -> None:
    def f(x):
        m = WithDict(x, 3)
        return x * m.b + m.c, sorted(vars(m))
    kiln.reset()
    got = kiln.compile(f, backend="eager")(X)
    want = f(X)
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
