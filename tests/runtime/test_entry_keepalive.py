"""A frame's cache entries must not keep the user's objects alive longer than eager would: a module,
an object whose attributes the frame read, a function bound as a global or a parameter the user drops
is freed (as under torch.compile, whose guards hold such objects weakly), whether it was traced for the
first entry of a code object or a later one, with the native fast entry on or off, under the default
and the eager backend. A new object of the same class then runs correctly (a hit or a recompile)."""
from __future__ import annotations

import weakref
from typing import Callable

import torch

import kiln
from tests.runtime.entry_fixtures import BACKENDS, _fresh, dead, fast_entry  # noqa: F401  # fixtures used by name


class _Block(torch.nn.Module):
    def __init__(self, scale: int = 2) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.fc(x))) * self.scale


def _run_module(mod: torch.nn.Module, backend: str) -> None:
    compiled = kiln.compile(mod, backend=backend)
    for train in (True, False):
        mod.train(train)
        for _ in range(2):
            compiled(torch.randn(4, 8))


@BACKENDS
def test_dropped_modules_are_freed_first_and_later_entries(fast_entry: bool, backend: str) -> None:
    refs = []
    for _ in range(3):
        mod = _Block()
        _run_module(mod, backend)
        refs.append(weakref.ref(mod))
        del mod
    assert [dead(r) for r in refs] == [True, True, True]
    # a new module of the class (perhaps at a dead one's address) runs as eager does
    torch.manual_seed(0)
    mod = _Block(scale=5).eval()
    ref = _Block(scale=5).eval()
    ref.load_state_dict(mod.state_dict())
    x = torch.randn(4, 8)
    torch.testing.assert_close(kiln.compile(mod, backend=backend)(x), ref(x))


class _Config:
    def __init__(self, k: float) -> None:
        self.k = k
        self.weight = torch.full((4,), k)


def _scaled(cfg: _Config, x: torch.Tensor) -> torch.Tensor:
    return x * cfg.k + cfg.weight


@BACKENDS
def test_plain_objects_whose_attributes_were_read_are_freed(fast_entry: bool, backend: str) -> None:
    compiled = kiln.compile(_scaled, backend=backend)
    x = torch.randn(4)
    refs = []
    for k in (2.0, 3.0, 4.0):
        cfg = _Config(k)
        torch.testing.assert_close(compiled(cfg, x), _scaled(cfg, x))
        torch.testing.assert_close(compiled(cfg, x), _scaled(cfg, x))
        refs.append(weakref.ref(cfg))
        del cfg
    assert [dead(r) for r in refs] == [True, True, True]
    for k in (2.0, 7.0):  # a value seen before and a new one: never a dead object's constants
        cfg = _Config(k)
        torch.testing.assert_close(compiled(cfg, x), _scaled(cfg, x))


_HELPER: Callable[[torch.Tensor], torch.Tensor] | None = None


def _calls_helper(x: torch.Tensor) -> torch.Tensor:
    assert _HELPER is not None
    return _HELPER(x) + 1


def _make_helper(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def helper(x: torch.Tensor) -> torch.Tensor:
        return x * k
    return helper


@BACKENDS
def test_functions_bound_as_globals_are_freed(fast_entry: bool, backend: str) -> None:
    global _HELPER
    compiled = kiln.compile(_calls_helper, backend=backend)
    x = torch.randn(4)
    refs = []
    try:
        for k in (2.0, 3.0, 4.0):
            _HELPER = _make_helper(k)
            torch.testing.assert_close(compiled(x), x * k + 1)
            torch.testing.assert_close(compiled(x), x * k + 1)
            refs.append(weakref.ref(_HELPER))
            _HELPER = None
        assert [dead(r) for r in refs] == [True, True, True]
        for k in (2.0, 9.0):
            _HELPER = _make_helper(k)
            torch.testing.assert_close(compiled(x), x * k + 1)
    finally:
        _HELPER = None


class _Holder:
    def __init__(self, k: float) -> None:
        self.p = torch.nn.Parameter(torch.full((4,), k))


def _uses_parameter(holder: _Holder, x: torch.Tensor) -> torch.Tensor:
    return x * holder.p


@BACKENDS
def test_parameters_read_through_an_object_are_freed(fast_entry: bool, backend: str) -> None:
    compiled = kiln.compile(_uses_parameter, backend=backend)
    x = torch.randn(4)
    holders, params = [], []
    for k in (2.0, 3.0, 4.0):
        holder = _Holder(k)
        with torch.no_grad():
            torch.testing.assert_close(compiled(holder, x), x * k)
            torch.testing.assert_close(compiled(holder, x), x * k)
        holders.append(weakref.ref(holder))
        params.append(weakref.ref(holder.p))
        del holder
    assert [dead(r) for r in holders] == [True, True, True]
    assert [dead(r) for r in params] == [True, True, True]
    with torch.no_grad():
        for k in (2.0, 6.0):
            torch.testing.assert_close(compiled(_Holder(k), x), x * k)


@BACKENDS
def test_a_compiled_module_dropped_with_its_wrapper_frees_its_parameters(fast_entry: bool, backend: str) -> None:
    params = []
    for _ in range(2):
        mod = _Block()
        _run_module(mod, backend)
        params.extend(weakref.ref(p) for p in mod.parameters())
        del mod
    assert all(dead(r) for r in params)
