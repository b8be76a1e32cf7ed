"""Shared helpers for AOT autograd tests: compile a module two ways and compare with eager."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx

from kiln.autograd import aot_eager


def traced(fn_or_module) -> fx.GraphModule:
    """A torch-level GraphModule without the real Dynamo (fast): fx.symbolic_trace."""
    return fx.symbolic_trace(fn_or_module)


def compile_fx(fn_or_module, *example_inputs, backend=aot_eager):
    """Capture with fx.symbolic_trace, then run Kiln's AOT backend on real example inputs."""
    return backend(traced(fn_or_module), list(example_inputs))


def clone_inputs(inputs):
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            y = x.detach().clone()
            y.requires_grad_(x.requires_grad)
            out.append(y)
        else:
            out.append(x)
    return out


def assert_close_trees(a, b, *, atol=1e-5, rtol=1e-5):
    la = a if isinstance(a, (list, tuple)) else [a]
    lb = b if isinstance(b, (list, tuple)) else [b]
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, atol=atol, rtol=rtol)
        else:
            assert x == y


def assert_same_state(m1: torch.nn.Module, m2: torch.nn.Module, *, grads=True, atol=1e-5):
    for (name, p1), (_, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        torch.testing.assert_close(p1, p2, atol=atol, rtol=1e-5, msg=f"parameter {name}")
        if grads:
            assert (p1.grad is None) == (p2.grad is None), name
            if p1.grad is not None:
                torch.testing.assert_close(p1.grad, p2.grad, atol=atol, rtol=1e-5, msg=f"grad {name}")
    for (name, b1), (_, b2) in zip(m1.named_buffers(), m2.named_buffers()):
        torch.testing.assert_close(b1, b2, atol=atol, rtol=1e-5, msg=f"buffer {name}")


@pytest.fixture
def twin():
    """Two copies of a module: one for eager, one for the compiled path."""
    def make(module: torch.nn.Module):
        return module, copy.deepcopy(module)
    return make


def make_sgd_step(net: torch.nn.Module):
    """A whole training step over `net` (zero_grad, MSE loss, backward, SGD update) as one function."""
    opt = torch.optim.SGD(net.parameters(), lr=0.05)

    def step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        return loss
    return step
