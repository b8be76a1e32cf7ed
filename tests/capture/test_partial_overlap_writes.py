"""An in-place op that reads, shifted or reordered, memory it writes raises eager's error.

`x[:-1].add_(x[1:])`, `m.add_(m.t())` or `x[1:] = x[:-1]`: ATen refuses them ("some elements of
the input tensor and the written-to tensor refer to a single memory location"); a functional graph
(AOT autograd) read every element before writing and answered quietly. Capture now breaks the
graph at such a write, so the op runs eagerly. Writes that ATen accepts stay in the graph:
`x.mul_(x)`, `x[0] = x[1]`, disjoint halves, a result computed apart.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.errors import GraphBreakError


def _compiled(fn, **options):
    kiln.reset()
    return kiln.compile(fn, backend="aot_eager", **options)


def _eager_error(fn, *args) -> str:
    with pytest.raises(RuntimeError) as info:
        fn(*[a.clone() for a in args])
    return str(info.value)


def _shifted_add(x):
    x[:-1].add_(x[1:])
    return x * 2


def _transpose_add(m):
    y = m * 1
    y.add_(y.t())
    return y


def _shifted_setitem(x):
    y = x + 0
    y[1:] = y[:-1]
    return y


def _shifted_iadd_symbolic(x):
    n = x.shape[0]
    x[: n - 1] += x[1:]
    return x


@pytest.mark.parametrize("fn, shape", [(_shifted_add, (5,)), (_transpose_add, (3, 3)),
                                       (_shifted_setitem, (5,)), (_shifted_iadd_symbolic, (6,))])
def test_partial_overlap_raises_eagers_error(fn, shape) -> None:
    x = torch.randn(*shape)
    message = _eager_error(fn, x)
    for dynamic in (False, True):
        with pytest.raises(RuntimeError, match="refer to a single memory location") as info:
            _compiled(fn, dynamic=dynamic)(x.clone())
        assert str(info.value) == message


def test_partial_overlap_under_fullgraph_names_the_write() -> None:
    with pytest.raises(GraphBreakError, match="reads memory it writes"):
        _compiled(_shifted_add, fullgraph=True)(torch.randn(5))


def test_writes_eager_accepts_stay_in_one_graph() -> None:
    def f(x, m):
        x.mul_(x)                   # the same elements: full overlap
        x[0] = x[1]                 # the written view x[0] does not meet x[1]
        x[: x.shape[0] // 2].add_(x[x.shape[0] // 2:])  # disjoint halves
        m[:, 0] = m[:, 1]
        m[1:].add_(m[:-1].clone())  # read from a copy
        return x.sum() + m.sum()

    x, m = torch.randn(6), torch.randn(3, 4)
    expected = f(x.clone(), m.clone())
    compiled = _compiled(f, fullgraph=True)
    got = compiled(x.clone(), m.clone())
    torch.testing.assert_close(got, expected)
    assert kiln.stats()["graphs"] == 1
