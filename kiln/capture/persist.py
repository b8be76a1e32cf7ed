"""The persistent frame cache: cache entries saved under KILN_CACHE_DIR and reused by later processes.

A warm start (the same script run again) would otherwise capture every frame anew: fake tensors,
AOT tracing and lowering, about a second per frame, although only the C++ build is cached on disk.
After a capture the entry hands its result to `store`; on a cache miss in a later process, `candidates`
lists the entries stored for the same code object, the entry reads (and verifies) those stored by
calls whose locals had the same types, uses the first whose guards pass on the actual frame, rebuilt
by `materialize` without tracing. Corresponds to torch's FXGraphCache and AOTAutogradCache,
one level up (the whole frame, as torch's precompile does).

Key (a directory per key): the code object's content (filename, qualname, bytecode, constants and
names, nested code objects), the compile options, kiln.config's capture settings, a hash of Kiln's
own sources, the torch, numpy and Python versions and the CPU feature flags. Changing the function's
source, Kiln or torch therefore never meets an old entry; everything else the entry depends on is in
its guards (a class parametrize makes per module by its structure, check_parametrized_type).

What an entry holds (a sealed record file, kiln.runtime.store / kiln.runtime.records: data only,
its SHA-256 in its name and header, both checked on load): its guards as records (the guard
function is generated again from them), the glue's source, and per graph the recipe its compiled
artifact gives of itself (kiln.runtime.artifact; no runtime or lowering internals are named here).
Guard sources and the glue are checked against the grammar capture writes (an allowlist,
kiln/capture/stored_code.py) before they are stored and before they run. An entry is stored only
when every part can be checked in another process, else it stays in memory only:
  - a glue namespace holding nothing but the graphs and admitted constants: ModelOutput
    classes (by name and digest, checked again on load as capture recognises them: a dataclass
    deriving from transformers' ModelOutput), enum members, dtypes, the few callables capture
    binds (grad mode, container types, `print` at a break), and classes whose instances the glue
    rebuilds (`C.__new__(C)`) when the frame's own data names them: never another callable; its
    attribute stores of the frame's own objects only under names the frame's code stores;
  - at a graph break, resume functions as data (`StoredResume`: offset, stack depth, NULL slots,
    live locals), checked against the frame's own bytecode (whose digest is in the key) and made
    again by kiln.capture.code, never read back as code; break callees as user functions by name
    and digest, each one the frame's code names or its closure holds, compiled again as their own
    frames (whose entries come from disk too). A break inside a try or `with torch.no_grad()`
    block stores its native resume functions (plain Python under the frame's handlers) the same
    way, the glue's try/except and context manager in one checked shape. Callees Kiln wraps
    otherwise (hooked modules, DDP, autograd.Function) are not stored;
  - each graph's artifact has a recipe (the built-in lowering, no symbolic view sizes but whole
    dims of a view's base, no constant tensors, no lifted module tensors);
  - each guard is portable. Object identity (check_id) is not, except for objects another process
    can name and compare: a module of Kiln, torch, numpy or the standard library (by its name; a
    user or other site-packages module is refused, since its attributes are read unguarded), a
    plain function
    without closure (by module and qualname, plus a digest of its code and defaults that must
    match; a data object its own closure holds, as the registry a decorator factory was given,
    goes by its type, and the entry is read only where that function is guarded by identity at
    a source S and each such cell by a type guard at `S.__closure__[i].cell_contents`: the trace
    read the cell through that source, so what it read of the object is guarded too), a class
    (by module and qualname; a class outside Kiln, torch and the standard library
    also carries a digest of the code of every method of its MRO, since capture inlines those
    methods without guarding them; closures and defaults holding functions are digested
    through, a decorator's inner function is found through `__wrapped__`), a property,
    staticmethod or classmethod (by its class and name), an enum member, a standard-library
    singleton (typing.Union). A function local to another one (the validators a library's factory
    makes per field) is guarded by its code instead (guards.check_code: code, globals, literal
    defaults), the code found again inside the named function that defines it, with its digest.
    Types in check_type and check_tensor are handled the same way (and the iterator types of a
    loop, by name);
    check_value only with literal values, sets of them and enum members; check_class_attr with
    literal, function, descriptor or absent values, or a dict of those by str keys (a registry,
    checked item by item), not other data objects; check_constant_result (a function marked as
    having a constant result, lru_cache'd or not, by name: the mark holds within one process, so a
    process reading the entry calls it once and compares the result). An identity guard on an
    object that has no name (a model's config reached through a second path) is stored as an
    aliasing guard over every guarded path to it, which is what the trace relied on.
A stored object that cannot be found again, or whose digest differs, makes the whole entry unusable
(`Stale`); it is then skipped and the frame is captured as usual. A file that fails its checksum
or does not decode, or whose graphs cannot be rebuilt (a kernel library changed), is deleted.

Switch: `kiln.config.persistent_cache` (env KILN_PERSISTENT_CACHE=0 turns it off); under
KILN_DEBUG entries are stored but not loaded, so that the debug dump sees real captures. Log:
KILN_LOGS=cache prints frame-cache stores, hits and skipped entries; kiln.stats()["disk_hits"]
counts entries served from disk.
"""
from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
import gc
import hashlib
import linecache
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from kiln import config, log
from kiln.capture.guards import (ABSENT, PARAMETRIZE_MODULE, CheckFn, ClassAttribute, ConstantCall, FunctionCode,
                                 GlobalState, Guard, ParametrizedClass, TensorSpec, compile_guards,
                                 parametrized_class_holds)
