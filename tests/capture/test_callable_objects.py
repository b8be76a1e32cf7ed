"""Objects made in the frame called through their class's Python `__call__` (a callable config, a
scaler, a stateful accumulator), traced whole as torch.compile traces them and equal to eager; the
class's `__call__` changing between calls recompiles."""
from __future__ import annotations

import torch

from semantics_oracle import check_calls
from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


class Scale:
    def __init__(self, k):
        self.k = k

    def __call__(self, v):
        return v * self.k


class Accumulate:
    def __init__(self):
        self.total = 0

    def __call__(self, v, *, weight=1):
        self.total = self.total + weight
        return v + self.total


class Twice(Scale):
    def __call__(self, v):
        return super().__call__(v) * 2


def test_object_made_in_the_frame_called() -> None:
    def f(x):
        s = Scale(3)
        return s(x), Scale(2)(x)
    check_traced(f, fresh(X))


def test_call_with_keywords_and_state() -> None:
    def f(x):
        acc = Accumulate()
        y = acc(x)
        y = acc(y, weight=3)
        return y, acc.total, acc
    check_traced(f, fresh(X))


def test_subclass_call_through_super_and_in_a_map() -> None:
    def f(x):
        fns = [Scale(2), Twice(3)]
        return [fn(x) for fn in fns], list(map(Twice(1), [x, x + 1]))
    check_traced(f, fresh(X))


def test_a_changed_call_on_the_class_recompiles() -> None:
    class Local:
        def __call__(self, v):
            return v + 1

    def f(x):
        return Local()(x)

    def swap(i):
        Local.__call__ = lambda self, v: v * 10
    check_calls(f, [(X,), (X,)], between=swap, fullgraph=True)
