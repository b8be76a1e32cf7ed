"""The persistent frame cache: cache entries saved under KILN_CACHE_DIR and reused by later processes.

A warm start (the same script run again) would otherwise capture every frame anew: fake tensors,
AOT tracing and lowering, about a second per frame, although only the C++ build is cached on disk.
After a capture the entry hands its result to `store`; on a cache miss in a later process, `lookup`
reads the entries stored for the same code object and returns the first whose guards pass on the
actual frame, rebuilt without tracing. Corresponds to torch's FXGraphCache and AOTAutogradCache,
one level up (the whole frame, as torch's precompile does).

Key (a directory per key): the code object's content (filename, qualname, bytecode, constants and
names, nested code objects), the compile options, kiln.config's capture settings, a hash of Kiln's
own sources, the torch and Python versions and the CPU. Changing the function's source, Kiln or
torch therefore never meets an old entry; everything else the entry depends on is in its guards.

What an entry holds: its guards, the glue's source, and per graph a recipe for its runtime
(kiln.runtime.aot: wrapper sources, kernel library path, AOT facts). An entry is stored only when
every part can be checked in another process, else it stays in memory only:
  - no graph break (its glue would call resume functions and nested compiled frames), at least one
    graph, and a glue namespace holding nothing but the graphs;
  - each graph's runtime has a recipe (the built-in lowering, no symbolic view sizes, no constant
    tensors, no lifted module tensors);
  - each guard is portable. Object identity (check_id) is not, except for objects another process
    can name and compare: a module of Kiln, torch or the standard library (by its name; a user or
    site-packages module is refused, since its attributes are read unguarded), a plain function
    without closure (by module and qualname, plus a digest of its code and defaults that must
    match), a class (by module and qualname; a class outside Kiln, torch and the standard library
    also carries a digest of the code of every method of its MRO, since capture inlines those
    methods without guarding them). Types in
    check_type and check_tensor are handled the same way; check_value only with literal values.
A stored object that cannot be found again, or whose digest differs, makes the whole entry unusable
(`Stale`); it is then skipped and the frame is captured as usual.

Switch: `kiln.config.persistent_cache` (env KILN_PERSISTENT_CACHE=0 turns it off); under
KILN_DEBUG entries are stored but not loaded, so that the debug dump sees real captures. Log:
KILN_LOGS=cache prints frame-cache stores, hits and skipped entries; kiln.stats()["disk_hits"]
counts entries served from disk.
"""
from __future__ import annotations

import functools
import hashlib
import io
import linecache
import marshal
import os
import pickle
import platform
import sys
import tempfile
import types
from dataclasses import dataclass
from typing import Any

import torch

from kiln import config
from kiln.capture.guards import CheckFn, Guard, TensorSpec, compile_guards
from kiln import log

FORMAT = 1  # bump when the pickled layout changes
_MAX_ENTRIES = 16  # newest files read per key; older ones are left for a cache cleaner


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


