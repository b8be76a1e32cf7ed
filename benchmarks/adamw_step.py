"""Workload: a compiled AdamW step over eight Linear layers (benchmarks.optimizer_step, with AdamW
and weight decay): the optimizer step whose compiled speed the bench compares with torch.compile's."""
from __future__ import annotations

import torch

from benchmarks.optimizer_step import optimizer_case
from benchmarks.workload import Case

NAME = "adamw_step"
DESCRIPTION = "compiled AdamW.step, 8 Linear layers"


def build(quick: bool) -> Case:
    return optimizer_case(lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2), quick)
