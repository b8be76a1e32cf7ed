"""The frame entry: what runs each time a compiled function is called.

Binds the call's arguments into `L` (kiln.capture.binding), runs the first cache entry whose
guards pass, and otherwise tries the entries a previous process stored for this code object
(kiln.capture.persist), and otherwise captures the frame anew through the tracer
(`capture_frame`), up to `config.cache_size_limit` entries per code object. It owns the
per-code-object caches, the dynamic-shape policy kept across recompiles, the counters behind
`kiln.stats()`, and the eager fallbacks (unsupported frames, internal errors, the cache limit, a
call under a torch function mode other than the default device's; a frame given up runs its own
code with its callees still compiled, kiln.capture.skip_frame). Safe to call from several threads:
a guard hit takes no lock; a miss grows the cache under one process-wide lock.
Corresponds to torch/_dynamo/eval_frame.py + convert_frame.py.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import threading
from dataclasses import dataclass, field
from types import CodeType, FunctionType
from typing import Any, Callable, Iterator

import torch

from kiln import compile_time, config
from kiln.capture.binding import make_binder, positional_locals
from kiln.capture.device_context import DISPATCH_MODE_ACTIVE, FUNCTION_MODE_ACTIVE, traceable_modes, user_dispatch_mode
from kiln.capture.guards import CheckFn, GlobalState, Guard, aliasing_guard, compile_guards, read_source
from kiln.capture.options import CompileOptions
from kiln.capture.trace_rules import COMPILED_MARKER, ORIGINAL_ATTR
from kiln import log
from kiln.errors import DeferredCheckFailed, ExternMismatchError, GraphBreakError, Unsupported
from kiln.fake.mode import caller_saved_tensor_hooks_suspended
from kiln import symbolic  # its names load lazily: sympy only comes with a capture

CaptureFn = Callable[..., Any]  # capture_frame(fn, L, options, wrap_frame, *, policy) -> CaptureResult


# names whose use marks a function that reads the frames calling it (sys._getframe(1).f_globals in
# collections.namedtuple and Enum's functional API, inspect.currentframe().f_back, ...)
_FRAME_READERS = frozenset({"_getframe", "_getframemodulename", "currentframe", "extract_stack",
                            "format_stack", "print_stack", "walk_stack"})


def reads_caller_frames(fn: Any) -> bool:
    """By its code's names: `fn` may read its callers' frames, so it runs as it is (uncompiled)
    where the glue calls it, its caller being the glue (whose globals are the frame's)."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code is not None and not _FRAME_READERS.isdisjoint(code.co_names)


@dataclass
class Stats:
    """The counters of kiln.stats(). `frames`: capture attempts (cache misses that traced a frame);
    `compiles`: captures that produced a cache entry; `recompiles`: the compiles of a code object
    that already had an entry; `cache_hits`: calls answered by a cache entry; `fallbacks`: calls run
    eagerly (unsupported frame, internal error, cache limit); `graphs`/`graph_breaks`: totals over
    every capture (`graphs` also counts those of entries loaded from disk); `disk_hits`: cache misses answered by an entry of the persistent frame cache
    (kiln.capture.persist) instead of a capture; `check_reruns`: calls run again eagerly after a deferred
    check failed (kiln.capture.deferred_checks: eager's exception raised). `cache_hits` is counted without the lock (the
    guard-hit path takes none), so threads calling at once may undercount it."""

    frames: int = 0
    compiles: int = 0
    recompiles: int = 0
    graph_breaks: int = 0
    graphs: int = 0
    cache_hits: int = 0
    fallbacks: int = 0
    disk_hits: int = 0
    check_reruns: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


STATS = Stats()


@dataclass(frozen=True, eq=False)  # equal only to itself: dropped by identity (CheckFn.enter)
class CacheEntry:
    """One compiled version of a frame: its guards and the glue that runs the compiled graphs."""

    check: CheckFn
    glue: Callable[[dict, dict, Any], Any]
    result: Any  # the CaptureResult it came from (graphs, guards, breaks, glue_source)
    check_fn: Callable[[dict, dict, Any], bool] = field(init=False)  # check.fn, one load less per call

    def __post_init__(self) -> None:
        object.__setattr__(self, "check_fn", self.check.fn)


@dataclass(frozen=True)
class CaptureEvent:
    """What observers (kiln.explain, the KILN_DEBUG dump) hear after each capture attempt."""

    fn: FunctionType
    result: Any | None  # the CaptureResult, or None when the frame fell back to eager
    recompile_reason: str | None
    fallback_reason: str | None = None
    unsupported: Unsupported | None = None


@dataclass
class FrameCache:
    """The entries of one code object under one set of options, newest first."""

    code: CodeType
    options: CompileOptions
    entries: list[CacheEntry] = field(default_factory=list)
    policy: Any = None  # kiln.symbolic.policy.DynamicPolicy, made on the first capture
    eager_reason: str | None = None  # set once a frame is known to run eagerly (until reset)
    limit_warned: bool = False
    last_failure: str | None = None
    disk: list | None = None  # persist.DiskEntry candidates not used yet; None until first read
    dropped: int = 0  # entries dropped, an object one compared by identity freed (CheckFn.enter)

    def clear(self) -> None:
        self.entries.clear()
        self.disk = None
        self.dropped = 0
        self.policy = None
        self.eager_reason = None
        self.limit_warned = False
        self.last_failure = None


_CACHES: dict[tuple, FrameCache] = {}
_ROUTERS: dict[tuple, Any] = {}  # (options key, injected tracer) -> skip_frame.Router
_CODE_CALLEES: dict[tuple, Any] = {}  # (code, options key, injected tracer) -> code_callee.CodeCallee
_OBSERVERS: list[Callable[[CaptureEvent], None]] = []
# Held while a miss reads or changes a FrameCache (its entries, its disk candidates, its policy)
# and while it captures: two threads missing on one frame must not both take the same disk entry
# or both capture it. Reentrant: a capture may meet another compiled callable of this thread.
# The glue runs outside it, so compiled frames called from a glue never wait on their caller.
_COMPILE_LOCK = threading.RLock()


def frame_cache(code: CodeType, options: CompileOptions) -> FrameCache:
    key = (code, options.cache_key())
    with _COMPILE_LOCK:
        cache = _CACHES.get(key)
        if cache is None:
            cache = _CACHES[key] = FrameCache(code, options)
        return cache


def reset() -> None:
    """Forget every cache entry, dynamic-shape decision and counter (kiln.reset())."""
    with _COMPILE_LOCK:
        for cache in _CACHES.values():
            cache.clear()  # compiled callables keep a reference to their FrameCache: empty it in place
        _CACHES.clear()
        _ROUTERS.clear()
        _CODE_CALLEES.clear()
        _SHARED_POLICIES.clear()
        for name, default in Stats().as_dict().items():
            setattr(STATS, name, default)


def drop_caches(options: CompileOptions) -> None:
    """Forget the caches made under one set of options (kiln.explain's throwaway compiles)."""
    key = options.cache_key()
    with _COMPILE_LOCK:
        for cache_key in [k for k in _CACHES if k[1] == key]:
            _CACHES.pop(cache_key).clear()
        for callee_key in [k for k in _CODE_CALLEES if k[1] == key]:
            del _CODE_CALLEES[callee_key]


def add_observer(observer: Callable[[CaptureEvent], None]) -> None:
    _OBSERVERS.append(observer)


def remove_observer(observer: Callable[[CaptureEvent], None]) -> None:
    _OBSERVERS.remove(observer)


@contextlib.contextmanager
def observing(observer: Callable[[CaptureEvent], None]) -> Iterator[None]:
    add_observer(observer)
    try:
        yield
    finally:
        remove_observer(observer)


def where(fn: Any) -> str:
    code = getattr(fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code else "<unknown>"


# ---------------------------------------------------------------------------------------------------
# The compiled callable


def compile_function(fn: Any, options: CompileOptions, capture: CaptureFn | None = None) -> Callable[..., Any]:
    """Wrap a Python function or bound method so that each call checks guards and runs compiled code.

    `capture` replaces the tracer (tests inject a fake one); by default it is
    kiln.capture.frame_capture.capture_frame, imported on first use.
    """
    bound_self, has_self = None, False
    if inspect.ismethod(fn):
        bound_self, has_self, fn = fn.__self__, True, fn.__func__
    if not isinstance(fn, FunctionType):
        raise TypeError(f"kiln.compile expects a Python function, method or nn.Module, not {type(fn).__name__}")
    frame = _Frame(fn, options, bound_self, has_self, capture)
    G = fn.__globals__
    entries = frame.cache.entries
    bind = frame.bind
    stats = STATS

    # The hot path: a closure over locals (every attribute load here is paid per call), with the
    # all-positional binding inlined; the binder handles keywords, defaults and methods.
    code = fn.__code__
    names = code.co_varnames[: code.co_argcount]
    nargs = len(names)
    plain = not has_self and not (code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)) \
        and code.co_kwonlyargcount == 0  # all-positional calls of this function bind by position
    locals_of = positional_locals(names)

    def compiled(*args: Any, **kwargs: Any) -> Any:
        if fn.__code__ is not code:
            # New code for the same function object (autoreload, a user assigning __code__): this
            # callable's entries and binder belong to the old code.
            return frame.call_with_new_code(args, kwargs)
        if plain and not kwargs and len(args) == nargs:
            L = locals_of(args)
        else:
            L = bind(args, kwargs)
        for entry in entries:
            if entry.check_fn(L, G, fn):
                stats.cache_hits += 1
                try:  # free in CPython 3.11 until something is raised
                    return entry.glue(L, G, fn)
                except ExternMismatchError as exc:
                    return frame.after_mismatch(exc, args, kwargs)
        return frame.miss(args, kwargs, L)

    if plain or (has_self and nargs and not (code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS))
                 and code.co_kwonlyargcount == 0):
        compiled = _exact_entry(fn, names, compiled, frame, G, stats, (bound_self,) if has_self else ()) or compiled
    functools.update_wrapper(compiled, fn)
    setattr(compiled, COMPILED_MARKER, True)
    setattr(compiled, ORIGINAL_ATTR, fn.__get__(bound_self) if has_self else fn)
    compiled._kiln_frame = frame  # type: ignore[attr-defined]
    return compiled