def function_digest(fn: types.FunctionType) -> str:
    """Code, defaults and closure of a function; NotPortable when they hold objects."""
    parts = [code_digest(fn.__code__)]
    for defaults in (fn.__defaults__, fn.__kwdefaults__):
        if defaults is not None and not _plain(defaults):
            raise NotPortable(f"defaults of {fn.__qualname__}")
        parts.append(repr(defaults))
    for cell in fn.__closure__ or ():
        value = cell.cell_contents
        if isinstance(value, type):  # the __class__ cell of a method that calls super()
            parts.append(f"class:{value.__module__}.{value.__qualname__}")
        elif _plain(value):
            parts.append(repr(value))
        else:
            raise NotPortable(f"closure of {fn.__qualname__}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _member_digest(value: Any) -> str:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return "property:" + ",".join(_member_digest(f) for f in (value.fget, value.fset, value.fdel))
    if isinstance(value, types.FunctionType):
        return function_digest(value)
    if isinstance(value, functools.partial):
        raise NotPortable("a functools.partial class attribute")
    return type(value).__qualname__  # data is guarded where the trace reads it


_SKIPPED_MEMBERS = frozenset({"__dict__", "__weakref__", "__doc__", "__module__", "__qualname__",
                              "__annotations__", "__slots__"})


@functools.lru_cache(maxsize=None)
def class_digest(cls: type) -> str:
    """The methods of every class of `cls`'s MRO that is not torch's or the standard library's."""
    h = hashlib.sha256()
    for klass in cls.__mro__:
        if _trusted_module(klass.__module__):
            h.update(f"{klass.__module__}.{klass.__qualname__}\0".encode())
            continue
        h.update(f"{klass.__module__}.{klass.__qualname__}:".encode())
        for name in sorted(klass.__dict__):
            if name not in _SKIPPED_MEMBERS:
                h.update(f"{name}={_member_digest(klass.__dict__[name])}\0".encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _stdlib_dirs() -> tuple[str, ...]:
    import sysconfig  # only when a class or module is first judged

    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib"))


@functools.lru_cache(maxsize=None)
def _trusted_module(name: str) -> bool:
    """Kiln, torch and the standard library: their content is fixed by the key (Kiln's sources,
    torch's and Python's versions). Everything else, installed libraries included (an upgrade
    changes no key), is user code: classes carry digests, module identities do not travel."""
    top = name.partition(".")[0]
    if top in ("kiln", "torch", "builtins") or top in sys.builtin_module_names:
        return True
    path = getattr(sys.modules.get(name), "__file__", None)
    if not path:
        return False
    path = os.path.realpath(path)
    return path.startswith(_stdlib_dirs()) and "-packages" + os.sep not in path


@functools.lru_cache(maxsize=None)
def environment_digest() -> str:
    """Kiln's own sources, torch, Python and the CPU: anything else is a different compiler."""
    import kiln
    from kiln.runtime import cache

    h = hashlib.sha256()
    root = os.path.dirname(kiln.__file__)
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                h.update(name.encode())
                with open(os.path.join(folder, name), "rb") as f:
                    h.update(f.read())
    for part in (FORMAT, torch.__version__, sys.version, platform.machine(), cache._cpu(),
                 os.environ.get("CXX", "g++")):
        h.update(repr(part).encode())
    return h.hexdigest()


_NOT_CAPTURE_SETTINGS = frozenset({"cache_dir", "debug_dir", "debug", "persistent_cache", "cache_size_limit",
                                   "suppress_errors"})


def _config_text() -> str:
    values = {k: v for k, v in vars(config).items()
              if not k.startswith("_") and k not in _NOT_CAPTURE_SETTINGS and _plain(v)}
    return repr(sorted(values.items()))


def frame_key(code: types.CodeType, options: Any) -> str | None:
    """The directory key of a code object's entries under these options; None if not persistable."""
    if not isinstance(options.backend, str):
        return None  # a backend callable has no name another process could look up
    if not _plain(dict(options.options)):
        return None
    parts = (code_digest(code), options.backend, options.fullgraph, options.dynamic, options.mode,
             repr(sorted((k, repr(v)) for k, v in options.options.items())), _config_text(),
             environment_digest())
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:40]


def _folder(key: str) -> str:
    return os.path.join(config.cache_dir, "frames", key[:2], key)


# ---------------------------------------------------------------------------------------------------
# Pickling with names instead of identities


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = sys.modules.get(module)
    if obj is None:
        raise Stale(f"module {module} is not imported")
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise Stale(f"{module}.{qualname} is gone")
    return obj


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch._ops.OpOverload):
            return ("op", obj._schema.name, obj._overloadname)
        if isinstance(obj, types.ModuleType):
            if sys.modules.get(obj.__name__) is not obj or not _trusted_module(obj.__name__):
                raise NotPortable(f"module {obj.__name__}")
            return ("module", obj.__name__)
        if isinstance(obj, types.FunctionType) and not _trusted_module(obj.__module__ or ""):
            self._check_named(obj)
            return ("function", obj.__module__, obj.__qualname__, function_digest(obj))
        # Kiln's, torch's and the standard library's functions and classes pickle by reference:
        # pickle itself checks that the name leads back to the same object.
        if isinstance(obj, type) and not _trusted_module(obj.__module__):
            self._check_named(obj)
            return ("class", obj.__module__, obj.__qualname__, class_digest(obj))
        if isinstance(obj, torch.Tensor):
            raise NotPortable("a tensor")
        return None

    @staticmethod
    def _check_named(obj: Any) -> None:
        if "<locals>" in obj.__qualname__:
            raise NotPortable(f"{obj.__qualname__} is local to a function")
        try:
            found = _resolve(obj.__module__, obj.__qualname__)
        except Stale:
            found = None
        if found is not obj:
            raise NotPortable(f"{obj.__module__}.{obj.__qualname__} is not reachable by its name")


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0]
        if kind == "op":
            namespace, op = pid[1].split("::")
            return getattr(getattr(getattr(torch.ops, namespace), op), pid[2] or "default")
        if kind == "module":
            module = sys.modules.get(pid[1])
            if module is None:
                raise Stale(f"module {pid[1]} is not imported")
            return module
        obj = _resolve(pid[1], pid[2])
        digest = function_digest(obj) if kind == "function" and isinstance(obj, types.FunctionType) \
            else class_digest(obj) if kind == "class" and isinstance(obj, type) else None
        if digest != pid[3]:
            raise Stale(f"{pid[1]}.{pid[2]} changed since the entry was stored")
        return obj


