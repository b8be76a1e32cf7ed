"""Containers read from outside the frame are guarded on what the trace read of them.

A global, closure, class or module attribute holding a set, frozenset, list, tuple, dict,
OrderedDict, defaultdict or deque: after the program changes it in place (add, append, a new key,
clear), the compiled function answers as eager does for len(), membership, iteration, truthiness,
indexing and keys, instead of replaying what the first trace saw. Each case is a program and a
change made between calls; the compiled results must equal eager's on every call.
"""
from __future__ import annotations

import collections
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from semantics_oracle import check_calls  # noqa: E402


class Holder:
    ITEMS = [1, 2]
    TAGS = {1, 2}
    MAP = {"a": 1}


def _case(kind: str):
    """(fn, change) for one container kind and read; built fresh so cases never share state."""
    s = {1, 2}
    items = [1, 2]
    d = {"a": 1}
    od = collections.OrderedDict(a=1)
    dd = collections.defaultdict(int, a=1)
    dq = collections.deque([1, 2])
    nested = {"k": [1, 2], "s": {3}}
    ns = types.SimpleNamespace(items=[1, 2], tags={5})
    mod = nn.Module()
    mod.tags = {1, 2}
    mod.cfg = {"a": [1]}
    holder = type("Holder", (), {"ITEMS": [1, 2], "TAGS": {1, 2}, "MAP": {"a": 1}})
    obj = holder()

    def grow_set() -> None:
        s.add(max(s) + 1)

    table = {
        "set_len": (lambda x: x + len(s), grow_set),
        "set_contains": (lambda x: x + (3 in s), grow_set),
        "set_iter": (lambda x: x + sum(s), grow_set),
        "set_sorted": (lambda x: x * sorted(s)[-1], grow_set),
        "set_truth": (lambda x: x + (1 if s else 0), s.clear),
        "set_in_comprehension": (lambda x: [x * v for v in s], grow_set),
        "list_len": (lambda x: x + len(items), lambda: items.append(3)),
        "list_contains": (lambda x: x + (3 in items), lambda: items.append(3)),
        "list_item": (lambda x: x + items[-1], lambda: items.append(7)),
        "list_truth": (lambda x: x + (1 if items else 0), items.clear),
        "dict_len": (lambda x: x + len(d), lambda: d.update(b=2)),
        "dict_contains": (lambda x: x + ("b" in d), lambda: d.update(b=2)),
        "dict_keys": (lambda x: (x, list(d.keys())), lambda: d.update(b=2)),
        "dict_value": (lambda x: x + d["a"], lambda: d.update(a=5)),
        "dict_truth": (lambda x: x + (1 if d else 0), d.clear),
        "ordered_dict_len": (lambda x: x + len(od), lambda: od.update(b=2)),
        "ordered_dict_order": (lambda x: (x, list(od)), lambda: od.move_to_end("a", last=False) or od.update(b=2)),
        "defaultdict_len": (lambda x: x + len(dd), lambda: dd.update(b=2)),
        "deque_len": (lambda x: x + len(dq), lambda: dq.append(3)),
        "nested_list": (lambda x: x + len(nested["k"]), lambda: nested["k"].append(3)),
        "nested_set": (lambda x: x + len(nested["s"]), lambda: nested["s"].add(4)),
        "namespace_list": (lambda x: x + len(ns.items), lambda: ns.items.append(3)),
        "namespace_set": (lambda x: x + len(ns.tags), lambda: ns.tags.add(6)),
        "module_set": (lambda x: x + len(mod.tags), lambda: mod.tags.add(3)),
        "module_dict_list": (lambda x: x + len(mod.cfg["a"]), lambda: mod.cfg["a"].append(1)),
        "class_list": (lambda x: x + len(holder.ITEMS), lambda: holder.ITEMS.append(3)),
        "class_set": (lambda x: x + len(holder.TAGS), lambda: holder.TAGS.add(3)),
        "class_dict": (lambda x: x + len(holder.MAP), lambda: holder.MAP.update(b=2)),
        "instance_class_set": (lambda x: x + len(obj.TAGS), lambda: holder.TAGS.add(3)),
        "type_of_instance_list": (lambda x: x + len(type(obj).ITEMS), lambda: holder.ITEMS.append(3)),
        "type_of_instance_set": (lambda x: x + len(type(obj).TAGS), lambda: holder.TAGS.add(3)),
        "type_of_new_object_list": (lambda x: x + type(holder()).ITEMS[-1], lambda: holder.ITEMS.append(9)),
        "type_of_new_object_set": (lambda x: x + len(type(holder()).TAGS), lambda: holder.TAGS.add(3)),
        "type_of_new_object_dict": (lambda x: x + type(holder()).MAP["a"], lambda: holder.MAP.update(a=4)),
    }
    return table[kind]


