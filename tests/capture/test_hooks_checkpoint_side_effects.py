"""torch.utils.checkpoint around a body that changes state outside the function (a list a module's
forward hook or the body appends to, a counter attribute, a dict entry): eager runs the body twice,
in the forward and again in the backward to recompute it, so the change happens twice. Kiln inlined
the body into the graph once, so hooks and counters saw one call. Such a checkpoint call now runs
eagerly (as torch.compile's); a body without such writes (a pure hook, a local list) stays one graph.
Oracle: eager for values, gradients of every leaf and the side effects."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import kiln


def _forward_hook_appends(reentrant: bool) -> tuple[Callable, Callable[[], list], list]:
    lin, log = nn.Linear(3, 3), []
    lin.register_forward_hook(lambda m, i, o: log.append(o.shape[0]))

    def f(x):
        return checkpoint(lambda v: lin(v).tanh(), x, use_reentrant=reentrant).sum()
    return f, lambda: list(log), list(lin.parameters())


def _pre_hook_appends(reentrant: bool) -> tuple[Callable, Callable[[], list], list]:
    lin, log = nn.Linear(3, 3), []
    lin.register_forward_pre_hook(lambda m, i: log.append("pre"))

    def f(x):
        return checkpoint(lin, x, use_reentrant=reentrant).sin().sum()
    return f, lambda: list(log), list(lin.parameters())


def _body_appends(reentrant: bool) -> tuple[Callable, Callable[[], list], list]:
    lin, log = nn.Linear(3, 3), []

    def body(v):
        log.append(v.shape[0])
        return lin(v).relu()

    def f(x):
        return checkpoint(body, x, use_reentrant=reentrant).sum()
    return f, lambda: list(log), list(lin.parameters())


class _Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, v):
        self.calls += 1
        return self.lin(v).sigmoid()


def _module_counter(reentrant: bool) -> tuple[Callable, Callable[[], list], list]:
    m = _Counting()

    def f(x):
        return checkpoint(m, x, use_reentrant=reentrant).sum()
    return f, lambda: [m.calls], list(m.parameters())


def _dict_entry(reentrant: bool) -> tuple[Callable, Callable[[], list], list]:
    lin, d = nn.Linear(3, 3), {"n": 0}

    def body(v):
        d["n"] += 1
        return lin(v) * 2

    def f(x):
        return checkpoint(body, x, use_reentrant=reentrant).sum()
    return f, lambda: [d["n"]], list(lin.parameters())


CASES = {"forward_hook_appends": _forward_hook_appends, "pre_hook_appends": _pre_hook_appends,
         "body_appends": _body_appends, "module_counter": _module_counter, "dict_entry": _dict_entry}


def _train(make: Callable, reentrant: bool, compile_with: str | None) -> tuple[Any, ...]:
    torch.manual_seed(0)
    f, read_log, params = make(reentrant)
    if compile_with is not None:
        kiln.reset()
        f = kiln.compile(f, backend=compile_with)
    x = torch.randn(2, 3, requires_grad=True)
    out = f(x)
    after_forward = read_log()
    out.backward()
    return out.detach(), x.grad, [p.grad for p in params], after_forward, read_log()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_side_effects_of_the_recompute_as_eager(name: str, reentrant: bool, backend: str) -> None:
    want = _train(CASES[name], reentrant, None)
    got = _train(CASES[name], reentrant, backend)
    assert want[4] != want[3]  # eager's backward ran the body again
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    torch.testing.assert_close(got[2], want[2])
    assert got[3:] == want[3:]


def test_a_pure_hook_in_the_body_stays_one_graph() -> None:
    lin = nn.Linear(3, 3)
    lin.register_forward_hook(lambda m, i, o: o * 2)

    def f(x):
        acc = []  # a local list: no write outside the function
        acc.append(checkpoint(lin, x, use_reentrant=False))
        return acc[0].tanh().sum()

    x = torch.randn(2, 3, requires_grad=True)
    kiln.reset()
    out = kiln.compile(f, backend="aot_eager", fullgraph=True)(x)
    out.backward()
    want_x = x.detach().clone().requires_grad_()
    f(want_x).backward()
    torch.testing.assert_close(x.grad, want_x.grad)
    assert kiln.stats()["graphs"] == 1


def test_the_break_names_the_write() -> None:
    f, _read_log, _params = _body_appends(False)
    kiln.reset()
    with pytest.raises(kiln.errors.GraphBreakError, match="changes state outside the function"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(2, 3, requires_grad=True))
