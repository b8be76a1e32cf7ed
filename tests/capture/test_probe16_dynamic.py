"""Dynamic-shape probes (round 16) that found Kiln deciding a size torch.compile keeps symbolic.

Each case runs a program on a sequence of shapes under kiln.compile, compares every output with
eager, and compares the number of graphs with the real torch.compile(backend="eager") on the same
calls (tests/torch_oracle.py): Kiln must compile no more graphs than torch.compile does.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from torch_oracle import torch_graph_count

LENGTHS = (4, 6, 9, 7, 2, 13, 3)
WIDE = (4, 6, 9, 7, 13, 10, 5)  # no result of 0 or 1, which any size specializes (as torch.compile)


def _kiln_graphs(fn, calls, dynamic=None, backend="eager"):
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend, dynamic=dynamic)
    for args in calls:
        torch.testing.assert_close(compiled(*args), fn(*args))
    return kiln.stats()["graphs"]


# -- bitwise operators on sizes with a low-bit mask: modular arithmetic, kept symbolic ------------

def and_parity(x):
    return torch.ones((x.shape[0] >> 1) + (x.shape[0] & 1)) * x.sum()


def and_low_bits(x):
    return x[: x.shape[0] & 3] * 2


def and_align_down(x):
    return x[: x.shape[0] & -4] + 1  # n rounded down to a multiple of 4


def align_up(x):
    return torch.zeros((x.shape[0] + 7) & ~7) + x.sum()


def or_low_bits(x):
    return torch.ones(x.shape[0] | 1), torch.ones(x.shape[0] | 3)


def or_negative_mask(x):
    return x * ((x.shape[0] | -4) + (x.shape[0] - 10 | -8))


def xor_low_bits(x):
    return torch.ones(x.shape[0] ^ 1), x * (x.shape[0] ^ 7)


def mask_on_the_left(x):
    return torch.ones(1 & x.shape[0]), torch.ones(3 | x.shape[0]), torch.ones(1 ^ x.shape[0])


def of_negative_values(x):
    # Python's bitwise ops treat negatives as infinite two's complement: (2 - 9) & 3 is 1
    n = x.shape[0] - 9
    return x * (n & 3) + (n & -4) + (n | 1) + (n ^ 3)


BITWISE = [and_parity, and_low_bits, and_align_down, align_up, or_low_bits, or_negative_mask,
           xor_low_bits, mask_on_the_left, of_negative_values]


@pytest.mark.parametrize("fn", BITWISE, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dynamic", [None, True])
def test_bitwise_mask_of_a_size_keeps_it_symbolic(fn, dynamic):
    calls = [(torch.randn(n, 3),) for n in LENGTHS]
    assert _kiln_graphs(fn, calls, dynamic) <= torch_graph_count(fn, calls, dynamic)


@pytest.mark.parametrize("fn", [and_parity, align_up, of_negative_values], ids=lambda f: f.__name__)
def test_bitwise_mask_under_mark_dynamic_compiles_once(fn):
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    for n in WIDE:
        x = torch.randn(n, 3)
        kiln.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), fn(x))
    assert kiln.stats()["graphs"] == 1


def test_bitwise_mask_of_an_int_argument():
    def f(x, n):
        return x * (n & 7) + (n | 1) - (n ^ 1) + (n & -2)

    calls = [(torch.randn(3), n) for n in (5, 6, -3, 11, 0, -8, 1)]
    assert _kiln_graphs(f, calls) <= torch_graph_count(f, calls)


def test_a_mask_that_is_not_low_bits_stays_symbolic_too():
    # an opaque BitwiseAnd of the size (kiln.symbolic.expr), as torch's BitwiseFn_bitwise_and
    def f(x):
        return x * (x.shape[0] & 6)

    calls = [(torch.randn(n),) for n in (4, 6, 9, 7)]
    assert _kiln_graphs(f, calls, dynamic=True) == 1 == torch_graph_count(f, calls, True)


@pytest.mark.parametrize("fn", [or_low_bits, align_up, xor_low_bits, of_negative_values], ids=lambda f: f.__name__)
def test_bitwise_mask_lowers(fn):
    calls = [(torch.randn(n, 3),) for n in WIDE]
    assert _kiln_graphs(fn, calls, dynamic=True, backend="aot_eager") == 1


@pytest.mark.cpp
@pytest.mark.parametrize("fn", [align_up, of_negative_values], ids=lambda f: f.__name__)
def test_bitwise_mask_compiles_to_cpp(fn):
    calls = [(torch.randn(n, 3),) for n in WIDE]
    assert _kiln_graphs(fn, calls, dynamic=True, backend="inductor") == 1
