"""numpy code on arrays that come from tensors is traced into the graph.

Each function goes tensor -> `.numpy()` -> numpy functions, operators, indexing, methods ->
`torch.from_numpy` (or returns the ndarray). Kiln must give eager's values *and dtypes* (numpy's
rules: float64 defaults, int true division to float64, bool sums to int64, python scalars that do
not widen float32 arrays), one graph and no break, like torch._dynamo.explain; an ndarray returned
from the frame is a real np.ndarray; a numpy function outside the table is a break naming it.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo

import kiln


def exp_roundtrip(x):
    a = np.exp(x.numpy()) + 1
    return torch.from_numpy(a)


def float64_defaults(x):
    a = x.numpy()
    return torch.from_numpy(a * np.ones(a.shape[1]) + np.arange(a.shape[1]))


def int_true_division(i):
    a = i.numpy()
    return torch.from_numpy(a / 2), torch.from_numpy(a // 3), torch.from_numpy(a % 3)


def bool_sum_and_mean(x):
    a = x.numpy()
    mask = a > 0
    return np.sum(mask), np.mean(a), mask.sum(axis=1), a.mean(axis=0, keepdims=True)


def scalar_keeps_float32(x):
    a = x.numpy()
    b = a * 2.5 - 1  # python scalars do not widen a float32 array
    return torch.from_numpy(b), b.dtype


def ufuncs(x):
    a = np.abs(x.numpy()) + 0.5
    return torch.from_numpy(np.log(a) + np.sqrt(a) * np.sin(a) - np.tanh(a) + np.square(a))


def shapes_and_views(x):
    a = x.numpy()
    b = a.reshape(2, -1).T
    c = np.transpose(a)[1:, ::2]
    d = np.expand_dims(a[0], 0)
    return torch.from_numpy(b.copy()), torch.from_numpy(c.copy()), \
        torch.from_numpy(d), a.shape, b.ndim, a.size, str(a.dtype)


def matmul_where_clip(x, y):
    a, b = x.numpy(), y.numpy()
    m = a @ b.T
    w = np.where(m > 0, m, 0.1 * m)
    return torch.from_numpy(np.clip(w, -1.0, 1.0) + np.maximum(a, 0).sum() + np.minimum(b, 0.5).max())


def concat_stack_astype(x, y):
    a, b = x.numpy(), y.numpy()
    c = np.concatenate([a, b], axis=0)
    s = np.stack([a, b], axis=1)
    return torch.from_numpy(c.astype(np.float64)), torch.from_numpy(s.astype("int32"))


def reductions(x):
    a = x.numpy()
    return (np.max(a, axis=1), a.min(), np.argmax(a, axis=0), np.std(a), a.var(axis=1, ddof=1),
            np.prod(a[:2, :2]), np.cumsum(a, axis=1))


def returns_ndarray(x):
    a = x.numpy()
    return np.exp(a) * 2


def int_array_ops(i):
    a = i.numpy()
    b = a * 3 + 1
    return torch.from_numpy(b), torch.from_numpy(b.astype(np.float32) / 4), np.sum(a), np.mean(a)


def inplace_on_array(x):
    a = x.numpy()
    a += 1.5  # also changes x: numpy shares its memory
    return x * 2


def creation_only(x):
    z = np.zeros((2, 3))
    z[0, 1] = 5.0
    return x + torch.from_numpy(z).float(), np.linspace(0, 1, 5)


def tensor_with_numpy_scalar(x, i):
    a = x.numpy()
    s = np.sum(a)  # np.float32 scalar
    m = np.max(a).astype(np.float64)
    return x * s + m, i * m, x > s, torch.tensor(m)


def sort_round_products_norm(x, i):
    a, n = x.numpy(), i.numpy()
    return (np.round(a * 10, 1), np.around(a), np.sort(a, axis=0), np.sort(a, axis=None), np.flip(a, 1),
            np.outer(a[0], a[1]), np.einsum("ij,kj->ik", a, a), np.linalg.norm(a), np.linalg.norm(a, axis=1),
            np.linalg.norm(n), np.exp2(n), np.round(n), np.outer(n, n))


def _x():
    torch.manual_seed(0)
    return torch.randn(4, 6)


CASES = [
    (exp_roundtrip, lambda: (_x(),)),
    (float64_defaults, lambda: (_x(),)),
    (int_true_division, lambda: (torch.arange(-6, 6).reshape(3, 4),)),
    (bool_sum_and_mean, lambda: (_x(),)),
    (scalar_keeps_float32, lambda: (_x(),)),
    (ufuncs, lambda: (_x(),)),
    (shapes_and_views, lambda: (_x(),)),
    (matmul_where_clip, lambda: (_x(), _x()[:3] * 2)),
    (concat_stack_astype, lambda: (_x(), _x() + 1)),
    (reductions, lambda: (_x(),)),
    (returns_ndarray, lambda: (_x(),)),
    (int_array_ops, lambda: (torch.arange(12, dtype=torch.int32).reshape(3, 4),)),
    (inplace_on_array, lambda: (_x(),)),
    (creation_only, lambda: (_x()[:2, :3],)),
    (tensor_with_numpy_scalar, lambda: (_x(), torch.arange(4))),
    (sort_round_products_norm, lambda: (_x(), torch.arange(6))),
]


def _same(got, want):
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    elif isinstance(want, (np.ndarray, np.generic)):
        assert type(got) is type(want), (type(got), type(want))
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        assert got == want


@pytest.mark.parametrize("fn,make", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_numpy_matches_eager_in_one_graph(fn, make, backend):
    kiln.reset()
    want = fn(*make())
    got = kiln.compile(fn, backend=backend)(*make())
    _same(got, want)
    stats = kiln.stats()
    assert stats["graph_breaks"] == 0 and stats["fallbacks"] == 0
    assert stats["graphs"] == 1


@pytest.mark.cpp
def test_numpy_through_inductor():
    kiln.reset()
    for fn, make in CASES[:6]:
        _same(kiln.compile(fn)(*make()), fn(*make()))
    assert kiln.stats()["fallbacks"] == 0


def test_inplace_changes_the_input_tensor():
    kiln.reset()
    x, y = _x(), _x()
    inplace_on_array(x)
    kiln.compile(inplace_on_array, backend="eager")(y)
    torch.testing.assert_close(y, x)


@pytest.mark.parametrize("fn,make", CASES, ids=[c[0].__name__ for c in CASES])
def test_numpy_counts_match_dynamo(fn, make):
    kiln.reset()
    ours = kiln.explain(fn)(*make())
    torch._dynamo.reset()
    theirs = torch._dynamo.explain(fn)(*make())
    assert ours.graph_break_count == 0, ours.break_reasons
    assert ours.graph_count <= theirs.graph_count


def unsupported_numpy(x):
    a = x.numpy()
    b = np.unwrap(a)  # not in Kiln's table: a break that names it
    return torch.from_numpy(np.abs(b))


def test_unsupported_numpy_function_breaks_with_its_name():
    kiln.reset()
    x = _x()
    report = kiln.explain(unsupported_numpy)(x)
    assert any("numpy.unwrap" in r.reason for r in report.break_reasons), report.break_reasons
    _same(kiln.compile(unsupported_numpy, backend="eager")(x), unsupported_numpy(x))


def test_numpy_on_grad_tensor_raises_as_eager():
    kiln.reset()
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        exp_roundtrip(x)
    with pytest.raises(RuntimeError, match="requires grad"):
        kiln.compile(exp_roundtrip, backend="eager")(x)


def test_casting_error_of_inplace_is_eagers():
    def fn(i):
        a = i.numpy()
        a += 1.5  # numpy refuses: float64 result into an int64 array
        return i

    kiln.reset()
    with pytest.raises(Exception) as want:
        fn(torch.arange(3))
    with pytest.raises(type(want.value)):
        kiln.compile(fn, backend="eager")(torch.arange(3))


def takes_ndarray(a, x):
    return torch.from_numpy(np.tanh(a) * 2) + x


def test_ndarray_input_is_a_guarded_graph_input():
    kiln.reset()
    a = np.linspace(-1, 1, 6).reshape(2, 3)
    x = torch.randn(2, 3, dtype=torch.float64)
    compiled = kiln.compile(takes_ndarray, backend="eager")
    _same(compiled(a, x), takes_ndarray(a, x))
    assert kiln.stats()["graphs"] == 1 and kiln.stats()["graph_breaks"] == 0
    b = a.astype(np.float32)  # another dtype: the guard fails, a new capture follows numpy's rules
    _same(compiled(b, x), takes_ndarray(b, x))
    assert kiln.stats()["recompiles"] >= 1
    a2 = a + 1  # same dtype and shape: the graph is reused on the new array's values
    _same(compiled(a2, x), takes_ndarray(a2, x))


def loop_rows_and_scalar_types(x):
    a = x.numpy()
    for row in a:
        x = x + torch.from_numpy(row * 2)
    return x, len(a), np.float64(a.sum()), np.float32(a)


def test_rows_len_and_numpy_scalar_types():
    kiln.reset()
    x = _x()
    _same(kiln.compile(loop_rows_and_scalar_types, backend="eager")(x.clone()), loop_rows_and_scalar_types(x.clone()))
    assert kiln.stats()["graphs"] == 1 and kiln.stats()["graph_breaks"] == 0


def branch_on_numpy_scalar(x):
    a = x.numpy()
    if np.sum(a) > 0:  # data-dependent: a break, then one side resumes
        return torch.from_numpy(a * 2)
    return torch.from_numpy(a - 1)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_branch_on_numpy_scalar(sign):
    kiln.reset()
    x = torch.ones(3, 3) * sign
    _same(kiln.compile(branch_on_numpy_scalar, backend="eager")(x.clone()), branch_on_numpy_scalar(x.clone()))
    assert kiln.stats()["fallbacks"] == 0
