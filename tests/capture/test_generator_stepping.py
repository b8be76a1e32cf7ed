"""Generators during capture (kiln/capture/variables/generator.py): `yield from` (SEND) with its
return value, `send`, `throw` and `close` resuming the body where eager's would (every generator is
stepped one yield at a time), an endless generator stepped only as far as it is
consumed, an error the body reaches late raised where eager raises it; traced whole as
torch.compile traces them and equal to eager."""
from __future__ import annotations

import pytest
import torch

import kiln
from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


def _sub(items):
    yield from items
    return 7


def _chained(a, b):
    yield from a
    r = yield from _sub(b)
    yield r


def test_yield_from_two_sources_and_a_return_value() -> None:
    def f(x):
        return list(_chained([x, x + 1], (x * 2,)))
    check_traced(f, fresh(X))


def test_send_into_an_accumulator() -> None:
    def f(x):
        def accumulator():
            total = 0
            while True:
                value = yield total
                total += value
        acc = accumulator()
        next(acc)
        acc.send(2)
        final = acc.send(5)
        return x * final
    check_traced(f, fresh(X))


def test_send_through_yield_from() -> None:
    def inner():
        got = yield 1
        got2 = yield got * 10
        return got2

    def f(x):
        def outer():
            r = yield from inner()
            yield r + 100
        g = outer()
        a = next(g)
        b = g.send(2)
        c = g.send(3)
        return x + a + b + c
    check_traced(f, fresh(X))


def test_throw_caught_by_the_body_then_close() -> None:
    def f(x):
        def gen():
            try:
                yield 1
            except ValueError:
                yield 99
        g = gen()
        next(g)
        caught = g.throw(ValueError("into"))
        g.close()
        return x + caught
    check_traced(f, fresh(X))


def test_throw_not_caught_reaches_the_caller() -> None:
    def f(x):
        def gen():
            yield 1
            yield 2
        g = gen()
        next(g)
        try:
            g.throw(KeyError("k"))
        except KeyError:
            x = x + 5
        try:
            next(g)
        except StopIteration:
            x = x * 2
        return x
    check_traced(f, fresh(X), oracle=False)


def test_close_runs_finally_and_stop_after() -> None:
    def f(x):
        log = []

        def gen():
            try:
                yield 1
                yield 2
            finally:
                log.append("closed")
        g = gen()
        a = next(g)
        g.close()
        try:
            next(g)
        except StopIteration:
            a = a + 10
        return x + a, log
    check_traced(f, fresh(X), oracle=False)


def test_endless_generator_stepped_as_far_as_consumed() -> None:
    def f(x):
        def naturals():
            k = 0
            while True:
                yield k
                k += 1
        g = naturals()
        return x + next(g) + next(g) + next(g)
    check_traced(f, fresh(X))


def test_send_non_none_to_a_just_started_generator_raises_as_eager() -> None:
    def f(x):
        def gen():
            v = yield 1
            yield v
        g = gen()
        g.send(3)
        return x
    kiln.reset()
    with pytest.raises(TypeError, match="just-started"):
        kiln.compile(f, backend="eager")(X)


def test_zip_and_enumerate_over_an_endless_generator() -> None:
    def f(x):
        def naturals():
            k = 0
            while True:
                yield k
                k += 1
        g = naturals()
        next(g)
        pairs = list(zip(g, [x, x * 2]))
        return [k * v for k, v in pairs], next(g)
    check_traced(f, fresh(X))


def test_loop_leaving_a_generator_early_does_not_run_the_rest_of_its_body() -> None:
    # once run ahead to its end, the body logged "mid" and "end" that eager's never reaches (a wrong answer)
    def f(x):
        log = []

        def gen():
            log.append("start")
            yield x
            log.append("mid")
            yield x + 1
            log.append("end")
        out = []
        for v in gen():
            out.append(v)
            log.append("got")
            if len(out) == 1:
                break
        return out, log
    check_traced(f, fresh(X))


def test_first_item_by_next_then_the_generator_dropped() -> None:
    def f(x):
        seen = []

        def scaled():
            for k in (1, 2, 3):
                seen.append(k)
                yield x * k
        first = next(scaled())
        return first, seen
    check_traced(f, fresh(X))


def _raises_stop(x):
    yield x
    raise StopIteration(5)


def _exhausts_inner(x):
    yield x * 2
    next(iter([]))


def test_stopiteration_escaping_the_body_is_a_chained_runtime_error() -> None:
    # PEP 479, for an explicit raise and for a next() on an exhausted iterator inside the body
    def f(x):
        out = []
        for make in (_raises_stop, _exhausts_inner):
            try:
                out.append(list(make(x)))
            except RuntimeError as e:
                out.append((str(e), type(e.__cause__).__name__, e.__cause__.args, e.__context__ is e.__cause__,
                            e.__suppress_context__))
        return x + 1, out
    check_traced(f, fresh(X))
