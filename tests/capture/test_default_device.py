"""The default device: a compiled call under `torch.set_default_device(d)` or `with torch.device(d):`.

Both push a DeviceContext (torch.utils._device) on the torch function mode stack; factories called
without `device=` get its device. As torch.compile, Kiln traces such a call (it ran eagerly
before: any active mode did), writes the device into the graph's factories, and guards on it: a
call with another default device, or none, takes another entry or recompiles, never a graph
traced for another device. Any other torch function mode (a user's TorchFunctionMode) still runs
the call eagerly. Graph counts are compared with Dynamo's (torch.compile with a counting backend);
values with eager's. The default device is process global: every test restores it.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest
import torch
from torch.overrides import TorchFunctionMode

import kiln
from kiln.backends import CountingBackend


@pytest.fixture(autouse=True)
def _restore_default_device() -> Iterator[None]:
    torch.set_default_device(None)
    try:
        yield
    finally:
        torch.set_default_device(None)


def _dynamo(fn: Callable[..., Any], calls: Callable[[Callable[..., Any]], Any]) -> int:
    import torch._dynamo

    counter = CountingBackend()
    torch._dynamo.reset()
    try:
        calls(torch.compile(fn, backend=counter))
    finally:
        torch._dynamo.reset()
    return counter.frame_count


def _kiln(fn: Callable[..., Any], calls: Callable[[Callable[..., Any]], Any], backend: Any = None) -> CountingBackend:
    kiln.reset()
    counter = CountingBackend(backend)
    calls(kiln.compile(fn, backend=counter))
    return counter


def _same(got: Any, want: Any) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert (got.device, got.dtype, got.shape) == (want.device, want.dtype, want.shape), (got, want)
        if want.device.type != "meta":
            assert torch.equal(got, want), (got, want)
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), (got, want)
        for g, w in zip(got, want):
            _same(g, w)
    else:
        assert got == want, (got, want)


def _factories(x: torch.Tensor) -> tuple:
    return (torch.zeros(2) + x[0], torch.ones(2, 3), torch.arange(4), torch.empty(3).shape,
            torch.full((2,), 7.0), torch.tensor([1.0, 2.0]), torch.randn(2).shape, torch.randn(2).device)


def _explicit(x: torch.Tensor) -> tuple:
    return (torch.zeros(2, device="cpu"), torch.ones(2, device=x.device) * x[0], torch.arange(3, device=None),
            torch.full((2,), 1, device="meta"))


# ---- the factories get the context's device, with or without it; explicit devices stay -----------
@pytest.mark.parametrize("backend", ["eager", "inductor"])
@pytest.mark.parametrize("fn", [_factories, _explicit], ids=["no_device", "explicit_device"])
def test_set_default_device_cpu_compiles_and_matches(fn: Callable[..., Any], backend: str) -> None:
    torch.set_default_device("cpu")
    x = torch.arange(1.0, 4.0)
    want = fn(x)
    counter = _kiln(fn, lambda c: _same(c(x), want), backend=None if backend == "eager" else kiln.inductor_backend)
    assert kiln.stats()["fallbacks"] == 0, kiln.stats()
    assert counter.frame_count == 1 == _dynamo(fn, lambda c: c(x))


@pytest.mark.parametrize("fn", [_factories, _explicit], ids=["no_device", "explicit_device"])
def test_with_device_meta_gives_factories_its_device(fn: Callable[..., Any]) -> None:
    x = torch.arange(1.0, 4.0, device="meta")
    with torch.device("meta"):
        want = fn(x)
        counter = _kiln(fn, lambda c: _same(c(x), want))
    assert kiln.stats()["fallbacks"] == 0, kiln.stats()
    assert counter.frame_count == 1
    graph = counter.graphs[0].code
    assert "device(type='meta')" in graph or "meta" in graph, graph


def test_dtype_defaults_follow_default_dtype_and_device() -> None:
    def f(x):
        return torch.zeros(2), torch.arange(3), torch.tensor([1, 2]), torch.tensor(2.5), torch.full((1,), True)
    x = torch.ones(1, device="meta")
    torch.set_default_dtype(torch.float64)
    try:
        with torch.device("meta"):
            want = f(x)
            counter = _kiln(f, lambda c: _same(c(x), want))
        assert counter.frame_count == 1 and kiln.stats()["fallbacks"] == 0
    finally:
        torch.set_default_dtype(torch.float32)


# ---- switching the default device between calls: another entry, never a stale graph --------------
def _devices(x: torch.Tensor) -> tuple:
    return torch.zeros(2).device, torch.arange(3).device, x + 1


def test_switching_default_device_recompiles_like_dynamo() -> None:
    x = torch.ones(2)

    def calls(c: Callable[..., Any]) -> list:
        seen = [c(x)[:2]]
        with torch.device("meta"):
            seen.append(c(x)[:2])
        seen.append(c(x)[:2])  # the first entry again
        torch.set_default_device("cpu")
        seen.append(c(x)[:2])
        torch.set_default_device("meta")
        seen.append(c(x)[:2])
        with torch.device("cpu"):
            seen.append(c(x)[:2])
        torch.set_default_device(None)
        seen.append(c(x)[:2])
        return seen

    want = calls(_devices)
    got: list = []
    counter = _kiln(_devices, lambda c: got.extend(calls(c)))
    assert got == want, (got, want)
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert want == [(cpu, cpu), (meta, meta), (cpu, cpu), (cpu, cpu), (meta, meta), (cpu, cpu), (cpu, cpu)]
    torch.set_default_device(None)
    # none, meta, cpu: one graph each; Dynamo makes 5 (its mode-stack guard fails on the same stack
    # entered another way: set_default_device("meta") after `with torch.device("meta")`)
    assert counter.frame_count == 3 <= _dynamo(_devices, calls), counter.frame_count
    assert kiln.stats()["fallbacks"] == 0, kiln.stats()


def _with_blocks(c: Callable[..., Any]) -> list:
    x = torch.ones(2)
    seen = [c(x)[:2]]
    for device in ("meta", None, "meta", "cpu", "cpu"):
        if device is None:
            seen.append(c(x)[:2])
            continue
        with torch.device(device):
            seen.append(c(x)[:2])
    return seen


def _set_default(c: Callable[..., Any]) -> list:
    x = torch.ones(2)
    seen = []
    for device in ("cpu", "cpu", "meta", "meta", "cpu", None, "meta"):
        torch.set_default_device(device)
        seen.append(c(x)[:2])
    torch.set_default_device(None)
    return seen


@pytest.mark.parametrize("calls", [_with_blocks, _set_default])
def test_graph_per_default_device_as_dynamo(calls: Callable[[Callable[..., Any]], list]) -> None:
    want = calls(_devices)
    got: list = []
    counter = _kiln(_devices, lambda c: got.extend(calls(c)))
    assert got == want, (got, want)
    assert counter.frame_count == 3 == _dynamo(_devices, calls), counter.frame_count
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["compiles"] == 3, kiln.stats()


def test_graph_traced_under_a_device_is_not_reused_without_it() -> None:
    x = torch.ones(2)
    kiln.reset()
    compiled = kiln.compile(_devices)
    with torch.device("meta"):
        assert compiled(x)[:2] == (torch.device("meta"),) * 2
    assert compiled(x)[:2] == (torch.device("cpu"),) * 2
    torch.set_default_device("meta")
    assert compiled(x)[:2] == (torch.device("meta"),) * 2
    assert kiln.stats()["compiles"] == 2 and kiln.stats()["fallbacks"] == 0, kiln.stats()


def test_nested_device_contexts_use_the_innermost() -> None:
    x = torch.ones(2)
    torch.set_default_device("cpu")
    kiln.reset()
    compiled = kiln.compile(_devices)
    with torch.device("meta"):
        assert compiled(x)[:2] == (torch.device("meta"),) * 2
        with torch.device("cpu"):
            assert compiled(x)[:2] == (torch.device("cpu"),) * 2
        assert compiled(x)[:2] == (torch.device("meta"),) * 2
    assert compiled(x)[:2] == (torch.device("cpu"),) * 2
    assert kiln.stats()["compiles"] == 2 and kiln.stats()["fallbacks"] == 0, kiln.stats()


def test_get_default_device_in_the_frame() -> None:
    def f(x):
        return x + 1, torch.get_default_device()
    x = torch.ones(2)
    kiln.reset()
    compiled = kiln.compile(f)
    for device in ("meta", "cpu", None):
        torch.set_default_device(device)
        assert compiled(x)[1] == f(x)[1], device
    assert kiln.stats()["fallbacks"] == 0


# ---- a user's torch function mode: still eager, on top of a device context too ------------------
class _Doubling(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 2 if func is torch.ones else out


def test_user_mode_over_default_device_runs_eagerly() -> None:
    def f(x):
        return torch.ones(2) + x
    x = torch.ones(2)
    torch.set_default_device("cpu")
    kiln.reset()
    compiled = kiln.compile(f)
    assert torch.equal(compiled(x), torch.full((2,), 2.0))
    with _Doubling():
        assert torch.equal(compiled(x), torch.full((2,), 3.0))  # eager, under the mode
    assert torch.equal(compiled(x), torch.full((2,), 2.0))
    with torch.device("meta"), _Doubling():
        assert compiled(torch.ones(2, device="meta")).device == torch.device("meta")
    assert kiln.stats()["compiles"] == 1, kiln.stats()


def test_graph_runs_without_the_mode_on_the_stack() -> None:
    seen: list[int] = []

    def f(x):
        return torch.zeros(2) + x
    x = torch.ones(2)
    torch.set_default_device("cpu")
    kiln.reset()
    counter = CountingBackend()

    def spy(gm: torch.fx.GraphModule, examples: list) -> Callable[..., Any]:
        run = counter(gm, examples)

        def call(*args: Any) -> Any:
            seen.append(torch._C._len_torch_function_stack())
            return run(*args)
        return call
    compiled = kiln.compile(f, backend=spy)
    assert torch.equal(compiled(x), f(x)) and torch.equal(compiled(x), f(x))
    assert seen == [0, 0] and torch._C._len_torch_function_stack() == 1
    assert torch.get_default_device() == torch.device("cpu")


# ---- the native fast entry checks the same state as the Python check ------------------------------
def _add_zeros(x: torch.Tensor) -> torch.Tensor:
    return x + torch.zeros(x.shape[0])


@pytest.mark.cpp
def test_native_entry_picks_the_entry_of_the_default_device() -> None:
    from kiln.runtime import boundary

    module = boundary.built()
    if module is None or not hasattr(module, "frame_entry"):
        pytest.skip("the boundary extension is not built")
    kiln.reset()
    compiled = kiln.compile(_add_zeros)
    x, on_meta = torch.ones(3), torch.ones(3, device="meta")
    settings = [(None, x), ("cpu", x), ("meta", on_meta)]
    for round_ in range(3):
        for device, arg in settings:
            torch.set_default_device(device)
            hits, compiles = kiln.stats()["cache_hits"], kiln.stats()["compiles"]
            got = compiled(arg)
            assert got.device == arg.device and (arg.is_meta or torch.equal(got, arg))
            if round_:
                assert kiln.stats()["cache_hits"] == hits + 1 and kiln.stats()["compiles"] == compiles
                fast = compiled.__globals__.get("_kiln_fast")
                assert type(fast).__name__ == "Entry", fast
        torch.set_default_device(None)
    with torch.device("meta"), _Doubling():  # another mode: eager, whichever entry would pass
        assert compiled(on_meta).is_meta
    assert kiln.stats()["compiles"] == 3 and kiln.stats()["fallbacks"] == 1, kiln.stats()


def test_python_and_native_checks_agree_on_every_stack() -> None:
    from kiln.capture.guards import GlobalState, Guard, compile_guards
    from kiln.runtime import boundary

    module = boundary.built()
    stacks: list[Callable[[], Any]] = [
        lambda: torch.device("meta"), lambda: torch.device("cpu"), lambda: _Doubling(),
        lambda: torch._C.DisableTorchFunction()]
    for expected in (None, torch.device("cpu"), torch.device("meta")):
        guard = Guard("", "check_global_state", GlobalState(torch.get_default_dtype(), False, expected))
        checks = [compile_guards([guard], native=None)]
        if module is not None and hasattr(module, "state_ok"):
            checks.append(compile_guards([guard], native=module))
            assert "___state_ok" in checks[1].source
        for outer in [None, *stacks]:
            for inner in [None, *stacks]:
                with (outer() if outer else _nothing()), (inner() if inner else _nothing()):
                    want = _stack_is(expected)
                    verdicts = [check({}, {}, None) for check in checks]
                    assert verdicts == [want] * len(checks), (expected, outer, inner, verdicts)


def _stack_is(expected: torch.device | None) -> bool:
    """The state a graph traced under `expected` assumes, read from the stack as eager sees it."""
    modes = [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]
    if expected is None or not modes:
        return expected is None and not modes
    return torch._C._is_torch_function_mode_enabled() and all(type(m).__name__ == "DeviceContext" for m in modes) \
        and modes[-1].device == expected


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


# ---- the persistent frame cache: an entry stored under a device is loaded only under it ----------
@pytest.mark.cpp
def test_stored_entry_keeps_its_device(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln import config
    from kiln.capture.entry import frames_of

    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(config, "persistent_cache", True)

    def f(x):
        return torch.zeros(3) + x * 2
    x = torch.ones(3)
    torch.set_default_device("cpu")
    kiln.reset()
    assert torch.equal(kiln.compile(f)(x), f(x)) and kiln.stats()["frames"] == 1
    kiln.reset()
    compiled = kiln.compile(f)
    assert torch.equal(compiled(x), f(x))
    assert kiln.stats()["disk_hits"] == 1 and kiln.stats()["frames"] == 0, kiln.stats()
    graphs = [v for k, v in frames_of(compiled).entries[0].glue.__globals__.items() if k.startswith("__graph")]
    assert graphs and all(hasattr(g, "_kiln_graph") for g in graphs)  # run with the modes off the stack
    torch.set_default_device(None)
    kiln.reset()
    assert torch.equal(kiln.compile(f)(x), f(x))
    assert kiln.stats()["disk_hits"] == 0 and kiln.stats()["frames"] == 1, kiln.stats()
    kiln.reset()
