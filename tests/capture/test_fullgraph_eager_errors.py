"""fullgraph=True and an in-place write eager refuses: a write into a tensor whose elements share
memory (an expand) that ATen rejects ("more than one element of the written-to tensor refers to a
single memory location") raises that RuntimeError, eager's type and message, under every backend,
as torch.compile(backend="eager") does, instead of a GraphBreakError; a write eager accepts (fill_,
zero_) stays a break, and without fullgraph the write keeps running natively with eager's outcome."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import kiln
from kiln.errors import GraphBreakError


def local_expand_add(base):
    x = base.expand(4, 3)
    x.add_(1)
    return x


def local_expand_copy(base):
    x = base.expand(4, 3)
    x.copy_(torch.ones(4, 3))
    return x


def local_expand_mul_tensor(base):
    y = base * 2
    x = y.expand(2, 4, 3)
    x.mul_(torch.full((2, 4, 3), 3.0))
    return x.sum()


def expanded_input_add(x):
    x.add_(2)
    return x * 2


def view_of_expanded_input(x):
    x[1:3].sub_(1)
    return x


def setitem_column_of_expand(base):
    x = base.expand(4, 3)
    x[:, 0] = torch.arange(4.0)
    return x


def operator_iadd(base):
    x = base.expand(4, 3)
    x += torch.ones(3)
    return x


CASES: list[tuple[Callable[..., Any], Callable[[], torch.Tensor]]] = [
    (local_expand_add, lambda: torch.randn(1, 3)),
    (local_expand_copy, lambda: torch.randn(1, 3)),
    (local_expand_mul_tensor, lambda: torch.randn(1, 3)),
    (expanded_input_add, lambda: torch.randn(1, 3).expand(4, 3)),
    (view_of_expanded_input, lambda: torch.randn(3).expand(4, 3)),
    (setitem_column_of_expand, lambda: torch.randn(1, 3)),
    (operator_iadd, lambda: torch.randn(1, 3)),
]


def _error(fn: Callable[..., Any], arg: torch.Tensor) -> BaseException:
    with pytest.raises(Exception) as info:
        fn(arg)
    return info.value


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("fn, make", CASES, ids=[fn.__name__ for fn, _ in CASES])
def test_fullgraph_raises_eagers_error(fn, make, backend):
    expected = _error(fn, make())
    assert isinstance(expected, RuntimeError) and "single memory location" in str(expected)
    kiln.reset()
    got = _error(kiln.compile(fn, fullgraph=True, backend=backend), make())
    assert type(got) is type(expected) and str(got) == str(expected)
    assert any(fn.__name__ in note and "fullgraph" in note for note in getattr(got, "__notes__", []))
    if backend == "eager":  # torch.compile's own answer: a RuntimeError (for some, its subclass wrapping it)
        torch._dynamo.reset()
        real = _error(torch.compile(fn, fullgraph=True, backend="eager"), make())
        assert isinstance(real, RuntimeError)


@pytest.mark.parametrize("fn, make", CASES[:4], ids=[fn.__name__ for fn, _ in CASES[:4]])
def test_without_fullgraph_the_error_is_still_eagers(fn, make):
    expected = _error(fn, make())
    kiln.reset()
    got = _error(kiln.compile(fn), make())
    assert type(got) is type(expected) and str(got) == str(expected)


def test_a_write_eager_accepts_stays_a_break_under_fullgraph():
    def fill(base):
        x = base.expand(4, 3)
        x.fill_(2.0)
        return x

    kiln.reset()
    with pytest.raises(GraphBreakError, match="share memory"):
        kiln.compile(fill, fullgraph=True)(torch.randn(1, 3))


def test_a_handler_in_the_frame_keeps_the_break():
    """Under a try block the error might be caught by the frame: no answer is made up for it."""
    def guarded(base):
        x = base.expand(4, 3)
        try:
            x.add_(1)
        except RuntimeError:
            x = x + 1
        return x

    kiln.reset()
    with pytest.raises(GraphBreakError):
        kiln.compile(guarded, fullgraph=True)(torch.randn(1, 3))
    torch.testing.assert_close(kiln.compile(guarded)(torch.ones(1, 3)), guarded(torch.ones(1, 3)))


def test_the_probe_leaves_the_random_stream_alone():
    def draw(base):
        x = base.expand(4, 3)
        x.add_(1)
        return x

    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    kiln.reset()
    with pytest.raises(RuntimeError):
        kiln.compile(draw, fullgraph=True)(torch.randn(1, 3))
    torch.manual_seed(0)
    torch.testing.assert_close(torch.rand(3), expected)
