"""A set's iteration order is its hash table's: an element removed in the frame leaves a dummy slot
(and set.pop moves a finger) that later adds see, and a copy of the table does not keep. A set made
in the frame and handed out (returned, or live across a graph break) is rebuilt by its element
operations, and the next frame (after a break) that gets one rebuilt this way replays it again for its own
shadow (a copy would drop the dummies); a set from outside that the frame changed gets the same
operations replayed on it
(kiln/capture/variables/sets.py: log, replay), so what the caller adds afterwards lands where
eager's would. Eager is the oracle (values and the order of every set, also after the call)."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln


def removed_then_returned(x):
    s = {8, 16, 24, 1}
    s.discard(8)
    return x + len(s), s


def popped_then_returned(x):
    s = {3, 11, 19, 27, 5}
    s.pop()
    s.pop()
    s.add(35)
    return x + len(s), s


def removed_across_a_break(x):
    s = {8, 16, 24, 1}
    s.discard(8)
    print("break")
    s.add(32)
    return x + 1, list(s), s


def removed_from_the_callers_set(x, s):
    s.discard(8)
    s.remove(24)
    s.add(40)
    return x + len(s)


CASES = [removed_then_returned, popped_then_returned, removed_across_a_break]


def _after(result):
    """What the caller sees of the returned set after adding to it."""
    s = result[-1]
    s.add(32)
    s.add(48)
    return [*result[:-1], list(s)]


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_a_returned_set_keeps_eagers_table(fn, capsys) -> None:
    kiln.reset()
    x = torch.ones(2)
    expected = _after(fn(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the frame is compiled
        compiled = kiln.compile(fn, backend="eager", fullgraph=fn is not removed_across_a_break)
        for _ in range(2):
            assert repr(_after(compiled(x))) == repr(expected)


def test_the_callers_set_gets_the_same_operations() -> None:
    kiln.reset()
    x = torch.ones(2)
    mine = {8, 16, 24, 1}
    expected = removed_from_the_callers_set(x, mine)
    mine.add(32)
    compiled = kiln.compile(removed_from_the_callers_set, backend="eager", fullgraph=True)
    theirs = {8, 16, 24, 1}
    got = compiled(x, theirs)
    theirs.add(32)
    torch.testing.assert_close(got, expected)
    assert list(theirs) == list(mine)
