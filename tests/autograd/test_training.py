"""Training through the real Dynamo feeding Kiln's AOT backend: grads, buffers, steps equal eager's."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from kiln.autograd import aot_autograd, aot_eager
from kiln.autograd.backend import run_eagerly
from tests.autograd.conftest import assert_same_state, make_sgd_step



@pytest.fixture(autouse=True)
def _roomy_dynamo_cache():
    """Many small modules compiled in one process: keep the real Dynamo from giving up on them,
    and leave its setting as it was for the other test files."""
    with torch._dynamo.config.patch(cache_size_limit=64):
        yield


def _grads_match(model: torch.nn.Module, make_inputs, *, steps: int = 1, backend=aot_eager,
                 seed: int = 0, loss_fn=lambda out: out.float().pow(2).mean(), atol=1e-5):
    """Run forward+backward eagerly and compiled for `steps`, comparing outputs, grads and buffers."""
    eager, compiled_model = model, copy.deepcopy(model)
    compiled = torch.compile(compiled_model, backend=backend)
    for step in range(steps):
        inputs = make_inputs(step)
        eager_inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
        torch.manual_seed(seed + step)
        expected = eager(*eager_inputs)
        loss_fn(expected).backward()
        torch.manual_seed(seed + step)
        got = compiled(*inputs)
        loss_fn(got).backward()
        torch.testing.assert_close(got, expected, atol=atol, rtol=1e-5)
        for a, b in zip(inputs, eager_inputs):
            if a.requires_grad:
                torch.testing.assert_close(a.grad, b.grad, atol=atol, rtol=1e-5)
        assert_same_state(eager, compiled_model, atol=atol)
    return compiled_model


def test_mlp_with_layer_norm_grads_match():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.GELU(), torch.nn.Linear(32, 10),
                                torch.nn.LayerNorm(10), torch.nn.ReLU(), torch.nn.Linear(10, 1))
    _grads_match(model, lambda step: [torch.randn(6, 10, requires_grad=True)])


class ConvBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 4, 3)
        self.bn2 = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        x = F.max_pool2d(x, 2)
        return self.bn2(self.conv2(x)).flatten(1)


@pytest.mark.parametrize("train", [True, False])
def test_conv_batchnorm_block_train_and_eval(train):
    torch.manual_seed(0)
    model = ConvBlock().train(train)
    if not train:  # eval reads running stats: make them non-trivial first
        model.train()(torch.randn(4, 3, 12, 12) * 2 + 1)
        model.eval()
    trained = _grads_match(model, lambda step: [torch.randn(3, 3, 12, 12, requires_grad=True)], steps=2)
    expected_batches = 2 if train else 1
    assert int(trained.bn.num_batches_tracked) == expected_batches


class TransformerBlock(torch.nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        att = self.drop(att.softmax(-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


def test_transformer_block_with_seeded_dropout():
    torch.manual_seed(0)
    _grads_match(TransformerBlock(), lambda step: [torch.randn(2, 5, 16, requires_grad=True)], steps=2)


def test_embedding_grads_match():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(20, 8), torch.nn.Linear(8, 3))
    _grads_match(model, lambda step: [torch.randint(0, 20, (4, 6))])


def test_save_all_partition_trains_too():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    backend = aot_autograd(run_eagerly, partition="save_all")
    _grads_match(model, lambda step: [torch.randn(3, 5, requires_grad=True)], backend=backend)


def test_training_loop_with_optimizer_outside():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                                torch.nn.Linear(16, 1))
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend=aot_eager)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_c = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = [(torch.randn(8, 6), torch.randn(8, 1)) for _ in range(4)]
    for x, y in data:
        for net, opt in ((eager, opt_e), (compiled, opt_c)):
            opt.zero_grad()
            F.mse_loss(net(x), y).backward()
            opt.step()
        assert_same_state(eager, model)


def test_whole_training_step_compiled_in_one_function():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model = copy.deepcopy(eager)

    eager_step, compiled_step = make_sgd_step(eager), torch.compile(make_sgd_step(model), backend=aot_eager)
    for _ in range(3):
        x, y = torch.randn(5, 4), torch.randn(5, 1)
        torch.testing.assert_close(compiled_step(x, y), eager_step(x, y))
        assert_same_state(eager, model)


def test_augmented_assignment_on_input_through_dynamo():
    def f(x, y):
        x += y
        return x * 2

    x, y = torch.randn(4), torch.randn(4)
    ex = x.clone()
    out = torch.compile(f, backend=aot_eager)(x, y)
    torch.testing.assert_close(out, f(ex, y))
    torch.testing.assert_close(x, ex)


def test_dynamic_shapes_from_dynamo():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend=aot_eager, dynamic=True)
    for n in (3, 7, 11):
        x = torch.randn(n, 8, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        (compiled(x) * torch.arange(n).view(-1, 1)).sum().backward()
        (eager(xe) * torch.arange(n).view(-1, 1)).sum().backward()
        torch.testing.assert_close(x.grad, xe.grad)
        assert_same_state(eager, model)


def test_leaf_parameter_updated_under_no_grad_inside_the_graph():
    def f(x, w):
        with torch.no_grad():  # fx.symbolic_trace would drop this; Dynamo records it
            w.mul_(0.5)
        return (x * w).sum()

    def run(fn):
        x, w = torch.ones(3, requires_grad=True), torch.full((3,), 4.0, requires_grad=True)
        fn(x, w).backward()
        return w.detach(), w.grad, x.grad, w.is_leaf

    got, expected = run(torch.compile(f, backend=aot_eager)), run(f)
    assert got[3] and expected[3]
    for a, b in zip(got[:3], expected[:3]):
        torch.testing.assert_close(a, b)
