"""Ops with no meta kernel met by a training step (CTC's backward, fractional_max_pool3d's backward,
masked softmax and its backward): the fake gives the real kernel's size, dtype and strides, on
contiguous and on transposed or channels-last inputs; and a compiled training step through them
is one graph, never its whole frame run eagerly, with eager's values and gradients."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.fake import FakeTensorMode

aten = torch.ops.aten


def _ctc_inputs(transposed: bool) -> tuple:
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(2, 6, 5, generator=g).log_softmax(-1)
    lp = lp.transpose(0, 1) if transposed else lp.transpose(0, 1).contiguous()
    return lp, torch.randint(1, 5, (2, 3), generator=g)


def _ctc_backward(lp: torch.Tensor, y: torch.Tensor, tensor_lengths: bool) -> torch.Tensor:
    il, tl = [6, 5], [3, 2]
    if tensor_lengths:
        il, tl = torch.tensor(il), torch.tensor(tl)
        nll, alpha = aten._ctc_loss.Tensor(lp, y, il, tl, 0, False)
        return aten._ctc_loss_backward.Tensor(torch.ones_like(nll), lp, y, il, tl, nll, alpha, 0, False)
    nll, alpha = aten._ctc_loss(lp, y, il, tl, 0, False)
    return aten._ctc_loss_backward(torch.ones_like(nll), lp, y, il, tl, nll, alpha, 0, False)


def _same_meta(fake: torch.Tensor, real: torch.Tensor) -> None:
    assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype)


@pytest.mark.parametrize("transposed", [False, True])
def test_ctc_loss_backward_fakes_like_the_cpu_kernel(transposed: bool) -> None:
    lp, y = _ctc_inputs(transposed)
    mode = FakeTensorMode()
    for tensor_lengths in (False, True):
        real = _ctc_backward(lp, y, tensor_lengths)
        if tensor_lengths:  # the forward's log_alpha size is data: only the backward is faked alone
            nll, alpha = aten._ctc_loss.Tensor(lp, y, torch.tensor([6, 5]), torch.tensor([3, 2]), 0, False)
            args = [lp, y, torch.tensor([6, 5]), torch.tensor([3, 2]), nll, alpha]
            fargs = [mode.from_real(a) for a in args]
            with mode:
                fake = aten._ctc_loss_backward.Tensor(torch.ones(2), *fargs, 0, False)
        else:
            flp, fy = mode.from_real(lp), mode.from_real(y)
            with mode:
                fake = _ctc_backward(flp, fy, False)
        _same_meta(fake, real)


def test_fractional_max_pool3d_backward_fakes_like_the_cpu_kernel() -> None:
    g = torch.Generator().manual_seed(1)
    for x in (torch.randn(1, 2, 6, 6, 6, generator=g),
              torch.randn(1, 2, 6, 6, 6, generator=g).contiguous(memory_format=torch.channels_last_3d)):
        samples = torch.rand(1, 2, 3, generator=g)
        out, idx = aten.fractional_max_pool3d(x, [2, 2, 2], [3, 3, 3], samples)
        grad = torch.randn(out.shape, generator=g)
        real = aten.fractional_max_pool3d_backward(grad, x, [2, 2, 2], [3, 3, 3], idx)
        mode = FakeTensorMode()
        fg, fx, fi = mode.from_real(grad), mode.from_real(x), mode.from_real(idx)
        with mode:
            fake = aten.fractional_max_pool3d_backward(fg, fx, [2, 2, 2], [3, 3, 3], fi)
        _same_meta(fake, real)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_masked_softmax_and_its_backward_fake_like_the_cpu_kernels(layout: str) -> None:
    g = torch.Generator().manual_seed(2)
    x = {"contiguous": torch.randn(3, 5, generator=g), "transposed": torch.randn(5, 3, generator=g).t(),
         "sliced": torch.randn(3, 10, generator=g)[:, ::2]}[layout]
    mask = torch.rand(3, 5, generator=g) > 0.6
    grad = torch.randn(5, 3, generator=g).t()
    out = aten._masked_softmax(x, mask, 1, 0)
    back = aten._masked_softmax_backward(grad, out, mask, 1)
    mode = FakeTensorMode()
    fx, fm, fg = mode.from_real(x), mode.from_real(mask), mode.from_real(grad)
    with mode:
        fout = aten._masked_softmax(fx, fm, 1, 0)
        fback = aten._masked_softmax_backward(fg, fout, fm, 1)
    _same_meta(fout, out)
    _same_meta(fback, back)


def _train_step_matches(fn, *args: torch.Tensor) -> None:
    """One step eager and compiled, the first argument the one requiring grad."""
    kiln.reset()
    eager_args = [a.detach().clone().requires_grad_(i == 0) for i, a in enumerate(args)]
    kiln_args = [a.detach().clone().requires_grad_(i == 0) for i, a in enumerate(args)]
    want = fn(*eager_args)
    want.square().sum().backward()
    got = kiln.compile(fn)(*kiln_args)
    got.square().sum().backward()
    torch.testing.assert_close(got, want)
    for a, b in zip(kiln_args, eager_args):
        if a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)  # fused sums round apart
    stats = kiln.stats()
    assert stats["fallbacks"] == 0 and stats["graph_breaks"] == 0, stats


def test_ctc_training_step_with_length_lists_compiles() -> None:
    g = torch.Generator().manual_seed(3)

    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        lp = (x * 2).log_softmax(-1)
        return F.ctc_loss(lp, y, [6, 5, 4], [3, 2, 2], reduction="sum") + F.ctc_loss(
            lp, y, (6, 5, 4), (3, 2, 2), reduction="none", zero_infinity=True).mean()

    _train_step_matches(loss, torch.randn(6, 3, 5, generator=g), torch.randint(1, 5, (3, 3), generator=g))


def test_fractional_max_pool3d_and_masked_softmax_training_steps_compile() -> None:
    g = torch.Generator().manual_seed(4)
    samples = torch.rand(1, 2, 3, generator=g)
    _train_step_matches(lambda x, s: F.fractional_max_pool3d(x * 2, 2, output_size=(3, 3, 3), _random_samples=s),
                        torch.randn(1, 2, 6, 6, 6, generator=g), samples)
    mask = torch.rand(3, 5, generator=g) > 0.6
    _train_step_matches(lambda x, m: torch._masked_softmax(x * 2, m, 1, 0) + 1, torch.randn(3, 5, generator=g), mask)
