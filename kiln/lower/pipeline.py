"""The lowering's passes as one named list, and the one driver that runs them.

A pass reads and fills a `Lowering` (the graph being lowered and every pass's output) and does
nothing else: the driver (`run`) checks its output with the seam's verifier (unless the option
"verify" is False), times it (`Lowering.timings[name]`, and kiln.compile_time as
`lower.<name>`, `build` as itself), logs it under KILN_LOGS=+lower and writes it to the debug dump
(KILN_DEBUG=1: `<run folder>/lower_<n>/<file>`). The lists:
    CPP_PASSES:    fold_batch_norm -> pack_convolutions -> fuse_attention -> decompose -> lower_to_loop_ir
                   -> schedule -> codegen_cpp -> codegen_wrapper -> build   (codegen_cpp starts the kernels'
                   compiler, the wrapper is written while it runs, build waits for it and binds the wrapper
                   to the library: `lower_start` runs the passes before build, `lower_finish` the build)
    TRITON_PASSES: fold_batch_norm -> pack_convolutions -> fuse_attention -> decompose -> lower_to_loop_ir
                   -> schedule -> codegen_triton
    REGENERATE:    codegen_cpp -> codegen_wrapper -> build (a program read back from the disk cache,
                   timed together as `cache_load`)
kiln.lower.compile_graph picks the list and wraps the result. Corresponds to the pass sequence of
torch/_inductor/compile_fx.py and graph.py.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.fx

from kiln import compile_time, config, log
from kiln.lower import autotune_cpu
from kiln.lower.codegen import native_wrapper, plan, triton_wrapper
from kiln.lower.codegen.cpp_kernel import generate
from kiln.lower.codegen.wrapper import WrapperWriter, bind_wrapper
from kiln.lower.decompose import decompose, wants_decomposition
from kiln.lower.eager_dtypes import mark_refused
from kiln.lower.fold_batch_norm import fold_batch_norm
from kiln.lower.fuse_attention import fuse_attention
from kiln.lower.pack_convolution import pack_convolutions
from kiln.lower.graph import lower_to_loop_ir, node_metas
from kiln.lower.ir import LoopIR, format_ir, verify_ir
from kiln.lower.lowerings import LOWERINGS
from kiln.lower.lowerings.extern import EXTERN_BY_DESIGN
from kiln.lower.schedule import KernelProgram, format_program, schedule, verify_program
from kiln.runtime import build
from kiln.runtime.aot import INPUT_UPDATES, MODULE_STATE
from kiln.runtime.plan import Plan, resolve as resolve_plan


class DebugDump:
    """KILN_DEBUG=1: each pass's output as a file named after the pass, in one folder per compiled
    graph (`lower_<n>/`) under the run folder of kiln.log, beside the capture dump. A no-op otherwise."""

    _counter = itertools.count()

    def __init__(self, folder: str | None) -> None:
        self.folder = folder

    @classmethod
    def start(cls, gm: torch.fx.GraphModule) -> "DebugDump":
        if not config.debug:
            return cls(None)
        name = f"lower_{next(cls._counter):03d}"
        folder = os.path.join(log.dump_run_dir(), name)
        os.makedirs(folder, exist_ok=True)
        log.add_dump_row(name, "lowering", "aten graph, loop IR, schedule, C++ and wrapper, one file per pass")
        out = cls(folder)
        out.write("aten_graph.py", gm.code)
        return out

    def write(self, name: str, text: str) -> None:
        if self.folder is not None:
            with open(os.path.join(self.folder, name), "w") as f:
                f.write(text)


@dataclass(frozen=True)
class Switches:
    """The bisector's switches (kiln.debug.bisect), each a set of names: `no_decompose` (ops kept
    whole), `aten_fallback` (ops run as ATen calls instead of their lowering), `no_fusion` (loop-IR
    buffers that get a kernel of their own)."""

    no_decompose: frozenset[str] = frozenset()
    aten_fallback: frozenset[str] = frozenset()
    no_fusion: frozenset[str] = frozenset()


@dataclass(frozen=True)
class LoweringOptions:
    """compile_graph's options dict, read once (`of`) and kept apart by who sets each key: the user's
    (`verify`: run the verifiers after their passes; `opt_level`: the kernels' -O flag, tests trade
    kernel speed for build time with "-O1"; the mode, resolved with kiln.config into `plan`), the
    bisector's `switches`, and the lowering's own `cpu_variant` (the CPU autotuner's variant being
    compiled, kiln.lower.autotune_cpu). A key of none of them is ignored."""

    plan: Plan
    verify: bool = True
    opt_level: str | None = None
    switches: Switches = Switches()
    cpu_variant: str | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any] | None) -> "LoweringOptions":
        options = options or {}
        switches = Switches(no_decompose=frozenset(options.get("no_decompose", ())),
                            aten_fallback=frozenset(options.get("aten_fallback", ())),
                            no_fusion=frozenset(options.get("no_fusion", ())))
        return cls(resolve_plan(options.get("mode")), verify=bool(options.get("verify", True)),
                   opt_level=options.get("opt_level"), switches=switches, cpu_variant=options.get("cpu_variant"))

    def variant(self, name: str) -> "LoweringOptions":
        """These options for one of the CPU autotuner's variants."""
        return dataclasses.replace(self, cpu_variant=name)

    def cache_text(self) -> str:
        """What of the options decides the kernel program a graph lowers to (the lowering's cache key;
        the wrapper is chosen after the program is made, from the plan)."""
        s = self.switches
        return repr((self.plan.mode, self.verify, self.opt_level, sorted(s.no_decompose), sorted(s.aten_fallback),
                     sorted(s.no_fusion), self.cpu_variant))


