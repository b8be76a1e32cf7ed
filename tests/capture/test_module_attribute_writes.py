"""`self.name = value` on a module inside a traced forward follows Python's object.__setattr__.

A class data descriptor (a property with a setter, a descriptor with `__set__`) wins over the
instance: its setter is inlined, and a later read goes through its getter again (it read back the
raw value stored). A module class's own `__setattr__` is inlined too, its `super().__setattr__`
storing the value; the write is replayed with nn.Module.__setattr__ so the override does not run a
second time. Compared with eager, under fullgraph=True.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import kiln


class Tenfold:
    def __set_name__(self, owner, name):
        self.slot = "_" + name

    def __get__(self, obj, cls):
        return self if obj is None else getattr(obj, self.slot, 0)

    def __set__(self, obj, value):
        setattr(obj, self.slot, value * 10)


class WithProperty(nn.Module):
    def __init__(self):
        super().__init__()
        self._k = 2

    @property
    def k(self):
        return self._k + 1

    @k.setter
    def k(self, value):
        self._k = value

    def forward(self, x):
        self.k = 5
        return x * self.k


class WithDescriptor(nn.Module):
    d = Tenfold()

    def forward(self, x):
        self.d = 2
        return x + self.d


class WithSetattr(nn.Module):
    def __init__(self):
        super().__init__()
        self.writes = 0

    def __setattr__(self, name, value):
        if name == "z":
            value = value + 1000
        super().__setattr__(name, value)

    def forward(self, x):
        self.z = 5
        return x * self.z


@pytest.mark.parametrize("make", [WithProperty, WithDescriptor, WithSetattr])
def test_module_attribute_write_in_forward_matches_eager(make):
    x = torch.randn(3)
    eager = make()
    expected = eager(x)
    model = make()
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), expected)
    torch.testing.assert_close(compiled(x), eager(x))
    assert model.__dict__.keys() == eager.__dict__.keys()
    for name in ("_k", "_d", "z"):
        assert getattr(model, name, None) == getattr(eager, name, None)


def test_property_setter_from_a_function_over_a_global_module():
    model = WithProperty()

    def f(x):
        model.k = 7
        return x * model.k

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 8.0))
    assert model._k == 7 and "k" not in model.__dict__
