"""The native wrapper's runtime: one C++ function per graph, called from Python in one step.

kiln.lower's native wrapper codegen writes, per graph, a C++ translation unit with one function
`kiln_graph(args, nargs, outs, ...)` over ATen's C++ API (ATen headers only, no Python; they come
from a precompiled header kept in the cache, which halves a graph's build): it
allocates buffers, calls the graph's C++ kernels through a table of function pointers and its
externs through `at::_ops::<op>::call` (other operators through the dispatcher), frees buffers
after their last use and fills `outs`. This module builds it (cached like the kernel library, size
and SHA-256 checked before loading) and binds it to the boundary extension (kiln.runtime.boundary,
shared with the guards), whose `call(handle, *args)` turns Python arguments into c10::IValues, runs
the graph function and wraps its outputs, turning a kernel's failed check or an ATen error into the
Python exception eager raises (a Python kernel's own exception, as a torch.library op raises it,
passes through as itself). A `NativeRecipe`
names both libraries and the kernel library by identity, so another process rebuilds the callable
without compiling (and without kiln.lower). Tier-up (`TieredWrapper`, `BACKGROUND`, `NativeRef`):
outside mode="reduce-overhead" a graph runs its Python wrapper first and switches to its native
wrapper, built on a daemon thread, once hot; a stored graph keeps its loop-level program (a sealed
record named by its SHA-256) so a later process runs the library an earlier one built, or writes the
source again from the program and builds it: C++ is never compiled from stored text. Corresponds to
Inductor's C++ wrapper (cpp_wrapper).
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import hashlib
import importlib
import json
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kiln import log
from kiln.runtime import build, cache, store
from kiln.runtime.artifact import RECIPE_ATTR, Recipe, loader
from kiln.runtime.boundary import aten_compile_flags, aten_helpers, aten_link_flags
from kiln.runtime.boundary import build_now as build_boundary  # `python -m kiln boundary`
from kiln.runtime.boundary import built as built_boundary
from kiln.runtime.boundary import load as boundary  # the extension that binds each graph's function
from kiln.runtime.kernel_wrapper import LibraryThreads, bind_threads, with_output_spec
from kiln.runtime.plan import WrapperPlan, wrapper_plan
from kiln.runtime.records import record_type

# how the graph function reports a kernel's failed check (kiln.lower.checks): the exception class
ERROR_KINDS = {"IndexError": 1, "RuntimeError": 2, "ValueError": 3, "ZeroDivisionError": 4, "TypeError": 5}


def graph_flags(precompiled: bool = True) -> tuple[str, ...]:
    """Compiler flags of a graph's native wrapper: ATen headers (through the precompiled header,
    where the cache holds one), linked to torch's own libraries."""
    header = precompiled_header_path() if precompiled else None
    return (*aten_compile_flags(), *(("-include", header) if header else ()), *aten_link_flags())


# ---------------------------------------------------------------------------------------------------
# The precompiled header: ATen's headers parsed once (about half of each graph's build), kept in
# the cache as `<key>.h` beside `<key>.h.gch` and its sealed size and SHA-256, like a library. g++
# reads the .gch instead of the headers when its flags match; it is checked against its record
# before any compile that reads it (a forged one would put code of someone else's into the graph).

PCH_HEADER = """// ATen's headers for kiln's native wrappers (kiln.runtime.native), precompiled once
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/convolution_ops.h>
#include <ATen/ops/convolution_backward_ops.h>
#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <string>
#include <vector>
"""

_pch_verified: dict[str, tuple[int, int, int]] = {}  # .gch path -> (inode, size, mtime) when verified


def precompiled_header_path() -> str | None:
    key = cache.cache_key(PCH_HEADER, aten_compile_flags(), f"{build.COMPILER} torch {torch.__version__}")
    return cache.artifact_path(key, ".h")


def _stat(path: str) -> tuple[int, int, int] | None:
    try:
        with store.open_trusted(path) as (_, st):
            return st.st_ino, st.st_size, st.st_mtime_ns
    except OSError:
        return None


