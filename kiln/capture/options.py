"""The frozen options of one `kiln.compile` call, and the marker attributes capture looks for.

`CompileOptions` travels from kiln.api through the entry into the tracer (and from there to every
resume function and callee compiled on its behalf), so that state is passed, not ambient.
The markers are plain attributes set on user functions by `kiln.disable` / `kiln.allow_in_graph`;
the tracer reads them with `getattr(fn, MARKER, False)`. Corresponds to the arguments that
torch.compile hands to torch._dynamo.optimize, and to torch._dynamo's skip/allow lists.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

# A function carrying this attribute (True) is never traced: calls to it run natively (a graph break).
DISABLE_MARKER = "_kiln_disable"
# A function carrying this attribute (True) is put into the graph as one call_function node.
ALLOW_IN_GRAPH_MARKER = "_kiln_allow_in_graph"
# Set on the callable that kiln.compile returns; the tracer inlines `ORIGINAL_ATTR` instead of it.
COMPILED_MARKER = "_kiln_compiled"
ORIGINAL_ATTR = "_kiln_original"

MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


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
        if self.mode not in MODES:
            raise ValueError(f"kiln.compile: unknown mode {self.mode!r}; expected one of {MODES}")
        if self.dynamic not in (None, True, False):
            raise ValueError(f"kiln.compile: dynamic must be None, True or False, not {self.dynamic!r}")
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
        return (backend, id(self.compiler), self.fullgraph, self.dynamic, self.mode,
                tuple(sorted((k, repr(v)) for k, v in self.options.items())))
