"""Objects by name instead of identity: how a stored entry refers to functions, classes, modules,
descriptors, enum members and singletons.

`_encode_named` writes such an object as plain data (module, qualname and, where the object is not
Kiln's, torch's or the standard library's, a digest from kiln.capture.persist.digest);
`_decode_named` finds it again in the reading process and raises Stale when the digest differs.
Functions local to another one go by their code, found again inside the function that defines it.
These are the `named` reference of the entry files (kiln.runtime.records). See docs/frame-cache.md.
"""
from __future__ import annotations

import contextvars
import enum
import functools
import os
import sys
import types
from typing import Any

import torch

from kiln.capture.guards import ABSENT, FunctionCode
from kiln.capture.persist.digest import (NotPortable, Stale, _MAX_DEPTH, _data_cells, _member_digest, _plain,
                                         _trusted_module, class_digest, code_digest, function_digest)
from kiln.runtime import records


# ---------------------------------------------------------------------------------------------------
# References: functions, classes and modules by name instead of identity


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = sys.modules.get(module)
    if obj is None:
        raise Stale(f"module {module} is not imported")
    for part in qualname.split("."):
        if not part.isidentifier():
            raise records.RecordError(f"bad name {qualname!r}")
        obj = getattr(obj, part, None)
        if obj is None:
            raise Stale(f"{module}.{qualname} is gone")
    return obj


def _found_by_name(module: str, obj: Any) -> bool:
    """Whether `module`'s attribute of obj's __name__ is obj (a builtin whose qualname names a class)."""
    try:
        return _resolve(module, obj.__name__) is obj
    except (Stale, records.RecordError):
        return False


_MAX_WRAPPED = 4  # decorators stacked on one function (functools.wraps keeps the inner qualname)


def _wrapped_depth(obj: Any) -> int:
    """How many `__wrapped__` steps lead from the object named by obj's module and qualname to obj
    (0: the name finds it). A decorated method's inner function carries its wrapper's name; capture
    inlines it through the wrapper's closure. NotPortable when no such path exists."""
    if "<locals>" in obj.__qualname__:
        raise NotPortable(f"{obj.__qualname__} is local to a function")
    try:
        found = _resolve(obj.__module__, obj.__qualname__)
    except (Stale, records.RecordError):
        found = None
    for depth in range(_MAX_WRAPPED + 1):
        if found is obj:
            return depth
        found = _unwrap(found)
    raise NotPortable(f"{obj.__module__}.{obj.__qualname__} is not reachable by its name")


def _unwrap(obj: Any) -> Any:
    """The function a decorator wrapped, read from the wrapper's own dict (no descriptor runs)."""
    namespace = getattr(obj, "__dict__", None) if isinstance(obj, (types.FunctionType, _LruCache)) else None
    return namespace.get("__wrapped__") if isinstance(namespace, dict) else None


# functools.lru_cache's wrapper: capture steps past its cache (it traces, or for a constant-result
# function calls, the function under it), so it goes by name with the digest of that function
_LruCache = functools._lru_cache_wrapper
_NAMED_KINDS = (types.FunctionType, types.BuiltinFunctionType, type, _LruCache)
_MEMBER_KINDS = (property, staticmethod, classmethod)


def _member_owner(obj: Any) -> tuple[type, str]:
    """(class, name) of a property, staticmethod or classmethod object found in a class's dict,
    located through its function's qualname."""
    fn = obj.fget if isinstance(obj, property) else obj.__func__
    qualname = getattr(fn, "__qualname__", "")
    owner_name, _, name = qualname.rpartition(".")
    if not owner_name or "<locals>" in qualname:
        raise NotPortable(f"a {type(obj).__name__} without an owning class")
    try:
        owner = _resolve(fn.__module__, owner_name)
    except (Stale, records.RecordError):
        owner = None
    if not isinstance(owner, type) or owner.__dict__.get(name) is not obj:
        raise NotPortable(f"{type(obj).__name__} {qualname} is not in its class's dict")
    return owner, name