def _pch_ok(header: str) -> bool:
    """Whether `header` holds PCH_HEADER and its .gch matches its sealed record (both trusted files:
    kiln.runtime.store)."""
    gch = header + ".gch"
    if store.read_file(header) != PCH_HEADER.encode():
        return False
    seen = _stat(gch)
    if seen is not None and _pch_verified.get(gch) == seen:
        return True
    body = store.read_sealed(gch + ".sum")
    try:
        record = json.loads(body) if body is not None else None
        expected = (int(record["size"]), str(record["sha256"])) if record else None
    except (ValueError, KeyError, TypeError):
        expected = None
    if expected is None or seen is None or store.file_digest(gch, expected[0]) != expected:
        return False
    _pch_verified[gch] = seen
    return True


def ensure_precompiled_header() -> bool:
    """Build the precompiled header into the cache unless a verified one is there; False when the
    cache is off or the build failed (graphs then compile without it)."""
    header = precompiled_header_path()
    if header is None:
        return False
    if _pch_ok(header):
        return True
    gch = header + ".gch"
    if os.path.lexists(gch):
        store.discard(gch, "the precompiled header does not match its record", gch + ".sum")
    start = time.perf_counter()
    try:
        with store.staging(header) as folder:
            made_header = os.path.join(folder, "kiln_native.h")
            store.write_private(made_header, PCH_HEADER)
            cmd = [build.COMPILER, *aten_compile_flags(), "-x", "c++-header", "kiln_native.h", "-o", "kiln_native.h.gch"]
            proc = build.run_compiler(cmd, folder)
            if proc.returncode != 0:
                raise build.BuildError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
            digest = store.file_digest(made_header + ".gch")
            if digest is None:
                raise build.BuildError("the compiler wrote no precompiled header")
            store.publish(made_header, header)
            store.publish(made_header + ".gch", gch)
        store.write_sealed(gch + ".sum", json.dumps({"size": digest[0], "sha256": digest[1]}).encode())
    except (OSError, build.BuildError) as exc:
        log.artifact("cache", f"no precompiled header for native wrappers: {exc}")
        return False
    log.artifact("cache", f"built the native wrappers' precompiled header {gch} in {time.perf_counter() - start:.1f}s")
    return _pch_ok(header)


GRAPH_SYMBOLS = ("kiln_graph",)  # what a graph's native wrapper library exports


def load_graph_library(source: str) -> ctypes.CDLL:
    """A graph's native wrapper library: from the cache, else built (with the precompiled header
    when it is there and verified, else from the headers themselves)."""
    flags = graph_flags()
    if "-include" in flags and not build.is_cached(source, flags) and not ensure_precompiled_header():
        flags = graph_flags(precompiled=False)
    return build.load(source, flags, symbols=GRAPH_SYMBOLS)


@record_type
@dataclass(frozen=True)
class NativeRecipe:
    """Everything needed to rebuild a graph's native wrapper in another process: each library as
    (path relative to the cache root, size, SHA-256), the kernel names in table order, and the
    nesting of the outputs."""

    graph_library: tuple[str, int, str]
    kernel_library: tuple[str, int, str] | None
    kernels: tuple[str, ...]
    output_spec: str | None

    def artifact_recipe(self) -> Recipe:
        return Recipe("native_wrapper", {"native": self})


