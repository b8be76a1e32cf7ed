"""Lazily conjugated and negated views (z.conj(), its .imag) under the default backend: eager's
kernels resolve the conj/neg bit as they read; Kiln's kernels read memory as it is, so the bits are
materialized in the graph (kiln/lower/decompose.py). Inputs that carry the bits keep them on their
fakes (kiln/fake/convert.py), so is_conj()/is_neg() and the ops traced see what eager sees."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln.log import KilnWarning

pytestmark = pytest.mark.cpp


def _z() -> torch.Tensor:
    return torch.randn(2, 3, dtype=torch.complex64)


PROGRAMS = {
    "conj_imag": lambda z: z.conj().imag * 1,
    "conj_imag_sum": lambda z: z.conj().imag.sum(0) + z.real.sum(0),
    "conj_times_self": lambda z: (z.conj() * z).real + 1,
    "conj_resolved_view_as_real": lambda z: torch.view_as_real(z.conj().resolve_conj()) * 2,
    "conj_output": lambda z: (z + 1).conj(),
    "neg_view_of_conj_output": lambda z: (z * 2).conj().imag,
    "flags": lambda z: (z * 2, z.is_conj(), z.is_neg(), z.conj().is_conj()),
}

INPUTS = {"plain": _z, "conj_input": lambda: _z().conj()}


@pytest.mark.parametrize("inputs", list(INPUTS))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_conj_and_neg_bits_match_eager(name: str, inputs: str) -> None:
    fn = PROGRAMS[name]
    kiln.reset()
    compiled = kiln.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        for _ in range(2):
            z = INPUTS[inputs]()
            got, expected = compiled(z), fn(z)
            got, expected = (got, expected) if isinstance(got, tuple) else ((got,), (expected,))
            for g, e in zip(got, expected):
                if isinstance(e, torch.Tensor):
                    torch.testing.assert_close(g.resolve_conj().resolve_neg(), e.resolve_conj().resolve_neg())
                else:
                    assert g == e