def _encode_named(obj: Any) -> Any:
    """(kind, module, qualname, digest) of a function or class; a module by name; a property,
    staticmethod or classmethod as its class's member; an enum member by class and name; None for
    anything else. Kiln's, torch's and the standard library's carry no digest: the key fixes them."""
    if isinstance(obj, types.ModuleType):
        if sys.modules.get(obj.__name__) is not obj or not _trusted_module(obj.__name__):
            raise NotPortable(f"module {obj.__name__}")
        return ("module", obj.__name__, "", None)
    if obj is ABSENT:
        return ("absent", "", "", None)
    if _numpy_bool(obj):
        return ("numpy_bool", "numpy", "True_" if obj else "False_", None)
    for name in _TORCH_BREAK_CALLS:
        if obj is getattr(torch, name):
            return ("torch_factory", "torch", name, None)
    if isinstance(obj, types.CodeType):
        return _encode_local_code(obj)
    if obj is object.__setattr__:  # a glue's attribute write past a class's own __setattr__
        return ("object_setattr", "builtins", "object.__setattr__", None)
    if isinstance(obj, torch.Tensor):
        if records.REFERENCES["tensor"].encode(obj) is None:
            raise NotPortable("a tensor that is not a small constant")
        return None  # written as data by the records' own tensor reference
    if isinstance(obj, enum.Enum):
        cls = type(obj)
        _wrapped_depth(cls)
        digest = None if _trusted_module(cls.__module__) else class_digest(cls)
        return ("enum", cls.__module__, f"{cls.__qualname__}.{obj.name}", digest)
    if isinstance(obj, _MEMBER_KINDS):
        owner, name = _member_owner(obj)
        digest = None if _trusted_module(owner.__module__) else _member_digest(obj)
        return ("member", owner.__module__, f"{owner.__qualname__}.{name}", digest)
    if isinstance(obj, type) and _UNNAMED_TYPES.get(obj.__name__) is obj:
        return ("builtin_type", "builtins", obj.__name__, None)
    if not isinstance(obj, _NAMED_KINDS) or isinstance(obj, (torch.dtype, torch.device)):
        return _encode_singleton(obj)
    module = getattr(obj, "__module__", None) or ""
    if not module:
        raise NotPortable(f"{obj!r:.60} has no module")
    if isinstance(obj, types.BuiltinFunctionType) and _trusted_module(module) and _found_by_name(module, obj):
        # torch.sin: qualname `_VariableFunctionsClass.sin`, reached as `torch.sin` (its guard by
        # identity keeps a replaced torch function from running a stale graph)
        return ("trusted", module, obj.__name__, None)
    depth = _wrapped_depth(obj)
    qualname = obj.__qualname__ + "/__wrapped__" * depth
    if _trusted_module(module):
        return ("trusted", module, qualname, None)
    if isinstance(obj, types.FunctionType):
        if _data_cells(obj):  # admitted by `loads` only where the guards check those cells
            return ("closure_function", module, qualname, function_digest(obj, cells=True))
        return ("function", module, qualname, function_digest(obj))
    if isinstance(obj, type):
        return ("class", module, qualname, class_digest(obj))
    if isinstance(obj, _LruCache) and isinstance(_unwrap(obj), types.FunctionType):
        return ("lru_cache", module, qualname, function_digest(_unwrap(obj)))
    raise NotPortable(f"{module}.{obj.__qualname__}")


