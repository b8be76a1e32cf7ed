"""The compiled callable of a code object, for every function object made from it.

Where it sits: a glue calls a function at a graph break through the entry's `wrap_frame`. For a
function made inside the frame (an inner def, a lambda, a comprehension) or one read from a
closure cell of a function made anew by each call of its maker, the function object is new on
every call, while its code is not. torch.compile hooks frames by their code object: the new
function's frame finds the entries of its code, and guards on what the trace read (cells,
defaults, globals) decide. `CodeCallee` is that: one per (code, options, tracer), called by the
glue as `callee(fn, *args, **kwargs)`; it binds the call's locals, runs the first entry of the
code's FrameCache whose guards pass on (L, fn.__globals__, fn), and otherwise hands the call to a
`_Frame` of this very function object (capture, recompile, fallback), which fills the same cache.
Compiling each new function object with compile_function (an entry's source made and exec'd per
object) made such a call ~37x slower. Resume functions of a frame with a closure go through it
too (kiln.capture.code._PerClosure).
Corresponds to torch/_dynamo/eval_frame.py's per-code-object cache lookup on frame entry.
"""
from __future__ import annotations

import inspect
import types
from typing import Any

from kiln.capture.binding import make_binder
from kiln.errors import ExternMismatchError

_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_NOT_PLAIN = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS


class CodeCallee:
    """`callee(fn, *args, **kwargs)`: `fn(*args, **kwargs)` through the compiled entries of
    `fn.__code__` (the code it was made for; another code goes through compile_function)."""

    def __init__(self, code: types.CodeType, options: Any, capture: Any) -> None:
        from kiln.capture import entry

        self.code = code
        self.options = options
        self.capture = capture
        self.cache = entry.frame_cache(code, options)
        self.names = code.co_varnames[: code.co_argcount]
        self.plain = not code.co_flags & _NOT_PLAIN and code.co_kwonlyargcount == 0
        self.routed: Any = None  # the code with its calls routed, once the frame is given up
        self.__name__ = self.__qualname__ = code.co_name  # for tracebacks and logs of the glue

    def __call__(self, fn: types.FunctionType, *args: Any, **kwargs: Any) -> Any:
        if type(fn) is not types.FunctionType or fn.__code__ is not self.code:
            return self.other(fn, args, kwargs)
        if self.plain and not kwargs and len(args) == len(self.names):
            L = dict(zip(self.names, args))
        else:
            L = make_binder(fn, None, False)(args, kwargs)  # defaults are the function object's own
        G = fn.__globals__
        for entry in self.cache.entries:
            if entry.check_fn(L, G, fn):
                self.stats().cache_hits += 1
                try:
                    return entry.glue(L, G, fn)
                except ExternMismatchError as exc:
                    return self.frame(fn).after_mismatch(exc, args, kwargs)
        if self.cache.eager_reason is not None:
            return self.skipped(fn)(*args, **kwargs)
        return self.frame(fn).miss(args, kwargs, L)

    @staticmethod
    def stats() -> Any:
        from kiln.capture.entry import STATS

        return STATS

    def frame(self, fn: types.FunctionType) -> Any:
        """The entry's slow path for this function object (a miss: capture, recompile, fallback)."""
        from kiln.capture.entry import _Frame

        return _Frame(fn, self.options, None, False, self.capture)

    def other(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        from kiln.capture.entry import compile_function

        if type(fn) is not types.FunctionType:  # (never from a glue: it passes what it reconstructed)
            return fn(*args, **kwargs)
        return compile_function(fn, self.options, self.capture)(*args, **kwargs)

    def skipped(self, fn: types.FunctionType) -> Any:
        """`fn` as a frame given up runs (kiln.capture.skip_frame): its own code with its call sites
        routed to compiled callees; the routed code made once for the code object."""
        from kiln.capture.entry import STATS, router_for

        STATS.fallbacks += 1
        if self.code.co_flags & _GENERATOR_FLAGS:
            return fn
        if self.routed is None:
            from kiln.capture.code import route_calls

            self.routed = route_calls(self.code, router_for(self.options, self.capture).route) or False
        if not self.routed:
            return fn
        made = types.FunctionType(self.routed, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        made.__kwdefaults__ = fn.__kwdefaults__
        made.__qualname__ = fn.__qualname__
        return made


__all__ = ["CodeCallee"]
