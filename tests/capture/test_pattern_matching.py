"""`match` / `case` inside a compiled function: traced in one graph (fullgraph=True), each case
chosen as eager chooses it, and a call whose subject takes another case recompiles instead of
reusing the first case's graph."""
from __future__ import annotations

import collections
import dataclasses
import enum

import pytest
import torch

import kiln
from torch._dynamo.testing import CompileCounter


@dataclasses.dataclass
class Add:
    k: int


@dataclasses.dataclass
class Mul:
    k: int
    extra: int = 0


class Point:
    __match_args__ = ("x", "y")

    def __init__(self, x, y):
        self.x, self.y = x, y


class Color(enum.Enum):
    RED = 1
    BLUE = 2


def sequences(x, spec):
    match spec:
        case ("scale", k):
            return x * k
        case ("shift", k, *rest):
            return x + k + len(rest)
        case [first, *_] if first == "neg":
            return -x
        case []:
            return x * 0
        case _:
            return x


def mappings(x, cfg):
    match cfg:
        case {"mode": "scale", "k": k}:
            return x * k
        case {"mode": "shift", **rest}:
            return x + rest.get("k", 1)
        case {}:
            return x - 1


def classes(x, op):
    match op:
        case Add(k=k):
            return x + k
        case Mul(k, extra=0):
            return x * k
        case Mul(k, e):
            return x * k + e
        case Point(px, py):
            return x * px + py
        case int(n):
            return x + n
        case str() as s:
            return x + len(s)
        case _:
            return x


def values(x, c):
    match c:
        case Color.RED:
            return x + 1
        case Color.BLUE | None:
            return x + 2


def tensors_in_containers(pair):
    match pair:
        case (a, b):
            return a + b
        case {"a": a}:
            return a * 2
        case torch.Tensor():
            return pair - 1


CALLS = [
    (sequences, [("scale", 2), ("shift", 3), ("shift", 3, 9, 9), ["neg", 1], [], ("other",), "scale"]),
    (mappings, [{"mode": "scale", "k": 4}, {"mode": "shift", "k": 5, "z": 0}, {"mode": "shift"}, {"mode": "x"},
                collections.OrderedDict(mode="scale", k=2)]),
    (classes, [Add(2), Mul(3), Mul(3, 4), Point(2, 5), 7, "abc", 2.5, True]),
    (values, [Color.RED, Color.BLUE, None]),
]


@pytest.mark.parametrize("fn,subjects", CALLS, ids=[fn.__name__ for fn, _ in CALLS])
def test_each_case_as_eager_in_one_graph(fn, subjects):
    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    x = torch.randn(3)
    for subject in subjects:
        expected = fn(x, subject)
        got = compiled(x, subject)
        if expected is None:
            assert got is None, subject
        else:
            torch.testing.assert_close(got, expected, msg=lambda m: f"{subject!r}: {m}")


def test_tensor_subjects_and_tensor_captures():
    compiled = kiln.compile(tensors_in_containers, backend="eager", fullgraph=True)
    a, b = torch.randn(3), torch.randn(3)
    for subject in [(a, b), {"a": a}, a, [a, b]]:
        torch.testing.assert_close(compiled(subject), tensors_in_containers(subject))


def test_a_new_case_recompiles_and_graph_count_matches_torch():
    kiln.reset()
    compiled = kiln.compile(sequences, backend="eager")
    x = torch.randn(3)
    for spec in [("scale", 2), ("scale", 2), ("shift", 1)]:
        torch.testing.assert_close(compiled(x, spec), sequences(x, spec))
    stats = kiln.stats()
    assert stats["graph_breaks"] == 0
    torch._dynamo.reset()
    counter = CompileCounter()
    oracle = torch.compile(sequences, backend=counter)
    for spec in [("scale", 2), ("scale", 2), ("shift", 1)]:
        oracle(x, spec)
    assert stats["graphs"] == counter.frame_count


def test_attribute_changed_between_calls_is_seen():
    compiled = kiln.compile(classes, backend="eager", fullgraph=True)
    x = torch.randn(3)
    p = Point(1, 2)
    torch.testing.assert_close(compiled(x, p), classes(x, p))
    p.y = 10
    torch.testing.assert_close(compiled(x, p), classes(x, p))
    del p.y  # the positional sub-pattern now fails: the wildcard case
    torch.testing.assert_close(compiled(x, p), classes(x, p))


def test_malformed_class_pattern_raises_eagers_type_error():
    class NoArgs:
        pass

    def f(x, o):
        match o:
            case NoArgs(a):
                return x + a
        return x

    compiled = kiln.compile(f, backend="eager")
    with pytest.raises(TypeError, match="accepts 0 positional sub-patterns"):
        compiled(torch.randn(2), NoArgs())
