"""How an identity guard (`check_id`, and `check_type`: the identity of a class) holds its object:
weakly where it can.

A cache entry lives until kiln.reset(); holding each object its guards compare by identity would
keep the user's functions, modules and objects alive as long (a helper function rebound for each
run, a model the user dropped). Torch.compile's guards hold such objects weakly and drop the cache
entry once one of them is freed (torch/_dynamo/guards.py, `id_ref` and `invalidate`); so do these:
`Expected` stores such a guard's object as a `WeakHeld` where `held_weakly` says so, the check
compares with the weak reference's object (never with an id, which a new object may reuse), and
`watch` calls a check function's `invalidate` when one of its objects is freed.
"""
from __future__ import annotations

import sys
import types
import weakref
from typing import Any, Callable, Iterable

from kiln.capture.trace_rules import in_stable_module

_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made at run time (a static type lives as long as the process)


def held_weakly(obj: Any) -> bool:
    """Whether an identity guard holds `obj` weakly. Strongly: what cannot be weakly referenced
    (ints, strings, tuples, None, `object()`, instances of classes with __slots__ and no
    __weakref__: holding them keeps their id theirs, and the literals among them are shared or
    immortal anyway) and what lives as long as the process or its module does, where a call of a
    weak reference per check would cost for nothing (a static type, a C function of a module or
    a type, a module imported in sys.modules, a class or function of torch or the standard
    library, whose modules are never reloaded: trace_rules.STABLE_MODULES)."""
    if isinstance(obj, types.ModuleType):
        return sys.modules.get(obj.__name__) is not obj
    if isinstance(obj, (type, types.FunctionType)) and in_stable_module(getattr(obj, "__module__", None)):
        return False
    if isinstance(obj, type):
        # A class its module names lives as long as the module: type guards sit on every module of
        # a model, and the call of a weak reference on each would cost where nothing is freed. A
        # class made by a call (`<locals>`, type(...)) is held weakly.
        return bool(obj.__flags__ & _HEAP_TYPE) and not _named_by_module(obj)
    if isinstance(obj, types.BuiltinFunctionType) and (obj.__self__ is None or
                                                        isinstance(obj.__self__, (types.ModuleType, type))):
        return False
    try:
        weakref.ref(obj)
    except TypeError:
        return False
    return True


def _named_by_module(cls: type) -> bool:
    """Whether `cls` is what its module's dicts hold at its qualified name (no code runs: the dicts
    are read, not the attributes)."""
    found: Any = sys.modules.get(getattr(cls, "__module__", None) or "")
    for part in cls.__qualname__.split("."):
        namespace = getattr(found, "__dict__", None)
        if not isinstance(namespace, (dict, types.MappingProxyType)):
            return False
        found = namespace.get(part)
    return found is cls


WEAK_KINDS = frozenset({"check_id", "check_type"})  # the kinds whose object Expected may hold weakly


class _Gone:
    """What `Guard.expected` gives for an object that was freed: equal to nothing but itself."""

    def __repr__(self) -> str:
        return "<freed object>"


GONE: Any = _Gone()


class WeakHeld:
    """An object held weakly, with its id while it lived (a guard's identity for dropping duplicates)."""

    __slots__ = ("ref", "id")

    def __init__(self, obj: Any) -> None:
        self.ref = weakref.ref(obj)
        self.id = id(obj)

    def get(self) -> Any:
        obj = self.ref()
        return GONE if obj is None else obj


class Expected:
    """The descriptor behind `Guard.expected` (a dataclass field with a descriptor as its default:
    the frozen dataclass's __init__ stores through `__set__`, and so does every
    `object.__setattr__(guard, "expected", v)`): a check_id guard's object is kept as a WeakHeld where
    `held_weakly` allows, under the same name in the instance dict (a data descriptor is found
    first), and reading the field gives the object, or GONE once it was freed. Every other guard
    keeps its value as it is; so does a guard unpickled (its dict set directly) until it is set
    again."""

    def __get__(self, guard: Any, owner: Any = None) -> Any:
        if guard is None:
            return None  # the field's default
        held = guard.__dict__["expected"]
        return held.get() if type(held) is WeakHeld else held

    def __set__(self, guard: Any, value: Any) -> None:
        weak = guard.kind in WEAK_KINDS and type(value) is not WeakHeld and held_weakly(value)
        guard.__dict__["expected"] = WeakHeld(value) if weak else value


def held(guard: Any) -> Any:
    """The guard's stored value: a WeakHeld for an object held weakly, else the value itself."""
    return guard.__dict__["expected"]


def watch(objects: Iterable[Any], invalidate: Callable[[], None]) -> list[weakref.ref]:
    """Weak references to `objects` that call `invalidate()` once any of them is freed. The caller
    keeps the list (freed with it, they call nothing). `invalidate` must not hold what it is kept
    by strongly (a bound method of the check function would keep that alive until the object dies)."""
    def freed(_: weakref.ref) -> None:
        invalidate()
    return [weakref.ref(obj, freed) for obj in objects]
