"""Corpus: generators: generator functions consumed in the frame (list, for, next, zip, sum),
yield from, send, generators over tensors, generator expressions, early exit, and generators
passed in and returned.

Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import torch

from .program import Program, case, fn_program, t


def _count_up(n):
    for k in range(n):
        yield k


def _scaled(items, k):
    for v in items:
        yield v * k


def _chained(a, b):
    yield from a
    yield from b


@case("generators")
def generator_consumed_by_list():
    def f(x):
        return [x * k for k in _count_up(3)]
    return fn_program(f, (t(2),))


@case("generators")
def generator_over_tensors():
    def f(x, y):
        return sum(_scaled([x, y], 3))
    return fn_program(f, (t(2), t(2)))


@case("generators")
def generator_next_and_partial_consumption():
    def f(x):
        gen = _count_up(5)
        first = next(gen)
        second = next(gen)
        return x + first + second, list(gen)
    return fn_program(f, (t(2),))


@case("generators")
def yield_from_two_sources():
    def f(x):
        return list(_chained([x, x + 1], (x * 2,)))
    return fn_program(f, (t(2),))


@case("generators")
def generator_defined_in_frame():
    def f(x):
        def pairs():
            yield x, 1
            yield x + 1, 2
        return [a * b for a, b in pairs()]
    return fn_program(f, (t(2),))


@case("generators", fullgraph=False)
def generator_with_return_value_via_yield_from():
    def f(x):
        def inner():
            yield 1
            return 10

        def outer():
            result = yield from inner()
            yield result

        return x + sum(outer())
    return fn_program(f, (t(2),))


@case("generators")
def generator_send_values():
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
    return fn_program(f, (t(2),))


@case("generators")
def generator_zipped_with_list():
    def f(x):
        return [v * k for v, k in zip([x, x, x], _count_up(10))]
    return fn_program(f, (t(2),))


@case("generators")
def generator_early_break():
    def f(x):
        out = x
        for k in _count_up(100):
            if k > 3:
                break
            out = out + k
        return out
    return fn_program(f, (t(2),))


@case("generators")
def generator_expression_in_any_all():
    def f(x):
        sizes = [2, 4, 6]
        if all(s % 2 == 0 for s in sizes) and not any(s > 10 for s in sizes):
            return x * 2
        return x
    return fn_program(f, (t(2),))


@case("generators")
def generator_returned_from_frame():
    def f(x):
        return (x * k for k in range(3))

    def drive(compiled):
        return list(compiled(torch.ones(2)))
    return Program(f, drive=drive)


@case("generators", fullgraph=False)
def generator_input_consumed():
    def f(x, gen):
        return sum(gen) + x
    return fn_program(f, (t(2), (k for k in range(4))))


@case("generators")
def generator_with_try_finally():
    def f(x):
        log = []

        def gen():
            try:
                yield 1
                yield 2
            finally:
                log.append("closed")

        out = x
        for v in gen():
            out = out + v
        return out, log
    return fn_program(f, (t(2),))


@case("generators")
def generator_enumerate_and_dict():
    def f(x):
        table = dict(enumerate(_scaled([x, x + 1], 2)))
        return table[1], list(table)
    return fn_program(f, (t(2),))


@case("generators")
def generator_over_module_list():
    layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])

    def f(x):
        return torch.stack(list(layer(x) for layer in layers))
    return fn_program(f, (t(2),))


@case("generators")
def generator_map_filter_chain():
    def f(x):
        evens = filter(lambda k: k % 2 == 0, _count_up(6))
        scaled = map(lambda k: x * k, evens)
        return list(scaled)
    return fn_program(f, (t(2),))


@case("generators")
def generator_stops_with_stopiteration_caught():
    def f(x):
        gen = _count_up(1)
        next(gen)
        try:
            next(gen)
        except StopIteration:
            return x + 1
        return x
    return fn_program(f, (t(2),))


@case("generators")
def generator_tuple_and_unpack():
    def f(x):
        a, b, c = _scaled([x, x, x], 2)
        return a + b + c
    return fn_program(f, (t(2),))


@case("generators")
def generator_close_and_throw():
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
    return fn_program(f, (t(2),))


def _raises_stop(x):
    yield x
    raise StopIteration


@case("generators")
def stopiteration_in_generator_body_is_runtime_error():
    # PEP 479: the StopIteration becomes RuntimeError("generator raised StopIteration")
    def f(x):
        out = []
        for make in (_raises_stop, _raises_stop):
            try:
                out.append(list(make(x)))
            except RuntimeError as e:
                out.append(type(e).__name__)
        return x + 1, out

    return fn_program(f, (t(2),))


@case("generators")
def generator_paused_in_except_block_closed_at_return():
    # eager closes g when the frame drops its locals: GeneratorExit at the yield in the handler
    def gen(x):
        try:
            yield x
        except ValueError:
            yield x * 100

    def f(x):
        g = gen(x)
        a = next(g)
        b = g.throw(ValueError("boom"))
        return a, b
    return fn_program(f, (t(2),))