from kiln.capture.options import CONSTANT_RESULT_MARKER
from kiln.capture.stored_code import UnsafeSource, check_glue_source, check_guard_source, rooted_at_locals
from kiln.errors import reraise
from kiln.runtime import artifact, cache, records, store as files

FORMAT = 4  # bump when the stored layout changes
_MAX_ENTRIES = 16  # newest files read per key and local types; older ones are left for a cache cleaner


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


def _folder(key: str, create: bool) -> str | None:
    """The key's folder (each step checked by kiln.runtime.store); None when it is missing and not
    `create`d, or not trusted."""
    return files.folder("frames", key[:2], key, create=create)


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


_NAMED = records.Reference("named", _encode_named, _decode_named)
_RECORD_TYPES = (Guard, TensorSpec, GlobalState, ClassAttribute, FunctionCode, ConstantCall, ParametrizedClass)


def dumps(value: Any) -> bytes:
    """`value` (guards, recipes, plain data) as the bytes of a cache file; NotPortable or pickle's
    error when something in it cannot be named in another process."""
    return records.dumps(value, [_NAMED], types=_RECORD_TYPES)


# functions whose closure holds data objects (`closure_function` references), collected while
# `loads` reads one file: each must be covered by the guards read with it (`_check_closure_functions`)
_CLOSURE_FUNCTIONS: contextvars.ContextVar[list[types.FunctionType] | None] = \
    contextvars.ContextVar("kiln_closure_functions", default=None)


def loads(data: bytes) -> Any:
    """What `dumps` wrote; Stale when a named object changed, RecordError when the data is not a
    well-formed entry (a planted pickle gadget included)."""
    token = _CLOSURE_FUNCTIONS.set([])
    try:
        value = records.loads(data, [_NAMED], types=_RECORD_TYPES)
        found = _CLOSURE_FUNCTIONS.get() or []
    finally:
        _CLOSURE_FUNCTIONS.reset(token)
    if found:
        _check_closure_functions(value, found)
    return value


def _check_closure_functions(value: Any, functions: list[types.FunctionType]) -> None:
    """RecordError unless each function whose closure holds a data object is guarded as the trace
    saw it: by identity at a source S (it is found by name and digest, its data cells by the type
    of their values), and each of those cells by a type guard at `S.__closure__[i].cell_contents`
    that expects the type the cell holds now. The tracer inlines a function found at S with its
    cells read through that source, so what it read of the object is guarded there; a function
    named elsewhere (a class attribute's value, a break callee) or a cell the trace never read is
    refused, since no guard would compare that object in another process."""
    guards = value.guards if isinstance(value, StoredFrame) else value if isinstance(value, (list, tuple)) else ()
    guards = [g for g in guards if isinstance(g, Guard)]
    for fn in functions:
        cells = _data_cells(fn)
        sources = [g.source for g in guards
                   if g.kind == "check_id" and g.expected is fn and isinstance(g.source, str) and g.source]
        typed = {(g.source, g.expected) for g in guards
                 if g.kind == "check_type" and isinstance(g.source, str) and isinstance(g.expected, type)}
        if not cells or not any(all((f"{source}.__closure__[{i}].cell_contents", kind) in typed for i, kind in cells)
                                for source in sources):
            raise records.RecordError(f"{fn.__module__}.{fn.__qualname__}: a closure holding data that no guard checks")


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


