"""Context managers during capture: `torch.autocast` regions and `@contextlib.contextmanager` generators.

Autocast: entering records `torch.amp._enter_autocast(device, dtype, enabled, cache)` in the graph
and switches the real autocast state while tracing, so every fake op gets the dtype eager autocast
gives; exiting records `torch.amp._exit_autocast`. AOT autograd runs those nodes for real while it
traces, so the ATen graph holds the casts autocast made (the lowering needs nothing special).
A contextmanager generator is traced by a child tracer that stops at its `yield` on enter and runs
on (or has the exception thrown in) on exit. `with lock:` on a threading lock does nothing in the
trace; the real lock is taken only around what a graph break runs natively inside the block. A
profiler range (`record_function`) is left out, as torch.compile leaves it out. Grad mode is grad_mode.py; Python classes with
`__enter__`/`__exit__` are inlined by BEFORE_WITH. Corresponds to torch/_dynamo/variables/ctx_manager.py.
"""
from __future__ import annotations

import contextlib
import threading
import types
from typing import TYPE_CHECKING, Any, Sequence

import torch

from kiln.capture.guards import Guard
from kiln.capture.sources import AttrSource, ClosureSource
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.dict import DictVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import CaptureState, Tracer


# ------------------------------------------------------------------------------------ autocast

def _autocast_args_of(cls: type, args: list[Any], kwargs: dict[str, Any]) -> tuple[str, torch.dtype, bool, bool]:
    """(device_type, dtype, enabled, cache_enabled) as the manager's constructor would resolve them."""
    if cls is torch.autocast:
        device = args[0] if args else kwargs["device_type"]
        rest = dict(zip(("dtype", "enabled", "cache_enabled"), args[1:]), **{k: v for k, v in kwargs.items()
                                                                            if k != "device_type"})
    else:  # torch.cpu.amp.autocast / torch.cuda.amp.autocast: (enabled, dtype, cache_enabled)
        device = "cpu" if cls is torch.cpu.amp.autocast else "cuda"
        rest = dict(zip(("enabled", "dtype", "cache_enabled"), args), **kwargs)
        if rest.get("dtype") is None:
            rest["dtype"] = torch.bfloat16 if device == "cpu" else torch.float16
    if not isinstance(device, str):
        raise Unsupported(f"torch.autocast with device_type {device!r}", kind="unsupported_call")
    dtype = rest.get("dtype")
    if dtype is None:
        dtype = torch.get_autocast_dtype(device)
    enabled = bool(rest.get("enabled", True))
    cache = rest.get("cache_enabled")
    if cache is None:
        cache = torch.is_autocast_cache_enabled()
    return device, dtype, enabled, bool(cache)


AUTOCAST_CLASSES = (torch.autocast, torch.cpu.amp.autocast, torch.cuda.amp.autocast)


class AutocastVariable(Variable):
    """A `torch.autocast(...)` manager; `enter_node` is the graph node of the open region."""

    def __init__(self, cls: type, device: str, dtype: torch.dtype, enabled: bool, cache: bool) -> None:
        self.cls = cls
        self.device = device
        self.dtype = dtype
        self.enabled = enabled
        self.cache = cache
        self.enter_node: torch.fx.Node | None = None
        self.real: Any = None  # the process's own autocast region while tracing

    def describe(self) -> str:
        return f"torch.autocast({self.device!r}, dtype={self.dtype})"

    def python_type(self) -> type:
        return self.cls

    def enter(self, tx: "Tracer") -> Variable:
        values = (self.device, self.dtype, self.enabled, self.cache)
        self.enter_node = tx.output.create_node("call_function", torch.amp._enter_autocast, values, {}, None)
        self.real = torch.amp._enter_autocast(*values)
        tx.state.open_contexts.append(self)
        return ConstantVariable(None)

    def exit(self, tx: "Tracer") -> Variable:
        if self not in tx.state.open_contexts:
            raise Unsupported(f"exiting {self.describe()} that this trace did not enter", kind="unsupported")
        tx.state.open_contexts.remove(self)
        self.close(tx.state)
        return ConstantVariable(None)

    def close(self, state: "CaptureState") -> None:
        """End the region in the graph and in the process."""
        state.output.create_node("call_function", torch.amp._exit_autocast, (self.enter_node,), {}, None)
        self.abandon()

    def abandon(self) -> None:
        """End the process's region only (the trace stopped inside the block)."""
        if self.real is not None:
            torch.amp._exit_autocast(self.real)
            self.real = None

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name == "__exit__":
            return ContextExitVariable(self)
        if name == "__enter__":
            return _BoundEnter(self)
        raise Unsupported(f"attribute {name!r} of {self.describe()}", kind="unsupported_attribute")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:  # the very object: an ExitStack that entered it exits it later
            return self.source.name()
        return (f"{glue.constant(torch.autocast)}({self.device!r}, dtype={glue.constant(self.dtype)}, "
                f"enabled={self.enabled}, cache_enabled={self.cache})")


