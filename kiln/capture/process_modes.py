"""Process-wide settings that traced code may read and change: the default dtype and whether
saved-tensor hooks are disabled (grad mode has its own, older path in variables/grad_mode.py).

Changing one in the frame (`torch.set_default_dtype(torch.float64)`, a
`disable_saved_tensors_hooks(msg)` block) records a node that sets it at that point of the graph
and sets it in the tracing process too, so fake tensors see what eager would. A graph leaves each
setting as it found it (a last node restores it) and the glue sets the frame's final value
natively, as for grad mode; the tracer restores the process when the capture ends. Reading one
before the frame changed it is guarded: the default dtype by the entry's global-state guard, the
others by a check_query guard. Corresponds to how torch/_dynamo treats these as global state
(convert_frame's restore of the default dtype, ctx_manager.py's saved-tensor-hooks variable).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from kiln.capture.guards import Guard, ProcessQuery

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import CaptureState


def set_saved_tensors_hooks_message(message: str | None) -> None:
    """Saved-tensor hooks disabled with `message`, or enabled again (None): the one call that sets
    the state `_saved_tensors_hooks_get_disabled_error_message()` reads, as a graph node."""
    if message is None:
        torch._C._autograd._saved_tensors_hooks_enable()
    else:
        torch._C._autograd._saved_tensors_hooks_disable(message)


@dataclass(frozen=True)
class ProcessMode:
    """One setting: how to read it, how to set it (also the graph node's target), and whether the
    entry's global-state guard already checks its value at entry (else a read is guarded)."""

    name: str
    read: Callable[[], Any]
    write: Callable[[Any], None]
    guarded_at_entry: bool


DEFAULT_DTYPE = ProcessMode("the default dtype", torch.get_default_dtype, torch._C._set_default_dtype, True)
SAVED_TENSORS_HOOKS = ProcessMode("the disabled saved-tensor hooks' message",
                                  torch._C._autograd._saved_tensors_hooks_get_disabled_error_message,
                                  set_saved_tensors_hooks_message, False)
MODES = (DEFAULT_DTYPE, SAVED_TENSORS_HOOKS)
MODE_WRITERS = frozenset(m.write for m in MODES)


def _dtypes(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return [value.dtype]
    if isinstance(value, (tuple, list)):
        return [d for v in value for d in _dtypes(v)]
    return [type(value)]


class ProcessModes:
    """What one capture did to the settings: their values when first touched and now."""

    def __init__(self) -> None:
        self.initial: dict[ProcessMode, Any] = {}
        self.current: dict[ProcessMode, Any] = {}

    def read(self, state: "CaptureState", mode: ProcessMode) -> Any:
        """The setting as the traced code sees it now (guarded when the trace did not set it)."""
        if mode in self.current:
            return self.current[mode]
        value = mode.read()
        if not mode.guarded_at_entry:
            state.output.guards.append(Guard("", "check_query", ProcessQuery(mode.read, (), value, mode.name)))
        return value

    def write(self, state: "CaptureState", mode: ProcessMode, value: Any) -> None:
        """Set it at this point of the graph and in the tracing process."""
        if mode not in self.initial:
            self.initial[mode] = self.current[mode] = mode.read()
        if self.current[mode] == value and type(self.current[mode]) is type(value):
            return
        state.output.create_node("call_function", mode.write, (value,), {}, None)
        mode.write(value)
        self.current[mode] = value

    def changed(self) -> list[tuple[ProcessMode, Any, Any]]:
        """(mode, value at the start, value now) for each setting the trace left changed."""
        return [(m, self.initial[m], self.current[m]) for m in self.initial if self.current[m] != self.initial[m]]

    def restore_in_graph(self, state: "CaptureState") -> None:
        """The graph's last nodes: each changed setting back to what the graph found."""
        for mode, initial, _ in self.changed():
            state.output.create_node("call_function", mode.write, (initial,), {}, None)

    def set_in_glue(self, glue: "GlueBuilder") -> None:
        """The glue sets the frame's own values natively once the graph has run."""
        for mode, _, now in self.changed():
            glue.line(f"{glue.constant(mode.write)}({glue.constant(now)})")

    def pinned_dtype(self, run_fake: Callable[[Any, tuple, dict], Any], target: Any, args: tuple,
                     kwargs: dict, example: Any) -> torch.dtype | None:
        """For an op recorded while the frame has changed the default dtype: the dtype to pass it
        explicitly, or None when its result does not depend on the default (the graph may run, or
        be lowered, under another default: an ATen graph keeps `ones(...)` without a dtype, and
        `int_tensor * 1.5` promotes to whatever default it meets). A dependent op that takes no
        `dtype` keyword cannot be pinned: a graph break."""
        now = self.current.get(DEFAULT_DTYPE)
        initial = self.initial.get(DEFAULT_DTYPE)
        if now is None or initial is None or now == initial or "dtype" in kwargs:
            return None
        try:
            torch._C._set_default_dtype(initial)
            other = run_fake(target, args, kwargs)
        finally:
            torch._C._set_default_dtype(now)
        if _dtypes(other) == _dtypes(example):
            return None
        from kiln.errors import Unsupported
        if isinstance(example, torch.Tensor):
            try:
                pinned = run_fake(target, args, {**kwargs, "dtype": example.dtype})
            except Unsupported:
                pinned = None
            if isinstance(pinned, torch.Tensor) and pinned.dtype == example.dtype:
                return example.dtype
        name = getattr(target, "__name__", target)
        raise Unsupported(f"{name}'s result dtype follows the default dtype the frame changed, and it takes no dtype",
                          kind="unsupported")

    def restore_process(self) -> None:
        """After tracing: the process as it was before the capture touched it."""
        for mode, initial in self.initial.items():
            mode.write(initial)