# ---------------------------------------------------------------------------------------------------
# Store


@records.record_type
@dataclass(frozen=True)
class StoredFrame:
    """What an entry file holds: guards (records), the glue's source, a recipe per graph, and the
    glue's constants (ModelOutput classes and the few objects capture binds, by name)."""

    format: int
    guards: tuple[Guard, ...]
    glue_name: str
    glue_source: str
    graphs: dict[str, artifact.Recipe]
    constants: dict[str, Any] = field(default_factory=dict)
    resumes: dict[str, "StoredResume"] = field(default_factory=dict)
    callees: dict[str, Any] = field(default_factory=dict)  # name -> function, as a named reference


@records.record_type
@dataclass(frozen=True)
class StoredResume:
    """A resume function of a stored glue, as the data it is made from (kiln.capture.glue's
    ResumeRequest): the offset of the frame's code it continues at, the stack depth there, the
    NULL slots among it and the live locals it takes; `native`: it runs as plain Python (it
    continues a break inside a try or with block under the frame's own handlers). Checked against
    the frame's own bytecode (`_check_breaks`) before kiln.capture.code makes the code object
    again; never code itself."""

    offset: int
    nstack: int
    live: tuple[str, ...]
    null_slots: tuple[int, ...]
    native: bool = False


# what a stored glue may hold besides its graphs: callables capture binds (grad mode around a
# graph, containers rebuilt from their items) and, through `_glue_constant`, ModelOutput classes
_GLUE_CALLABLES = (torch._C._set_grad_enabled, tuple, list, dict, set, frozenset, slice, torch.Size, reraise,
                   types.CellType)  # a closure cell a frame made, passed to a resume function
# context managers a glue may make, enter and hand the `__exit__` of to a resume function (a break
# inside `with torch.no_grad():`)
_GLUE_CONTEXTS = (torch.no_grad, torch.enable_grad)
# torch functions a glue may call natively at a graph break, by their name in torch from this table
# only, read from torch when the entry is stored and when it is read (torch._dynamo, once imported,
# replaces torch.manual_seed with a wrapper: the glue calls what the program's `torch.manual_seed`
# finds): a tensor factory whose size a graph computed as a tensor (`torch.arange(mask.sum())`,
# Longformer's global attention indices), which only allocates, and a reseed (Reformer's hashing).
_TORCH_BREAK_CALLS = ("arange", "manual_seed")


def _break_builtin(value: Any) -> bool:
    """A builtin a glue may call natively at a graph break, when the frame's own code names it."""
    return value is print or any(value is getattr(torch, name) for name in _TORCH_BREAK_CALLS)


def _glue_constant(value: Any) -> bool:
    """Whether the glue of a stored entry may hold `value`. A ModelOutput class is checked as capture
    recognised it (a dataclass deriving from transformers' ModelOutput that changes nothing about
    how fields become items), after the reader found it by module and qualname with its digest."""
    if any(value is allowed for allowed in _GLUE_CALLABLES + _GLUE_CONTEXTS) or _break_builtin(value):
        return True
    if isinstance(value, (enum.Enum, torch.dtype, torch.device)) or _numpy_bool(value):
        return True
    if not isinstance(value, type):
        return False
    if _namedtuple_class(value):
        return True
    from kiln.capture.variables.model_output import is_model_output_class  # the tracer's package: not at import

    return is_model_output_class(value)


