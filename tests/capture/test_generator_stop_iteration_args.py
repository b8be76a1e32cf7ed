"""The StopIteration a generator stepped during capture raises at its end is the one CPython makes
(kiln/capture/variables/generator.py): a body that returns None (falls off its end, a bare
`return`) raises StopIteration() with empty args; one that returns a value v raises
StopIteration(v), v a tensor too; a finished generator stepped again raises StopIteration()."""
from __future__ import annotations

import torch

from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


def _falls_off_the_end(x):
    yield x


def _bare_return(x):
    yield x
    return


def _returns(value):
    yield 1
    return value


def _stop_of(gen):
    try:
        next(gen)
    except StopIteration as stop:
        return stop.args, stop.value, str(stop)
    return "no stop"


def test_a_body_that_returns_none_stops_with_empty_args() -> None:
    def f(x):
        g, h = _falls_off_the_end(x), _bare_return(x)
        next(g)
        next(h)
        return x + 1, _stop_of(g), _stop_of(h)
    check_traced(f, fresh(X))


def test_a_finished_generator_stepped_again_stops_with_empty_args() -> None:
    def f(x):
        g = _returns("done")
        next(g)
        first = _stop_of(g)
        return x + 1, first, _stop_of(g), _stop_of(g)
    check_traced(f, fresh(X))


def test_send_past_the_end_stops_with_empty_args() -> None:
    def f(x):
        g = _falls_off_the_end(x)
        next(g)
        try:
            g.send(None)
        except StopIteration as stop:
            return x + 1, stop.args
    check_traced(f, fresh(X))


def test_a_returned_tensor_is_the_stop_value() -> None:
    def f(x):
        g = _returns(x * 2)
        next(g)
        try:
            next(g)
        except StopIteration as stop:
            return stop.value + 1, len(stop.args)
    check_traced(f, fresh(X), oracle=False)  # torch.compile breaks on it


def test_a_returned_none_tuple_and_tensor_tuple() -> None:
    def f(x):
        a, b = _returns((1, None)), _returns((x, 2))
        next(a)
        next(b)
        try:
            next(b)
        except StopIteration as stop:
            t = stop.value[0] * 2
        return x + 1, _stop_of(a), t
    check_traced(f, fresh(X), oracle=False)