_MISSING = object()  # an argument _exact_entry's function was not given


def _exact_entry(fn: FunctionType, names: tuple[str, ...], general: Callable[..., Any], frame: "_Frame",
                 G: dict, stats: Any, bound: tuple = ()) -> Callable[..., Any] | None:
    """The compiled callable of an all-positional function as a function of the same parameters:
    `def entry(x=MISSING, y=MISSING, *extra)` binds a call's locals with one dict display, and
    CPython calls it as it calls any plain function (no **kwargs dict, no call into the binder; an
    empty `extra` is the shared empty tuple), a few tenths of a microsecond a call. A call missing an
    argument (a default, a TypeError to raise as eager's), one with too many arguments (eager's
    TypeError text) and a function whose __code__ was replaced since go to `general`, the
    callable compile_function makes for every function. None where the names cannot be written
    (positional-only parameters, names that are not identifiers or are the entry's own). A bound
    method's `bound` self is its first local (`_kiln_self`), never an argument of the call."""
    code = fn.__code__
    if code.co_posonlyargcount or not all(n.isidentifier() and not n.startswith("_kiln_") for n in names):
        return None
    frame_names, names = names, names[len(bound):]
    given = ", ".join(names) + ("," if len(names) == 1 else "")
    missing = "".join(f" or {n} is _kiln_missing" for n in names)
    head = (f"({''.join(f'{n}=_kiln_missing, ' for n in names)}*_kiln_extra):\n"
            f"    if _kiln_extra or _kiln_fn.__code__ is not _kiln_code{missing}:\n"
            f"        return _kiln_general(({given}), _kiln_extra)\n")
    values = ["_kiln_self"] * len(bound) + list(names)
    loop = (f"    _kiln_L = {{{', '.join(f'{n!r}: {v}' for n, v in zip(frame_names, values))}}}\n"
            f"    for _kiln_entry in _kiln_entries:\n"
            f"        if _kiln_entry.check_fn(_kiln_L, _kiln_G, _kiln_fn):\n"
            f"            _kiln_stats.cache_hits += 1\n"
            f"            try:  # free in CPython 3.11 until something is raised\n"
            f"                return _kiln_entry.glue(_kiln_L, _kiln_G, _kiln_fn)\n"
            f"            except _kiln_mismatch as _kiln_exc:\n"
            f"                return _kiln_frame.after_mismatch(_kiln_exc, ({given}), {{}})\n"
            f"    return _kiln_frame.miss(({given}), {{}}, _kiln_L)\n")
    # `entry` runs the loop itself; `fast` (its code swapped in by `refresh`) hands the call to the
    # boundary extension's Entry (kiln.capture.fast_entry), which gives `slow` what it does not answer
    stale = "    if _kiln_frame.cache.dropped != _kiln_drops[0]: _kiln_refresh()\n"  # an entry dropped since
    source = (f"def entry{head}{loop}"
              f"def fast{head}    return _kiln_fast({', '.join(names)})\n"
              f"def again{head}    _kiln_refresh()\n    return _kiln_entry({', '.join(names)})\n"  # the extension loaded
              f"def slow({', '.join(names)}):\n{stale}{loop}")

    def general_of(values: tuple, extra: tuple) -> Any:
        # the call as it was made, as far as it can be told: the arguments up to the first missing
        # one by position, the others by name (every parameter is positional-or-keyword); more
        # positional arguments than parameters (`extra`) raise eager's TypeError there
        if extra:
            return general(*values, *extra)
        k = next((i for i, v in enumerate(values) if v is _MISSING), len(values))
        return general(*values[:k], **{n: v for n, v in zip(names[k:], values[k:]) if v is not _MISSING})

    namespace = {"_kiln_missing": _MISSING, "_kiln_fn": fn, "_kiln_code": code, "_kiln_general": general_of,
                 "_kiln_entries": frame.cache.entries, "_kiln_G": G, "_kiln_stats": stats,
                 "_kiln_mismatch": ExternMismatchError, "_kiln_frame": frame, "_kiln_fast": None,
                 "_kiln_self": bound[0] if bound else None, "_kiln_drops": [0]}
    filename = f"<kiln entry of {fn.__qualname__}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for tracebacks
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102  # identifiers only
    entry, loop_code, fast_code = namespace["entry"], namespace["entry"].__code__, namespace["fast"].__code__
    namespace["_kiln_entry"], again = entry, (entry, namespace["again"].__code__)

    def refresh() -> None:
        """The entry's code for the frame's cache as it is now: the fast entry where every cache
        entry qualifies, the loop otherwise (after each miss, and from `slow` after a drop)."""
        from kiln.capture.fast_entry import native_entry  # with the first capture: not at `import kiln`

        with _COMPILE_LOCK:  # reentrant: a miss holds it already
            entries, namespace["_kiln_drops"][0] = frame.cache.entries, frame.cache.dropped
            fast = None if not (entries and config.fast_entry) else native_entry(
                list(entries), frame_names, bound, G, namespace["slow"], entries, stats, ExternMismatchError,
                lambda exc, args: frame.after_mismatch(exc, args, {}), frame.name, again)
            namespace["_kiln_fast"] = fast  # before the code that reads it
            entry.__code__ = loop_code if fast is None else fast_code

    frame.refresh = namespace["_kiln_refresh"] = refresh
    if frame.cache.entries:  # the code's cache is shared: another compiled function of it filled it
        with _COMPILE_LOCK:
            refresh()
    return entry  # type: ignore[no-any-return]


