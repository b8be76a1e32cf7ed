"""The RemovableHandle of `x.register_hook(fn)` on an input inside the compiled frame: returned,
stored on an object, kept across a break, or removed in the frame (`h.remove()`, twice too). The
registration is replayed after the graph; its handle is now the replay's (returned or stored, it is
the real handle), and a remove() in the frame drops the registration. Was: any use of the handle
made the whole frame run eagerly (0 graphs where torch.compile makes 1). Oracle: eager for the
outputs, the gradients after a backward before and after the handle's removal, and the handle's
type; torch.compile's graph count (1)."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

import kiln

GRAD = torch.tensor([1.0, 2.0, 3.0])


def returned(x, y):
    h = x.register_hook(lambda g: g * 2)
    return x, y * y, h


def returned_twice_in_a_list(x, y):
    hs = [x.register_hook(lambda g: g * 4), x.register_hook(lambda g: g / 2)]
    return x, y + 1, [hs, hs[0]]


def removed_then_another(x, y):
    h = x.register_hook(lambda g: g * 2)
    y = y * y
    h.remove()
    x.register_hook(lambda g: g * 3)
    return x, y, None


def removed_twice(x, y):
    h = x.register_hook(lambda g: g * 5)
    h.remove()
    h.remove()
    return x, y.sin(), None


def first_of_two_removed_then_a_third(x, y):
    a = x.register_hook(lambda g: g * 2)
    b = x.register_hook(lambda g: g + 1)
    a.remove()
    c = x.register_hook(lambda g: g * 10)
    return x, y * 3, [b, c]


class _Holder:
    handle: Any = None


_holder = _Holder()


def stored_on_an_object(x, y):
    _holder.handle = x.register_hook(lambda g: g * 7)
    return x, y - 1, None


KEPT = [returned, returned_twice_in_a_list, removed_then_another, removed_twice, first_of_two_removed_then_a_third,
        stored_on_an_object]


def removed_then_returned(x, y):  # eager's handle, removed, goes back to the caller
    h = x.register_hook(lambda g: g * 2)
    h.remove()
    return x, y * 2, h


def kept_across_a_break(x, y):
    h = x.register_hook(lambda g: g * 2)
    print("break")
    h.remove()
    return x, y * 2, None


def _handles(value: Any) -> list[RemovableHandle]:
    if isinstance(value, RemovableHandle):
        return [value]
    if isinstance(value, (list, tuple)):
        return [h for v in value for h in _handles(v)]
    return []


def _drive(fn: Callable, backend: str | None) -> list[Any]:
    torch.manual_seed(0)
    x = torch.zeros(3, requires_grad=True)
    y = torch.randn(2)
    _holder.handle = None
    if backend is not None:
        kiln.reset()
        fn = kiln.compile(fn, backend=backend)
    a, b, extra = fn(x, y)
    a.backward(GRAD)
    first = x.grad.clone()
    handles = _handles(extra) + ([_holder.handle] if _holder.handle is not None else [])
    for h in handles:
        h.remove()  # the same handle twice: the second remove() does nothing
    a.backward(GRAD)
    return [b, first, x.grad.clone(), [type(h).__name__ for h in handles]]


def _same(fn: Callable, backend: str) -> None:
    want = _drive(fn, None)
    got = _drive(fn, backend)
    torch.testing.assert_close(got[:3], want[:3])
    assert got[3] == want[3]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", KEPT, ids=lambda f: f.__name__)
def test_one_graph_and_eagers_handles(fn: Callable, backend: str) -> None:
    _same(fn, backend)
    assert kiln.stats()["graphs"] == 1


@pytest.mark.parametrize("fn", [removed_then_returned, kept_across_a_break], ids=lambda f: f.__name__)
def test_other_uses_give_eagers_results(fn: Callable, capsys: Any) -> None:
    _same(fn, "eager")


def test_a_hooked_module_parameter_handle_stored_on_the_module() -> None:
    def make() -> tuple[nn.Module, Callable]:
        torch.manual_seed(0)
        m = nn.Linear(3, 2)

        def f(x):
            m.hook_handle = m.weight.register_hook(lambda g: g * 0)
            return m(x).sum()
        return m, f

    results = []
    for backend in (None, "aot_eager"):
        m, f = make()
        if backend is not None:
            kiln.reset()
            f = kiln.compile(f, backend=backend, fullgraph=True)
        x = torch.randn(4, 3)
        f(x).backward()
        zeroed = m.weight.grad.clone()
        m.hook_handle.remove()
        m(x).sum().backward()
        results.append((zeroed, m.weight.grad.clone(), type(m.hook_handle).__name__))
    torch.testing.assert_close(results[1][:2], results[0][:2])
    assert results[1][2] == results[0][2]
