"""Dict views are live: `d.keys()`, `d.values()` and `d.items()` taken before the dict changes see
the change (len, membership, iteration, reversed, set operations), as in CPython, inside the
frame, when returned from it, and across a graph break. Compared with eager under fullgraph=False
and True.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import kiln

sys.path.insert(0, str(Path(__file__).parent))
from semantics_oracle import check_calls  # noqa: E402


def views_then_insert(x):
    d = {"a": 1}
    k, v, it = d.keys(), d.values(), d.items()
    d["b"] = 2
    return x + len(k) + sum(v) + len(it) + ("b" in k)


def views_then_delete_and_pop(x):
    d = {"a": 1, "b": 2, "c": 3}
    k, v = d.keys(), d.values()
    del d["a"]
    d.pop("b")
    return x * len(k), list(k), list(v), "a" in k, 3 in v


def views_then_update_and_clear(x):
    d = {"a": x}
    items = d.items()
    d.update(b=x + 1, c=x + 2)
    n = len(items)
    d.clear()
    return x + n, len(items), bool(items), list(items)


def view_iterated_after_setdefault(x):
    d = {"a": x}
    k = d.keys()
    d.setdefault("b", x * 2)
    return [d[key] + 1 for key in k], [key for key in reversed(k)]


def view_of_an_input_dict(d, x):
    k = d.keys()
    v = d.values()
    d["new"] = x * 3
    return x + len(k), "new" in k, len(v)


def keys_view_set_operations(x):
    d = {"a": 1, "b": 2}
    k = d.keys()
    d["c"] = 3
    return (x, k & {"a", "z"}, k | ["q"], k - {"a"}, k ^ {"a", "w"}, ["c", "y"] & k, {"a", "b", "c"} == k,
            k == ["a", "b", "c"], k <= {"a", "b", "c", "d"}, k < {"a", "b", "c"}, k.isdisjoint({"z"}))


def items_view_set_operations(x):
    d = {"a": 1, "b": 2}
    it = d.items()
    d["c"] = 3
    return x, it & {("a", 1), ("b", 5)}, it - {("a", 1)}, ("c", 3) in it, ("c", 4) in it, it == {("a", 1), ("b", 2), ("c", 3)}


def values_view_membership(x):
    d = {"a": 1}
    v = d.values()
    d["b"] = 7
    return x + (7 in v), v == v, sorted(v)


def view_in_a_loop_with_tensors(x):
    d = {"w": x}
    keys = d.keys()
    for i in range(3):
        d[f"k{i}"] = x * i
    return [d[k] for k in keys], len(keys)


def view_returned(x):
    d = {"a": x}
    k = d.keys()
    d["b"] = x + 1
    return k, d.values(), d.items()


CASES = [views_then_insert, views_then_delete_and_pop, views_then_update_and_clear, view_iterated_after_setdefault,
         keys_view_set_operations, items_view_set_operations, values_view_membership, view_in_a_loop_with_tensors,
         view_returned]


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_views_follow_their_dict(fn, fullgraph: bool) -> None:
    x = torch.ones(2)
    check_calls(fn, [(x,), (x * 2,)], fullgraph=fullgraph)


def test_view_of_an_input_dict_sees_the_frame_write() -> None:
    kiln.reset()
    compiled = kiln.compile(view_of_an_input_dict, backend="eager", fullgraph=True)
    x = torch.ones(2)
    want_d, got_d = {"a": 1}, {"a": 1}
    want = view_of_an_input_dict(want_d, x)
    got = compiled(got_d, x)
    assert torch.equal(got[0], want[0]) and got[1:] == want[1:]
    assert list(got_d) == list(want_d)


def test_returned_view_stays_a_view_of_the_returned_dict() -> None:
    def fn(x):
        d = {"a": x}
        return d, d.keys()

    kiln.reset()
    d, k = kiln.compile(fn, backend="eager")(torch.ones(2))
    d["later"] = 1
    assert list(k) == ["a", "later"]


def test_view_live_across_a_graph_break() -> None:
    def fn(x):
        d = {"a": x}
        k = d.keys()
        v = d.values()
        print("a graph break")
        d["b"] = x + 1
        return x + len(k) + len(v), list(k), k

    check_calls(fn, [(torch.ones(2),), (torch.ones(2),)])
