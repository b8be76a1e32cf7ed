"""Guard portability: which guards of an entry another process can check, and in what form.

`_portable_guards` raises NotPortable for a guard no other process could compare (an identity
guard on an object that has no name, a class attribute holding a data object, ...), except that an
identity guard on an unnamed object is stored as an aliasing guard over every guarded path to it,
which is what the trace relied on. `_portable_guard` checks one guard, on store and again on load.
See docs/frame-cache.md for what is admitted and why.
"""
from __future__ import annotations

import enum
import types
from typing import Any

import torch

from kiln.capture.guards import (ABSENT, ClassAttribute, ConstantCall, FunctionCode, Guard, PARAMETRIZE_MODULE,
                                 ParametrizedClass, TensorSpec, parametrized_class_holds)
from kiln.capture.options import CONSTANT_RESULT_MARKER
from kiln.capture.persist.digest import NotPortable, _plain
from kiln.capture.persist.names import _LruCache, _MEMBER_KINDS, _encode_singleton, _function_code, _numpy_bool, _unwrap


_LITERAL_TYPES = (int, float, str, bytes, bool, type(None), type(Ellipsis), torch.dtype, torch.layout,
                  torch.device, torch.memory_format)


_IDENTITY_KINDS = (types.ModuleType, types.FunctionType, type, types.BuiltinFunctionType, enum.Enum, _LruCache,
                   *_MEMBER_KINDS)


def _portable_key(key: Any) -> bool:
    if type(key) in _LITERAL_TYPES or isinstance(key, (enum.Enum, type)):
        return True
    if type(key) is tuple:
        return all(_portable_key(k) for k in key)
    return _encode_singleton(key) is not None


def _portable_guard(guard: Guard) -> None:
    """Raise NotPortable unless another process can check this guard (the pickler checks names).
    Also run on every guard read back, so that a record's kind and expected value agree."""
    kind, expected = guard.kind, guard.expected
    if not isinstance(guard.source, str) or (guard.description is not None and not isinstance(guard.description, str)):
        raise NotPortable("a guard without a source text")
    if kind == "check_id":
        if not isinstance(expected, _IDENTITY_KINDS):
            raise NotPortable(f"identity of {type(expected).__name__} at {guard.source}")
    elif kind == "check_value":
        literal_set = type(expected) in (set, frozenset) and all(type(v) in _LITERAL_TYPES for v in expected)
        if type(expected) not in _LITERAL_TYPES and not isinstance(expected, enum.Enum) \
                and not _numpy_bool(expected) and not literal_set:
            raise NotPortable(f"value of type {type(expected).__name__} at {guard.source}")
    elif kind == "check_keys":
        if not isinstance(expected, tuple) or not all(_portable_key(k) for k in expected):
            raise NotPortable(f"keys at {guard.source}")
    elif kind == "check_set_order":
        if not isinstance(expected, tuple) or not all(type(v) in _LITERAL_TYPES for v in expected):
            raise NotPortable(f"set order at {guard.source}")
    elif kind == "check_absent":
        if not isinstance(expected, frozenset) or not all(type(k) is str for k in expected):
            raise NotPortable(f"absent names at {guard.source}")
    elif kind == "check_tensor":
        if not isinstance(expected, TensorSpec):
            raise NotPortable(f"tensor spec at {guard.source}")
    elif kind == "check_class_attr":
        _portable_class_attr(expected)
    elif kind == "check_code":
        if not (isinstance(expected, FunctionCode) and isinstance(expected.code, types.CodeType)
                and isinstance(expected.module, str) and _plain(expected.defaults) and _plain(expected.kwdefaults)
                and (expected.defaults is None or type(expected.defaults) is tuple)
                and (expected.kwdefaults is None or type(expected.kwdefaults) is tuple)):
            raise NotPortable(f"a malformed function-code guard at {guard.source}")
    elif kind == "check_constant_result":
        _portable_constant_call(expected)
    elif kind == "check_parametrized_type":
        if not (isinstance(expected, ParametrizedClass) and isinstance(expected.base, type)
                and type(expected.names) is tuple and all(type(n) is str for n in expected.names)):
            raise NotPortable(f"a malformed parametrized-class guard at {guard.source}")
    elif kind == "check_aliasing":
        if not (isinstance(expected, tuple) and all(isinstance(g, tuple) and all(isinstance(s, str) for s in g)
                                                    for g in expected)):
            raise NotPortable("aliasing groups that are not source texts")
    elif kind not in ("check_type", "check_none", "check_not_none", "check_len", "check_min_len",
                      "check_grad_mode", "check_global_state", "check_shape"):
        raise NotPortable(f"guard kind {kind}")


