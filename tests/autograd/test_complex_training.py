"""Training through complex arithmetic with Python complex scalars, against eager's gradients.

The backward of `z * (1 + 2j)` conjugates the Python scalar (aten._conj of a constant, a view op
whose argument is no tensor): the partitioner's walk from a view to the input it aliases assumed a
tensor there and failed, so the frame ran eagerly with a warning.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln


def _mul(a):
    return torch.view_as_real(torch.view_as_complex(a) * (1 + 2j))


def _div_add(a):
    z = torch.view_as_complex(a)
    return torch.view_as_real((z + 0.5j) / (2 - 1j))


def _scalar_first(a):
    z = torch.view_as_complex(a)
    return torch.view_as_real((3 - 1j) * z - 1j)


def _abs_angle(a):
    z = torch.view_as_complex(a) * (0.5 + 0.5j)
    return z.abs() + z.angle()


def _exp_polar(a):
    z = torch.polar(a[..., 0].abs() + 0.1, a[..., 1]) * 1j
    return torch.view_as_real(z.exp())


def _rotary(a):
    # rotary embeddings as complex multiplication (the LLaMA way), by a complex tensor and a scalar
    z = torch.view_as_complex(a)
    freqs = torch.polar(torch.ones(a.shape[-2]), torch.arange(a.shape[-2]) * 0.1)
    return torch.view_as_real(z * freqs * (1 - 0.5j)).flatten(-2)


FUNCS = [_mul, _div_add, _scalar_first, _abs_angle, _exp_polar, _rotary]


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize("fn", FUNCS, ids=lambda f: f.__name__)
def test_grads_match_eager(fn, backend):
    kiln.reset()
    torch.manual_seed(0)
    a = torch.randn(4, 3, 2, requires_grad=True)
    b = a.detach().clone().requires_grad_()
    weight = torch.randn_like(fn(b))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        out = kiln.compile(fn, backend=backend, fullgraph=True)(a)
    (out * weight).sum().backward()
    (fn(b) * weight).sum().backward()
    torch.testing.assert_close(out, fn(b.detach()))
    torch.testing.assert_close(a.grad, b.grad)
    assert kiln.stats()["fallbacks"] == 0
