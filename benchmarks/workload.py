"""What a benchmark workload is: a `Case` that says what to compile, with which inputs, and how one
step runs (a forward call, a training step: forward, loss, backward, or a step of the workload's own:
an optimizer's `step()`, compiled itself).

Each workload module (benchmarks/<name>.py) defines `NAME`, `DESCRIPTION` and `build(quick) -> Case`.
The runner compiles `case.make_fn()` once per compiler, so Kiln and torch.compile never share a
module object (each gets the same weights from the same seed).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class Case:
    make_fn: Callable[[], Callable]  # a fresh function or nn.Module (same weights every time)
    inputs: Sequence[tuple]  # one argument tuple per call of a step; most workloads have one
    training: bool = False  # the output is a loss: a step also runs backward and returns the grads
    bytes_moved: int | None = None  # input + output bytes of one call, for memory-bound workloads
    rtol: float = 1e-4
    atol: float = 1e-5
    notes: dict = field(default_factory=dict)
    # a step of the workload's own: `custom_step(fn, original)` returns the zero-argument step that
    # calls `fn` (`original` compiled, or `original`) and returns what to compare against eager
    custom_step: Callable[[Callable, Callable], Callable[[], list]] | None = None


def make_step(case: Case, fn: Callable, original: Callable) -> Callable[[], list]:
    """A zero-argument step over every input tuple of `case`, calling `fn` (`original` compiled, or
    `original` itself); returns what it computed, so the runner can compare compiled against eager
    (outputs, and for training the loss and the gradient of every parameter of `original`)."""
    if case.custom_step is not None:
        return case.custom_step(fn, original)
    params = list(original.parameters()) if isinstance(original, torch.nn.Module) else []

    def step() -> list:
        results = []
        for args in case.inputs:
            if case.training:
                for p in params:
                    p.grad = None
                loss = fn(*args)
                loss.backward()
                results.append([loss.detach()] + [p.grad for p in params])
            else:
                results.append(fn(*args))
        return results

    return step


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
