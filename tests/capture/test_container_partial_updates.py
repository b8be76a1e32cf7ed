"""Container updates from an iterator or generator that raises midway (kiln/capture/variables/
dict.py, sets.py, deque.py): eager's dict.update, set.update, deque.extend and Counter.update
store each item as they read it, so the items before the error stay in the container; the
compiled frame leaves the container as eager does. Also dict()/update() items that are not
pairs raise eager's ValueError in the trace, and a capture during which Kiln's own lazy imports
register classes with the `numbers` ABCs keeps its isinstance-on-an-ABC answers (no internal error)."""
from __future__ import annotations

import collections
import subprocess
import sys
import textwrap

import pytest
import torch

from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


def _raising(n: int):
    for i in range(n):
        yield i
    raise KeyError("stop")


def _ior(c, pairs) -> None:
    c |= pairs


UPDATES = {
    "dict_update_pairs": (lambda c: c.update((str(i), i) for i in _raising(2)), {"z": 0}),
    "dict_update_map": (lambda c: c.update(zip("ab", _raising(3))), {"a": 9}),
    "dict_ior": (lambda c: _ior(c, ((i, -i) for i in _raising(3))), {}),
    "ordered_dict_update": (lambda c: c.update((i, i) for i in _raising(2)), collections.OrderedDict(q=1)),
    "defaultdict_update": (lambda c: c.update((i, [i]) for i in _raising(2)), collections.defaultdict(list)),
    "set_update": (lambda c: c.update(_raising(3)), {7}),
    "set_update_two": (lambda c: c.update(iter([5, 6]), _raising(1)), {0}),
    "set_difference_update": (lambda c: c.difference_update(_raising(2)), {0, 1, 2}),
    "deque_extend": (lambda c: c.extend(_raising(2)), collections.deque([4])),
    "deque_extendleft": (lambda c: c.extendleft(_raising(3)), collections.deque([4], maxlen=3)),
    "counter_update": (lambda c: c.update(_raising(2)), collections.Counter("ab")),
}


@pytest.mark.parametrize("name", list(UPDATES))
def test_items_read_before_the_error_stay(name: str) -> None:
    update, container = UPDATES[name]

    def f(x, c):
        try:
            update(c)
        except KeyError:
            return x - 1, len(c)
        return x + 1, len(c)

    check_traced(f, fresh(X, container), oracle=False)


@pytest.mark.parametrize("items", [[("a", 1), ("b",)], [("a", 1, 2)], ["ab", "cde"]])
def test_update_items_that_are_not_pairs(items: list) -> None:
    def f(x, d):
        try:
            d.update(items)
        except ValueError as error:
            return x - 1, str(error)
        return x + 1, None

    check_traced(f, fresh(X, {"z": 0}))


def test_abc_answer_survives_kilns_own_imports_during_the_capture() -> None:
    program = textwrap.dedent("""
        import collections, sys, torch, kiln
        def gen():
            yield 1
            raise KeyError("k")
        def f(x, c):
            try:
                c.update(gen())
            except KeyError:
                pass
            return x + len(c)
        assert "sympy" not in sys.modules, "the check needs sympy to load during the capture"
        c = collections.Counter("a")
        out = kiln.compile(f, backend="eager")(torch.ones(1), c)
        assert kiln.stats()["fallbacks"] == 0, kiln.stats()
        assert out.tolist() == [3.0] and dict(c) == {"a": 1, 1: 1}, (out, c)
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_update_items_that_are_no_sequence() -> None:
    def f(x, d):
        caught = []
        for bad in ({1}, [1], [("k", 2), 3], ["ab", None]):
            try:
                d.update(bad)
            except TypeError as error:
                caught.append(str(error))
        try:
            d |= [5.0]
        except TypeError as error:
            caught.append(str(error))
        return x + len(d), caught

    check_traced(f, fresh(X, {"z": 0}), oracle=False)
