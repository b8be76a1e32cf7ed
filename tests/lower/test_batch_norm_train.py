"""Train-mode BatchNorm lowered to Kiln's own kernels (no ATen call): the forward's per-channel
statistics, its normalize with what follows fused in, the running statistics' update, and the
backward's two per-channel sums and its input gradient, in NCHW and channels-last, compiled against
eager in each grad mode (backward, no_grad inside the compiled function with parameters that
require grad, inference_mode), across eval/train switches.

Found here: the training forward and backward were ATen externs, ~22% of a DenseNet-style training
step; and once they were Kiln's kernels, a channels-last input summed each channel with a stride of
C floats (a loop per channel over the whole activation: 3-6x slower than eager) until the scheduler
learnt to run such a sum along the rows (kiln.lower.schedule.reads_across).
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn

import kiln
from tests.lower.conftest import check

aten = torch.ops.aten

pytestmark = pytest.mark.cpp

LAYOUTS = ["nchw", "channels_last"]


def _laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else t.contiguous()


def _stats(c: int) -> list[torch.Tensor]:
    """weight, bias, running mean, running var"""
    return [torch.rand(c) + 0.5, torch.randn(c), torch.randn(c) * 0.1, torch.rand(c) + 0.5]


def _forward(x, w, b, mean, var):
    out, save_mean, save_rstd, new_mean, new_var = aten._native_batch_norm_legit_functional(
        x, w, b, mean, var, True, 0.1, 1e-5)
    return torch.relu(out), save_mean, save_rstd, new_mean, new_var


def _backward(grad, x, w, mean, var, save_mean, save_rstd):
    return tuple(aten.native_batch_norm_backward(grad, x, w, mean, var, save_mean, save_rstd, True, 1e-5,
                                                 [True, True, True]))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_training_forward_is_kiln_kernels(layout: str) -> None:
    x = _laid_out(torch.randn(4, 16, 12, 12) * 2 + 1, layout)
    compiled = check(_forward, x, *_stats(16), atol=1e-5, rtol=1e-5)
    assert compiled.extern_count == 0, compiled.wrapper_source
    out = compiled(x, *_stats(16))[0]
    assert out.stride() == x.stride()  # eager's layout
    if layout == "channels_last":
        # the statistics summed along the rows, each thread into its own row of accumulators
        assert "col_buf" in compiled.cpp_source
    else:
        # statistics, running-statistics update and normalize + ReLU in one pass per channel
        assert compiled.kernel_count == 1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_training_backward_is_kiln_kernels(layout: str) -> None:
    x = _laid_out(torch.randn(4, 16, 12, 12) * 2 + 1, layout)
    w, _, mean, var = _stats(16)
    save_mean, save_rstd = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False).add(1e-5).rsqrt()
    grad = _laid_out(torch.randn(4, 16, 12, 12), layout)
    compiled = check(_backward, grad, x, w, mean, var, save_mean, save_rstd, atol=1e-5, rtol=1e-5)
    assert compiled.extern_count == 0, compiled.wrapper_source
    if layout == "channels_last":
        assert "col_buf" in compiled.cpp_source


class _ConvBnReLU(nn.Module):
    def __init__(self, bn: nn.Module, inside_no_grad: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, bn.num_features, 3, padding=1, bias=False)
        self.bn = bn
        self.inside_no_grad = inside_no_grad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inside_no_grad:
            with torch.no_grad():
                return torch.relu(self.bn(self.conv(x))) + 1
        return torch.relu(self.bn(self.conv(x))) + 1


BATCH_NORMS: dict[str, Callable[[], nn.Module]] = {
    "default": lambda: nn.BatchNorm2d(8),
    "cumulative_average": lambda: nn.BatchNorm2d(8, momentum=None),
    "no_running_stats": lambda: nn.BatchNorm2d(8, track_running_stats=False),
    "no_affine": lambda: nn.BatchNorm2d(8, affine=False, momentum=0.3),
}
GRAD_MODES = ["grad", "no_grad_inside", "no_grad", "inference_mode"]
# cumulative_average-no_grad_inside-nchw: momentum=None reads num_batches_tracked as a number (a graph
# break inside the no_grad block); the graph before it once ran an out= matmul with grad on
QUICK = {("default", "grad", "nchw"), ("default", "grad", "channels_last"), ("default", "no_grad_inside", "nchw"),
         ("cumulative_average", "no_grad_inside", "nchw"),
         ("cumulative_average", "inference_mode", "channels_last"), ("no_running_stats", "no_grad", "nchw"),
         ("no_affine", "grad", "channels_last")}


def _params() -> list[Any]:
    return [pytest.param(bn, mode, layout, id=f"{bn}-{mode}-{layout}",
                         marks=[] if (bn, mode, layout) in QUICK else [pytest.mark.slow])
            for bn in BATCH_NORMS for mode in GRAD_MODES for layout in LAYOUTS]


def _close(got: Any, want: Any, what: str) -> None:
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("bn,mode,layout", _params())
def test_module_matches_eager_in_each_grad_mode(bn: str, mode: str, layout: str) -> None:
    """Outputs, running statistics, num_batches_tracked (values and how far each step moves their
    version counters) and gradients against eager over train steps with an eval step between them
    (the statistics it reads are the ones the compiled training steps wrote)."""
    torch.manual_seed(0)
    module = _ConvBnReLU(BATCH_NORMS[bn](), inside_no_grad=mode == "no_grad_inside")
    if layout == "channels_last":
        module = module.to(memory_format=torch.channels_last)
    reference = copy.deepcopy(module)
    kiln.reset()
    compiled = kiln.compile(module)
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode)
    try:
        for step, training in enumerate([True, True, False, True]):
            module.train(training)
            reference.train(training)
            x = _laid_out(torch.randn(4, 3, 10, 10) * (step + 1) + step, layout)
            versions = [b._version for b in module.buffers()], [c._version for c in reference.buffers()]
            if context is not None:
                with context():
                    got, want = compiled(x), reference(x)
            else:
                got, want = compiled(x), reference(x)
            _close(got, want, f"output of step {step}")
            assert got.stride() == want.stride()
            assert got.requires_grad == want.requires_grad
            if mode == "grad":
                grad = torch.randn_like(want)
                got.backward(grad)
                want.backward(grad)
                for (name, p), q in zip(module.named_parameters(), reference.parameters()):
                    _close(p.grad, q.grad, f"{name}.grad after step {step}")
            for (name, b), c in zip(module.named_buffers(), reference.buffers()):
                assert b.dtype == c.dtype
                _close(b, c, f"{name} after step {step}")
            moved = ([b._version - v for b, v in zip(module.buffers(), versions[0])],
                     [c._version - v for c, v in zip(reference.buffers(), versions[1])])
            assert moved[0] == moved[1], f"version counters of {[n for n, _ in module.named_buffers()]} at step {step}"
    finally:
        kiln.reset()


@pytest.mark.parametrize("shape", [(4, 6, 5, 5), (8, 6)])
def test_no_running_stats_is_kiln_kernels(shape: tuple[int, ...]) -> None:
    """track_running_stats=False: the statistics-only overload is decomposed the same way."""
    def fn(x, w, b):
        return tuple(aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5))

    compiled = check(fn, torch.randn(shape) * 3 - 1, torch.rand(6) + 0.5, torch.randn(6), atol=1e-5, rtol=1e-5)
    assert compiled.extern_count == 0, compiled.wrapper_source