_LITERAL_TYPES = (int, float, str, bytes, bool, type(None), type(Ellipsis), torch.dtype, torch.layout,
                  torch.device, torch.memory_format)


def _portable_guard(guard: Guard) -> None:
    """Raise NotPortable unless another process can check this guard (the pickler checks names)."""
    kind, expected = guard.kind, guard.expected
    if kind == "check_id":
        if not isinstance(expected, (types.ModuleType, types.FunctionType, type, types.BuiltinFunctionType)):
            raise NotPortable(f"identity of {type(expected).__name__} at {guard.source}")
    elif kind == "check_value":
        if type(expected) not in _LITERAL_TYPES:
            raise NotPortable(f"value of type {type(expected).__name__} at {guard.source}")
    elif kind == "check_keys":
        if not all(type(k) in (str, int) for k in expected):
            raise NotPortable(f"keys at {guard.source}")
    elif kind == "check_tensor":
        if not isinstance(expected, TensorSpec):
            raise NotPortable(f"tensor spec at {guard.source}")
    elif kind not in ("check_type", "check_none", "check_not_none", "check_len", "check_min_len",
                      "check_grad_mode", "check_global_state", "check_aliasing", "check_shape"):
        raise NotPortable(f"guard kind {kind}")


# ---------------------------------------------------------------------------------------------------
# Store


def _payload(check: CheckFn, result: Any) -> dict:
    """The stored form of an entry, or NotPortable."""
    from kiln.runtime.aot import graph_recipe

    if result.breaks:
        raise NotPortable("the frame has a graph break (resume functions are not persisted)")
    if not result.graphs:
        raise NotPortable("no graph")
    first = result.glue_source.split("\n", 1)[0]
    if not (first.startswith("def ") and "(" in first):
        raise NotPortable("the glue has no source")
    glue_name = first[len("def "):first.index("(")]
    graphs = {}
    for name, value in result.glue.__globals__.items():
        if name in ("__builtins__", glue_name):
            continue
        recipe = graph_recipe(value)
        if recipe is None:
            raise NotPortable(f"{name} has no recipe (backend output {type(value).__name__})")
        graphs[name] = recipe
    for guard in check.guards:
        _portable_guard(guard)
    # Code objects go marshalled (Python's version is in the key): compile() of a long guard
    # function is a good part of a warm start.
    glue_code = compile(result.glue_source, _glue_filename(glue_name), "exec")
    return {"guards": check.guards, "guards_source": check.source,
            "guards_code": marshal.dumps(check.code) if check.code is not None else None,
            "glue_source": result.glue_source, "glue_name": glue_name, "glue_code": marshal.dumps(glue_code),
            "graphs": graphs}