def build_flags(options: LoweringOptions) -> tuple[str, ...]:
    """The kernels' compiler flags: build's defaults, with the opt_level option in place of the -O flag."""
    if options.opt_level is None:
        return build.DEFAULT_FLAGS
    return tuple(options.opt_level if f.startswith("-O") else f for f in build.DEFAULT_FLAGS)


@dataclass
class Lowering:
    """One graph on its way through the passes: the input, the choices made before the passes, and
    what each pass made (None until it ran)."""

    aten_gm: torch.fx.GraphModule
    example_inputs: Sequence[Any]
    options: LoweringOptions
    device: torch.device  # of the graph (kiln.lower.codegen.triton_wrapper.graph_device)
    codegen: str  # "cpp" or "triton" (kiln.lower.codegen.triton_wrapper.choose_codegen)
    dump: DebugDump
    started: float = field(default_factory=time.perf_counter)  # the end of the last timed pass
    timings: dict[str, float] = field(default_factory=dict)
    gm: torch.fx.GraphModule | None = None
    ir: LoopIR | None = None
    hints: list[str] = field(default_factory=list)
    program: KernelProgram | None = None
    source: str = ""  # the C++ kernels, or the Triton module under codegen "triton"
    signatures: dict[str, tuple[list[str], list[str], bool]] = field(default_factory=dict)
    native_build: native_wrapper.NativeBuild | plan.PlannedGraph | None = None
    kernels_built: concurrent.futures.Future | None = None  # the kernel library, building since codegen_cpp
    lib: Any = None
    fn: Callable[..., tuple] | None = None
    wrapper_source: str = ""
    wrapper_writer: WrapperWriter | None = None  # what wrote wrapper_source (bound to `lib` by the build pass)

    def lap(self) -> float:
        """Seconds since the last lap (or since the Lowering was made: work before the first pass,
        the cache key and lookup, counts in the first pass)."""
        now = time.perf_counter()
        seconds, self.started = now - self.started, now
        return seconds


@dataclass(frozen=True)
class Pass:
    """One named pass: `run` fills the Lowering; `verify` checks what it made (the seam's verifier);
    `show` is its output for KILN_LOGS=+lower; `dumps` are (file name, text) for the debug dump."""

    name: str
    run: Callable[[Lowering], None]
    verify: Callable[[Lowering], None] | None = None
    show: Callable[[Lowering], str] | None = None
    dumps: tuple[tuple[str, Callable[[Lowering], str]], ...] = ()


def _fold_batch_norm(lo: Lowering) -> None:
    gm = _copy_graph(lo.aten_gm)
    if lo.options.cpu_variant == "linear_onednn":
        autotune_cpu.linear_onednn_rewrite(gm)
    lo.gm = fold_batch_norm(gm)


def _pack_convolutions(lo: Lowering) -> None:
    assert lo.gm is not None
    # only in an inference graph (AOT autograd marks its module state): a training graph's weights
    # change every step, and its backward reads the weight as it is
    if MODULE_STATE in lo.aten_gm.meta:
        mutated = tuple(int(p) for _, p in lo.aten_gm.meta.get(INPUT_UPDATES, ()))
        lo.gm = pack_convolutions(lo.gm, tuple(int(p) for p in lo.aten_gm.meta[MODULE_STATE]), mutated)


