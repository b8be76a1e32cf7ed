"""reversed() of torch's indexed module containers (kiln/capture/variables/builtin.py): a
ModuleList, Sequential or ParameterList is walked back to front inside the graph, as
torch.compile does (it was a graph break, and the for loop over the reversed object after it
ran the rest of the frame eagerly). A subclass indexing its own way is not assumed to follow."""
from __future__ import annotations

import torch
import torch.nn as nn

import kiln
from trace_oracle import check_traced, fresh

X = torch.arange(4.0).view(2, 2)


def _layers() -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList(nn.Linear(2, 2) for _ in range(3))


def test_reversed_module_list_with_enumerate() -> None:
    layers = _layers()

    def f(x):
        for i, layer in enumerate(reversed(layers)):
            x = layer(x) + i
        return x
    check_traced(f, fresh(X))


def test_reversed_sequential_and_list_of_it() -> None:
    seq = nn.Sequential(*_layers())

    def f(x):
        order = list(reversed(seq))
        for layer in order:
            x = layer(x).relu()
        return x, len(order)
    check_traced(f, fresh(X))


def test_reversed_parameter_list() -> None:
    params = nn.ParameterList(nn.Parameter(torch.full((2,), float(k))) for k in range(1, 4))

    def f(x):
        for p in reversed(params):
            x = x * p - 1
        return x
    check_traced(f, fresh(X))


def test_subclass_with_its_own_getitem_matches_eager() -> None:
    class Doubled(nn.ModuleList):
        def __getitem__(self, idx):
            return nn.Sequential(super().__getitem__(idx), super().__getitem__(idx))

    layers = Doubled(_layers())

    def f(x):
        for layer in reversed(layers):
            x = layer(x)
        return x
    kiln.reset()
    expected = f(X.clone())
    got = kiln.compile(f, backend="eager")(X.clone())
    torch.testing.assert_close(got, expected)
