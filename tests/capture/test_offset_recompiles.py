"""Views at different storage offsets: a frame that reads `x.storage_offset()` (of an input, or of a
view it made of one) recompiles once, then reads the offset as a symbolic int, as torch.compile does
(it passes the number across a graph break, and automatic dynamic makes the changed int a symbol);
Kiln used to guard the offset's value and capture once per offset. A frame that never reads the
offset is not guarded on it at all. Values equal eager's on every backend, including extern calls
(mm, addmm, bmm, conv, embedding, index_select) on offset views, in-place updates of offset
views of inputs and outputs that alias inputs."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import kiln
from eager_compare import dynamo_graphs, outcome, same_outcome

BUF = torch.arange(48.0) / 4 - 3


def _compare(fn: Callable[..., Any], make_calls: Callable[[], list[tuple]], backend: str = "eager") -> int:
    """Each call eager then compiled, on fresh arguments: the same value (or exception type) and the
    arguments left the same; returns Kiln's graph count."""
    kiln.reset()
    counter = kiln.backends.CountingBackend(kiln.backends.lookup(backend))
    compiled = kiln.compile(fn, backend=counter)
    for want_args, got_args in zip(make_calls(), make_calls()):
        want = outcome(fn, *want_args)
        got = outcome(compiled, *got_args)
        assert same_outcome(got, want, text=False), (got, want)
        assert all(torch.equal(a, b) for a, b in zip(got_args, want_args) if isinstance(a, torch.Tensor))
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["graph_breaks"] == 0, kiln.stats()
    return counter.frame_count


def _torch_count(fn: Callable[..., Any], make_calls: Callable[[], list[tuple]]) -> int:
    def run(compiled: Callable[..., Any]) -> None:
        for args in make_calls():
            outcome(compiled, *args)
    return dynamo_graphs(fn, run)


def _scaled_by_offset(x):
    return x * x.storage_offset()


def _offset_of_a_view(x):
    y = x[1:]
    return y * y.storage_offset() + x.storage_offset()


def _offset_of_a_column(x):
    return x.t()[1].storage_offset() * x


def _offset_in_a_size(x):
    return x.new_ones(x.storage_offset() % 3 + 1).sum() * x


def _slices() -> list[tuple]:
    return [(BUF[i:i + 5],) for i in range(7)]


def _tiles() -> list[tuple]:
    grid = BUF.reshape(6, 8)
    return [(grid[i % 3:i % 3 + 2, i:i + 3],) for i in range(6)]


OFFSET_READERS = {
    "scaled_by_offset": (_scaled_by_offset, _slices),
    "offset_of_a_view": (_offset_of_a_view, _slices),
    "offset_of_a_column": (_offset_of_a_column, _tiles),
    "offset_in_a_size": (_offset_in_a_size, _slices),
}


@pytest.mark.parametrize("name", sorted(OFFSET_READERS))
def test_offset_read_recompiles_once(name):
    fn, calls = OFFSET_READERS[name]
    # torch.compile makes 2 to 4 graphs here (the graph break at the read splits the frame)
    assert _compare(fn, calls) == 2 <= _torch_count(fn, calls)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
@pytest.mark.parametrize("name", sorted(OFFSET_READERS))
def test_offset_read_lowered(name, backend):
    fn, calls = OFFSET_READERS[name]
    assert _compare(fn, calls, backend) <= 2


def test_slices_of_one_buffer_as_two_inputs():
    def fn(x, y):
        return x * x.storage_offset() + y
    calls = lambda: [(BUF[i:i + 5], BUF[:5]) for i in range(7)]  # noqa: E731
    assert _compare(fn, calls, "aot_eager") == _torch_count(fn, calls)


# Extern calls and in-place updates on views at several offsets: one graph, eager's values.
_MAT = torch.arange(120.0).reshape(30, 4) / 16
_W = torch.arange(12.0).reshape(4, 3) / 8
_B3 = torch.arange(400.0).reshape(25, 4, 4) / 64
_EMB = torch.arange(180.0).reshape(60, 3) / 8
_IDX = torch.tensor([0, 2, 1, 4])
_IMG = torch.arange(2560.0).reshape(20, 2, 8, 8) / 256
_KER = torch.arange(54.0).reshape(3, 2, 3, 3) / 32


def _inplace(x):
    x.mul_(2).add_(1)
    return x


EXTERNS = {
    "mm": (lambda x, w: x @ w, lambda: [(_MAT[i:i + 5], _W) for i in range(5)]),
    "addmm": (lambda x, w: torch.addmm(x[0, :3], x, w), lambda: [(_MAT[i:i + 4], _W) for i in range(5)]),
    "bmm": (lambda a, b: torch.bmm(a, b), lambda: [(_B3[i:i + 2], _B3[i + 3:i + 5]) for i in range(5)]),
    "embedding_index_select": (lambda w, ix: torch.nn.functional.embedding(ix, w) + torch.index_select(w, 0, ix),
                               lambda: [(_EMB[i:i + 10], _IDX) for i in range(5)]),
    "conv": (lambda x, w: torch.nn.functional.conv2d(x, w), lambda: [(_IMG[i:i + 1], _KER) for i in range(5)]),
    "inplace_offset_view": (_inplace, lambda: [(BUF.clone()[i:i + 5],) for i in range(5)]),
    "alias_output": (lambda x: (x[1:], x * 2), lambda: [(BUF[i:i + 5],) for i in range(5)]),
}


@pytest.mark.cpp
@pytest.mark.parametrize("name", sorted(EXTERNS))
def test_externs_on_offset_views(name):
    fn, calls = EXTERNS[name]
    assert _compare(fn, calls, "inductor") == 1

