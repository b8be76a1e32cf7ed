"""Shared by the test_trace_*.py files: one program compiled whole by Kiln, checked against eager and
against the real torch.compile as the oracle.

`check_traced` runs a program eagerly, then under `kiln.compile(fullgraph=True, backend="eager")`,
and compares outputs and what the program did to its arguments; it then asks torch._dynamo.explain
(the oracle) and kiln.explain for their counts: torch.compile traces the program in one graph and
Kiln needs no more graphs and no break. `check_breaks` is for programs torch.compile does not trace
whole either: Kiln breaks with a reason under fullgraph, and without it still gives eager's answer.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch._dynamo

import kiln


def same(got: Any, expected: Any, path: str = "result") -> None:
    """Deep equality: tensors by value and dtype, containers by type and items in order, dicts by
    keys in order (tensor keys by position), other objects by ==."""
    assert type(got) is type(expected), f"{path}: {type(got)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and got.shape == expected.shape, f"{path}: {got} != {expected}"
        torch.testing.assert_close(got, expected, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, np.ndarray):
        np.testing.assert_allclose(got, expected)
        assert got.dtype == expected.dtype, path
    elif isinstance(expected, (tuple, list)) or type(expected).__name__ == "deque":
        assert len(got) == len(expected), f"{path}: {len(got)} != {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            same(g, e, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert len(got) == len(expected), f"{path}: keys {list(got)} != {list(expected)}"
        for i, ((gk, gv), (ek, ev)) in enumerate(zip(got.items(), expected.items())):
            if isinstance(ek, torch.Tensor):
                same(gk, ek, f"{path}.key{i}")
            else:
                assert gk == ek, f"{path}: key {gk!r} != {ek!r}"
            same(gv, ev, f"{path}[{ek!r}]")
        if hasattr(expected, "__dict__"):
            same(vars(got), vars(expected), f"{path}.__dict__")
    elif isinstance(expected, (set, frozenset)) and any(isinstance(e, torch.Tensor) for e in expected):
        assert len(got) == len(expected), path
    elif isinstance(expected, (set, frozenset)):
        assert got == expected and list(got) == list(expected), f"{path}: {got} != {expected} (or not in eager's order)"
    elif hasattr(expected, "__dict__") and type(expected).__module__ not in ("builtins", "torch"):
        same(vars(got), vars(expected), f"{path}.__dict__")
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"


@contextlib.contextmanager
def configured(settings: dict[str, Any]) -> Iterator[None]:
    """The same option set on kiln.config and torch._dynamo.config for the block."""
    saved = {k: getattr(kiln.config, k) for k in settings}
    try:
        for key, value in settings.items():
            setattr(kiln.config, key, value)
        with torch._dynamo.config.patch(**settings):
            yield
    finally:
        for key, value in saved.items():
            setattr(kiln.config, key, value)


def _run(fn: Callable[..., Any], make_args: Callable[[], tuple]) -> tuple[Any, tuple]:
    torch.manual_seed(0)
    args = make_args()
    return fn(*args), args


def check_traced(fn: Callable[..., Any], make_args: Callable[[], tuple], *, settings: dict[str, Any] | None = None,
                 calls: int = 1, oracle: bool = True) -> None:
    """Kiln compiles `fn` whole (fullgraph=True) and matches eager, results and argument mutations,
    over `calls` calls; torch.compile also traces it in one graph (unless `oracle` is False: a
    program torch.compile breaks on, which Kiln traces), and Kiln makes no more graphs."""
    grad = torch.is_grad_enabled()
    with configured(settings or {}):
        kiln.reset()
        torch._dynamo.reset()
        compiled = kiln.compile(fn, backend="eager", fullgraph=True)
        for _ in range(calls):
            expected, eager_args = _run(fn, make_args)
            eager_grad = torch.is_grad_enabled()
            torch.set_grad_enabled(grad)
            got, kiln_args = _run(compiled, make_args)
            assert torch.is_grad_enabled() == eager_grad, "grad mode after the call differs from eager's"
            torch.set_grad_enabled(grad)
            same(got, expected)
            same(kiln_args, eager_args, "arguments after the call")
        stats = kiln.stats()
        assert stats["graph_breaks"] == 0 and stats["fallbacks"] == 0, stats
        kiln.reset()
        explained = kiln.explain(fn)(*make_args())
        torch.set_grad_enabled(grad)
        assert explained.graph_break_count == 0, explained.break_reasons
        if oracle:
            torch._dynamo.reset()
            try:
                dynamo = torch._dynamo.explain(fn)(*make_args())
            finally:
                torch.set_grad_enabled(grad)  # torch.compile may leave grad mode as its trace set it
            assert dynamo.graph_break_count <= 0, [str(b.reason)[:200] for b in dynamo.break_reasons]
            assert explained.graph_count <= max(dynamo.graph_count, 1)


def check_breaks(fn: Callable[..., Any], make_args: Callable[[], tuple], reason: str, *,
                 settings: dict[str, Any] | None = None) -> None:
    """torch.compile does not trace `fn` whole and neither does Kiln: under fullgraph=True Kiln
    raises a GraphBreakError whose reason contains `reason`; without it Kiln gives eager's answer
    (through a graph break, never an eager fallback of the whole frame)."""
    with configured(settings or {}):
        torch._dynamo.reset()
        with contextlib.suppress(Exception):
            torch.compile(fn, backend="eager", fullgraph=True)(*make_args())
            raise AssertionError("torch.compile traced it whole: use check_traced")
        kiln.reset()
        try:
            kiln.compile(fn, backend="eager", fullgraph=True)(*make_args())
        except kiln.errors.GraphBreakError as exc:
            assert reason in str(exc), str(exc)
        else:
            raise AssertionError("Kiln traced it whole where torch.compile breaks")
        kiln.reset()
        expected, eager_args = _run(fn, make_args)
        got, kiln_args = _run(kiln.compile(fn, backend="eager"), make_args)
        same(got, expected)
        same(kiln_args, eager_args, "arguments after the call")
        assert kiln.stats()["fallbacks"] == 0, kiln.stats()


def fresh(*values: Any) -> Callable[[], tuple]:
    """Arguments made anew (deep copies) for each run, so one run's mutations do not reach the next."""
    return lambda: copy.deepcopy(values)
