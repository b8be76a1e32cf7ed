"""Dicts from outside the frame keyed by objects whose class writes __hash__/__eq__ in Python (a
user key class, a frozen dataclass), read and written in the frame: looked up as CPython does (the
same object first, then keys of an equal hash compared with ==), with __hash__ and __eq__ traced so
that what they read is guarded. torch.compile captures reads with the key object itself and `in`
with a new equal key; Kiln captures those and also reads and updates through a new equal key,
and leaves adding a new user-hashed key to a break. Oracles: eager (values, the dict after each
call, which key objects it holds) and torch._dynamo.explain (graph and break counts)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import pytest
import torch

import kiln


class Key:
    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return isinstance(other, Key) and other.name == self.name


@dataclasses.dataclass(frozen=True)
class Spec:
    layer: int
    kind: str


K1, K2 = Key("a"), Key("b")
TABLE: dict = {}
SPECS: dict = {}
LOOKUP = Key("a")


def _reset() -> None:
    TABLE.clear()
    TABLE.update({K1: 2.0, K2: 3.0, "plain": 5.0})
    SPECS.clear()
    SPECS.update({Spec(0, "attn"): 0.5, Spec(1, "mlp"): 1.5})
    LOOKUP.name = "a"


def read_with_the_key_itself(x):
    return x * TABLE[K1]


def contains_new_equal_key(x):
    return x + (1 if Key("b") in TABLE else 0) + (1 if Key("z") in TABLE else 0)


def read_with_new_equal_key(x):
    return x * TABLE[Key("a")] + TABLE["plain"]


def get_with_default(x):
    return x * TABLE.get(Key("zz"), 7.0) + TABLE.get(Key("b"), 0.0)


def update_through_equal_key(x):
    TABLE[Key("a")] = TABLE[K1] + 1  # the dict keeps K1 as its key
    return x * TABLE[K1]


def frozen_dataclass_keys(x):
    return x * SPECS[Spec(1, "mlp")] + (Spec(2, "mlp") in SPECS)


def lookup_key_from_outside(x):
    return x * TABLE[LOOKUP]


def add_new_user_key(x):
    TABLE[Key("c")] = 4.0  # torch.compile runs this frame eagerly; Kiln breaks here
    return x + 1


PROGRAMS = [read_with_the_key_itself, contains_new_equal_key, read_with_new_equal_key, get_with_default,
            update_through_equal_key, frozen_dataclass_keys, lookup_key_from_outside, add_new_user_key]
CAPTURED_BY_TORCH = {read_with_the_key_itself, contains_new_equal_key}


def _state() -> tuple:
    return ([(type(k).__name__, k if isinstance(k, str) else id(k), v) for k, v in TABLE.items()],
            [(k, v) for k, v in SPECS.items()])


def _run(fn: Callable[..., Any], n: int = 3) -> tuple[list, list]:
    outs, states = [], []
    for i in range(n):
        outs.append(fn(torch.full((2,), float(i))))
        states.append(_state())
    return outs, states


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_values_and_the_dict_are_eagers(fn):
    _reset()
    expected, expected_states = _run(fn)
    _reset()
    kiln.reset()
    got, states = _run(kiln.compile(fn))
    assert states[:1] == expected_states[:1] or fn is add_new_user_key
    assert [[(t, v) for t, _, v in s[0]] for s in states] == [[(t, v) for t, _, v in s[0]] for s in expected_states]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    if fn is update_through_equal_key:
        assert next(iter(TABLE)) is K1  # the original key object stays


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_graph_counts_against_torch_compile(fn):
    _reset()
    torch._dynamo.reset()
    real = torch._dynamo.explain(fn)(torch.ones(2))
    _reset()
    kiln.reset()
    ours = kiln.explain(fn)(torch.ones(2))
    _reset()
    if fn is add_new_user_key:
        assert any("user-hashed key" in b.reason for b in ours.break_reasons)
        return
    assert (ours.graph_count, ours.graph_break_count, ours.break_reasons) == (1, 0, [])
    if fn in CAPTURED_BY_TORCH:
        assert (real.graph_count, real.graph_break_count) == (1, 0)


def test_a_changed_lookup_key_recompiles():
    """The traced __hash__ read LOOKUP.name: guarded, so a new name is a new lookup."""
    _reset()
    kiln.reset()
    compiled = kiln.compile(lookup_key_from_outside)
    first = compiled(torch.ones(2))
    LOOKUP.name = "b"
    second = compiled(torch.ones(2))
    torch.testing.assert_close(first, torch.full((2,), 2.0))
    torch.testing.assert_close(second, torch.full((2,), 3.0))
    _reset()