class _Frame:
    """The slow path of one compiled callable: recompiles, fallbacks, logging."""

    def __init__(self, fn: FunctionType, options: CompileOptions, bound_self: Any, has_self: bool,
                 capture: CaptureFn | None) -> None:
        self.fn = fn
        self.options = options
        self.bound_self = bound_self
        self.has_self = has_self
        self.capture = capture
        self.cache = frame_cache(fn.__code__, options)
        self.bind = make_binder(fn, bound_self, has_self)
        self.successor: Callable[..., Any] | None = None  # compiled for the function's newer code
        self.refresh: Callable[[], None] | None = None  # the exact entry's choice of code (_exact_entry)
        self.skipped: Any = None  # skip_frame._Routed: the function run when the frame is skipped

    def call_with_new_code(self, args: tuple, kwargs: dict) -> Any:
        """Call the compiled callable made for the function's current `__code__` (made once per code)."""
        with _COMPILE_LOCK:
            successor = self.successor
            if successor is None or successor._kiln_frame.cache.code is not self.fn.__code__:  # type: ignore[attr-defined]
                target = self.fn.__get__(self.bound_self) if self.has_self else self.fn
                successor = self.successor = compile_function(target, self.options, self.capture)
        return successor(*args, **kwargs)

    @property
    def name(self) -> str:
        return self.fn.__qualname__

    def run_eagerly(self, args: tuple, kwargs: dict, skip: bool = False) -> Any:
        """The call run by the function itself: its whole subtree eager (the cache limit, a torch
        function mode), or with `skip` as torch.compile runs a frame it gave up: its own code in
        CPython, the frames it calls compiled (kiln.capture.skip_frame)."""
        STATS.fallbacks += 1
        fn = self.skipped_function() if skip else self.fn
        if self.has_self:
            return fn(self.bound_self, *args, **kwargs)
        return fn(*args, **kwargs)

    def skipped_function(self) -> Callable[..., Any]:
        """The function as a skipped frame runs: its call sites routed to compiled callees. Not
        for a generator function: torch.compile compiles nothing while its body runs (after the
        call that made the generator returned)."""
        if self.skipped is None:
            from kiln.capture.skip_frame import _Routed  # with the first frame given up: bytecode is not cheap

            routed = not self.fn.__code__.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE
                                                      | inspect.CO_ASYNC_GENERATOR)
            self.skipped = _Routed(self.fn, router_for(self.options, self.capture).route) if routed else False
        return self.skipped.get() if self.skipped else self.fn

    def wrap_frame(self, fn: Any) -> Callable[..., Any]:
        """Given to the tracer: a resume function or callee, compiled on first call with our options;
        for a code object, the callable `callee(fn, *args)` of every function of that code."""
        if isinstance(fn, CodeType):
            if not _FRAME_READERS.isdisjoint(fn.co_names):
                return _call_as_it_is  # as below: nothing may stand between it and the glue
            return code_callee(fn, self.options, self.capture)
        if not isinstance(fn, FunctionType) and not inspect.ismethod(fn):
            return fn
        if reads_caller_frames(fn):
            return fn  # the entry's own Python frames would stand between it and the glue it reads
        return compile_function(fn, self.options, self.capture)

    def miss(self, args: tuple, kwargs: dict, L: dict) -> Any:
        if torch._C._len_torch_function_stack() and not traceable_modes():
            return self.under_mode(FUNCTION_MODE_ACTIVE, args, kwargs)  # it must see eager's calls (device_context)
        if torch._C._len_torch_dispatch_stack() and user_dispatch_mode() is not None:
            return self.under_mode(DISPATCH_MODE_ACTIVE, args, kwargs)  # and eager's aten ops
        with _COMPILE_LOCK:
            entry = self.entry_for(L)
            if self.refresh is not None:
                self.refresh()
        if entry is None:  # given up (routed), or past the cache limit (its subtree eager, as torch.compile)
            return self.run_eagerly(args, kwargs, skip=self.cache.eager_reason is not None)
        try:
            return entry.glue(L, self.fn.__globals__, self.fn)
        except ExternMismatchError as exc:
            return self.after_mismatch(exc, args, kwargs)

    def under_mode(self, reason: str, args: tuple, kwargs: dict) -> Any:
        """The call run eagerly, whole, because a user's mode is active: said to the observers
        (kiln.explain's fallbacks) and the graph_breaks log, nothing cached (the next call without
        the mode compiles as usual)."""
        if _OBSERVERS or log.enabled("graph_breaks"):
            log.artifact("graph_breaks", f"{self.name} ({where(self.fn)}) runs eagerly: {reason}")
            self.notify(CaptureEvent(self.fn, None, None, reason))
        return self.run_eagerly(args, kwargs)

    def after_mismatch(self, exc: ExternMismatchError, args: tuple, kwargs: dict) -> Any:
        """A graph of this frame got an extern result unlike its fake tensor (a Kiln or fake-impl
        bug, kiln.errors.ExternMismatchError): the frame runs eagerly from now on, with one warning,
        and this call too where nothing was changed yet (the graph is the first thing a glue runs,
        and it wrote no input before the check); else, or under fullgraph=True, the error is raised
        naming the frame. An outer frame's glue had done its own work before calling into this one,
        so it never replays: the error leaves here unclean."""
        clean, exc.clean = exc.clean, False
        if isinstance(exc, DeferredCheckFailed):
            if not clean:
                raise exc  # (never: each entry answers its own frame's checks)
            # a branch to a `raise` that the graph assumed not taken was taken: the frame, which
            # did nothing visible yet, runs eagerly and raises (or returns) what eager does
            STATS.check_reruns += 1
            return self.fn(self.bound_self, *args, **kwargs) if self.has_self else self.fn(*args, **kwargs)
        with _COMPILE_LOCK:
            self.cache.entries.clear()
            self.cache.eager_reason = f"internal error: {exc}"
        if clean and not self.options.fullgraph and config.suppress_errors:
            log.warn(f"kiln: internal error while running {self.name} ({where(self.fn)}); running it eagerly: {exc}")
            return self.run_eagerly(args, kwargs, skip=True)
        exc.add_note(f"(in a graph kiln compiled for {self.name} at {where(self.fn)})")
        raise exc

    def entry_for(self, L: dict) -> CacheEntry | None:
        """The entry that answers this call: one another thread made meanwhile, one from disk, or a
        fresh capture; None when the call runs eagerly. Called under _COMPILE_LOCK."""
        cache = self.cache
        if cache.eager_reason is not None:
            return None
        G, F = self.fn.__globals__, self.fn
        for entry in cache.entries:  # another thread may have added it while this one waited
            if entry.check_fn(L, G, F):
                STATS.cache_hits += 1
                return entry
        reason = None
        if cache.entries:
            failure = cache.entries[0].check.first_failure(L, G, F)
            reason = failure[1] if failure else "guards of every entry failed"
            cache.last_failure = reason
            if len(cache.entries) >= config.cache_size_limit:
                self.warn_limit(reason)
                return None
            self.log_recompile(failure, L, G, F)
        # Not for an injected tracer (its entries are its own), nor under KILN_DEBUG (the debug
        # dump wants each stage of a real capture).
        if config.persistent_cache and self.capture is None and not config.debug:
            loaded = self.load_entry(L)
            if loaded is not None:
                return loaded
        STATS.frames += 1
        return self.capture_entry(L, reason)

    def load_entry(self, L: dict) -> CacheEntry | None:
        """An entry of the persistent frame cache whose guards pass on this call, made current."""
        from kiln.capture import persist

        cache, fn = self.cache, self.fn
        if cache.disk is None:
            cache.disk = persist.candidates(fn.__code__, self.options)
        G = fn.__globals__
        for disk in list(cache.disk):
            if not disk.matches(L) or not disk.check.fn(L, G, fn):
                continue
            cache.disk.remove(disk)  # used once: if it is in memory now, or if it cannot be loaded
            with persist.without_collections():
                try:
                    glue, result = persist.materialize(disk, fn, self.wrap_frame)
                except Exception as exc:  # a kernel library gone from the C++ cache: capture instead
                    log.artifact("cache", f"frame cache: {disk.path} not loaded: {type(exc).__name__}: {exc}")
                    continue
                entry = CacheEntry(disk.check, glue, result)
                if cache.policy is None:
                    cache.policy = _new_policy()
                _note_inputs(cache.policy, disk.check.guards, L, G, fn)
            entry.check.enter(cache, entry)
            STATS.disk_hits += 1
            STATS.graphs += result.graph_count
            log.artifact("cache", f"frame cache hit: {self.name} from {disk.path}")
            return entry
        if cache.disk:
            log.artifact("cache", f"frame cache miss: no stored entry of {self.name} passes its guards")
        return None

    def warn_limit(self, reason: str) -> None:
        if self.cache.limit_warned:
            return
        self.cache.limit_warned = True
        log.warn(
            f"kiln: {self.name} ({where(self.fn)}) reached config.cache_size_limit "
            f"({config.cache_size_limit}) compiled versions; calls that match none of them now run "
            f"eagerly. Last failing guard: {reason}. If a size keeps changing, use "
            f"kiln.mark_dynamic or dynamic=True.")

    def log_recompile(self, failure: tuple[Guard, str] | None, L: dict, G: dict, F: Any) -> None:
        if failure is None or not log.enabled("recompiles"):
            return
        decision = self.dynamic_decision(failure, L, G, F)
        text = f"Recompiling {self.name} ({where(self.fn)}): {failure[1]}"
        if decision:
            text += f"; {decision}"
        log.artifact("recompiles", text)

    def dynamic_decision(self, failure: tuple[Guard, str], L: dict, G: dict, F: Any) -> str | None:
        """What automatic dynamic will do about the size, int or float whose guard failed, in words."""
        policy = self.cache.policy
        if policy is None:
            return None
        guard = failure[0]
        if guard.kind not in ("check_tensor", "check_value"):
            return None
        try:
            value = eval(guard.source, {"L": L, "G": G, "F": F})
        except Exception:
            return None
        if guard.kind == "check_value":
            if type(guard.expected) is type(value) and type(value) in (int, float):
                return policy.explain_change(guard.source, guard.expected, value)
            return None
        if not isinstance(value, torch.Tensor) or value.dim() != len(guard.expected.sizes):
            return None
        new = tuple(value.shape)
        old = tuple(n if o is None else o for o, n in zip(guard.expected.sizes, new))
        return policy.explain_change(guard.source, old, new) if old != new else None

    def capture_entry(self, L: dict, recompile_reason: str | None) -> CacheEntry | None:
        cache, options, fn = self.cache, self.options, self.fn
        capture = self.capture or _default_capture()
        if cache.policy is None:
            cache.policy = _policy_of(cache)
        try:
            # A capture leaves the thread's dispatch key sets as it found them, whatever it raised
            # through: one resume capture (is_same_size, equal, allclose in a tuple) left Python and
            # the keys below it excluded, and the next fake op crashed the process.
            with compile_time.frame(self.name), torch._C._PreserveDispatchKeyGuard(), \
                    caller_saved_tensor_hooks_suspended():
                result = capture(fn, L, options, self.wrap_frame, policy=cache.policy)
            if result.breaks and options.fullgraph:
                raise GraphBreakError(str(result.breaks[0]))
            check = compile_guards(with_entry_guards(result.guards, L, fn.__globals__, fn))
            if not check.fn(L, fn.__globals__, fn):
                # Otherwise every call would recompile: a tracer bug, reported as an internal error.
                failure = check.first_failure(L, fn.__globals__, fn)
                why = failure[1] if failure else "the generated check returns False"
                raise AssertionError(f"the guards of a fresh capture fail on its own inputs: {why}")
        except (GraphBreakError, symbolic.ConstraintViolation):  # read only when something was raised
            # a user error (a mark_dynamic dim the program specialized) is the user's to see, as in torch.compile
            raise
        except Unsupported as exc:
            if options.fullgraph:
                raise GraphBreakError(f"{where(fn)}: {self.name}: {exc.reason}") from exc
            self.fall_back(f"unsupported: {exc.reason}", recompile_reason, exc)
            return None
        except Exception as exc:
            if options.fullgraph or not config.suppress_errors:
                exc.add_note(f"(while kiln compiled {self.name} at {where(fn)})")
                raise
            log.warn(f"kiln: internal error while compiling {self.name} ({where(fn)}); running it eagerly: "
                     f"{type(exc).__name__}: {exc}")
            self.fall_back(f"internal error: {type(exc).__name__}: {exc}", recompile_reason)
            return None
        from kiln.capture.code import is_resume_code  # loaded with the tracer already; bytecode is not cheap

        if not result.graphs and not result.breaks and not result.traced_tensor_ops and not options.fullgraph \
                and not is_resume_code(fn.__code__):
            # As torch.compile: a frame in which no op was traced runs eagerly from now on; its glue
            # could only be slower than the frame itself, and later calls are not captured again.
            # A frame whose tensor ops were all unused this time keeps a guarded entry: other
            # inputs may use them.
            # Not a resume function: the one of a loop is the same code object for every iteration,
            # and its last (the loop ran out, nothing left to trace) must not make every later
            # iteration eager; that capture keeps a guarded entry like any other.
            self.fall_back("no tensor ops were traced", recompile_reason, quiet=True)
            return None
        _note_inputs(cache.policy, check.guards, L, fn.__globals__, fn)
        entry = CacheEntry(check, result.glue, result)
        if cache.entries:
            STATS.recompiles += 1
        STATS.compiles += 1
        STATS.graphs += len(result.graphs)
        STATS.graph_breaks += len(result.breaks)
        entry.check.enter(cache, entry)  # newest first: after automatic dynamic it is the most general
        if config.persistent_cache and self.capture is None:
            from kiln.capture import persist

            persist.store(fn.__code__, options, check, result, (L, fn.__globals__, fn))
        self.notify(CaptureEvent(fn, result, recompile_reason))
        return entry

    def fall_back(self, reason: str, recompile_reason: str | None, exc: Unsupported | None = None,
                  quiet: bool = False) -> None:
        self.cache.eager_reason = reason
        message = f"{self.name} ({where(self.fn)}) runs eagerly: {reason}"
        if quiet:
            log.debug("capture", message)
        else:
            log.artifact("graph_breaks", message)
        self.notify(CaptureEvent(self.fn, None, recompile_reason, reason, exc))
        return None

    def notify(self, event: CaptureEvent) -> None:
        for observer in list(_OBSERVERS):
            observer(event)


