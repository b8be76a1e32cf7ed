"""Calls of the torch namespace that change (or read) state of the process rather than compute:
torch.set_num_threads, set_float32_matmul_precision, use_deterministic_algorithms, get/set_rng_state.
Each is a graph break run for real where the program runs it, on every call of the compiled code:
as graph nodes they ran once at trace time and were then dropped as dead code.
"""
from __future__ import annotations

import torch

import kiln


def _set_threads(x, n):
    torch.set_num_threads(n)
    return x + 1


def test_set_num_threads_runs_on_every_call() -> None:
    saved = torch.get_num_threads()
    try:
        compiled = kiln.compile(_set_threads, backend="eager")
        compiled(torch.zeros(2), 1)
        torch.set_num_threads(2)
        compiled(torch.zeros(2), 1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(saved)


def _matmul_precision(x):
    torch.set_float32_matmul_precision("medium")
    return x * 2


def test_set_float32_matmul_precision_runs_on_every_call() -> None:
    saved = torch.get_float32_matmul_precision()
    try:
        compiled = kiln.compile(_matmul_precision, backend="eager")
        compiled(torch.zeros(2))
        torch.set_float32_matmul_precision("highest")
        compiled(torch.zeros(2))
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(saved)


def _rewind(x):
    state = torch.get_rng_state()
    a = torch.rand(2)
    torch.set_rng_state(state)
    b = torch.rand(2)
    return x + a - b


def test_set_rng_state_rewinds_the_generator() -> None:
    compiled = kiln.compile(_rewind, backend="eager")
    for _ in range(2):
        torch.manual_seed(0)
        assert torch.equal(compiled(torch.zeros(2)), torch.zeros(2))
