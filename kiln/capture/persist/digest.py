"""Digests and the key of the frame cache: what an entry is filed under, and how another process
tells that a named object is still the one stored.

`code_digest`, `function_digest` and `class_digest` hash what capture relied on without guarding it
(a code object's bytecode and constants; a function's code, defaults and closure; the methods of a
class's MRO). `environment_digest` and `frame_key` make an entry's directory key: the code object,
the compile options, kiln.config's capture settings, Kiln's own sources, the torch, numpy and Python
versions and the CPU. `FORMAT` is the stored layout's version; `NotPortable` (not stored) and
`Stale` (not used) are the two ways an entry is refused. See docs/frame-cache.md.
"""
from __future__ import annotations

import enum
import functools
import hashlib
import os
import sys
import types
from typing import Any

import torch

from kiln import config
from kiln.runtime import cache


FORMAT = 8  # bump when the stored layout or a guard's meaning changes (8: GlobalState holds the default device)


class NotPortable(Exception):
    """A value of the entry cannot be named in another process: the entry is not stored."""


class Stale(Exception):
    """A stored name resolves to something else than when it was stored: the entry is not used."""


# ---------------------------------------------------------------------------------------------------
# Digests


def _const_text(value: Any) -> str:
    if isinstance(value, types.CodeType):
        return "code:" + code_digest(value)
    if isinstance(value, frozenset):  # set order follows string hashing, which differs per process
        return "frozenset:" + repr(sorted(_const_text(v) for v in value))
    if isinstance(value, tuple):
        return "tuple:(" + ",".join(_const_text(v) for v in value) + ")"
    return f"{type(value).__name__}:{value!r}"


