"""A recompile's message is written during the guard check, before the call runs: it names the values
it shows without running the program's Python __repr__ (which may raise on a half-made object or have
side effects). Found by the held-out Autoformer (copy.deepcopy of its config inside forward)."""
from __future__ import annotations

import collections
import copy
import dataclasses

import torch

import kiln
from kiln.capture import entry
from kiln.capture.guards.kinds import _short


@dataclasses.dataclass
class Settings:
    scale: float = 2.0
    names: list = dataclasses.field(default_factory=lambda: ["a", "b"])


class Loud:
    reprs = 0

    def __repr__(self) -> str:
        Loud.reprs += 1
        return "Loud()"


class Broken:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_deepcopy_of_a_dataclass_in_the_compiled_function() -> None:
    # deepcopy's own frame recompiles while its memo holds the copy _reconstruct has not filled yet
    def f(x, s):
        d = copy.deepcopy(s)
        d.scale = d.scale + 1
        return x * d.scale + len(d.names), s.scale

    compiled = kiln.compile(f, backend="eager")
    x = torch.ones(3)
    for _ in range(2):
        got, want = compiled(x, Settings()), f(x, Settings())
        assert torch.equal(got[0], want[0]) and got[1] == want[1]


def test_copy_of_a_dataclass_in_the_compiled_function() -> None:
    def f(x, s):
        d = copy.copy(s)
        d.scale = 5.0
        return x * d.scale, s.scale

    compiled = kiln.compile(f, backend="eager")
    x = torch.ones(3)
    got, want = compiled(x, Settings()), f(x, Settings())
    assert torch.equal(got[0], want[0]) and got[1] == want[1]


def test_recompile_does_not_run_a_python_repr() -> None:
    def f(x, o):
        return x + 1 if o is None else x - 1

    compiled = kiln.compile(f, backend="eager")
    x = torch.ones(2)
    assert torch.equal(compiled(x, None), x + 1)
    Loud.reprs = 0
    assert torch.equal(compiled(x, Loud()), x - 1)
    assert Loud.reprs == 0
    assert torch.equal(compiled(x, [Loud(), {"k": Loud()}]), x - 1)
    assert Loud.reprs == 0


def test_recompile_with_a_repr_that_raises() -> None:
    def f(x, o):
        return x * 2 if o is None else x * 3

    compiled = kiln.compile(f, backend="eager")
    x = torch.ones(2)
    assert torch.equal(compiled(x, None), x * 2)
    assert torch.equal(compiled(x, Broken()), x * 3)
    assert torch.equal(compiled(x, (Broken(),)), x * 3)


def test_short_names_values_without_their_python_repr() -> None:
    point = collections.namedtuple("point", "x y")
    assert _short(point(1, 2)) == "point(1, 2)"
    assert _short([1, "a", None]) == "[1, 'a', None]"
    assert _short({"k": (1,)}) == "{'k': (1,)}"
    assert _short(torch.float32) == "torch.float32"
    assert _short(Broken()).startswith("<") and "Broken object" in _short(Broken())
    assert "Settings object" in _short(Settings())
    assert _short([[[1]]]) == "[[<list of 1>]]"
    assert _short(list(range(100))) == "[0, 1, 2, 3, 4, 5, ...]"


def test_a_type_change_between_two_classes_of_one_name_says_so() -> None:
    # torch.nn.utils.parametrize gives each module its own ParametrizedConv1d: the message read
    # "changed type from torch.nn.ParametrizedConv1d to torch.nn.ParametrizedConv1d" (held-out Encodec)
    from kiln.capture.guards.kinds import type_change

    def make():
        class Box:
            k = 2
        return Box

    one, two = make(), make()
    text = type_change(one, two)
    assert text.startswith("from ") and "another class of the same name" in text
    assert f"{id(one):#x}" in text and f"{id(two):#x}" in text
    assert type_change(int, float) == "from int to float"

    def f(x, b):
        return x + b.k

    compiled = kiln.compile(f, backend="eager")
    x = torch.ones(2)
    assert torch.equal(compiled(x, one()), x + 2)
    assert torch.equal(compiled(x, two()), x + 2)
    assert "b changed type from" in entry.frames_of(compiled).last_failure
    assert "another class of the same name" in entry.frames_of(compiled).last_failure
