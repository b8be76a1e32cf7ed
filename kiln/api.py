"""The public API: kiln.compile and its companions, mirroring torch.compile so that habits carry over.

`compile` wraps a function, a bound method or an nn.Module (which stays an nn.Module) in the frame
entry of kiln.capture.entry; `disable`/`allow_in_graph` set the markers the tracer reads; `reset`
and `stats` reach the entry's caches and counters. Corresponds to torch/__init__.py's compile and
torch/_dynamo/eval_frame.py's OptimizedModule, disable and reset.
"""
from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, Mapping, TypeVar

import torch

from kiln import backends, compile_time
from kiln.capture import breaks, distributed, entry
from kiln.capture.options import (
    ALLOW_IN_GRAPH_MARKER,
    COMPILED_MARKER,
    DISABLE_MARKER,
    ORIGINAL_ATTR,
    CompileOptions,
    is_disabled,
)

T = TypeVar("T")


def compile(model: Any = None, *, fullgraph: bool = False, dynamic: bool | None = None,
            backend: str | Callable[..., Any] = "inductor", mode: str | None = None,
            options: Mapping[str, Any] | None = None, disable: bool = False) -> Any:
    """Compile a function, bound method or nn.Module; usable as `@kiln.compile` and `@kiln.compile(...)`.

    fullgraph: raise kiln.errors.GraphBreakError at the first graph break instead of splitting.
    dynamic: False (static sizes), True (symbolic from the start), None (automatic dynamic).
    backend: "eager", "aot_eager", "inductor", a registered name, or a callable (gm, example_inputs).
    mode: None/"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs".
        "reduce-overhead" under "inductor" replays CUDA graphs for CUDA tensors, and on CPU runs
        each graph through the native wrapper (one generated C++ function per graph, not one Python
        line and ctypes call per kernel; kiln.config.cpu_wrapper). "max-autotune" tunes Triton
        launches on CUDA; on CPU the max-autotune modes run the default path.
    options: a dict for the "inductor" backend, keys from kiln.capture.options.INDUCTOR_OPTIONS
        ("verify", "opt_level", "no_decompose", "aten_fallback", "no_fusion"); other backends take none.
    A bad value of any argument raises TypeError/ValueError here, not at the first call.
    disable: return `model` unchanged (a switch to turn compilation off without editing call sites).
    """
    # Every argument is checked here, also in the decorator form, before anything is compiled.
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(f"kiln.compile: options must be a dict, not {type(options).__name__}")
    if mode is not None and options:
        raise ValueError("kiln.compile: give either mode or options, not both (as torch.compile)")
    CompileOptions(backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode, options=dict(options or {}))
    compiler = backends.lookup(backend, mode=mode, options=options)
    if model is None:
        return lambda m: compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                                 options=options, disable=disable)
    compile_options = CompileOptions(
        backend=backend, compiler=compiler,
        fullgraph=fullgraph, dynamic=dynamic, mode=mode, options=dict(options or {}),
    )
    if disable:
        return model
    return compile_with(model, compile_options)


def compile_with(model: Any, options: CompileOptions, capture: Callable[..., Any] | None = None) -> Any:
    """kiln.compile with ready options; `capture` replaces the tracer (tests inject a fake one)."""
    if isinstance(model, OptimizedModule):
        model = model._orig_mod  # compiling (or explaining) a compiled module starts from the original
    if isinstance(model, torch.nn.Module):
        return OptimizedModule(model, options, capture)
    if getattr(model, COMPILED_MARKER, False):
        model = getattr(model, ORIGINAL_ATTR)  # compiling twice compiles the original once more
    if is_disabled(model):
        return model
    if inspect.ismethod(model) or inspect.isfunction(model):
        return entry.compile_function(model, options, capture)
    if isinstance(model, functools.partial):
        inner = compile_with(model.func, options, capture)
        return functools.partial(inner, *model.args, **model.keywords)
    if callable(model) and inspect.ismethod(getattr(model, "__call__", None)):
        return entry.compile_function(model.__call__, options, capture)
    raise TypeError(f"kiln.compile: cannot compile {type(model).__name__!r}; expected a function, "
                    f"a method or an nn.Module")


