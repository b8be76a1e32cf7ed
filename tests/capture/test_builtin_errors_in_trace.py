"""Errors eager raises from list methods, sorted() and sequence repetition on values known at
trace time (kiln/capture/variables/sequence.py, ordering.py, operators.py): raised in the trace
as eager raises them, where the program's own handlers catch them, instead of escaping the
tracer as an internal error (an eager fallback of the whole frame with a warning). The list is
left as eager leaves it."""
from __future__ import annotations

import pytest
import torch

from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


def _catching(body):
    def f(x):
        items = [1, 2, 3]
        try:
            body(items)
        except (ValueError, IndexError, TypeError) as error:
            return x - 1, type(error).__name__, items
        return x + 1, None, items
    return f


BODIES = {
    "remove_missing": lambda items: items.remove(5),
    "remove_present": lambda items: items.remove(2),
    "pop_out_of_range": lambda items: items.pop(7),
    "pop_negative_out_of_range": lambda items: items.pop(-4),
    "pop_negative": lambda items: items.pop(-3),
    "pop_of_emptied": lambda items: [items.clear(), items.pop()],
    "pop_by_string": lambda items: items.pop("a"),
    "insert_by_string": lambda items: items.insert("a", 0),
    "insert_far": lambda items: items.insert(10, 0),
    "sort_mixed_types": lambda items: [items.append("a"), items.sort()],
    "sorted_mixed_types": lambda items: sorted([1, "a"]),
    "repeat_by_float": lambda items: items * 1.5,
    "repeat_tuple_by_float": lambda items: (1,) * 2.0,
}


@pytest.mark.parametrize("name", list(BODIES))
def test_error_is_caught_in_the_frame_as_in_eager(name: str) -> None:
    check_traced(_catching(BODIES[name]), fresh(X), oracle=False)


def test_uncaught_error_leaves_the_frame_with_eager_type() -> None:
    import kiln

    def f(x, items):
        items.append(x.sum())
        items.remove(7)
        return x

    for compiled in (kiln.compile(f, backend="eager"), f):
        items: list = []
        with pytest.raises(ValueError):
            compiled(torch.ones(2), items)
        assert len(items) == 1
