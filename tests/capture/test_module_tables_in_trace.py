"""A module whose parameters, buffers or submodules change inside the compiled forward
(`register_buffer` on the first call, `self.buf = ...` through Module.__setattr__, a ModuleList
appended to): later reads in the same trace see the change, and what asks the real tables
(`buffers()`, `named_parameters()`, iterating a container) never answers from the tables as they
were before it. Compared with eager over several calls, and the module's state after them."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kiln


class RegistersOnFirstCall(nn.Module):
    def forward(self, x):
        if not hasattr(self, "cache"):
            self.register_buffer("cache", x.clone())
        return x + self.cache


class RegistersThenCounts(nn.Module):
    def forward(self, x):
        if "acc" not in self._buffers:
            self.register_buffer("acc", torch.zeros_like(x), persistent=False)
        self.acc.add_(x)
        return self.acc + 1, len(list(self.buffers())), [n for n, _ in self.named_buffers()]


class RegistersThenCountsWithoutReading(nn.Module):
    def forward(self, x):
        if "acc" not in self._buffers:
            self.register_buffer("acc", torch.zeros_like(x), persistent=False)
        return x + 1, len(list(self.buffers())), [n for n, _ in self.named_buffers()]


class RegistersParameterThenCounts(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x):
        if not hasattr(self, "extra"):
            self.register_parameter("extra", nn.Parameter(torch.ones(3)))
        return self.inner(x) * self.extra, sum(p.numel() for p in self.parameters())


class ChildRegisters(nn.Module):
    def __init__(self):
        super().__init__()
        self.child = RegistersOnFirstCall()

    def forward(self, x):
        y = self.child(x)
        return y, [n for n, _ in self.named_buffers()]


class AssignsRegisteredBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(3))

    def forward(self, x):
        self.state = self.state + x
        return self.state * 2


class FillsNoneBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("maybe", None)

    def forward(self, x):
        if self.maybe is None:
            self.maybe = x.detach() * 3
        return x + self.maybe


class AppendsToModuleList(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Identity()])

    def forward(self, x):
        if len(self.blocks) < 3:
            self.blocks.append(nn.ReLU())
        for b in self.blocks:
            x = b(x) + 1
        return x, len(self.blocks)


MODULES = [RegistersOnFirstCall, RegistersThenCounts, RegistersThenCountsWithoutReading, RegistersParameterThenCounts, ChildRegisters,
           AssignsRegisteredBuffer, FillsNoneBuffer, AppendsToModuleList]


def _same(got, expected):
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected)
    elif isinstance(expected, (tuple, list)):
        assert type(got) is type(expected) and len(got) == len(expected)
        for g, e in zip(got, expected):
            _same(g, e)
    else:
        assert got == expected


@pytest.mark.parametrize("backend", ["eager", "default"])
@pytest.mark.parametrize("cls", MODULES, ids=[c.__name__ for c in MODULES])
def test_as_eager_over_calls(cls, backend):
    kiln.reset()
    torch.manual_seed(0)
    mine = cls()
    torch.manual_seed(0)
    theirs = cls()
    compiled = kiln.compile(mine) if backend == "default" else kiln.compile(mine, backend="eager")
    for _ in range(3):
        x = torch.randn(3)
        with torch.no_grad():
            _same(compiled(x), theirs(x))
    assert list(mine.state_dict()) == list(theirs.state_dict())
    for (name, a), b in zip(mine.state_dict().items(), theirs.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


def test_a_read_after_register_buffer_stays_in_the_graph():
    kiln.reset()
    compiled = kiln.compile(RegistersOnFirstCall(), backend="eager")
    compiled(torch.randn(3))
    assert kiln.stats()["graph_breaks"] == 0
