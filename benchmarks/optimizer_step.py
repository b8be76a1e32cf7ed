"""The compiled-optimizer workloads (benchmarks.adamw_step, adam_step, sgd_step): `compile(opt.step)`
over the parameters of eight Linear layers whose gradients are already there.

Compiling `optimizer.step` is how torch.compile's documentation speeds an optimizer up: one graph
per step that updates every parameter and its state tensors in place, the per-parameter kernels
fused horizontally. The step here is the optimizer's own code, with its default flags (on CPU, the
per-parameter loop: neither `foreach` nor `fused`), so what shows is how a compiler copes with
it: the loop over parameters, the step counter, state created on the first call, and how many
graphs, recompiles and breaks that costs (the compile table prints them beside the times). Each
step returns the parameters and every state tensor, which the runner compares with eager's after
the first step.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn as nn

from benchmarks.workload import Case

LAYERS = 8


def optimizer_case(make_optimizer: Callable[[Sequence[torch.Tensor]], torch.optim.Optimizer], quick: bool) -> Case:
    dim = 64 if quick else 512

    def make_fn() -> Callable[[], object]:
        torch.manual_seed(0)
        params = [p for _ in range(LAYERS) for p in nn.Linear(dim, dim).parameters()]
        g = torch.Generator().manual_seed(1)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        return make_optimizer(params).step

    return Case(make_fn=make_fn, inputs=[()], rtol=1e-4, atol=1e-6, custom_step=optimizer_step)


def optimizer_step(fn: Callable[[], object], original: Callable[[], object]) -> Callable[[], list]:
    """Call `fn` (the compiled or eager `opt.step`); return the parameters and the state tensors of
    `original`'s optimizer (the live tensors: the runner compares them right after the first step)."""
    optimizer: torch.optim.Optimizer = original.__self__  # type: ignore[attr-defined]
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def step() -> list:
        fn()
        state = [v for p in params for v in optimizer.state[p].values() if isinstance(v, torch.Tensor)]
        return params + state

    return step