class OptimizedModule(torch.nn.Module):
    """An nn.Module whose forward runs compiled; everything else is the original module's.

    The original is registered as the submodule `_orig_mod` (as torch.compile does), so parameters(),
    state_dict() (keys prefixed `_orig_mod.`), train()/eval(), to() and hooks on the original act on
    the original; any other attribute is read from the original.
    """

    def __init__(self, mod: torch.nn.Module, options: CompileOptions, capture: Callable[..., Any] | None = None) -> None:
        super().__init__()
        self._orig_mod = mod
        self._kiln_options = options
        self._kiln_capture = capture
        self._kiln_forward_of = _forward_of(mod)
        self._kiln_forward = _compiled_forward(mod, options, capture)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mod = self._orig_mod
        if _forward_of(mod) is not self._kiln_forward_of:
            # `Net.forward = ...` (or autoreload replacing the class) after compile: eager would
            # call the new forward, so compile that one.
            self._kiln_forward_of = _forward_of(mod)
            self._kiln_forward = _compiled_forward(mod, self._kiln_options, self._kiln_capture)
        if mod._forward_hooks or mod._forward_pre_hooks or _has_global_hooks():
            return _call_with_hooks(mod, self._kiln_forward, args, kwargs)
        return self._kiln_forward(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            # Read through __dict__: during unpickling or deepcopy `_modules` may not exist yet, and
            # `self._modules` would come back here forever.
            orig = self.__dict__.get("_modules", {}).get("_orig_mod")
            if orig is None:
                raise
            return getattr(orig, name)

    def __repr__(self) -> str:
        return f"OptimizedModule({self._orig_mod!r}, backend={self._kiln_options.backend_name!r})"


def _compiled_forward(mod: torch.nn.Module, options: CompileOptions, capture: Callable[..., Any] | None) -> Any:
    if distributed.is_ddp(mod):
        # DDP's forward is the reducer's Python, which capture does not trace (as Dynamo skips it):
        # it runs as it is around the compiled forward of the module it wraps.
        wrapped = mod.module
        assert isinstance(wrapped, torch.nn.Module)  # DDP's constructor stores the module it wraps
        return distributed.DDPForward(mod, entry.compile_function(wrapped.forward, options, capture))
    return entry.compile_function(mod.forward, options, capture)


def _forward_of(mod: torch.nn.Module) -> Any:
    """What `mod.forward` resolves to, without making a bound method: an instance attribute or the
    class's function."""
    return mod.__dict__.get("forward") or getattr(type(mod), "forward", None)


def _has_global_hooks() -> bool:
    hooks = torch.nn.modules.module
    return bool(hooks._global_forward_hooks or hooks._global_forward_pre_hooks)


def _call_with_hooks(mod: torch.nn.Module, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    # The original module's own forward hooks, which torch runs in Module._call_impl around forward;
    # the compiled forward replaces only the forward call itself.
    hooks = torch.nn.modules.module
    pre = list(hooks._global_forward_pre_hooks.items()) + list(mod._forward_pre_hooks.items())
    for hook_id, hook in pre:
        if hook_id in mod._forward_pre_hooks_with_kwargs:
            result = hook(mod, args, kwargs)
            if result is not None:
                args, kwargs = result
        else:
            result = hook(mod, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    output = forward(*args, **kwargs)
    post = list(hooks._global_forward_hooks.items()) + list(mod._forward_hooks.items())
    for hook_id, hook in post:
        if hook_id in mod._forward_hooks_with_kwargs:
            result = hook(mod, args, kwargs, output)
        else:
            result = hook(mod, args, output)
        if result is not None:
            output = result
    return output


def disable(fn: Callable[..., T] | None = None, recursive: bool = True) -> Any:
    """A copy of `fn` that capture never traces: calls to it run natively (a graph break).

    Usable as `@kiln.disable`. `fn` itself is left as it was (other callers may still be traced,
    as with torch._dynamo.disable); a callable returned by kiln.compile is unwrapped to its original.
    `recursive` is accepted for torch._dynamo.disable's signature: kiln never captures frames
    called from a disabled function (there is no frame hook to re-enter capture), so both mean the same.
    """
    if fn is None:
        return lambda f: disable(f, recursive)
    if getattr(fn, COMPILED_MARKER, False):
        fn = getattr(fn, ORIGINAL_ATTR)
    if getattr(fn, DISABLE_MARKER, False):
        return fn
    return _marked_wrapper(fn, DISABLE_MARKER)


def allow_in_graph(fn: Callable[..., T]) -> Callable[..., T]:
    """Mark `fn` so that capture puts each call to it into the graph as one node, untraced.

    Like torch._dynamo.allow_in_graph this marks `fn` itself, so every caller sees it.
    """
    try:
        setattr(fn, ALLOW_IN_GRAPH_MARKER, True)
        return fn
    except (AttributeError, TypeError):  # builtins and bound methods take no attributes: wrap them
        return _marked_wrapper(fn, ALLOW_IN_GRAPH_MARKER)


def _marked_wrapper(fn: Any, marker: str) -> Any:
    @functools.wraps(fn)
    def marked(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    setattr(marked, marker, True)
    return marked


def reset() -> None:
    """Clear every compiled cache entry, dynamic-shape decision, one-time warning and counter.

    Entries stored on disk by the persistent frame cache stay (as torch's on-disk caches do): the
    next call may load one instead of capturing; kiln.config.persistent_cache=False prevents it."""
    entry.reset()
    compile_time.reset()
    breaks.reset()  # graph breaks are logged once per reset
    # A stage that was never imported (a warm start served from the persistent cache) has nothing
    # to forget; importing it here would only slow `kiln.reset()` down.
    policy = sys.modules.get("kiln.symbolic.policy")
    if policy is not None:
        policy.reset_policies()
    code = sys.modules.get("kiln.capture.code")
    if code is not None:
        code.reset()  # resume code objects are rebuilt, so no cache keyed by an old one survives
    fake_cache = sys.modules.get("kiln.fake.cache")
    if fake_cache is not None:
        fake_cache.clear()  # fake-op output metadata memoized by input shapes
    store = sys.modules.get("kiln.runtime.store")
    if store is not None:
        store.forget_verdicts()  # a cache directory fixed (or broken) since is judged again


def stats() -> dict[str, int | float]:
    """Counters since the last reset: frames, compiles, recompiles, graphs, graph_breaks,
    cache_hits, fallbacks (see kiln.capture.entry.Stats)."""
    counters: dict[str, int | float] = dict(entry.STATS.as_dict())
    # seconds per compile stage, summed over frames (kiln.compile_time): "compile_time.capture",
    # "compile_time.aot", "compile_time.lower.schedule", "compile_time.build", ...
    counters.update({f"compile_time.{name}": s for name, s in compile_time.totals().items()})
    return counters

