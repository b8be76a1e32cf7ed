"""Checks eager performs are never dropped: an op that raises on its inputs' values (an integer
division by zero, an index out of range) raises under kiln.compile even when its result is dead,
read in part, multiplied by zero, selected away by a `where`, or only its shape is used.

Each program runs eagerly and compiled (capture only, AOT autograd, and the default backend whose
kernels must check every element: kiln/lower/coverage.py), static and dynamic, on good inputs
(values equal) and bad ones (eager's exception class). A kernel count shows the common case, an
op read whole, gets no check-only pass.
"""
from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import config

from .conftest import compile_fn

pytestmark = pytest.mark.cpp


def _int(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


# op name -> (op(x, i) returning a 2-d [2, 3] value, good inputs, bad inputs)
# x and i are 2-d; the bad input breaks an element of the value's last row or column only.
def _floordiv(a, b):
    return a // b


def _remainder(a, b):
    return a % b


def _fmod(a, b):
    return torch.fmod(a, b)


def _trunc_div(a, b):
    return torch.div(a, b, rounding_mode="trunc")


def _index(x, i):
    return x[i]


def _gather(x, i):
    return x.gather(1, i)


def _index_select(x, i):
    return x.index_select(0, i.flatten())[:, 0].view(2, 3)


def _index_select_dim1(x, i):
    return x.index_select(1, i[0]).repeat(2, 1)


def _embedding(x, i):
    return F.embedding(i, x)[..., 0]


def _take(x, i):
    return torch.take(x, i)


_DIV_GOOD = (_int([[7, 8, 9], [10, 11, 12]]), _int([[2, 3, 4], [5, 6, 7]]))
_DIV_BAD = (_int([[7, 8, 9], [10, 11, 12]]), _int([[2, 3, 4], [5, 6, 0]]))
_X = torch.arange(12.0).view(4, 3)
OPS = {
    "floordiv": (_floordiv, _DIV_GOOD, _DIV_BAD),
    "floordiv_i32": (_floordiv, tuple(t.int() for t in _DIV_GOOD), tuple(t.int() for t in _DIV_BAD)),
    "remainder": (_remainder, _DIV_GOOD, _DIV_BAD),
    "fmod_i16": (_fmod, tuple(t.short() for t in _DIV_GOOD), tuple(t.short() for t in _DIV_BAD)),
    "trunc_div": (_trunc_div, _DIV_GOOD, _DIV_BAD),
    "index": (_index, (_X, _int([[0, 1, 2], [3, 2, 1]])), (_X, _int([[0, 1, 2], [3, 2, 4]]))),
    "index_i32": (_index, (_X, _int([[0, 1, 2], [3, 2, 1]], torch.int32)),
                  (_X, _int([[0, 1, 2], [3, 2, -5]], torch.int32))),
    "gather": (_gather, (_X[:2], _int([[0, 1, 2], [2, 1, 0]])), (_X[:2], _int([[0, 1, 2], [2, 1, 3]]))),
    "index_select": (_index_select, (_X, _int([[0, 1, 2], [3, 2, 1]])), (_X, _int([[0, 1, 2], [3, 2, 4]]))),
    "index_select_dim1": (_index_select_dim1, (_X, _int([[0, 1, 2], [0, 0, 0]])),
                          (_X, _int([[0, 1, 3], [0, 0, 0]]))),
    "embedding": (_embedding, (_X, _int([[0, 1, 2], [3, 2, 1]])), (_X, _int([[0, 1, 2], [3, 2, 4]]))),
    "take": (_take, (_X, _int([[0, 1, 2], [11, 2, 1]])), (_X, _int([[0, 1, 2], [3, 2, 12]]))),
}


def _dead(op, x, i):
    _ = op(x, i)
    return x + 1


def _times_zero(op, x, i):
    y = op(x, i)
    return y * 0 if not y.dtype.is_floating_point else y[:0].sum() + x


def _where_untaken(op, x, i):
    y = op(x, i)
    return torch.where(torch.ones(y.shape, dtype=torch.bool), y.new_zeros(()), y)


def _first_row(op, x, i):
    return op(x, i)[0] + 1


def _first_column(op, x, i):
    return op(x, i)[:, :1] * 2


def _empty_slice(op, x, i):
    return op(x, i)[:, :0] + 1


def _partial_sum(op, x, i):
    return op(x, i)[:1].sum(-1)


def _shape_only(op, x, i):
    return torch.zeros(op(x, i).shape)


def _bitwise_and_zero(op, x, i):
    y = op(x, i)
    return y & 0 if not y.dtype.is_floating_point else (y * 2).amax() + x.sum()


def _where_branch(op, x, i):
    y = op(x, i)
    return torch.where(y > 100, y, y.new_zeros(()))


def _diagonal(op, x, i):
    return op(x, i).diagonal() + 1


def _transposed_first_row(op, x, i):
    return op(x, i).t()[0] + 1


def _whole(op, x, i):
    return op(x, i) + 1


USES = [_dead, _times_zero, _where_untaken, _first_row, _first_column, _empty_slice, _partial_sum, _shape_only,
        _bitwise_and_zero, _where_branch, _diagonal, _transposed_first_row, _whole]


def _outcome(fn, args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the class is what is compared
        return type(e)


def _same(got, want) -> None:
    if isinstance(want, type):
        assert got is want or (isinstance(got, type) and issubclass(got, want)), (got, want)
        return
    assert not isinstance(got, type), f"raised {got}, eager returned"
    torch.testing.assert_close(got, want)


def _run(backend: str | None, dynamic: bool, op_name: str, use) -> None:
    op, good, bad = OPS[op_name]

    def program(x, i):
        return use(op, x, i)

    kiln.reset()
    kwargs = {} if backend is None else {"backend": backend}
    compiled = kiln.compile(program, dynamic=dynamic, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to eager would hide what the kernels do
        for args in (good, bad, good):
            _same(_outcome(compiled, args), _outcome(program, args))


@pytest.mark.parametrize("use", USES, ids=[u.__name__.strip("_") for u in USES])
@pytest.mark.parametrize("op_name", list(OPS))
def test_default_backend_checks_every_element(op_name, use) -> None:
    _run(None, False, op_name, use)


@pytest.mark.parametrize("use", [_dead, _times_zero, _first_row, _empty_slice, _shape_only, _where_branch],
                         ids=lambda u: u.__name__.strip("_"))
@pytest.mark.parametrize("op_name", ["floordiv", "index", "gather", "embedding", "index_select_dim1"])
def test_dynamic_shapes_check_every_element(op_name, use) -> None:
    _run(None, True, op_name, use)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("use", [_dead, _shape_only], ids=lambda u: u.__name__.strip("_"))
@pytest.mark.parametrize("op_name", ["floordiv", "remainder", "index", "gather", "embedding", "take"])
def test_graphs_keep_dead_checking_ops(backend, op_name, use) -> None:
    _run(backend, False, op_name, use)


def _train_dead_index(x, i):
    _ = x[i]
    return (x * 2).sum()


def _train_gather_first(x, i):
    return x.gather(1, i)[0].sum()


def _train_embedding_first(x, i):
    return F.embedding(i, x)[0].sum() * 3


def _train_dead_division(x, i):
    _ = i // (i - 1)
    return x.sin().sum()


# good indices, then bad ones in a row the program does not read (x is [4, 2])
_TRAIN_INDICES = {
    _train_dead_index: (_int([[0, 1], [2, 0]]), _int([[0, 1], [2, 4]])),
    _train_gather_first: (_int([[0, 1], [1, 0]]), _int([[0, 1], [1, 2]])),
    _train_embedding_first: (_int([[0, 1], [2, 0]]), _int([[0, 1], [2, 4]])),
    _train_dead_division: (_int([[0, 2], [2, 0]]), _int([[0, 2], [1, 0]])),
}


@pytest.mark.parametrize("backend", [None, "aot_eager"])
@pytest.mark.parametrize("fn", [_train_dead_index, _train_gather_first, _train_embedding_first, _train_dead_division],
                         ids=lambda f: f.__name__.strip("_"))
def test_training_graphs_check_in_the_forward(fn, backend) -> None:
    kiln.reset()
    compiled = kiln.compile(fn, **({} if backend is None else {"backend": backend}))
    for i in _TRAIN_INDICES[fn]:
        x = torch.randn(4, 2, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        want = _outcome(lambda: fn(xe, i).backward() or xe.grad, ())
        got = _outcome(lambda: compiled(x, i).backward() or x.grad, ())
        _same(got, want)


_WHOLE = {
    "embedding": (lambda w, i: F.embedding(i, w) * 2, (_X, _int([1, 2]))),
    "floordiv": (lambda a, b: a // b + 1, _DIV_GOOD),
    "gather_sum": (lambda x, i: x.gather(1, i).sum(), (_X, _int([[0], [1], [2], [0]]))),
    "index": (lambda x, i: x[i] * 2, (_X, _int([1, 2]))),
    "index_2d": (lambda x, i: x[i, i] + 1, (_X, _int([1, 2]))),
    "remainder_where": (lambda a, b: torch.where(a % b == 0, a, b), _DIV_GOOD),
    "embedding_sum": (lambda w, i: F.embedding(i, w).sum(-1), (_X, _int([[1, 2]]))),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), (_X, _int([0, 1, 2, 0]))),
    "floordiv_flattened": (lambda a, b: (a // b).view(-1) + 1, _DIV_GOOD),
    "floordiv_split": (lambda a, b: (a // b).view(3, 2) + 1, tuple(t.view(-1) for t in _DIV_GOOD)),
    "embedding_transposed": (lambda w, i: F.embedding(i, w).t() * 2, (_X, _int([1, 2]))),
    "embedding_broadcast": (lambda w, i: F.embedding(i, w) + w[:1].unsqueeze(1), (_X, _int([[1, 2], [3, 0]]))),
    "gather_permuted_view": (lambda x, i: x.gather(1, i).view(2, 2, 3).permute(2, 0, 1).reshape(3, 4) - 1,
                             (_X, _int([[0, 1, 2]] * 4))),
}


@pytest.mark.parametrize("name", list(_WHOLE))
def test_an_op_read_whole_gets_no_check_pass(name) -> None:
    fn, args = _WHOLE[name]
    c = compile_fn(fn, *args)
    assert c.kernel_count == 1, c.cpp_source


def test_a_partly_read_op_gets_one_check_pass() -> None:
    c = compile_fn(lambda w, i: F.embedding(i, w)[0], _X, _int([0, 1]))
    assert c.kernel_count == 2
    with pytest.raises(IndexError):
        c(_X, _int([0, 9]))
    torch.testing.assert_close(c(_X, _int([2, 1]))[0], _X[2])


@pytest.mark.triton
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("use", [_dead, _times_zero, _first_row, _where_untaken], ids=lambda u: u.__name__.strip("_"))
@pytest.mark.parametrize("op_name", ["floordiv", "index", "embedding"])
def test_triton_kernels_check_every_element(op_name, use) -> None:
    pytest.importorskip("triton")
    op, good, bad = OPS[op_name]
    with config.patch(cpu_backend="triton"):
        c = compile_fn(lambda x, i: use(op, x, i), *good)
        for args in (good, bad):
            want = _outcome(lambda *a: (use(op, *a),), args)
            got = _outcome(c, args)
            if isinstance(want, type):
                _same(got, want)
            else:
                _same(got[0], want[0])


def _dead_cholesky(x):
    _ = torch.linalg.cholesky(x)
    return x + 1


def _dead_inverse(x):
    _ = torch.linalg.inv(x)
    return x * 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager", None])
@pytest.mark.parametrize("fn", [_dead_cholesky, _dead_inverse], ids=lambda f: f.__name__.strip("_"))
def test_dead_factorizations_still_fail_on_bad_matrices(fn, backend) -> None:
    kiln.reset()
    compiled = kiln.compile(fn, **({} if backend is None else {"backend": backend}))
    good, bad = torch.eye(3) * 2, (-torch.eye(3) if fn is _dead_cholesky else torch.zeros(3, 3))
    torch.testing.assert_close(compiled(good), fn(good))
    # eager raises torch.linalg.LinAlgError; an ATen call inside compiled kernels' wrapper raises
    # it as a RuntimeError (its base class), which the default backend is held to here
    with pytest.raises(torch.linalg.LinAlgError if backend else RuntimeError, match="factorization|singular"):
        compiled(bad)