def _fuse_attention(lo: Lowering) -> None:
    assert lo.gm is not None
    lo.gm = fuse_attention(lo.gm)


def _copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)


def _decompose(lo: Lowering) -> None:
    assert lo.gm is not None
    metas = node_metas(lo.gm, lo.example_inputs)
    # ops Kiln computes itself that eager refuses for their dtypes stay whole and run as ATen calls
    mark_refused(lo.gm, metas, lambda target: target not in EXTERN_BY_DESIGN
                 and (target in LOWERINGS or wants_decomposition(target)))
    lo.gm = decompose(lo.gm, metas, keep=lo.options.switches.no_decompose)


def _lower_to_loop_ir(lo: Lowering) -> None:
    assert lo.gm is not None
    # the AOT runtime's mark of mutated inputs' new values (computed into their storage where safe)
    updates = tuple((int(k), int(p)) for k, p in lo.aten_gm.meta.get(INPUT_UPDATES, ()))
    lo.ir, lo.hints = lower_to_loop_ir(lo.gm, lo.example_inputs, aten_fallback=lo.options.switches.aten_fallback,
                                       input_updates=updates)


def _schedule(lo: Lowering) -> None:
    assert lo.ir is not None
    # column sums fuse into the kernel that makes their rows only where the C++ generator runs them
    lo.program = schedule(lo.ir, unfused=lo.options.switches.no_fusion, column_partials=lo.codegen == "cpp")


def _codegen_triton(lo: Lowering) -> None:
    assert lo.program is not None
    lo.fn, lo.source, lo.wrapper_source = triton_wrapper.compile_program(
        lo.program, lo.device, autotune=lo.options.plan.autotune)


def _codegen_cpp(lo: Lowering) -> None:
    assert lo.program is not None
    lo.source, lo.signatures = generate(lo.program)
    lo.native_build = plan.start(lo.program, lo.signatures, lo.options.plan.wrapper)  # a compiled wrapper builds while the kernels do
    if lo.signatures:  # the compiler starts now; the build pass waits for it (lower_start, lower_finish)
        lo.kernels_built = build.load_soon(lo.source, build_flags(lo.options), symbols=tuple(lo.signatures))


def _codegen_wrapper(lo: Lowering) -> None:
    assert lo.program is not None
    lo.wrapper_writer = WrapperWriter(lo.program, lo.signatures)
    lo.wrapper_source = lo.wrapper_writer.write()  # written while the kernels compile: it needs no library


def _build(lo: Lowering) -> None:
    assert lo.wrapper_writer is not None
    lo.lib = lo.kernels_built.result() if lo.kernels_built is not None else None
    lo.fn = bind_wrapper(lo.wrapper_writer, lo.wrapper_source, lo.lib)


def _verify_ir(lo: Lowering) -> None:
    assert lo.ir is not None
    verify_ir(lo.ir)


def _verify_program(lo: Lowering) -> None:
    assert lo.program is not None
    verify_program(lo.program)


def _gm_code(lo: Lowering) -> str:
    assert lo.gm is not None
    return lo.gm.code


def _ir_text(lo: Lowering) -> str:
    assert lo.ir is not None
    return format_ir(lo.ir)


def _program_text(lo: Lowering) -> str:
    assert lo.program is not None
    return format_program(lo.program)


def _build_text(lo: Lowering) -> str:
    flags = build_flags(lo.options)
    return f"{build.COMPILER} {' '.join(flags)} {' '.join(build.LIBS)}\nlibrary: {getattr(lo.lib, '_name', None)}\n"


FOLD_BATCH_NORM = Pass("fold_batch_norm", _fold_batch_norm)
PACK_CONVOLUTIONS = Pass("pack_convolutions", _pack_convolutions)
FUSE_ATTENTION = Pass("fuse_attention", _fuse_attention)
DECOMPOSE = Pass("decompose", _decompose, show=_gm_code, dumps=(("decompose.py", _gm_code),))
LOWER_TO_LOOP_IR = Pass("lower_to_loop_ir", _lower_to_loop_ir, verify=_verify_ir, show=_ir_text, dumps=(
    ("lower_to_loop_ir.txt", lambda lo: _ir_text(lo) + "".join(f"\n# perf hint: {h}" for h in lo.hints)),))
SCHEDULE = Pass("schedule", _schedule, verify=_verify_program, show=_program_text,
                dumps=(("schedule.txt", _program_text),))
