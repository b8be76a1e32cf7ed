"""Workload: a compiled Adam step over eight Linear layers (benchmarks.optimizer_step, with Adam)."""
from __future__ import annotations

import torch

from benchmarks.optimizer_step import optimizer_case
from benchmarks.workload import Case

NAME = "adam_step"
DESCRIPTION = "compiled Adam.step, 8 Linear layers"


def build(quick: bool) -> Case:
    return optimizer_case(lambda params: torch.optim.Adam(params, lr=1e-3), quick)
