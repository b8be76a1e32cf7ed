"""A generator the frame leaves paused inside a try/finally, an except block or a `with`: eager
closes it when the frame's locals are dropped at its return (its cleanup runs after the return
value was made), so capture runs that close in the trace (kiln/capture/variables/generator.py,
close_dropped_at_return) under fullgraph=True. One dropped earlier (a `for` iterator popped at a
`break`) closes where the trace cannot see: the frame still runs eagerly, with eager's effects."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln


def _paused_in_except(x):
    try:
        yield x
    except ValueError:
        yield x * 100


def throw_then_return(x):
    g = _paused_in_except(x)
    a = next(g)
    b = g.throw(ValueError("boom"))
    return a + b


def _cleanup_logs(log, x):
    try:
        yield x + 1
        yield x + 2
    finally:
        log.append("closed")


def left_paused_in_finally(x, log):
    g = _cleanup_logs(log, x)
    return next(g) * 2


def two_paused_closed_in_slot_order(x, log):
    first = _cleanup_logs(log, x)
    second = _cleanup_logs(log, x * 3)
    log.append("before")
    return next(second) + next(first)


def cleanup_changes_the_returned_list(x):
    mine = []
    g = _cleanup_logs(mine, x)
    return next(g), mine  # eager's caller sees "closed": the close runs after the tuple was made


def _with_manager(log, x):
    with torch.no_grad():
        log.append("enter")
        yield x * 2


def paused_inside_with(x, log):
    g = _with_manager(log, x)
    y = next(g)
    return y + 1, torch.is_grad_enabled()


CAPTURED = [throw_then_return, left_paused_in_finally, two_paused_closed_in_slot_order,
            cleanup_changes_the_returned_list, paused_inside_with]


def _args(fn, log):
    x = torch.arange(3.0)
    return (x,) if fn in (throw_then_return, cleanup_changes_the_returned_list) else (x, log)


def _run(fn, compiled):
    log: list = []
    return compiled(*_args(fn, log)), log


@pytest.mark.parametrize("fn", CAPTURED, ids=lambda f: f.__name__)
def test_close_at_return_is_traced_and_equals_eager(fn) -> None:
    kiln.reset()
    expected = _run(fn, fn)
    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    for _ in range(2):
        got = _run(fn, compiled)
        assert repr(got) == repr(expected)
    report = kiln.explain(fn)(*_args(fn, []))
    assert (report.graph_count, report.graph_break_count) == (1, 0)


def break_out_of_for(x, log):
    for v in _cleanup_logs(log, x):
        log.append("body")
        break
    log.append("after")  # eager closed the generator at the break: "closed" comes before this
    return v


def test_generator_dropped_at_a_break_runs_eagerly() -> None:
    kiln.reset()
    expected = _run(break_out_of_for, break_out_of_for)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _run(break_out_of_for, kiln.compile(break_out_of_for, backend="eager"))
    assert repr(got) == repr(expected)
    assert expected[1] == ["body", "closed", "after"]