def _bind(graph_lib: ctypes.CDLL, kernel_lib: ctypes.CDLL | None, kernels: tuple[str, ...],
          output_spec: str | None, recipe: NativeRecipe | None,
          constants: list[torch.Tensor] | None = None) -> Callable[..., Any]:
    module = boundary()
    addresses = [ctypes.cast(getattr(kernel_lib, k), ctypes.c_void_p).value for k in kernels] if kernel_lib else []
    follow = None
    if kernels:
        assert kernel_lib is not None
        env: dict[str, Any] = {}
        bind_threads(env, kernel_lib)  # the library's shared LibraryThreads state
        follow = env["_follow_threads"]
        assert isinstance(follow.__self__, LibraryThreads)
    graph_fn = ctypes.cast(graph_lib.kiln_graph, ctypes.c_void_p).value
    handle = module.make(graph_fn, addresses, list(constants or []), follow)
    call: Any = functools.partial(module.call, handle)
    call.steal = functools.partial(module.steal, handle)
    call = with_output_spec(call, output_spec)
    if recipe is not None:
        setattr(call, RECIPE_ATTR, recipe.artifact_recipe)
    return call


def make_native(graph_lib: ctypes.CDLL, kernel_lib: ctypes.CDLL | None, kernels: tuple[str, ...],
                output_spec: str | None, constants: list[torch.Tensor] | None = None) -> Callable[..., Any]:
    """A graph's native wrapper library (`load_graph_library`) bound to its kernels (and to the
    graph's constant tensors, which keep it out of the persistent cache)."""
    found = build.stored_identity(graph_lib)
    kernel_id = build.stored_identity(kernel_lib) if kernels else None
    recipe = None
    if found is not None and (kernel_id is not None or not kernels):
        recipe = NativeRecipe(found, kernel_id, kernels, output_spec)
    else:
        log.artifact("cache", "native wrapper not persistable: a library is outside the cache")
    if constants:
        recipe = None
    return _bind(graph_lib, kernel_lib, kernels, output_spec, recipe, constants)


def load_native(recipe: NativeRecipe) -> Callable[..., Any]:
    """The native wrapper of a recipe (build.LibraryError when a library is gone or changed)."""
    graph_lib = build.load_stored(*recipe.graph_library, symbols=GRAPH_SYMBOLS)
    kernel_lib = (build.load_stored(*recipe.kernel_library, symbols=recipe.kernels)
                  if recipe.kernel_library is not None else None)
    if recipe.kernels and kernel_lib is None:
        raise ValueError("a native wrapper with kernels but no kernel library")
    return _bind(graph_lib, kernel_lib, recipe.kernels, recipe.output_spec, recipe)


@loader("native_wrapper")
def _load(fields: dict[str, Any]) -> Callable[..., Any]:
    recipe = fields.get("native")
    if not isinstance(recipe, NativeRecipe):
        raise ValueError("a native wrapper recipe without its NativeRecipe")
    return load_native(recipe)


# ---------------------------------------------------------------------------------------------------
# Plans: a graph's native wrapper as data, run by the boundary extension (no compile per graph)


@dataclass(frozen=True)
class Plan:
    """A graph's wrapper for the boundary extension's plan runner (written by
    kiln.lower.codegen.plan; the instruction set is boundary.cpp's `kiln_plan`): the instruction
    words (int64, native byte order), the tables they index, the failed-check messages per site
    (error kind, template pieces), (slots, int registers, float registers), and the kernels in the
    order the words call them."""

    words: bytes
    doubles: tuple[float, ...]
    strings: tuple[str, ...]
    ops: tuple[tuple[str, str], ...]
    dtypes: tuple[torch.dtype, ...]
    sites: tuple[tuple[int, int, tuple[str, ...]], ...]
    counts: tuple[int, int, int]
    kernels: tuple[str, ...]


PLAN_ENTRY = "kiln_plan_"  # a kernel's plan entry: kiln.lower.codegen.cpp_kernel.plan_entries


