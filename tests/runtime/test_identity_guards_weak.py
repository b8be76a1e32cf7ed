"""Identity guards (check_id) hold what can die weakly (kiln.capture.guards.identity): a lambda, a
function found as a module's attribute, an nn.Module captured by a closure, a class, a bound
method's object, each guarded by identity, is freed once the user drops it, as torch.compile's
guards let it be; the cache entry that compared with it is dropped (it can never match again, and
must not count against cache_size_limit), and a new object of the same type, at the dead one's
address where CPython reuses it, is compiled for, never taken for the dead one: by the Python
check and by the boundary extension's fast entry (op KOP_IS_REF), which an older build without
that op does not get (it reports `frame_entry_ops`)."""
from __future__ import annotations

import gc
import sys
import types
import weakref
from typing import Any, Callable

import pytest
import torch

import kiln
from kiln import config
from kiln.capture.entry import frames_of
from kiln.capture.guards import Guard
from kiln.capture.guards.identity import GONE, held_weakly
from tests.runtime.entry_fixtures import BACKENDS, _fresh, dead, fast_entry  # noqa: F401  # fixtures used by name


def _compiles() -> int:
    return int(kiln.stats()["compiles"])


# ---------------------------------------------------------------------------------------------------
# A lambda bound as a global, its identity used (`is not None` pins it: a check_id guard)

_ACT: Callable[[torch.Tensor], torch.Tensor] | None = None


def _calls_act(x: torch.Tensor) -> torch.Tensor:
    present = _ACT is not None
    if not present:
        return x
    assert _ACT is not None
    return _ACT(x) - 1


def _make_act(k: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: torch.tanh(x) * k


@BACKENDS
def test_a_lambda_global_guarded_by_identity_is_freed(fast_entry: bool, backend: str) -> None:
    global _ACT
    compiled = kiln.compile(_calls_act, backend=backend)
    x = torch.randn(5)
    refs = []
    try:
        for k in (2.0, 3.0, 4.0):
            _ACT = _make_act(k)
            for _ in range(2):
                torch.testing.assert_close(compiled(x), _calls_act(x))
            assert any(g.kind == "check_id" and g.expected is _ACT for g in frames_of(compiled).entries[0].check.guards)
            refs.append(weakref.ref(_ACT))
            _ACT = None
        assert [dead(r) for r in refs] == [True, True, True]
        assert frames_of(compiled).entries == [] or all(e.check.valid for e in frames_of(compiled).entries)
        for k in (2.0, 9.0):
            _ACT = _make_act(k)
            torch.testing.assert_close(compiled(x), _calls_act(x))
    finally:
        _ACT = None


# ---------------------------------------------------------------------------------------------------
# A module's attribute that is a function (a top-level def, rebound: guarded by identity)

_HELPERS = types.ModuleType("kiln_test_identity_helpers")


def _calls_module_function(x: torch.Tensor) -> torch.Tensor:
    return _HELPERS.scale(x) + 1


def _define_scale(k: float) -> None:
    exec(f"def scale(x):\n    return x * {k!r}\n", _HELPERS.__dict__)  # noqa: S102  # a literal


@BACKENDS
def test_a_module_attribute_that_is_a_function_is_freed_when_rebound(fast_entry: bool, backend: str) -> None:
    compiled = kiln.compile(_calls_module_function, backend=backend)
    x = torch.randn(6)
    refs = []
    for k in (2.0, 3.0, 5.0):
        _define_scale(k)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), _calls_module_function(x))
        refs.append(weakref.ref(_HELPERS.scale))
    del _HELPERS.scale
    assert [dead(r) for r in refs] == [True, True, True]
    assert frames_of(compiled).entries == []  # each entry dropped with its function
    _define_scale(7.0)
    torch.testing.assert_close(compiled(x), _calls_module_function(x))


