"""Reductions without an identity over an empty dim raise what eager raises, on every backend.

`x.max()` of an empty tensor returned -inf where eager raises `RuntimeError: max(): Expected
reduction dim to be specified for input.numel() == 0...`. Every such op (max, min, amax, amin,
argmax, argmin, aminmax, max/min along a dim, the inf and -inf vector norms), with and without a
dim, on tensors empty in each position, is compared with eager: exception type and message, or the
values where eager returns (an empty output). Sizes known to be 0 while compiling run the ATen call;
sizes that are 0 only at run time (nonzero's count, a slice by an int argument) are checked in the
kernel, and the same compiled code keeps working for the next non-empty input.
"""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import kiln
from kiln import config

OPS = {
    "max": lambda x: x.max(),
    "min": lambda x: x.min(),
    "amax": lambda x: x.amax(),
    "amax_0": lambda x: x.amax(0),
    "amin_last": lambda x: x.amin(-1, keepdim=True),
    "amax_all_dims": lambda x: x.amax(tuple(range(x.dim()))),
    "argmax": lambda x: x.argmax(),
    "argmin_0": lambda x: x.argmin(0),
    "argmax_keepdim": lambda x: x.argmax(keepdim=True),
    "aminmax": lambda x: torch.aminmax(x),
    "aminmax_last": lambda x: torch.aminmax(x, dim=-1),
    "max_dim": lambda x: x.max(-1),
    "min_dim_0": lambda x: x.min(0),
    "norm_inf": lambda x: torch.linalg.vector_norm(x, float("inf")),
    "norm_minus_inf_last": lambda x: torch.linalg.vector_norm(x, float("-inf"), dim=-1),
    "fused": lambda x: (x * 2 + 1).max() - 1,
}
SHAPES = [(0,), (3, 0), (0, 4), (0, 0)]


def _outcome(fn, *args):
    try:
        return fn(*args), None
    except Exception as exc:  # the test compares what eager and compiled code raise
        return None, exc


def _compare(fn, *args, compiled=None) -> None:
    expected, eager_error = _outcome(fn, *args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to eager would warn
        got, error = _outcome(compiled or kiln.compile(fn), *args)
    if eager_error is None:
        assert error is None, f"compiled code raised {error!r} where eager returned"
        torch.testing.assert_close(got, expected, equal_nan=True)
    else:
        assert type(error) is type(eager_error) and str(error) == str(eager_error), (eager_error, error)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    kiln.reset()


@pytest.mark.cpp
@pytest.mark.parametrize("name", list(OPS))
def test_static_empty_sizes(name) -> None:
    for shape in SHAPES:
        _compare(OPS[name], torch.randn(shape))
        kiln.reset()
    _compare(OPS[name], torch.zeros(0, 3, dtype=torch.int64))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_other_backends(backend) -> None:
    for name in ("max", "argmax", "max_dim", "aminmax_last"):
        for shape in SHAPES:
            kiln.reset()
            _compare(OPS[name], torch.randn(shape), compiled=kiln.compile(OPS[name], backend=backend))


DATA_DEPENDENT = {
    "max": lambda x: torch.nonzero(x).max(),
    "min_float": lambda x: torch.nonzero(x).float().min() * 2,
    "amax_0": lambda x: torch.nonzero(x).amax(0),
    "argmax": lambda x: torch.nonzero(x).argmax(),
    "argmin_0": lambda x: torch.nonzero(x).argmin(0),
    "max_dim": lambda x: torch.nonzero(x).max(0).values + 1,
    "aminmax": lambda x: torch.aminmax(torch.nonzero(x)),
    "norm_inf": lambda x: torch.linalg.vector_norm(torch.nonzero(x).float(), float("inf")),
    "bool_any_max": lambda x: (torch.nonzero(x) > 0).amax(0),
}


@pytest.mark.cpp
@pytest.mark.parametrize("name", list(DATA_DEPENDENT))
def test_size_zero_only_at_run_time(name) -> None:
    fn = DATA_DEPENDENT[name]
    compiled = kiln.compile(fn, dynamic=True)
    for x in (torch.tensor([1.0, 0.0, 3.0]), torch.zeros(3), torch.tensor([0.0, 2.0, 0.0])):
        _compare(fn, x, compiled=compiled)
    assert kiln.stats()["recompiles"] == 0


@pytest.mark.cpp
@pytest.mark.parametrize("op", ["amin", "argmax", "max_dim"])
def test_empty_output_over_a_run_time_empty_dim(op) -> None:
    # the reduced dim is empty only at run time and the output is empty too: a check where the
    # result is read would read nothing, so the ATen call runs (found by the faulting fuzz programs)
    reduce = {"amin": lambda t: t.amin(0), "argmax": lambda t: t.argmax(0), "max_dim": lambda t: t.max(0).values}[op]
    fn = lambda x: reduce(x[torch.nonzero(x.sum(1) > 0.5)[:, 0]])  # noqa: E731
    for x in (torch.zeros(4, 0), torch.rand(4, 3) + 1, torch.zeros(4, 3)):
        kiln.reset()
        _compare(fn, x, compiled=kiln.compile(fn, dynamic=True))


@pytest.mark.cpp
def test_slice_by_an_int_argument() -> None:
    fn = lambda x, n: (x[:n].max(), x[:n].argmin())  # noqa: E731
    compiled = kiln.compile(fn, dynamic=True)
    x = torch.randn(5)
    for n in (3, 0, 4):
        _compare(fn, x, n, compiled=compiled)


@pytest.mark.cpp
def test_dynamic_sizes_that_cannot_be_zero_keep_their_fused_kernel() -> None:
    # a backed size is >= 2 under its guard: no check, no ATen call
    import sympy

    from kiln.symbolic.expr import surely_positive

    s0 = sympy.Symbol("s0", integer=True, nonnegative=True)
    u0 = sympy.Symbol("u0", integer=True, nonnegative=True)
    n = sympy.Symbol("s1", integer=True)
    assert surely_positive(s0) and surely_positive(3 * s0 ** 2) and surely_positive(sympy.Integer(4))
    assert not surely_positive(u0) and not surely_positive(n) and not surely_positive(s0 - 2)
    assert not surely_positive(sympy.Integer(0))
    fn = lambda x: x.amax(-1) * 2  # noqa: E731
    compiled = kiln.compile(fn, dynamic=True)
    for shape in ((3, 5), (4, 7)):
        _compare(fn, torch.randn(shape), compiled=compiled)


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_triton() -> None:
    pytest.importorskip("triton")
    with config.patch(cpu_backend="triton"):
        for name in ("max", "argmax", "max_dim", "aminmax_last"):
            for shape in SHAPES[:2]:
                kiln.reset()
                _compare(OPS[name], torch.randn(shape))
        for name in ("max", "argmax", "amax_0"):
            kiln.reset()
            fn = DATA_DEPENDENT[name]
            compiled = kiln.compile(fn, dynamic=True)
            for x in (torch.tensor([1.0, 0.0, 3.0]), torch.zeros(3)):
                _compare(fn, x, compiled=compiled)
