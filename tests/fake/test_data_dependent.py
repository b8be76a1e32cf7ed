"""Data-dependent ops raise DataDependentOutputError naming the op, or give unbacked sizes."""
from __future__ import annotations

import pytest
import torch

import kiln.config
import kiln.symbolic as shape_env_mod
from kiln.errors import DataDependentOutputError, Unsupported
from kiln.fake import FakeTensorMode, is_fake

CASES = {
    "nonzero": (lambda x: x.nonzero(), "aten.nonzero"),
    "argwhere": (lambda x: torch.argwhere(x), "aten.nonzero"),
    "bool_mask_index": (lambda x: x[x > 0], "aten.index.Tensor"),
    "masked_select": (lambda x: x.masked_select(x > 0), "aten.masked_select"),
    "unique": (lambda x: torch.unique(x), "aten._unique2"),
    "unique_dim": (lambda x: torch.unique(x, dim=0), "aten.unique_dim"),
    "unique_consecutive": (lambda x: torch.unique_consecutive(x), "aten.unique_consecutive"),
    "item": (lambda x: x.sum().item(), "aten._local_scalar_dense"),
    "int": (lambda x: int(x[0, 0]), "aten._local_scalar_dense"),
    "float": (lambda x: float(x[0, 0]), "aten._local_scalar_dense"),
    "bool": (lambda x: bool(x.sum() > 0), "aten._local_scalar_dense"),
    "if": (lambda x: 1 if x.max() > 0 else 0, "aten._local_scalar_dense"),
    "tolist": (lambda x: x.tolist(), "tolist"),
    "numpy": (lambda x: x.numpy(), "numpy"),
    "repeat_interleave": (lambda x: torch.repeat_interleave(torch.tensor([1, 2])), "aten.repeat_interleave.Tensor"),
    "equal": (lambda x: torch.equal(x, x), "aten.equal"),
    "allclose": (lambda x: torch.allclose(x, x), "aten.allclose"),
    "bincount": (lambda x: torch.bincount(torch.tensor([1, 2])), "aten.bincount"),
    # C++ reads the index tensor's data before any op is dispatched; the binding shim names it.
    "tensor_split_by_tensor": (lambda x: torch.tensor_split(x, torch.tensor([1, 2])), "torch.tensor_split"),
    "to_sparse": (lambda x: x.to_sparse(), "aten._to_sparse"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_raises_naming_the_op(name):
    fn, op = CASES[name]
    with FakeTensorMode():
        x = torch.randn(3, 4)
        with pytest.raises(DataDependentOutputError) as info:
            fn(x)
    assert op in str(info.value) or op in info.value.op
    assert isinstance(info.value, Unsupported) and info.value.kind == "data_dependent"


def test_data_independent_variants_still_work():
    with FakeTensorMode():
        x = torch.randn(3, 4)
        assert x[torch.tensor([0, 2])].shape == (2, 4)
        assert torch.repeat_interleave(torch.tensor([1, 2]), output_size=3).shape == (3,)
        assert torch.nn.functional.one_hot(torch.tensor([1, 2]), 5).shape == (2, 5)
        assert torch.nonzero_static(x, size=4).shape == (4, 2)
        assert x.count_nonzero().shape == ()


def test_nonzero_gives_an_unbacked_size_with_a_shape_env():
    mode = FakeTensorMode(shape_env=shape_env_mod.ShapeEnv())
    with mode:
        x = torch.randn(3, 4)
        idx = x.nonzero()
        assert is_fake(idx) and idx.dtype == torch.long
        n = idx.shape[0]
        assert isinstance(n, torch.SymInt) and shape_env_mod.is_symbolic(n)
        assert idx.shape[1] == 2
        assert idx.sum(0).shape == (2,)  # reductions over the unbacked dim work


def test_masked_select_gives_an_unbacked_size_with_a_shape_env():
    mode = FakeTensorMode(shape_env=shape_env_mod.ShapeEnv())
    with mode:
        x = torch.randn(3, 4)
        out = x.masked_select(x > 0)
    assert out.dim() == 1 and isinstance(out.shape[0], torch.SymInt)


def test_item_gives_an_unbacked_int_only_when_capturing_scalars():
    mode = FakeTensorMode(shape_env=shape_env_mod.ShapeEnv())
    with mode:
        x = torch.arange(4)
        with pytest.raises(DataDependentOutputError):
            x.sum().item()
        with kiln.config.patch(capture_scalar_outputs=True):
            n = x.sum().item()
            assert isinstance(n, torch.SymInt) and shape_env_mod.is_symbolic(n)
            f = torch.randn(2).sum().item()  # a float scalar: an unbacked symbolic float
            assert isinstance(f, torch.SymFloat) and shape_env_mod.is_symbolic(f)
            assert torch.zeros(n).dim() == 1
