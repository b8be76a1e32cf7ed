"""A graph input that requires grad, carries an autograd history freed by an earlier backward, and
gets no gradient from the graph: read for its shape, through ops without a derivative, or detached
inside. Eager records no edge to it, so the second backward never walks into that history; the
compiled Function must not be tied to it either (it raised "Trying to backward through the graph a
second time": a GAN step's `d(rec.detach())` backward, then the generator's backward)."""
from __future__ import annotations

from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln


def _shape_only(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (torch.ones_like(x) * w).sum()


def _mask_only(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, w, w * 2).sum()


def _integer_cast(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (w * x.long()).sum()


def _detached_inside(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.detach() * w).sum()


def _returned_view_and_loss(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x[1:], (torch.zeros_like(x) + w).pow(2).sum()


PROGRAMS = [_shape_only, _mask_only, _integer_cast, _detached_inside, _returned_view_and_loss]


def _loss(out: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return out[1] if isinstance(out, tuple) else out


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_backward_skips_a_gradless_input_with_a_freed_history(fn: Callable, backend: str) -> None:
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    grads = []
    for run in (fn, compiled):
        a = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
        x = a * a  # MulBackward saves `a`: freed by the backward below
        x.sum().backward()
        w = torch.tensor([0.5, 1.5, -1.0], requires_grad=True)
        out = run(x, w)
        _loss(out).backward()
        if isinstance(out, tuple):
            assert out[0].requires_grad and out[0]._base is x  # the view keeps its history
        grads.append((a.grad.clone(), w.grad.clone()))
    torch.testing.assert_close(grads[1], grads[0])


class _Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


def _gan_step(g: nn.Module, d: nn.Module, og: torch.optim.Optimizer, od: torch.optim.Optimizer,
              z: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    fake = g(z)
    od.zero_grad()
    d_real, d_fake = d(real), d(fake.detach())
    ld = F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real)) + \
        F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
    ld.backward()
    od.step()
    og.zero_grad()
    score = d(fake)
    lg = F.binary_cross_entropy_with_logits(score, torch.ones_like(d_real)) + F.mse_loss(fake, real)
    lg.backward()
    og.step()
    return ld.detach(), lg.detach()


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_gan_step_with_two_optimizers_trains_like_eager(backend: str) -> None:
    kiln.reset()
    results = []
    for compile_step in (False, True):
        torch.manual_seed(0)
        g, d = _Generator(), nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))
        og = torch.optim.Adam(g.parameters(), lr=1e-2)
        od = torch.optim.SGD(d.parameters(), lr=1e-2, momentum=0.9)
        step = kiln.compile(_gan_step, backend=backend) if compile_step else _gan_step
        gen = torch.Generator().manual_seed(1)
        losses = [step(g, d, og, od, torch.randn(6, 4, generator=gen), torch.randn(6, 4, generator=gen))
                  for _ in range(3)]
        results.append((losses, [p.detach().clone() for p in [*g.parameters(), *d.parameters()]]))
    torch.testing.assert_close(results[1], results[0])