def _glue_filename(glue_name: str) -> str:
    return f"<kiln glue from disk: {glue_name}>"


def store(code: types.CodeType, options: Any, check: CheckFn, result: Any) -> bool:
    """Save a fresh entry of `code` for later processes; False when it is not persistable."""
    key = frame_key(code, options)
    if key is None:
        log.artifact("cache", f"frame cache: {code.co_qualname} not stored: the backend is a callable")
        return False
    try:
        buffer = io.BytesIO()
        _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(_payload(check, result))
    except Exception as exc:  # NotPortable, or an object pickle refuses: kept in memory only
        log.artifact("cache", f"frame cache: {code.co_qualname} not stored: {type(exc).__name__}: {exc}")
        return False
    data = buffer.getvalue()
    folder = _folder(key)
    path = os.path.join(folder, hashlib.sha256(data).hexdigest()[:24] + ".entry")
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # readers never see half a file
    except OSError as exc:
        log.artifact("cache", f"frame cache: {code.co_qualname} not stored: {exc}")
        return False
    log.artifact("cache", f"frame cache: stored {code.co_qualname} in {path}")
    return True


# ---------------------------------------------------------------------------------------------------
# Lookup


@dataclass
class DiskEntry:
    """One stored entry, read but not yet used: its guards compiled, its graphs not yet loaded."""

    path: str
    check: CheckFn
    payload: dict


def candidates(code: types.CodeType, options: Any) -> list[DiskEntry]:
    """The usable stored entries of `code` under `options`, newest first."""
    key = frame_key(code, options)
    folder = _folder(key) if key is not None else None
    if folder is None or not os.path.isdir(folder):
        if key is not None:
            log.artifact("cache", f"frame cache miss: nothing stored for {code.co_qualname}")
        return []
    paths = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".entry")]
    paths.sort(key=lambda p: os.stat(p).st_mtime_ns, reverse=True)
    out = []
    for path in paths[:_MAX_ENTRIES]:
        try:
            with open(path, "rb") as f:
                payload = _Unpickler(f).load()
            compiled = None
            if payload["guards_code"] is not None:
                compiled = (payload["guards_source"], marshal.loads(payload["guards_code"]))
            check = compile_guards(payload["guards"], compiled=compiled)
        except Stale as exc:
            log.artifact("cache", f"frame cache: {path} skipped: {exc}")
            continue
        except Exception as exc:  # a damaged or foreign file is a miss, never an error
            log.artifact("cache", f"frame cache: {path} unreadable: {type(exc).__name__}: {exc}")
            continue
        out.append(DiskEntry(path, check, payload))
    return out


def materialize(disk: DiskEntry) -> tuple[Any, Any]:
    """(glue, result) of a stored entry whose guards passed; OSError/AttributeError when a kernel
    library left the C++ cache."""
    from kiln.runtime.aot import load_graph_recipe

    payload = disk.payload
    namespace: dict[str, Any] = {name: load_graph_recipe(recipe) for name, recipe in payload["graphs"].items()}
    filename = _glue_filename(payload["glue_name"])
    source = payload["glue_source"]
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for tracebacks
    exec(marshal.loads(payload["glue_code"]), namespace)
    glue = namespace[payload["glue_name"]]
    result = LoadedResult(glue, payload["glue_source"], list(disk.check.guards), [], [], disk.path,
                          len(payload["graphs"]))
    return glue, result


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