def bind_plan(module: Any, plan: Plan, kernel_lib: ctypes.CDLL | None, output_spec: str | None,
              constants: list[torch.Tensor] | None = None) -> Callable[..., Any]:
    """A graph's plan bound to its kernels (their plan entries in the graph's kernel library) in the
    boundary extension `module`: called like the native wrapper, with no C++ built for the graph
    (AttributeError when the kernel library has no plan entries: one built before they existed)."""
    entries = [ctypes.cast(getattr(kernel_lib, PLAN_ENTRY + k), ctypes.c_void_p).value for k in plan.kernels] \
        if kernel_lib is not None else []
    if plan.kernels and kernel_lib is None:
        raise ValueError("a plan with kernels but no kernel library")
    follow = None
    if plan.kernels:
        assert kernel_lib is not None
        env: dict[str, Any] = {}
        bind_threads(env, kernel_lib)
        follow = env["_follow_threads"]
    handle = module.make_plan(plan.words, list(plan.doubles), list(plan.strings), list(plan.ops), list(plan.dtypes),
                              [(site, kind, list(pieces)) for site, kind, pieces in plan.sites], plan.counts,
                              entries, list(constants or []), follow)
    call: Any = functools.partial(module.call, handle)
    call.steal = functools.partial(module.steal, handle)
    return with_output_spec(call, output_spec)


def tier_plan(python: Callable[..., Any], plan: Callable[[], Plan], kernel_lib: Callable[[], ctypes.CDLL | None],
              output_spec: str | None, constants: list[torch.Tensor] | None, name: str,
              ref: Callable[[], NativeRef | None] | None) -> TieredWrapper:
    """`python` behind a TieredWrapper that runs the graph's plan: from the first call when the
    boundary extension is built (this process or an earlier one built it), else from the first call
    after BACKGROUND built it (once for every graph). `plan` and `kernel_lib` are asked once."""

    def bind(module: Any) -> Callable[..., Any]:
        return bind_plan(module, plan(), kernel_lib(), output_spec, constants)

    def start() -> concurrent.futures.Future:
        module = built_boundary()
        if module is None:
            return BACKGROUND.submit(lambda: bind(boundary()))
        done: concurrent.futures.Future = concurrent.futures.Future()
        try:
            done.set_result(bind(module))
        except Exception as exc:  # reported by the wrapper, which keeps the Python tier
            done.set_exception(exc)
        return done

    wrapper = TieredWrapper(python, start, 1, name, ref)
    if built_boundary() is not None:
        wrapper.start_now()  # bound now: the plan runs from the first call
    return wrapper


def settled(python: Callable[..., Any], native_fn: Callable[..., Any], name: str,
            ref: Callable[[], NativeRef | None]) -> TieredWrapper:
    """A TieredWrapper already running `native_fn` (a plan bound up front): its recipe names the
    Python wrapper and the stored program, from which a later process writes the plan again."""
    wrapper = TieredWrapper(python, lambda: None, 1, name, ref)
    wrapper._settle(native_fn, None)
    return wrapper


# ---------------------------------------------------------------------------------------------------
# Tier-up: the Python wrapper first, the native wrapper once the graph is hot


class _Background:
    """One daemon thread that builds native wrappers in submission order, off the calling thread
    (the compiler is a subprocess, so the caller keeps the GIL). A daemon: a process that exits
    while a build runs does not wait for it; a build that did not finish is not used."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.pending = 0  # submitted and not finished
        self.seconds = 0.0  # spent building, all jobs together (benchmarks report it)
        # a forked child (a DataLoader worker) has no builder thread: it starts its own on demand,
        # and builds its parent had running never finish there (those graphs stay on Python)
        os.register_at_fork(after_in_child=self._forget_parent)

    def _forget_parent(self) -> None:
        self._queue = queue.Queue()
        self._lock = threading.Lock()
        self._thread = None
        self.pending = 0

    def submit(self, job: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self.pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kiln-native-tier-up", daemon=True)
                self._thread.start()
        self._queue.put((job, future))
        return future

    def _run(self) -> None:
        while True:
            job, future = self._queue.get()
            begin = time.perf_counter()
            try:
                future.set_result(job())
            except BaseException as exc:  # reported by the wrapper that asked, on its next call
                future.set_exception(exc)
            finally:
                with self._lock:
                    self.seconds += time.perf_counter() - begin
                    self.pending -= 1

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no build is queued or running (True), or `timeout` seconds pass (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.pending:
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.01)
        return True


BACKGROUND = _Background()


@record_type
@dataclass(frozen=True)
class NativeRef:
    """In a persisted graph: its loop-level program, kept in the cache as a sealed record named by
    its SHA-256 (which the reader checks), the cache paths its native wrapper library has under each
    flag set load_graph_library may use, and what binding it needs. A process that loads the graph
    runs the native wrapper at once when an earlier one built it, else tiers up itself: the source
    written again from the program by this Kiln's writer (`register_writer`), never read back."""

    program: tuple[str, str]  # (path relative to the cache root, SHA-256 of the record)
    graph_libraries: tuple[str, ...]
    kernel_library: tuple[str, int, str] | None
    kernels: tuple[str, ...]
    output_spec: str | None


