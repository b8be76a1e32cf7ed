"""Workload: a compiled SGD step with momentum over eight Linear layers (benchmarks.optimizer_step,
with SGD: the momentum buffers are created by the first step, so the second differs from it)."""
from __future__ import annotations

import torch

from benchmarks.optimizer_step import optimizer_case
from benchmarks.workload import Case

NAME = "sgd_step"
DESCRIPTION = "compiled SGD(momentum).step, 8 Linear layers"


def build(quick: bool) -> Case:
    return optimizer_case(lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9), quick)
