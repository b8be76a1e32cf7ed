"""Enum members during capture: `.value` / `.name` read off a member guarded by identity, members
compared, used as dict keys, looked up by value (`Color(2)`), Flag members combined through Flag's
Python `__or__` (whose instances must not see the metaclass's `__getattr__`), IntEnum arithmetic;
traced whole as torch.compile traces them, and a different member recompiles."""
from __future__ import annotations

import enum

import torch

from semantics_oracle import check_calls
from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 5


class Perm(enum.Flag):
    R = 1
    W = 2


class Boxed(enum.Enum):
    SMALL = (1, "s")
    LARGE = (3, "l")


def pick(x, color):
    if color == Color.RED:
        return x + color.value
    return x - Color.BLUE.value, color.name


def test_member_value_and_name_for_each_member() -> None:
    check_traced(pick, fresh(X, Color.RED))
    check_traced(pick, fresh(X, Color.BLUE))
    check_calls(pick, [(X, Color.RED), (X, Color.BLUE), (X, Color.RED)], fullgraph=True)


def test_int_enum_arithmetic_and_ordering() -> None:
    def f(x, level):
        return x * level + Level.HIGH, level > Level.LOW, int(level), level.value
    check_traced(f, fresh(X, Level.HIGH))


def test_member_as_dict_key_identity_and_isinstance() -> None:
    def f(x, c):
        weights = {Color.RED: 1, Color.BLUE: 2}
        return x * weights[c], c is Color.BLUE, isinstance(c, Color), c._value_, c._name_
    check_traced(f, fresh(X, Color.BLUE))


def test_lookup_by_value_and_tuple_values() -> None:
    def f(x, box):
        size, tag = box.value
        return x * size + Color(2).value, tag
    check_traced(f, fresh(X, Boxed.LARGE), oracle=False)


def test_flag_members_combined() -> None:
    def f(x, p):
        both = p | Perm.W
        return x * both.value, Perm.W in both
    check_traced(f, fresh(X, Perm.R), oracle=False)