# The native wrapper's writer for a stored program record: `write(record) -> (source, kernel order)`,
# None when it cannot write one. kiln.lower.codegen.native_wrapper registers it on import; a process
# served from the disk cache imports it (by name, as kiln.runtime.artifact does its loaders) only when
# a stored graph tiers up, so a warm start that never does so never loads the lowering.
_WRITER_MODULE = "kiln.lower.codegen.native_wrapper"
_writers: list[Callable[[bytes], tuple[str, tuple[str, ...]] | None]] = []


def register_writer(write: Callable[[bytes], tuple[str, tuple[str, ...]] | None]) -> None:
    _writers[:] = [write]


# The plan's writer for a stored program record (kiln.lower.codegen.plan registers it on import):
# `write(record) -> Plan`, None when a plan cannot express the graph.
_PLAN_WRITER_MODULE = "kiln.lower.codegen.plan"
_plan_writers: list[Callable[[bytes], Plan | None]] = []


def register_plan_writer(write: Callable[[bytes], Plan | None]) -> None:
    _plan_writers[:] = [write]


def _written_plan(program: bytes, ref: NativeRef) -> Plan:
    """The plan this Kiln writes for a stored program (BuildError where it cannot)."""
    if not _plan_writers:
        importlib.import_module(_PLAN_WRITER_MODULE)
    plan = _plan_writers[0](program)
    if plan is None:
        raise build.BuildError("a plan cannot express the stored program")
    if plan.kernels != ref.kernels:
        raise build.BuildError("the stored program's kernels are not the ones its graph binds")
    return plan


def native_ref(program: bytes, source: str | None, kernel_lib: ctypes.CDLL | None, kernels: tuple[str, ...],
               output_spec: str | None) -> NativeRef | None:
    """The NativeRef of a graph whose native wrapper is `source` (None: a plan, no graph library),
    written from the program whose record is `program` (stored beside the libraries); None when the
    cache is off or cannot take it."""
    digest = hashlib.sha256(program).hexdigest()
    path = cache.artifact_path(digest[:40], ".native.program")
    rel = store.relative(path) if path is not None else None
    if path is None or rel is None:
        return None
    if store.read_sealed(path) != program and not store.write_sealed(path, program):
        return None
    paths = []
    for flags in dict.fromkeys((graph_flags(), graph_flags(precompiled=False))):
        if source is None:
            break
        lib_rel = store.relative(build.library_path(source, flags))
        if lib_rel is None:
            return None
        paths.append(lib_rel)
    kernel_id = build.stored_identity(kernel_lib) if kernels else None
    if kernels and kernel_id is None:
        return None
    return NativeRef((rel, digest), tuple(paths), kernel_id, kernels, output_spec)


def _stored_program(ref: NativeRef) -> bytes:
    path = store.absolute(ref.program[0])
    body = store.read_sealed(path) if path is not None else None
    if body is None or hashlib.sha256(body).hexdigest() != ref.program[1]:
        raise build.LibraryError(f"{ref.program[0]}: the graph's program is missing or not the stored one")
    return body


