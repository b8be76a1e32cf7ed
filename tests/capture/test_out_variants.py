"""`out=` inside a compiled function writes its out tensor, returns it, and raises eager's errors.

Regression tests (out= used to be dropped from the graph, a silent wrong
answer on every backend), then the OpInfo sweep of ops with an out= form: a CI slice here, every
op @slow (tests/capture/out_variant_sweep.py holds the sweep).
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

import kiln
from kiln.log import KilnWarning

sys.path.insert(0, str(Path(__file__).parent))
from out_variant_sweep import check_out_op, out_ops  # noqa: E402

def _options(backend: str) -> dict | None:
    return {"opt_level": "-O1"} if backend == "inductor" else None  # faster C++ builds in tests


BACKENDS = ["eager", "aot_eager", "inductor"]


def _compile(fn, backend):
    kiln.reset()
    return kiln.compile(fn, backend=backend, options=_options(backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_is_written_and_read_back(backend: str) -> None:
    def f(x, buf, colsum):
        torch.mul(x, 2, out=buf)
        torch.sum(x, 0, out=colsum)
        return buf + colsum

    x = torch.randn(3, 4)
    buf, colsum = torch.zeros(3, 4), torch.zeros(4)
    got = _compile(f, backend)(x, buf, colsum)
    torch.testing.assert_close(buf, x * 2)
    torch.testing.assert_close(colsum, x.sum(0))
    torch.testing.assert_close(got, x * 2 + x.sum(0))
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["fallbacks"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_call_returns_the_out_tensor(backend: str) -> None:
    def f(a, b, c):
        y = torch.add(a, b, out=c)
        return y is c, y

    a, b, c = torch.randn(5), torch.randn(5), torch.empty(5)
    same, y = _compile(f, backend)(a, b, c)
    assert same is True and y is c
    torch.testing.assert_close(c, a + b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tuple_out_returns_a_structseq_of_the_out_tensors(backend: str) -> None:
    def f(x, values, indices):
        r = torch.max(x, 0, out=(values, indices))
        return r, r.values is values, r.indices is indices

    x = torch.randn(3, 4)
    values, indices = torch.empty(4), torch.empty(4, dtype=torch.long)
    r, v_same, i_same = _compile(f, backend)(x, values, indices)
    expected = torch.max(x, 0)
    assert type(r) is type(torch.max(x, 0, out=(torch.empty(4), torch.empty(4, dtype=torch.long))))
    assert v_same and i_same and r[0] is values
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_made_in_the_frame_is_resized_inside_the_graph(backend: str) -> None:
    def f(x):
        e = torch.empty(0)
        torch.sum(x, 1, out=e)
        values, indices = torch.empty(0), torch.empty(0, dtype=torch.long)
        torch.sort(x, out=(values, indices))
        return e * 2, values, indices

    x = torch.randn(3, 4)
    got = _compile(f, backend)(x)
    expected = f(x)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and torch.equal(g, e)
    assert kiln.stats()["graph_breaks"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_resizing_an_input_breaks_and_warns_as_eager(backend: str) -> None:
    def f(x, out):
        torch.sum(x, 0, out=out)
        return out * 2

    x = torch.randn(3, 4)
    out = torch.zeros(2)  # not empty: eager resizes it and warns that this is deprecated
    compiled = _compile(f, backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = compiled(x, out)
    messages = [str(w.message) for w in caught]
    assert sum("was resized" in m for m in messages) == 1, messages  # eager's one, not the fake's
    assert not any(issubclass(w.category, KilnWarning) for w in caught)
    assert out.shape == (4,) and torch.equal(out, x.sum(0)) and torch.equal(got, x.sum(0) * 2)
    explanation = kiln.explain(f)(x, torch.empty(0))
    assert len(explanation.break_reasons) == 1
    assert "resizes" in explanation.break_reasons[0].reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_dtype_that_cannot_hold_the_result_raises_eagers_error(backend: str) -> None:
    def f(x, out):
        torch.mul(x, 2.5, out=out)
        return out

    out = torch.empty(3, dtype=torch.long)
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        _compile(f, backend)(torch.randn(3), out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reduction_into_a_wider_out_accumulates_in_outs_dtype(backend: str) -> None:
    def f(x, total, running):
        torch.sum(x, 0, out=total)
        torch.cumsum(x, 0, out=running)
        return total, running

    x = torch.randn(2000, 3)
    total, running = torch.empty(3, dtype=torch.float64), torch.empty(2000, 3, dtype=torch.float64)
    _compile(f, backend)(x, total, running)
    # eager computes in float64 here, not in float32 and then casts
    assert torch.equal(total, x.double().sum(0))
    assert torch.equal(running, x.double().cumsum(0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_under_autograd_raises_eagers_error(backend: str) -> None:
    def f(x, out):
        return torch.mul(x, 2, out=out)

    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        _compile(f, backend)(torch.randn(3, requires_grad=True), torch.empty(3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_into_views_and_into_an_input(backend: str) -> None:
    def f(x, rows, square):
        torch.mul(x[0], 2, out=rows[1])  # a view of an input
        torch.exp(x, out=x)  # the op's own input
        torch.matmul(x, x.t(), out=square)
        return rows, square

    x, rows, square = torch.randn(3, 3), torch.zeros(2, 3), torch.empty(3, 3)
    ex, erows, esquare = x.clone(), rows.clone(), square.clone()
    f(ex, erows, esquare)
    _compile(f, backend)(x, rows, square)
    torch.testing.assert_close((x, rows, square), (ex, erows, esquare))


def test_out_keeps_the_call_in_the_captured_graph() -> None:
    def f(x, buf):
        torch.mul(x, 2, out=buf)

    counter = kiln.backends.CountingBackend()
    kiln.reset()
    buf = torch.zeros(3)
    x = torch.randn(3)
    kiln.compile(f, backend=counter)(x, buf)
    assert torch.equal(buf, x * 2)
    (gm,) = counter.graphs
    assert [n.kwargs.get("out") is not None for n in gm.graph.nodes if n.op == "call_function"] == [True]


# ------------------------------------------------------------------------------- the OpInfo sweep
# one op per kind of lowering (binary and ternary pointwise, a where, reductions with one and two
# outputs, scans, sorts, matmuls, joins, gathers, norms); the whole database runs under `-m slow`
CI_SLICE = [
    "add", "div.no_rounding_mode", "where", "addcmul", "nansum", "cumsum", "logsumexp", "aminmax",
    "max.reduction_with_dim", "topk", "cummax", "addmm", "bmm", "cat", "gather", "softmax", "linalg.vector_norm",
]


@pytest.mark.cpp
@pytest.mark.parametrize("name", CI_SLICE)
def test_out_variant_slice(name: str) -> None:
    result = check_out_op(name)
    assert result == "pass", result


@pytest.mark.cpp
@pytest.mark.slow
def test_out_variant_full_sweep() -> None:
    results = {n: check_out_op(n) for n in sorted(out_ops())}
    tried = {n: r for n, r in results.items() if not r.startswith("skip")}
    failed = {n: r for n, r in tried.items() if r != "pass"}
    print(f"out= sweep: {len(tried) - len(failed)}/{len(tried)} ops pass")
    assert not failed, failed
