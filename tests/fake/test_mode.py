"""FakeTensorMode used standalone, as a user would: factories, modules and ops make fakes."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.fake import FakeTensor, FakeTensorMode, is_fake, mode_of


def meta_of(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad)


FACTORIES = {
    "randn": lambda: torch.randn(3, 4),
    "rand": lambda: torch.rand(2, 5, dtype=torch.float64),
    "randint": lambda: torch.randint(0, 10, (4, 2)),
    "randperm": lambda: torch.randperm(7),
    "zeros": lambda: torch.zeros(2, 3, dtype=torch.int32),
    "ones": lambda: torch.ones(5),
    "empty": lambda: torch.empty(2, 3, 4),
    "empty_strided": lambda: torch.empty_strided((2, 3), (1, 2)),
    "full": lambda: torch.full((2, 2), 7),
    "full_float": lambda: torch.full((2, 2), 7.5),
    "arange": lambda: torch.arange(10),
    "arange_float": lambda: torch.arange(0, 1, 0.25),
    "tensor": lambda: torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
    "tensor_int": lambda: torch.tensor([1, 2, 3]),
    "as_tensor": lambda: torch.as_tensor([1.0, 2.0]),
    "eye": lambda: torch.eye(3, 4),
    "linspace": lambda: torch.linspace(0, 1, 5),
    "logspace": lambda: torch.logspace(0, 1, 5),
    "zeros_like": lambda: torch.zeros_like(torch.empty(2, 3).t()),
    "ones_like": lambda: torch.ones_like(torch.empty(2, 3), dtype=torch.float16),
    "rand_like": lambda: torch.rand_like(torch.empty(4)),
    "randn_like": lambda: torch.randn_like(torch.empty(2, 2)),
    "empty_like_cl": lambda: torch.empty_like(torch.empty(2, 3, 4, 5), memory_format=torch.channels_last),
    "new_zeros": lambda: torch.empty(2).new_zeros(3, 3),
    "scalar_tensor": lambda: torch.scalar_tensor(3.0),
    "requires_grad": lambda: torch.randn(3, requires_grad=True),
    "complex": lambda: torch.randn(2, dtype=torch.complex64),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factories_match_real(name):
    torch.manual_seed(0)
    real = FACTORIES[name]()
    with FakeTensorMode():
        fake = FACTORIES[name]()
    assert isinstance(fake, FakeTensor)
    assert meta_of(fake) == meta_of(real)


MODULES = {
    "linear": (lambda: nn.Linear(8, 4), (2, 8)),
    "conv2d": (lambda: nn.Conv2d(3, 6, 3, padding=1), (2, 3, 8, 8)),
    "layernorm": (lambda: nn.LayerNorm(8), (2, 5, 8)),
    "batchnorm": (lambda: nn.BatchNorm2d(3), (2, 3, 4, 4)),
    "embedding": (lambda: nn.Embedding(10, 4), None),
    "lstm": (lambda: nn.LSTM(4, 6, batch_first=True), (2, 3, 4)),
    "mha": (lambda: nn.MultiheadAttention(8, 2, batch_first=True), None),
    "transformer_layer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), (2, 5, 8)),
    "sequential": (lambda: nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Dropout(0.1), nn.Linear(8, 2)), (3, 4)),
}


def _run_module(name: str):
    make, shape = MODULES[name]
    torch.manual_seed(0)
    m = make()
    if name == "embedding":
        out = m(torch.tensor([[1, 2], [3, 4]]))
    elif name == "mha":
        x = torch.randn(2, 5, 8)
        out = m(x, x, x)
    else:
        out = m(torch.randn(*shape))
    return m, out


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_construct_and_run(name):
    real_m, real_out = _run_module(name)
    with FakeTensorMode():
        fake_m, fake_out = _run_module(name)
    for (pn, rp), (_, fp) in zip(real_m.named_parameters(), fake_m.named_parameters()):
        assert is_fake(fp) and isinstance(fp, nn.Parameter), pn
        assert meta_of(fp) == meta_of(rp), pn
    for (bn, rb), (_, fb) in zip(real_m.named_buffers(), fake_m.named_buffers()):
        assert is_fake(fb) and meta_of(fb) == meta_of(rb), bn
    real_leaves = torch.utils._pytree.tree_leaves(real_out)
    fake_leaves = torch.utils._pytree.tree_leaves(fake_out)
    assert len(real_leaves) == len(fake_leaves)
    for r, f in zip(real_leaves, fake_leaves):
        if isinstance(r, torch.Tensor):
            assert is_fake(f) and meta_of(f) == meta_of(r)


def test_lecture_snippet_runs_without_memory_in_a_fresh_process():
    code = (
        "import torch\n"
        "from kiln.fake import FakeTensorMode\n"
        "with FakeTensorMode():\n"
        "    a = torch.randn(1024, 1024, device='cuda')\n"
        "    b = torch.randn(1024, 1024, device='cuda')\n"
        "    c = a @ b\n"
        "    print(c.shape, c.dtype, c.device)\n"
        "    big = torch.empty(1 << 20, 1 << 20)\n"  # 4 TiB if it were allocated
        "    print(big.shape, (big @ big).shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "torch.Size([1024, 1024]) torch.float32 cuda:0"
    assert lines[1] == "torch.Size([1048576, 1048576]) torch.Size([1048576, 1048576])"


def test_no_storage_and_no_kernel():
    with FakeTensorMode():
        x = torch.empty(1 << 20, 1 << 20)  # 4 TiB
        y = (x * 2).sum(0)
    assert y.shape == (1 << 20,)
    assert x.untyped_storage().device.type == "meta"


def test_inplace_returns_the_same_object_and_tracks_metadata():
    with FakeTensorMode():
        x = torch.randn(3, 4)
        assert x.add_(1) is x
        assert x.t_() is x and x.shape == (4, 3) and x.stride() == (1, 4)
        x.unsqueeze_(0)
        assert x.shape == (1, 4, 3)
        y = torch.randn(2)
        y.resize_(5, 5)
        assert y.shape == (5, 5) and y.stride() == (5, 1)
        out = torch.empty(3)
        assert torch.add(torch.randn(3), 1, out=out) is out


def test_views_share_the_fake_storage():
    with FakeTensorMode():
        x = torch.randn(4, 6)
        v = x[1:, ::2]
        assert v._base is x
        assert v.storage_offset() == 6 and v.stride() == (6, 2)
        assert v.untyped_storage()._cdata == x.untyped_storage()._cdata
        assert x.view(24)._is_view()


def test_autograd_through_fakes():
    with FakeTensorMode():
        lin = nn.Linear(4, 3)
        x = torch.randn(5, 4, requires_grad=True)
        loss = F.relu(lin(x)).pow(2).mean()
        loss.backward()
        assert is_fake(x.grad) and x.grad.shape == (5, 4)
        assert is_fake(lin.weight.grad) and lin.weight.grad.shape == (3, 4)
        (gx,) = torch.autograd.grad(lin(x).sum(), x)
        assert gx.shape == x.shape


def test_mixed_real_and_fake_inputs():
    real = torch.ones(3)
    lin = nn.Linear(3, 2)  # real parameters, fake input
    with FakeTensorMode():
        x = torch.randn(3)
        assert is_fake(x + real)
        assert is_fake(lin(x)) and lin(x).shape == (2,)


def test_fakes_work_outside_the_with_block():
    mode = FakeTensorMode()
    with mode:
        x = torch.randn(2, 3)
    y = x.relu() @ x.t()
    assert is_fake(y) and y.shape == (2, 2) and y.fake_mode is mode
    assert mode_of([1, y, "a"]) is mode and mode_of([torch.ones(1)]) is None


def test_two_modes_do_not_mix():
    with FakeTensorMode():
        a = torch.randn(2)
    with FakeTensorMode():
        b = torch.randn(2)
        with pytest.raises(RuntimeError, match="another FakeTensorMode"):
            a + b
    with pytest.raises(RuntimeError, match="two different FakeTensorModes"):
        a + b


def test_modes_nest():
    outer, inner = FakeTensorMode(), FakeTensorMode()
    with outer:
        with outer:
            a = torch.randn(2)
        with inner:
            b = torch.randn(2)
            with inner:
                c = torch.randn(2)
        d = torch.randn(2)
    assert a.fake_mode is outer and d.fake_mode is outer
    assert b.fake_mode is inner and c.fake_mode is inner
    assert type(torch.randn(2)) is torch.Tensor


def test_device_mismatch_raises_like_eager():
    with FakeTensorMode():
        a = torch.randn(2, device="cuda")
        b = torch.randn(2)
        assert (a + torch.tensor(1.0)).device == torch.device("cuda:0")  # cpu scalar mixes
        with pytest.raises(RuntimeError, match="same device"):
            a + b


def test_to_and_dtype_conversion():
    with FakeTensorMode():
        x = torch.randn(2, 3)
        assert x.to(torch.float16).dtype == torch.float16
        assert x.to("cpu") is x
        assert x.double().dtype == torch.float64
        y = torch.randn(1, 2, 3, 4).to(memory_format=torch.channels_last)
        assert y.stride() == (24, 1, 8, 2)


def test_fx_interpreter_runs_on_fakes():
    def f(x, w):
        return (torch.sin(x) @ w).relu().sum(1)

    gm = torch.fx.symbolic_trace(f)
    mode = FakeTensorMode()
    x = mode.from_real(torch.randn(4, 5))
    w = mode.from_real(torch.randn(5, 3))
    with mode:
        out = torch.fx.Interpreter(gm).run(x, w)
    assert is_fake(out) and out.shape == (4,)


def test_repr_and_tolist():
    with FakeTensorMode():
        x = torch.randn(2, 3, requires_grad=True)
    assert repr(x) == "FakeTensor(size=(2, 3), dtype=torch.float32, device='cpu', requires_grad=True)"


def test_deepcopy_of_a_fake_module():
    import copy

    with FakeTensorMode():
        m = nn.Linear(3, 2)
    m2 = copy.deepcopy(m)
    assert is_fake(m2.weight) and m2.weight.shape == (2, 3) and m2.weight is not m.weight
    assert isinstance(m2.weight, nn.Parameter) and m2.weight.requires_grad


def test_channels_last_conv_keeps_layout():
    conv = nn.Conv2d(3, 8, 3)
    x = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    real = conv(x)
    mode = FakeTensorMode()
    with mode:
        fake = conv(mode.from_real(x))
    assert fake.stride() == real.stride() == (1568, 1, 112, 8)


def test_library_code_stays_off_torch_internals():
    """kiln.fake builds on public-facing contracts only (no torch._subclasses, torch._dynamo ...)."""
    import pathlib
    import re

    import kiln.fake

    forbidden = re.compile(r"^\s*(from|import)\s+torch\.(_dynamo|_inductor|_functorch|_subclasses|"
                           r"fx\.experimental|export)\b|torch\.(compile|jit)\(", re.M)
    for path in pathlib.Path(kiln.fake.__file__).parent.glob("*.py"):
        assert not forbidden.search(path.read_text()), path.name


@pytest.mark.parametrize("loss", [F.multi_margin_loss, F.multilabel_margin_loss])
def test_margin_loss_backward_has_a_fake_impl(loss):
    # The backward ops of these losses have no meta kernel: Kiln's fake impl gives the input's shape,
    # dtype and the contiguous strides the CPU kernel allocates.
    torch.manual_seed(0)
    x = torch.randn(5, 4).t().requires_grad_()
    target = torch.randint(0, 4, (4,)) if loss is F.multi_margin_loss else torch.randint(-1, 5, (4, 5))
    (real,) = torch.autograd.grad(loss(x, target), x)
    mode = FakeTensorMode()
    fx, ft = mode.from_real(x), mode.from_real(target)
    with mode:
        (fake,) = torch.autograd.grad(loss(fx, ft), fx)
    assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype)