def _written_source(program: bytes, ref: NativeRef) -> str:
    """The native wrapper source this Kiln writes for a stored program (on the builder thread)."""
    if not _writers:
        importlib.import_module(_WRITER_MODULE)
    written = _writers[0](program)
    if written is None:
        raise build.BuildError("the native wrapper cannot be written for the stored program")
    source, kernels = written
    if kernels != ref.kernels:
        raise build.BuildError("the stored program's kernels are not the ones its graph binds")
    return source


def _bind_ref(graph_lib: ctypes.CDLL, ref: NativeRef) -> Callable[..., Any]:
    kernel_lib = build.load_stored(*ref.kernel_library, symbols=ref.kernels) if ref.kernel_library is not None else None
    found = build.stored_identity(graph_lib)
    recipe = NativeRecipe(found, ref.kernel_library, ref.kernels, ref.output_spec) if found is not None else None
    return _bind(graph_lib, kernel_lib, ref.kernels, ref.output_spec, recipe)


def load_tiered(python: Callable[..., Any], ref: NativeRef, wrapper: WrapperPlan | None = None) -> Callable[..., Any]:
    """A persisted graph's wrapper in a new process: its native wrapper when a process before this
    one built it, else its Python wrapper behind a TieredWrapper that writes the native source from
    the stored program and builds it once the graph is hot (as the process that compiled it would).
    `wrapper`: the wrapper settings to load it under, kiln.config's now by default."""
    wrapper = wrapper or wrapper_plan()
    if not wrapper.native_allowed:
        return python
    for rel in ref.graph_libraries:
        graph_lib = build.load_cached(rel, symbols=GRAPH_SYMBOLS)
        if graph_lib is None:
            continue
        try:
            return _bind_ref(graph_lib, ref)
        except (build.LibraryError, OSError, AttributeError) as exc:
            log.artifact("cache", f"native wrapper of a stored graph not used ({exc}); its Python wrapper runs")
            return python
    if wrapper.native_plan and (wrapper.tier_up_after > 0 or wrapper.native_up_front) \
            and (ref.kernel_library is not None or not ref.kernels):
        # the plan, written from the stored program on the first call (kiln.lower imported then)
        plans: list[Plan] = []

        def plan() -> Plan:
            if not plans:
                plans.append(_written_plan(_stored_program(ref), ref))
            return plans[0]

        def kernel_lib() -> ctypes.CDLL | None:
            return build.load_stored(*ref.kernel_library, symbols=ref.kernels) if ref.kernel_library else None

        return tier_plan(python, plan, kernel_lib, ref.output_spec, None,
                         f"a stored graph of {len(ref.kernels)} kernels (plan)", lambda: ref)
    if wrapper.tier_up_after <= 0:
        return python

    def start() -> Any:
        program = _stored_program(ref)  # read and checked on the calling thread; written and built on BACKGROUND's
        return BACKGROUND.submit(lambda: _bind_ref(load_graph_library(_written_source(program, ref)), ref))

    return TieredWrapper(python, start, wrapper.tier_up_after,
                         f"a stored graph of {len(ref.kernels)} kernels", lambda: ref)


@loader("tiered")
def _load_tiered(fields: dict[str, Any]) -> Callable[..., Any]:
    from kiln.runtime.artifact import rebuild

    python = rebuild(fields["python"])
    ref = fields.get("native")
    return load_tiered(python, ref) if isinstance(ref, NativeRef) else python