def _namedtuple_class(value: type) -> bool:
    """A class collections.namedtuple (or typing.NamedTuple) made, directly on tuple: calling it runs
    only the `__new__` namedtuple generates, a lambda whose one global is tuple.__new__ and which
    sees no builtins (checked here on the class found in this process; its methods are in its
    digest). A subclass, or one given its own __init__, is not admitted: its constructor is user code."""
    if value.__bases__ != (tuple,) or not isinstance(value.__dict__.get("_fields"), tuple) \
            or "__init__" in value.__dict__:
        return False
    new = value.__dict__.get("__new__")
    new = getattr(new, "__func__", new)
    return isinstance(new, types.FunctionType) and new.__code__.co_names == ("_tuple_new",) \
        and new.__globals__.get("_tuple_new") is tuple.__new__ and new.__globals__.get("__builtins__") == {} \
        and not new.__closure__


def _built_class(value: Any, guards: Any, code: types.CodeType | None = None) -> bool:
    """A class whose instances the glue rebuilds without its constructor (`C.__new__(C)`, then
    their attributes): admitted only as the type a check_type guard of the same entry expects, so
    that the entry is used only where the frame's own data holds instances of it (a forged entry
    naming another class has guards that fail), as a class an identity guard finds in the
    frame's own data (`L['cache'].layer_class_to_replicate`, not a global), or as a class the
    frame's own `code` names (it builds one itself: Reformer's encoder makes its
    ReformerDynamicCache), found by name with its digest as every class is."""
    return isinstance(value, type) and not _glue_constant(value) and (any(
        g.expected is value and (g.kind == "check_type" or g.kind == "check_id" and rooted_at_locals(g.source))
        for g in guards) or code is not None and value.__name__ in code.co_names)


def _guard_texts(guard: Guard) -> list[str]:
    """The texts of a guard that end up in the generated guard function."""
    texts = [guard.source] if guard.source else []
    if guard.kind == "check_aliasing":
        texts += [src for group in guard.expected for src in group]
    return texts


def check_texts(frame: StoredFrame, code: types.CodeType | None = None) -> None:
    """UnsafeSource unless every text of the entry is in the vocabulary capture writes. A glue with
    graph breaks is checked with its frame's `code`: the break callees (resume functions, compiled
    callees, `print`) take only graph outputs, literals and the frame's own locals, and the methods
    it may call on graph outputs (`.item()`) are those the code names."""
    for guard in frame.guards:
        for text in _guard_texts(guard):
            check_guard_source(text)
    natives = {name for name, value in frame.constants.items() if _break_builtin(value)}
    classes = {name for name, value in frame.constants.items() if _built_class(value, frame.guards, code)}
    callees = set(frame.resumes) | set(frame.callees) | natives
    methods: tuple[str, ...] = ()
    if callees:
        if code is None:
            raise UnsafeSource("a glue with graph breaks checked without its code")
        methods = tuple(n for n in code.co_names if not n.startswith("__"))
    contexts = [name for name, value in frame.constants.items() if any(value is c for c in _GLUE_CONTEXTS)]
    check_glue_source(frame.glue_source, frame.glue_name, frame.graphs,
                      [name for name in frame.constants if name not in natives | classes], callees, methods, classes,
                      _scalar_sources(frame.guards), contexts, _stored_attributes(code) if code is not None else (),
                      [name for name, value in frame.constants.items() if value is types.CellType])


@functools.lru_cache(maxsize=256)
def _stored_attributes(code: types.CodeType) -> frozenset[str]:
    """The attribute names the frame's own code stores (STORE_ATTR): a glue replaying those stores
    may set them on the frame's own objects (stored_code._stores_own_attribute)."""
    import dis  # only for entries checked with their code

    return frozenset(i.argval for i in dis.get_instructions(code) if i.opname == "STORE_ATTR")


def _scalar_sources(guards: Any) -> list[str]:
    """Sources the guards pin to an int, float or bool (by type or value) or to a plain tensor
    (check_tensor's exact type): values the glue may compare, running no user comparison method."""
    out = []
    for g in guards:
        if g.kind == "check_type" and g.expected in (int, float, bool) \
                or g.kind == "check_value" and type(g.expected) in (int, float, bool) \
                or g.kind == "check_tensor" and isinstance(g.expected, TensorSpec) and g.expected.type is torch.Tensor:
            out.append(g.source)
    return out


