"""Cells shared between a frame and its inner functions stay shared across graph breaks.

An inner function made before a break and the code after the break (a resume function) must see
one cell: a variable rebound after the break (`one = lambda: 2`, `k = 3`, a `nonlocal` counter) is
read with its new value by the inner function, and a write by the inner function is read by the
frame, as in eager. Each case runs under kiln.compile(backend="eager") against eager, and the
graph count is checked against the real torch.compile where it matters.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import kiln

sys.path.insert(0, str(Path(__file__).parent))
from semantics_oracle import check_calls  # noqa: E402

def brk(tag: str = "") -> None:
    print(tag, end="")  # a graph break


def rebound_after_break_in_the_inner_function(x):
    one = lambda: 1  # noqa: E731
    def inner(y):
        brk()
        return y + one()
    a = inner(x)
    one = lambda: 2  # noqa: E731
    return inner(a)


def rebound_after_a_break_in_the_frame(x):
    k = 1
    get = lambda: k  # noqa: E731
    brk()
    k = 5
    return x * get()


def argument_cell_rebound(x, k):
    get = lambda: k  # noqa: E731
    y = x + get()
    brk()
    k = k * 3
    return y + get()


def unbound_at_the_break(x):
    def read():
        return later
    brk()
    later = 7
    return x * read()


def nonlocal_counter_across_breaks(x):
    count = 0
    def bump():
        nonlocal count
        count += 1
        brk()
    bump()
    y = x + count
    bump()
    return y + count, count


def inner_writes_frame_reads(x):
    seen = []
    total = 0
    def add(v):
        nonlocal total
        total = total + v
        seen.append(v)
    add(1)
    brk()
    add(2)
    brk()
    return x + total, len(seen)


def two_inner_functions_one_cell(x):
    scale = 2
    def get():
        return scale
    def put(v):
        nonlocal scale
        scale = v
    brk()
    put(4)
    brk()
    return x * get()


def cells_in_a_loop_with_a_break(x):
    total = 0
    def add(v):
        nonlocal total
        total += v
    for i in range(3):
        add(i)
        brk()
    return x + total


class Base(torch.nn.Module):
    def scaled(self, h):
        return h * 2


class WithSelfCell(Base):
    def forward(self, h):
        offset = lambda: self.bias  # noqa: E731 - `self` is a cell variable
        brk()
        self.bias = 3.0
        return super().scaled(h) + offset()


CASES = [
    (rebound_after_break_in_the_inner_function, lambda: (torch.ones(2),)),
    (rebound_after_a_break_in_the_frame, lambda: (torch.ones(2),)),
    (argument_cell_rebound, lambda: (torch.ones(2), 2)),
    (unbound_at_the_break, lambda: (torch.ones(2),)),
    (nonlocal_counter_across_breaks, lambda: (torch.ones(2),)),
    (inner_writes_frame_reads, lambda: (torch.ones(2),)),
    (two_inner_functions_one_cell, lambda: (torch.ones(2),)),
    (cells_in_a_loop_with_a_break, lambda: (torch.ones(2),)),
]


@pytest.mark.parametrize("fn, make", CASES, ids=[c[0].__name__ for c in CASES])
def test_cells_shared_across_breaks(fn, make, capsys: pytest.CaptureFixture[str]) -> None:
    check_calls(fn, [make(), make(), make()])


def test_self_cell_with_zero_argument_super_across_a_break(capsys: pytest.CaptureFixture[str]) -> None:
    eager_mod, compiled_mod = WithSelfCell(), WithSelfCell()
    eager_mod.bias = compiled_mod.bias = 1.0
    kiln.reset()
    compiled = kiln.compile(compiled_mod, backend="eager")
    h = torch.ones(2)
    for _ in range(2):
        torch.testing.assert_close(compiled(h), eager_mod(h))


def test_issue_example_graph_count_matches_torch(capsys: pytest.CaptureFixture[str]) -> None:
    """Sharing the cell costs no extra graph: as many as the real torch.compile makes."""
    kiln.reset()
    x = torch.ones(2)
    explained = kiln.explain(rebound_after_a_break_in_the_frame)(x)
    oracle = torch._dynamo.explain(rebound_after_a_break_in_the_frame)(x)
    assert explained.graph_count <= oracle.graph_count


def _counter():
    n = 0

    def bump(x):
        nonlocal n
        n += 1
        return x + n
    return bump


bump = _counter()


def one_closure_called_twice(x):
    return bump(x) + bump(x)


def test_one_cell_reached_by_two_calls_sees_the_first_write() -> None:
    """A function with a nonlocal counter called twice in one frame: the second call reads what the
    first wrote (one CellVariable per real cell), before and after eager moved the counter on."""
    x = torch.ones(2)
    kiln.reset()
    compiled = kiln.compile(one_closure_called_twice, backend="eager")
    for _ in range(3):
        before = bump.__closure__[0].cell_contents
        want = x + before + 1 + x + before + 2
        torch.testing.assert_close(compiled(x), want)
        assert bump.__closure__[0].cell_contents == before + 2


def _pair():
    n = 0

    def bump():
        nonlocal n
        n += 1

    def read():
        return n
    return bump, read


class Holder:
    """Two functions reached through two attributes: their cell is one object or two."""

    def __init__(self, bump, read) -> None:
        self.bump, self.read = bump, read


def bump_then_read(x, holder):
    holder.bump()
    return x + holder.read()


def test_one_cell_reached_through_two_paths_is_guarded_as_one() -> None:
    """The trace relied on `holder.bump` and `holder.read` sharing a cell (the read sees the bump):
    a holder whose two functions close over different cells must not run that code."""
    x = torch.ones(2)
    kiln.reset()
    compiled = kiln.compile(bump_then_read, backend="eager")
    bump, read = _pair()
    torch.testing.assert_close(compiled(x, Holder(bump, read)), x + 1)
    torch.testing.assert_close(compiled(x, Holder(bump, read)), x + 2)
    other_bump, _ = _pair()
    _, other_read = _pair()  # each starts at 0: the read does not see the bump
    torch.testing.assert_close(compiled(x, Holder(other_bump, other_read)), x + 0)
    assert other_bump.__closure__[0].cell_contents == 1
