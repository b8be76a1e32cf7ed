"""One capture of a frame: run the root tracer, and start again until the capture settles.

`capture_frame` runs the tracer (tracer.py) over the frame's bytecode. When an instruction cannot be
traced, it starts the capture again with the root tracer told to stop just before the root-frame
instruction that led to it, which becomes the graph break (glue.py builds it); a trace that
initialized lazy modules, or a value made under inference_mode that escapes, also starts it again.
Input: a function and its bound arguments; output: a CaptureResult.
Corresponds to torch/_dynamo/convert_frame.py.
"""
from __future__ import annotations

import types
from typing import Any, Callable

import torch

from kiln import log
from kiln.capture import code as code_mod
from kiln.capture.device_context import default_device, modes_suspended
from kiln.capture.breaks import BreakRecord, make_break_record
from kiln.capture.glue import (CaptureResult, check_breakable, finish_break, finish_return, handled_in_trace,
                               unbacked_break)
from kiln.capture.options import CompileOptions
from kiln.capture.sources import AttrSource, ClosureSource, LocalSource
from kiln.capture.trace_rules import is_library_code
from kiln.capture.tracer import GENERATOR_FLAGS, CaptureState, ReachedBreak, Tracer
from kiln.capture.variables.context_manager import abandon_open_contexts
from kiln.capture.variables.functions import CellVariable
from kiln.capture.variables.generator import close_dropped_at_return, refuse_unclosed_cleanups
from kiln.errors import (GraphBreakError, HookedTensorEscapes, InferenceModeEscapes, RestartCapture, UnsafeDeferral,
                         Unsupported)

# kinds of value or op found too late in a trace: the frame is captured again with them as breaks
_ESCAPES = (InferenceModeEscapes, HookedTensorEscapes, UnsafeDeferral)
_MAX_RESTARTS = 16  # captures started again after the trace initialized lazy modules


def capture_frame(fn: types.FunctionType, L: dict[str, Any], options: CompileOptions,
                  wrap_frame: Callable[[Any], Any], *, policy: Any = None) -> CaptureResult:
    """Capture one call of `fn` with its arguments bound in `L` (see docs/seams.md)."""
    code = fn.__code__
    log.artifact("bytecode", lambda: "original bytecode:\n" + code_mod.render_code(code))
    if code.co_flags & GENERATOR_FLAGS:
        raise Unsupported(f"{code.co_name} is a generator or coroutine", kind="generator")
    # The default device (a DeviceContext, the one torch function mode a call gets here with) goes
    # into the graph's factories; the trace and the backend run with the modes off the stack.
    device = default_device()
    with modes_suspended():
        return _capture(fn, L, options, wrap_frame, policy, device)