def test_the_fast_entry_checks_a_weakly_held_function() -> None:
    # a plain function guarded by identity qualifies for the boundary extension's fast entry
    if kiln.capture.guards.native_checks() is None:
        pytest.skip("the boundary extension is not built")
    compiled = kiln.compile(_calls_module_function, backend="eager")
    x = torch.randn(6)
    _define_scale(2.0)
    compiled(x)
    compiled(x)
    assert compiled.__globals__["_kiln_fast"] is not None  # type: ignore[attr-defined]
    hits = kiln.stats()["cache_hits"]
    torch.testing.assert_close(compiled(x), x * 2.0 + 1)
    assert kiln.stats()["cache_hits"] == hits + 1


# ---------------------------------------------------------------------------------------------------
# An nn.Module captured by a closure; a class guarded by identity; a bound method's object


class _Small(torch.nn.Module):
    """A submodule reached through two names (tied): the second is guarded to be the first (an
    aliasing guard; by identity before stop 48), the first by its type."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.again = self.fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.again(self.fc(x)))


def _closure_over(mod: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        return mod(x) * 2
    return run


@BACKENDS
def test_an_nn_module_captured_by_a_closure_is_freed(fast_entry: bool, backend: str) -> None:
    x = torch.randn(3, 4)
    refs = []
    with torch.no_grad():
        for _ in range(3):
            mod = _Small()
            run = _closure_over(mod)
            compiled = kiln.compile(run, backend=backend)
            for _ in range(2):
                torch.testing.assert_close(compiled(x), run(x))
            guards = frames_of(compiled).entries[0].check.guards
            # the tie is guarded (`again` is `fc`), not the first call's object: nothing holds the module
            assert any(g.kind == "check_aliasing" and "'again'" in str(g.expected) and "'fc'" in str(g.expected)
                       for g in guards)
            assert not any(g.kind == "check_id" and g.expected is mod.fc for g in guards)
            refs += [weakref.ref(mod), weakref.ref(mod.fc), weakref.ref(mod.fc.weight)]
            del mod, run, compiled
        assert [dead(r) for r in refs] == [True] * 9
        mod = _Small()
        run = _closure_over(mod)
        torch.testing.assert_close(kiln.compile(run, backend=backend)(x), run(x))


_KIND: Any = None


def _uses_kind(x: torch.Tensor) -> torch.Tensor:
    return x * _KIND.scale + (1 if isinstance(_KIND, type) else 0)


def _make_kind(k: float) -> type:
    class Kind:
        scale = k
    return Kind


@BACKENDS
def test_a_class_guarded_by_identity_is_freed(fast_entry: bool, backend: str) -> None:
    global _KIND
    compiled = kiln.compile(_uses_kind, backend=backend)
    x = torch.randn(4)
    refs = []
    try:
        for k in (2.0, 3.0, 4.0):
            _KIND = _make_kind(k)
            for _ in range(2):
                torch.testing.assert_close(compiled(x), _uses_kind(x))
            guards = frames_of(compiled).entries[0].check.guards
            assert any(g.kind == "check_id" and g.expected is _KIND for g in guards)
            refs.append(weakref.ref(_KIND))
            _KIND = None
        assert [dead(r) for r in refs] == [True, True, True]
        for k in (2.0, 6.0):
            _KIND = _make_kind(k)
            torch.testing.assert_close(compiled(x), _uses_kind(x))
    finally:
        _KIND = None


def _make_scaler(k: float) -> Any:
    class Scaler:  # a class per call: its method, guarded by identity, is a new function each time
        def __init__(self, k: float) -> None:
            self.k = k

        def apply(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.k
    return Scaler(k)


_METHOD: Any = None


def _calls_method(x: torch.Tensor) -> torch.Tensor:
    return _METHOD(x) + 1


@BACKENDS
def test_a_bound_method_global_its_function_and_object_are_freed(fast_entry: bool, backend: str) -> None:
    global _METHOD
    compiled = kiln.compile(_calls_method, backend=backend)
    x = torch.randn(4)
    refs = []
    try:
        for k in (2.0, 3.0, 4.0):
            owner = _make_scaler(k)
            _METHOD = owner.apply
            for _ in range(2):
                torch.testing.assert_close(compiled(x), _calls_method(x))
            refs += [weakref.ref(owner), weakref.ref(_METHOD.__func__), weakref.ref(type(owner))]
            _METHOD = None
            del owner
        assert [dead(r) for r in refs] == [True] * 9
        _METHOD = _make_scaler(5.0).apply
        torch.testing.assert_close(compiled(x), _calls_method(x))
    finally:
        _METHOD = None


# ---------------------------------------------------------------------------------------------------
# A new object at a dead one's address is compiled for, not taken for it


class _Token:
    def __init__(self, k: float) -> None:
        self.k = k


_TOKEN: Any = None
_MARK: Any = None


def _uses_token(x: torch.Tensor) -> torch.Tensor:
    # id() guards the token's identity (`_TOKEN is _MARK` alone is an aliasing guard: any one
    # object reached by both names passes it, dead or not)
    return x * (2 if id(_TOKEN) == id(_MARK) else 3)


def _same_address(dead_ids: set[int], k: float) -> tuple[_Token, bool]:
    """A new _Token, at one of `dead_ids` where CPython's allocator gives one back soon."""
    made = []
    for _ in range(2000):
        token = _Token(k)
        if id(token) in dead_ids:
            return token, True
        made.append(token)
    return _Token(k), False