def _numpy_bool(value: Any) -> bool:
    """numpy.True_ or numpy.False_ (a numpy comparison's result the trace took as a constant)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and type(value) is getattr(numpy, "bool_", None)


def _encode_singleton(obj: Any) -> Any:
    """A module-level object of the standard library that pickles by name (typing.Union,
    typing.Literal: keys of a dict a trace read), or None."""
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str) or module.partition(".")[0] in ("kiln", "torch") \
            or not _trusted_module(module) or isinstance(obj, _PLAIN_SCALARS):
        return None  # Kiln's and torch's objects travel as records or through their own references
    try:
        name = obj.__reduce__()
    except Exception:
        return None
    if not isinstance(name, str) or not name.isidentifier() or getattr(sys.modules.get(module), name, None) is not obj:
        return None
    return ("singleton", module, name, None)


_PLAIN_SCALARS = (int, float, bool, str, bytes, complex, type(None), tuple, list, dict, set, frozenset)
# Builtin types no module names: a loop's iterator (guarded by type at a break inside the loop), a
# code object (the `__code__` of a function a decorator's closure holds, guarded by type), a closure
# cell (what a glue makes around a cell variable of the frame to hand its resume function)
_UNNAMED_TYPES: dict[str, type] = {t.__name__: t for t in (type(iter(())), type(iter([])), type(iter(range(0))),
                                                            types.CodeType, types.CellType)}


def _decode_named(data: Any) -> Any:
    kind, module, qualname, digest = data
    if kind == "singleton":
        if not _trusted_module(module) or module.partition(".")[0] in ("kiln", "torch") \
                or not str(qualname).isidentifier():
            raise records.RecordError(f"{module}.{qualname} is not a trusted singleton")
        found = getattr(sys.modules.get(module), qualname, None)
        if found is None or found.__reduce__() != qualname:
            raise Stale(f"{module}.{qualname} is gone")
        return found
    if kind == "module":
        found = sys.modules.get(module)
        if found is None or not _trusted_module(module):
            raise Stale(f"module {module} is not imported")
        return found
    if kind == "absent":
        return ABSENT
    if kind == "numpy_bool":
        found = getattr(sys.modules.get("numpy"), str(qualname), None) if qualname in ("True_", "False_") else None
        if not _numpy_bool(found):
            raise records.RecordError(f"numpy.{qualname} is not a numpy bool")
        return found
    if kind == "torch_factory":
        if qualname not in _TORCH_BREAK_CALLS:
            raise records.RecordError(f"torch.{qualname} is not a function a glue may call")
        return getattr(torch, str(qualname))
    if kind == "local_code":
        return _decode_local_code(module, qualname, digest)
    if kind == "object_setattr":
        return object.__setattr__
    if kind == "builtin_type":
        found = _UNNAMED_TYPES.get(str(qualname))
        if found is None:
            raise records.RecordError(f"{qualname!r} is not a builtin iterator type")
        return found
    if kind in ("enum", "member"):
        return _decode_member(kind, module, qualname, digest)
    name, *unwraps = str(qualname).split("/")
    if len(unwraps) > _MAX_WRAPPED or any(u != "__wrapped__" for u in unwraps):
        raise records.RecordError(f"bad name {qualname!r}")
    found = _resolve(module, name)
    for _ in unwraps:
        found = _unwrap(found)
        if found is None:
            raise Stale(f"{module}.{name} no longer wraps a function")
    if not isinstance(found, _NAMED_KINDS):
        raise records.RecordError(f"{module}.{qualname} is not a function or class")
    if kind == "trusted":
        if not _trusted_module(module):
            raise records.RecordError(f"{module} is not a trusted module")
        return found
    if kind == "closure_function":
        pending = _CLOSURE_FUNCTIONS.get()
        if pending is None or not isinstance(found, types.FunctionType):
            raise records.RecordError(f"{module}.{qualname}: a function with data cells outside a frame's guards")
        if function_digest(found, cells=True) != digest:
            raise Stale(f"{module}.{qualname} changed since the entry was stored")
        pending.append(found)
        return found
    actual = function_digest(found) if kind == "function" and isinstance(found, types.FunctionType) \
        else class_digest(found) if kind == "class" and isinstance(found, type) \
        else function_digest(_unwrap(found)) if kind == "lru_cache" and isinstance(found, _LruCache) \
        and isinstance(_unwrap(found), types.FunctionType) else None
    if actual is None or actual != digest:
        raise Stale(f"{module}.{qualname} changed since the entry was stored")
    return found


def _encode_local_code(code: types.CodeType) -> Any:
    """The code object of a function local to a named one: by the module, the name of the
    outermost function that defines it and its own qualname, with its digest."""
    outer = code.co_qualname.partition(".<locals>.")[0]
    if outer == code.co_qualname:
        raise NotPortable(f"code of {code.co_qualname} is not local to a function")
    module = _module_of_file(code.co_filename)
    if module is None:
        raise NotPortable(f"no module imported from {code.co_filename}")
    if _decode_local_code(module, code.co_qualname, code_digest(code)) is not code:
        raise NotPortable(f"code of {code.co_qualname} is not found again through {module}.{outer}")
    return ("local_code", module, code.co_qualname, code_digest(code))


@functools.lru_cache(maxsize=None)
def _module_of_file(filename: str) -> str | None:
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and os.path.realpath(path) == os.path.realpath(filename):
            return name
    return None


def _decode_local_code(module: str, qualname: Any, digest: Any) -> types.CodeType:
    outer_name = str(qualname).partition(".<locals>.")[0]
    outer = _unwrapped_function(_resolve(module, outer_name))
    found = _nested_code(outer.__code__, str(qualname), 0) if outer is not None else None
    if found is None:
        raise Stale(f"{module}.{qualname} is gone")
    if code_digest(found) != digest:
        raise Stale(f"{module}.{qualname} changed since the entry was stored")
    return found


def _unwrapped_function(obj: Any) -> types.FunctionType | None:
    for _ in range(_MAX_WRAPPED + 1):
        if isinstance(obj, types.FunctionType) and "<locals>" not in obj.__code__.co_qualname:
            return obj
        obj = _unwrap(obj)
    return None


def _nested_code(code: types.CodeType, qualname: str, depth: int) -> types.CodeType | None:
    if code.co_qualname == qualname:
        return code
    if depth > _MAX_DEPTH:
        return None
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found = _nested_code(const, qualname, depth + 1)
            if found is not None:
                return found
    return None


def _function_code(fn: types.FunctionType) -> FunctionCode:
    """A local function's identity guard as another process can check it (guards.check_code)."""
    kwdefaults = None if fn.__kwdefaults__ is None else tuple(fn.__kwdefaults__.items())
    if not _plain(fn.__defaults__) or not _plain(kwdefaults):
        raise NotPortable(f"defaults of {fn.__qualname__} that are not literals")
    return FunctionCode(fn.__code__, fn.__module__, fn.__defaults__, kwdefaults)


