"""Reductions over several dims walk memory along the stride-1 one, and group norm scales each
element with a per-channel factor stored once.

A group norm's statistics of an NHWC activation reduce over (C/G, H*W) where C/G is the stride-1
dim: in the logical order the kernel's vector loop went along H*W, a row apart, or across groups.
And the normalization, left as `(x - mean) * rstd * weight + bias` with rstd lazy, recomputed its
group's rsqrt and divisions for every element (a group norm and SiLU of a 64-channel NHWC
activation ran 2.7x eager's time, 0.5x torch.compile's). Checked on the kernel source and on the
values against eager."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from .conftest import check

pytestmark = pytest.mark.cpp


def _simd_bodies(source: str) -> list[tuple[str, str]]:
    """(loop line, body) of every loop that carries an `omp simd` pragma."""
    lines = source.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.strip().startswith("#pragma omp simd"):
            continue
        depth, body = 0, []
        for following in lines[i + 1:]:
            body.append(following)
            depth += following.count("{") - following.count("}")
            if depth <= 0:
                break
        out.append((lines[i + 1].strip(), "\n".join(body)))
    return out


def _simd_ranges(source: str) -> list[int]:
    return [int(m.group(1)) for loop, _ in _simd_bodies(source)
            for m in [re.match(r"for \(int64_t \w+ = 0; \w+ < (\d+);", loop)] if m]


def _group_norm_silu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(F.group_norm(x, 8, w, b))


@pytest.mark.parametrize("shape,channels_last", [((1, 64, 16, 16), True), ((2, 32, 8, 8), True),
                                                 ((2, 32, 8, 8), False), ((2, 16, 10), False),
                                                 ((1, 16, 4, 4, 4), False)])
def test_group_norm_takes_no_square_root_per_element(shape: tuple[int, ...], channels_last: bool) -> None:
    x = torch.randn(shape) * 3 + 1
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    c = check(_group_norm_silu, x, torch.randn(shape[1]), torch.randn(shape[1]), atol=1e-5, rtol=1e-5)
    bodies = _simd_bodies(c.cpp_source)
    assert bodies, c.cpp_source
    assert not any("sqrt(" in body for _, body in bodies), c.cpp_source


@pytest.mark.parametrize("affine", ["weight_and_bias", "weight", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_group_norm_matches_eager(affine: str, dtype: torch.dtype) -> None:
    x = (torch.randn(2, 12, 5, 3, dtype=dtype) * 4 - 2).to(memory_format=torch.channels_last)
    w = torch.randn(12, dtype=dtype) if affine != "none" else None
    b = torch.randn(12, dtype=dtype) if affine == "weight_and_bias" else None

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.group_norm(x, 3, w, b) * 2

    check(fn, x, atol=1e-5, rtol=1e-5)


def test_group_norm_statistics_match_eager() -> None:
    x = torch.randn(3, 8, 6) * 2 + 5
    w, b = torch.randn(8), torch.randn(8)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.ops.aten.native_group_norm.default(x, w, b, 3, 8, 6, 4, 1e-5)

    check(fn, x, atol=1e-5, rtol=1e-5)


def test_group_norm_statistics_walk_the_channels() -> None:
    x = torch.randn(1, 64, 16, 16).to(memory_format=torch.channels_last)
    c = check(lambda x: F.group_norm(x, 8), x, atol=1e-5, rtol=1e-5)
    reductions = [loop for loop, body in _simd_bodies(c.cpp_source) if "acc_" in body]
    # the 8 channels of a group, contiguous; not the 256 pixels, 64 floats apart, nor 8 groups apart
    assert reductions and all(re.match(r"for \(int64_t \w+ = 0; \w+ < 8;", loop) for loop in reductions), \
        c.cpp_source
    assert not re.search(r"\[\w+ / 8\]", c.cpp_source)  # no per-element gather of a group's statistics
    # each channel of the group adds into a lane of its own, not all 8 into one scalar per pixel
    assert not re.search(r"#pragma omp simd reduction\(\+:\w+\)\s*\n\s*for \(int64_t \w+ = 0; \w+ < 8;",
                         c.cpp_source), c.cpp_source
    assert "lanes_acc_" in c.cpp_source


@pytest.mark.parametrize("inner", [2, 3, 8, 15, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sums_with_a_short_contiguous_inner_dim_match_eager(inner: int, dtype: torch.dtype) -> None:
    x = (torch.randn(3, 40, inner, dtype=dtype) * 5 + 2).transpose(1, 2)  # the short dim has stride 1

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.sum((1, 2)), x.mean((1, 2)), torch.var(x, (1, 2)), (x * x).sum((1, 2), keepdim=True)

    c = check(fn, x, atol=1e-5, rtol=1e-5)
    assert ("lanes_acc_" in c.cpp_source) == (inner < 16), c.cpp_source


@pytest.mark.parametrize("op", ["sum", "amax", "mean", "var"])
def test_reduction_over_a_transposed_input_walks_its_stride_1_dim(op: str) -> None:
    x = torch.randn(2, 48, 8).transpose(1, 2)  # sizes (2, 8, 48), strides (384, 1, 8)

    def fn(x: torch.Tensor) -> torch.Tensor:
        if op == "var":
            return torch.var(x, (1, 2))
        return getattr(torch, op)(x, (1, 2))

    c = check(fn, x, atol=1e-5, rtol=1e-5)
    ranges = _simd_ranges(c.cpp_source)
    assert ranges and 48 not in ranges and 8 in ranges, c.cpp_source


def test_reduction_that_is_contiguous_keeps_its_order() -> None:
    c = check(lambda x: x.sum((1, 2)), torch.randn(2, 8, 48), atol=1e-5, rtol=1e-5)
    assert 48 in _simd_ranges(c.cpp_source), c.cpp_source


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_arg_reductions_keep_the_first_of_ties(op: str) -> None:
    x = torch.zeros(2, 48, 8).transpose(1, 2)  # every element ties: the first in the logical order wins
    x[0, 3, 5] = x[0, 5, 3] = 1.0

    def fn(x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(2, 1, 8, 48)
        return getattr(torch, op)(flat.flatten(2), dim=2)

    check(fn, x if op == "argmax" else -x)
