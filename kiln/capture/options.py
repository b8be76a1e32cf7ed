"""The frozen options of one `kiln.compile` call, and the marker attributes capture looks for.

`CompileOptions` travels from kiln.api through the entry into the tracer (and from there to every
resume function and callee compiled on its behalf), so that state is passed, not ambient.
The markers are plain attributes set on user functions by `kiln.disable` / `kiln.allow_in_graph`;
the tracer reads them with `getattr(fn, MARKER, False)`. Corresponds to the arguments that
torch.compile hands to torch._dynamo.optimize, and to torch._dynamo's skip/allow lists.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import torch

# A function carrying this attribute (True) is never traced: calls to it run natively (a graph break).
DISABLE_MARKER = "_kiln_disable"
# torch's own marks for functions Dynamo must not trace: torch._dynamo.disable and
# torch.compiler.disable set this attribute on their wrapper ...
TORCH_DISABLE_MARKER = "_torchdynamo_disable"
# ... and torch._disable_dynamo (on Optimizer.zero_grad, state_dict, load_state_dict, ...) wraps the
# function in a closure that imports torch._dynamo on its first call; it is known by its code.
_TORCH_LAZY_DISABLE_CODE = torch._disable_dynamo(lambda: None).__code__
# A function carrying this attribute (True) is put into the graph as one call_function node.
ALLOW_IN_GRAPH_MARKER = "_kiln_allow_in_graph"
# Set on the callable that kiln.compile returns; the tracer inlines `ORIGINAL_ATTR` instead of it.
COMPILED_MARKER = "_kiln_compiled"
ORIGINAL_ATTR = "_kiln_original"
# Set by torch._dynamo.assume_constant_result (and libraries that spell it without importing torch,
# as transformers' import probes do): a call with constant arguments runs for real while tracing,
# and its result is a constant of the graph.
CONSTANT_RESULT_MARKER = "_dynamo_marked_constant"

def is_disabled(fn: Any) -> bool:
    """True for a function capture must not trace: calls to it run natively (a graph break), and
    kiln.compile of it gives it back as it is. kiln.disable's mark, and torch's, as torch.compile
    honours them: torch marks the functions whose Python it keeps out of every graph (an
    optimizer's zero_grad and state_dict, the fused optimizer kernels' drivers)."""
    fn = getattr(fn, "__func__", fn)  # a bound method carries its function's marks
    if getattr(fn, DISABLE_MARKER, False) or getattr(fn, TORCH_DISABLE_MARKER, False) is True:
        return True
    return getattr(fn, "__code__", None) is _TORCH_LAZY_DISABLE_CODE


MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# The options the "inductor" backend understands (read by kiln.lower.compile_graph): "verify"
# (check the loop IR, default True), "opt_level" (e.g. "-O1"), and the bisector's switches
# "no_decompose", "aten_fallback", "no_fusion" (collections of op/buffer names). Kept here so that
# kiln.compile can refuse a misspelt key without importing the lowering.
INDUCTOR_OPTIONS = frozenset({"verify", "opt_level", "no_decompose", "aten_fallback", "no_fusion"})


@dataclass(frozen=True)
class CompileOptions:
    """What the user asked of kiln.compile; `compiler` is the resolved backend callable.

    `dynamic`: False (all sizes static), True (all symbolic from the start), None (static first,
    then automatic dynamic on the dims that change). `backend` is the name or callable the user
    gave, kept for messages; `compiler(gm, example_inputs) -> callable` is what capture calls.
    """

    backend: str | Callable[..., Any] = "inductor"
    compiler: Callable[..., Any] | None = None
    fullgraph: bool = False
    dynamic: bool | None = None
    mode: str | None = None
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if type(self.fullgraph) is not bool:
            raise TypeError(f"kiln.compile: fullgraph must be True or False, not {self.fullgraph!r}")
        if not (isinstance(self.mode, str) or self.mode is None) or self.mode not in MODES:
            raise ValueError(f"kiln.compile: unknown mode {self.mode!r}; expected one of {MODES}")
        if not any(self.dynamic is v for v in (None, True, False)):  # `in` would take 0 and 1
            raise ValueError(f"kiln.compile: dynamic must be None, True or False, not {self.dynamic!r}")
        if not isinstance(self.backend, str) and not callable(self.backend):
            raise TypeError(f"kiln.compile: backend must be a name or a callable (gm, example_inputs), "
                            f"not {self.backend!r}")
        if self.options is not None and not isinstance(self.options, Mapping):
            raise TypeError(f"kiln.compile: options must be a dict, not {type(self.options).__name__}")
        for key in self.options or {}:
            if not isinstance(key, str):
                raise TypeError(f"kiln.compile: option names are strings, not {key!r}")
            if self.backend == "inductor" and key not in INDUCTOR_OPTIONS:
                raise ValueError(f"kiln.compile: unknown option {key!r} for the inductor backend; "
                                 f"known options: {', '.join(sorted(INDUCTOR_OPTIONS))}")
        if self.options and isinstance(self.backend, str) and self.backend != "inductor":
            raise ValueError(f"kiln.compile: backend {self.backend!r} takes no options (only 'inductor' does)")
        if not isinstance(self.options, MappingProxyType):
            object.__setattr__(self, "options", MappingProxyType(dict(self.options or {})))

    @property
    def backend_name(self) -> str:
        if isinstance(self.backend, str):
            return self.backend
        return getattr(self.backend, "__name__", type(self.backend).__name__)

    def cache_key(self) -> tuple:
        """Two compiles share cache entries for a code object only when this key is equal."""
        backend = self.backend if isinstance(self.backend, str) else id(self.backend)
        return (backend, _compiler_key(self.compiler), self.fullgraph, self.dynamic, self.mode,
                tuple(sorted((k, repr(v)) for k, v in self.options.items())))


def _compiler_key(compiler: Any) -> Any:
    """The compiler by identity, except a partial that lookup made per call (inductor with a mode
    or options): by its function and arguments, so that modules compiled one by one with the same
    arguments share their compiled code, as torch.compile's do."""
    if isinstance(compiler, functools.partial):
        return (id(compiler.func), repr(compiler.args), repr(sorted(compiler.keywords.items())))
    return id(compiler)
