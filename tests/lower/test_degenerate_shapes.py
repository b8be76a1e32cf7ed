"""Size-0 and size-1 dims through the lowering: eager's values and shapes, and no fallback to eager.

Index arithmetic divides by sizes (a reshape's `//` and `%`, a roll's `%`, a repeat's `%`); with a
size of 0 such a division once raised ZeroDivisionError inside the lowering and the frame ran
eagerly with a warning. Chains of pointwise, reduction, view, indexing and scatter ops run on every
shape below through kiln.compile(backend="inductor"); a CI slice takes one shape per chain in
rotation, the `slow` sweep every pair.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln

SHAPES = [(0,), (1,), (0, 3), (3, 0), (1, 0), (0, 1), (1, 1), (2, 0, 3), (0, 2, 2), (1, 3, 1), (2, 1, 0, 2)]
LONG = torch.int64


def _nonempty_last(x, fn):
    return fn(x) if x.shape[-1] else x.sum(-1)


CHAINS = {
    # pointwise and reductions
    "pointwise": lambda x: torch.sin(x) * 2 + x.exp(),
    "sum_last": lambda x: (x * 2).sum(-1),
    "mean_last": lambda x: x.mean(-1),
    "prod": lambda x: x.prod(-1),
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax_first": lambda x: torch.log_softmax(x * 3, 0),
    "logsumexp": lambda x: torch.logsumexp(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "argmax": lambda x: _nonempty_last(x, lambda t: t.argmax(-1)),
    "all": lambda x: (x > 0).all(-1),
    "where_sum": lambda x: torch.where(x > 0, x, x * 2).sum(0),
    "int_div_mod": lambda x: ((x * 10).long() // 3 % 5).sum(-1),
    "cumsum": lambda x: torch.cumsum(x, 0) + 1,
    "sort": lambda x: torch.sort(x, -1).values + 1,
    # views
    "reshape_flat": lambda x: (x + 1).reshape(-1) * 2,
    "reshape_back": lambda x: (x + 1).reshape(-1).reshape(x.shape).sum(0),
    "view_column": lambda x: x.exp().reshape(1, -1).view(-1, 1) + 1,
    "permute": lambda x: x.permute(*reversed(range(x.dim()))).contiguous() + 1,
    "transpose_sum": lambda x: (x.transpose(0, -1) * 2).sum(0),
    "expand": lambda x: x.unsqueeze(0).expand(2, *x.shape) * 2,
    "slice": lambda x: x[1:] * 2 + 1,
    "slice_empty": lambda x: x[:0] * 2 + 1,
    "slice_step": lambda x: x[::2] + x[::2],
    "flat_step": lambda x: x.reshape(-1)[::3] * 2,
    "flip": lambda x: x.flip(0) + x,
    "roll": lambda x: torch.roll(x, 1, 0) * 2,
    "roll_flat": lambda x: torch.roll(x, 2) * 2,
    "repeat": lambda x: x.repeat(2, *([1] * (x.dim() - 1))) + 1,
    "repeat_zero": lambda x: x.repeat(0, *([1] * (x.dim() - 1))) + 1,
    "cat": lambda x: torch.cat([x, x * 2], 0),
    "cat_last_sum": lambda x: torch.cat([x, x + 1], -1).sum(-1),
    "cat_with_empty": lambda x: torch.cat([x.reshape(-1), torch.zeros(0), x.reshape(-1) + 1]),
    "stack": lambda x: torch.stack([x, x], -1) * 2,
    "pad": lambda x: F.pad(x, (1, 2)) * 2,
    "matmul": lambda x: (x.reshape(x.shape[0], -1) @ x.reshape(x.shape[0], -1).t()) + 1,
    # indexing and scatters
    "gather": lambda x: torch.gather(x, 0, torch.zeros_like(x, dtype=LONG)) + 1,
    "index_select": lambda x: torch.index_select(x, -1, torch.zeros(min(x.shape[-1], 1), dtype=LONG)) * 2,
    "embedding_no_ids": lambda x: F.embedding(torch.zeros(0, dtype=LONG), x.reshape(x.shape[0], -1)) + 1,
    "index_put_no_ids": lambda x: x.clone().index_put_((torch.zeros(0, dtype=LONG),), torch.tensor(1.0)),
    "scatter_add_no_ids": lambda x: x.reshape(-1).clone().scatter_add_(0, torch.zeros(0, dtype=LONG), torch.zeros(0)),
}


def _outcome(fn, x):
    try:
        return fn(x), None
    except Exception as exc:  # compared with what the compiled function raises
        return None, exc


def _check(name: str, shape: tuple[int, ...]) -> None:
    kiln.reset()
    fn = CHAINS[name]
    x = torch.randn(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eager's own notes (var of one element, ...)
        expected, eager_error = _outcome(fn, x)
        warnings.simplefilter("error", kiln.log.KilnWarning)  # a fallback to eager warns
        got, error = _outcome(kiln.compile(fn, backend="inductor"), x)
    assert kiln.stats()["fallbacks"] == 0
    if eager_error is not None:
        assert type(error) is type(eager_error), (eager_error, error)
        return
    assert error is None, error
    for g, e in zip(got if isinstance(got, (list, tuple)) else [got], expected if isinstance(expected, (list, tuple)) else [expected]):
        assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape)
        torch.testing.assert_close(g, e, equal_nan=True)


CI_SLICE = [(name, SHAPES[k % len(SHAPES)]) for k, name in enumerate(CHAINS)] + [
    ("reshape_back", (3, 0)), ("roll_flat", (2, 0, 3)), ("repeat_zero", (0, 2, 2))]


@pytest.mark.parametrize("name,shape", CI_SLICE, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in CI_SLICE])
def test_degenerate_shapes_slice(name, shape) -> None:
    _check(name, shape)


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("name", list(CHAINS))
def test_degenerate_shapes_sweep(name, shape) -> None:
    _check(name, shape)


def test_backward_through_empty_dims() -> None:
    def f(x):
        return (torch.softmax(x, -1) * x).sum()

    for shape in [(0, 3), (3, 0), (1, 1)]:
        kiln.reset()
        x1, x2 = torch.randn(shape, requires_grad=True), None
        x2 = x1.detach().clone().requires_grad_()
        f(x1).backward()
        with warnings.catch_warnings():
            warnings.simplefilter("error", kiln.log.KilnWarning)
            kiln.compile(f, backend="inductor")(x2).backward()
        assert kiln.stats()["fallbacks"] == 0
        torch.testing.assert_close(x2.grad, x1.grad)
