"""Inputs that are views of a base of another dtype (view_as_real of a complex tensor, view_as_complex
of a real one), through the default backend: values, the base's gradient and in-place updates seen
through the base, as eager's.

Found by probe round 10 (g_view_as_real_input_grad): the fake of such an input was replayed as an
as_strided of its base's fake, so it had the base's dtype; the compiled graph's first extern then
disagreed with its fake ("returned a torch.float32 tensor ... where its fake tensor at capture was
torch.complex64") and the frame fell back to eager with a warning (kiln.fake.convert).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch

import kiln
from kiln.log import KilnWarning

pytestmark = pytest.mark.cpp


def _reads(v: torch.Tensor) -> Any:
    return v.pow(2).sum(-1), v[..., 0] * 3


def _writes(v: torch.Tensor) -> Any:
    v.mul_(2)
    return v.sum()


def _complex(c: torch.Tensor) -> Any:
    return (c * c).real, c.abs()


CASES: dict[str, tuple[Callable[..., Any], Callable[[], torch.Tensor]]] = {
    "view_as_real_grad": (_reads, lambda: torch.view_as_real(torch.randn(5, dtype=torch.complex64, requires_grad=True))),
    "view_as_real_slice": (_reads, lambda: torch.view_as_real(torch.randn(5, dtype=torch.complex64))[1:]),
    "view_as_real_slice_written": (_writes, lambda: torch.view_as_real(torch.randn(5, dtype=torch.complex64))[1:]),
    "view_as_complex_grad": (_complex, lambda: torch.view_as_complex(torch.randn(6, 2, requires_grad=True))[1:]),
}


def _run(fn: Callable[..., Any], make: Callable[[], torch.Tensor]) -> list[Any]:
    torch.manual_seed(0)
    v = make()
    out = fn(v)
    outs = out if isinstance(out, tuple) else (out,)
    if outs[0].requires_grad:
        sum((o * torch.linspace(-1, 2, o.numel()).view(o.shape)).sum() for o in outs).backward()
    base = v._base
    return [*outs, base.detach().clone(), base.grad]


@pytest.mark.parametrize("name", list(CASES))
def test_retyped_view_input_matches_eager(name: str) -> None:
    fn, make = CASES[name]
    kiln.reset()
    expected = _run(fn, make)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        got = _run(kiln.compile(fn), make)
    for g, e in zip(got, expected):
        if e is None:
            assert g is None
        else:
            assert g.dtype == e.dtype
            torch.testing.assert_close(g, e)
    assert kiln.stats()["fallbacks"] == 0
