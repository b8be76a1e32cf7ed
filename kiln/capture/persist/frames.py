"""Storing and loading frame entries: the records, their checks, and the files.

`StoredFrame` (guards, the glue's source, a recipe per graph, the glue's constants) and
`StoredResume` (a resume function as data) are what an entry file holds (`dumps`/`loads`).
Before an entry is written and after it is read, its glue constants are checked against what
capture binds, its graph breaks against the frame's own bytecode (`_check_breaks`) and its texts
against the grammar capture writes (`check_texts`, kiln.capture.persist.grammar). `store` writes
an entry after a capture; `candidates` lists the entries of a code object as `DiskEntry`s, read
and compiled on first use; `materialize` rebuilds the glue of one whose guards passed.
See docs/frame-cache.md.
"""
from __future__ import annotations

import contextlib
import enum
import functools
import gc
import hashlib
import linecache
import operator
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from kiln import log
from kiln.capture.deferred_checks import check_passed, divides_by_zero, graph_raised, rng_state
from kiln.capture.device_context import runs_without_modes
from kiln.capture.guards import (CheckFn, ClassAttribute, ConstantCall, FunctionCode, GlobalState, Guard,
                                 ParametrizedClass, TensorSpec, compile_guards)
from kiln.capture.persist.digest import FORMAT, NotPortable, Stale, _bound_cell, _data_cells, frame_key
from kiln.capture.persist.grammar import UnsafeSource, check_glue_source, check_guard_source, rooted_at_locals
from kiln.capture.persist.names import _CLOSURE_FUNCTIONS, _TORCH_BREAK_CALLS, _decode_named, _encode_named, _numpy_bool
from kiln.capture.persist.portable import _portable_guard, _portable_guards
from kiln.capture.side_effects import advance_by
from kiln.errors import reraise
from kiln.runtime import artifact, records, store as files


_MAX_ENTRIES = 16  # newest files read per key and local types; older ones are left for a cache cleaner


def _folder(key: str, create: bool) -> str | None:
    """The key's folder (each step checked by kiln.runtime.store); None when it is missing and not
    `create`d, or not trusted."""
    return files.folder("frames", key[:2], key, create=create)


# ---------------------------------------------------------------------------------------------------
# Entry files: records, and other objects by name (kiln.capture.persist.names)

_NAMED = records.Reference("named", _encode_named, _decode_named)
_RECORD_TYPES = (Guard, TensorSpec, GlobalState, ClassAttribute, FunctionCode, ConstantCall, ParametrizedClass)


def dumps(value: Any) -> bytes:
    """`value` (guards, recipes, plain data) as the bytes of a cache file; NotPortable or pickle's
    error when something in it cannot be named in another process."""
    return records.dumps(value, [_NAMED], types=_RECORD_TYPES)


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
                   float, operator.truediv,  # a size as a float, or over an int, computed as eager does (symint.py)
                   types.CellType,  # a closure cell a frame made, passed to a resume function
                   object.__setattr__,  # an attribute write past a class's own __setattr__ (traced)
                   advance_by,  # the trace's next() calls on an iterator from outside, replayed
                   check_passed, graph_raised, rng_state,  # a graph's deferred checks (deferred_checks.py)
                   divides_by_zero,  # a zero divisor of Python numbers: the frame runs eagerly (same)
                   torch.is_grad_enabled)  # the grad mode a graph raising under a handler puts back (same)
# context managers a glue may make, enter and hand the `__exit__` of to a resume function (a break
# inside `with torch.no_grad():`)
_GLUE_CONTEXTS = (torch.no_grad, torch.enable_grad)


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
                      [name for name, value in frame.constants.items() if value is types.CellType],
                      [name for name, value in frame.constants.items() if value is object.__setattr__])


@functools.lru_cache(maxsize=256)
def _stored_attributes(code: types.CodeType) -> frozenset[str]:
    """The attribute names the frame's own code stores (STORE_ATTR): a glue replaying those stores
    may set them on the frame's own objects (grammar._stores_own_attribute)."""
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
        recipe = artifact.describe(getattr(value, "_kiln_graph", value))  # a graph runs_without_modes wrapped
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
            graphs = {name: artifact.rebuild(recipe) for name, recipe in frame.graphs.items()}
        except Exception as exc:
            files.discard(disk.path, f"its graphs cannot be rebuilt: {type(exc).__name__}: {exc}")
            raise
        if any(g.kind == "check_global_state" and g.expected.default_device is not None for g in disk.check.guards):
            graphs = {name: runs_without_modes(graph) for name, graph in graphs.items()}  # as the glue had them
        namespace.update(graphs)
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
