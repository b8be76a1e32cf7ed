"""`Tensor.set_` in a compiled frame, compared with eager (values, `_version`, requires_grad, what
a backward does):

- `v.set_(v)` (or set_ of an alias with v's own layout, `v.set_(v.detach())`) changes nothing but
  v's version counter, which eager bumps: the graph holds the one in-place op that writes v's own
  values (it left `_version` at 0, and an in-place update after it was functionalization's internal
  error, "cannot mutate tensors with frozen storage");
- set_ on a tensor that requires grad, with grad on, is a break: eager's set_ has no derivative (its
  result's backward raises "derivative for set_ is not implemented");
- an in-place update after set_ gave the tensor another layout is a clean break (eager runs it), not
  an internal error.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import kiln
from tests.autograd.test_leftovers43 import compiled, facts, flat, run_quietly

BACKENDS = ["default", "aot_eager", "eager"]


def intermediate_to_itself(x):
    y = x * 2
    y.set_(y)
    return y


def intermediate_to_its_detached_alias(x):
    y = x * 2
    y.set_(y.detach())
    return y


def to_itself_then_updated(x):
    y = x * 2
    y.set_(y)
    y.add_(1)
    return y


def to_itself_twice_then_viewed(x):
    y = x * 2
    y.set_(y)
    y.mul_(3)
    y.set_(y)
    return y, y[1:]


def updated_then_to_itself_then_read(x):
    y = x + 1
    y.mul_(2)
    y.set_(y)
    return y * y, y


def input_to_itself(x):
    x.set_(x)
    return x + 1


def input_to_itself_then_updated(x):
    x.set_(x)
    x.add_(1)
    return x * 2


CASES = [intermediate_to_itself, intermediate_to_its_detached_alias, to_itself_then_updated,
         to_itself_twice_then_viewed, updated_then_to_itself_then_read, input_to_itself,
         input_to_itself_then_updated]


def call(fn: Callable[..., Any], mode: str, updates_input: bool) -> tuple[list[Any], torch.Tensor]:
    leaf = torch.arange(4.).requires_grad_(mode == "requires_grad")
    # an input updated in place is not a leaf that requires grad (eager refuses that)
    x = leaf * 1 if updates_input and mode == "requires_grad" else leaf
    with torch.no_grad() if mode == "no_grad" else torch.enable_grad():
        outs = flat(fn(x))
    return outs, x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["plain", "no_grad", "requires_grad"])
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_set_to_itself_as_eager(fn, mode, backend):
    fast = compiled(fn, backend)
    updates_input = fn.__name__.startswith("input")
    want, e_x = call(fn, mode, updates_input)
    got, k_x = call(lambda x: run_quietly(fast, x), mode, updates_input)
    assert all(torch.equal(g, e) for g, e in zip(got, want)) and len(got) == len(want)
    assert torch.equal(k_x, e_x) and k_x._version == e_x._version
    assert facts(got, [k_x]) == facts(want, [e_x])
    assert kiln.stats()["fallbacks"] == 0
    if mode == "requires_grad":  # eager's set_ has no derivative: the backward raises as eager's
        for outs in (got, want):
            with pytest.raises(RuntimeError, match="derivative for set_ is not implemented"):
                sum(o.sum() for o in outs if o.requires_grad).backward()
    else:
        assert kiln.stats()["graph_breaks"] == 0


def set_to_a_view_then_updated(x):
    y = x * 2
    y.set_(y.view(2, 2))
    y.add_(1)
    return y


def set_to_a_transpose_then_updated(x):
    y = (x * 2).view(2, 2)
    y.set_(y.t())
    y.mul_(3)
    return y


@pytest.mark.parametrize("fn", [set_to_a_view_then_updated, set_to_a_transpose_then_updated],
                         ids=lambda f: f.__name__)
def test_update_after_set_to_another_layout_is_a_clean_break(fn):
    fast = compiled(fn, "default")
    want = fn(torch.arange(4.))
    got = run_quietly(fast, torch.arange(4.))  # no internal error
    assert torch.equal(got, want) and got._version == want._version and got.stride() == want.stride()
