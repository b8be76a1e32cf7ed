"""Sets made in the frame whose elements' class writes __hash__ and __eq__ in Python (a user key
class, a frozen dataclass): each element found or added as CPython's set does, by the traced
__hash__ (its table: eager's iteration order, also with colliding hashes) and __eq__
(kiln/capture/variables/sets.py, user_hashed_keys.py). torch.compile gives wrong answers on most
of these (it hashes such objects by identity); Kiln must give eager's, in one graph under
fullgraph=True, and a set operation it does not follow (equal elements that are different objects
on both sides) must run eagerly with eager's result."""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import kiln


class Mod4:
    """Equal by value, hashed by value % 4: values 1, 5, 9 collide (the table probes)."""

    def __init__(self, v):
        self.v = v

    def __hash__(self):
        return self.v % 4

    def __eq__(self, other):
        return isinstance(other, Mod4) and other.v == self.v


@dataclasses.dataclass(frozen=True)
class Spec:
    layer: int
    kind: str = "mlp"


def literal_with_duplicates(x):
    s = {Mod4(1), Mod4(2), Mod4(1), Mod4(5)}
    return x + len(s), Mod4(5) in s, Mod4(6) in s, [e.v for e in s]


def add_discard_remove(x):
    s = set()
    for v in (9, 1, 5, 2, 1, 13):
        s.add(Mod4(v))
    s.discard(Mod4(5))
    s.discard(Mod4(100))
    s.remove(Mod4(9))
    s.add(Mod4(17))  # probes past the slot 5 left
    try:
        s.remove(Mod4(42))
    except KeyError:
        x = x * 2
    return x + len(s), [e.v for e in s]


def from_input_list_and_comprehension(x, specs):
    uniq = set(specs)
    layers = {Spec(s.layer) for s in specs}
    return x * len(uniq) + len(layers), Spec(1) in uniq, Spec(3) in uniq, sorted(s.layer for s in layers)


def pop_in_table_order(x):
    s = {Mod4(6), Mod4(3), Mod4(2)}
    first = s.pop()
    return x + first.v, [e.v for e in s]


def union_of_the_same_objects(x):
    a, b, c = Mod4(1), Mod4(2), Mod4(3)
    left, right = {a, b}, {b, c}
    both = left | right
    left.update(right)
    only = left - {c}
    return x + len(both), sorted(e.v for e in both), [e.v for e in left], sorted(e.v for e in only)


CAPTURED = [literal_with_duplicates, add_discard_remove, from_input_list_and_comprehension, pop_in_table_order,
            union_of_the_same_objects]


def _args(fn):
    x = torch.arange(3.0)
    if fn is from_input_list_and_comprehension:
        return x, [Spec(1), Spec(2, "attn"), Spec(1), Spec(2)]
    return (x,)


@pytest.mark.parametrize("fn", CAPTURED, ids=lambda f: f.__name__)
def test_values_equal_eager_in_one_graph(fn) -> None:
    kiln.reset()
    expected = fn(*_args(fn))
    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    for _ in range(2):
        assert repr(compiled(*_args(fn))) == repr(expected)
    report = kiln.explain(fn)(*_args(fn))
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def union_of_equal_strangers(x):
    left = {Mod4(1), Mod4(2)}
    right = {Mod4(2), Mod4(3)}  # Mod4(2) equals left's, another object: eager keeps left's
    both = left | right
    return x + len(both), sorted(e.v for e in both), [id(e) in {id(k) for k in left} for e in both]


def test_operation_between_equal_strangers_runs_eagerly() -> None:
    kiln.reset()
    expected = union_of_equal_strangers(torch.arange(3.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = kiln.compile(union_of_equal_strangers, backend="eager")(torch.arange(3.0))
    assert repr(got) == repr(expected)
