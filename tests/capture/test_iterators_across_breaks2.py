"""Iterators that live across a graph break, compared with eager (values, containers, raised errors).

A resumed frame must see eager's iterator state over the live container: enumerate / zip / reversed
over a list the loop body mutates after the break, dict views whose values change, dicts, sets,
OrderedDicts and deques whose size or layout changes during iteration (eager's RuntimeError, its
own text), iterators held in locals across a break, nested loops that both break, and the type
names of held iterators. A plain loop of each kind compiles its body once, not once per position.
"""
from __future__ import annotations

import collections
from typing import Any, Callable

import pytest
import torch

import kiln
from eager_compare import outcome, same_outcome
from torch_oracle import torch_graph_count

gb = torch._dynamo.graph_break


def check(fn: Callable[..., Any], *args: Any) -> None:
    """One call eager and one compiled (the default backend) on a fresh `torch.zeros(2)` and `args`."""
    kiln.reset()
    want = outcome(fn, torch.zeros(2), *args)
    got = outcome(kiln.compile(fn), torch.zeros(2), *args)
    assert same_outcome(got, want, text=True), (got, want)


# ------------------------------------------------------------------ enumerate over a mutated list

def enum_append(x):
    l = [1, 2]
    for i, v in enumerate(l):
        x = x + v * i
        gb()
        if len(l) < 4:
            l.append(v * 10)
    return x, l


def enum_pop(x):
    l = [1, 2, 3, 4, 5]
    for i, v in enumerate(l):
        x = x * 2 + v + i
        gb()
        l.pop()
    return x, l


def enum_insert(x):
    l = [1, 2, 3]
    for i, v in enumerate(l):
        x = x * 2 + v + i
        gb()
        if i == 0:
            l.insert(0, 7)
    return x, l


def enum_setitem(x):
    l = [1, 2, 3]
    for i, v in enumerate(l):
        x = x * 2 + v + i
        gb()
        if i + 1 < len(l):
            l[i + 1] = 100
    return x, l


def enum_extend_start(x):
    l = [1, 2]
    for i, v in enumerate(l, 5):
        x = x * 2 + v + i
        gb()
        if len(l) < 4:
            l.extend([v, v])
    return x, l


def enum_breaks_every_third(x):
    # several steps of the enumerate inside one resumed trace (its count traced past the break)
    l = list(range(7))
    for i, v in enumerate(l, 3):
        x = x + i * v
        if i % 3 == 0:
            gb()
            if len(l) < 9:
                l.append(i)
    return x, l


@pytest.mark.parametrize("fn", [enum_append, enum_pop, enum_insert, enum_setitem, enum_extend_start,
                                enum_breaks_every_third])
def test_enumerate_over_a_list_mutated_after_the_break(fn):
    check(fn)


# ------------------------------------------------------------------ zip

def zip_append(x):
    l, m = [1, 2], [3, 4, 5, 6]
    for a, b in zip(l, m):
        x = x * 2 + a + b
        gb()
        if len(l) < 4:
            l.append(a * 10)
    return x, l


def zip_pop_second(x):
    l, m = [1, 2, 3], [3, 4, 5, 6]
    for a, b in zip(l, m):
        x = x * 2 + a + b
        gb()
        m.pop()
    return x, l, m


def zip_three_columns(x):
    a, b, c = [1, 2, 3], [4, 5, 6], [7, 8, 9]
    for p, q, r in zip(a, b, c):
        x = x * 2 + p * q - r
        gb()
        c.pop()
    return x, c


def zip_tuple_and_list(x):
    l, t = [1, 2], (5, 6, 7, 8)
    for a, b in zip(t, l):
        x = x * 2 + a + b
        gb()
        if len(l) < 4:
            l.append(a)
    return x, l


def zip_of_enumerate(x):
    l, m = [1, 2], [5, 6, 7]
    for (i, a), b in zip(enumerate(l), m):
        x = x * 2 + a + b + i
        gb()
        if len(l) < 3:
            l.append(3)
    return x, l


def enumerate_of_zip(x):
    l, m = [1, 2], [3, 4, 5]
    for i, (a, b) in enumerate(zip(l, m)):
        x = x * 2 + i + a * b
        gb()
        if len(l) < 3:
            l.append(7)
    return x, l


