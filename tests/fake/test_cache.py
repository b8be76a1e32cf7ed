"""The fake-op cache: a hit rebuilds exactly the metadata the kernel would have produced."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.fake import FakeTensorMode, cache


@pytest.fixture(autouse=True)
def fresh_cache():
    cache.clear()
    yield
    cache.clear()


def meta_of(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device)


PROGRAM = [
    lambda x, y: x + y,
    lambda x, y: x.t() + y,
    lambda x, y: x @ y,
    lambda x, y: x.t() @ y,
    lambda x, y: F.layer_norm(x, (8,)),
    lambda x, y: x.sum(0),
    lambda x, y: x.max(1),
    lambda x, y: x.to(torch.float16),
    lambda x, y: x.to(memory_format=torch.channels_last) if x.dim() == 4 else x.clone(),
    lambda x, y: torch.cat([x, y]),
    lambda x, y: x.expand(2, 8, 8) * 2,
    lambda x, y: (x > 0).float(),
]


def test_hits_match_misses():
    mode = FakeTensorMode()
    with mode:
        x, y = torch.randn(8, 8), torch.randn(8, 8)
        first = [torch.utils._pytree.tree_leaves(fn(x, y)) for fn in PROGRAM]
        misses = cache.stats.misses
        second = [torch.utils._pytree.tree_leaves(fn(x, y)) for fn in PROGRAM]
    assert cache.stats.misses == misses and cache.stats.hits >= len(PROGRAM)
    for a, b in zip(first, second):
        assert [meta_of(t) for t in a] == [meta_of(t) for t in b]


def test_scalar_types_are_part_of_the_key():
    with FakeTensorMode():
        x = torch.arange(3)
        assert (x + 1).dtype == torch.int64
        assert (x + 1.0).dtype == torch.float32
        assert (x + True).dtype == torch.int64
        assert (x + 1).dtype == torch.int64


def test_layout_is_part_of_the_key():
    with FakeTensorMode():
        x = torch.randn(4, 6)
        a = x + 1
        b = x.t() + 1
        assert a.stride() == (6, 1) and b.stride() == (1, 6)


def test_default_dtype_is_part_of_the_key():
    with FakeTensorMode():
        assert torch.randn(2).dtype == torch.float32
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            assert torch.randn(2).dtype == torch.float64
        finally:
            torch.set_default_dtype(old)


def test_views_and_inplace_ops_are_not_cached():
    assert not cache.is_cacheable_op(torch.ops.aten.view.default)
    assert not cache.is_cacheable_op(torch.ops.aten.add_.Tensor)
    assert not cache.is_cacheable_op(torch.ops.aten.add.out)
    assert not cache.is_cacheable_op(torch.ops.aten.nonzero.default)
    assert cache.is_cacheable_op(torch.ops.aten.add.Tensor)
    with FakeTensorMode():
        x = torch.randn(4)
        for _ in range(2):
            v = x.view(2, 2)
            assert v._base is x


def test_outputs_are_fresh_tensors_on_every_hit():
    with FakeTensorMode():
        x = torch.randn(3)
        a, b = x * 2, x * 2
    assert a is not b and a.untyped_storage()._cdata != b.untyped_storage()._cdata


def test_symbolic_inputs_bypass_the_cache():
    import kiln.symbolic as symbolic
    env = symbolic.ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    x = mode.from_real(torch.randn(5, 3), source="L['x']", dynamic_dims=(0,))
    with mode:
        x + 1
        x + 1
    assert cache.stats.hits == 0
