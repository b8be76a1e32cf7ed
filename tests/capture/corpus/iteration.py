"""Corpus: itertools, iter/next, range, enumerate/zip/map/filter/reversed as iterators.

Iterators made in the frame are consumed partly, passed to other iterators and to builtins;
itertools' combinators (product, chain, chain.from_iterable, zip_longest, accumulate, islice,
count, repeat, groupby, permutations, combinations, pairwise, starmap, tee) over tensors and
constants. Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import itertools

import torch

from .program import Program, case, fn_program, t


@case("itertools")
def itertools_product_of_tensors_and_ints():
    def f(x, y):
        out = x * 0
        for v, k in itertools.product([x, y], [1, 2]):
            out = out + v * k
        return out
    return fn_program(f, (t(2), t(2)))


@case("itertools")
def itertools_product_repeat():
    def f(x):
        combos = list(itertools.product((0, 1), repeat=2))
        return x + len(combos), combos
    return fn_program(f, (t(2),))


@case("itertools")
def itertools_chain_mixed():
    def f(x, y):
        out = x
        for v in itertools.chain([x, y], (1, 2)):
            out = out + v
        return out
    return fn_program(f, (t(2), t(2)))


@case("itertools")
def itertools_chain_from_iterable():
    def f(x, y):
        nested = [[x, y], [x * 2], []]
        flat = list(itertools.chain.from_iterable(nested))
        return len(flat), sum(flat)
    return fn_program(f, (t(2), t(2)))


@case("itertools")
def itertools_zip_longest_fillvalue():
    def f(x):
        rows = list(itertools.zip_longest([1, 2, 3], "ab", fillvalue=None))
        return x + len(rows), rows
    return fn_program(f, (t(2),))


@case("itertools")
def itertools_zip_longest_tensors():
    def f(x, y):
        out = []
        for a, b in itertools.zip_longest([x, y, x], [y], fillvalue=x * 0):
            out.append(a + b)
        return out
    return fn_program(f, (t(2), t(2)))


@case("itertools")
def itertools_accumulate_running_sum():
    def f(x):
        sums = list(itertools.accumulate([x, x + 1, x + 2]))
        products = list(itertools.accumulate([1, 2, 3, 4], lambda a, b: a * b))
        return sums[-1], products
    return fn_program(f, (t(2),))


@case("itertools")
def itertools_islice_and_count():
    def f(x):
        firsts = list(itertools.islice(itertools.count(5, 2), 3))
        window = list(itertools.islice([x, x + 1, x + 2, x + 3], 1, None, 2))
        return x + sum(firsts), window
    return fn_program(f, (t(2),))


@case("itertools")
def itertools_repeat_and_starmap():
    def f(x):
        parts = list(itertools.repeat(x, 3))
        pairs = list(itertools.starmap(lambda a, b: a * b, [(x, 2), (x, 3)]))
        return torch.cat(parts), pairs
    return fn_program(f, (t(2),))


@case("itertools")
def itertools_repeat_without_times_beside_finite_columns():
    # repeat(obj) has no end: map and zip stop at the finite column beside it; a count, and a
    # negative one (no items), too. (`times=` as a keyword: tests/capture/test_itertools_repeat.py,
    # torch.compile never ends tracing it, so it has no oracle here)
    def f(x):
        scaled = list(map(torch.mul, [x, x + 1, x + 2], itertools.repeat(3)))
        tagged = list(zip(itertools.repeat("a"), [x, x * 2]))
        return scaled, tagged, list(itertools.repeat(x, 2)), list(itertools.repeat(1, -2))
    return fn_program(f, (t(2),))


@case("itertools")
def itertools_combinations_and_permutations():
    def f(x):
        combos = list(itertools.combinations((1, 2, 3, 4), 2))
        perms = list(itertools.permutations("abc", 2))
        return [torch.ones(c) for c in combos[:2]], len(perms), x + len(combos)
    return fn_program(f, (t(2),))


@case("itertools")
def itertools_groupby_constants():
    def f(x):
        runs = [(k, len(list(g))) for k, g in itertools.groupby("aabccc")]
        return x * len(runs), runs
    return fn_program(f, (t(2),))


@case("itertools")
def itertools_pairwise_over_tensors():
    def f(x, y, z):
        return [b - a for a, b in itertools.pairwise([x, y, z])]
    return fn_program(f, (t(2), t(2), t(2)))


@case("itertools")
def itertools_tee_two_passes():
    def f(x):
        a, b = itertools.tee(iter([x, x + 1]))
        return sum(a), list(b)[1]
    return fn_program(f, (t(2),))


@case("itertools")
def itertools_filterfalse_and_takewhile():
    def f(x):
        odd = list(itertools.filterfalse(lambda k: k % 2 == 0, range(7)))
        small = list(itertools.takewhile(lambda k: k < 4, range(10)))
        dropped = list(itertools.dropwhile(lambda k: k < 8, range(10)))
        return x + len(odd), small, dropped
    return fn_program(f, (t(2),))


@case("itertools")
def itertools_cycle_with_zip():
    def f(x):
        signs = itertools.cycle([1, -1])
        return [v * s for v, s in zip([x, x, x], signs)]
    return fn_program(f, (t(2),))


@case("itertools")
def itertools_compress():
    def f(x, y):
        kept = list(itertools.compress([x, y, x + y], [True, False, True]))
        return kept
    return fn_program(f, (t(2), t(2)))


@case("iteration")
def iter_and_next_with_default():
    def f(x):
        it = iter([x, x + 1])
        a = next(it)
        b = next(it)
        c = next(it, None)
        return a + b, c is None
    return fn_program(f, (t(2),))


@case("iteration")
def next_on_exhausted_raises_stopiteration():
    def f(x):
        it = iter([x])
        next(it)
        try:
            next(it)
        except StopIteration:
            return x * 2
        return x
    return fn_program(f, (t(2),))


@case("iteration")
def iterator_consumed_across_loops():
    def f(x):
        it = iter(range(6))
        firsts = []
        for v in it:
            firsts.append(v)
            if v == 2:
                break
        rest = list(it)
        return x + sum(firsts), rest
    return fn_program(f, (t(2),))


@case("iteration")
def iter_over_tensor_rows():
    def f(x):
        it = iter(x)
        first = next(it)
        return first + next(it)
    return fn_program(f, (t(3, 2),))


@case("iteration")
def enumerate_with_start_and_zip_strict_lengths():
    def f(x, y):
        out = []
        for i, (a, b) in enumerate(zip([x, y], [y, x]), start=1):
            out.append(a * i - b)
        return out
    return fn_program(f, (t(2), t(2)))


@case("iteration")
def map_with_two_iterables():
    def f(x, y):
        return list(map(torch.add, [x, y], [y, y])), list(map(str, [1, 2]))
    return fn_program(f, (t(2), t(2)))


@case("iteration")
def filter_with_none_and_function():
    def f(x):
        truthy = list(filter(None, [0, 1, "", "a", None, 2]))
        big = list(filter(lambda k: k > 1, [0, 1, 2, 3]))
        return x + len(truthy), big
    return fn_program(f, (t(2),))


@case("iteration")
def range_properties_and_slicing():
    def f(x):
        r = range(2, 20, 3)
        return x + len(r), r[1], list(r[1:4]), r.start, r.stop, r.step, 8 in r, r.index(11)
    return fn_program(f, (t(2),))


@case("iteration")
def range_from_tensor_size():
    def f(x):
        out = x[0] * 0
        for i in range(x.size(0)):
            out = out + x[i] * i
        return out
    return fn_program(f, (t(4, 2),))


@case("iteration")
def reversed_range_and_list():
    def f(x):
        order = list(reversed(range(3)))
        return [x * k for k in reversed(order)], order
    return fn_program(f, (t(2),))


@case("iteration")
def zip_unequal_stops_at_shortest():
    def f(x):
        pairs = list(zip([x, x + 1, x + 2], "ab"))
        return len(pairs), pairs[-1][1]
    return fn_program(f, (t(2),))


@case("iteration")
def zip_star_transposes():
    def f(x, y):
        rows = [(x, 1), (y, 2)]
        tensors, numbers = zip(*rows)
        return torch.stack(tensors), numbers
    return fn_program(f, (t(2), t(2)))


@case("iteration")
def user_iterator_class():
    class Countdown:
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return self

        def __next__(self):
            if self.n <= 0:
                raise StopIteration
            self.n -= 1
            return self.n

    def f(x):
        return [x * k for k in Countdown(3)]
    return fn_program(f, (t(2),))


class Countdown:
    """An iterator object (its `__iter__` returns itself) whose state is read after the loop."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n <= 0:
            raise StopIteration
        self.n -= 1
        return self.n


