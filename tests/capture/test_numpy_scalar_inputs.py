"""numpy scalar arguments of a compiled function (NumpyScalarVariable in
kiln/capture/variables/numpy_scalar_args.py): where graph ops take one as the number it holds, it is a
symbolic input guarded by its numpy type, so a new value of the same type reuses the graph, as
torch.compile reuses its graph (it passes the scalar as a tensor input): one graph per numpy type,
counted against the real torch.compile with a counting backend. Another type (a Python int, another
numpy dtype) must not reuse it; a Python-level use of the value specializes it, with eager's result.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo

import kiln
from kiln.backends import CountingBackend, lookup

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]


def _scale_shift(x, s):
    return x * s, x + s, (x - s).relu()


def _exact(got, want) -> None:
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and torch.equal(got, want), (got, want)
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _exact(g, w)
    else:
        assert got == want, (got, want)


def _counts(fn, calls) -> tuple[int, int]:
    """(Kiln's graphs, torch.compile's graphs) over the same calls, each checked against eager."""
    ours = CountingBackend()
    kiln.reset()
    compiled = kiln.compile(fn, backend=ours)
    for args in calls:
        _exact(compiled(*args), fn(*args))
    theirs = CountingBackend()
    torch._dynamo.reset()
    oracle = torch.compile(fn, backend=theirs)
    for args in calls:
        oracle(*args)
    return ours.frame_count, theirs.frame_count


X = torch.randn(6)


@pytest.mark.parametrize("kind", [np.int64, np.int32, np.float32, np.float64])
def test_new_values_of_one_numpy_type_reuse_the_graph(kind) -> None:
    calls = [(X, kind(v)) for v in (3, 4, 5, 7)]
    assert _counts(_scale_shift, calls) == (1, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_values_match_eager_under_each_backend(backend: str) -> None:
    counter = CountingBackend(lookup(backend))
    kiln.reset()
    compiled = kiln.compile(_scale_shift, backend=counter)
    for s in (np.float32(0.5), np.float32(-2.25), np.float32(3.0)):
        _exact(compiled(X, s), _scale_shift(X, s))
    for s in (np.int64(2), np.int64(-9)):
        _exact(compiled(X, s), _scale_shift(X, s))
    assert counter.frame_count == 2


def test_another_type_does_not_reuse_the_graph() -> None:
    # a Python int, another numpy integer, a numpy float, a Python float: each its own graph
    calls = [(X, np.int64(3)), (X, 3), (X, np.int32(3)), (X, np.float64(3.0)), (X, 3.0), (X, np.int64(4))]
    ours, theirs = _counts(_scale_shift, calls)
    assert ours == theirs == 5


def test_integer_tensors_keep_eager_type_promotion() -> None:
    xi = torch.arange(6)
    calls = [(xi, np.float64(1.5)), (xi, np.float64(2.5)), (xi, np.int64(3)), (xi, np.int64(4))]
    assert _counts(_scale_shift, calls) == (2, 2)


def test_a_python_level_use_specializes_with_eager_types() -> None:
    def fn(x, s):
        return x * s, s * 2, type(s).__name__

    ours = CountingBackend()
    kiln.reset()
    compiled = kiln.compile(fn, backend=ours)
    for s in (np.int64(3), np.int64(3), np.int64(4), np.float32(1.5)):
        got, want = compiled(X, s), fn(X, s)
        _exact(got[0], want[0])
        assert type(got[1]) is type(want[1]) and got[1] == want[1] and got[2] == want[2]
    assert ours.frame_count == 3  # specialized: a graph per value read


def test_a_scalar_torch_reads_with_its_own_dtype_stays_exact() -> None:
    def fn(x, s):
        return torch.tensor(s) + x.double(), torch.full((2,), s)

    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    for s in (np.float64(0.25), np.float64(0.5), np.float32(0.75)):
        _exact(compiled(X, s), fn(X, s))


def test_numpy_scalars_made_inside_the_function() -> None:
    def fn(x, n):
        s = np.float32(0.5) * np.float32(n)
        t = np.int64(n) + 1
        return x * s + t, s, t

    ours = CountingBackend()
    kiln.reset()
    compiled = kiln.compile(fn, backend=ours)
    for n in (2, 2, 3):
        got, want = compiled(X, n), fn(X, n)
        _exact(got[0], want[0])
        assert type(got[1]) is type(want[1]) and got[1] == want[1]
        assert type(got[2]) is type(want[2]) and got[2] == want[2]


@pytest.mark.filterwarnings("error::kiln.log.KilnWarning")  # no capture may fall back to eager
def test_zero_nan_and_huge_values_stay_correct() -> None:
    kiln.reset()
    compiled = kiln.compile(_scale_shift, backend="aot_eager")
    for s in (np.float64(2.0), np.float64(0.0), np.float64(-0.0), np.float64("nan"), np.float64("inf"),
              np.float32(1e30), np.int64(-2**63), np.int64(2**63 - 1)):
        got, want = compiled(X, s), _scale_shift(X, s)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, equal_nan=True)
            assert g.dtype == w.dtype
