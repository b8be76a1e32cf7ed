"""The default device: the one torch function mode capture models, `torch.utils._device.DeviceContext`.

`torch.set_default_device(d)` and `with torch.device(d):` push a DeviceContext on the thread's
torch function mode stack; the innermost gives every factory of `_device_constructors()` called
without a `device=` keyword the device `d`, and passes every other call through. Capture reads
that device (`default_device`), traces with the mode taken off the stack (Kiln's own calls, fake
tensors and the backend's, must not see it) and writes the device into each such factory call of
the graph (variables/torch.py); the entry's global-state guard checks that the same device (or
none) is active (guards/global_kinds.py, boundary.cpp's KOP_STATE). Any other mode on the stack
(a user's TorchFunctionMode) sees every torch call: such a call runs eagerly (entry.py). A compiled
graph runs with the modes off the stack (`runs_without_modes`): it already holds the device.
A user's TorchDispatchMode (one on the dispatch mode stack, not in an infra slot such as a fake
mode's) sees every aten op: a call under one runs eagerly too (`user_dispatch_mode`), as
torch.compile skips such a frame, and the entry's mode check fails while one is active.
Corresponds to how torch/_dynamo traces DeviceContext (variables/torch_function.py) and guards
on the default device (guards.py's DEFAULT_DEVICE).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch.utils._device import DeviceContext, _device_constructors

FUNCTION_MODE_ACTIVE = "a torch function mode other than the default device's is active (a TorchFunctionMode)"
DISPATCH_MODE_ACTIVE = "a torch dispatch mode is active (a TorchDispatchMode sees every aten op)"


def _device_mode() -> DeviceContext | None:
    """The innermost mode where every mode on the stack is exactly a DeviceContext (`with
    torch.device` inside set_default_device stacks two; the innermost one's device wins) and modes
    are on; else None."""
    n = torch._C._len_torch_function_stack()
    if n == 0 or not torch._C._is_torch_function_mode_enabled():
        return None
    modes = [torch._C._get_function_stack_at(i) for i in range(n)]
    return modes[-1] if all(type(m) is DeviceContext for m in modes) else None


def traceable_modes() -> bool:
    """No torch function mode is active, or only DeviceContexts (the one mode capture models)."""
    return torch._C._len_torch_function_stack() == 0 or _device_mode() is not None


def default_device() -> torch.device | None:
    """The device of the innermost DeviceContext when only those are active; None otherwise."""
    mode = _device_mode()
    return None if mode is None else mode.device


def user_dispatch_mode() -> Any | None:
    """The innermost TorchDispatchMode on the thread's dispatch mode stack that is not an infra
    mode (a fake, proxy or functional mode sits in its own slot, `_mode_key`) nor one of Kiln's own
    (its ATen tracer, while a backend traces code that calls a compiled function); None when none is."""
    n = torch._C._len_torch_dispatch_stack()
    for i in reversed(range(n)):
        mode = torch._C._get_dispatch_stack_at(i)
        if getattr(mode, "_mode_key", None) is None and not type(mode).__module__.startswith("kiln."):
            return mode
    return None


def device_state_is(expected: torch.device | None) -> bool:
    """The guard's check: no mode at all (`expected` None), or only DeviceContexts, the innermost
    one of `expected`; and no user dispatch mode (the graph would run without showing it its ops)."""
    if torch._C._len_torch_dispatch_stack() and user_dispatch_mode() is not None:
        return False
    if expected is None:
        return torch._C._len_torch_function_stack() == 0
    return default_device() == expected


def applies_to(fn: Any) -> bool:
    """Whether a DeviceContext gives `fn` its device (a factory called without `device=`)."""
    try:
        return fn in _device_constructors()
    except TypeError:  # an unhashable callable
        return False


@contextlib.contextmanager
def modes_suspended() -> Iterator[None]:
    """The thread's torch function modes off the stack for the block, then put back in order."""
    n = torch._C._len_torch_function_stack()
    if n == 0:
        yield
        return
    saved = [torch._C._pop_torch_function_stack() for _ in range(n)]
    try:
        yield
    finally:
        for mode in reversed(saved):
            torch._C._push_on_torch_function_stack(mode)


def runs_without_modes(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (a compiled graph traced under a DeviceContext) called with the modes off the stack:
    its factories already name the device, and the backend's own code (a wrapper's
    `torch.empty_strided` without a device) must not be given another. `_kiln_graph` is `fn` (the
    persistent cache stores that, and wraps it again on load)."""
    def run(*args: Any) -> Any:
        if not torch._C._len_torch_function_stack():
            return fn(*args)
        with modes_suspended():
            return fn(*args)
    run._kiln_graph = fn  # type: ignore[attr-defined]
    return run