@pytest.mark.parametrize("fn", [zip_append, zip_pop_second, zip_three_columns, zip_tuple_and_list,
                                zip_of_enumerate, enumerate_of_zip])
def test_zip_over_lists_mutated_after_the_break(fn):
    check(fn)


# ------------------------------------------------------------------ reversed

def reversed_setitem(x):
    l = [1, 2, 3, 4]
    for v in reversed(l):
        x = x * 2 + v
        gb()
        l[0] = 50
    return x, l


def reversed_pop_front(x):
    l = [1, 2, 3, 4]
    for v in reversed(l):
        x = x * 2 + v
        gb()
        if len(l) > 2:
            l.pop(0)
    return x, l


def reversed_held_then_set(x):
    l = [1, 2, 3]
    it = reversed(l)
    a = next(it)
    gb()
    l[0] = 9
    return x + a, list(it)


def reversed_exhausted_stays_exhausted(x):
    l = [1, 2]
    it = reversed(l)
    out = list(it)
    gb()
    l.append(3)
    return x, out, list(it)


@pytest.mark.parametrize("fn", [reversed_setitem, reversed_pop_front, reversed_held_then_set,
                                reversed_exhausted_stays_exhausted])
def test_reversed_list_across_the_break(fn):
    check(fn)


# ------------------------------------------------------------------ dict views read live

def items_later_value_set(x):
    d = {"a": 1, "b": 2, "c": 3}
    for k, v in d.items():
        x = x * 2 + v
        gb()
        d["c"] = 30
    return x, d


def values_next_value_set(x):
    d = {"a": 1, "b": 2, "c": 3}
    keys = list(d)
    for i, v in enumerate(d.values()):
        x = x * 2 + v
        gb()
        if i + 1 < len(keys):
            d[keys[i + 1]] = 100
    return x, d


def ordered_dict_value_set(x):
    d = collections.OrderedDict(a=1, b=2, c=3)
    for k, v in d.items():
        x = x * 2 + v
        gb()
        d["c"] = 30
    return x, dict(d)


def nested_dict_of_lists(x):
    d = {"a": [1, 2], "b": [3]}
    for k, vs in d.items():
        for i, v in enumerate(vs):
            x = x * 2 + v + i
            gb()
            if len(vs) < 3:
                vs.append(v + 1)
    return x, d


@pytest.mark.parametrize("fn", [items_later_value_set, values_next_value_set, ordered_dict_value_set,
                                nested_dict_of_lists])
def test_dict_views_see_values_set_after_the_break(fn):
    check(fn)


# ------------------------------------------------------------------ size changed during iteration

def dict_items_grown(x):
    d = {"a": 1, "b": 2}
    for k, v in d.items():
        x = x * 2 + v
        gb()
        d[k + k] = 5
    return x, d


def dict_keys_grown(x):
    d = {"a": 1, "b": 2}
    for k in d:
        x = x * 2 + d[k]
        gb()
        d[k + k] = 5
    return x, d


def dict_shrunk(x):
    d = {"a": 1, "b": 2, "c": 3}
    for k in d:
        x = x * 2 + d[k]
        gb()
        del d["c"]
    return x, d


def dict_values_popped(x):
    d = {"a": 1, "b": 2, "c": 3}
    for v in d.values():
        x = x * 2 + v
        gb()
        d.pop("c", None)
    return x, d


def dict_grown_without_a_break(x):
    d = {"a": 1, "b": 2}
    for k in d.keys():
        x = x * 2 + d[k]
        d[k + k] = 5
    return x, d


def enumerate_over_a_grown_dict(x):
    d = {"a": 1, "b": 2}
    for i, k in enumerate(d):
        x = x * 2 + d[k] + i
        gb()
        d["c" + k] = 1
    return x, d


def dict_held_iterator_grown(x):
    d = {"a": 1, "b": 2}
    it = iter(d)
    next(it)
    gb()
    d["c"] = 3
    return x, list(it)


