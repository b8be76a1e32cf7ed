"""The bench's peak-memory measurement (benchmarks.memory): it sees ATen's CPU allocations, counts
what is live at once rather than what was ever allocated, charges a step nothing for tensors made
before it, and the report prints its table.
"""
from __future__ import annotations

import torch

from benchmarks import report
from benchmarks.memory import peak_of_steps, peak_step_bytes

MB4 = 1 << 20  # float32 elements in 4 MiB


def test_peak_counts_what_is_live_at_once() -> None:
    def two_at_once():
        a, b = torch.ones(MB4), torch.ones(MB4)
        return (a + b).sum()  # a, b and a + b live together

    def one_after_another():
        for _ in range(3):
            torch.ones(MB4).sum()

    assert peak_step_bytes(two_at_once) >= 3 * 4 * MB4
    assert 4 * MB4 <= peak_step_bytes(one_after_another) < 2 * 4 * MB4


def test_a_step_is_not_charged_for_what_existed_before_it() -> None:
    held = [torch.ones(MB4)]

    def frees_an_old_tensor_and_makes_a_small_one():
        held.clear()
        return torch.ones(16)

    peaks = peak_of_steps({"s": frees_an_old_tensor_and_makes_a_small_one})
    assert 64 <= peaks["s"] < 4096


def test_memory_table_prints_each_compiler(capsys) -> None:
    rows = [{"name": "w", "eager_peak_bytes": 3 << 20, "kiln": {"peak_bytes": 2 << 20},
             "torch": {"peak_bytes": 4 << 20}}]
    report.print_memory_table(rows)
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("w "))
    assert line.split() == ["w", "3.00", "2.00", "4.00", "0.50"]
