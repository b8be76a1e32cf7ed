"""A value the frame read from outside keeps the value it had when read, after the frame writes there.

The glue replays the frame's writes (attributes, globals, container contents, cells) after the
graph; a value read before a write (`old = o.v; o.v = new; return old`, `o.v = stack.pop()`) must
be the old one, whether it is returned, stored by another write, or passed on at a graph break.
Compared with eager.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import kiln

sys.path.insert(0, str(Path(__file__).parent))
from semantics_oracle import check_calls  # noqa: E402


class Box:
    pass


A, B = Box(), Box()
HOLDER = Box()
CURRENT = A
STACK: list = []
TABLE: dict = {}


def reset_state() -> None:
    global CURRENT
    HOLDER.v = A
    HOLDER.w = None
    CURRENT = A
    STACK[:] = [A, B]
    TABLE.clear()
    TABLE["k"] = A


def attribute_swapped(x):
    old = HOLDER.v
    HOLDER.v = B
    return x * 2, old


def global_swapped(x):
    global CURRENT
    old = CURRENT
    CURRENT = B
    return x * 2, old


def popped_into_an_attribute(x):
    HOLDER.w = STACK.pop()
    HOLDER.v = TABLE.pop("k")
    return x + 1


def popped_and_returned(x):
    last = STACK.pop()
    first = STACK[0]
    STACK.clear()
    return x + 1, last, first


def written_then_other_written_from_it(x):
    HOLDER.w = HOLDER.v
    HOLDER.v = B
    return x + 1


def swapped_before_a_graph_break(x):
    old = HOLDER.v
    HOLDER.v = B
    print("a graph break")
    return x + 1, old


CASES = [attribute_swapped, global_swapped, popped_into_an_attribute, popped_and_returned,
         written_then_other_written_from_it, swapped_before_a_graph_break]


def _state():
    return (HOLDER.v, HOLDER.w, CURRENT, list(STACK), dict(TABLE))


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_values_read_before_the_frame_writes(fn, capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.ones(2)
    for _ in range(2):
        reset_state()
        want = fn(x)
        want_state = _state()
        reset_state()
        kiln.reset()
        got = kiln.compile(fn, backend="eager")(x)
        assert _state() == want_state
        if isinstance(want, tuple):
            assert torch.equal(got[0], want[0]) and all(g is w for g, w in zip(got[1:], want[1:]))
        else:
            assert torch.equal(got, want)