def router_for(options: CompileOptions, capture: CaptureFn | None) -> Any:
    """The one skip_frame.Router of these options: the callees of every frame given up under them
    are compiled with them, each callee's compiled callable made once."""
    key = (options.cache_key(), capture)
    router = _ROUTERS.get(key)
    if router is None:
        from kiln.capture.skip_frame import Router

        router = _ROUTERS[key] = Router(lambda fn: compile_function(fn, options, capture), _skipped_callee)
    return router


def code_callee(code: CodeType, options: CompileOptions, capture: CaptureFn | None) -> Any:
    """The one code_callee.CodeCallee of a code object under these options: the compiled callable
    of each function object made from `code` (an inner def made anew by each call of its maker)."""
    key = (code, options.cache_key(), capture)
    callee = _CODE_CALLEES.get(key)
    if callee is None:
        from kiln.capture.code_callee import CodeCallee

        with _COMPILE_LOCK:
            callee = _CODE_CALLEES.get(key)
            if callee is None:
                callee = _CODE_CALLEES[key] = CodeCallee(code, options, capture)
    return callee


def _call_as_it_is(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def _skipped_callee(compiled: Any) -> Callable[..., Any] | None:
    """For a compiled callee given up for good: its skipped function, called straight from the
    routed call site (a recursion through a skipped frame adds no entry frames per level)."""
    frame = getattr(compiled, "_kiln_frame", None)
    if frame is None or frame.cache.eager_reason is None or frame.fn.__code__ is not frame.cache.code:
        return None
    STATS.fallbacks += 1
    return frame.skipped_function()


def with_entry_guards(guards: list[Guard], L: dict, G: dict, F: Any) -> list[Guard]:
    """The capture's guards plus the two the entry adds to every capture: the global state
    (default dtype, autocast) and one check_aliasing guard over every tensor guarded (which of them
    were the same object must stay so: torch.compile's duplicate-input / no-aliasing guards)."""
    guards = list(guards)
    if not any(g.kind == "check_global_state" for g in guards):
        guards.append(Guard("", "check_global_state", GlobalState.now()))
    sources = list(dict.fromkeys(g.source for g in guards if g.kind == "check_tensor"))
    if len(sources) < 2:
        return guards
    env = {"L": L, "G": G, "F": F}
    try:
        values = [eval(src, env) for src in sources]
    except Exception:  # a source that cannot be read fails its own guard just after; nothing to add
        return guards
    alias = aliasing_guard(sources, values)
    return guards + ([alias] if alias is not None else [])


def _note_inputs(policy: Any, guards: list[Guard], L: dict, G: dict, F: Any) -> None:
    """Show the policy the sizes and ints this capture specialized on (read back through the guards),
    so that the next capture of this code object makes symbolic exactly what changed since."""
    if policy is None:
        return
    env = {"L": L, "G": G, "F": F}
    for guard in guards:
        is_int = guard.kind == "check_value" and type(guard.expected) is int
        # a float guarded by type was a symbol of that capture (one from the disk cache, too)
        is_float = guard.kind in ("check_value", "check_type") and float in (type(guard.expected), guard.expected)
        if guard.kind != "check_tensor" and not is_int and not is_float:
            continue
        try:
            value = read_source(guard.source, env)
        except Exception:  # the guard passed a moment ago, so this does not happen; never fatal here
            continue
        if is_float:
            if type(value) is float:
                policy.note_float(guard.source, value, symbolic=guard.kind == "check_type")
        elif is_int:
            policy.note_int(guard.source, value)
        else:
            policy.note_sizes(guard.source, value)


def _default_capture() -> CaptureFn:
    from kiln.capture.frame_capture import capture_frame  # the tracer imports this module's users lazily
    # rules that register themselves with the tracer's modules (optimizers, foreach calls with
    # tensor scalars): imported from here, outside the modules they extend
    from kiln.capture.variables import foreach, optimizer  # noqa: F401

    return capture_frame


# Resume functions of one user function over the same variables share one policy: the two
# branches of a data-dependent `if` resume in two code objects, and torch.compile (one resume
# function for both) makes an int or a size dynamic once it changes in either of them.
_SHARED_POLICIES: dict[tuple, Any] = {}


def _policy_of(cache: FrameCache) -> Any:
    from kiln.capture.code import origin_of  # a capture is under way: the tracer loaded it already

    origin = origin_of(cache.code)
    if origin is None:
        return _new_policy()
    key = (origin, cache.code.co_varnames[:cache.code.co_argcount], cache.options.cache_key())
    policy = _SHARED_POLICIES.get(key)
    if policy is None:
        policy = _SHARED_POLICIES[key] = _new_policy()
    return policy


def _new_policy() -> Any:
    try:
        from kiln.symbolic.policy import DynamicPolicy
    except ImportError:
        return None
    return DynamicPolicy()


def frames_of(compiled: Callable[..., Any]) -> FrameCache:
    """The FrameCache behind a callable returned by compile_function (to inspect its entries: guards, glue, graphs)."""
    return compiled._kiln_frame.cache  # type: ignore[attr-defined]

