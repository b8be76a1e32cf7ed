"""Guard kinds over no one value (source ""): the process-wide state a graph bakes in (grad mode,
default dtype, autocast), settings the trace asked for (`ProcessQuery`), calls made for real because
their result is promised constant (`ConstantCall`), and which tensor inputs are the same object.

What they compare is bound as a constant or named by its sources. Helpers the generated check calls
by a fixed name are added to the Emitter's table (`CHECK_HELPERS`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from kiln.capture.device_context import (DISPATCH_MODE_ACTIVE, FUNCTION_MODE_ACTIVE, default_device, device_state_is,
                                         user_dispatch_mode)
from kiln.capture.guards.kinds import CHECK_HELPERS, Check, Emitter, Guard, _short, guard_kind, user_name


@dataclass(frozen=True)
class ConstantCall:
    """A call capture made for real because its function is marked as having a constant result
    (assume_constant_result; transformers' install probes): the function, its constant arguments
    (kwargs as items) and the result the graph was traced with. The mark promises one answer for
    the lifetime of a process, not across processes (another environment, another install): an
    entry read from disk calls the function once in the new process before it is used."""

    fn: Any
    args: tuple
    kwargs: tuple
    result: Any

    def __str__(self) -> str:
        return f"{getattr(self.fn, '__qualname__', '?')}(...) returns {_short(self.result)}"


# (id(fn), args, kwargs) -> (fn, result): one real call per function and arguments per process,
# the one capture made or the first guard check of an entry read from disk (fn kept alive, so that
# its id is not reused)
_CONSTANT_RESULTS: dict[tuple[int, str, str], tuple[Any, Any]] = {}


def note_constant_result(call: ConstantCall) -> None:
    """What capture's real call of a constant-result function returned (no second call in-process)."""
    _CONSTANT_RESULTS[(id(call.fn), repr(call.args), repr(call.kwargs))] = (call.fn, call.result)


def _constant_result_holds(call: ConstantCall) -> bool:
    key = (id(call.fn), repr(call.args), repr(call.kwargs))
    known = _CONSTANT_RESULTS.get(key)
    if known is None or known[0] is not call.fn:
        try:
            result = call.fn(*call.args, **dict(call.kwargs))
        except Exception:
            return False  # capture raises the same and breaks there
        known = _CONSTANT_RESULTS[key] = (call.fn, result)
    return known[1] is call.result or (type(known[1]) is type(call.result) and known[1] == call.result)


@guard_kind
def check_constant_result(expected: ConstantCall, name: str, em: Emitter) -> list[Check]:
    # Source "": the function is bound as a constant (its identity at the source the trace read it
    # from has its own check_id guard), so the check never calls anything else.
    return [Check(f"___constant_result({em.bind(expected)})",
                  lambda env: f"{getattr(expected.fn, '__qualname__', '?')}() no longer returns "
                              f"{_short(expected.result)}")]


@guard_kind
def check_grad_mode(expected: bool, name: str, em: Emitter) -> list[Check]:
    state = {True: "enabled", False: "disabled"}
    return [Check(f"___grad_enabled() is {bool(expected)}",
                  lambda v: f"grad mode changed (was {state[bool(expected)]} when compiled, now {state[not expected]})")]


@dataclass(frozen=True)
class GlobalState:
    """Process-wide settings a traced graph bakes in besides grad mode (source ""): the default
    dtype, autocast, and the default device of the torch function mode stack (None: no mode; a
    device: only a DeviceContext of it, kiln.capture.device_context)."""

    default_dtype: torch.dtype
    autocast: bool
    default_device: torch.device | None = None

    @staticmethod
    def now() -> "GlobalState":
        return GlobalState(torch.get_default_dtype(), torch._C._is_any_autocast_enabled(), default_device())

    def __str__(self) -> str:
        device = "no torch function mode" if self.default_device is None else f"default device {self.default_device}"
        return f"default dtype {self.default_dtype}, autocast {'on' if self.autocast else 'off'}, {device}"


def _modes_changed(expected: torch.device | None) -> str:
    """Why the torch function mode stack is not the one a graph was traced under, in words."""
    if user_dispatch_mode() is not None:
        return DISPATCH_MODE_ACTIVE
    now = default_device()
    if now is None and torch._C._len_torch_function_stack():
        return FUNCTION_MODE_ACTIVE
    before = "none" if expected is None else str(expected)
    return f"the default device changed (torch.set_default_device / torch.device) from {before} to {now or 'none'}"


@guard_kind
def check_global_state(expected: GlobalState, name: str, em: Emitter) -> list[Check]:
    # Factories without a dtype follow the default dtype, and autocast changes the dtype of every
    # matmul: a graph traced under other settings computes something else. The default device
    # (a DeviceContext, the one torch function mode capture models) went into every factory of the
    # graph; any other mode (a user's TorchFunctionMode) sees every torch call, so graphs are only
    # made without one (kiln.capture.entry runs the call eagerly) and every entry checks the stack.
    device = expected.default_device
    if em.native is not None and not expected.autocast and hasattr(em.native, "state_ok"):
        # one call of the boundary extension for all three
        def why(env: Any) -> str:
            if torch.get_default_dtype() is not expected.default_dtype:
                return f"the default dtype changed from {expected.default_dtype} to {torch.get_default_dtype()}"
            if not device_state_is(device):
                return _modes_changed(device)
            return "autocast was turned on"
        return [Check(f"___state_ok(None, {em.bind(expected.default_dtype)}, {em.bind(device)})", why)]
    return [
        Check(f"___default_dtype() is {em.bind(expected.default_dtype)}",
              lambda env: f"the default dtype changed from {expected.default_dtype} to {torch.get_default_dtype()}"),
        Check(f"___any_autocast() is {expected.autocast}",
              lambda env: f"autocast was turned {'off' if expected.autocast else 'on'}"),
        Check(f"___device_state_is({em.bind(device)})", lambda env: _modes_changed(device)),
    ]




@dataclass(frozen=True, repr=False)
class ProcessQuery:
    """A process-wide setting the trace asked for and baked in: `fn(*args)` gave `result` (a
    torch.backends flag, `torch.distributed.is_initialized()`, whether saved-tensor hooks are
    disabled). Source ""; the function and its arguments are bound as constants, and the check calls
    it again. In another process nothing is known about them: such an entry is not stored."""

    fn: Any
    args: tuple
    result: Any
    label: str

    def __str__(self) -> str:
        return f"{self.label} is {_short(self.result)}"

    __repr__ = __str__


@guard_kind
def check_query(expected: ProcessQuery, name: str, em: Emitter) -> list[Check]:
    # every name is bound (never the repr of a user value: generated text is not built from it)
    call = f"{em.bind(expected.fn)}(*{em.bind(expected.args)})"
    result = expected.result

    def why(env: Any) -> str:
        try:
            now = expected.fn(*expected.args)
        except Exception as exc:  # reported, not raised: the entry is simply not used
            now = f"<{type(exc).__name__}>"
        return f"{expected.label} changed from {_short(result)} to {_short(now)}"

    if result is None or isinstance(result, bool):
        return [Check(f"{call} is {em.bind(result)}", why)]
    return [Check(f"type({call}) is {em.bind(type(result))} and {call} == {em.bind(result)}", why)]


@guard_kind
def check_aliasing(groups: tuple[tuple[str, ...], ...], name: str, em: Emitter) -> list[Check]:
    """Which tensor inputs are the same object: `groups` partitions their sources (source "")."""
    # A graph captured with two distinct tensors must not run on one tensor passed twice (nor the
    # reverse): after functionalization an in-place update of one would not show in the other.
    checks = []
    for group in groups:
        for other in group[1:]:
            def no_longer_same(env: dict, a: str = group[0], b: str = other) -> str:
                return f"{user_name(a)} and {user_name(b)} are no longer the same tensor"
            checks.append(Check(f"{group[0]} is {other}", no_longer_same))
    firsts = [group[0] for group in groups]

    def why_distinct(env: dict) -> str:
        seen: dict[int, str] = {}
        for src in firsts:
            value = eval(src, env)
            if id(value) in seen:
                return f"{user_name(seen[id(value)])} and {user_name(src)} are now the same tensor"
            seen[id(value)] = src
        return "tensor inputs alias differently"

    if len(firsts) == 2:
        checks.append(Check(f"{firsts[0]} is not {firsts[1]}", why_distinct))
    elif len(firsts) > 2:
        ids = ", ".join(f"id({f})" for f in firsts)
        checks.append(Check(f"len({{{ids}}}) == {len(firsts)}", why_distinct))
    return checks


def aliasing_guard(sources: Sequence[str], values: Sequence[Any]) -> Guard | None:
    """The check_aliasing guard for tensors `values` read at `sources` (None when fewer than two)."""
    groups: dict[int, list[str]] = {}
    for src, value in zip(sources, values):
        groups.setdefault(id(value), []).append(src)
    if len(sources) < 2:
        return None
    return Guard("", "check_aliasing", tuple(tuple(g) for g in groups.values()))


CHECK_HELPERS["___constant_result"] = _constant_result_holds
CHECK_HELPERS["___device_state_is"] = device_state_is
