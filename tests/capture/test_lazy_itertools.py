"""itertools iterators made on demand (kiln/capture/variables/lazy_itertools.py): count, cycle, tee,
islice over a shared iterator, and zip/map/enumerate over them, traced whole as torch.compile traces
them (fullgraph=True) and equal to eager; a counter kept across calls or a graph break keeps eager's
state."""
from __future__ import annotations

import itertools

import torch

import kiln
from trace_oracle import check_traced, fresh
from semantics_oracle import check_calls

X = torch.arange(4.0)


def _x() -> tuple:
    return (X.clone(),)


def test_islice_leaves_the_rest_of_a_shared_iterator() -> None:
    # the old rule read the whole iterator: list(it) came back empty (a wrong answer)
    def f(x):
        it = iter([x, x + 1, x + 2, x + 3])
        head = list(itertools.islice(it, 2))
        return head, list(it)
    check_traced(f, _x)


def test_islice_with_start_stop_step_then_next_on_the_source() -> None:
    def f(x):
        it = iter([x, x * 2, x * 3, x * 4, x * 5, x * 6])
        picked = itertools.islice(it, 1, 5, 2)
        first = next(picked)
        after = next(it)  # islice read up to index 1 only
        return first, after, list(picked), list(it)
    check_traced(f, _x)


def test_islice_of_a_list_and_of_a_range() -> None:
    def f(x):
        return list(itertools.islice([x, x + 1, x + 2, x + 3], 1, None, 2)), x + sum(itertools.islice(range(10), 3, 6))
    check_traced(f, _x)


def test_count_under_islice_and_zip() -> None:
    def f(x):
        firsts = list(itertools.islice(itertools.count(5, 2), 3))
        out = x
        for i, v in zip(itertools.count(1), [x, x * 2]):
            out = out + i * v
        return out + sum(firsts), firsts
    check_traced(f, _x)


def test_count_of_floats_stepped_by_next() -> None:
    def f(x):
        c = itertools.count(0.5, 0.25)
        a, b = next(c), next(c)
        return x * a + b, next(c)
    check_traced(f, _x)


def test_count_stopped_by_a_break_in_the_loop() -> None:
    def f(x):
        for i in itertools.count(start=1):
            x = x * 2
            if i >= 3:
                break
        return x
    check_traced(f, _x)


def test_cycle_with_zip_and_enumerate() -> None:
    def f(x):
        signs = itertools.cycle([1, -1])
        scaled = [v * s for v, s in zip([x, x, x], signs)]
        letters = [(i, c) for i, c in enumerate(itertools.islice(itertools.cycle("ab"), 5))]
        return scaled, letters
    check_traced(f, _x)


def test_cycle_of_an_iterator_reads_it_once() -> None:
    def f(x):
        it = iter([x, x + 1])
        c = itertools.cycle(it)
        return [next(c) for _ in range(5)], list(it)
    check_traced(f, _x)


def test_cycle_of_nothing_ends() -> None:
    def f(x):
        return x + len(list(itertools.cycle([])))
    check_traced(f, _x)


def test_tee_two_and_three_copies() -> None:
    def f(x):
        a, b = itertools.tee(iter([x, x + 1]))
        p, q, r = itertools.tee([x * 2, x * 3, x * 4], 3)
        first = next(p)
        return sum(a), list(b)[1], first, list(q), list(zip(p, r))
    check_traced(f, _x)


def test_map_over_count_and_an_islice() -> None:
    def f(x):
        return list(map(lambda k, v: v * k, itertools.count(2), itertools.islice(iter([x, x + 1, x + 2]), 2)))
    check_traced(f, _x)


def test_zip_over_lazy_filter_reads_the_predicate_as_eager() -> None:
    seen = []

    def f(x):
        seen.clear()
        kept = itertools.filterfalse(lambda k: seen.append(k) or k % 2, range(10))
        return x + sum(a * b for a, b in zip(kept, [1, 2])), list(seen)
    check_traced(f, _x, oracle=False)


COUNTER = itertools.count()


def test_global_counter_keeps_its_state_across_calls() -> None:
    def f(x):
        return x + next(COUNTER)
    global COUNTER
    COUNTER = itertools.count()
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    got = [compiled(torch.zeros(1)).item() for _ in range(3)]
    assert got == [0.0, 1.0, 2.0]
    assert next(COUNTER) == 3


def test_count_made_in_the_frame_survives_a_graph_break() -> None:
    def f(x):
        c = itertools.count(3, 2)
        a = next(c)
        torch._dynamo.graph_break()
        return x + a + next(c), c
    kiln.reset()
    got, counter = kiln.compile(f, backend="eager")(torch.zeros(1))
    assert got.item() == 8.0 and next(counter) == 7
    check_calls(lambda x: f(x)[0], [(torch.zeros(1),), (torch.ones(1),)])


def test_iter_of_a_callable_and_a_sentinel_calls_it_as_read() -> None:
    # iter(fn, sentinel): fn runs once per item read, the sentinel is not yielded, then it is spent
    def f(x):
        stack = [3, 2, 1, 0, 5]
        calls = []

        def pop():
            calls.append(len(stack))
            return stack.pop()
        it = iter(pop, 1)
        first = next(it)
        rest = list(it)
        return x + first, rest, list(it), stack, calls
    check_traced(f, _x)


def test_zip_strict_of_unequal_lengths_raises_after_the_full_rows() -> None:
    # eager's ValueError comes when the row past the shortest is asked for: the loop body ran first
    def f(x):
        seen = []
        try:
            for a, b in zip([1, 2, 3], (x, x * 2), strict=True):
                seen.append(b * a)
        except ValueError as e:
            seen.append(str(e))
        return seen
    check_traced(f, _x)
