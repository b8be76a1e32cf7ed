"""DynamicPolicy decisions (dynamic=False/True/None, automatic dynamic, ints) and the marks."""
from __future__ import annotations

import pytest
import torch

from kiln import config
from kiln.symbolic import DynamicPolicy, mark_dynamic, mark_static, maybe_mark_dynamic, policy_for, reset_policies
from kiln.symbolic.marks import marked_dynamic, marked_maybe_dynamic, marked_static

X = "L['x']"


def test_marks_are_stored_on_the_tensor():
    t = torch.empty(4, 5, 6)
    mark_dynamic(t, 0)
    mark_dynamic(t, [-1])
    maybe_mark_dynamic(t, 1)
    assert marked_dynamic(t) == {0, 2} and marked_maybe_dynamic(t) == {1} and marked_static(t) == set()
    u = torch.empty(4, 5)
    mark_static(u)
    assert marked_static(u) == {0, 1}
    with pytest.raises(ValueError):
        mark_dynamic(u, 0)  # contradicts mark_static
    with pytest.raises(IndexError):
        mark_dynamic(t, 3)


def test_dynamic_false_and_true():
    p = DynamicPolicy()
    t = torch.empty(4, 5, 6)
    assert p.dynamic_dims(X, t, False) == ()
    mark_dynamic(t, 0)
    # as torch.compile: dynamic=False turns automatic dynamic off, the user's marks still count
    assert p.dynamic_dims(X, t, False) == (0,)
    s = torch.empty(4, 1, 6)
    mark_static(s, 2)
    assert p.dynamic_dims(X, s, True) == (0, 1)  # size 1 is returned; the ShapeEnv specializes it
    with config.patch(assume_static_by_default=False):
        assert p.dynamic_dims(X, s, None) == (0, 1)


def test_automatic_dynamic_after_a_change():
    p = DynamicPolicy()
    first = torch.empty(8, 3)
    assert p.dynamic_dims(X, first, None) == ()  # static first
    p.note_sizes(X, first)
    same = torch.empty(8, 3)
    assert p.dynamic_dims(X, same, None) == ()
    changed = torch.empty(9, 3)
    assert p.dynamic_dims(X, changed, None) == (0,)
    assert p.explain_change(X, (8, 3), (9, 3)) == "x dim 0: 8 -> 9, now dynamic"
    p.note_sizes(X, changed)
    # once dynamic, stays dynamic, even when the size comes back
    assert p.dynamic_dims(X, torch.empty(8, 3), None) == (0,)
    assert p.dynamic_dims(X, torch.empty(8, 4), None) == (0, 1)
    with config.patch(automatic_dynamic_shapes=False):
        assert p.dynamic_dims(X, torch.empty(10, 4), None) == ()
        assert "automatic_dynamic_shapes is off" in p.explain_change(X, (8, 3), (9, 3))


def test_marks_in_the_policy():
    p = DynamicPolicy()
    t = torch.empty(8, 3, 2)
    mark_dynamic(t, 0)
    maybe_mark_dynamic(t, 2)
    assert p.dynamic_dims(X, t, None) == (0, 2)  # from the first capture
    p.note_sizes(X, t)
    u = torch.empty(9, 4, 2)
    mark_static(u, 1)
    assert p.dynamic_dims(X, u, None) == (0,)  # dim 1 changed but is marked static


def test_dynamic_false_ignores_changes_and_says_so():
    p = DynamicPolicy()
    first = torch.empty(8, 3)
    assert p.dynamic_dims(X, first, False) == ()
    p.note_sizes(X, first)
    assert p.dynamic_dims(X, torch.empty(9, 3), False) == ()
    assert p.explain_change(X, (8, 3), (9, 3)) == "x dim 0: 8 -> 9, recompiled with a static size (dynamic=False)"
    n = "L['n']"
    assert not p.int_is_dynamic(n, 5, False)
    assert "(dynamic=False)" in p.explain_change(n, 5, 6)


def test_explain_change_names_what_keeps_a_dim_static():
    p = DynamicPolicy()
    t = torch.empty(8, 3)
    mark_static(t, 0)
    p.dynamic_dims(X, t, None)
    assert p.explain_change(X, (8, 3), (9, 3)) == "x dim 0: 8 -> 9, recompiled with a static size (mark_static)"
    assert p.explain_change(X, (8, 3), (8, 1)) == \
        "x dim 1: 3 -> 1, recompiled with a static size (sizes 0 and 1 are always specialized)"
    w = "L['self']._parameters['weight']"
    p.dynamic_dims(w, torch.nn.Parameter(torch.empty(4, 4)), None)
    assert p.explain_change(w, (4, 4), (5, 4)).endswith("recompiled with a static size (a parameter)")


def test_rank_change_is_not_a_size_change():
    p = DynamicPolicy()
    p.note_sizes(X, torch.empty(8, 3))
    assert p.dynamic_dims(X, torch.empty(8, 3, 2), None) == ()
    assert "rank 2 -> 3" in p.explain_change(X, (8, 3), (8, 3, 2))


def test_int_arguments():
    p = DynamicPolicy()
    n = "L['n']"
    assert not p.int_is_dynamic(n, 5, None)
    p.note_sizes(n, 5)
    assert not p.int_is_dynamic(n, 5, None)
    assert p.int_is_dynamic(n, 6, None)
    assert p.explain_change(n, 5, 6) == "n: 5 -> 6, now dynamic"
    p.note_int(n, 6)
    assert p.int_is_dynamic(n, 5, None)  # sticky
    assert p.int_is_dynamic(n, 1, None)  # a dynamic int stays symbolic at 0 and 1, as in torch.compile
    assert not p.int_is_dynamic(n, True, True)  # bools are never symbolic
    assert p.int_is_dynamic(n, 7, True) and not p.int_is_dynamic(n, 7, False)
    with config.patch(specialize_int=True):
        assert not p.int_is_dynamic(n, 9, None) and not p.int_is_dynamic(n, 9, True)
        assert "specialize_int" in p.explain_change(n, 5, 9)


def test_policy_per_code_object():
    def f(x):
        return x

    def g(x):
        return x

    reset_policies()
    assert policy_for(f.__code__) is policy_for(f.__code__)
    assert policy_for(f.__code__) is not policy_for(g.__code__)
    policy_for(f.__code__).note_sizes(X, torch.empty(2, 2))
    reset_policies()
    assert policy_for(f.__code__).dynamic_dims(X, torch.empty(3, 2), None) == ()


def test_parameters_stay_static_unless_marked():
    p = DynamicPolicy()
    w = torch.nn.Parameter(torch.empty(4, 3))
    assert p.dynamic_dims("L['self'].w", w, True) == ()
    p.note_sizes("L['self'].w", w)
    assert p.dynamic_dims("L['self'].w", torch.nn.Parameter(torch.empty(5, 3)), None) == ()
    marked = torch.nn.Parameter(torch.empty(4, 3))
    mark_dynamic(marked, 0)
    assert p.dynamic_dims("L['self'].v", marked, True) == (0,)
