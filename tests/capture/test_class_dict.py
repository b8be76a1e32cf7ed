"""A class's `__dict__` read from outside the frame (kiln/capture/variables/class_dict.py):
membership, lookups, get with a default, keys and length traced whole as torch.compile traces them;
its keys guarded (a class attribute added later recompiles), its values guarded as read; writes
raise eager's TypeError."""
from __future__ import annotations

import torch

from semantics_oracle import check_calls
from trace_oracle import check_traced, fresh

X = torch.arange(3.0)


class Model:
    registry: dict = {}
    scale = 2

    def __init__(self, x):
        self.x = x

    def method(self):
        return 1


class Sub(Model):
    pass


def test_membership_through_type_of_an_object_made_in_the_frame() -> None:
    def f(x):
        out = x
        if "registry" in type(Model(x)).__dict__:
            out = out + 1
        if "scale" in Sub.__dict__:
            out = out * 100
        return out
    check_traced(f, fresh(X))


def test_lookup_get_keys_and_length() -> None:
    def f(x):
        return (Model.__dict__["scale"] * x, Sub.__dict__.get("scale", 7), len(Model.__dict__) > 3,
                "method" in Model.__dict__.keys(), [k for k in Model.__dict__ if k == "scale"])
    check_traced(f, fresh(X))


def test_an_attribute_added_to_the_class_recompiles() -> None:
    def f(x):
        return x * (Sub.__dict__["scale"] if "scale" in Sub.__dict__ else 1)

    def add(i):
        Sub.scale = 5 + i
    try:
        check_calls(f, [(X,), (X,), (X,)], between=add, fullgraph=True)
    finally:
        del Sub.scale


def test_writing_the_mappingproxy_raises_type_error() -> None:
    def f(x):
        try:
            Model.__dict__["new"] = 1
        except TypeError:
            x = x + 1
        return x
    check_traced(f, fresh(X), oracle=False)
