"""What the mode and kiln.config's code-generator and wrapper settings mean for one compile, resolved
once: the mode string and those settings are read here and nowhere else.

`kiln.compile(mode=...)` hands the "inductor" backend a mode string, which reaches
`kiln.lower.compile_graph` in its options dict. kiln.config adds the code generator of graphs on CPU
tensors (`cpu_backend`) and the wrapper settings (`cpu_wrapper`, `native_wrapper_after`). They
interact: mode="reduce-overhead" records CUDA graphs on CUDA tensors and builds a CPU graph's native
wrapper up front unless cpu_wrapper is "python"; cpu_wrapper="auto" outside that mode tiers a hot
graph up after native_wrapper_after calls (0: never); mode="max-autotune" tunes Triton launches and
compiles a CPU graph's variants to keep the fastest. `resolve(mode)` turns them into a frozen `Plan`
whose fields the backend (CUDA graphs or not), the lowering (kiln.lower.pipeline.LoweringOptions
holds one beside the option keys) and the runtime read; a graph read back from the frame cache has no
mode, and the runtime asks `wrapper_plan()` for its tier-up. A plan is resolved when a graph is
compiled or loaded, so a `kiln.config.patch(...)` applies to the next one. The module is in the
runtime, the bottom of the compiled-artifact stack, so that every stage that reads a plan may import
it; it imports only kiln.config.
"""
from __future__ import annotations

from dataclasses import dataclass

from kiln import config

CPU_WRAPPERS = ("python", "native", "auto")


@dataclass(frozen=True)
class WrapperPlan:
    """How a CPU graph's C++ kernels are called: one Python line and ctypes call each (the Python
    wrapper) or one generated C++ function per graph (the native wrapper, kiln.runtime.native)."""

    native_allowed: bool  # False under cpu_wrapper="python": no native wrapper, not even one built before
    native_up_front: bool  # built when the graph is compiled (a graph it cannot express keeps the Python one)
    tier_up_after: int  # calls after which a graph on its Python wrapper builds its native one (0: never)
    # a native wrapper runs as a plan interpreted by the boundary extension where the plan can express
    # the graph (no C++ compiled per graph; kiln.lower.codegen.plan), from the graph's first call
    native_plan: bool = True

    def tiers_up(self) -> bool:
        """Whether a graph compiled now starts on its Python wrapper and tiers up once hot."""
        return self.tier_up_after > 0 and not self.native_up_front


@dataclass(frozen=True)
class Plan:
    """One compile's choices. `mode` is the user's, None for "default"."""

    mode: str | None
    cuda_graphs: bool  # graphs on CUDA tensors replay as CUDA graphs (kiln.runtime.cudagraphs)
    autotune: bool  # Triton launches tuned on CUDA; a CPU graph's variants compiled, the fastest kept
    cpu_backend: str  # the code generator of graphs on CPU tensors, as configured ("cpp" or "triton")
    wrapper: WrapperPlan


def wrapper_plan(mode: str | None = None) -> WrapperPlan:
    """The wrapper settings of kiln.config now, for a graph compiled under `mode` (None for a graph
    read back from the frame cache, or compiled without one)."""
    choice = config.cpu_wrapper
    if choice not in CPU_WRAPPERS:
        raise ValueError(f"kiln.config.cpu_wrapper (KILN_CPU_WRAPPER) must be one of {', '.join(CPU_WRAPPERS)}, "
                         f"not {choice!r}")
    after = config.native_wrapper_after
    return WrapperPlan(native_allowed=choice != "python",
                       native_up_front=choice == "native" or (choice == "auto" and mode == "reduce-overhead"),
                       tier_up_after=after if choice != "python" and after > 0 else 0,
                       native_plan=config.native_plan and choice != "python")


def resolve(mode: str | None) -> Plan:
    """The plan of a compile under the user's `mode` (None or "default": the default; kiln.compile
    checked it against kiln.capture.options.MODES), with kiln.config as it is now."""
    if mode == "default":
        mode = None
    return Plan(mode=mode, cuda_graphs=mode == "reduce-overhead", autotune=mode == "max-autotune",
                cpu_backend=config.cpu_backend, wrapper=wrapper_plan(mode))