def _portable_constant_call(expected: Any) -> None:
    """A call of a constant-result function: the function by name (a plain function, or an
    lru_cache wrapper around one), still marked as constant where it was found, with literal
    arguments and result. Another process calls it once before the entry is used."""
    if not isinstance(expected, ConstantCall) or type(expected.args) is not tuple \
            or type(expected.kwargs) is not tuple or not _plain((expected.args, expected.kwargs, expected.result)):
        raise NotPortable("a constant-result call with arguments or a result that are not literals")
    fn = expected.fn
    target = _unwrap(fn) if isinstance(fn, _LruCache) else fn
    if not isinstance(target, types.FunctionType) or getattr(target, CONSTANT_RESULT_MARKER, False) is not True:
        raise NotPortable(f"a constant-result call of {type(fn).__name__} that is not a marked function")


def _portable_class_attr(expected: Any) -> None:
    """A class attribute found at trace time: its classes go by name (their digests cover their
    methods), its value must be one the digest or the check itself pins down: a literal (compared
    by value), a function or descriptor of a class's dict (covered by the owning class's digest
    and found by name), ABSENT, or a dict of such values under str keys (compared item by item).
    Another data object (a dict holding lists, an instance) is not: another process could hold
    different contents under the same digest."""
    if not isinstance(expected, ClassAttribute) or not isinstance(expected.classes, tuple) \
            or not all(isinstance(c, type) for c in expected.classes) or not isinstance(expected.name, str):
        raise NotPortable("a malformed class attribute record")
    value = expected.value
    if value is ABSENT or type(value) in _LITERAL_TYPES or isinstance(value, (types.FunctionType, *_MEMBER_KINDS)):
        return
    if type(value) is dict and all(type(k) is str for k in value) and all(
            type(v) in _LITERAL_TYPES or isinstance(v, _IDENTITY_KINDS) for v in value.values()):
        return  # a registry of named functions, checked item by item (guards.check_class_attr)
    raise NotPortable(f"class attribute {expected.name} holds a {type(value).__name__}")


def _portable_guards(guards: list[Guard], frame: tuple[dict, dict, Any] | None) -> list[Guard]:
    """The guards as another process can check them. An object reached through two paths is
    guarded by identity (`second is <that object>`); when the object has no name another process
    could look up (a model's config), what the trace assumed is that the paths lead to one object:
    that is written as an aliasing guard over every guarded path whose value is that object
    (found by evaluating the guards' sources on the frame), so that whichever path the trace read
    the object through first is tied to the others."""
    out: list[Guard] = []
    aliased: set[int] = set()
    values: list[tuple[str, Any]] | None = None
    for guard in guards:
        if guard.kind == "check_id" and isinstance(guard.expected, types.FunctionType) \
                and "<locals>" in guard.expected.__qualname__:
            guard = Guard(guard.source, "check_code", _function_code(guard.expected), guard.description)
        if guard.kind == "check_type" and _parametrized_class(guard.expected) is not None:
            guard = Guard(guard.source, "check_parametrized_type", _parametrized_class(guard.expected),
                          guard.description)
        if guard.kind == "check_id" and not isinstance(guard.expected, _IDENTITY_KINDS):
            if id(guard.expected) in aliased:
                continue
            if values is None:
                values = _source_values(guards, frame)
            paths = list(dict.fromkeys(src for src, value in values if value is guard.expected))
            if len(paths) < 2:
                raise NotPortable(f"identity of {type(guard.expected).__name__} at {guard.source}")
            aliased.add(id(guard.expected))
            guard = Guard("", "check_aliasing", (tuple(paths),))
        _portable_guard(guard)
        out.append(guard)
    return out


def _parametrized_class(cls: Any) -> ParametrizedClass | None:
    """The structure of a class torch.nn.utils.parametrize made for one module (it makes one per
    module, so no name finds it in another process), or None for any other class."""
    if not isinstance(cls, type) or cls.__module__ != PARAMETRIZE_MODULE or len(cls.__bases__) != 1:
        return None
    record = ParametrizedClass(cls.__bases__[0], tuple(sorted(cls.__dict__)))
    return record if parametrized_class_holds(cls, record) else None


def _source_values(guards: list[Guard], frame: tuple[dict, dict, Any] | None) -> list[tuple[str, Any]]:
    """(source, value on this frame) of each guarded source, in guard order (an identity guard's
    value is the object it expects: its guard passed on this frame)."""
    if frame is None:
        return []
    L, G, F = frame
    namespace = {"L": L, "G": G, "F": F}
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for guard in guards:
        if not guard.source or guard.kind == "check_shape" or guard.source in seen:
            continue
        seen.add(guard.source)
        if guard.kind == "check_id":
            out.append((guard.source, guard.expected))
            continue
        try:
            out.append((guard.source, eval(guard.source, namespace)))  # sources capture wrote in this process
        except Exception:
            continue
    return out