def _check_breaks(frame: StoredFrame, code: types.CodeType) -> None:
    """NotPortable unless the break parts of an entry agree with the frame's own bytecode, the one
    thing another process can trust (the entry's key holds its digest): each resume function
    continues at an instruction of `code` with the stack depth, NULL slots and live locals the
    bytecode has there (kiln.capture.code.stack_shape_at), and each function or builtin the glue
    calls at a break is one the code names."""
    if not frame.resumes and not frame.callees and not any(_break_builtin(v) for v in frame.constants.values()):
        return
    from kiln.capture import code as code_mod  # the bytecode library: only for frames with breaks

    names = set(code.co_names)
    for name, fn in frame.callees.items():
        # a decorator's wrapper calls the function it holds in a cell (`func`): materialize checks
        # that this closure holds that very function
        if isinstance(fn, type) and issubclass(fn, torch.autograd.Function) and name.startswith("__callee"):
            if fn.__name__ not in names:  # `Fn.apply(...)`: the code names the Function class
                raise NotPortable(f"break callee {name}: {code.co_qualname} does not name {fn.__name__}")
            continue
        if not name.startswith("__callee") or not isinstance(fn, types.FunctionType) \
                or fn.__name__ not in names and not code.co_freevars and not _module_forward(fn, frame.guards):
            raise NotPortable(f"break callee {name} is not a function {code.co_qualname} names")
    for name, value in frame.constants.items():
        if _break_builtin(value) and value.__name__ not in names:
            raise NotPortable(f"{name}: {code.co_qualname} does not name {value.__name__}")
    for name, resume in frame.resumes.items():
        if not (name.startswith("__resume") and isinstance(resume, StoredResume) and type(resume.offset) is int
                and type(resume.nstack) is int and type(resume.live) is tuple and type(resume.null_slots) is tuple
                and type(resume.native) is bool
                and all(type(n) is str for n in resume.live) and all(type(i) is int for i in resume.null_slots)):
            raise NotPortable(f"malformed resume function {name}")
        try:
            shape = code_mod.stack_shape_at(code, resume.offset)
        except ValueError as exc:
            raise NotPortable(f"{name}: {exc}") from exc
        if shape is None or shape.depth != resume.nstack:
            raise NotPortable(f"{name}: the stack at offset {resume.offset} of {code.co_qualname} is not "
                              f"{resume.nstack} deep")
        if len(set(resume.null_slots)) != len(resume.null_slots) or not set(resume.null_slots) <= shape.maybe_null:
            raise NotPortable(f"{name}: NULL slots {resume.null_slots} where the bytecode holds objects")
        if len(set(resume.live)) != len(resume.live) \
                or not set(resume.live) <= set(code_mod.live_locals_at(code, resume.offset)):
            raise NotPortable(f"{name}: locals {resume.live} are not live at offset {resume.offset}")


def _module_forward(fn: types.FunctionType, guards: Any) -> bool:
    """The forward of a module the frame calls (`self.encoder(x)`: the glue calls the compiled
    forward with the module as its first argument): admitted when the frame's own data holds a
    module of that class (the type a check_type guard of the entry expects)."""
    return fn.__name__ == "forward" and any(
        g.kind == "check_type" and isinstance(g.expected, type) and issubclass(g.expected, torch.nn.Module)
        and getattr(g.expected, "forward", None) is fn for g in guards)


def _stored_resume(value: Any) -> StoredResume:
    request = getattr(value, "request", None)
    if request is None:
        raise NotPortable("a resume function made from no request")
    return StoredResume(request.offset, request.nstack, tuple(request.live), tuple(request.null_slots),
                        bool(request.native))


def _callee_function(value: Any) -> Any:
    """The user function behind a break callee the glue binds (compiled by the entry's wrap_frame),
    or for `Function.apply` run as its compiled forward (autograd_function.InferenceApply) the
    Function class, made into one again by materialize."""
    applies = sys.modules.get("kiln.capture.variables.autograd_function")  # loaded by the capture
    if applies is not None and isinstance(value, applies.InferenceApply):
        return value.function
    frame = getattr(value, "_kiln_frame", None)
    if frame is None or frame.has_self or frame.capture is not None or not isinstance(frame.fn, types.FunctionType):
        raise NotPortable(f"a break callee {type(value).__name__}")
    return frame.fn


