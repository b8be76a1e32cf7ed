"""Lowering: an ATen-level FX graph to fused C++ kernels and a Python wrapper that runs them.

`compile_graph(aten_gm, example_inputs)` is the fw/bw compiler AOT autograd calls. It picks the
code generator, looks the graph up in the disk cache (same code, input metadata and Kiln sources),
forks for mode="max-autotune" on CPU, and hands the rest to kiln.lower.pipeline, whose driver runs
the named passes in order (each name is its key in CompiledGraph.timings and in KILN_LOGS=+lower):
    fold_batch_norm -> pack_convolutions -> fuse_attention -> decompose -> lower_to_loop_ir -> schedule -> codegen_cpp
    -> codegen_wrapper -> build
It returns a CompiledGraph: a callable over the real inputs returning a tuple like `aten_gm`.
`prepare_graph` does the same in two steps (the passes, with the C++ compiler left running; then the
wait for it), which AOT autograd uses to compile a forward's kernels beside its backward's.
Under KILN_DEBUG=1 each pass's output is also written to `<run folder>/lower_<n>/<pass name>.*`.
Corresponds to torch/_inductor/compile_fx.py.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree

from kiln import config, log
from kiln.lower import autotune_cpu, conv_layout, pipeline
from kiln.lower.codegen.wrapper import make_wrapper
from kiln.lower.codegen import triton_wrapper
from kiln.lower.ir import LoopIR
from kiln.lower.schedule import ExternCall, Kernel, KernelProgram, ScatterKernel, check_stored_program
from kiln.runtime import artifact, cache
from kiln.runtime.aot import INPUT_UPDATES, MODULE_STATE


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
    codegen: str = "cpp"  # the code generator that ran: "cpp" or "triton"
    triton_source: str = ""  # the Triton kernels' module when codegen == "triton"

    def __call__(self, *args: Any) -> tuple:
        return self.fn(*args)

    def artifact_recipe(self) -> Any:
        """This graph as data for the runtime's artifact protocol (None when it cannot travel)."""
        return artifact.describe(self.fn)

    @property
    def kernel_count(self) -> int:
        return sum(isinstance(s, (Kernel, ScatterKernel)) for s in self.program.steps)

    @property
    def extern_count(self) -> int:
        return sum(isinstance(s, ExternCall) for s in self.program.steps)

    @property
    def extern_ops(self) -> tuple[Any, ...]:
        """The ops (ATen overloads, or other callables) the graph's extern calls run, in order."""
        return tuple(s.node.op for s in self.program.steps if isinstance(s, ExternCall))

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


def _graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: pipeline.LoweringOptions) -> str | None:
    """A key for the whole compiled graph: its code, its inputs' metadata and Kiln's own sources.
    Graphs with tensor constants are not cached (their values are not in the code)."""
    if any(n.op == "get_attr" for n in gm.graph.nodes):
        return None
    parts = [gm.code, options.cache_text(), cache.code_version(),
             conv_layout.tunables(), repr(gm.meta.get(INPUT_UPDATES, ())),
             repr(gm.meta.get(MODULE_STATE))]
    # The code leaves implicit what ambient state decided when it was traced: a factory without
    # dtype= means the default dtype then. Each node's traced dtype pins it (and the default too).
    parts.append(str(torch.get_default_dtype()))
    parts.append(f"fallback_random={config.fallback_random}")  # random ops lowered or ATen calls
    # ATen's vector width (ATEN_CPU_CAPABILITY may lower it on one CPU) decides some of eager's roundings
    # that the lowering follows (reductions.vector_lane)
    parts.append(torch.backends.cpu.get_cpu_capability())
    for n in gm.graph.nodes:
        for v in pytree.tree_leaves(n.meta.get("val")):
            if isinstance(v, torch.Tensor):
                # and its sizes: with symbolic inputs, the same code can trace to other sizes (the
                # ShapeEnv clamped `x[:n]` to 16 in one capture, kept n in another); and its storage
                # offset, which a slice's lowering reads: x[:, k:k + 2] starts at k where k >= 0 was
                # guarded and at k + 5 where k < 0 was, in graphs whose code is the same
                parts.append(f"{n.name}:{v.dtype}:{v.device.type}:{tuple(map(str, v.shape))}:{tuple(map(str, v.stride()))}"
                             f":{v.storage_offset()}")
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            parts.append(f"{x.dtype}{tuple(map(str, x.shape))}{tuple(map(str, x.stride()))}{x.storage_offset()}")
        else:
            parts.append(f"{type(x).__name__}:{x}")
    return cache.cache_key("\n".join(parts), (), "graph")


