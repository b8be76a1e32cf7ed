"""Python's protocols on nn.Module instances whose class writes the protocol method itself: truth
(`if self.child:` runs the class's `__bool__`, else its `__len__`), `len(self)`, `for l in self`
(`__iter__`, or the old `__getitem__` protocol), `k in self` (`__contains__`). Each is inlined as
CPython calls it, not answered with nn.Module's defaults (true) nor refused as a graph break; the
class attribute found (or its absence) is guarded, so one added between calls recompiles."""
from __future__ import annotations

import torch
from torch import nn

import kiln
from eager_compare import run


class Bag(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.items = nn.ModuleList([nn.Identity() for _ in range(n)])

    def __len__(self) -> int:
        return len(self.items)

    def forward(self, x):
        return x + len(self)


class Switch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.on = False

    def __bool__(self) -> bool:
        return self.on

    def forward(self, x):
        return x


class Holder(nn.Module):
    def __init__(self, child: nn.Module) -> None:
        super().__init__()
        self.child = child

    def forward(self, x):
        if self.child:
            return x + 100
        return x - 100


def _fullgraph_matches(m: nn.Module, *args) -> None:
    want = m(*args)
    kiln.reset()
    got = kiln.compile(m, backend="eager", fullgraph=True)(*args)
    torch.testing.assert_close(got, want)


def test_truth_of_a_child_through_its_len() -> None:
    for n in (0, 2):
        _fullgraph_matches(Holder(Bag(n)), torch.ones(2))


def test_truth_of_a_child_through_its_bool_follows_its_state_between_calls() -> None:
    m = Holder(Switch())
    compiled = kiln.compile(m, backend="eager", fullgraph=True)
    kiln.reset()
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), m(x))
    m.child.on = True
    torch.testing.assert_close(compiled(x), m(x))
    assert compiled(x)[0].item() == 101.0


def test_truth_of_self_through_len() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.k = 0

        def __len__(self) -> int:
            return self.k

        def forward(self, x):
            return x + (5 if self else -5)
    m = M()
    kiln.reset()
    compiled = kiln.compile(m, backend="eager", fullgraph=True)
    x = torch.zeros(2)
    assert compiled(x)[0].item() == -5.0
    m.k = 3
    assert compiled(x)[0].item() == 5.0


def test_len_iter_getitem_and_contains_written_by_the_class_do_not_break() -> None:
    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ls = nn.ModuleList([nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)])
            self.names = {"a"}

        def __getitem__(self, i):
            return self.ls[i]

        def __len__(self) -> int:
            return len(self.ls)

        def __contains__(self, k) -> bool:
            return k in self.names

        def forward(self, x):
            for i in range(len(self)):
                x = self[i](x)
            for layer in self:  # the old protocol: self[0], self[1], ... until IndexError
                x = layer(x)
            return x + ("a" in self) + 10 * ("z" in self)
    torch.manual_seed(0)
    _fullgraph_matches(Stack(), torch.randn(1, 2))


def test_iter_written_by_the_class() -> None:
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 2)

        def __iter__(self):
            return iter([self.b, self.a])

        def forward(self, x):
            for layer in self:
                x = layer(x) * 2
            return x
    torch.manual_seed(0)
    _fullgraph_matches(Pair(), torch.randn(1, 2))


def test_len_and_bool_of_a_module_in_a_plain_function() -> None:
    bag = Bag(2)
    empty = Bag(0)

    def f(x):
        return x * len(bag), bool(bag), bool(empty), not empty
    run(f, [(torch.ones(2),)], graphs=1)


def test_a_bool_added_to_the_class_between_calls_recompiles() -> None:
    class Child(nn.Module):
        def forward(self, x):
            return x
    m = Holder(Child())
    kiln.reset()
    compiled = kiln.compile(m, backend="eager")
    x = torch.zeros(2)
    assert compiled(x)[0].item() == 100.0
    Child.__bool__ = lambda self: False  # type: ignore[attr-defined]
    assert m(x)[0].item() == -100.0
    assert compiled(x)[0].item() == -100.0


def test_container_index_out_of_range_raises_in_the_frame() -> None:
    ls = nn.ModuleList([nn.ReLU(), nn.Tanh()])
    d = nn.ModuleDict({"a": nn.ReLU()})

    def f(x):
        out = x
        try:
            out = ls[5](x)
        except IndexError as exc:
            out = out + len(str(exc))
        try:
            out = d["zz"](out)
        except KeyError:
            out = out * 3
        return out
    run(f, [(torch.ones(2),)], graphs=1)