class TieredWrapper:
    """A graph's Python wrapper that hands over to the graph's native wrapper once the graph is hot.

    Compiling the native wrapper costs a C++ build per graph, which a graph called a few times
    (most graphs in a test suite, a script's one-off shapes) never earns back, while a training or
    serving loop saves the Python wrapper's per-kernel calls on every call. So the Python wrapper runs
    first; the `after`-th call asks `start()` for the native build (the source is written on the
    calling thread, the compiler runs on BACKGROUND's thread and returns a future of the bound
    callable) and each later call looks whether it is done: from then on the native wrapper runs.
    Both wrappers run the same memory plan, kernels and checks; a build that fails leaves the Python
    wrapper, with one warning. `steal(args)` is the backward's list entry (kernel_wrapper.positional)."""

    __slots__ = ("current", "python", "after", "calls", "future", "start", "name", "ref", "followers", "__weakref__")

    def __init__(self, python: Callable[..., Any], start: Callable[[], Any], after: int, name: str,
                 ref: Callable[[], NativeRef | None] | None = None) -> None:
        self.current = python
        self.python = python
        self.after: int | None = max(int(after), 1)  # None once settled: native running, or refused
        self.calls = 0
        self.future: Any = None
        self.start = start
        self.name = name
        self.ref = ref  # where the native library will be, for the recipe
        self.followers: list[Callable[[Callable[..., Any]], None]] = []

    def __call__(self, *args: Any) -> Any:
        if self.after is not None:
            self._tick()
        return self.current(*args)

    def steal(self, args: list) -> Any:
        if self.after is not None:
            self._tick()
        steal = getattr(self.current, "steal", None)
        return steal(args) if steal is not None else self.current(*args)

    def when_native(self, follow: Callable[[Callable[..., Any]], None]) -> None:
        """Call `follow(native)` once the native wrapper runs (now, if it already does), so that a
        caller holding this wrapper can call the native one directly: this frame and its tick are
        then off its path. A wrapper that settles on Python never calls it."""
        if self.after is None:
            if self.current is not self.python:
                follow(self.current)
            return
        self.followers.append(follow)

    def artifact_recipe(self) -> Recipe | None:
        """The Python wrapper's recipe, and where the native library will be once built: a process
        that loads this graph from disk runs the native wrapper when one was built before it."""
        method = getattr(self.python, RECIPE_ATTR, None)
        python = method() if callable(method) else None
        if not isinstance(python, Recipe):
            return None
        ref = self.ref() if self.ref is not None else None
        return Recipe("tiered", {"python": python, "native": ref}) if ref is not None else python

    def start_now(self) -> None:
        """Ask `start()` now, and run the native wrapper from the next call if it is ready at once."""
        self._tick()
        self.calls = 0
        if self.future is not None and self.future.done():
            self._tick()
        self.calls = 0

    def _tick(self) -> None:
        self.calls += 1
        if self.future is None:
            if self.calls < (self.after or 0):
                return
            begin = time.perf_counter()
            try:
                self.future = self.start()
            except Exception as exc:  # a writer bug must not break a graph that runs
                self._settle(None, f"{type(exc).__name__}: {exc}")
                return
            if self.future is None:  # the writer cannot express this graph (reason logged)
                self._settle(None, None)
                return
            log.artifact("perf_hints", f"{self.name}: hot after {self.calls} calls; native wrapper written in "
                                       f"{(time.perf_counter() - begin) * 1e3:.0f} ms, building in the background")
            return
        if not self.future.done():
            return
        try:
            native = self.future.result()
        except Exception as exc:
            self._settle(None, f"{type(exc).__name__}: {str(exc)[:2000]}")
            return
        self._settle(native, None)

    def _settle(self, native: Callable[..., Any] | None, error: str | None) -> None:
        self.after = None
        self.future = None
        self.start = None  # type: ignore[assignment]  # asked once
        followers, self.followers = self.followers, []
        if native is not None:
            self.current = native
            log.artifact("perf_hints", f"{self.name}: the native wrapper runs from call {self.calls} on")
            for follow in followers:
                follow(native)
        elif error is not None:
            log.warn(f"kiln: the native wrapper of {self.name} did not build, its Python wrapper keeps running: {error}")


def wait_for_tier_up(timeout: float | None = None) -> bool:
    """Wait until every native wrapper build asked for so far has finished (benchmarks call this
    before timing steady state); False when `timeout` seconds passed first."""
    return BACKGROUND.wait(timeout)