def wrap_autocast_instance(state: "CaptureState", value: Any, source: Any) -> AutocastVariable:
    """A `torch.autocast` object made outside the frame (a decorator's, a module attribute): its
    Python `__enter__` sets the process's state, so it is never inlined; its settings are guarded."""
    settings = {"device": value.device, "fast_dtype": value.fast_dtype, "_enabled": value._enabled,
                "_cache_enabled": value._cache_enabled}
    if source is not None:
        state.output.guards.append(Guard(source.name(), "check_type", type(value)))
        for attr, setting in settings.items():
            state.output.guards.append(Guard(AttrSource(source, attr).name(), "check_value", setting))
    var = AutocastVariable(type(value), value.device, value.fast_dtype, bool(value._enabled),
                           bool(value._cache_enabled))
    var.source = source
    return var


def close_open_contexts(state: "CaptureState") -> None:
    """At the end of a graph (a break inside an autocast block): the graph leaves autocast as it
    found it, and the glue enters a real region for the native instruction (ContextExitVariable)."""
    for ctx in reversed(state.open_contexts):
        ctx.close(state)


def abandon_open_contexts(state: "CaptureState") -> None:
    """After a capture, whatever happened: the tracer's own autocast regions are left."""
    for ctx in reversed(state.open_contexts):
        ctx.abandon()


# ------------------------------------------------------------------------------------ generators

class GeneratorYielded(Exception):
    """A generator traced in steps (a contextmanager's body) reached a `yield`."""

    def __init__(self, value: Variable) -> None:
        super().__init__("yield")
        self.value = value


class GeneratorContextVariable(Variable):
    """`with some_contextmanager(...)`: the generator runs in a child tracer, in two halves."""

    def __init__(self, func: Variable, args: list[Variable], kwargs: dict[str, Variable]) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.gen: "Tracer | None" = None
        self.yield_ip = 0

    def describe(self) -> str:
        return f"contextmanager {getattr(self.func, 'describe', lambda: '?')()}"

    def python_type(self) -> type:
        return contextlib._GeneratorContextManager

    def enter(self, tx: "Tracer") -> Variable:
        if self.gen is not None:
            raise Unsupported("entering a contextmanager object twice (raised natively)", kind="unsupported")
        self.gen = _start_generator(tx, self.func, self.args, self.kwargs)
        value = self._advance(tx)
        if value is None:
            raise Unsupported("a contextmanager generator that did not yield (raised natively)", kind="unsupported")
        return value

    def exit(self, tx: "Tracer", exc: Variable | None = None) -> Variable:
        from kiln.capture.variables.exception import ExceptionVariable, RaisedInTrace, catch_in_frame

        gen = self.gen
        if gen is None:
            raise Unsupported("exiting a contextmanager that was not entered", kind="unsupported")
        if exc is None or not isinstance(exc, ExceptionVariable):
            if self._advance(tx) is not None:
                raise Unsupported("a contextmanager generator that yielded twice (raised natively)",
                                  kind="unsupported")
            return ConstantVariable(False)
        # `gen.throw(exc)`: raised at the paused yield, under the generator's own handlers.
        gen.current = gen.instructions[self.yield_ip]
        if not catch_in_frame(gen, RaisedInTrace(exc)):
            return ConstantVariable(False)
        gen.ip = gen.next_ip
        try:
            finished = self._advance(tx, resume=False) is None
        except RaisedInTrace as raised:
            if raised.exception is exc:
                return ConstantVariable(False)  # re-raised the same exception: not suppressed
            raise
        if not finished:
            raise Unsupported("a contextmanager generator that yielded after a throw (raised natively)",
                              kind="unsupported")
        return ConstantVariable(True)  # the generator swallowed the exception

    def _advance(self, tx: "Tracer", resume: bool = True) -> Variable | None:
        """Run the generator to its next yield (its value) or its end (None)."""
        gen = self.gen
        assert gen is not None
        if resume and gen.current is not None and gen.current.opname == "YIELD_VALUE":
            gen.ip = gen.next_ip
            gen.push(ConstantVariable(None))  # the value `send` would deliver
        try:
            gen.run()
        except GeneratorYielded as yielded:
            self.yield_ip = gen.ip
            return yielded.value
        finally:
            tx.state.innermost = tx
        return None

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name == "__exit__":
            return ContextExitVariable(self)
        if name == "__enter__":
            return _BoundEnter(self)
        raise Unsupported(f"attribute {name!r} of {self.describe()}", kind="unsupported_attribute")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.gen is None:  # made but not entered (a break at its `with`): make it again natively
            # what the @contextmanager helper makes: the manager over (generator function, args, kwargs)
            args = "".join(f"{glue.reconstruct(a)}, " for a in self.args)
            kwargs = ", ".join(f"{k!r}: {glue.reconstruct(v)}" for k, v in self.kwargs.items())
            make = glue.constant(contextlib._GeneratorContextManager)
            return f"{make}({glue.reconstruct(self.func)}, ({args}), {{{kwargs}}})"
        raise Unsupported("a graph break inside a @contextmanager block (its generator is mid-trace)",
                          kind="reconstruct")