@case("iteration")
def user_iterator_stopped_early_keeps_its_state():
    def f(x, c):
        out = x
        for k in c:
            out = out + k
            if k == 3:
                break
        return out
    c = Countdown(6)
    return Program(f, ((t(2), c), (t(2), c)), observe=lambda: c.n)


@case("iteration")
def user_iterator_stepped_by_next_then_drained():
    def f(x, c):
        it = iter(c)
        first = next(it)
        return x + first, list(it), next(it, -1)
    c = Countdown(4)
    return Program(f, ((t(2), c),), observe=lambda: c.n)


@case("iteration")
def user_iterable_returns_separate_cursor():
    class Cursor:
        def __init__(self, items):
            self.items, self.at = items, 0

        def __next__(self):
            if self.at >= len(self.items):
                raise StopIteration
            self.at += 1
            return self.items[self.at - 1]

    class Bag:
        def __init__(self, items):
            self.items = items

        def __iter__(self):
            return Cursor(self.items)

    def f(x):
        bag = Bag([1, 2, 3])
        return [x * k for k in bag] + [sum(bag)]
    return fn_program(f, (t(2),))


@case("iteration")
def user_iterator_raises_other_error_caught():
    class Flaky:
        def __init__(self):
            self.n = 0

        def __iter__(self):
            return self

        def __next__(self):
            self.n += 1
            if self.n == 3:
                raise ValueError("broken")
            return self.n

    def f(x):
        seen = []
        try:
            for k in Flaky():
                seen.append(x * k)
        except ValueError as err:
            return seen, str(err)
        return seen, ""
    return fn_program(f, (t(2),))


