"""`del self.name` in a module's forward, for a plain attribute (outside the parameter, buffer and
submodule tables): nn.Module.__delattr__ hands it to object.__delattr__, so it leaves the instance
dict. Captured as a side effect replayed after the graph, not a graph break: later reads in the same
trace miss it (hasattr False, a read raises AttributeError, getattr's default answers), setting it
again wins, and the next call (where it is gone) recompiles on its absence."""
from __future__ import annotations

import torch
from torch import nn

import kiln


def _compare(make, calls: int = 3) -> None:
    eager, compiled_module = make(), make()
    kiln.reset()
    compiled = kiln.compile(compiled_module, backend="eager", fullgraph=True)
    for i in range(calls):
        x = torch.full((2,), float(i))
        torch.testing.assert_close(compiled(x), eager(x))
        assert sorted(vars(compiled_module)) == sorted(vars(eager))
        assert {k: v for k, v in vars(compiled_module).items() if not k.startswith("_")}.keys() == \
            {k: v for k, v in vars(eager).items() if not k.startswith("_")}.keys()
    assert kiln.stats()["graph_breaks"] == 0


class Once(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flag = 1

    def forward(self, x):
        if hasattr(self, "flag"):
            del self.flag
            return x + 1
        return x - 1


def test_delete_a_plain_attribute_once() -> None:
    _compare(Once)


def test_reads_after_the_deletion_in_the_same_call() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cache = torch.ones(2)

        def forward(self, x):
            y = x
            if hasattr(self, "cache"):
                y = y + self.cache
                del self.cache
            y = y + (10 if hasattr(self, "cache") else 20) + getattr(self, "cache", torch.zeros(2))
            try:
                self.cache
            except AttributeError:
                y = y * 2
            return y
    _compare(M)


def test_set_again_after_the_deletion() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def forward(self, x):
            n = self.n
            del self.n
            self.n = n + 1
            return x * self.n
    _compare(M)


def test_deleting_a_missing_attribute_raises_as_in_eager() -> None:
    class M(nn.Module):
        def forward(self, x):
            try:
                del self.missing
            except AttributeError:
                return x + 5
            return x
    _compare(M, calls=1)