def _start_generator(tx: "Tracer", func: Variable, args: list[Variable], kwargs: dict[str, Variable]) -> "Tracer":
    """A child tracer over the generator function's code, bound to its arguments, not yet run."""
    from kiln.capture.variables.functions import NestedFunctionVariable, UserFunctionVariable

    if isinstance(func, UserFunctionVariable):
        fn = func.fn
        code, f_globals = fn.__code__, fn.__globals__
        defaults, kwdefaults = fn.__defaults__ or (), fn.__kwdefaults__ or {}
        closure = [tx.state.real_cell(cell, None if func.source is None else ClosureSource(i, func.source))
                   for i, cell in enumerate(fn.__closure__ or ())]
    elif isinstance(func, NestedFunctionVariable):
        code, f_globals = func.code, func.f_globals
        defaults, kwdefaults, closure = func.defaults, func.kwdefaults, list(func.closure or [])
    else:
        raise Unsupported(f"a contextmanager over {func.describe()}", kind="unsupported_call")
    local_vars = tx._bind(code, defaults, kwdefaults, list(args), dict(kwargs), code.co_qualname)
    child = tx.child(code, f_globals, local_vars, dict(zip(code.co_freevars, closure)))
    child.suspend_at_yield = True
    return child


# ------------------------------------------------------------------------------------ classes, exits

class ContextManagerClassVariable(Variable):
    """`torch.autocast` (and its device aliases) or contextlib's `_GeneratorContextManager` class:
    calling it makes the manager's Variable."""

    def __init__(self, cls: type, source: Any = None) -> None:
        self.cls = cls
        self.source = source

    def describe(self) -> str:
        return f"class {self.cls.__qualname__}"

    def python_type(self) -> type:
        return type(self.cls)

    def as_python_value(self) -> Any:
        return self.cls

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if self.cls is contextlib._GeneratorContextManager:
            func, pos, kw = args
            if not isinstance(kw, DictVariable):
                raise Unsupported("contextlib._GeneratorContextManager with keywords that are not a dict",
                                  kind="unsupported_call")
            return GeneratorContextVariable(func, tx.iterate(pos), dict(kw.items))
        if not all(a.is_constant() for a in [*args, *kwargs.values()]):
            raise Unsupported(f"{self.cls.__qualname__} with arguments unknown at trace time", kind="unsupported_call")
        if self.cls is PROFILER_RANGE:
            return ProfilerRangeVariable([a.as_constant() for a in args],
                                         {k: v.as_constant() for k, v in kwargs.items()})
        values = _autocast_args_of(self.cls, [a.as_constant() for a in args],
                                   {k: v.as_constant() for k, v in kwargs.items()})
        return AutocastVariable(self.cls, *values)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return glue.constant(self.cls)


# ------------------------------------------------------------------------------------ profiler ranges

# torch.profiler.record_function is the same class
PROFILER_RANGE = torch.autograd.profiler.record_function


class ProfilerRangeVariable(Variable):
    """`with torch.autograd.profiler.record_function(name):` (every optimizer step opens one).

    As torch.compile does, the range is left out of the compiled region: inside the graph it does
    nothing (its enter and exit are profiler ops that would pin the graph to eager's call order
    and have no fake kernels). A graph break inside the block opens none either: the resume
    function finds a no-op `__exit__` (the frame's code, compiled or not, records no range)."""

    def __init__(self, args: list[Any], kwargs: dict[str, Any]) -> None:
        self.args = args
        self.kwargs = kwargs

    def describe(self) -> str:
        return f"record_function({', '.join(map(repr, self.args))})"

    def python_type(self) -> type:
        return PROFILER_RANGE

    def enter(self, tx: "Tracer") -> Variable:
        return self  # record_function.__enter__ returns the manager

    def exit(self, tx: "Tracer") -> Variable:
        return ConstantVariable(None)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name == "__exit__":
            return ContextExitVariable(self)
        if name == "__enter__":
            return _BoundEnter(self)
        raise Unsupported(f"attribute {name!r} of {self.describe()}", kind="unsupported_attribute")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        args = "".join(f"{glue.constant(a)}, " for a in self.args)
        kwargs = ", ".join(f"{k}={glue.constant(v)}" for k, v in self.kwargs.items())
        return f"{glue.constant(PROFILER_RANGE)}({args}{kwargs})"


