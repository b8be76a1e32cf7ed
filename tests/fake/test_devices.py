"""Fake devices: 'cpu' everywhere, and 'cuda' on this CPU-only build as far as it goes."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.fake import FakeTensorMode, is_fake
from kiln.fake.devices import BUILT_DEVICE_TYPES, explain_missing, normalize_device

CUDA0 = torch.device("cuda", 0)

OPS = {
    "matmul": lambda a, b: a @ b,
    "slice": lambda a, b: a[1:, :2],
    "select": lambda a, b: a[0],
    "int_index": lambda a, b: a[torch.tensor([0, 2], device="cuda")],
    "copy_": lambda a, b: a.clone().copy_(b),
    "contiguous": lambda a, b: a.t().contiguous(),
    "softmax": lambda a, b: a.softmax(-1),
    "cat": lambda a, b: torch.cat([a, b]),
    "where": lambda a, b: torch.where(a > 0, a, 0.0),
    "sum": lambda a, b: a.sum(),
    "cpu_scalar": lambda a, b: a * torch.tensor(2.0),
    "layer_norm": lambda a, b: F.layer_norm(a, (4,)),
    "batch_norm": lambda a, b: F.batch_norm(a, torch.zeros(4, device="cuda"), torch.ones(4, device="cuda"),
                                            training=True),
    "sdpa": lambda a, b: F.scaled_dot_product_attention(a[None], b[None], b[None]),
    "to_half": lambda a, b: a.to(torch.float16),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_cuda_ops(name):
    with FakeTensorMode():
        a = torch.randn(4, 4, device="cuda")
        b = torch.randn(4, 4, device="cuda")
        out = OPS[name](a, b)
    assert is_fake(out) and out.device == CUDA0 and out.is_cuda
    assert not out.is_meta and not out.is_cpu and out.get_device() == 0


def test_moving_between_devices():
    with FakeTensorMode():
        x = torch.randn(3)
        assert x.device == torch.device("cpu") and not x.is_cuda
        y = x.cuda()
        assert y.device == CUDA0 and y is not x
        assert y.to("cuda") is y
        assert x.to("cuda:0", torch.float16).dtype == torch.float16
        assert y.to(x).device == torch.device("cpu")
        assert y.cpu().device == torch.device("cpu")
        z = torch.tensor([1.0, 2.0], device="cuda", requires_grad=True)
        assert z.device == CUDA0 and z.requires_grad and z.is_leaf


def test_cuda_modules_and_backward():
    with FakeTensorMode():
        lin = nn.Linear(4, 2, device="cuda")
        moved = nn.Linear(4, 2).cuda()
        x = torch.randn(3, 4, device="cuda", requires_grad=True)
        loss = (lin(x) + moved(x)).sum()
        loss.backward()
    assert lin.weight.device == CUDA0 and moved.weight.device == CUDA0
    assert x.grad.device == CUDA0 and lin.weight.grad.device == CUDA0


def test_real_cpu_tensor_moved_to_fake_cuda():
    real = torch.randn(2, 2)
    with FakeTensorMode():
        y = real.cuda()
    assert is_fake(y) and y.device == CUDA0


def test_device_names_are_normalized():
    assert normalize_device("cuda") == CUDA0
    assert normalize_device(1) == torch.device("cuda", 1)
    assert normalize_device("cpu") == torch.device("cpu")
    assert normalize_device(None) == torch.get_default_device()


@pytest.mark.skipif("cuda" in BUILT_DEVICE_TYPES, reason="only a CPU-only build refuses cuda guards")
def test_refusal_is_one_clear_line():
    msg = explain_missing("cuda")
    assert "\n" not in msg and "without cuda" in msg and "'cpu'" in msg
    with FakeTensorMode():
        x = torch.randn(2)
        # The legacy type-string API initializes the CUDA runtime in C++ before any op.
        with pytest.raises(RuntimeError) as info:
            x.type("torch.cuda.FloatTensor")
    assert str(info.value) == msg + " (in Tensor.type)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fake_cuda_on_a_cuda_build_allocates_nothing():
    assert "cuda" in BUILT_DEVICE_TYPES  # design B: C++ sees the fake cuda device too
    before = torch.cuda.memory_allocated()
    with FakeTensorMode():
        a = torch.randn(4096, 4096, device="cuda")
        lin = nn.Linear(4096, 4096).cuda()
        out = lin(a[1:]).relu()
        out.sum().backward()
        real_device_of_storage = a.untyped_storage().device.type
    assert out.device == CUDA0 and lin.weight.grad.device == CUDA0
    assert real_device_of_storage == "meta"
    assert torch.cuda.memory_allocated() == before
