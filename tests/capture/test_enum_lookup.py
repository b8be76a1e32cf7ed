"""`Color(value)` inside a compiled function: the member looked up at trace time (one graph, the
value guarded), the ValueError of a value no member has raised where eager raises it, and a class
with its own `_missing_` hook left to eager (its Python runs there)."""
from __future__ import annotations

import enum

import pytest
import torch

import kiln


class Mode(enum.Enum):
    ADD = 1
    MUL = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 3


class Shape(enum.Enum):
    SQUARE = "sq"
    ROUND = "rd"

    @classmethod
    def _missing_(cls, value):
        return cls.SQUARE if str(value).startswith("s") else None


def apply(x, m):
    mode = Mode(m)
    if mode is Mode.ADD:
        return x + 2, mode
    return x * 2, mode


def levels(x, v):
    return x * Level(v), Level(v).name


def shapes(x, v):
    return x + len(Shape(v).value)


def test_member_by_value_in_one_graph():
    kiln.reset()
    compiled = kiln.compile(apply, backend="eager", fullgraph=True)
    x = torch.randn(3)
    for m in (1, 2, 1, Mode.MUL):
        got, expected = compiled(x, m), apply(x, m)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] is expected[1]
    assert kiln.stats()["graph_breaks"] == 0


def test_int_enum_member():
    compiled = kiln.compile(levels, backend="eager", fullgraph=True)
    x = torch.randn(3)
    for v in (1, 3):
        got, expected = compiled(x, v), levels(x, v)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1] == expected[1]


def test_unknown_value_raises_eagers_value_error():
    compiled = kiln.compile(apply, backend="eager")
    with pytest.raises(ValueError, match="7 is not a valid Mode"):
        compiled(torch.randn(2), 7)


def test_a_missing_hook_runs_as_eager():
    compiled = kiln.compile(shapes, backend="eager")
    x = torch.randn(2)
    for v in ("sq", "rd", "strange"):
        torch.testing.assert_close(compiled(x, v), shapes(x, v))
    with pytest.raises(ValueError):
        compiled(x, "zzz")