def _ignored_range_exit(*exc_info: Any) -> None:
    """What a resume function finds as the `__exit__` of an ignored profiler range."""
    return None


# ------------------------------------------------------------------------------------ locks

# threading.Lock() and _thread.allocate_lock() make a `_thread.lock`; threading.RLock() a
# `_thread.RLock` (the C one) or threading._PyRLock where that is missing.
LOCK_TYPES: tuple[type, ...] = (type(threading.Lock()), type(threading.RLock()), threading._PyRLock)  # type: ignore[attr-defined]


def is_lock(value: Any) -> bool:
    return type(value) in LOCK_TYPES


class LockExitVariable(Variable):
    """The bound `__exit__` BEFORE_WITH leaves for `with lock:` on a threading lock.

    As in torch.compile, the traced region treats the lock as a manager that does nothing: the
    compiled code runs on one thread, and the lock guards no tensor. Entering it gives True (what
    `lock.__enter__()` returns) and exiting it suppresses nothing. Only when a graph break falls
    inside the block is the real lock taken: the glue acquires it before the native instruction,
    and the resume function releases it at the block's end (it calls the real `__exit__`), so
    whatever runs natively inside the block holds the lock as in eager."""

    def __init__(self, lock: Variable) -> None:
        self.lock = lock

    def describe(self) -> str:
        return f"__exit__ of {self.lock.describe()}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return ConstantVariable(None)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        name = glue.fresh("lock")
        glue.line(f"{name} = {self.lock.reconstruct(glue)}")
        glue.line(f"{name}.__enter__()")
        return f"{name}.__exit__"


class HeldLockExitVariable(Variable):
    """`lock.__exit__` of a lock the glue took (a graph break inside `with lock:`), on the stack of
    the resume function: releasing the real lock is a call that runs natively, where the program
    releases it."""

    def __init__(self, value: Any, source: Any) -> None:
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"__exit__ of {type(self.value.__self__).__qualname__} object"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        raise Unsupported("the end of a `with lock:` block whose lock was taken for a graph break inside it "
                          "(released natively)", kind="lock_release")


def is_held_lock_exit(value: Any) -> bool:
    return isinstance(value, types.BuiltinMethodType) and is_lock(getattr(value, "__self__", None)) \
        and value.__name__ == "__exit__"


def is_context_manager_class(value: Any) -> bool:
    return value is contextlib._GeneratorContextManager or value is PROFILER_RANGE \
        or any(value is c for c in AUTOCAST_CLASSES)


class _BoundEnter(Variable):
    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return self.ctx.enter(tx)


class ContextExitVariable(Variable):
    """The bound `__exit__` BEFORE_WITH leaves on the stack for an autocast or generator manager."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def describe(self) -> str:
        return f"__exit__ of {self.ctx.describe()}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if isinstance(self.ctx, GeneratorContextVariable):
            return self.ctx.exit(tx, args[1] if len(args) > 1 else None)
        return self.ctx.exit(tx)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if isinstance(self.ctx, ProfilerRangeVariable):
            # no range is opened for what a break runs natively: the compiled region has none
            return glue.constant(_ignored_range_exit)
        # A break inside the block: enter a real manager of the same kind now, so the native
        # instruction runs in the region; the resume function exits it.
        name = glue.fresh("ctx")
        glue.line(f"{name} = {self.ctx.reconstruct(glue)}")
        glue.line(f"{name}.__enter__()")
        return f"{name}.__exit__"


__all__ = ["AUTOCAST_CLASSES", "PROFILER_RANGE", "ProfilerRangeVariable", "AutocastVariable", "ContextExitVariable", "ContextManagerClassVariable",
           "GeneratorContextVariable", "GeneratorYielded", "HeldLockExitVariable", "LockExitVariable", "abandon_open_contexts",
           "close_open_contexts", "is_context_manager_class", "is_held_lock_exit", "is_lock", "wrap_autocast_instance"]