@case("iteration", fullgraph=False)
def user_iterator_graph_break_inside_loop():
    def f(x, c):
        out = x
        for k in c:
            out = out + k
            torch._dynamo.graph_break()
            out = out * 2
        return out
    c = Countdown(3)
    return Program(f, ((t(2), c),), observe=lambda: c.n)


@case("iteration")
def user_iterable_with_getitem():
    class Seq:
        def __init__(self, items):
            self.items = items

        def __getitem__(self, i):
            return self.items[i]

        def __len__(self):
            return len(self.items)

    def f(x):
        s = Seq([x, x * 2])
        return [v + 1 for v in s], len(s)
    return fn_program(f, (t(2),))


class Squares:
    """The old iteration protocol: `__getitem__` and no `__iter__`, ended by IndexError."""

    def __init__(self, n):
        self.n, self.reads = n, 0

    def __getitem__(self, i):
        self.reads += 1
        if i >= self.n:
            raise IndexError(i)
        return i * i


@case("iteration")
def getitem_iteration_stopped_early():
    def f(x, sq):
        out = x
        for v in sq:
            if v > 4:
                break
            out = out + v
        return out, 9 in sq
    sq = Squares(6)
    return Program(f, ((t(2), sq),), observe=lambda: sq.reads)


@case("iteration", fullgraph=False)
def getitem_iteration_graph_break_inside_loop():
    def f(x, sq):
        out = x
        for v in sq:
            out = out + v
            torch._dynamo.graph_break()
        return out
    sq = Squares(3)
    return Program(f, ((t(2), sq),), observe=lambda: sq.reads)


@case("iteration")
def class_with_iter_none_is_not_iterable():
    class Opaque:
        __iter__ = None

        def __getitem__(self, i):
            return i

    def f(x):
        try:
            iter(Opaque())
        except TypeError:
            return x + 1
        return x
    return fn_program(f, (t(2),))


@case("iteration")
def while_loop_with_counter_and_break_continue():
    def f(x):
        k = 0
        out = x
        while True:
            k += 1
            if k % 2 == 0:
                continue
            out = out * 2
            if k > 5:
                break
        return out, k
    return fn_program(f, (t(2),))


@case("iteration")
def for_else_runs_without_break():
    def f(x):
        for k in range(3):
            if k == 10:
                break
        else:
            x = x + 100
        for k in range(3):
            if k == 1:
                break
        else:
            x = x - 1000
        return x
    return fn_program(f, (t(2),))


@case("itertools")
def itertools_predicate_runs_only_as_far_as_consumed():
    def f(x, seen):
        def is_small(k):
            seen.append(k)
            return k < 3

        first_big = next(itertools.filterfalse(is_small, range(10)))
        kept = itertools.takewhile(is_small, [0, 1, 5, 2])
        return x + first_big, list(kept)
    seen = []
    return Program(f, ((t(2), seen),), observe=lambda: list(seen))


@case("itertools")
def itertools_starmap_and_compress_over_tensors():
    def f(x, y):
        scaled = itertools.starmap(torch.mul, [(x, 2), (y, 3)])
        kept = itertools.compress([x, y, x * y], (s > 1 for s in [2, 0, 5]))
        return list(scaled), list(kept), list(itertools.permutations([x, y]))[1][0]
    return fn_program(f, (t(2), t(2)))


@case("itertools")
def itertools_groupby_with_key_and_combinations_with_replacement():
    def f(x):
        words = ["apple", "avocado", "banana", "blueberry", "cherry"]
        firsts = [(k, len(list(g))) for k, g in itertools.groupby(words, key=lambda w: w[0])]
        pairs = list(itertools.combinations_with_replacement((1, 2), 2))
        return x * len(firsts), firsts, pairs
    return fn_program(f, (t(2),))
