"""Known bugs planted in Kiln's lowering, for the bisector and minifier tests (test-only).

Each `plant_<name>()` patches one table entry or pass of kiln.lower in this process and returns a
function that undoes it. A repro subprocess plants the same bug first with
`python -c "from tests.debug.planted import plant; plant('wrong_lowering'); ..."`, since a fresh
process has none of the test's patches.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import torch

aten = torch.ops.aten


def plant_wrong_lowering() -> Callable[[], None]:
    """aten.mul.Tensor lowered as an addition."""
    from kiln.lower.lowerings import LOWERINGS

    saved = LOWERINGS[aten.mul.Tensor]
    LOWERINGS[aten.mul.Tensor] = LOWERINGS[aten.add.Tensor]

    def undo() -> None:
        LOWERINGS[aten.mul.Tensor] = saved

    return undo


def plant_dropped_term() -> Callable[[], None]:
    """aten.addcmul's decomposition drops its `value` factor: self + t1 * t2."""
    # `kiln.lower.decompose` is also the name of the pass function: take the module itself
    module = importlib.import_module("kiln.lower.decompose")

    original = module.decomposition_table

    def table() -> dict[Any, Any]:
        out = dict(original())
        out[aten.addcmul.default] = lambda self, t1, t2, value=1: aten.add.Tensor(self, aten.mul.Tensor(t1, t2))
        return out

    module.decomposition_table = table

    def undo() -> None:
        module.decomposition_table = original

    return undo


def plant_broken_fusion() -> Callable[[], None]:
    """A sum fused into a kernel with other nodes computes a max instead (a sum alone is right)."""
    import kiln.lower.pipeline as lower  # the schedule pass calls schedule() by this module's name
    from kiln.lower.ir import Reduction
    from kiln.lower.schedule import Block, Kernel, KernelProgram

    original = lower.schedule

    def schedule(ir: Any, **kwargs: Any) -> Any:
        program = original(ir, **kwargs)
        steps = []
        for step in program.steps:
            if isinstance(step, Kernel) and len(step.nodes) > 1:
                blocks = tuple(Block(b.kind, tuple(
                    dataclasses.replace(n, reduction_type="max")
                    if isinstance(n, Reduction) and n.reduction_type == "sum" else n for n in b.nodes))
                    for b in step.blocks)
                step = dataclasses.replace(step, blocks=blocks)
            steps.append(step)
        return KernelProgram(program.ir, tuple(steps))

    lower.schedule = schedule

    def undo() -> None:
        lower.schedule = original

    return undo


PLANTS = {"wrong_lowering": plant_wrong_lowering, "dropped_term": plant_dropped_term,
          "broken_fusion": plant_broken_fusion}


def plant(name: str) -> Callable[[], None]:
    return PLANTS[name]()
