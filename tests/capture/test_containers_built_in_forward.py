"""nn.Sequential / nn.ModuleList built inside a forward from modules the frame holds
(`nn.Sequential(self.a, nn.GELU(), self.b)(x)`): captured without a graph break, the children read
as the trace's own variables (a child from outside keeps its source, so its parameters stay graph
inputs: gradients reach them and a parameter replaced between calls is seen). A container kept
after the frame (stored, returned) or changed in it (append) is refused, not answered from the
container made at trace time."""
from __future__ import annotations

import torch
from torch import nn

import kiln
from eager_compare import run


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 3)
        self.b = nn.Linear(3, 2)

    def forward(self, x):
        s = nn.Sequential(self.a, nn.GELU(), self.b)
        return s(x) + s[0:1](x).sum() + len(s)


def test_sequential_of_children_with_gradients() -> None:
    torch.manual_seed(0)
    eager = Block()
    mine = Block()
    mine.load_state_dict(eager.state_dict())
    kiln.reset()
    compiled = kiln.compile(mine, backend="eager", fullgraph=True)
    x = torch.randn(4, 2)
    want, got = eager(x), compiled(x)
    torch.testing.assert_close(got, want)
    want.pow(2).sum().backward()
    got.pow(2).sum().backward()
    for p, q in zip(eager.parameters(), mine.parameters()):
        torch.testing.assert_close(q.grad, p.grad)


def test_a_parameter_replaced_between_calls_is_seen() -> None:
    m = Block()
    kiln.reset()
    compiled = kiln.compile(m, backend="eager", fullgraph=True)
    x = torch.ones(1, 2)
    torch.testing.assert_close(compiled(x), m(x))
    m.a.weight = nn.Parameter(torch.full((3, 2), 2.0))
    torch.testing.assert_close(compiled(x), m(x))


def test_module_list_built_from_an_argument_choice_and_nested_sequential() -> None:
    torch.manual_seed(0)
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)

    def f(x, flip: bool):
        ls = nn.ModuleList([b, a] if flip else [a, b])
        for layer in ls:
            x = layer(x)
        outer = nn.Sequential(nn.Sequential(a, nn.Tanh()), b)
        return x + ls[-1](x), len(ls), outer(x), [type(c).__name__ for c in outer]
    run(f, [(torch.ones(1, 2), False), (torch.ones(1, 2), True)])


def test_a_built_container_kept_or_changed_is_not_answered_from_the_trace_time_one() -> None:
    a = nn.Linear(2, 2)

    def appended(x):
        ls = nn.ModuleList([a])
        ls.append(nn.ReLU())
        for layer in ls:
            x = layer(x)
        return x, len(ls)

    def returned(x):
        s = nn.Sequential(a, nn.ReLU())
        return s(x), s

    def used(x):
        return nn.Sequential(a, nn.ReLU())(x)

    x = torch.full((1, 2), -3.0)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(used, backend="eager")(x), used(x))
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["fallbacks"] == 0, kiln.stats()
    kiln.reset()
    got, want = kiln.compile(appended, backend="eager")(x), appended(x)
    torch.testing.assert_close(got, want)
    for _ in range(2):
        out, s = kiln.compile(returned, backend="eager")(x)
        torch.testing.assert_close(out, returned(x)[0])
        assert s[0] is a
    a2 = kiln.compile(returned, backend="eager")(x)[1]
    assert a2 is not s  # a new container on each call, as in eager
