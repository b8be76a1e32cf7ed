"""A lazy value that a gather reads (nearest upsampling, index, index_select, gather) is stored
before the gather's kernel reads it at computed addresses. Computed from NHWC data (a residual sum
of two convolutions' results in a VAE decoder's up block) it is stored NHWC, as eager's pointwise
ops keep their input's memory format, so the store streams along the channels and the gather reads
whole channel rows (kiln/lower/lowerings/indexing.py `_stored_for_gather`). Row-major data keeps
row-major storage.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.lower.ir import Pointwise
from kiln.lower.lowerings.convolution import channels_last_strides

from .conftest import check, raises_as_eager

pytestmark = pytest.mark.cpp

CL = torch.channels_last


def _upsample_sum(x, y):
    return F.interpolate(x + y, scale_factor=2.0, mode="nearest")


def _upsample_silu(x):
    return F.interpolate(F.silu(x), scale_factor=2.0, mode="nearest")


def _index_rows(x, y, i):
    return (x * y)[:, :, i]


def _index_select_columns(x, y, i):
    return (x - y).index_select(3, i)


def _gather_dim2(x, y, i):
    return torch.gather(x + y, 2, i)


def _nhwc(*s):
    return torch.randn(*s).contiguous(memory_format=CL)


_CASES = {
    "upsample_sum": (_upsample_sum, lambda: (_nhwc(2, 16, 5, 6), _nhwc(2, 16, 5, 6))),
    "upsample_silu": (_upsample_silu, lambda: (_nhwc(1, 32, 4, 4),)),
    "index_rows": (_index_rows, lambda: (_nhwc(2, 8, 5, 3), _nhwc(2, 8, 5, 3), torch.tensor([4, 0, 0, 2]))),
    "index_select_columns": (_index_select_columns, lambda: (_nhwc(2, 12, 3, 5), _nhwc(2, 12, 3, 5), torch.tensor([1, 4]))),
    "gather_dim2": (_gather_dim2, lambda: (_nhwc(2, 8, 4, 3), _nhwc(2, 8, 4, 3), torch.randint(0, 4, (2, 8, 6, 3)))),
}


def _stored_sources(c):
    """The layouts of the intermediate 4-d pointwise buffers (the gathers' stored sources)."""
    outputs = {getattr(o, "name", None) for o in c.program.ir.outputs}
    return [b.layout for b in c.program.ir.buffers
            if isinstance(b, Pointwise) and b.name not in outputs and len(b.layout.sizes) == 4]


@pytest.mark.parametrize("name", list(_CASES))
def test_a_gather_source_computed_from_nhwc_data_is_stored_nhwc(name) -> None:
    fn, make = _CASES[name]
    c = check(fn, *make())
    stored = _stored_sources(c)
    assert len(stored) == 1, c.cpp_source
    assert tuple(stored[0].strides) == channels_last_strides(stored[0].sizes), (stored[0], c.cpp_source)


@pytest.mark.parametrize("name", list(_CASES))
def test_a_gather_source_computed_from_row_major_data_stays_row_major(name) -> None:
    fn, make = _CASES[name]
    args = [a.contiguous() for a in make()]
    c = check(fn, *args)
    for lay in _stored_sources(c):
        assert tuple(lay.strides) != channels_last_strides(lay.sizes) or lay.sizes[1] == 1, c.cpp_source


def test_an_out_of_range_index_still_raises_from_an_nhwc_source() -> None:
    x, y = _nhwc(2, 12, 3, 5), _nhwc(2, 12, 3, 5)
    raises_as_eager(IndexError, _index_select_columns, x, y, torch.tensor([1, 5]), first_line=True)
    x, y = _nhwc(2, 8, 4, 3), _nhwc(2, 8, 4, 3)
    raises_as_eager(RuntimeError, _gather_dim2, x, y, torch.full((2, 8, 6, 3), 4), first_line=True)
