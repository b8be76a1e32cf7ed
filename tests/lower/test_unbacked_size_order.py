"""A data-dependent size (an unbacked symbol: nonzero's count, masked_select's length) read by a
kernel over data whose sizes the inputs give (kiln/lower/schedule.py): the scheduler may move a
pointwise node up into an earlier kernel once the buffers it reads exist, and must also wait for
the extern call whose result gives the symbol. It hoisted `x * count` into the kernel before
nonzero ran, and the wrapper read the count before binding it (UnboundLocalError, every call)."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln

pytestmark = pytest.mark.cpp


def count_scales_input(x):
    idx = torch.nonzero(x > 0)
    return idx.shape[0] * x


def count_scales_input_and_selection(x):
    idx = torch.nonzero(x > 0)
    return idx.shape[0] * x, x[x > 0]


def mean_by_count(x):
    kept = torch.masked_select(x, x > 0)
    return x.sum() / max(kept.numel(), 1), x - kept.numel()


def count_in_a_mask(x):
    n = torch.nonzero(x).shape[0]
    return torch.where(x > n, x, x * n)


def count_in_a_reduction(x):
    n = torch.nonzero(x > 0).shape[0]
    return (x * n).sum(0), (x + n).amax(1)


CASES = [
    (count_scales_input, (6,)),
    (count_scales_input_and_selection, (7,)),
    (mean_by_count, (5,)),
    (count_in_a_mask, (6,)),
    (count_in_a_reduction, (4, 3)),
]


@pytest.mark.parametrize("fn,shape", CASES, ids=[fn.__name__ for fn, _ in CASES])
def test_a_kernel_reading_a_data_dependent_size_runs_after_its_extern(fn, shape) -> None:
    kiln.reset()
    compiled = kiln.compile(fn, backend="inductor")
    gen = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an internal error would fall back to eager with a warning
        for trial in range(3):
            x = torch.randn(*shape, generator=gen) * 3
            if trial == 2:
                x = x.abs()  # every element selected
            got, expected = compiled(x), fn(x)
            for g, e in zip(*(v if isinstance(v, tuple) else (v,) for v in (got, expected))):
                torch.testing.assert_close(g, e)
    assert kiln.stats()["fallbacks"] == 0
