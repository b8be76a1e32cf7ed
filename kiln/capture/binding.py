"""Binding a compiled function's call arguments into its locals `L`, as Python binds them.

The entry (kiln.capture.entry) binds every call of a compiled function before it checks guards:
`make_binder` gives a function (args, kwargs) -> L keyed and ordered as Signature.bind +
apply_defaults would, without inspect where it can, and `positional_locals` the one-dict-display
binder of an all-positional call. Anything odd goes through inspect.Signature, for Python's own
TypeError. Dynamo has no counterpart: it reads the locals of a frame CPython has already bound.
"""
from __future__ import annotations

import inspect
from types import FunctionType
from typing import Any, Callable

def code_signature(fn: FunctionType) -> inspect.Signature:
    """The parameters the code object really has. inspect.signature(fn) follows `__wrapped__`
    (functools.wraps) and `__signature__`, so a decorated `forward(self, *args, **kwargs)` would be
    bound with the wrapped function's names and its `kwargs` local left unset."""
    bare = FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    bare.__kwdefaults__ = fn.__kwdefaults__
    return inspect.signature(bare)


def _signature_tracker(fn: FunctionType) -> Callable[[], inspect.Signature]:
    """code_signature(fn), made again whenever `__defaults__` or `__kwdefaults__` was replaced or
    changed in place since the last call (autoreload, or a user, may set them after compile): the
    bound defaults become L's values, which the guards check."""
    made: list = [None, None, None]  # defaults, kwdefaults items, signature

    def signature_now() -> inspect.Signature:
        defaults, kwdefaults = fn.__defaults__, fn.__kwdefaults__
        items = tuple(kwdefaults.items()) if kwdefaults else ()
        same = made[2] is not None and made[0] is defaults and len(items) == len(made[1]) and \
            all(a[0] == b[0] and a[1] is b[1] for a, b in zip(items, made[1]))
        if not same:
            made[:] = [defaults, items, code_signature(fn)]
        return made[2]
    return signature_now


def make_binder(fn: FunctionType, bound_self: Any, has_self: bool) -> Callable[[tuple, dict], dict]:
    """A function (args, kwargs) -> L, keyed and ordered as Signature.bind + apply_defaults would
    (parameters, then *args, keyword-only ones, **kwargs). All-positional calls of a plain signature
    take a zip; keywords, defaults, *args and **kwargs are bound here without inspect (a transformers
    forward takes `**kwargs`: Signature.bind cost tens of microseconds per call); anything odd (an
    unknown or repeated name, a missing argument, positional-only parameters) goes through
    inspect.Signature for Python's own TypeError."""
    code = fn.__code__
    names, kwonly, star, starstar = _parameters(code)
    slow = _inspect_binder(fn, bound_self, has_self)
    if code.co_posonlyargcount:
        return slow
    keywords = _keyword_binder(fn, bound_self, has_self, (names, kwonly, star, starstar), slow)
    if star is not None or starstar is not None or kwonly:
        return keywords
    nargs = len(names) - (1 if has_self else 0)

    if has_self:
        def bind_method(args: tuple, kwargs: dict) -> dict:
            if kwargs or len(args) != nargs:
                return keywords(args, kwargs)
            return dict(zip(names, (bound_self, *args)))
        return bind_method

    def bind(args: tuple, kwargs: dict) -> dict:
        if kwargs or len(args) != nargs:
            return keywords(args, kwargs)
        return dict(zip(names, args))
    return bind


_Parameters = tuple[tuple[str, ...], tuple[str, ...], str | None, str | None]


def _parameters(code: Any) -> _Parameters:
    """(positional-or-keyword names, keyword-only names, the *args name, the **kwargs name) of a code."""
    names = code.co_varnames[: code.co_argcount]
    kwonly = code.co_varnames[code.co_argcount: code.co_argcount + code.co_kwonlyargcount]
    rest = code.co_argcount + code.co_kwonlyargcount
    star = code.co_varnames[rest] if code.co_flags & inspect.CO_VARARGS else None
    starstar = code.co_varnames[rest + (star is not None)] if code.co_flags & inspect.CO_VARKEYWORDS else None
    return names, kwonly, star, starstar


def _inspect_binder(fn: FunctionType, bound_self: Any, has_self: bool) -> Callable[[tuple, dict], dict]:
    """The binder through inspect.Signature, for the calls make_binder's own binders refuse."""
    signature_now = _signature_tracker(fn)

    def slow(args: tuple, kwargs: dict) -> dict:
        if has_self:
            args = (bound_self, *args)
        try:
            bound = signature_now().bind(*args, **kwargs)
        except TypeError:
            # Re-raise Python's own message ("f() missing 1 required positional argument: 'x'"):
            # a call that cannot bind fails before the body runs, so this has no side effect.
            fn(*args, **kwargs)
            raise
        bound.apply_defaults()
        return dict(bound.arguments)
    return slow


def _keyword_binder(fn: FunctionType, bound_self: Any, has_self: bool, parameters: _Parameters,
                    slow: Callable[[tuple, dict], dict]) -> Callable[[tuple, dict], dict]:
    """The binder of keywords, defaults, *args and **kwargs without inspect (`slow` for anything odd)."""
    names, kwonly, star, starstar = parameters
    keyword_names = frozenset(names + kwonly)  # what a keyword argument can name

    def keywords(given: tuple, kwargs: dict) -> dict:
        args = (bound_self, *given) if has_self else given
        if len(args) > len(names) and star is None:
            return slow(given, kwargs)
        if starstar is None and not keyword_names.issuperset(kwargs):
            return slow(given, kwargs)
        defaults = fn.__defaults__ or ()
        first_default = len(names) - len(defaults)
        out = {}
        for i, name in enumerate(names):
            if i < len(args):
                if name in kwargs:  # given twice
                    return slow(given, kwargs)
                out[name] = args[i]
            elif name in kwargs:
                out[name] = kwargs[name]
            elif i >= first_default:
                out[name] = defaults[i - first_default]
            else:
                return slow(given, kwargs)
        if star is not None:
            out[star] = args[len(names):]
        if kwonly:
            kwdefaults = fn.__kwdefaults__ or {}
            for name in kwonly:
                if name in kwargs:
                    out[name] = kwargs[name]
                elif name in kwdefaults:
                    out[name] = kwdefaults[name]
                else:
                    return slow(given, kwargs)
        if starstar is not None:
            out[starstar] = {k: v for k, v in kwargs.items() if k not in keyword_names}
        return out
    return keywords


def positional_locals(names: tuple[str, ...]) -> Callable[[tuple], dict]:
    """`args -> dict(zip(names, args))` for a tuple of exactly len(names) arguments, written out as
    one dict display: a third of the cost of building the dict from a zip, per call of a compiled
    function."""
    if not all(name.isidentifier() for name in names):  # a code made by hand: its names as they are
        return lambda args: dict(zip(names, args))
    items = ", ".join(f"{name!r}: args[{k}]" for k, name in enumerate(names))
    return eval(f"lambda args: {{{items}}}")  # noqa: S307  # built from identifiers only
