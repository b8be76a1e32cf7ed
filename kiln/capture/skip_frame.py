"""A frame that runs eagerly while the frames it calls are still compiled: torch.compile's skip.

When capture gives a frame up (an Unsupported that is no break point, an error on the path
is_compiling() chose, an internal error, a frame in which no tensor op was traced), torch.compile
skips that one frame: its bytecode runs in CPython, and the frames it calls still reach the
eval-frame hook and are compiled on their own (FrameAction.SKIP for the frame, DEFAULT for its
callees). Kiln has no eval-frame hook, so the entry runs a copy of the frame's code whose call sites
first hand their callable to a `Router` (kiln.capture.code.route_calls); the router answers with the
compiled callable where torch.compile would compile the callee's frame, and with the callable itself
everywhere else. Input: a function given up by the entry; output: the function to run in its place.
Corresponds to torch/_dynamo/eval_frame.py's skip of one code object (types.FrameExecStrategy).
"""
from __future__ import annotations

import functools
import inspect
import os
import types
import weakref
from typing import Any, Callable

import torch

from kiln.capture.code import route_calls
from kiln.capture.trace_rules import (has_builtin_rule, is_library_code, is_torch_function, marked_rule,
                                      runs_natively)

_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# callables that never run a Python frame of their own: answered without a look-up
_NATIVE_TYPES = frozenset({types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodDescriptorType,
                           types.WrapperDescriptorType, types.MethodWrapperType, types.ClassMethodDescriptorType,
                           type, torch._ops.OpOverloadPacket, torch._ops.OpOverload})


def routed_function(fn: types.FunctionType, route: Callable[[Any], Any]) -> types.FunctionType | None:
    """`fn` whose code hands each call's callable to `route` (same globals, closure, defaults and
    names, so tracebacks, zero-argument super() and the frame's own reads are eager's); None where
    the bytecode is not understood (the caller then runs `fn` itself, its callees uncompiled)."""
    code = route_calls(fn.__code__, route)
    if code is None:
        return None
    made = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    made.__kwdefaults__ = fn.__kwdefaults__
    made.__qualname__ = fn.__qualname__
    return made


class _Routed:
    """The routed copy of one function, made again when the function's defaults are replaced."""

    def __init__(self, fn: types.FunctionType, route: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.route = route
        self.made = routed_function(fn, route)

    def get(self) -> Callable[..., Any]:
        made, fn = self.made, self.fn
        if made is None:
            return fn
        if made.__defaults__ is not fn.__defaults__ or made.__kwdefaults__ is not fn.__kwdefaults__:
            made = self.made = routed_function(fn, self.route)
        return made or fn


class Router:
    """What a call site of a skipped frame calls in place of its callable.

    A user's Python function (not torch's or the standard library's, nor Kiln's own, nor one a
    mark or a trace rule keeps native) becomes its compiled callable, made once by `compile_fn` and
    kept while the function lives; a bound method, its function's compiled callable bound again; an
    nn.Module whose class keeps Module.__call__, its forward compiled (hooks and all run as eager
    runs them); a functools.partial, its function routed; any other object with a Python
    __call__, that __call__ compiled. A generator function (no frame of its own to capture) runs
    routed itself, and so does a function whose compiled callable already runs eagerly for good
    (`eager_of`): no entry frames are added at each level of a recursion. Everything else is given
    back as it is."""

    def __init__(self, compile_fn: Callable[[types.FunctionType], Any],
                 eager_of: Callable[[Any], Callable[..., Any] | None]) -> None:
        self.compile_fn = compile_fn
        self.eager_of = eager_of
        # id(fn) -> (a weak reference to fn, what it is called as, its compiled callable's FrameCache
        # or None): a dict look-up in C per call, the entry dropped with the function
        self.known: dict[int, tuple[weakref.ref, Any, Any]] = {}
        self.route = self._route  # one bound method: the constant routed code holds (and is cached by)

    def _route(self, c: Any) -> Any:
        kind = type(c)
        if kind is types.FunctionType:
            return self.function(c)
        if kind is types.MethodType:
            fn = c.__func__
            if type(fn) is types.FunctionType:
                made = self.function(fn)
                return c if made is fn else types.MethodType(made, c.__self__)
            return c
        if kind is functools.partial:  # its function's frame is what torch.compile meets
            made = self._route(c.func)
            return c if made is c.func else functools.partial(made, *c.args, **c.keywords)
        if kind in _NATIVE_TYPES:
            return c
        try:
            return self.other(c)
        except Exception:  # an object whose attributes raise: called as it is, so eager's error is its own
            return c

    def function(self, fn: types.FunctionType) -> Any:
        found = self.known.get(id(fn))
        if found is None or found[0]() is not fn:
            found = self.learn(fn)
        made, cache = found[1], found[2]
        if cache is None or cache.eager_reason is None:
            return made.get() if isinstance(made, _Routed) else made
        eager = self.eager_of(made)
        return made if eager is None else eager

    def learn(self, fn: types.FunctionType) -> tuple[weakref.ref, Any, Any]:
        key, known = id(fn), self.known
        made = self.decide(fn)
        frame = getattr(made, "_kiln_frame", None) if made is not fn else None
        found = (weakref.ref(fn, lambda _, key=key: known.pop(key, None)), made,  # type: ignore[misc]
                 None if frame is None else frame.cache)
        known[key] = found
        return found

    def decide(self, fn: types.FunctionType) -> Any:
        """fn itself (run as it is), a _Routed (a generator function), or fn's compiled callable."""
        code = fn.__code__
        if not compiles(fn):
            return fn
        if code.co_flags & _GENERATOR_FLAGS:
            return _Routed(fn, self.route)
        return self.compile_fn(fn)

    def other(self, c: Any) -> Any:
        kind = type(c)
        if isinstance(c, torch.nn.Module) and kind.__call__ is torch.nn.Module.__call__:
            forward = kind.forward
            if type(forward) is not types.FunctionType or "forward" in c.__dict__:
                return c
            made = self.function(forward)
            if made is forward:
                return c
            from kiln.capture.variables.module import _has_hooks  # the kinds load with the first capture

            if not _has_hooks(c):  # Module.__call__ would call forward and nothing else
                return types.MethodType(made, c)
            from kiln.capture.distributed import HookedModuleCall

            return functools.partial(HookedModuleCall(made), c)
        call = getattr(kind, "__call__", None)
        if type(call) is types.FunctionType and not isinstance(c, type):
            made = self.function(call)
            return c if made is call else types.MethodType(made, c)
        return c


def compiles(fn: types.FunctionType) -> bool:
    """Whether torch.compile compiles `fn`'s frame when a skipped frame calls it: user code
    (a library's too), not torch's or the standard library's (skipped files), nor Kiln's own, nor a
    function a mark or a trace rule runs natively, nor one that reads its callers' frames."""
    from kiln.capture.entry import reads_caller_frames  # entry imports this module on a fallback

    filename = fn.__code__.co_filename
    if is_library_code(filename) or filename.startswith(_KILN_DIR) or filename.startswith("<kiln"):
        return False
    if marked_rule(fn) is not None or runs_natively(fn) or reads_caller_frames(fn):
        return False
    try:
        return not (is_torch_function(fn) or has_builtin_rule(fn))
    except Exception:
        return False


__all__ = ["Router", "compiles", "routed_function"]