def _decode_member(kind: str, module: str, qualname: str, digest: Any) -> Any:
    """An enum member or a class-dict member (property, staticmethod, classmethod), read from its
    class without running any descriptor, and compared with the stored digest."""
    owner_name, _, name = str(qualname).rpartition(".")
    owner = _resolve(module, owner_name)
    if not isinstance(owner, type) or not name.isidentifier():
        raise records.RecordError(f"{module}.{qualname} is not a class member")
    trusted = _trusted_module(module)
    if (digest is None) != trusted:
        raise records.RecordError(f"{module}.{qualname}: digest does not match the module's trust")
    if kind == "enum":
        if not issubclass(owner, enum.Enum):
            raise records.RecordError(f"{module}.{owner_name} is not an enum")
        found = owner.__members__.get(name)
        if found is None:
            raise Stale(f"{module}.{qualname} is gone")
        if not trusted and class_digest(owner) != digest:
            raise Stale(f"{module}.{owner_name} changed since the entry was stored")
        return found
    found = owner.__dict__.get(name)
    if not isinstance(found, _MEMBER_KINDS):
        raise Stale(f"{module}.{qualname} is no longer a {kind}")
    if not trusted and _member_digest(found) != digest:
        raise Stale(f"{module}.{qualname} changed since the entry was stored")
    return found


# torch functions a glue may call natively at a graph break, by their name in torch from this table
# only, read from torch when the entry is stored and when it is read (torch._dynamo, once imported,
# replaces torch.manual_seed with a wrapper: the glue calls what the program's `torch.manual_seed`
# finds): a tensor factory whose size a graph computed as a tensor (`torch.arange(mask.sum())`,
# Longformer's global attention indices), which only allocates, and a reseed (Reformer's hashing).
_TORCH_BREAK_CALLS = ("arange", "manual_seed")


# functions whose closure holds data objects (`closure_function` references), collected while
# `loads` reads one file: each must be covered by the guards read with it (`_check_closure_functions`)
_CLOSURE_FUNCTIONS: contextvars.ContextVar[list[types.FunctionType] | None] = \
    contextvars.ContextVar("kiln_closure_functions", default=None)
