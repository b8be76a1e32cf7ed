"""Accuracy of var/std/var_mean and of the norms' statistics (which lower through the same two
passes) where the variance is tiny against the square of the mean: a dim of 2 to 8, values around
100 or 1000 with a small spread, rows and columns, channels-last, keepdim, several dims. The float
mean's rounding error m - mean adds n * (m - mean)^2 to the sum of squared deviations; over a dim
of 2 that lost 3e-4 relative (eager's Welford in double: 6e-8). The bound is against float64."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from .conftest import compile_fn

pytestmark = pytest.mark.cpp

REL = 1e-6
aten = torch.ops.aten


def _error(fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> float:
    """The largest relative error of the compiled fn(x)'s outputs against fn over x in float64."""
    got = compile_fn(fn, x)(x)
    want = fn(x.double())
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    errors = []
    for g, w in zip(got, want):
        assert g.shape == w.shape
        errors.append(((g.double() - w).abs() / w.abs().clamp_min(1e-30)).max().item())
    return max(errors)


def _near(shape: tuple[int, ...], mean: float, spread: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * spread + mean


def test_std_over_a_dim_of_two_channels_last() -> None:  # the report's repro
    x = _near((2, 4, 2500, 50), 0.0, 1.0).contiguous(memory_format=torch.channels_last)
    assert _error(lambda t: t.std(0), x) < REL


def test_std_over_a_dim_of_two_large_mean() -> None:
    x = _near((2, 4, 2500, 50), 1000.0, 1.0).contiguous(memory_format=torch.channels_last)
    assert _error(lambda t: t.std(0), x) < REL


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_var_over_a_short_dim(n: int) -> None:
    x = _near((n, 40000), 100.0, 1e-2, seed=n)
    assert _error(lambda t: t.var(0), x) < REL


@pytest.mark.parametrize("correction", [0, 1])
def test_row_and_column_var_small_spread(correction: int) -> None:
    x = _near((64, 4096), 1000.0, 1e-3)
    assert _error(lambda t: t.var(1, correction=correction), x) < REL
    assert _error(lambda t: t.std(0, correction=correction), x.t().contiguous()) < REL


def test_var_mean_keepdim_and_unbiased() -> None:
    x = _near((3, 50000), 1000.0, 1e-2)
    assert _error(lambda t: torch.var_mean(t, 0, correction=0, keepdim=True), x) < REL
    assert _error(lambda t: aten.var.dim(t, [0], True, False), x) < REL


def test_var_over_several_dims() -> None:
    x = _near((2, 3, 4000, 2), 500.0, 1e-2)
    assert _error(lambda t: t.var((0, 3)), x) < REL
    assert _error(lambda t: t.std((1, 3), keepdim=True), x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)) < REL


def test_layer_norm_statistics() -> None:
    x = _near((20000, 4), 100.0, 1e-2)
    assert _error(lambda t: aten.native_layer_norm(t, [4], None, None, 1e-12)[2], x) < REL


def test_batch_and_group_norm_statistics() -> None:
    x = _near((2, 8, 3, 1), 100.0, 1e-2)  # 6 values per channel, 3 per group of 2 channels... per sample
    assert _error(lambda t: aten.native_batch_norm(t, None, None, None, None, True, 0.1, 1e-12)[2], x) < REL
    y = _near((4000, 4, 1, 1), 100.0, 1e-2)  # groups of 2 channels: a variance over 2 values
    assert _error(lambda t: aten.native_group_norm(t, None, None, 4000, 4, 1, 2, 1e-12)[2], y) < REL
