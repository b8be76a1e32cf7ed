"""Outputs whose metadata used to differ from eager's, on every backend.

- view_as_complex / view_as_real / view(dtype) of an input: the runtime rebuilt the view with
  as_strided on the base and so returned the base's dtype (float32 for a complex64 view).
- batch norm in eval mode on CPU: eager returns empty save_mean / save_invstd; the fake impls of
  the functional and no-training overloads and the lowering's decomposition returned (C,).
- nonzero / argwhere whose result leaves the graph as it is: the wrapper read the unbacked
  count before binding it (NameError).
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.fake import FakeTensorMode

def _options(backend: str) -> dict | None:
    return {"opt_level": "-O1"} if backend == "inductor" else None  # faster C++ builds in tests


BACKENDS = ["eager", "aot_eager", "inductor"]
aten = torch.ops.aten


def _run(fn, backend, *args):
    kiln.reset()
    return kiln.compile(fn, backend=backend, options=_options(backend))(*args)


def _assert_same(got, expected):
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for g, e in zip(got, expected, strict=True):
        assert (g.dtype, g.shape) == (e.dtype, e.shape)
        torch.testing.assert_close(g, e, equal_nan=True)  # float bits seen as float16 can be NaN


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_as_complex_of_an_input_keeps_dtype_and_aliases(backend: str) -> None:
    x = torch.randn(5, 2)
    got = _run(lambda t: torch.view_as_complex(t), backend, x)
    _assert_same(got, torch.view_as_complex(x))
    got[0] = 7 + 8j  # still a view of x, as in eager
    assert x[0].tolist() == [7.0, 8.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dtype_views_of_an_input(backend: str) -> None:
    def f(z, x):
        return torch.view_as_real(z), x.view(torch.int32), x.view(torch.float16)[1:]

    z, x = torch.randn(4, dtype=torch.complex64), torch.randn(3, 4)
    _assert_same(_run(f, backend, z, x), f(z, x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_as_complex_gradient(backend: str) -> None:
    def f(x):
        return torch.view_as_complex(x * 2)

    x = torch.randn(3, 2, requires_grad=True)
    ex = x.detach().clone().requires_grad_()
    _run(f, backend, x).abs().sum().backward()
    f(ex).abs().sum().backward()
    torch.testing.assert_close(x.grad, ex.grad)


def test_fake_batch_norm_eval_statistics_are_empty_on_cpu() -> None:
    x, w, b, rm, rv = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2), torch.randn(2), torch.rand(2)
    cases = [(aten._native_batch_norm_legit_functional.default, (x, w, b, rm, rv, False, 0.1, 1e-5)),
             (aten._native_batch_norm_legit_no_training.default, (x, w, b, rm, rv, 0.1, 1e-5)),
             (aten._native_batch_norm_legit.default, (x, w, b, rm.clone(), rv.clone(), False, 0.1, 1e-5))]
    mode = FakeTensorMode()
    for op, args in cases:
        expected = op(*args)
        with mode:
            got = op(*[mode.from_real(a) if isinstance(a, torch.Tensor) else a for a in args])
        assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in expected], op


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("training", [False, True])
def test_native_batch_norm_legit_outputs(backend: str, training: bool) -> None:
    def f(x, w, b, rm, rv):
        return aten._native_batch_norm_legit(x, w, b, rm, rv, training, 0.1, 1e-5)

    args = [torch.randn(3, 2, 4), torch.randn(2), torch.randn(2), torch.randn(2), torch.rand(2)]
    eager_args = [a.clone() for a in args]
    _assert_same(_run(f, backend, *args), f(*eager_args))
    _assert_same(tuple(args), tuple(eager_args))  # running statistics updated alike


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_norm_module_in_eval_mode(backend: str) -> None:
    bn = torch.nn.BatchNorm2d(3).eval()
    bn.running_mean.uniform_()
    x = torch.randn(2, 3, 4, 4)
    _assert_same(_run(bn, backend, x), bn(x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("values", [[[1.0, 0, 2], [0, 0, 3]], [[0.0, 0, 0]], [[1.0, 1, 1], [1, 1, 1]]])
def test_nonzero_and_argwhere_returned_from_the_graph(backend: str, values: list) -> None:
    def f(x):
        return torch.nonzero(x), torch.argwhere(x * 2)

    x = torch.tensor(values)
    _assert_same(_run(f, backend, x), f(x))
    assert kiln.stats()["fallbacks"] == 0
