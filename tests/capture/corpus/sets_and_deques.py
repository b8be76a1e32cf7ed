"""Corpus: set, frozenset and collections.deque, made in the frame, passed in and held globally.

Sets of constants answer membership, algebra and len at trace time; sets of tensors hold them by
identity; a global set or deque that changes between calls must not leave a stale answer (its
length and contents are guarded). Each runs under fullgraph=True unless it says otherwise.
"""
from __future__ import annotations

import collections

import torch

from .program import Program, case, fn_program, t

SEEN = {"a", "b"}
WINDOW = collections.deque([1, 2, 3], maxlen=3)


@case("sets")
def set_of_constants_algebra():
    def f(x):
        a = {1, 2, 3}
        b = {2, 3, 4}
        return x + len(a & b), sorted(a | b), sorted(a - b), sorted(a ^ b)
    return fn_program(f, (t(2),))


@case("sets")
def set_methods_add_discard_update():
    def f(x):
        s = set()
        s.add(3)
        s.add(3)
        s.update([4, 5], (6,))
        s.discard(5)
        s.discard(99)
        s.remove(4)
        return x * len(s), sorted(s), 6 in s
    return fn_program(f, (t(2),))


@case("sets")
def set_comparisons_subset_superset():
    def f(x):
        small, big = {1, 2}, {1, 2, 3}
        out = x
        if small <= big and small.issubset(big) and big.issuperset(small):
            out = out + 1
        if small < big and not big < small and small.isdisjoint({7}):
            out = out * 2
        return out
    return fn_program(f, (t(2),))


@case("sets")
def set_pop_and_copy():
    def f(x):
        s = {7}
        c = s.copy()
        item = s.pop()
        return x + item, len(s), len(c)
    return fn_program(f, (t(2),))


@case("sets")
def set_intersection_update_and_difference_update():
    def f(x):
        s = {1, 2, 3, 4}
        s.intersection_update({2, 3, 4, 5})
        s.difference_update([4])
        s.symmetric_difference_update({3, 9})
        return x * sum(s), sorted(s)
    return fn_program(f, (t(2),))


@case("sets")
def set_from_list_deduplicates():
    def f(x):
        names = ["w", "b", "w", "b", "c"]
        unique = set(names)
        return x * len(unique), sorted(unique)
    return fn_program(f, (t(2),))


@case("sets")
def frozenset_of_constants_as_key():
    def f(x):
        key = frozenset({"a", "b"})
        table = {key: 3, frozenset(): 0}
        return x * table[frozenset(["b", "a"])], len(key | {"c"})
    return fn_program(f, (t(2),))


@case("sets")
def set_of_tensors_membership_by_identity():
    def f(x, y):
        pool = {x, y}
        z = x + 0
        out = x * 0
        if x in pool:
            out = out + 1
        if z not in pool:
            out = out + 10
        return out, len(pool)
    return fn_program(f, (t(2), t(2)))


@case("sets")
def set_of_tensors_iterated_sum():
    def f(x, y):
        pool = set()
        pool.add(x)
        pool.add(y)
        pool.add(x)
        return sum(v.sum() for v in pool), len(pool)
    return fn_program(f, (t(2), t(2)))


@case("sets")
def set_input_membership():
    def f(x, allowed):
        if "scale" in allowed:
            return x * 2
        return x
    return fn_program(f, (t(2), {"scale", "shift"}))


@case("sets")
def set_input_mutated_for_caller():
    def f(x, tags):
        tags.add("visited")
        tags.discard("stale")
        return x + len(tags)
    return fn_program(f, (t(2), {"stale", "x"}))


@case("sets")
def global_set_len_changes_between_calls():
    def f(x):
        return x * len(SEEN)

    def reset_and_grow(_, i):
        SEEN.add(f"n{i}")

    SEEN.clear()
    SEEN.update({"a", "b"})
    return Program(f, ((t(2),), (t(2),), (t(2),)), between=reset_and_grow)


@case("sets")
def global_set_membership_changes_between_calls():
    def f(x):
        if "c" in SEEN:
            return x + 1
        return x - 1

    def add_c(_, i):
        SEEN.add("c")

    SEEN.clear()
    SEEN.update({"a", "b"})
    return Program(f, ((t(2),), (t(2),)), between=add_c)


@case("sets")
def closed_over_set_len_changes():
    flags = set()

    def f(x):
        return x + len(flags)

    def grow(_, i):
        flags.add(i)
    return Program(f, ((t(2),), (t(2),), (t(2),)), between=grow)


@case("sets")
def set_comprehension_from_sizes():
    def f(x, y):
        sizes = {v.shape[0] for v in (x, y, x)}
        return x.sum() * len(sizes), sorted(sizes)
    return fn_program(f, (t(2), t(3)))


@case("sets")
def set_equality_and_in_on_strings():
    def f(x):
        a = {"relu", "gelu"}
        b = set(["gelu", "relu"])
        if a == b and "relu" in a:
            return x.relu()
        return x
    return fn_program(f, (t(3),))


@case("deques")
def deque_append_pop_both_ends():
    def f(x):
        d = collections.deque([x, x + 1])
        d.append(x + 2)
        d.appendleft(x - 1)
        right = d.pop()
        left = d.popleft()
        return right - left, len(d), list(d)
    return fn_program(f, (t(2),))


@case("deques", fullgraph=False)
def deque_extend_extendleft_rotate():
    def f(x):
        d = collections.deque([1, 2, 3])
        d.extend([4, 5])
        d.extendleft([0, -1])
        d.rotate(2)
        return x * d[0], list(d)
    return fn_program(f, (t(2),))


@case("deques")
def deque_maxlen_drops_oldest():
    def f(x):
        d = collections.deque(maxlen=2)
        for k in range(4):
            d.append(x * k)
        return list(d), d.maxlen
    return fn_program(f, (t(2),))


@case("deques")
def deque_index_set_and_insert():
    def f(x):
        d = collections.deque(["a", "b", "c"])
        d[1] = "z"
        d.insert(0, "start")
        d.remove("c")
        return x + len(d), list(d), d.index("z"), d.count("a")
    return fn_program(f, (t(2),))


@case("deques")
def deque_as_bfs_queue():
    def f(x):
        queue = collections.deque([(x, 0)])
        results = []
        while queue:
            value, depth = queue.popleft()
            results.append(value)
            if depth < 2:
                queue.append((value * 2, depth + 1))
                queue.append((value + 1, depth + 1))
        return len(results), results[-1]
    return fn_program(f, (t(2),))


@case("deques")
def deque_input_mutated_for_caller():
    def f(x, d):
        d.append(x * 2)
        d.popleft()
        return len(d)
    d = collections.deque([t(2), t(2)])
    return Program(f, ((t(2), d),), observe=lambda: list(d))


@case("deques")
def deque_copy_clear_and_reverse():
    def f(x):
        d = collections.deque([x, x + 1, x + 2])
        c = d.copy()
        d.reverse()
        c.clear()
        return list(d)[0], len(c)
    return fn_program(f, (t(2),))


@case("deques")
def global_deque_contents_change_between_calls():
    def f(x):
        return x * sum(WINDOW)

    def push(_, i):
        WINDOW.append(10 * i)

    WINDOW.clear()
    WINDOW.extend([1, 2, 3])
    return Program(f, ((t(2),), (t(2),), (t(2),)), between=push)


@case("deques")
def deque_iteration_and_membership():
    def f(x):
        d = collections.deque([1, 3, 5])
        total = x
        for v in d:
            total = total + v
        return total, 3 in d, 4 in d
    return fn_program(f, (t(2),))
