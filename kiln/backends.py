"""Backends: what turns a captured FX graph into something callable (the torch.compile backend contract).

A backend is `backend(gm: fx.GraphModule, example_inputs) -> callable`; capture calls it once per
graph. Built in: "eager" (run the captured graph as is), "aot_eager" (kiln.autograd, ATen graphs run
eagerly) and "inductor" (kiln.autograd + kiln.lower, the whole stack; also usable as a backend of
the real torch.compile as `kiln.inductor_backend`). Corresponds to torch/_dynamo/backends/registry.py.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import torch

from kiln import config
from kiln.runtime import plan

Backend = Callable[[torch.fx.GraphModule, list], Callable[..., Any]]

_REGISTRY: dict[str, Backend] = {}

# Diagnostics wrap the inductor's compilers through this table; kiln.debug fills it (no stage imports
# kiln.debug). A hook takes and returns (make_backend, fw_compiler, bw_compiler), where
# make_backend(fw_compiler, bw_compiler) -> backend is AOT autograd or a wrapper around it.
InductorHook = Callable[[Callable[..., Any], Callable[..., Any], Callable[..., Any]],
                        tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]]
_INDUCTOR_HOOKS: list[InductorHook] = []


def add_inductor_hook(hook: InductorHook) -> None:
    """Register a hook around the inductor's compilers (idempotent; hooks apply in this order)."""
    if hook not in _INDUCTOR_HOOKS:
        _INDUCTOR_HOOKS.append(hook)


def register_backend(name: str | Backend | None = None, fn: Backend | None = None) -> Any:
    """Register a backend under a name: `register_backend("mine", fn)`, or as a decorator
    (`@register_backend` uses the function's name, `@register_backend("mine")` a given one)."""
    if callable(name) and fn is None:
        return register_backend(name.__name__, name)
    if fn is None:
        return lambda f: register_backend(name or f.__name__, f)
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_backend: the name must be a non-empty string, not {name!r}")
    if name in _REGISTRY and _REGISTRY[name] is not fn:
        raise ValueError(f"register_backend: a backend named {name!r} is already registered")
    _REGISTRY[name] = fn
    return fn


def list_backends() -> list[str]:
    """The names accepted by kiln.compile(backend=...)."""
    return sorted(_REGISTRY)


def lookup(backend: str | Backend, *, mode: str | None = None, options: Mapping[str, Any] | None = None) -> Backend:
    """The callable for a backend name or a backend callable; `mode`/`options` go to "inductor"."""
    if callable(backend):
        if options:
            raise ValueError("kiln.compile: options=... is only for the built-in backends, not a callable backend")
        return backend
    if backend not in _REGISTRY:
        raise ValueError(f"kiln.compile: unknown backend {backend!r}; known backends: {', '.join(list_backends())}")
    fn: Callable[..., Any] = _REGISTRY[backend]  # "inductor" also takes mode= and options=
    if backend == "inductor" and (mode not in (None, "default") or options):
        return functools.partial(fn, mode=mode, options=dict(options or {}))
    return fn


@register_backend
def eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    """Run the captured torch-level graph as is (its generated forward, skipping fx's call wrapper)."""
    return gm.forward


@register_backend
def aot_eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    """AOT autograd down to ATen, then run the ATen graphs eagerly."""
    from kiln.autograd import aot_eager as run_aot_eager  # on first use: a warm start may never need it

    from kiln.autograd.cond import compile_conds, has_cond

    if has_cond(gm):  # graph-level conds: each piece and branch through AOT autograd on its own
        return compile_conds(gm, example_inputs, run_aot_eager)
    return run_aot_eager(gm, example_inputs)


@register_backend
def inductor(gm: torch.fx.GraphModule, example_inputs: list, *, mode: str | None = None,
             options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """The whole stack: AOT autograd, then kiln.lower's compile_graph for forward and backward.

    Also a backend of the real torch.compile: pass `kiln.inductor_backend` as its `backend` argument.
    """
    # Loaded on first use (sympy, the tracer): a warm start served from the disk cache never needs them.
    from kiln.autograd import aot_autograd
    from kiln.lower import LoweringCompiler

    lower_options = dict(options or {})
    if mode not in (None, "default"):
        lower_options["mode"] = mode  # the lowering resolves its plan per graph from it (kiln.runtime.plan)
    compiler: Callable[..., Any] = LoweringCompiler(lower_options or None)
    fw_compiler = bw_compiler = compiler
    if plan.resolve(mode).cuda_graphs:  # on CUDA tensors; on CPU the plan builds the native wrapper instead
        from kiln.runtime import cudagraphs

        shared: dict[str, Any] = {}  # the forward and backward of this frame record into one pool
        fw_compiler = cudagraphs.wrap_compiler(compiler, shared, "forward")
        bw_compiler = cudagraphs.wrap_compiler(compiler, shared, "backward")
    make_backend: Callable[..., Any] = aot_autograd
    for hook in _INDUCTOR_HOOKS:  # diagnostics (run report, repro) when their setting is on
        make_backend, fw_compiler, bw_compiler = hook(make_backend, fw_compiler, bw_compiler)
    backend = make_backend(fw_compiler, bw_compiler)
    from kiln.autograd.cond import compile_conds, has_cond

    if has_cond(gm):  # graph-level conds: each piece and branch compiled on its own
        return compile_conds(gm, example_inputs, backend)
    return backend(gm, example_inputs)


inductor_backend = inductor


class CountingBackend:
    """A backend that records every graph it is given and runs it eagerly (tests and explain use it)."""

    def __init__(self, inner: Backend | None = None) -> None:
        self.inner = inner or eager
        self.graphs: list[torch.fx.GraphModule] = []
        self.example_inputs: list[list] = []
        self.__name__ = "counting"

    @property
    def frame_count(self) -> int:
        return len(self.graphs)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        self.graphs.append(gm)
        self.example_inputs.append(list(example_inputs))
        return self.inner(gm, example_inputs)
