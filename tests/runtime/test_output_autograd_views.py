"""A compiled graph's results are autograd views where eager's are, and only there.

A wrapper hands out some results as views of its own buffers (a 3-d matmul computed as a 2-d mm
and viewed back, a slice of a larger buffer, a detached result): eager's results of those ops are no
views. Autograd treats a view differently, so before kiln.runtime.aot.not_views an in-place op on
such a result raised where eager's runs: "Output 0 of CompiledFunction is a view and is being
modified inplace" (a training graph), or "A view was created in no_grad mode and is being modified
inplace with grad mode enabled" (an evaluation call whose result is updated later). Found by the
grad-modes x externs sweep (tests/runtime/test_grad_modes_x_externs.py). Every runtime tier: the
Python wrapper, the native plan, and reduce-overhead.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn

import kiln
from kiln import config
from kiln.log import KilnWarning

pytestmark = pytest.mark.cpp


def _programs() -> dict[str, tuple[Callable[[], Any], Callable[[Any, torch.Tensor], torch.Tensor]]]:
    """name: (a factory of the module, what the compiled function returns)."""
    return {
        "matmul_3d": (lambda: nn.Linear(8, 5, bias=False), lambda m, x: x @ m.weight.t()),
        "linear_3d": (lambda: nn.Linear(8, 5), lambda m, x: m(x)),
        "lstm": (lambda: nn.LSTM(8, 5, batch_first=True), lambda m, x: m(x)[0]),
        "detached": (lambda: nn.Linear(8, 5), lambda m, x: m(x).detach() * 1 + m(x).detach()[..., :3].sum()),
        "slice_of_buffer": (lambda: nn.Linear(8, 6), lambda m, x: m(x).relu()[..., 1:4]),
    }


PROGRAMS = _programs()
TIERS = {"python": dict(cpu_wrapper="python"), "plan": dict(cpu_wrapper="native", native_plan=True)}


def _run(fn: Callable, model: nn.Module, x: torch.Tensor, weight: torch.Tensor) -> list[Any]:
    """A result modified in place, then a backward; an evaluation result updated later with grad on."""
    facts: list[Any] = []
    for evaluate in (False, True):
        try:
            if evaluate:
                with torch.no_grad():
                    out = fn(x)
                out.mul_(weight)  # grad on: the result now carries a history through `weight`
            else:
                out = fn(x)
                out.add_(1)
            # a training graph's results are never views: an in-place op on eager's view is fine, on a
            # view made inside the compiled autograd.Function it raises (eager's linear on 3-d input
            # gives one, compiled the same result comes back as no view)
            facts.append((out._is_view() if evaluate else None, out.requires_grad, out.detach().clone()))
            out.square().sum().backward()
            facts.append([p.grad.clone() for p in (*model.parameters(), weight) if p.grad is not None])
        except RuntimeError as exc:  # the gist: a version counter's message names sizes and versions
            facts.append(("raised", str(exc).split(":")[0]))
        for p in (*model.parameters(), weight):
            p.grad = None
    return facts


@pytest.mark.parametrize("tier", list(TIERS))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_a_result_modified_in_place_is_eagers(name: str, tier: str) -> None:
    kiln.reset()
    torch.manual_seed(0)
    make, body = PROGRAMS[name]
    model = make()
    x = torch.randn(2, 4, 8)
    weight = torch.rand(1, requires_grad=True)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return body(model, t)

    expected = _run(fn, model, x, weight)
    with config.patch(**TIERS[tier]), warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        compiled = kiln.compile(fn)
        got = _run(compiled, model, x, weight)
        got_again = _run(compiled, model, x, weight)  # the cached graphs
    for result in (got, got_again):
        assert len(result) == len(expected)
        for e, g in zip(expected, result):
            assert type(g) is type(e), (g, e)
            if isinstance(e, tuple) and e[0] == "raised":
                assert g == e
                continue
            if isinstance(e, tuple):
                assert g[:2] == e[:2], f"(is view, requires grad): compiled {g[:2]}, eager {e[:2]}"
            for a, b in zip(e[-1:] if isinstance(e, tuple) else e, g[-1:] if isinstance(g, tuple) else g):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_reduce_overhead_result_modified_in_place() -> None:
    kiln.reset()
    torch.manual_seed(0)
    model = nn.Linear(8, 5)
    x = torch.randn(3, 4, 8)
    compiled = kiln.compile(model, mode="reduce-overhead")
    for _ in range(2):
        expected, got = model(x), compiled(x)
        assert not got._is_view()
        expected.add_(1)
        got.add_(1)
        torch.testing.assert_close(got, expected)
        got.sum().backward()
