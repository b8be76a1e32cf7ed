"""Standard-library helpers that ask questions of builtin types, traced as eager runs them:
`dataclasses.asdict`/`astuple`/`fields`/`replace` (they ask `hasattr(type(v), "__dataclass_fields__")`
of every value, ints and floats included), and attribute reads on builtin types, present or not."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import kiln


@dataclasses.dataclass
class Inner:
    w: float = 0.5


@dataclasses.dataclass
class Cfg:
    scale: float = 2.0
    name: str = "cfg"
    shifts: list = dataclasses.field(default_factory=lambda: [1, 2])
    inner: Inner = dataclasses.field(default_factory=Inner)
    pair: tuple = (1, 2.5)


def as_dict(x):
    c = Cfg()
    c.shifts.append(3)
    d = dataclasses.asdict(c)
    return x * d["scale"] + sum(d["shifts"]) + d["inner"]["w"], d


def as_tuple(x):
    c = Cfg(scale=3.0)
    t = dataclasses.astuple(c)
    return x * t[0], t


def names_of_fields(x):
    return x + len(dataclasses.fields(Cfg)), [f.name for f in dataclasses.fields(Cfg())]


def replaced(x):
    c = dataclasses.replace(Cfg(), scale=4.0)
    return x * c.scale, dataclasses.is_dataclass(c), dataclasses.is_dataclass(3)


def builtin_attribute_reads(x):
    return (x + 1, hasattr(int, "zz"), hasattr(int, "bit_length"), getattr(float, "qq", 5),
            hasattr(str, "__match_args__"), hasattr(list, "append"))


def builtin_attribute_error_caught(x):
    try:
        return int.nope
    except AttributeError as e:
        return x + 1, str(e)


@pytest.mark.parametrize("fn", [as_dict, as_tuple, names_of_fields, replaced, builtin_attribute_reads,
                                builtin_attribute_error_caught])
def test_traced_in_one_graph_as_eager(fn):
    kiln.reset()
    x = torch.randn(3)
    got = kiln.compile(fn, backend="eager", fullgraph=True)(x)
    expected = fn(x)
    torch.testing.assert_close(got[0], expected[0])
    assert got[1:] == expected[1:]
    assert kiln.stats()["graph_breaks"] == 0


def test_uncaught_attribute_error_of_a_builtin_is_eagers():
    def f(x):
        return x + float.missing

    with pytest.raises(AttributeError, match="type object 'float' has no attribute 'missing'"):
        kiln.compile(f, backend="eager")(torch.randn(2))
