"""numpy scalars passed to graph ops (kiln/capture/variables/numpy_scalar_args.py): np.finfo /
np.iinfo limits and numpy scalars as clamp bounds, fill values and operands are traced whole as
torch.compile traces them, equal to eager in value and dtype; where torch reads the scalar as a
tensor of its own dtype (torch.tensor(np.float64(...))) the answer is eager's too."""
from __future__ import annotations

import numpy as np
import torch

import kiln
from trace_oracle import check_traced, fresh

X = torch.tensor([-2.0, 0.5, 3.0])


def test_finfo_and_iinfo_limits_as_bounds_and_operands() -> None:
    def f(x):
        return (x + np.iinfo(np.int16).max, x.clamp(min=np.finfo(np.float32).min),
                float(np.finfo(np.float64).eps), x.clamp(max=np.finfo(np.float16).max))
    check_traced(f, fresh(X))


def test_numpy_scalars_as_fill_values_and_operands() -> None:
    def f(x):
        return (x.masked_fill(x > 0, np.float32(1.5)), torch.where(x > 0, x, np.float64(0.25)),
                x * np.float32(3), torch.clamp(x, np.int32(-1), np.int32(2)))
    check_traced(f, fresh(X), oracle=False)


def test_a_scalar_torch_reads_as_a_float64_tensor_keeps_eager_dtype() -> None:
    def f(x):
        return torch.tensor(np.float64(0.5)), torch.full((2,), np.float64(0.5)), x + 1
    kiln.reset()
    got = kiln.compile(f, backend="eager")(X)
    want = f(X)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)


def test_in_place_op_with_a_numpy_scalar_matches_eager() -> None:
    def f(x):
        y = x.clone()
        y.mul_(np.float32(2.5))
        return y + np.float32(1)
    kiln.reset()
    got = kiln.compile(f, backend="eager")(X)
    assert torch.equal(got, f(X))