KINDS = ["set_len", "set_contains", "set_iter", "set_sorted", "set_truth", "set_in_comprehension", "list_len",
         "list_contains", "list_item", "list_truth", "dict_len", "dict_contains", "dict_keys", "dict_value",
         "dict_truth", "ordered_dict_len", "ordered_dict_order", "defaultdict_len", "deque_len", "nested_list",
         "nested_set", "namespace_list", "namespace_set", "module_set", "module_dict_list", "class_list",
         "class_set", "class_dict", "instance_class_set", "type_of_instance_list", "type_of_instance_set",
         "type_of_new_object_list", "type_of_new_object_set", "type_of_new_object_dict"]


@pytest.mark.parametrize("kind", KINDS)
def test_container_changed_in_place_is_seen(kind: str) -> None:
    fn, change = _case(kind)
    x = torch.ones(2)
    check_calls(fn, [(x,), (x,), (x,)], between=lambda i: change())


G_TAGS = {1, 2}
G_FROZEN = frozenset({1, 2})


def global_set_len(x):
    return x + len(G_TAGS) + len(G_FROZEN)


def test_global_set_len_follows_the_set() -> None:
    """The issue's example: len() of a global set after the set grows."""
    x = torch.ones(2)
    check_calls(global_set_len, [(x,), (x,), (x,)], between=lambda i: G_TAGS.add(10 + i))


def test_class_attribute_read_without_a_source_is_checked_by_contents() -> None:
    """A class reached only through an object built in the frame: its list and set attributes are
    compared item by item with what the trace read, not by identity with themselves."""
    def make():
        return type("Local", (), {"ITEMS": [1, 2], "TAGS": {1}})

    klass = make()
    factory = {"k": klass}

    def fn(x):
        obj = factory["k"]()
        kind = type(obj)
        return x + len(kind.ITEMS) + len(kind.TAGS)

    def change(i: int) -> None:
        klass.ITEMS.append(i)
        klass.TAGS.add(10 + i)

    check_calls(fn, [(torch.ones(2),)] * 3, between=change)


@pytest.mark.parametrize("name, change", [
    ("MAP", lambda k: k.MAP.update(b=2)),
    ("ITEMS", lambda k: k.ITEMS.append(2)),
    ("TAGS", lambda k: k.TAGS.add(2)),
])
def test_class_attribute_guard_compiled_later_keeps_the_trace_time_contents(name: str, change) -> None:
    """Guards are compiled again when the native checks load (CheckFn.use_native): a container
    changed in place meanwhile must still fail the guard made from what the trace read."""
    from kiln.capture.guards import ClassAttribute, Guard, compile_guards

    klass = type("K", (), {"MAP": {"a": 1}, "ITEMS": [1], "TAGS": {1}})
    guard = Guard("", "check_class_attr", ClassAttribute(klass.__mro__, name, klass.__dict__[name]))
    assert compile_guards([guard], native=None)({}, {}, None)
    change(klass)
    assert not compile_guards([guard], native=None)({}, {}, None)
