"""StopIteration.value of a generator stepped during capture (kiln/capture/variables/generator.py,
next() in kiln/capture/variables/builtin.py): the step that runs the body to its `return` raises
StopIteration carrying the returned value, through next() as through send(); a finished generator
stepped again stops with None, as eager's does (after a for loop, list(), or an earlier stop)."""
from __future__ import annotations

import torch

from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


def _two_then_return(x):
    yield x
    yield x * 2
    return "done"


def test_next_past_the_last_yield_carries_the_return_value() -> None:
    def f(x):
        g = _two_then_return(x)
        a, b = next(g), next(g)
        try:
            next(g)
        except StopIteration as stop:
            return a + b, stop.value, stop.args
    check_traced(f, fresh(X))


def test_only_the_first_stop_carries_the_value() -> None:
    def f(x):
        g = _two_then_return(x)
        out = []
        for _ in range(4):
            try:
                out.append(next(g))
            except StopIteration as stop:
                out.append(("stop", stop.value))
        return out
    check_traced(f, fresh(X))


def test_a_generator_drained_by_a_loop_or_list_stops_with_none() -> None:
    def f(x):
        g, h = _two_then_return(x), _two_then_return(x + 1)
        for _ in g:
            pass
        drained = list(h)
        values = []
        for gen in (g, h):
            try:
                next(gen)
            except StopIteration as stop:
                values.append(stop.value)
        return values, len(drained)
    check_traced(f, fresh(X))


def test_send_past_the_end_then_next() -> None:
    def f(x):
        g = _two_then_return(x)
        next(g)
        next(g)
        values = []
        try:
            g.send(None)
        except StopIteration as stop:
            values.append(stop.value)
        try:
            next(g)
        except StopIteration as stop:
            values.append(stop.value)
        return x + 1, values
    check_traced(f, fresh(X))