@BACKENDS
def test_a_new_object_at_a_dead_ones_address_recompiles(fast_entry: bool, backend: str) -> None:
    global _TOKEN, _MARK
    compiled = kiln.compile(_uses_token, backend=backend)
    x = torch.randn(4)
    reused = 0
    try:
        for k in (1.0, 2.0, 3.0):
            _TOKEN = _MARK = _Token(k)  # `is` holds: x * 2
            for _ in range(2):
                torch.testing.assert_close(compiled(x), _uses_token(x))
            ref, dead_id = weakref.ref(_TOKEN), id(_TOKEN)
            _TOKEN = _MARK = None
            assert dead(ref)
            _MARK = _Token(-1.0)
            before = _compiles()
            _TOKEN, at_dead = _same_address({dead_id}, k)  # `is` fails now: x * 3, never the dead one's x * 2
            reused += at_dead
            torch.testing.assert_close(compiled(x), x * 3)
            assert _compiles() == before + 1
            _TOKEN = _MARK = None
        assert reused or sys.implementation.name != "cpython"  # the address was given back at least once
    finally:
        _TOKEN = _MARK = None


def test_the_fast_entry_never_takes_a_new_object_at_a_dead_ones_address(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cache entry is kept (its drop switched off) so that the boundary extension's own check of
    # the weak reference decides: its op must fail for the new object at the freed one's address.
    global _TOKEN, _MARK
    if kiln.capture.guards.native_checks() is None:
        pytest.skip("the boundary extension is not built")
    monkeypatch.setattr(config, "fast_entry", True)
    compiled = kiln.compile(_uses_token, backend="eager")
    x = torch.randn(4)
    try:
        _TOKEN = _MARK = _Token(1.0)
        compiled(x)
        compiled(x)
        assert compiled.__globals__["_kiln_fast"] is not None  # type: ignore[attr-defined]
        entry = frames_of(compiled).entries[0]
        entry.check.on_invalid = None
        ref, dead_id = weakref.ref(_TOKEN), id(_TOKEN)
        _TOKEN = _MARK = None
        assert dead(ref) and not entry.check.valid and frames_of(compiled).entries == [entry]
        token, _ = _same_address({dead_id}, 1.0)
        _TOKEN = _MARK = token  # `is` holds again, and at the dead one's address: still a miss
        before = _compiles()
        torch.testing.assert_close(compiled(x), x * 2)
        assert _compiles() == before + 1
    finally:
        _TOKEN = _MARK = None


# ---------------------------------------------------------------------------------------------------
# Dead entries do not count against cache_size_limit


_STEP: Any = None


def _calls_step(x: torch.Tensor) -> torch.Tensor:
    return _STEP(x) + 1


@BACKENDS
def test_entries_of_freed_objects_do_not_fill_the_cache(fast_entry: bool, backend: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    global _STEP
    monkeypatch.setattr(config, "cache_size_limit", 2)
    compiled = kiln.compile(_calls_step, backend=backend)
    x = torch.randn(4)
    try:
        for k in range(5):
            _define_scale(float(k + 2))
            _STEP = _HELPERS.scale
            torch.testing.assert_close(compiled(x), _calls_step(x))
            _STEP = None
            del _HELPERS.scale
            gc.collect()
            assert len(frames_of(compiled).entries) == 0
        assert kiln.stats()["fallbacks"] == 0
    finally:
        _STEP = None


# ---------------------------------------------------------------------------------------------------
# Which objects are held weakly, and the guard record


def test_what_is_held_weakly() -> None:
    class Slotted:
        __slots__ = ("a",)

    weak = [lambda: None, _Small(), _make_kind(1.0), _Token(1.0), _make_scaler(1.0).apply,
            types.ModuleType("not_imported"), [].append]
    strong = [1, 2.5, "text", (1, 2), None, object(), Slotted(), len, torch, int, torch.Tensor, torch.relu,
              torch.nn.Linear, torch.nn.functional.gelu, torch.nn.functional.dropout]
    assert [held_weakly(o) for o in weak] == [True] * len(weak)
    assert [held_weakly(o) for o in strong] == [False] * len(strong)


def test_a_guard_gives_its_object_while_it_lives_and_gone_after() -> None:
    token = _Token(1.0)
    guard = Guard("G['t']", "check_id", token)
    same = Guard("G['t']", "check_id", token)
    assert guard.expected is token and guard == same and guard.key() == same.key()
    key = guard.key()
    ref = weakref.ref(token)
    del token
    assert dead(ref)
    assert guard.expected is GONE and guard.key() == key and "freed" in str(guard)
    assert Guard("G['n']", "check_id", 5).expected == 5  # an int: held as it is


def test_an_extension_without_the_weak_identity_op_is_not_given_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # A build from before KOP_IS_REF has no `frame_entry_ops`: an entry with a weakly held identity
    # keeps the Python loop there, and never reaches the extension's parser.
    from kiln.capture import fast_entry as fast

    real = kiln.capture.guards.native_checks()
    if real is None:
        pytest.skip("the boundary extension is not built")
    made: list = []

    class OldBuild:  # the real extension's tensor checks, a frame_entry that records its calls
        def __getattr__(self, name: str) -> Any:
            if name == "frame_entry_ops":
                raise AttributeError(name)
            return getattr(real, name)

        def frame_entry(self, *args: Any) -> str:
            made.append(args)
            return "entry"

    old_build = OldBuild()
    monkeypatch.setattr(fast, "native_checks", lambda: old_build)
    monkeypatch.setattr(config, "fast_entry", False)
    compiled = kiln.compile(_calls_module_function, backend="eager")
    x = torch.randn(6)
    _define_scale(2.0)
    compiled(x)
    cache = frames_of(compiled)
    args = (list(cache.entries), ("x",), (), _calls_module_function.__globals__, lambda *a: None, cache.entries,
            kiln.capture.entry.STATS, RuntimeError, lambda exc, args: None)
    assert fast.native_entry(*args) is None and made == []
    monkeypatch.setattr(OldBuild, "frame_entry_ops", 14, raising=False)
    assert fast.native_entry(*args) == "entry" and made


def test_recompiles_for_objects_freed_per_call_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # A new object per call, compared by identity and freed after it: each call's entry is dropped
    # and the next recompiles; past the accumulated limit (torch.compile's accumulated_recompile_limit)
    # the frame runs eagerly instead of compiling forever, with eager's values throughout.
    global _TOKEN, _MARK
    from kiln.capture.guards import compile as guards_compile

    monkeypatch.setattr(guards_compile, "ACCUMULATED_LIMIT", 3)
    compiled = kiln.compile(_uses_token, backend="eager")
    x = torch.randn(4)
    try:
        for k in range(6):
            _TOKEN = _MARK = _Token(float(k))
            torch.testing.assert_close(compiled(x), _uses_token(x))
            _TOKEN = _MARK = None
            gc.collect()
        assert kiln.stats()["compiles"] == 3 and kiln.stats()["fallbacks"] == 3
        assert "freed since" in (frames_of(compiled).eager_reason or "")
    finally:
        _TOKEN = _MARK = None