CODEGEN_TRITON = Pass("codegen_triton", _codegen_triton, dumps=(("codegen_triton.py", lambda lo: lo.source),
                                                                 ("codegen_wrapper.py", lambda lo: lo.wrapper_source)))
CODEGEN_CPP = Pass("codegen_cpp", _codegen_cpp, dumps=(("codegen_cpp.cpp", lambda lo: lo.source),))
BUILD = Pass("build", _build, dumps=(("build.txt", _build_text),))
CODEGEN_WRAPPER = Pass("codegen_wrapper", _codegen_wrapper, dumps=(("codegen_wrapper.py", lambda lo: lo.wrapper_source),))

CPP_PASSES = (FOLD_BATCH_NORM, PACK_CONVOLUTIONS, FUSE_ATTENTION, DECOMPOSE, LOWER_TO_LOOP_IR, SCHEDULE, CODEGEN_CPP, CODEGEN_WRAPPER, BUILD)
TRITON_PASSES = (FOLD_BATCH_NORM, PACK_CONVOLUTIONS, FUSE_ATTENTION, DECOMPOSE, LOWER_TO_LOOP_IR, SCHEDULE, CODEGEN_TRITON)
# A program read back from the disk cache: its C++ is written again (never a stored source) and built
# (found in the cache); what the skipped passes made is dumped from the program itself.
REGENERATE = (CODEGEN_CPP, CODEGEN_WRAPPER, BUILD)
STORED_DUMPS = (("lower_to_loop_ir.txt", _ir_text), ("schedule.txt", _program_text))


def _record(lo: Lowering, name: str, seconds: float) -> None:
    lo.timings[name] = seconds
    compile_time.add(name if name in ("build", "cache_load") else f"lower.{name}", seconds)


def run(lo: Lowering, passes: Sequence[Pass], *, timed_as: str | None = None) -> None:
    """Run `passes` in order, each verified, timed, logged and dumped; `timed_as`: one timing for
    all of them under that name instead of one per pass."""
    verify = lo.options.verify
    together = 0.0
    for p in passes:
        p.run(lo)
        if verify and p.verify is not None:
            p.verify(lo)
        if timed_as is None:
            _record(lo, p.name, lo.lap())
        else:
            together += lo.lap()
        show = p.show
        if show is not None:
            log.debug("lower", lambda: f"{p.name}:\n{show(lo)}")
        for file, text in p.dumps:
            lo.dump.write(file, text(lo))
    if timed_as is not None:
        _record(lo, timed_as, together)


def lower(lo: Lowering) -> None:
    """The passes of the Lowering's code generator, then the wrapper it runs (native or Python)."""
    lower_start(lo)
    lower_finish(lo)


def lower_start(lo: Lowering) -> None:
    """The passes up to the build: the C++ kernels' compiler runs in the background when this returns,
    and the caller may lower another graph (a forward's backward) before `lower_finish`."""
    if lo.codegen == "triton":
        run(lo, TRITON_PASSES)
        return
    run(lo, CPP_PASSES[:CPP_PASSES.index(BUILD)])


def lower_finish(lo: Lowering) -> None:
    """The build pass (waiting for the kernels' compiler, binding the wrapper), and the wrapper it runs."""
    if lo.codegen == "cpp":
        lo.started = time.perf_counter()  # the build pass counts its wait, not what ran since lower_start
        run(lo, CPP_PASSES[CPP_PASSES.index(BUILD):])
    _finish(lo, "".join(f"{k}: {v * 1e3:.1f} ms\n" for k, v in lo.timings.items()))


def regenerate(lo: Lowering, program: KernelProgram, hints: list[str]) -> None:
    """A program read back from the disk cache made callable again (the passes before it skipped)."""
    lo.program, lo.ir, lo.hints = program, program.ir, hints
    for file, text in STORED_DUMPS:
        lo.dump.write(file, text(lo))
    run(lo, REGENERATE, timed_as="cache_load")
    _finish(lo, "loaded from the disk cache (the passes did not run)\n")


def _finish(lo: Lowering, timings_text: str) -> None:
    if lo.codegen == "cpp":
        assert lo.fn is not None and lo.program is not None
        lo.fn = plan.choose(lo.fn, lo.program, lo.signatures, lo.lib, lo.options.plan.wrapper, lo.dump.write,
                            lo.native_build)  # timed itself
    lo.dump.write("timings.txt", timings_text)
