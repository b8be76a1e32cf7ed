"""Graph breaks in loops and data-dependent `while` loops: no more graphs or compiles than
torch.compile.

The oracle is the real torch.compile with a counting backend: its number of graphs and its
successfully compiled frames (torch._dynamo.utils.counters["frames"]["ok"]). Kiln's are the
graphs its counting backend receives and the captures that produced a graph (observed through
kiln.capture.entry's observers). Each program runs on inputs that take different paths, and its
results must equal eager's.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import kiln
from kiln.capture import entry


def helper_printing(x, i):
    if i == 1:
        print("tick")
    return x * 2 + i


def loop_over_a_printing_helper(x):
    for i in range(3):
        x = helper_printing(x, i)
    return x.sum()


def helper_branching(x, i):
    if x.sum() > 0:  # a data-dependent branch inside the helper
        return x - i
    return x + i


def loop_over_a_branching_helper(x):
    for i in range(4):
        x = helper_branching(x, i)
    return x


def while_on_a_tensor_with_a_counter(x):
    n = 0
    while x.sum() > 0:
        x = x - 1
        n += 1
    return x, n


def while_on_any(x):
    while (x > 0).any():
        x = x - 1.5
    return x * 2


CASES = {
    loop_over_a_printing_helper: [torch.tensor([0.5, -1.0, 2.0]), torch.tensor([3.0, 1.0, -4.0])],
    loop_over_a_branching_helper: [torch.tensor([0.5, -1.0, 0.2]), torch.tensor([3.0, 4.0, 2.0])],
    while_on_a_tensor_with_a_counter: [torch.full((3,), 2.0), torch.full((3,), 4.0)],
    while_on_any: [torch.full((3,), 2.0), torch.full((3,), 5.0)],
}


class _Counting:
    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def _torch_compile_counts(fn, inputs) -> tuple[int, int]:
    torch._dynamo.reset()
    counters.clear()
    backend = _Counting()
    compiled = torch.compile(fn, backend=backend)
    for x in inputs:
        compiled(x.clone())
    return backend.graphs, counters["frames"]["ok"]


def _kiln_counts(fn, inputs) -> tuple[int, int]:
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    with_graph = []
    observer = with_graph.append
    entry.add_observer(observer)
    try:
        for x in inputs:
            got = compiled(x.clone())
            expected = fn(x.clone())
            torch.testing.assert_close(got, expected)
    finally:
        entry.remove_observer(observer)
    assert kiln.stats()["fallbacks"] == 0
    captures = sum(1 for event in with_graph if event.result is not None and event.result.graphs)
    return backend.frame_count, captures


@pytest.mark.parametrize("fn", list(CASES), ids=lambda f: f.__name__)
def test_no_more_graphs_or_compiles_than_torch_compile(fn, capsys) -> None:
    dynamo_graphs, dynamo_frames = _torch_compile_counts(fn, CASES[fn])
    kiln_graphs, kiln_captures = _kiln_counts(fn, CASES[fn])
    assert kiln_graphs <= dynamo_graphs, (kiln_graphs, dynamo_graphs)
    assert kiln_captures <= dynamo_frames, (kiln_captures, dynamo_frames)


def test_a_dynamic_int_stays_symbolic_at_zero_and_one() -> None:
    def f(x, i):
        return x + i

    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(f, backend=backend)
    x = torch.randn(3)
    for i in [2, 3, 0, 1, 5]:
        torch.testing.assert_close(compiled(x, i), x + i)
    assert backend.frame_count == 2  # static 2, then one symbolic graph for every other value


def test_both_branches_of_a_break_share_what_became_dynamic() -> None:
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(helper_branching, backend=backend)
    for x, i in [(torch.ones(2), 0), (torch.ones(2), 1), (-torch.ones(2), 2), (-torch.ones(2), 3)]:
        torch.testing.assert_close(compiled(x, i), helper_branching(x, i))
    # the test's graph, `x - i` static then dynamic, `x + i` already dynamic
    assert backend.frame_count == 4