def dict_grown_then_caught(x):
    d = {"a": 1, "b": 2}
    it = iter(d.items())
    out = [next(it)]
    gb()
    d["z"] = 0
    try:
        out.append(next(it))
    except RuntimeError as e:
        out.append(str(e))
    return x, out


def set_grown(x):
    s = {1, 2}
    for v in s:
        x = x * 2 + v
        gb()
        s.add(v + 10)
    return x, s


def set_grown_without_a_break(x):
    s = {1, 2}
    for v in s:
        x = x * 2 + v
        s.add(v + 10)
    return x, s


def ordered_dict_grown(x):
    d = collections.OrderedDict(a=1, b=2)
    for k in d:
        x = x * 2 + d[k]
        gb()
        d["z" + k] = 3
    return x, dict(d)


def ordered_dict_key_added_and_removed(x):
    d = collections.OrderedDict(a=1, b=2)
    for k in d:
        x = x * 2 + d[k]
        d["z"] = 1
        del d["z"]
    return x, dict(d)


def ordered_dict_moved(x):
    d = collections.OrderedDict(a=1, b=2, c=3)
    for k, v in d.items():
        x = x * 2 + v
        gb()
        d.move_to_end("a")
    return x, dict(d)


def deque_appended(x):
    q = collections.deque([1, 2, 3])
    for v in q:
        x = x * 2 + v
        gb()
        q.append(1)
    return x


def deque_appended_without_a_break(x):
    q = collections.deque([1, 2, 3])
    for v in q:
        x = x * 2 + v
        if v == 2:
            q.append(1)
    return x


def deque_changed_before_the_break(x):
    q = collections.deque([1, 2, 3])
    it = iter(q)
    a = next(it)
    q.append(5)
    gb()
    return x + a, list(it)


def deque_exhausted_then_appended(x):
    q = collections.deque([1])
    it = iter(q)
    out = list(it)
    gb()
    q.append(2)
    for _ in range(2):
        try:
            out.append(next(it))
        except (RuntimeError, StopIteration) as e:
            out.append(f"{type(e).__name__}: {e}")
    return x, out


@pytest.mark.parametrize("fn", [dict_items_grown, dict_keys_grown, dict_shrunk, dict_values_popped,
                                dict_grown_without_a_break, enumerate_over_a_grown_dict, dict_held_iterator_grown,
                                dict_grown_then_caught, set_grown, set_grown_without_a_break, ordered_dict_grown,
                                ordered_dict_key_added_and_removed, ordered_dict_moved, deque_appended,
                                deque_appended_without_a_break, deque_changed_before_the_break,
                                deque_exhausted_then_appended])
def test_a_container_changed_during_iteration_raises_as_eager(fn):
    check(fn)


# ------------------------------------------------------------------ what must not raise

def dict_key_added_and_removed(x):
    d = {"a": 1, "b": 2}
    for k in d:
        x = x * 2 + d[k]
        gb()
        d["z"] = 1
        del d["z"]
    return x, d


def deque_item_replaced(x):
    q = collections.deque([1, 2, 3])
    for v in q:
        x = x * 2 + v
        gb()
        q[-1] = 9
    return x, list(q)


def list_appended_in_a_for_loop(x):
    l = [1, 2]
    for v in l:
        x = x * 2 + v
        gb()
        if len(l) < 5:
            l.append(v + 1)
    return x, l


@pytest.mark.parametrize("fn", [dict_key_added_and_removed, deque_item_replaced, list_appended_in_a_for_loop])
def test_changes_eager_allows_do_not_raise(fn):
    check(fn)


# ------------------------------------------------------------------ iterators held in locals

def list_iterator_exhausted_stays_exhausted(x):
    l = [1]
    it = iter(l)
    for v in it:
        x = x + v
    gb()
    l.append(2)
    return x, list(it)


def held_enumerate(x):
    l = [1, 2, 3]
    it = enumerate(l)
    a = next(it)
    gb()
    l.append(4)
    return x + a[1], list(it)


def held_zip(x):
    l, m = [1, 2, 3], [4, 5, 6, 7]
    it = zip(l, m)
    a = next(it)
    gb()
    l.append(4)
    return x + a[1], list(it)


