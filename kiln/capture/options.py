"""The frozen options of one `kiln.compile` call, and the marker attributes capture looks for.

`CompileOptions` travels from kiln.api through the entry into the tracer (and from there to every
resume function and callee compiled on its behalf), so that state is passed, not ambient.
The markers (attributes set on user functions by `kiln.disable` / `kiln.allow_in_graph`) are
declared with the rest of the trace rules in kiln.capture.trace_rules and named here too, for the
callers that know them as options. Corresponds to the arguments that torch.compile hands to
torch._dynamo.optimize.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from kiln.capture.trace_rules import (  # noqa: F401  (re-exported: kiln.api and the frame cache name them here)
    ALLOW_IN_GRAPH_MARKER,
    COMPILED_MARKER,
    CONSTANT_RESULT_MARKER,
    DISABLE_MARKER,
    ORIGINAL_ATTR,
    TORCH_DISABLE_MARKER,
    is_disabled,
)

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
