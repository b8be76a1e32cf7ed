"""Custom ops (torch.library) run their registered fake impl; without one the error says how."""
from __future__ import annotations

import pytest
import torch

from kiln.errors import DataDependentOutputError, MissingFakeImplError
from kiln.fake import FakeTensorMode, is_fake


@torch.library.custom_op("kiln_test_fake::no_fake", mutates_args=())
def no_fake(x: torch.Tensor) -> torch.Tensor:
    return x.sin()


REAL_CALLS: list[tuple] = []


@torch.library.custom_op("kiln_test_fake::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    REAL_CALLS.append(tuple(x.shape))
    return torch.cat([x, x])


CALLS: list[tuple] = []


@twice.register_fake
def _twice_fake(x):
    CALLS.append(tuple(x.shape))
    return x.new_empty(2 * x.shape[0], *x.shape[1:])


@torch.library.custom_op("kiln_test_fake::positives", mutates_args=())
def positives(x: torch.Tensor) -> torch.Tensor:
    return x[x > 0]


@positives.register_fake
def _positives_fake(x):
    n = torch.library.get_ctx().new_dynamic_size()
    return x.new_empty(n)


@torch.library.custom_op("kiln_test_fake::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, k: float) -> None:
    x.mul_(k)


@scale_.register_fake
def _scale_fake(x, k):
    return None


def test_registered_fake_impl_runs():
    CALLS.clear()
    with FakeTensorMode():
        x = torch.randn(3, 5)
        out = twice(x)
    assert is_fake(out) and out.shape == (6, 5) and out.dtype == torch.float32
    assert CALLS == [(3, 5)]


def test_real_impl_never_runs():
    REAL_CALLS.clear()
    with FakeTensorMode():
        assert twice(torch.randn(3, device="cuda")).device == torch.device("cuda:0")
        assert twice(torch.randn(2, 2)).shape == (4, 2)
    assert REAL_CALLS == []
    assert twice(torch.ones(1)).shape == (2,) and REAL_CALLS == [(1,)]  # the real one, for contrast


def test_missing_fake_impl_names_the_op_and_the_fix():
    with FakeTensorMode():
        x = torch.randn(3)
        with pytest.raises(MissingFakeImplError) as info:
            no_fake(x)
    msg = str(info.value)
    assert "kiln_test_fake::no_fake" in msg and "torch.library.register_fake" in msg


def test_library_defined_op_without_any_kernel():
    lib = torch.library.Library("kiln_test_fake2", "DEF")
    lib.define("bare(Tensor x) -> Tensor")
    lib.impl("bare", lambda x: x.clone(), "CPU")
    try:
        with FakeTensorMode():
            with pytest.raises(MissingFakeImplError, match="kiln_test_fake2::bare"):
                torch.ops.kiln_test_fake2.bare(torch.randn(2))
    finally:
        lib._destroy()


def test_new_dynamic_size_needs_a_shape_env():
    with FakeTensorMode():
        with pytest.raises(DataDependentOutputError, match="positives"):
            positives(torch.randn(4))


def test_new_dynamic_size_gives_an_unbacked_symbol():
    import kiln.symbolic as symbolic
    with FakeTensorMode(shape_env=symbolic.ShapeEnv()):
        out = positives(torch.randn(4))
    assert isinstance(out.shape[0], torch.SymInt) and symbolic.is_symbolic(out.shape[0])


def test_mutating_custom_op():
    with FakeTensorMode():
        x = torch.randn(3)
        assert scale_(x, 2.0) is None
        assert is_fake(x)
