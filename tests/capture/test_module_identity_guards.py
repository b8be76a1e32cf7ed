"""Modules are guarded by type, not identity (two instances of a class share a graph), so a trace
that decides something by WHICH module it holds pins that module's identity: `self.l1 is self.l0`,
`l == self.l0` (nn.Module compares by identity), `holder["m"] is a`, a module as a set element or
dict key made in the frame. Without the pin, a module swapped for another of the same class
between calls reused the graph and answered the old comparison."""
from __future__ import annotations

import torch
from torch import nn

import kiln


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l0 = nn.Linear(2, 2)
        self.l1 = nn.Linear(2, 2)

    def forward(self, x):
        return self.l1(x) * (2 if self.l1 is self.l0 else 1) + (3 if self.l1 == self.l0 else 0)


def _follows(m, fn, change, x) -> None:
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    torch.testing.assert_close(compiled(x), fn(x))
    change()
    torch.testing.assert_close(compiled(x), fn(x))


def test_tying_two_children_between_calls_is_seen() -> None:
    m = Pair()
    _follows(m, m, lambda: setattr(m, "l1", m.l0), torch.ones(1, 2))


def test_untying_two_children_between_calls_is_seen() -> None:
    m = Pair()
    m.l1 = m.l0
    _follows(m, m, lambda: setattr(m, "l1", nn.Linear(2, 2)), torch.ones(1, 2))


def test_a_global_holder_switched_to_another_instance() -> None:
    a, b = nn.ReLU(), nn.ReLU()
    holder = {"m": a}

    def f(x):
        return x * (1 if holder["m"] is a else 5)
    _follows(None, f, lambda: holder.__setitem__("m", b), torch.ones(2))


def test_membership_of_a_module_in_a_list_of_modules() -> None:
    a, b, c = nn.Tanh(), nn.Tanh(), nn.Tanh()
    chosen = [a]

    def f(x):
        return x * (10 if chosen[0] in [b, c] else 1) + len({a, b, chosen[0]})
    _follows(None, f, lambda: chosen.__setitem__(0, b), torch.ones(2))
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["graph_breaks"] == 0, kiln.stats()


def test_a_dict_from_outside_keyed_by_modules() -> None:
    a, b = nn.ReLU(), nn.Tanh()
    table = {a: 1.0, b: 2.0}

    def f(x):
        return x * table[a] + x * table.get(b, 0.5) + (10 if b in table else 0)
    _follows(None, f, lambda: table.__setitem__(a, 7.0), torch.ones(2))
    _follows(None, f, lambda: table.pop(b), torch.ones(2))
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["graph_breaks"] == 0, kiln.stats()
