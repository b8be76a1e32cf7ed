"""The per-call floor of a small compiled program: once a graph's native wrapper runs, the runtime
calls it directly (no TieredWrapper frame on the forward or the backward), and the entry binds the
frame's locals with one dict display. Every grad mode, inside and outside the compiled function,
still gives eager's values, requires_grad and gradients on the tiny graphs this path serves."""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import pytest
import torch

import kiln
from kiln.capture.binding import positional_locals
from kiln.runtime import native

pytestmark = pytest.mark.cpp


def _add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def _softmax(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * y, -1)


def _no_grad_inside(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        z = x * 2
    return torch.softmax(z + y, -1)


def _enable_grad_inside(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():
        z = x * y
    return z.exp()


_OUTSIDE: dict[str, Callable[[], Any]] = {
    "grad": contextlib.nullcontext, "no_grad": torch.no_grad, "enable_grad": torch.enable_grad,
    "inference_mode": torch.inference_mode,
}


@pytest.mark.parametrize("fn", [_add, _softmax, _no_grad_inside, _enable_grad_inside], ids=lambda f: f.__name__)
@pytest.mark.parametrize("outside", list(_OUTSIDE))
@pytest.mark.parametrize("requires", [False, True])
def test_tiny_graphs_give_eagers_values_and_grads_in_every_grad_mode(fn, outside, requires) -> None:
    kiln.reset()
    compiled = kiln.compile(fn)
    for call in range(4):  # first calls, then the steady path (the plan runs from the first call)
        x = torch.randn(4, 16, requires_grad=requires)
        y = torch.randn(4, 16, requires_grad=requires)
        xe, ye = x.detach().requires_grad_(requires), y.detach().requires_grad_(requires)
        with _OUTSIDE[outside]():
            got, want = compiled(x, y), fn(xe, ye)
        torch.testing.assert_close(got, want)
        assert got.requires_grad == want.requires_grad and (got.grad_fn is None) == (want.grad_fn is None)
        assert got.is_inference() == want.is_inference()
        if want.requires_grad:
            g = torch.randn(4, 16)
            got.backward(g)
            want.backward(g)
            for a, b in ((x, xe), (y, ye)):
                torch.testing.assert_close(a.grad, b.grad)
    kiln.reset()


def test_parameters_requiring_grad_under_no_grad_inside_the_function() -> None:
    kiln.reset()
    layer = torch.nn.Linear(16, 16)

    def f(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            frozen = layer(x)
        return torch.softmax(frozen, -1) + layer(x)

    compiled = kiln.compile(f)
    for _ in range(3):
        x = torch.randn(4, 16)
        got, want = compiled(x), f(x)
        torch.testing.assert_close(got, want)
        assert got.requires_grad and want.requires_grad
        (grads_got,) = torch.autograd.grad(got.sum(), [layer.weight])
        (grads_want,) = torch.autograd.grad(want.sum(), [layer.weight])
        torch.testing.assert_close(grads_got, grads_want)
    kiln.reset()


def _count_tiered_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    counts = [0, 0]
    call, steal = native.TieredWrapper.__call__, native.TieredWrapper.steal

    def counted_call(self: Any, *args: Any) -> Any:
        counts[0] += 1
        return call(self, *args)

    def counted_steal(self: Any, args: list) -> Any:
        counts[1] += 1
        return steal(self, args)

    monkeypatch.setattr(native.TieredWrapper, "__call__", counted_call)
    monkeypatch.setattr(native.TieredWrapper, "steal", counted_steal)
    return counts


def test_a_settled_graph_is_called_without_its_tiered_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    kiln.reset()
    counts = _count_tiered_calls(monkeypatch)
    compiled = kiln.compile(_softmax)
    x, y = torch.randn(4, 16), torch.randn(4, 16, requires_grad=True)
    for _ in range(3):
        compiled(x, y).sum().backward()
        with torch.no_grad():
            compiled(x, y)
    assert native.wait_for_tier_up(600)
    for _ in range(2):  # a Python tier still running ticks here, and settles
        compiled(x, y).sum().backward()
        with torch.no_grad():
            compiled(x, y)
    counts[:] = [0, 0]
    y.grad = None
    for _ in range(3):
        out = compiled(x, y)
        out.backward(torch.ones_like(out))
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, y), _softmax(x, y))
    assert counts == [0, 0]  # forward, backward and inference graph: the native wrapper called directly
    ye = y.detach().requires_grad_()
    for _ in range(3):
        _softmax(x, ye).backward(torch.ones(4, 16))
    torch.testing.assert_close(y.grad, ye.grad)
    kiln.reset()


@pytest.mark.parametrize("names", [(), ("x",), ("x", "y", "z"), ("self", "args_", "L")])
def test_positional_locals_bind_as_zip_does(names) -> None:
    values = tuple(object() for _ in names)
    got = positional_locals(names)(values)
    assert got == dict(zip(names, values)) and list(got) == list(names)


def _runtime(compiled: Any) -> Any:
    from kiln.capture.entry import frames_of
    from kiln.runtime.aot import AotRuntime

    (entry,) = frames_of(compiled).entries
    (runtime,) = [v for v in entry.glue.__globals__.values() if isinstance(v, AotRuntime)]  # type: ignore[attr-defined]
    return runtime


def _library_threads(graph: Any) -> int:
    import ctypes

    query = graph._lib.kiln_get_num_threads
    query.restype = ctypes.c_int
    return int(query())


@pytest.mark.parametrize("after", [1, 2])
def test_a_native_backward_follows_threads_changed_after_its_forward(after) -> None:
    # The C++ node runs the native backward without the GIL only while the kernel library has
    # torch's thread count; a count changed between forward and backward goes through Python first.
    kiln.reset()
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(3 - after)
        compiled = kiln.compile(_softmax)
        x, y = torch.randn(4, 16), torch.randn(4, 16, requires_grad=True)
        for _ in range(3):
            compiled(x, y).sum().backward()
        assert native.wait_for_tier_up(600)
        compiled(x, y).sum().backward()
        backward = _runtime(compiled).function.recipe["backward"]
        out = compiled(x, y)
        torch.set_num_threads(after)
        y.grad = None
        out.backward(torch.ones_like(out))
        assert _library_threads(backward) == after
        ye = y.detach().requires_grad_()
        _softmax(x, ye).backward(torch.ones(4, 16))
        torch.testing.assert_close(y.grad, ye.grad)
    finally:
        torch.set_num_threads(saved)
        kiln.reset()


def _matmul3d(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.matmul(x.view(2, 2, 16), y.t())  # eager's is no view; a wrapper's may be one of its buffer


def _under_no_grad(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.softmax(x * y, -1)


def _view_out(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x + y
    return s, s[1:].t()


_DIRECT = {"_add": _add, "_softmax": _softmax, "_matmul3d": _matmul3d, "_under_no_grad": _under_no_grad,
           "_view_out": _view_out}


def _direct_expected(name: str, outside: str, requires: bool) -> bool:
    """Whether the graph is an inference graph that runs as the extension's direct call."""
    inference = not requires or outside in ("no_grad", "inference_mode") or name == "_under_no_grad"
    return inference and name != "_view_out"  # a view of an intermediate is rebuilt in Python


@pytest.mark.parametrize("name", list(_DIRECT))
@pytest.mark.parametrize("outside", list(_OUTSIDE))
@pytest.mark.parametrize("requires", [False, True])
def test_plain_inference_graphs_run_as_one_native_call(name, outside, requires) -> None:
    # Once its native wrapper runs, a plain inference graph's runtime is the extension's direct call
    # (AotRuntime's plain branch in C++: grad mode off for a graph under without_grad, results that
    # eager gives as no view handed out as detached aliases), and every call still gives eager's
    # values, autograd views, requires_grad, inference flags and grad mode after the call.
    from kiln.runtime import boundary
    from kiln.runtime.aot import AotRuntime

    kiln.reset()
    fn = _DIRECT[name]
    compiled = kiln.compile(fn)
    for call in range(4):
        x = torch.randn(4, 16, requires_grad=requires)
        y = torch.randn(4, 16, requires_grad=requires)
        with _OUTSIDE[outside]():
            mode = torch.is_grad_enabled()
            got, want = compiled(x, y), fn(x, y)
            assert torch.is_grad_enabled() == mode
        gots, wants = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for g, w in zip(gots, wants):
            torch.testing.assert_close(g, w)
            assert g._is_view() == w._is_view() and g.requires_grad == w.requires_grad
            assert g.is_inference() == w.is_inference()
            if not w.is_inference() and not w.requires_grad:
                with torch.enable_grad():  # a view made in no_grad mode would refuse this
                    g.mul_(2)
                    w.mul_(2)
                torch.testing.assert_close(g, w)
    if boundary.built() is not None and native.wait_for_tier_up(600):
        direct = type(_runtime(compiled)).__call__ is not AotRuntime.__call__
        assert direct == _direct_expected(name, outside, requires)
    kiln.reset()


def test_a_direct_call_restores_grad_mode_when_the_graph_raises() -> None:
    # the direct call of a graph run under without_grad turns grad mode off in C++: a failed check
    # inside the graph (an index out of range) must leave the caller's mode as it was
    kiln.reset()

    def f(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return x[i] * 2

    compiled = kiln.compile(f)
    x = torch.randn(8, requires_grad=True)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, torch.tensor([1, 2])), f(x, torch.tensor([1, 2])))
    with pytest.raises(IndexError):
        f(x, torch.tensor([1, 9]))
    with pytest.raises(IndexError):
        compiled(x, torch.tensor([1, 9]))
    assert torch.is_grad_enabled()
    kiln.reset()


def _fast_of(compiled: Any) -> Any:
    return compiled.__globals__.get("_kiln_fast")


def _needs_fast_entry() -> Any:
    from kiln.runtime import boundary

    module = boundary.built()
    if module is None or not hasattr(module, "frame_entry"):
        pytest.skip("the boundary extension is not built")
    return module


@pytest.mark.parametrize("fn", [_add, _softmax, _no_grad_inside, _enable_grad_inside], ids=lambda f: f.__name__)
@pytest.mark.parametrize("outside", list(_OUTSIDE))
@pytest.mark.parametrize("requires", [False, True])
def test_a_frame_of_tensor_guards_is_one_native_entry_in_every_grad_mode(fn, outside, requires) -> None:
    # guards, glue and graph call in one C call (kiln.capture.fast_entry): eager's values, grads,
    # requires_grad and inference flags, and the hits counted as the Python loop counts them
    _needs_fast_entry()
    kiln.reset()
    compiled = kiln.compile(fn)
    for call in range(4):
        x = torch.randn(4, 16, requires_grad=requires)
        y = torch.randn(4, 16, requires_grad=requires)
        xe, ye = x.detach().requires_grad_(requires), y.detach().requires_grad_(requires)
        hits = kiln.stats()["cache_hits"]
        with _OUTSIDE[outside]():
            got, want = compiled(x, y), fn(xe, ye)
        assert kiln.stats()["cache_hits"] == hits + (call > 0)
        assert _fast_of(compiled) is not None and type(_fast_of(compiled)).__name__ == "Entry"
        torch.testing.assert_close(got, want)
        assert got.requires_grad == want.requires_grad and got.is_inference() == want.is_inference()
        if want.requires_grad:
            g = torch.randn(4, 16)
            got.backward(g)
            want.backward(g)
            torch.testing.assert_close(x.grad, xe.grad)
            torch.testing.assert_close(y.grad, ye.grad)
    assert kiln.stats()["compiles"] == 1
    kiln.reset()


def test_the_native_entry_hands_failed_guards_to_the_python_loop() -> None:
    _needs_fast_entry()
    kiln.reset()
    compiled = kiln.compile(_softmax)
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    for _ in range(2):
        compiled(x, y)
    assert _fast_of(compiled) is not None
    # another shape, the same tensor twice, grad mode off, another default dtype: each misses
    torch.testing.assert_close(compiled(torch.randn(2, 8), torch.randn(2, 8)).shape, torch.Size([2, 8]))
    # automatic dynamic made the new entry symbolic: both entries in C, its shape guards too
    assert kiln.stats()["recompiles"] == 1 and _fast_of(compiled) is not None
    torch.testing.assert_close(compiled(x, x), _softmax(x, x))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, y), _softmax(x, y))
    saved = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        torch.testing.assert_close(compiled(x, y), _softmax(x, y))
    finally:
        torch.set_default_dtype(saved)
    kiln.reset()
    torch.testing.assert_close(compiled(x, y), _softmax(x, y))  # after reset: captured again, fast again
    assert kiln.stats()["compiles"] == 1 and _fast_of(compiled) is not None
    kiln.reset()


def test_the_native_entry_checks_the_globals_the_graph_read(monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_fast_entry()
    kiln.reset()
    compiled = kiln.compile(_softmax)
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    for _ in range(2):
        compiled(x, y)
    assert _fast_of(compiled) is not None

    class FakeTorch:
        @staticmethod
        def softmax(t: torch.Tensor, dim: int) -> torch.Tensor:
            return t * 0 + 7

    monkeypatch.setitem(_softmax.__globals__, "torch", FakeTorch)
    assert bool((compiled(x, y) == 7).all())  # eager's answer with the global replaced
    monkeypatch.undo()
    kiln.reset()


def test_reset_frees_the_graphs_a_native_entry_answered_for() -> None:
    import gc
    import weakref

    _needs_fast_entry()
    kiln.reset()
    compiled = kiln.compile(_softmax)
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    for _ in range(2):
        compiled(x, y)
    assert _fast_of(compiled) is not None
    graph = weakref.ref(_runtime(compiled))
    kiln.reset()
    gc.collect()
    assert graph() is None
    torch.testing.assert_close(compiled(x, y), _softmax(x, y))
    kiln.reset()


def test_a_dropped_compiled_function_is_freed_with_its_native_entry() -> None:
    # the native entry holds the Python entry's slow path, whose namespace holds the native entry: a
    # cycle only the garbage collector can free (the entry's type must take part in it)
    import gc
    import weakref

    _needs_fast_entry()
    kiln.reset()
    refs = []
    for _ in range(3):
        def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x + y, -1)

        compiled = kiln.compile(f)
        x, y = torch.randn(4, 16), torch.randn(4, 16)
        for _ in range(2):
            compiled(x, y)
        assert _fast_of(compiled) is not None  # the 2nd and 3rd: at once, the code's cache is shared
        refs.append(weakref.ref(compiled))  # (its graphs stay: the cache belongs to f's code, as Dynamo's)
        del compiled, f
    gc.collect()
    assert [r() is None for r in refs] == [True] * 3
    kiln.reset()
