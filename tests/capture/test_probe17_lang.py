"""Python-language classes of bug found by the 17th probe (Dynamo-style programs kept outside the
repository, /work/scratch/probelang4): each test runs eagerly and through
kiln.compile(backend="eager") and compares values, raised exceptions and side effects, and where
it matters the number of graphs.

- operator.countOf / operator.indexOf broke the graph (no rule): they read the container one item
  at a time as `in` does (identity, then ==, a user __eq__ traced), indexOf stopping at the first
  match and raising eager's ValueError when there is none;
- copy.deepcopy in a compiled frame was an internal error (RecursionError, the frame ran eagerly):
  its memo dict holds a key `id(memo)`, and describing that dict described the key, which
  described the dict again; a dict being described is shown as `{...}` inside itself, as repr does;
- a list, tuple or range iterator from outside the frame (a global, a closure, an argument) stepped
  by the trace (next(), a for loop, list()) was not advanced: every call read the same first items
  and the caller's iterator stayed where it was (a wrong answer); the trace's next() calls are
  replayed on the real iterator after the graph (side_effects.advance_iterator); a list
  iterator's items are read from the list by index as the trace changes it (an item appended in
  the frame is reached, as in eager, where it raised StopIteration), and one returned or live
  across a break is the real iterator, not a copy;
"""
from __future__ import annotations

import copy
import operator

import torch

import kiln
from eager_compare import outcome, run
from semantics_oracle import same

X = torch.arange(3.0) - 1.0


class Key:
    def __init__(self, v: int) -> None:
        self.v = v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and self.v == other.v


# ------------------------------------------------------------ operator.countOf / operator.indexOf
def test_count_of_constants_and_tensors() -> None:
    def f(x):
        return x + operator.countOf([1, 1, 2], 1) + operator.countOf((x, x), x) * 10
    run(f, [(X,)], graphs=1)


def test_count_of_uses_user_eq() -> None:
    def f(x, keys):
        return x + operator.countOf(keys, Key(1)) + operator.countOf(keys, Key(9)) * 10
    run(f, [(X, [Key(1), Key(2), Key(1)])], graphs=1)


def test_index_of_first_match_and_missing_raises() -> None:
    def f(x):
        i = operator.indexOf((Key(3), Key(1), Key(1)), Key(1))
        try:
            operator.indexOf([1, 2], 5)
        except ValueError as e:
            return x * i + len(str(e))
        return x
    run(f, [(X,)], graphs=1)


def test_index_of_leaves_iterator_after_match() -> None:
    def f(x):
        it = iter([4, 5, 6, 5])
        i = operator.indexOf(it, 5)
        return x + i * 10 + sum(it)
    run(f, [(X,)], graphs=1)



# ------------------------------------------------------------ copy.deepcopy (memo keyed by id(memo))
def test_deepcopy_nested_list_in_frame() -> None:
    def f(x):
        a = [[1, 2], [3]]
        b = copy.deepcopy(a)
        b[0].append(9)
        return x + len(a[0]) + len(b[0]) * 10
    run(f, [(X,)], graphs=1)


def test_dict_keyed_by_its_own_id_described() -> None:
    def f(x):
        memo = {}
        memo[id(memo)] = [1]
        memo[id(memo)].append(2)
        return x + len(memo[id(memo)])
    run(f, [(X,)], graphs=1)


# ------------------------------------------------------------ iterators from outside the frame
def test_global_range_iterator_advances_each_call() -> None:
    it = iter(range(20))

    def f(x):
        a = next(it)
        b = next(it)
        return x + a * 10 + b
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    got = [compiled(X) for _ in range(3)]
    assert [int(g[1]) for g in got] == [1, 23, 45] and next(it) == 6


def test_argument_list_iterator_partly_consumed_by_loop() -> None:
    def f(x, it):
        for v in it:
            x = x + v
            if v == 2:
                break
        return x
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    for fn in (f, compiled):
        it = iter([1, 2, 3, 4])
        out = fn(X, it)
        assert same(out, X + 3) and list(it) == [3, 4], fn


def test_closure_tuple_iterator_exhausted_by_list() -> None:
    def make():
        it = iter((1, 2, 3))

        def f(x):
            return x + sum(list(it)) + next(it, 100)
        return f
    eager, compiled = make(), kiln.compile(make(), backend="eager")
    for _ in range(2):
        assert same(compiled(X), eager(X))


def test_exhausted_list_iterator_stays_exhausted_after_growth() -> None:
    def make():
        data = [1, 2]
        it = iter(data)

        def f(x):
            total = x + sum(it)
            data.append(5)
            return total + next(it, -1)
        return f
    eager, compiled = make(), kiln.compile(make(), backend="eager")
    for _ in range(2):
        assert same(compiled(X), eager(X))


def test_outside_iterator_stepped_then_graph_break() -> None:
    it = iter([1, 2, 3, 4, 5, 6])

    def f(x):
        a = next(it)
        torch._dynamo.graph_break()
        return x + a * 10 + next(it)
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    assert [int(compiled(X)[1]) for _ in range(2)] == [12, 34] and next(it) == 5


def test_outside_list_iterator_sees_items_appended_in_frame() -> None:
    def make():
        data = [1]
        it = iter(data)

        def f(x):
            a = next(it)
            data.append(a + 1)
            return x + a + next(it)
        return f
    eager, compiled = make(), kiln.compile(make(), backend="eager")
    for _ in range(2):
        assert outcome(compiled, X)[0] == outcome(eager, X)[0]
    fresh_eager, fresh_compiled = make(), kiln.compile(make(), backend="eager")
    assert same(fresh_compiled(X), fresh_eager(X))


def test_outside_iterator_returned_is_the_same_object() -> None:
    def f(x, it):
        next(it)
        return x + 1, it
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    it = iter([1, 2, 3])
    out, back = compiled(X, it)
    assert back is it and list(it) == [2, 3]
