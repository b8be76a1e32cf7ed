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
import types
from typing import Any, Callable, Mapping, TypeVar, cast

import torch

from kiln import backends, compile_time
from kiln.capture import breaks, distributed, entry
from kiln.capture.options import CompileOptions
from kiln.capture.trace_rules import ALLOW_IN_GRAPH_MARKER, COMPILED_MARKER, DISABLE_MARKER, ORIGINAL_ATTR, is_disabled
from kiln.capture.trace_rules import graph_break  # re-exported: kiln.graph_break()

T = TypeVar("T")
_MODULE_CALL = torch.nn.Module.__call__
_MISSING = object()
_module_hooks = torch.nn.modules.module  # its global hook dicts, read on every call of a compiled module


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
        launches on CUDA and on CPU compiles a graph's variants, keeping the fastest (kiln.runtime.plan).
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
    """An nn.Module whose call runs compiled; everything else is the original module's.

    As torch.compile's wrapper: the original is the submodule `_orig_mod` (so parameters(),
    state_dict() with keys prefixed `_orig_mod.`, to() and train()/eval() act on it), `training`
    is the original's, and every other attribute is read from, written to and deleted on the
    original (`opt.step += 1` changes what the compiled forward reads); dir() lists the
    original's attributes. A class that overrides `__call__` has its override compiled; otherwise
    the forward is compiled and the original's hooks run around it as Module.__call__ runs them
    (backward hooks included). Pickling, torch.save and copy.deepcopy rebuild it from the original
    and the compile arguments.
    """

    # The wrapper's own state; any other name is the original module's.
    _OWN_ATTRIBUTES = frozenset({"_orig_mod", "_kiln_options", "_kiln_capture", "_kiln_forward_of",
                                 "_kiln_forward", "_kiln_initialized", "__dict__", "forward"})

    def __init__(self, mod: torch.nn.Module, options: CompileOptions, capture: Callable[..., Any] | None = None) -> None:
        # Before Module.__init__: `training` (set there) and every other attribute read or write
        # reaches the original through `_orig_mod`.
        object.__setattr__(self, "_orig_mod", mod)
        object.__setattr__(self, "_kiln_initialized", False)
        super().__init__()
        self._orig_mod = mod  # now registered as the submodule
        self._kiln_options = options
        self._kiln_capture = capture
        self._kiln_forward_of = _call_target_of(mod)
        self._kiln_forward = _compiled_forward(mod, options, capture)
        object.__setattr__(self, "_kiln_initialized", True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The wrapper is not one of the program's modules: global hooks (register_module_forward_hook)
        # run once, around the original, as forward runs them; Module.__call__ on the wrapper would
        # run them a second time around the wrapper. Hooks registered on the wrapper itself run there.
        if (self._forward_hooks or self._forward_pre_hooks or self._backward_hooks or self._backward_pre_hooks
                or self._forward_hooks_always_called):
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # Paid on every call before the compiled forward's guards: the original is read from
        # `_modules` (`self._orig_mod` misses the instance dict and goes through __getattr__) and the
        # class's `__call__` is looked up once.
        mod = cast(torch.nn.Module, self._modules["_orig_mod"])
        overrides, target = _call_target(mod)
        if target is not self._kiln_forward_of:
            # `Net.forward = ...` (or autoreload replacing the class) after compile: eager would
            # call the new forward, so compile that one.
            self._kiln_forward_of = target
            self._kiln_forward = _compiled_forward(mod, self._kiln_options, self._kiln_capture)
        if overrides:
            return self._kiln_forward(*args, **kwargs)  # the class's own __call__, compiled
        if mod._backward_hooks and mod._is_full_backward_hook is False:
            # register_backward_hook (the legacy kind) hooks the last autograd node the forward
            # makes, which only eager's forward makes: run eagerly, as torch.compile does
            return mod(*args, **kwargs)
        if _needs_module_call(mod):
            # backward hooks (or hooks that must run even when forward raises): Module.__call__
            # itself runs them, around the compiled forward
            with distributed.compiled_forward_of(mod, self._kiln_forward):
                return mod(*args, **kwargs)
        if mod._forward_hooks or mod._forward_pre_hooks or _has_global_hooks():
            return _call_with_hooks(mod, self._kiln_forward, args, kwargs)
        return self._kiln_forward(*args, **kwargs)

    @property  # type: ignore[override]  # Module declares a plain attribute
    def training(self) -> bool:
        return self._orig_mod.training

    @training.setter
    def training(self, value: bool) -> None:
        if self.__dict__.get("_kiln_initialized"):  # Module.__init__'s default is not the original's
            self._orig_mod.training = value

    def __getattr__(self, name: str) -> Any:
        if name == "_orig_mod":
            # Read through __dict__: during unpickling or deepcopy `_modules` may not exist yet,
            # and `self._modules` would come back here forever.
            modules = self.__dict__.get("_modules", {})
            if "_orig_mod" in modules:
                return modules["_orig_mod"]
            raise AttributeError(name)
        return getattr(self._orig_mod, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in OptimizedModule._OWN_ATTRIBUTES or hasattr(type(self), name) or not self.__dict__.get("_kiln_initialized"):
            super().__setattr__(name, value)
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        if name in OptimizedModule._OWN_ATTRIBUTES or hasattr(type(self), name):
            super().__delattr__(name)
        else:
            delattr(self._orig_mod, name)

    def __dir__(self) -> list[str]:
        own = list(self._orig_mod.__dir__())
        return own + [name for name in super().__dir__() if name not in own]

    def __len__(self) -> int:
        if hasattr(type(self._orig_mod), "__len__"):
            return len(self._orig_mod)  # type: ignore[arg-type]
        raise TypeError(f"object of type {type(self._orig_mod).__name__!r} has no len()")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The compiled callables and caches are not data: rebuilt from the original and the arguments.
        options = self._kiln_options
        return (_rebuild, (self._orig_mod, options.backend, options.fullgraph, options.dynamic, options.mode,
                           dict(options.options), self._kiln_capture))


def _rebuild(mod: torch.nn.Module, backend: Any, fullgraph: bool, dynamic: bool | None, mode: str | None,
             options: dict[str, Any], capture: Callable[..., Any] | None) -> OptimizedModule:
    """An OptimizedModule again from what __reduce__ kept (unpickling, torch.load, deepcopy)."""
    compiler = backends.lookup(backend, mode=mode, options=options or None)
    compile_options = CompileOptions(backend=backend, compiler=compiler, fullgraph=fullgraph, dynamic=dynamic,
                                     mode=mode, options=options)
    return OptimizedModule(mod, compile_options, capture)


def _compiled_forward(mod: torch.nn.Module, options: CompileOptions, capture: Callable[..., Any] | None) -> Any:
    if distributed.is_ddp(mod):
        # DDP's forward is the reducer's Python, which capture does not trace (as Dynamo skips it):
        # it runs as it is around the compiled forward of the module it wraps.
        wrapped = mod.module
        assert isinstance(wrapped, torch.nn.Module)  # DDP's constructor stores the module it wraps
        return distributed.DDPForward(mod, entry.compile_function(wrapped.forward, options, capture))
    if _overrides_call(mod):
        # torch.compile compiles `mod.__call__`: a class's own __call__ (`5 * self.forward(x)`) is
        # what calling the module runs, hooks or not
        return entry.compile_function(mod.__call__, options, capture)
    forward = mod.forward
    if inspect.ismethod(forward) or inspect.isfunction(forward):
        return entry.compile_function(forward, options, capture)
    # an instance attribute `self.forward = functools.partial(self._impl, ...)` or a callable object:
    # compiled as kiln.compile compiles it; a builtin (`m.forward = torch.relu`) has no frame to capture
    try:
        return compile_with(forward, options, capture)
    except TypeError:
        return forward


def _class_call(klass: type) -> Any:
    """The raw `__call__` entry of `klass`'s MRO, as inspect.getattr_static(klass, "__call__") finds
    it: walked here for classes whose metaclass is `type` (the MRO and every class __dict__ are then
    the real ones; getattr_static costs microseconds per call of a compiled module), else asked."""
    if type(klass) is type:
        for base in klass.__mro__:
            found = base.__dict__.get("__call__", _MISSING)
            if found is not _MISSING:
                return found
    return inspect.getattr_static(klass, "__call__", None)


def _call_target(mod: torch.nn.Module) -> tuple[bool, Any]:
    """(whether the class overrides Module.__call__, what calling `mod` compiles), without making a
    bound method: the class's own __call__, an instance forward, or the class's forward."""
    klass = type(mod)
    call = _class_call(klass)
    if isinstance(call, types.FunctionType) and call is not _MODULE_CALL:
        return True, call
    return False, mod.__dict__.get("forward") or getattr(klass, "forward", None)


def _overrides_call(mod: torch.nn.Module) -> bool:
    return _call_target(mod)[0]


def _call_target_of(mod: torch.nn.Module) -> Any:
    return _call_target(mod)[1]


def _needs_module_call(mod: torch.nn.Module) -> bool:
    """Hooks only Module.__call__ runs as eager does: backward hooks and pre-hooks (they wrap the
    forward's inputs and outputs in autograd nodes), and forward hooks marked always_call."""
    hooks = _module_hooks
    return bool(mod._backward_hooks or mod._backward_pre_hooks or mod._forward_hooks_always_called
                or hooks._global_backward_hooks or hooks._global_backward_pre_hooks
                or hooks._global_forward_hooks_always_called)


def _has_global_hooks() -> bool:
    hooks = _module_hooks
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
    global_with_kwargs = getattr(hooks, "_global_forward_hooks_with_kwargs", {})
    for hook_id, hook in post:
        if hook_id in mod._forward_hooks_with_kwargs or hook_id in global_with_kwargs:
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

