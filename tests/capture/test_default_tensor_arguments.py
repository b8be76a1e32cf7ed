"""A tensor held as a default argument of a function from outside (`def g(v, b=bias)`, a
keyword-only default too) is a graph input read from the function's `__defaults__` /
`__kwdefaults__`: traced whole as torch.compile traces it, in-place changes to it seen, and a
replaced default recompiles."""
from __future__ import annotations

import torch

import kiln

from semantics_oracle import check_calls
from trace_oracle import check_traced, fresh

BIAS = torch.ones(2) * 5


def shifted(v, b=BIAS, *, c=BIAS * 2):
    return v + b + c


def test_positional_and_keyword_only_tensor_defaults() -> None:
    def f(x):
        return shifted(x), shifted(x, x), shifted(x, c=x)
    check_traced(f, fresh(torch.arange(2.0)))


def test_default_in_a_closure_function() -> None:
    scale = torch.full((2,), 3.0)

    def g(v, s=scale):
        return v * s

    def f(x):
        return g(x) + g(x, 2)
    check_traced(f, fresh(torch.arange(2.0)))


def test_changed_in_place_and_replaced_between_calls() -> None:
    def f(x):
        return shifted(x)
    saved = shifted.__defaults__

    def change(i):
        if i == 1:
            BIAS.add_(1)
        else:
            shifted.__defaults__ = (torch.zeros(2),)
    try:
        check_calls(f, [(torch.arange(2.0),)] * 3, between=change, fullgraph=True)
    finally:
        shifted.__defaults__ = saved
        BIAS.sub_(1)


def _accumulate(v, store=[], *, seen={}):  # noqa: B006 - the shared mutable default is the point
    store.append(v)
    seen[len(store)] = v
    return len(store) + len(seen)


class _Holder:
    def push(self, v, store=[]):  # noqa: B006
        store.append(v)
        return len(store)


def test_mutable_default_is_the_same_object_every_call() -> None:
    # `def g(v, store=[])` keeps one list across calls: its length was baked into the first graph
    # (no guard on it) and every later call returned the first call's value.
    holder = _Holder()

    def f(x):
        return x * _accumulate(1) + holder.push(2)

    compiled = kiln.compile(f, backend="eager")
    for expected_count in (1, 2, 3):
        got = compiled(torch.ones(2))
        assert len(_Holder.push.__defaults__[0]) == expected_count
        assert len(_accumulate.__defaults__[0]) == expected_count and len(_accumulate.__kwdefaults__["seen"]) == expected_count
        torch.testing.assert_close(got, torch.full((2,), 3.0 * expected_count))
