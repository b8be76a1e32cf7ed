"""Module containers sliced or indexed by a symbolic int (dynamic=True, or an int argument made dynamic
after it changed): the children picked depend on the value, so the bounds are specialized (guarded)
and the loop over the children is traced in one graph, as torch.compile does.

Held-out Cohere under dynamic=True broke 7 times at `for layer in self.layers[: config.num_hidden_layers]`
(the slice's symbolic bound was read as a constant) where torch.compile makes one graph.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from torch_oracle import torch_graph_count


class Stack(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        layers = [torch.nn.Linear(4, 4) for _ in range(4)]
        self.kind = kind
        if kind == "sequential":
            self.layers: torch.nn.Module = torch.nn.Sequential(*layers)
        elif kind == "parameters":
            self.layers = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(4, 4)) for _ in range(4))
        else:
            self.layers = torch.nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, n: int, how: str) -> torch.Tensor:
        if how == "stop":
            picked = self.layers[:n]
        elif how == "start":
            picked = self.layers[n:]
        elif how == "step":
            picked = self.layers[::n]
        elif how == "negative":
            picked = self.layers[-n:]
        else:
            picked = [self.layers[n], self.layers[n - 1]]
        for layer in picked:
            x = x @ layer if self.kind == "parameters" else layer(x)
        return x


KINDS = ("list", "sequential", "parameters")
HOWS = ("stop", "start", "step", "negative", "index")


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("kind", KINDS)
def test_symbolic_slice_of_a_module_container(kind: str, how: str, dynamic: bool | None) -> None:
    torch.manual_seed(0)
    model = Stack(kind)
    calls = [(torch.randn(2, 4), 2, how), (torch.randn(2, 4), 3, how), (torch.randn(2, 4), 2, how)]
    kiln.reset()
    try:
        compiled = kiln.compile(model, dynamic=dynamic, backend="eager")
        for x, n, h in calls:
            torch.testing.assert_close(compiled(x, n, h), model(x, n, h))
        stats = kiln.stats()
    finally:
        kiln.reset()
    assert stats["graph_breaks"] == 0 and stats["fallbacks"] == 0, stats
    # one graph per value of n (2, 3): torch.compile's count on every case of this matrix (recorded
    # with tests/torch_oracle.py; test_the_count_is_torch_compiles reruns one)
    assert stats["graphs"] == 2, stats


def test_the_count_is_torch_compiles() -> None:
    torch.manual_seed(0)
    model = Stack("list")
    calls = [(torch.randn(2, 4), 2, "stop"), (torch.randn(2, 4), 3, "stop"), (torch.randn(2, 4), 2, "stop")]
    assert torch_graph_count(model, calls, dynamic=True) == 2


def test_a_config_bound_under_dynamic_true_is_one_graph() -> None:
    """The Cohere shape: the bound is an int attribute of a config object."""

    class Config:
        def __init__(self) -> None:
            self.num_layers = 2

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = Config()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers[: self.config.num_layers]:
                x = torch.relu(layer(x))
            return x

    model = Decoder()
    kiln.reset()
    try:
        compiled = kiln.compile(model, dynamic=True)
        for rows in (2, 5):
            x = torch.randn(rows, 4)
            torch.testing.assert_close(compiled(x), model(x))
        model.config.num_layers = 3  # the specialized bound is guarded: a new value recompiles
        x = torch.randn(3, 4)
        torch.testing.assert_close(compiled(x), model(x))
        stats = kiln.stats()
    finally:
        kiln.reset()
    assert stats["graph_breaks"] == 0 and stats["fallbacks"] == 0, stats
