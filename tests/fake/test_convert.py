"""mode.from_real: real tensor -> fake in one call, memoized, views stay views."""
from __future__ import annotations

import gc

import pytest
import torch
import torch.nn as nn

from kiln.errors import MissingFakeImplError
from kiln.fake import FakeTensorMode, is_fake
from kiln.fake.convert import symbolic_strides


def meta_of(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad)


CASES = {
    "contiguous": lambda: torch.randn(3, 4),
    "transposed": lambda: torch.randn(3, 4).t(),
    "channels_last": lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
    "scalar": lambda: torch.tensor(3.5),
    "int64": lambda: torch.arange(6),
    "bool": lambda: torch.ones(2, 2, dtype=torch.bool),
    "half": lambda: torch.randn(4, dtype=torch.float16),
    "empty": lambda: torch.empty(0, 3),
    "expanded": lambda: torch.randn(3, 1).expand(3, 4),
    "requires_grad": lambda: torch.randn(2, 3, requires_grad=True),
    "non_leaf": lambda: torch.randn(2, 3, requires_grad=True) * 2,
    "sliced": lambda: torch.randn(5, 6)[1:4, ::2],
    "meta": lambda: torch.empty(2, 3, device="meta"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_metadata_is_preserved(name):
    real = CASES[name]()
    mode = FakeTensorMode()
    fake = mode.from_real(real)
    assert is_fake(fake)
    assert meta_of(fake) == meta_of(real)


def test_memoized():
    mode = FakeTensorMode()
    t = torch.randn(3)
    assert mode.from_real(t) is mode.from_real(t)
    assert mode.from_real(mode.from_real(t)) is mode.from_real(t)
    assert FakeTensorMode().from_real(t) is not mode.from_real(t)


def test_memo_does_not_keep_real_tensors_alive():
    mode = FakeTensorMode()
    t = torch.randn(3)
    mode.from_real(t)
    assert len(mode._real_to_fake) == 1
    del t
    gc.collect()
    assert len(mode._real_to_fake) == 0


def test_views_of_one_base_stay_views_of_one_fake_base():
    base = torch.randn(4, 6)
    a, b = base[0], base[:, 2:]
    mode = FakeTensorMode()
    fa, fb = mode.from_real(a), mode.from_real(b)
    fbase = mode.from_real(base)
    assert fa._base is fbase and fb._base is fbase
    assert fa.untyped_storage()._cdata == fb.untyped_storage()._cdata == fbase.untyped_storage()._cdata
    assert meta_of(fa) == meta_of(a) and meta_of(fb) == meta_of(b)
    # A metadata change of the base is seen by the views' storage relation, as for real tensors.
    with mode:
        fbase.add_(1)
    assert fb.storage_offset() == 2


def test_view_of_a_leaf_keeps_autograd_relation():
    w = torch.randn(4, requires_grad=True)
    v = w[1:]
    mode = FakeTensorMode()
    fv = mode.from_real(v)
    assert fv.requires_grad and not fv.is_leaf
    with torch.no_grad():
        nv = w[1:]
    fnv = mode.from_real(nv)
    assert fnv.requires_grad == nv.requires_grad and fnv.is_leaf == nv.is_leaf


@pytest.mark.parametrize("make", [
    lambda z, f: torch.view_as_real(z)[1:],
    lambda z, f: torch.view_as_real(z).t(),
    lambda z, f: torch.view_as_complex(f)[1:],
    lambda z, f: f[2:].view(torch.complex64),
    lambda z, f: f.view(torch.int32)[1:, 1:],
    lambda z, f: z.view(torch.float32)[3:],
], ids=["view_as_real_slice", "view_as_real_t", "view_as_complex_slice", "view_dtype_complex",
        "view_dtype_int", "complex_view_dtype"])
def test_a_view_of_another_dtype_than_its_base_keeps_its_dtype(make):
    """view_as_real of a complex tensor (and the other retyping views) has a base of another dtype:
    replayed as an as_strided of the base's fake, it came out complex64 with the view's sizes, and
    a compiled graph's extern then disagreed with its fake (probe round 10)."""
    z, f = torch.randn(5, dtype=torch.complex64), torch.randn(6, 2)
    t = make(z, f)
    mode = FakeTensorMode()
    ft = mode.from_real(t)
    assert meta_of(ft) == meta_of(t) and ft.dtype == t.dtype
    assert ft.untyped_storage().nbytes() == t.untyped_storage().nbytes()
    if t._base is not None:  # .view(dtype) of a view keeps no _base in eager
        fbase = mode.from_real(t._base)
        assert ft.untyped_storage()._cdata == fbase.untyped_storage()._cdata  # still one storage


def test_a_retyping_view_of_a_base_that_requires_grad_stays_differentiable():
    z = torch.randn(4, dtype=torch.complex64, requires_grad=True)
    v = torch.view_as_real(z)[1:]
    mode = FakeTensorMode()
    fv = mode.from_real(v)
    assert fv.dtype == torch.float32 and fv.requires_grad and not fv.is_leaf


def test_parameters_stay_parameters():
    lin = nn.Linear(3, 2)
    mode = FakeTensorMode()
    fw = mode.from_real(lin.weight)
    assert isinstance(fw, nn.Parameter) and is_fake(fw) and fw.requires_grad
    frozen = nn.Parameter(torch.randn(2), requires_grad=False)
    assert not mode.from_real(frozen).requires_grad


def test_grad_is_converted_too():
    t = torch.randn(3, requires_grad=True)
    t.sum().backward()
    f = FakeTensorMode().from_real(t)
    assert is_fake(f.grad) and f.grad.shape == (3,)


def test_storage_offset_without_a_base():
    storage = torch.randn(10).untyped_storage()
    t = torch.empty(0).set_(storage, 2, (2, 3), (3, 1))
    f = FakeTensorMode().from_real(t)
    assert meta_of(f) == meta_of(t)
    assert f.untyped_storage().nbytes() == storage.nbytes()


def test_dynamic_dims_need_a_shape_env_and_a_source():
    mode = FakeTensorMode()
    with pytest.raises(ValueError, match="shape_env"):
        mode.from_real(torch.randn(3), source="L['x']", dynamic_dims=(0,))


def test_unsupported_tensors_say_so():
    with pytest.raises(NotImplementedError, match="quantized"):
        FakeTensorMode().from_real(torch.quantize_per_tensor(torch.randn(2), 0.1, 0, torch.qint8))


@pytest.mark.parametrize("op", [
    lambda x: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8),
    lambda x: torch.quantize_per_tensor(x, torch.tensor(0.1), torch.tensor(0), torch.quint8),
    lambda x: torch.quantize_per_channel(x.view(2, 2), torch.tensor([0.1, 0.2]), torch.tensor([0, 0]), 0, torch.qint8),
    lambda x: torch.quantize_per_tensor_dynamic(x, torch.quint8, False),
], ids=["per_tensor", "tensor_qparams", "per_channel", "dynamic"])
def test_quantizing_ops_are_refused_not_given_a_float_result(op):
    # PyTorch's meta kernels answer float32 for these: a graph holding one would meet a quantized
    # tensor at run time where its fake said float32
    mode = FakeTensorMode()
    with mode, pytest.raises(MissingFakeImplError, match="quantized"):
        op(mode.from_real(torch.randn(4)))


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_tensors_keep_their_structure(layout):
    dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    real = dense.to_sparse() if layout == "coo" else dense.to_sparse_csr()
    mode = FakeTensorMode()
    fake = mode.from_real(real)
    assert is_fake(fake) and fake.layout == real.layout and fake.shape == real.shape
    assert fake._nnz() == 2
    # PyTorch has almost no sparse meta kernels: ops on fake sparse tensors say so.
    with mode, pytest.raises(MissingFakeImplError, match="sparse"):
        torch.mm(fake, torch.randn(2, 3))


@pytest.mark.parametrize("shape,strides", [
    ((5, 8), (8, 1)),                  # contiguous
    ((8, 5), (1, 8)),                  # transposed
    ((2, 3, 4, 5), (60, 1, 15, 3)),    # channels last
    ((3, 4), (0, 1)),                  # expanded
    ((3, 1, 4), (4, 4, 1)),            # a size-1 dim
    ((4, 3), (6, 2)),                  # a gap
])
def test_symbolic_strides_follow_the_layout(shape, strides):
    # Sizes scaled by 10 stand in for symbols: a dense stride must be the product of sizes.
    scaled = [s * 10 if s > 1 else s for s in shape]
    out = symbolic_strides(scaled, shape, strides)
    for d in range(len(shape)):
        inner = [e for e in range(len(shape)) if strides[e] < strides[d] or (strides[e] == strides[d] and e > d)]
        dense = strides[d] == _prod(shape[e] for e in inner) and strides[d] != 0
        if dense and shape[d] > 1:
            assert out[d] == _prod(scaled[e] for e in inner), (d, out)
        elif not dense:
            assert out[d] == strides[d], (d, out)


def _prod(xs) -> int:
    p = 1
    for x in xs:
        p *= x
    return p


def test_conversion_inside_the_active_mode():
    mode = FakeTensorMode()
    real = torch.randn(3, 4)
    real_view = real[1:]
    with mode:
        fake = mode.from_real(real)
        view = mode.from_real(real_view)
    assert meta_of(fake) == meta_of(real) and view._base is fake
    assert fake.untyped_storage().device.type == "meta"