def held_zip_loses_an_item(x):
    l, m = [1, 2, 3], [4]
    it = iter(l)
    for a, b in zip(it, m):
        x = x + a * b
        gb()
    return x, list(it)


def held_deque_iterator(x):
    q = collections.deque([1, 2, 3])
    it = iter(q)
    a = next(it)
    gb()
    b = next(it)
    q.append(5)
    return x + a + b, list(q)


def held_iterator_type_names(x):
    l, d, q = [1, 2], {"a": 1}, collections.deque([1])
    its = [iter(l), reversed(l), enumerate(l), zip(l, l), iter(d), iter(d.items()), iter(d.values()),
           iter(q), iter({1})]
    gb()
    return x, [type(i).__name__ for i in its]


def held_list_iterator_type_name(x):
    l = [1, 2, 3]
    it = iter(l)
    next(it)
    gb()
    return x, type(it).__name__


@pytest.mark.parametrize("fn", [list_iterator_exhausted_stays_exhausted, held_enumerate, held_zip,
                                held_zip_loses_an_item, held_deque_iterator, held_iterator_type_names,
                                held_list_iterator_type_name])
def test_iterators_held_in_locals(fn):
    check(fn)


# ------------------------------------------------------------------ loop control after the resume

def nested_enumerates_both_break(x):
    outer = [1, 2]
    for i, a in enumerate(outer):
        gb()
        inner = [a, a + 1]
        for j, b in enumerate(inner):
            x = x * 2 + a * b + i + j
            gb()
            if len(inner) < 3:
                inner.append(b)
        if len(outer) < 3:
            outer.append(7)
    return x, outer


def enumerate_continue_break_else(x):
    l = [1, 2, 3]
    i = -1
    for i, v in enumerate(l):
        x = x + v
        gb()
        if v == 2:
            l.append(9)
            continue
        if v == 9:
            break
    else:
        x = x - 1
    return x, l, i


def zip_else_after_the_break(x):
    l, m = [1, 2], [3, 4, 5]
    for a, b in zip(l, m):
        x = x + a * b
        gb()
        if len(l) < 3:
            l.append(6)
    else:
        x = x * 10
    return x, l


@pytest.mark.parametrize("fn", [nested_enumerates_both_break, enumerate_continue_break_else,
                                zip_else_after_the_break])
def test_loop_control_after_the_resume(fn):
    check(fn)


# ------------------------------------------------------------------ graph counts

def _enumerate_loop(x, xs):
    for i, t in enumerate(xs):
        x = x + t * i
        print(end="")
    return x


def _zip_loop(x, xs):
    for a, b in zip(xs, xs):
        x = x + a * b
        gb()
    return x


def _reversed_loop(x, xs):
    for a in reversed(xs):
        x = x + a
        gb()
    return x


def _items_loop(x, xs):
    d = {i: t for i, t in enumerate(xs)}
    for k, v in d.items():
        x = x + v
        gb()
    return x


@pytest.mark.parametrize("fn", [_enumerate_loop, _zip_loop, _reversed_loop, _items_loop])
def test_an_unmutated_loop_compiles_its_body_once_not_per_position(fn):
    counts = []
    for n in (6, 12):
        xs = [torch.full((2,), float(i)) for i in range(n)]
        kiln.reset()
        backend = kiln.backends.CountingBackend()
        compiled = kiln.compile(fn, backend=backend)
        torch.testing.assert_close(compiled(torch.zeros(2), xs), fn(torch.zeros(2), xs))
        stats = kiln.stats()
        assert stats["fallbacks"] == 0, stats
        counts.append((stats["compiles"], backend.frame_count))
    assert counts[0] == counts[1] and counts[0][0] <= 4, counts


def test_held_iterator_graph_count_matches_torch_compile():
    def held(x, xs):
        it = iter(xs)
        x = x + next(it)
        gb()
        x = x + next(it)
        gb()
        return x + next(it)

    xs = [torch.full((2,), float(i)) for i in range(4)]
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(held, backend=backend)
    torch.testing.assert_close(compiled(torch.zeros(2), xs), held(torch.zeros(2), xs))
    assert kiln.stats()["compiles"] == torch_graph_count(held, [(torch.zeros(2), xs)]) == 3
