"""The compiled backward takes its saved activations over (kernel_wrapper.positional's `steal`): the
runtime hands the wrapper its only references, and the wrapper frees each after its last use, so a
training step's peak memory is lower than when the backward is called with them as arguments (the
activations then live until it returns). Gradients are the same either way."""
from __future__ import annotations

import pytest
import torch

import kiln
from benchmarks.memory import peak_step_bytes
from kiln.runtime import kernel_wrapper

pytestmark = pytest.mark.cpp


def _chain(x: torch.Tensor, ws: list[torch.Tensor]) -> torch.Tensor:
    for w in ws:
        x = torch.tanh(x @ w)  # tanh's backward reads its output: one saved activation per layer
    return x.sum()


def _peak_and_grads() -> tuple[int, list[torch.Tensor]]:
    kiln.reset()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 256, generator=g)
    ws = [(torch.randn(256, 256, generator=g) / 16).requires_grad_() for _ in range(6)]
    compiled = kiln.compile(_chain)

    def step() -> list[torch.Tensor]:
        for w in ws:
            w.grad = None
        compiled(x, ws).backward()
        return [w.grad for w in ws]

    step()
    peak = peak_step_bytes(step)
    # the same again: this profile frees the gradients the last one allocated, and a measurement
    # that counted frees of blocks from before its step (benchmarks.memory) came out lower here
    assert peak_step_bytes(step) == peak
    grads = step()
    kiln.reset()
    assert peak is not None
    return peak, grads


def test_stolen_activations_lower_the_peak_and_keep_the_gradients(monkeypatch) -> None:
    # the Python wrapper's list entry (a graph's plan, which runs from the first call once the
    # boundary extension is built, steals through the extension and is left out here)
    monkeypatch.setattr(kiln.config, "native_plan", False)
    stolen_peak, stolen_grads = _peak_and_grads()

    def without_steal(takes_list):
        return lambda *args: takes_list(list(args))  # no `steal`: the backward gets them as arguments

    monkeypatch.setattr(kernel_wrapper, "positional", without_steal)
    monkeypatch.setattr("kiln.lower.codegen.wrapper.positional", without_steal)
    held_peak, held_grads = _peak_and_grads()
    for a, b in zip(stolen_grads, held_grads):
        torch.testing.assert_close(a, b)
    # six 256 KiB activations: at least two of them are gone by the time the backward peaks
    assert stolen_peak <= held_peak - 2 * 256 * 256 * 4, (stolen_peak, held_peak)
