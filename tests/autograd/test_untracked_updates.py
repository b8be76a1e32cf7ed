"""Batch norm's running statistics keep eager's version counters under Kiln.

Eager's batch norm writes running_mean/running_var inside its kernel, an op that is neither in-place
nor out=, so autograd never counts the write: their `_version` stays put step after step (only
`num_batches_tracked += 1` counts). Kiln functionalizes the update and copies the new values back
after the graph; that copy used to move both counters once per call. Each case runs a few steps
and compares how far every tensor's counter moved with eager's, and the values.

Found here: issue 30 (the copy back in kiln.runtime.aot moved the counters once per train step).
"""
from __future__ import annotations

import copy
from typing import Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln

pytestmark = pytest.mark.cpp


def _functional(bn: nn.BatchNorm2d) -> Callable:
    def step(x):
        return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, True, 0.1, 1e-5).relu()
    return step


def _torch_batch_norm(bn: nn.BatchNorm2d) -> Callable:
    def step(x):
        return torch.batch_norm(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, True, 0.2, 1e-5,
                                False) * 2
    return step


def _module(bn: nn.BatchNorm2d) -> Callable:
    return lambda x: bn(x) + 1


def _also_added_to(bn: nn.BatchNorm2d) -> Callable:
    # the running mean is also updated by a visible in-place op: eager counts that one
    def step(x):
        out = bn(x)
        with torch.no_grad():
            bn.running_mean.add_(1)
        return out
    return step


def _mean_through_a_view(bn: nn.BatchNorm2d) -> Callable:
    # the statistics are views of one buffer: the update reaches it through them, uncounted
    def step(x):
        return F.batch_norm(x, bn.stats[0], bn.stats[1], bn.weight, bn.bias, True, 0.1, 1e-5)
    return step


STEPS: dict[str, Callable[[nn.BatchNorm2d], Callable]] = {
    "functional": _functional, "torch_batch_norm": _torch_batch_norm, "module": _module,
    "also_added_to": _also_added_to, "mean_through_a_view": _mean_through_a_view,
}


def _state(bn: nn.Module) -> dict[str, torch.Tensor]:
    return dict(bn.named_buffers())


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("kind", list(STEPS))
def test_running_statistics_versions_move_as_eager(kind: str, grad: bool) -> None:
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(6)
    bn.register_buffer("stats", torch.stack([torch.zeros(6), torch.ones(6)]))
    reference = copy.deepcopy(bn)
    compiled, eager = kiln.compile(STEPS[kind](bn)), STEPS[kind](reference)
    kiln.reset()
    try:
        for step in range(3):
            x = torch.randn(4, 6, 5, 5) * (step + 1) + step
            before = {n: t._version for n, t in _state(bn).items()}, {n: t._version for n, t in _state(reference).items()}
            with torch.set_grad_enabled(grad):
                got, want = compiled(x), eager(x)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            for name, t in _state(bn).items():
                torch.testing.assert_close(t, _state(reference)[name], msg=lambda m: f"{name}: {m}")
            moved = {n: t._version - before[0][n] for n, t in _state(bn).items()}
            want_moved = {n: t._version - before[1][n] for n, t in _state(reference).items()}
            assert moved == want_moved, f"step {step}"
    finally:
        kiln.reset()


def test_instance_norm_statistics_move_as_eager() -> None:
    # eager's instance norm writes its running statistics with a copy_ it counts: once per call
    torch.manual_seed(0)
    norm = nn.InstanceNorm2d(5, track_running_stats=True)
    reference = copy.deepcopy(norm)
    compiled = kiln.compile(norm)
    kiln.reset()
    try:
        for step in range(2):
            x = torch.randn(3, 5, 4, 4) + step
            before = norm.running_mean._version, reference.running_mean._version
            torch.testing.assert_close(compiled(x), reference(x), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(norm.running_var, reference.running_var)
            assert norm.running_mean._version - before[0] == reference.running_mean._version - before[1] == 1
    finally:
        kiln.reset()


def test_a_saved_statistic_is_still_read_after_the_update_as_eager_reads_it() -> None:
    """An eval-mode step saves running_var for its backward; a train-mode step then updates it.
    Eager's backward does not object (the write is uncounted) and reads the updated values; so
    must the compiled one."""
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(4)
    reference = copy.deepcopy(bn)
    compiled = kiln.compile(lambda x: bn(x).square().sum())
    kiln.reset()
    try:
        grads = []
        first, second = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3) * 3
        for module, run in ((bn, compiled), (reference, lambda x: reference(x).square().sum())):
            x = first.clone().requires_grad_()
            module.eval()
            loss = run(x)
            module.train()
            run(second)
            loss.backward()
            grads.append(x.grad)
        torch.testing.assert_close(grads[0], grads[1])
    finally:
        kiln.reset()
