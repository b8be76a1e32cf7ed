"""Lowering: an ATen-level FX graph to fused C++ kernels and a Python wrapper that runs them.

`compile_graph(aten_gm, example_inputs)` is the fw/bw compiler AOT autograd calls. It runs these
named passes in order (each name is its key in CompiledGraph.timings and in KILN_LOGS=+lower):
    decompose -> lower_to_loop_ir -> schedule -> codegen_cpp -> build -> codegen_wrapper
and returns a CompiledGraph: a callable over the real inputs returning a tuple like `aten_gm`.
A graph compiled before (same code, input metadata and Kiln sources) is loaded from the disk cache.
Corresponds to torch/_inductor/compile_fx.py.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx

from kiln.debug import log
from kiln.lower.codegen.cpp_kernel import generate
from kiln.lower.codegen.wrapper import make_wrapper
from kiln.lower.decompose import decompose
from kiln.lower.graph import lower_to_loop_ir, node_metas
from kiln.lower.ir import LoopIR, format_ir, verify_ir
from kiln.lower.schedule import ExternCall, Kernel, KernelProgram, ScatterKernel, schedule
from kiln.runtime import build, cache


@dataclass
class CompiledGraph:
    """The result of compile_graph: call it like the graph; the rest is for people and benchmarks."""

    fn: Callable[..., tuple]
    cpp_source: str
    wrapper_source: str
    program: KernelProgram
    perf_hints: list[str]
    timings: dict[str, float] = field(default_factory=dict)  # seconds per pass
    _signatures: dict = field(default_factory=dict, repr=False)
    _lib: Any = field(default=None, repr=False)

    def __call__(self, *args: Any) -> tuple:
        return self.fn(*args)

    @property
    def kernel_count(self) -> int:
        return sum(isinstance(s, (Kernel, ScatterKernel)) for s in self.program.steps)

    @property
    def extern_count(self) -> int:
        return sum(isinstance(s, ExternCall) for s in self.program.steps)

    def profile(self, *args: Any, repeat: int = 10) -> list[dict[str, Any]]:
        """Time each kernel alone on these inputs: per kernel its name, FX origins, median seconds,
        the bytes of the buffers it touches and the achieved GB/s (for bandwidth reports)."""
        samples: dict[str, list[tuple[float, int]]] = {}
        fn, _ = make_wrapper(self.program, self._signatures, self._lib,
                             record=lambda name, dt, nbytes: samples.setdefault(name, []).append((dt, nbytes)))
        for _ in range(repeat):
            fn(*args)
        origins = {s.name: list(dict.fromkeys(s.origins() if isinstance(s, Kernel) else s.node.origins))
                   for s in self.program.steps if isinstance(s, (Kernel, ScatterKernel))}
        report = []
        for name, runs in samples.items():
            seconds = sorted(dt for dt, _ in runs)[len(runs) // 2]
            nbytes = runs[0][1]
            report.append({"name": name, "origins": origins[name], "seconds": seconds, "bytes": nbytes,
                           "gbps": nbytes / seconds / 1e9 if seconds > 0 else float("inf")})
        return report


def _copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)


def _graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any]) -> str | None:
    """A key for the whole compiled graph: its code, its inputs' metadata and Kiln's own sources.
    Graphs with tensor constants are not cached (their values are not in the code)."""
    if any(n.op == "get_attr" for n in gm.graph.nodes):
        return None
    parts = [gm.code, repr(sorted((k, repr(v)) for k, v in options.items())), cache.code_version()]
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            parts.append(f"{x.dtype}{tuple(map(str, x.shape))}{tuple(map(str, x.stride()))}{x.storage_offset()}")
        else:
            parts.append(f"{type(x).__name__}:{x}")
    return cache.cache_key("\n".join(parts), (), "graph")


def compile_graph(aten_gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                  options: dict[str, Any] | None = None) -> CompiledGraph:
    """Fuse, generate C++, build (or load from the disk cache) and wrap one ATen graph."""
    options = options or {}  # "verify": check the IR (default True); "opt_level": e.g. "-O1"
    timings: dict[str, float] = {}
    start = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal start
        now = time.perf_counter()
        timings[name] = now - start
        start = now

    key = _graph_key(aten_gm, example_inputs, options)
    cached = cache.load_graph(key) if key is not None else None
    if cached is not None:
        program, source, signatures, hints, flags = cached  # type: ignore[misc]
        lib = build.load(source, flags) if signatures else None
        fn, wrapper_source = make_wrapper(program, signatures, lib)
        mark("cache_load")
        log.artifact("output_code", lambda: f"// kernels\n{source}\n# wrapper\n{wrapper_source}")
        return CompiledGraph(fn, source, wrapper_source, program, hints, timings, signatures, lib)

    gm = _copy_graph(aten_gm)
    metas = node_metas(gm, example_inputs)
    gm = decompose(gm, metas)
    mark("decompose")
    log.debug("lower", lambda: f"decompose:\n{gm.code}")
    ir, hints = lower_to_loop_ir(gm, example_inputs)
    if options.get("verify", True):
        verify_ir(ir)
    mark("lower_to_loop_ir")
    log.debug("lower", lambda: f"lower_to_loop_ir:\n{format_ir(ir)}")
    program = schedule(ir)
    mark("schedule")
    log.debug("lower", lambda: "schedule:\n" + "\n".join(
        f"{s.name}: {', '.join(n.name for n in s.nodes)}" if isinstance(s, Kernel) else
        f"{s.name}: scatter {s.node.name}" if isinstance(s, ScatterKernel) else f"extern {s.node.name} = {s.node.op}"
        for s in program.steps))
    source, signatures = generate(program)
    mark("codegen_cpp")
    flags = build.DEFAULT_FLAGS
    if "opt_level" in options:  # tests trade kernel speed for build time with "-O1"
        flags = tuple(options["opt_level"] if f.startswith("-O") else f for f in flags)
    lib = build.load(source, flags) if signatures else None
    mark("build")
    fn, wrapper_source = make_wrapper(program, signatures, lib)
    mark("codegen_wrapper")
    if key is not None:
        cache.store_graph(key, (program, source, signatures, hints, flags))
    for hint in hints:
        log.artifact("perf_hints", hint)
    log.artifact("output_code", lambda: f"// kernels\n{source}\n# wrapper\n{wrapper_source}")
    return CompiledGraph(fn, source, wrapper_source, program, hints, timings, signatures, lib)


__all__ = ["compile_graph", "CompiledGraph", "LoopIR", "KernelProgram"]