def _stored_graph(value: Any) -> tuple[KernelProgram, list[str]]:
    """A graph record read back from the disk cache: (program, perf hints) as written, the program
    checked before anything is generated from it (schedule.check_stored_program); ValueError
    otherwise (the record is deleted)."""
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple)
            and all(isinstance(h, str) for h in value[1])):
        raise ValueError("not a (program, hints) record")
    return check_stored_program(value[0]), list(value[1])


def _shape_env_of(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """The ShapeEnv of the graph's symbols (from a symbolic input or traced size), or None."""
    values = list(example_inputs) + [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    for v in pytree.tree_leaves(values):
        found = [v] if isinstance(v, (torch.SymInt, torch.SymFloat)) else (
            [s for s in (*v.shape, *v.stride()) if isinstance(s, torch.SymInt)] if isinstance(v, torch.Tensor) else [])
        for sym in found:
            env = getattr(sym.node, "shape_env", None)
            if env is not None:
                return env
    return None


def _guards_recorded(shape_env: Any) -> int:
    if shape_env is None:
        return 0
    return len(getattr(shape_env, "guards", ())) + len(getattr(shape_env, "runtime_asserts", ()))


CODEGEN_DEVICES = ("cpu", "cuda")  # device types a code generator handles: C++ (cpu), Triton (cuda, cpu)


def _foreign_device(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """What no code generator handles among the graph's tensors, if any: a device (meta, say:
    kernels given a meta tensor's data pointer would read memory that does not exist) or a sparse
    layout (no strides to index it by)."""
    values = list(example_inputs) + [n.meta.get("val") for n in gm.graph.nodes]
    for v in pytree.tree_leaves(values):
        if isinstance(v, torch.Tensor) and v.device.type not in CODEGEN_DEVICES:
            return f"a tensor of device {v.device.type!r}"
        if isinstance(v, torch.Tensor) and v.layout != torch.strided:
            return f"a tensor of layout {v.layout}"
    return None


def _scalar_read_in_graph(gm: torch.fx.GraphModule) -> str | None:
    """Where the graph reads a tensor's value as a number (`.item()` under capture_scalar_outputs:
    `x * t.item()`, `torch.arange(n.item())`, or the number returned), if it does. The number is a
    symbol no input gives; the wrappers bind the sizes an extern returns (nonzero's count) but not a
    scalar read from a tensor's data, so a kernel, a size or an output naming it could not be built."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten._local_scalar_dense.default:
            return f"a tensor's value read as a number ({node.name}, .item())"
    return None


def _aten_runner(gm: torch.fx.GraphModule, foreign: str) -> CompiledGraph:
    """The ATen graph run op by op, as the aot_eager backend runs it (no kernels, no wrapper)."""
    hint = f"graph with {foreign}: runs as ATen calls (no code generator for it)"
    log.artifact("perf_hints", hint)

    def run(*args: Any) -> tuple:
        return tuple(gm.forward(*args))  # no Module.__call__: global module hooks are the program's

    program = KernelProgram(LoopIR((), (), {}), ())
    return CompiledGraph(run, "", "", program, [hint])


def compile_graph(aten_gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                  options: dict[str, Any] | None = None) -> CompiledGraph:
    """Fuse, generate C++, build (or load from the disk cache) and wrap one ATen graph. `options`
    (kiln.lower.pipeline.LoweringOptions reads them): "mode", "verify" (check the IR, default True),
    "opt_level" (e.g. "-O1"), the bisector's switches; other keys are ignored."""
    return prepare_graph(aten_gm, example_inputs, options=options)()


def prepare_graph(aten_gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                  options: dict[str, Any] | None = None) -> Callable[[], CompiledGraph]:
    """compile_graph in two steps: this call runs the passes up to the build and leaves the C++
    compiler running in the background; the function it returns waits for it and gives the
    CompiledGraph (or raises what compile_graph would). AOT autograd prepares the forward and the
    backward before finishing either, so the forward's kernels compile while the backward is lowered
    and beside the backward's (kiln.autograd.backend.compile_with_aot)."""
    started = time.perf_counter()  # the cache key and lookup count in the first pass's time
    foreign = _foreign_device(aten_gm, example_inputs) or _scalar_read_in_graph(aten_gm)
    if foreign is not None:
        return _ready(_aten_runner(aten_gm, foreign))
    return _prepare(aten_gm, example_inputs, pipeline.LoweringOptions.of(options), started)


def _ready(compiled: CompiledGraph) -> Callable[[], CompiledGraph]:
    return lambda: compiled


class LoweringCompiler:
    """kiln.lower as AOT autograd's forward/backward compiler under fixed options: called, it is
    compile_graph; its `prepare` is prepare_graph (what kiln.autograd.backend looks for)."""

    def __init__(self, options: dict[str, Any] | None) -> None:
        self.options = options

    def __call__(self, aten_gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
        return compile_graph(aten_gm, example_inputs, options=self.options)

    def prepare(self, aten_gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[[], CompiledGraph]:
        return prepare_graph(aten_gm, example_inputs, options=self.options)


def _prepare(aten_gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: pipeline.LoweringOptions,
             started: float) -> Callable[[], CompiledGraph]:
    # the graph's device picks the code generator: C++ on CPU (or Triton when kiln.config.cpu_backend
    # says so, under Triton's interpreter), Triton on CUDA (kiln.lower.codegen.triton_wrapper)
    device = triton_wrapper.graph_device(example_inputs)
    codegen = triton_wrapper.choose_codegen(device, options.plan.cpu_backend)
    key = _graph_key(aten_gm, example_inputs, options) if codegen == "cpp" else None  # Triton graphs: not on disk yet
    cached = cache.load_graph(key, packages=("kiln.lower.",), check=_stored_graph) if key is not None else None
    if cached is None and codegen == "cpp" and options.plan.autotune and options.cpu_variant is None:
        variants = autotune_cpu.variants_for(aten_gm)
        if len(variants) > 1:
            return _ready(_compile_autotuned(aten_gm, example_inputs, options, key, variants))
    lo = pipeline.Lowering(aten_gm, example_inputs, options, device, codegen, pipeline.DebugDump.start(aten_gm),
                           started)
    if cached is not None:
        pipeline.regenerate(lo, *cached)
        return _ready(_compiled(lo))
    # A guard the passes record (a decomposition that reads a symbol's value, as linspace does
    # with a float end) specializes this program to the example's values, which the key does not
    # hold: such a program is used for this capture only (whose guards include it), never stored
    # under the key for a later capture with other values to find. The program is stored while its
    # kernels compile (what is left for finish, waiting and binding, records no guard).
    shape_env = _shape_env_of(aten_gm, example_inputs)
    guards_before = _guards_recorded(shape_env)
    pipeline.lower_start(lo)
    assert lo.program is not None
    if key is not None and _guards_recorded(shape_env) == guards_before:
        cache.store_graph(key, (lo.program, tuple(lo.hints)), packages=("kiln.lower.",))

    def finish() -> CompiledGraph:
        pipeline.lower_finish(lo)
        for hint in lo.hints if codegen == "cpp" else ():  # (the Triton path has never logged them)
            log.artifact("perf_hints", hint)
        return _compiled(lo)

    return finish


def _compiled(lo: pipeline.Lowering) -> CompiledGraph:
    """The CompiledGraph of a Lowering whose passes ran (its code logged as output_code)."""
    assert lo.fn is not None and lo.program is not None
    source, wrapper_source = lo.source, lo.wrapper_source
    if lo.codegen == "triton":
        log.artifact("output_code", lambda: f"# triton kernels\n{source}\n# wrapper\n{wrapper_source}")
        return CompiledGraph(lo.fn, "", wrapper_source, lo.program, lo.hints, lo.timings, codegen="triton",
                             triton_source=source)
    log.artifact("output_code", lambda: f"// kernels\n{source}\n# wrapper\n{wrapper_source}")
    return CompiledGraph(lo.fn, source, wrapper_source, lo.program, lo.hints, lo.timings, lo.signatures, lo.lib)


def _compile_autotuned(aten_gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                       options: pipeline.LoweringOptions, key: str | None, variants: list[str]) -> CompiledGraph:
    """mode="max-autotune" on CPU: each variant compiled (kiln.lower.autotune_cpu), the fastest chosen
    on the first call and then stored under this graph's key."""
    shape_env = _shape_env_of(aten_gm, example_inputs)
    guards_before = _guards_recorded(shape_env)
    candidates: dict[str, CompiledGraph] = {}
    for name in variants:
        with autotune_cpu.variant_settings(name):
            candidates[name] = _prepare(aten_gm, example_inputs, options.variant(name), time.perf_counter())()
    storable = key is not None and _guards_recorded(shape_env) == guards_before

    def store(winner: str) -> None:
        chosen = candidates[winner]
        if storable and key is not None and chosen.codegen == "cpp":
            cache.store_graph(key, (chosen.program, tuple(chosen.perf_hints)), packages=("kiln.lower.",))

    first = candidates["default"]
    return CompiledGraph(autotune_cpu.AutotunedGraph(candidates, store), first.cpp_source, first.wrapper_source,
                         first.program, first.perf_hints, first.timings, first._signatures, first._lib)


__all__ = ["compile_graph", "prepare_graph", "LoweringCompiler", "CompiledGraph", "LoopIR", "KernelProgram"]
