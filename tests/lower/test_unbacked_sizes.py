"""Data-dependent sizes through the lowering: nonzero, argwhere, masked_select and boolean indexing
give a size no input has (an unbacked symbol); the ops after them index with it. The wrapper binds
it from the extern call's real result, and every kernel after the call takes it as an argument.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import sympy
import torch

import kiln
from kiln.lower.ir import (Const, Extern, InputBuffer, Layout, Load, LoopIR, Op, Pointwise, VerificationError,
                           verify_ir)

pytestmark = pytest.mark.cpp


def nonzero_then_compute(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    idx = torch.nonzero(x > 0)
    return idx.sum(0) * 2 + 1, idx.float().mean(), idx[:, 1] * x.shape[0] + idx[:, 0]


def masked_select_then_compute(x: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, ...]:
    s = torch.masked_select(x, m)
    return (s * 2).sum(), s.exp() + 1, s.cumsum(0)


def argwhere_then_gather(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    rows = torch.argwhere(x.sum(1) > 0).squeeze(1)
    picked = x.index_select(0, rows)
    return picked * 3, picked.amax(1), rows.float().mean() + rows.sum()


def boolean_index_then_softmax(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    kept = x[x.abs() > 0.5]
    return torch.softmax(kept, 0), kept * kept.sum()


CASES: list[tuple[Callable[..., Any], Callable[[torch.Generator], tuple[torch.Tensor, ...]]]] = [
    (nonzero_then_compute, lambda g: (torch.randn(6, 5, generator=g),)),
    (masked_select_then_compute, lambda g: (torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g) > 0)),
    (argwhere_then_gather, lambda g: (torch.randn(7, 4, generator=g),)),
    (boolean_index_then_softmax, lambda g: (torch.randn(23, generator=g),)),
]


@pytest.mark.parametrize("fn,make", CASES, ids=[fn.__name__ for fn, _ in CASES])
def test_data_dependent_sizes_compile_without_falling_back(fn: Callable[..., Any], make: Callable) -> None:
    kiln.reset()
    compiled = kiln.compile(fn, backend="inductor")
    gen = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an internal error would fall back to eager with a warning
        for trial in range(3):
            args = make(gen)
            if trial == 2:  # nothing selected: the data-dependent size is 0
                args = tuple(torch.zeros_like(a) for a in args)
            got, want = compiled(*args), fn(*args)
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.dtype == w.dtype
                torch.testing.assert_close(g, w, equal_nan=True)
    stats = kiln.stats()
    assert stats["fallbacks"] == 0, stats
    if fn is not boolean_index_then_softmax:  # x[mask] breaks the graph in capture (as torch.compile's)
        assert stats["graphs"] == 1 and stats["recompiles"] == 0, stats


def test_verifier_accepts_an_unbacked_size_only_after_the_call_that_binds_it() -> None:
    u0, i0 = sympy.Symbol("u0"), sympy.Symbol("i0")
    one, two = sympy.Integer(1), sympy.Integer(2)
    idx = Layout(torch.int64, (u0, two), (two, one))
    call = Extern("buf0", idx, (), op=torch.ops.aten.nonzero.default, results=(("buf0", idx, ()),))
    body = Op("add", (Load("buf0", 2 * i0, torch.int64), Const(1, torch.int64)), torch.int64)
    use = Pointwise("buf1", Layout(torch.int64, (u0,), (one,)), (), body)
    ir = LoopIR((call, use), (), {})
    assert ir.unbacked_symbols() == ("u0",) and ir.size_symbols() == {"u0"}
    verify_ir(ir)
    plain = Pointwise("buf1", Layout(torch.int64, (u0,), (one,)), (), Op("add", (Load("arg0", i0 + u0, torch.int64),
                      Const(1, torch.int64)), torch.int64))
    with pytest.raises(VerificationError, match="unknown index symbols|no input of the graph gives"):
        verify_ir(LoopIR((InputBuffer("arg0", idx, ()), plain, call), (), {}))


def test_gradient_through_masked_select_on_inductor() -> None:
    # the backward scatters the gradient back through the mask: its kernels take the count too
    def fn(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        s = torch.masked_select(x, m)
        return (s.exp() * 2).sum() + s.sum()

    kiln.reset()
    compiled = kiln.compile(fn, backend="inductor")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in range(3):
            gen = torch.Generator().manual_seed(seed)
            x = torch.randn(6, 5, generator=gen, requires_grad=True)
            m = torch.randn(6, 5, generator=gen) > 0
            (got,) = torch.autograd.grad(compiled(x, m), x)
            (want,) = torch.autograd.grad(fn(x, m), x)
            torch.testing.assert_close(got, want)
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["graphs"] == 1