@contextlib.contextmanager
def without_collections() -> Iterator[None]:
    """Reading an entry parses and compiles text and unpickles records: many short-lived objects,
    no cycles. The collections they would trigger walk torch's whole heap each time (a large part
    of a warm start), so they are held back until the entry is read (and, in kiln.capture.entry,
    until its graphs are rebuilt and its inputs noted)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _payload(check: CheckFn, result: Any, frame: tuple[dict, dict, Any] | None = None,
             code: types.CodeType | None = None) -> StoredFrame:
    """The stored form of an entry, or NotPortable / UnsafeSource. `frame` (L, G, F of the call that
    captured it) lets identity guards on unnamed objects become aliasing guards; `code` is the
    frame's code (a glue with graph breaks is checked against it)."""
    first = result.glue_source.split("\n", 1)[0]
    if not (first.startswith("def ") and "(" in first):
        raise NotPortable("the glue has no source")
    glue_name = first[len("def "):first.index("(")]
    graphs = {}
    constants = {}
    resumes: dict[str, StoredResume] = {}
    callees: dict[str, Any] = {}
    for name, value in result.glue.__globals__.items():
        if name in ("__builtins__", "__name__", glue_name):  # __name__ is the frame's module's, set on load
            continue
        if name.startswith("__const_") and (_glue_constant(value) or _built_class(value, check.guards, code)):
            constants[name] = value
            continue
        if name.startswith("__resume"):
            resumes[name] = _stored_resume(value)
            continue
        if name.startswith("__callee"):
            callees[name] = _callee_function(value)
            continue
        recipe = artifact.describe(value)
        if recipe is None:
            raise NotPortable(f"{name} has no recipe (backend output {type(value).__name__})")
        graphs[name] = recipe
    guards = _portable_guards(list(check.guards), frame)
    stored = StoredFrame(FORMAT, tuple(guards), glue_name, result.glue_source, graphs, constants, resumes, callees)
    if code is not None:
        _check_breaks(stored, code)
    check_texts(stored, code)
    return stored


def _glue_filename(glue_name: str) -> str:
    return f"<kiln glue from disk: {glue_name}>"


def store(code: types.CodeType, options: Any, check: CheckFn, result: Any,
          frame: tuple[dict, dict, Any] | None = None) -> bool:
    """Save a fresh entry of `code` for later processes; False when it is not persistable.
    `frame`: (L, G, F) of the call that captured it, its guards passing."""
    key = frame_key(code, options)
    if key is None:
        log.artifact("cache", f"frame cache: {code.co_qualname} not stored: the backend is a callable")
        return False
    try:
        data = dumps(_payload(check, result, frame, code))
        loads(data)  # what cannot be read back (an object pickled by reference, say) is not stored
    except Exception as exc:  # NotPortable, UnsafeSource, or an object no record admits
        log.artifact("cache", f"frame cache: {code.co_qualname} not stored: {type(exc).__name__}: {exc}")
        return False
    folder = _folder(key, create=True)
    if folder is None:
        return False  # the cache directory is refused or cannot be made (warned once by store)
    name = _content_name(data) if frame is None else f"{discriminator(frame[0])}-{_content_name(data)}"
    path = os.path.join(folder, name)
    if not files.write_sealed(path, data):
        return False
    log.artifact("cache", f"frame cache: stored {code.co_qualname} in {path}")
    return True


def _content_name(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:24] + ".entry"


# ---------------------------------------------------------------------------------------------------
# Lookup


class _Unusable:
    """The check of an entry that could not be read: it never passes."""

    guards: list[Guard] = []

    @staticmethod
    def fn(L: dict, G: dict, F: Any) -> bool:
        return False


