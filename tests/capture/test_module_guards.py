"""nn.Module guards: a module is guarded by type and by what the trace read from it, not by identity,
so two instances of one class share a graph (as torch.compile, which inlines built-in modules and
reads parameters as inputs), while a changed flag, hyperparameter or structure still recompiles.
The expected counts are torch.compile 2.13's with a counting backend (checked by the slow
test_module_counts_match_torch_compile_oracle)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kiln


class MLP(nn.Module):
    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 2)
        self.scale = scale

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) * self.scale


def call_model(m, x):
    return m(x)


class Counter:
    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm


def kiln_counts(scenario):
    kiln.reset()
    counter = Counter()
    with kiln.config.patch(suppress_errors=False):
        scenario(lambda fn: kiln.compile(fn, backend=counter))
    return counter.graphs


def two_linears(compile_):
    torch.manual_seed(0)
    l1, l2, x = nn.Linear(4, 4), nn.Linear(4, 4), torch.randn(3, 4)
    f = compile_(call_model)
    for m in (l1, l2, l1, l2):
        torch.testing.assert_close(f(m, x), m(x))


def two_mlps(compile_):
    torch.manual_seed(0)
    m1, m2, x = MLP(), MLP(), torch.randn(3, 4)
    f = compile_(call_model)
    for m in (m1, m2, m1, m2):
        torch.testing.assert_close(f(m, x), m(x))


def two_compiled_mlps(compile_):
    torch.manual_seed(0)
    m1, m2, x = MLP(), MLP(), torch.randn(3, 4)
    c1, c2 = compile_(m1), compile_(m2)
    for c, m in ((c1, m1), (c2, m2), (c1, m1), (c2, m2)):
        torch.testing.assert_close(c(x), m(x))


def eval_then_train(compile_):
    m, x = MLP(), torch.randn(3, 4)
    c = compile_(m)
    c(x)
    m.eval()
    c(x)
    m.train()
    c(x)


def changed_hyperparameter(compile_):
    m, x = MLP(), torch.randn(3, 4)
    c = compile_(m)
    torch.testing.assert_close(c(x), m(x))
    m.scale = 3.0
    torch.testing.assert_close(c(x), m(x))
    m.scale = 2.0
    torch.testing.assert_close(c(x), m(x))


# torch.compile 2.13 (backend=counting) gives these graph counts on the same scenarios.
SCENARIOS = [(two_linears, 1), (two_mlps, 1), (two_compiled_mlps, 1), (eval_then_train, 1),
             (changed_hyperparameter, 2)]


@pytest.mark.parametrize("scenario,expected", SCENARIOS, ids=[s.__name__ for s, _ in SCENARIOS])
def test_module_compile_counts_match_torch_compile(scenario, expected):
    assert kiln_counts(scenario) == expected


def test_instance_with_other_constants_does_not_reuse_graph():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    m1, m2 = MLP(scale=2.0), MLP(scale=5.0)
    f = kiln.compile(call_model, backend="eager")
    kiln.reset()
    torch.testing.assert_close(f(m1, x), m1(x))
    torch.testing.assert_close(f(m2, x), m2(x))


def test_instance_with_other_structure_or_hooks_does_not_reuse_graph():
    class Stack(nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(n))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(0)
    x = torch.randn(2, 4)
    kiln.reset()
    f = kiln.compile(call_model, backend="eager")
    s2, s3 = Stack(2), Stack(3)
    torch.testing.assert_close(f(s2, x), s2(x))
    torch.testing.assert_close(f(s3, x), s3(x))
    hooked = Stack(2)
    hooked.layers[0].register_forward_hook(lambda mod, inp, out: out * 0)
    torch.testing.assert_close(f(hooked, x), hooked(x))
    shadowed = Stack(2)
    shadowed.forward = lambda x: x - 1  # an instance attribute hides the class's forward
    torch.testing.assert_close(f(shadowed, x), shadowed(x))


@pytest.mark.slow
def test_module_counts_match_torch_compile_oracle():
    def torch_counts(scenario):
        torch._dynamo.reset()
        counter = Counter()
        scenario(lambda fn: torch.compile(fn, backend=counter))
        return counter.graphs

    for scenario, expected in SCENARIOS:
        assert torch_counts(scenario) == expected, scenario.__name__
