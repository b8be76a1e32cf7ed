"""Guards against what changed between two calls: a second call whose input differs from the first
in something the trace read (a view bit, ...) must recompile or take another cached graph, never
reuse a graph made for the first. Each case runs with the boundary extension's tensor check and with
the generated Python checks (kiln.config.native_guards), which must agree."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import pytest
import torch

import kiln
from kiln.runtime import native
from eager_compare import dynamo_graphs, outcome, same_outcome


@pytest.fixture(params=["python", pytest.param("native", marks=pytest.mark.cpp)])
def guard_path(request: Any, monkeypatch: Any) -> str:
    if request.param == "native":
        native.boundary()  # built now, so the check functions made below call it
    monkeypatch.setattr(kiln.config, "native_guards", request.param == "native")
    return str(request.param)


def _same_as_eager(fn: Callable[..., Any], calls: Sequence[tuple]) -> int:
    """Each call eager, then compiled (backend="eager"): the same outcome; returns the graph count."""
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for i, args in enumerate(calls):
        want = outcome(fn, *args)
        got = outcome(compiled, *args)
        assert same_outcome(got, want, text=False), f"call {i}: compiled gave {got!r}, eager {want!r}"
    assert kiln.stats()["fallbacks"] == 0, kiln.stats()
    return backend.frame_count


# --- the negative bit of a real view (`z.conj().imag`), not only of complex tensors


def test_neg_bit_of_real_view_is_guarded(guard_path: str) -> None:
    z = torch.tensor([1 + 2j, 3 - 1j])

    def f(x: torch.Tensor) -> Any:
        return x.is_neg(), x + 1

    assert z.conj().imag.is_neg() and z.conj().imag.dtype == torch.float32
    assert _same_as_eager(f, [(z.imag,), (z.conj().imag,), (z.imag,)]) == 2


def test_neg_view_of_int_tensor_branch(guard_path: str) -> None:
    a = torch.tensor([1, 2, 3])

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.is_neg() else x - 1

    _same_as_eager(f, [(a,), (torch._neg_view(a),), (a,), (torch._neg_view(a),)])


# --- getters of process-wide settings that no table names: answered at trace time and guarded


def _flip(query: Callable[[], Any], set_to: Callable[[Any], None], values: Sequence[Any]) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if query() else x * 3

    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    old = query()
    try:
        for v in values:
            set_to(v)
            assert torch.equal(compiled(torch.ones(2)), f(torch.ones(2))), v
    finally:
        set_to(old)
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["fallbacks"] == 0


def test_anomaly_mode_read_in_frame(guard_path: str) -> None:
    _flip(torch.is_anomaly_enabled, torch.set_anomaly_enabled, [False, True, False])


def test_anomaly_check_nan_read_in_frame(guard_path: str) -> None:
    was_enabled = torch.is_anomaly_enabled()
    try:
        _flip(torch.is_anomaly_check_nan_enabled, lambda v: torch.set_anomaly_enabled(v, v), [False, True])
    finally:  # check_nan is on by default: _flip's restore would leave anomaly mode itself on
        torch.set_anomaly_enabled(was_enabled)


def test_warn_always_read_in_frame(guard_path: str) -> None:
    _flip(torch.is_warn_always_enabled, torch.set_warn_always, [False, True, False])


def test_deterministic_debug_mode_read_in_frame(guard_path: str) -> None:
    _flip(torch.get_deterministic_debug_mode, torch.set_deterministic_debug_mode, [0, 1, 0])


def test_autocast_dtype_getter_with_argument(guard_path: str) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.get_autocast_dtype("cpu"))

    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    old = torch.get_autocast_dtype("cpu")
    try:
        for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
            torch.set_autocast_dtype("cpu", dtype)
            assert compiled(torch.ones(2)).dtype == f(torch.ones(2)).dtype == dtype
    finally:
        torch.set_autocast_dtype("cpu", old)
    assert kiln.stats()["graphs"] == 2


# --- `x[i] = v` with an int argument that became dynamic: no guard on i's value


def _graphs_within_dynamo(fn: Callable[..., Any], calls: Sequence[tuple]) -> None:
    kiln_graphs = _same_as_eager(fn, calls)
    want = dynamo_graphs(fn, lambda compiled: [compiled(*args) for args in calls])
    assert kiln_graphs <= want, f"{kiln_graphs} graphs, torch.compile made {want}"


def _index_calls(*indices: Any) -> list[tuple]:
    return [(torch.arange(8.0), i) for i in indices]


def test_setitem_at_dynamic_int_index() -> None:
    def f(x: torch.Tensor, i: int) -> torch.Tensor:
        y = x.clone()
        y[i] = 0
        return y

    _graphs_within_dynamo(f, _index_calls(1, 2, 3, 4, 5, -1))


def test_setitem_from_same_tensor_at_dynamic_index() -> None:
    def f(x: torch.Tensor, i: int) -> torch.Tensor:
        y = x.clone()
        y[i] = y[0] * 2
        y[i + 1] += 1
        return y

    _graphs_within_dynamo(f, _index_calls(1, 2, 3, 4, 5, -3))

    def overlapping(x: torch.Tensor, i: int) -> Any:  # eager refuses the shifted copy: so does Kiln
        y = x.clone()
        y[i] = 0
        y[1:i] = y[0:i - 1]
        return y

    _same_as_eager(overlapping, _index_calls(3, 4, 5, 1))


# --- a function of torch's namespaces replaced between calls (a library patching F.gelu)


@pytest.mark.parametrize("namespace, name", [(torch.nn.functional, "gelu"), (torch, "sigmoid"),
                                             (torch.nn.functional, "relu")])
def test_torch_function_replaced_between_calls(namespace: Any, name: str) -> None:
    program = {"gelu": lambda x: torch.nn.functional.gelu(x), "sigmoid": lambda x: torch.sigmoid(x),
               "relu": lambda x: torch.nn.functional.relu(x)}[name]
    kiln.reset()
    compiled = kiln.compile(program, backend="aot_eager")  # the graph holds the function it traced
    original = getattr(namespace, name)
    x = torch.ones(3)
    assert torch.equal(compiled(x), program(x))
    setattr(namespace, name, lambda v, *a, **k: v * 0 - 5)
    try:
        assert torch.equal(compiled(x), torch.full((3,), -5.0))
    finally:
        setattr(namespace, name, original)
    assert torch.equal(compiled(x), program(x))