class DiskEntry:
    """One stored entry, not yet read: its file is read and verified and its guards compiled the
    first time its `check` is asked for, and only when `matches` (the types of the frame's locals
    at the call that stored it) admits the call. Frames of library code shared by many models (a
    decorator's wrapper) collect one entry per model under one key; each call reads only its own."""

    def __init__(self, path: str, discriminator: str | None, code: types.CodeType | None = None) -> None:
        self.path = path
        self.discriminator = discriminator
        self.code = code  # the frame's code: a glue with graph breaks is checked against it
        self._check: Any = None
        self._payload: StoredFrame | None = None

    def matches(self, L: dict) -> bool:
        return self.discriminator is None or self.discriminator == discriminator(L)

    @property
    def check(self) -> Any:
        if self._check is None:
            with without_collections():
                found = _candidate(self.path, self.code)
            self._check, self._payload = (found if found is not None else (_Unusable(), None))
        return self._check

    @property
    def payload(self) -> StoredFrame:
        self.check  # noqa: B018  (reads the file once)
        if self._payload is None:
            raise Stale(f"{self.path} could not be read")
        return self._payload


def discriminator(L: dict) -> str:
    """A short hash of the types of a call's locals (never their values): a stored entry's file
    name starts with it, so a call skips the entries of calls with other types without reading
    them. A guard set that does not check some local's type only loses a hit, never passes wrongly."""
    text = repr(sorted((str(k), type(v).__module__, type(v).__qualname__) for k, v in L.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _split_name(name: str) -> tuple[str | None, str]:
    """(discriminator or None, content part) of an entry's file name."""
    head, sep, rest = name.partition("-")
    if sep and len(head) == 8 and all(c in "0123456789abcdef" for c in head):
        return head, rest
    return None, name


def _read(path: str, code: types.CodeType | None = None) -> StoredFrame | None:
    """The entry at `path`, verified; None (and the file deleted) when it is damaged or foreign."""
    data = files.read_sealed(path)
    if data is None:
        return None
    if _split_name(os.path.basename(path))[1] != _content_name(data):
        files.discard(path, "its name is not the hash of its content")
        return None
    try:
        frame = loads(data)
        if not isinstance(frame, StoredFrame) or frame.format != FORMAT:
            raise records.RecordError("not a stored frame of this format")
        if not all(isinstance(g, Guard) for g in frame.guards) or not all(
                isinstance(r, artifact.Recipe) for r in frame.graphs.values()):
            raise records.RecordError("a stored frame with foreign parts")
        if not isinstance(frame.constants, dict) or not all(
                isinstance(k, str) and k.startswith("__const_") and k.isidentifier()
                and (_glue_constant(v) or _built_class(v, frame.guards, code))
                for k, v in frame.constants.items()):
            raise records.RecordError("a stored glue constant that capture does not bind")
        if not isinstance(frame.resumes, dict) or not isinstance(frame.callees, dict):
            raise records.RecordError("a stored frame with foreign parts")
        for guard in frame.guards:
            _portable_guard(guard)
        if code is not None:
            _check_breaks(frame, code)
        check_texts(frame, code)
    except (records.RecordError, UnsafeSource, NotPortable) as exc:
        files.discard(path, f"not a frame entry: {exc}")
        return None
    return frame


def candidates(code: types.CodeType, options: Any) -> list[DiskEntry]:
    """The usable stored entries of `code` under `options`, newest first."""
    key = frame_key(code, options)
    folder = _folder(key, create=False) if key is not None else None
    if folder is None:
        if key is not None:
            log.artifact("cache", f"frame cache miss: nothing stored for {code.co_qualname}")
        return []
    paths = []
    for name in os.listdir(folder):
        if name.endswith(".entry"):
            try:
                paths.append((os.stat(os.path.join(folder, name)).st_mtime_ns, os.path.join(folder, name)))
            except OSError:  # removed by another process meanwhile
                continue
    paths.sort(reverse=True)
    out: list[DiskEntry] = []
    per_kind: dict[str | None, int] = {}
    for _, path in paths:
        kind = _split_name(os.path.basename(path))[0]
        per_kind[kind] = per_kind.get(kind, 0) + 1
        if per_kind[kind] <= _MAX_ENTRIES:
            out.append(DiskEntry(path, kind, code))
    return out


def _candidate(path: str, code: types.CodeType | None = None) -> tuple[CheckFn, StoredFrame] | None:
    """The entry at `path` with its guards compiled, or None (logged) when it cannot be used."""
    try:
        frame = _read(path, code)
        if frame is None:
            return None
        check = compile_guards(list(frame.guards))  # generated again from the records
    except Stale as exc:
        log.artifact("cache", f"frame cache: {path} skipped: {exc}")
        return None
    except Exception as exc:  # never an error: the frame is captured as usual
        log.artifact("cache", f"frame cache: {path} unreadable: {type(exc).__name__}: {exc}")
        return None
    return check, frame


def materialize(disk: DiskEntry, fn: types.FunctionType | None = None,
                wrap_frame: Any = None) -> tuple[Any, Any]:
    """(glue, result) of a stored entry whose guards passed. When a graph cannot be rebuilt (a
    kernel library left the cache or is not the recorded one) the entry file is deleted and the
    error raised: the caller captures the frame, which stores a fresh entry. An entry with graph
    breaks needs its frame's function `fn` and the entry's `wrap_frame`: its resume functions are
    made again from `fn`'s code (kiln.capture.code.resume_callable), its callees compiled anew."""
    frame = disk.payload
    with without_collections():
        namespace: dict[str, Any] = dict(frame.constants)
        if frame.resumes or frame.callees:
            # Stale (the entry is skipped, the file kept: it may be another closure's) unless this
            # function is the one the entry was read for and holds or names each callee
            if fn is None or wrap_frame is None or fn.__code__ is not disk.code:
                raise Stale("an entry with graph breaks is used only for the code it was read for")
            cells = [c.cell_contents for c in fn.__closure__ or () if _bound_cell(c)]
            for callee in frame.callees.values():
                if callee.__name__ not in fn.__code__.co_names and not any(callee is c for c in cells) \
                        and not _module_forward(callee, frame.guards):
                    raise Stale(f"break callee {callee.__qualname__} is neither named by {fn.__qualname__} "
                                f"nor held in its closure nor a guarded module's forward")
            from kiln.capture.code import ResumeRequest, resume_callable  # the bytecode library: breaks only

            for name, stored in frame.resumes.items():
                request = ResumeRequest(stored.offset, stored.nstack, stored.live, stored.null_slots, stored.native)
                namespace[name] = resume_callable(fn, request, wrap_frame)
            for name, callee in frame.callees.items():
                if isinstance(callee, type):
                    namespace[name] = _inference_apply(callee, wrap_frame)
                else:
                    namespace[name] = wrap_frame(callee)
        try:
            namespace.update({name: artifact.rebuild(recipe) for name, recipe in frame.graphs.items()})
        except Exception as exc:
            files.discard(disk.path, f"its graphs cannot be rebuilt: {type(exc).__name__}: {exc}")
            raise
        filename = _glue_filename(frame.glue_name)
        source = frame.glue_source
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for tracebacks
        if fn is not None:  # what the glue's native calls (type(name, bases, ns)) take as __module__
            namespace["__name__"] = fn.__globals__.get("__name__")
        exec(compile(source, filename, "exec"), namespace)
    glue = namespace[frame.glue_name]
    result = LoadedResult(glue, source, list(disk.check.guards), [], [], disk.path, len(frame.graphs))
    return glue, result


def _inference_apply(function: type, wrap_frame: Any) -> Any:
    """`function.apply` as capture binds it at a break (its forward compiled as a frame of its own)."""
    from kiln.capture.variables.autograd_function import inference_apply  # only for such entries

    apply = inference_apply(getattr(function, "apply", None), wrap_frame)
    if apply is None:
        raise Stale(f"{function.__qualname__}.apply is no longer its forward alone")
    return apply


def _bound_cell(cell: types.CellType) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


@dataclass(frozen=True)
class LoadedResult:
    """A CaptureResult's fields for an entry read from disk (it has no FX graphs in memory)."""

    glue: Any
    glue_source: str
    guards: list[Guard]
    graphs: list
    breaks: list
    path: str
    graph_count: int  # graphs the glue runs (their FX graphs are not kept on disk)