@functools.lru_cache(maxsize=None)
def code_digest(code: types.CodeType) -> str:
    """A hash of everything a code object computes with (not its line table)."""
    h = hashlib.sha256()
    for part in (code.co_filename, code.co_qualname, code.co_code, code.co_names, code.co_varnames,
                 code.co_freevars, code.co_cellvars, code.co_argcount, code.co_posonlyargcount,
                 code.co_kwonlyargcount, code.co_flags, code.co_firstlineno,
                 tuple(_const_text(c) for c in code.co_consts)):
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list, frozenset)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return type(value) in (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


_MAX_DEPTH = 6  # functions reached through closures and defaults (decorators wrap a few levels deep)


def _captured_text(value: Any, owner: str, depth: int, lenient: bool = False, stack: tuple[int, ...] = ()) -> str:
    """A value a function holds in a closure cell or a default, as digest text. What capture can
    inline from there is code (functions, by digest), classes (by name, as `__class__` cells of
    methods that call super()), enum members, literals, and bare `object()` sentinels (they carry
    no state); anything else makes the function NotPortable, unless `lenient` (the methods of a
    class digest, where other data goes by its type: the methods capture inlines are covered,
    and data they read is guarded where the trace reads it, as for class attributes)."""
    if _plain(value):
        return repr(value)
    if isinstance(value, types.FunctionType):
        return "function:" + function_digest(value, depth + 1, lenient, stack)
    if isinstance(value, type):
        return f"class:{value.__module__}.{value.__qualname__}"
    if isinstance(value, enum.Enum):
        return f"enum:{type(value).__module__}.{type(value).__qualname__}.{value.name}"
    if type(value) is object:
        return "sentinel"
    if isinstance(value, types.MethodType) and isinstance(value.__func__, types.FunctionType):
        # a bound method: its code by digest, its instance by type (data is guarded where it is read)
        return f"method:{function_digest(value.__func__, depth + 1, lenient, stack)}:{type(value.__self__).__qualname__}"
    if isinstance(value, (tuple, list)):
        return type(value).__name__ + ":(" + ",".join(_captured_text(v, owner, depth, lenient, stack) for v in value) + ")"
    if lenient:
        return f"data:{type(value).__module__}.{type(value).__qualname__}"
    raise NotPortable(f"{owner} holds a {type(value).__name__}")


def function_digest(fn: types.FunctionType, depth: int = 0, lenient: bool = False,
                    _stack: tuple[int, ...] = (), cells: bool = False) -> str:
    """Code, defaults and closure of a function, functions among them by their own digests (a
    function already being digested, as a decorator's wrapper reached again from its inner
    function, by its code only); NotPortable when they hold objects another process could not
    compare. `cells`: a data object held directly in the function's own closure goes by its type
    (`_data_cells`; the caller makes sure the guards check that type and what the trace read)."""
    if id(fn) in _stack:
        return "cycle:" + code_digest(fn.__code__)
    _stack = (*_stack, id(fn))
    if depth > _MAX_DEPTH:
        if lenient:
            return code_digest(fn.__code__)
        raise NotPortable(f"functions nested too deep in closures of {fn.__qualname__}")
    parts = [code_digest(fn.__code__)]
    for defaults in (fn.__defaults__, fn.__kwdefaults__):
        if defaults is None or _plain(defaults):
            parts.append(repr(defaults))
        elif isinstance(defaults, dict):
            parts.append(repr([(k, _captured_text(v, f"defaults of {fn.__qualname__}", depth, lenient, _stack))
                               for k, v in defaults.items()]))
        else:
            parts.append(_captured_text(defaults, f"defaults of {fn.__qualname__}", depth, lenient, _stack))
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell (a name bound later in the enclosing function)
            parts.append("empty")
            continue
        if cells and _data_cell(value):
            parts.append(f"cell:{type(value).__module__}.{type(value).__qualname__}")
            continue
        parts.append(_captured_text(value, f"closure of {fn.__qualname__}", depth, lenient, _stack))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _data_cell(value: Any) -> bool:
    """A closure value that `_captured_text` cannot digest by content: an object holding data
    (a decorator factory's registry argument), as opposed to literals, functions, classes, enum
    members, sentinels and sequences of them."""
    return not (_plain(value) or isinstance(value, (types.FunctionType, type, enum.Enum, types.MethodType,
                                                    tuple, list)) or type(value) is object)


def _data_cells(fn: types.FunctionType) -> list[tuple[int, type]]:
    """(index, type of its value) of each cell of `fn`'s own closure that holds a data object."""
    out = []
    for i, cell in enumerate(fn.__closure__ or ()):
        if _bound_cell(cell) and _data_cell(cell.cell_contents):
            out.append((i, type(cell.cell_contents)))
    return out


def _member_digest(value: Any) -> str:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return "property:" + ",".join(_member_digest(f) for f in (value.fget, value.fset, value.fdel))
    if isinstance(value, types.FunctionType):
        return function_digest(value, lenient=True)
    if isinstance(value, functools.partial):
        raise NotPortable("a functools.partial class attribute")
    return type(value).__qualname__  # data is guarded where the trace reads it


_SKIPPED_MEMBERS = frozenset({"__dict__", "__weakref__", "__doc__", "__module__", "__qualname__",
                              "__annotations__", "__slots__"})


@functools.lru_cache(maxsize=None)
def class_digest(cls: type) -> str:
    """The methods of every class of `cls`'s MRO that is not torch's or the standard library's.
    Data attributes count only by name and type, and only where they shadow a method of the MRO:
    others are guarded where the trace reads them, and libraries set them lazily (a cached flag
    set by the first instance would otherwise split every entry stored before it)."""
    code_names = {name for klass in cls.__mro__ for name, value in vars(klass).items() if _is_code(value)}
    h = hashlib.sha256()
    for klass in cls.__mro__:
        if _trusted_module(klass.__module__):
            h.update(f"{klass.__module__}.{klass.__qualname__}\0".encode())
            continue
        h.update(f"{klass.__module__}.{klass.__qualname__}:".encode())
        for name in sorted(klass.__dict__):
            value = klass.__dict__[name]
            if name not in _SKIPPED_MEMBERS and (name in code_names):
                h.update(f"{name}={_member_digest(value)}\0".encode())
    return h.hexdigest()


def _is_code(value: Any) -> bool:
    return isinstance(value, (types.FunctionType, staticmethod, classmethod, property, functools.partial))


@functools.lru_cache(maxsize=None)
def _stdlib_dirs() -> tuple[str, ...]:
    import sysconfig  # only when a class or module is first judged

    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib"))


@functools.lru_cache(maxsize=None)
def _trusted_module(name: str) -> bool:
    """Kiln, torch, numpy (which torch imports, and whose functions capture traces from a table of
    its own) and the standard library: their content is fixed by the key (Kiln's sources, torch's,
    numpy's and Python's versions). Everything else, installed libraries included (an upgrade
    changes no key), is user code: classes carry digests, module identities do not travel."""
    top = name.partition(".")[0]
    if top in ("kiln", "torch", "numpy", "builtins") or top in sys.builtin_module_names:
        return True
    path = getattr(sys.modules.get(name), "__file__", None)
    if not path:
        return False
    path = os.path.realpath(path)
    return path.startswith(_stdlib_dirs()) and "-packages" + os.sep not in path


@functools.lru_cache(maxsize=None)
def environment_digest() -> str:
    """Kiln's own sources, torch, numpy, Python and the CPU: anything else is a different compiler."""
    h = hashlib.sha256()
    numpy_version = getattr(sys.modules.get("numpy"), "__version__", None)  # imported by torch when installed
    for part in (FORMAT, cache.source_digest(), torch.__version__, numpy_version, sys.version, cache.cpu_features(),
                 os.environ.get("CXX", "g++")):
        h.update(repr(part).encode())
    return h.hexdigest()


# where things are written and how failures are reported: none changes what a frame compiles to (the
# repro folder defaults to the working directory, which would otherwise key frames by it)
_NOT_CAPTURE_SETTINGS = frozenset({"cache_dir", "debug_dir", "repro_dir", "debug", "persistent_cache",
                                   "cache_size_limit", "suppress_errors", "native_guards"})


def _config_text() -> str:
    values = {k: v for k, v in vars(config).items()
              if k in config.setting_names() and k not in _NOT_CAPTURE_SETTINGS and _plain(v)}
    return repr(sorted(values.items()))


def _changed_lowering_limits() -> str:
    """kiln.lower.conv_layout's limits when they differ from the ones it was loaded with (a test or a
    user changed one), else "": a frame whose graphs were compiled under other limits is another
    entry. Read without importing kiln.lower (a warm start does not load it); unchanged limits
    leave the key as it is with kiln.lower not loaded."""
    conv_layout = sys.modules.get("kiln.lower.conv_layout")
    if conv_layout is None:
        return ""
    now = conv_layout.tunables()
    return "" if now == conv_layout.LOADED_TUNABLES else now


def frame_key(code: types.CodeType, options: Any) -> str | None:
    """The directory key of a code object's entries under these options; None if not persistable."""
    if not isinstance(options.backend, str):
        return None  # a backend callable has no name another process could look up
    if not _plain(dict(options.options)):
        return None
    parts = (code_digest(code), options.backend, options.fullgraph, options.dynamic, options.mode,
             repr(sorted((k, repr(v)) for k, v in options.options.items())), _config_text(),
             environment_digest(), _changed_lowering_limits())
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:40]


def _bound_cell(cell: types.CellType) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True