def _capture(fn: types.FunctionType, L: dict[str, Any], options: CompileOptions,
             wrap_frame: Callable[[Any], Any], policy: Any, device: torch.device | None) -> CaptureResult:
    stop: tuple[int, int, BreakRecord] | None = None
    unbacked_limit: int | None = None
    restarts = 0
    # inference_mode blocks are traced as no-grad regions, and pure hooks on computed tensors stay in
    # the graph, until one escapes (the exception's class): then they are breaks
    escaped: set[type] = set()
    while True:
        state = CaptureState(fn, options, policy)
        state.output.default_device = device
        state.inference_breaks = InferenceModeEscapes in escaped
        state.hook_breaks = HookedTensorEscapes in escaped
        state.defer_checks = UnsafeDeferral not in escaped
        state.output.fake_mode.unbacked_limit = unbacked_limit
        root = _root_tracer(state, fn, L, None if stop is None else stop[:2])
        try:
            try:
                value = root.run()
                close_dropped_at_return(root, state.generators)
                refuse_unclosed_cleanups(state.generators)
            except _ESCAPES as exc:
                _note_escape(exc, escaped)
                stop = None
                continue
            except RestartCapture:
                restarts += 1
                if restarts > _MAX_RESTARTS:
                    raise
                stop = None  # the program changed: decide the break again too
                continue
            except ReachedBreak:
                assert stop is not None
                refuse_unclosed_cleanups(state.generators)  # the frame then runs eagerly
                try:
                    return finish_break(state, root, fn, options, wrap_frame, stop[2])
                except _ESCAPES as exc:  # such a value is live at the break
                    _note_escape(exc, escaped)
                    stop = None
                    continue
            except Unsupported as exc:
                if stop is not None:
                    raise
                if unbacked_limit is None and not options.fullgraph:
                    unbacked_limit = unbacked_break(state, exc)
                    if unbacked_limit is not None:
                        continue  # again, breaking at the op that made the size
                tx = _user_frame(state.innermost or root)
                record = make_break_record(exc, tx.code, tx.lineno)
                if options.fullgraph and exc.eager_error is not None and not handled_in_trace(state.innermost or root):
                    # eager's own error (no handler of the frame around it): raised as eager raises it
                    exc.eager_error.add_note(f"(raised while kiln captured {fn.__qualname__} with fullgraph=True, "
                                             f"at {record.filename}:{record.lineno})")
                    raise exc.eager_error
                if options.fullgraph:
                    raise GraphBreakError(str(record)) from exc
                if state.read_compiling and _raised_in_trace(exc) and not handled_in_trace(state.innermost or root):
                    # `if not is_compiling(): mask = ones(...)` then `mask[:, None]`: an error on the
                    # path is_compiling() chose, which eager (where it is False) may never take; as
                    # torch.compile, the frame runs eagerly rather than raising it
                    raise Unsupported(f"{exc.reason}, on a path chosen by torch.compiler.is_compiling() "
                                      "(True while capturing, False when the frame runs eagerly)",
                                      kind="compiling_path") from exc
                check_breakable(root, exc, record)
                if root.current is None:  # Unsupported before the first instruction: nowhere to break
                    raise exc
                offset = root.current.offset
                stop = (offset, root.arrivals.get(offset, 1) - 1, record)
                continue
            try:
                return finish_return(state, root, fn, options, value)
            except _ESCAPES as exc:
                _note_escape(exc, escaped)
                stop = None
                continue
        finally:
            abandon_open_contexts(state)
            state.output.fake_mode.forget_real_tensors()
            state.real_inputs.release()
            torch._C._set_grad_enabled(state.initial_grad)
            state.modes.restore_process()


def _raised_in_trace(exc: Unsupported) -> bool:
    """Whether the break is an error the trace saw raised (eager's own, run natively at the break;
    or an op that raised on its fake inputs: `x + None`)."""
    return "(raised natively)" in exc.reason or " failed on fake inputs: " in exc.reason


def _note_escape(exc: RestartCapture, escaped: set[type]) -> None:
    """Capture again with the escaping kind of value as breaks; a second escape of that kind (the
    breaks did not keep it in) is an internal error rather than an endless loop."""
    if type(exc) in escaped:
        raise exc
    escaped.add(type(exc))


def _user_frame(tx: Tracer) -> Tracer:
    """The innermost tracer running the user's code: a break inside torch or the standard library
    is reported at the user's line that called into it."""
    while tx.parent is not None and is_library_code(tx.code.co_filename):
        tx = tx.parent
    return tx


def _root_tracer(state: CaptureState, fn: types.FunctionType, L: dict[str, Any],
                 stop: tuple[int, int] | None) -> Tracer:
    code = fn.__code__
    cells: dict[str, CellVariable] = {}
    for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
        cells[name] = state.real_cell(cell, ClosureSource(i))
    for name in code_mod.passed_cells(code):
        # a resume function takes the frame's cells themselves (code.make_resume_code)
        passed = L.get(name)
        if not isinstance(passed, types.CellType):
            raise Unsupported(f"cell variable {name!r} of a resume function given {type(passed).__name__}",
                              kind="unsupported")
        cells[name] = state.real_cell(passed, AttrSource(LocalSource(name), "cell_contents"))
    tx = Tracer(state, code, fn.__globals__, {}, cells, lazy_locals=L,
                stop_offset=None if stop is None else stop[0], stop_arrival=0 if stop is None else stop[1])
    return tx


__all__ = ["CaptureResult", "capture_frame"]
