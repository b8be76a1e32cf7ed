"""The compiler bisector: which stage, then which pass, kernel or op makes a compiled run go wrong.

`bisect(fn, *args, **kwargs)` runs fn eagerly (and in float64), then compiled with "eager" (capture
only), "aot_eager" (+ AOT autograd) and the whole stack. The first backend whose run differs names
the stage. Inside AOT autograd it tries the other partitioner; inside lowering it flips the switches
of kiln.lower.compile_graph by binary search over each kind in turn (fusion off per kernel, each
lowering replaced by its ATen call, each decomposition skipped) until one switch alone makes the run
match eager. Returns a BisectResult naming it, with the kernel source and the FX nodes it covers.
Counterpart: torch/_inductor/compiler_bisector.py and the "bisect by backend" advice of the docs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from kiln import config
from kiln.debug.accuracy import Outcome, compare, fp64_case, run_case

# Switch kinds in the order they are tried: a fused kernel that is wrong is also fixed by running
# its ops as ATen calls, and a wrong lowering is also avoided by skipping the decomposition that
# produced the op, so the narrower explanation goes first.
SWITCH_ORDER = ("no_fusion", "aten_fallback", "no_decompose")
SUBSYSTEM = {"no_fusion": "fusion", "aten_fallback": "lowering", "no_decompose": "decomposition"}


@dataclass
class BisectResult:
    """What bisect found: the stage at fault and, inside it, the switch that alone fixes the run."""

    stage: str | None  # "capture", "aot_autograd", "lowering", or None when nothing differs
    failure: str = ""  # how the first failing run differed from eager
    subsystem: str | None = None  # "partition", "fusion", "lowering", "decomposition"
    culprit: str | None = None  # a kernel ("graph 0 kernel2"), an op ("aten.mul.Tensor"), a partitioner
    kernel_source: str = ""
    nodes: list[str] = field(default_factory=list)  # FX nodes the culprit covers
    kernel_nodes: list[str] = field(default_factory=list)  # every FX node fused into those kernels
    trials: list[str] = field(default_factory=list)  # one line per run: what was switched, pass/fail

    def __str__(self) -> str:
        if self.stage is None:
            return "bisect: every backend matches eager; nothing to bisect"
        lines = [f"bisect: the first stage that differs from eager is {self.stage}: {self.failure}"]
        if self.culprit is not None:
            lines.append(f"culprit ({self.subsystem}): {self.culprit}")
        elif self.stage == "lowering":
            lines.append("not isolated: no single switch (fusion, lowering, decomposition) fixes the run; "
                         "suspect code generation, the build or the wrapper")
        if self.nodes:
            lines.append(f"graph nodes: {', '.join(self.nodes)}")
        if self.kernel_nodes and self.kernel_nodes != self.nodes:
            lines.append(f"its kernels fuse: {', '.join(self.kernel_nodes)}")
        if self.kernel_source:
            lines.append("kernel source:")
            lines.append(self.kernel_source.rstrip())
        lines.append(f"runs ({len(self.trials)}):")
        lines.extend(f"  {t}" for t in self.trials)
        return "\n".join(lines)


@dataclass
class _Lowered:
    """One graph compile_graph lowered during a run: its ATen graph and the CompiledGraph."""

    aten: torch.fx.GraphModule
    compiled: Any
    ops: frozenset[str]  # ops after decomposition (what the lowering table saw)
    decomposed: dict[str, list[str]]  # ATen node -> the nodes its decomposition put in its place


class _Session:
    """The runs of one bisection: fn, its inputs, eager's outcome and a float64 reference."""

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict) -> None:
        self.fn, self.args, self.kwargs = fn, tuple(args), dict(kwargs)
        self.module = fn if isinstance(fn, torch.nn.Module) else None
        self.reference = run_case(fn, self.args, self.kwargs)
        self.reference64 = fp64_case(fn, self.args, self.kwargs)
        self.trials: list[str] = []

    def run(self, backend: Callable[..., Any], label: str) -> str | None:
        """Compile fn with `backend` (fresh caches, errors raised), run it; None if it matches eager."""
        from kiln.api import compile_with
        from kiln.capture import entry
        from kiln.capture.options import CompileOptions

        options = CompileOptions(backend=backend, compiler=backend)
        with config.patch(suppress_errors=False, persistent_cache=False):
            try:
                compiled = compile_with(self.fn, options)
                outcome = run_case(compiled, self.args, self.kwargs, module=self.module)
            except Exception as exc:  # compile_with itself refusing the input
                outcome = Outcome(error=exc)
            finally:
                entry.drop_caches(options)
        why = compare(self.reference, outcome, self.reference64)
        self.trials.append(f"{label}: {'ok' if why is None else 'differs: ' + why}")
        return why


def _named_backend(name: str) -> Callable[..., Any]:
    from kiln import backends

    inner = backends.lookup(name)

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        return inner(gm, example_inputs)

    backend.__name__ = name
    return backend


def _lowering_backend(switches: dict[int, dict[str, frozenset[str]]], sink: list[_Lowered] | None = None,
                      partition: str = "min_cut") -> Callable[..., Any]:
    """The whole stack with per-graph switches for compile_graph (graphs numbered in compile order,
    which is the same in every run of the same program)."""
    from kiln.autograd import aot_autograd
    from kiln.lower import compile_graph

    count = [0]

    def compiler(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        index = count[0]
        count[0] += 1
        options = {k: tuple(sorted(v)) for k, v in switches.get(index, {}).items() if v}
        compiled = compile_graph(gm, example_inputs, options=options)
        if sink is not None:
            sink.append(_Lowered(gm, compiled, *_decomposition_of(gm, example_inputs)))
        return compiled

    aot = aot_autograd(compiler, compiler, partition=partition)

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        return aot(gm, example_inputs)

    backend.__name__ = "inductor"
    return backend


def _decomposition_of(gm: torch.fx.GraphModule, example_inputs: list) -> tuple[frozenset[str], dict[str, list[str]]]:
    """The ops the lowering table sees (after the decompose pass, run here on a copy) and, per
    decomposed node, the new nodes standing between the nodes that survived around it."""
    from kiln.lower.decompose import decompose
    from kiln.lower.graph import node_metas

    copy = torch.fx.GraphModule(gm, gm.graph.__deepcopy__())
    try:
        copy = decompose(copy, node_metas(copy, example_inputs))
    except Exception:  # the lowering will fail the same way; the ops before decomposition will do
        copy = gm
    ops = frozenset(str(n.target) for n in copy.graph.nodes
                    if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload))
    before = [n.name for n in gm.graph.nodes]
    survivors = {n.name for n in copy.graph.nodes} & set(before)
    decomposed: dict[str, list[str]] = {}
    fresh: list[str] = []
    gap: list[str] = []  # original nodes erased since the last survivor
    position = {name: k for k, name in enumerate(before)}
    for n in copy.graph.nodes:
        if n.name not in position:
            fresh.append(n.name)
            continue
        gap = [b for b in before[:position[n.name]] if b not in survivors and b not in decomposed]
        for erased in gap:  # a gap of several erased nodes shares its new nodes (an over-approximation)
            decomposed[erased] = list(fresh)
        fresh = []
    return ops, decomposed


def _items(kind: str, lowered: list[_Lowered]) -> list[tuple[int, str, frozenset[str]]]:
    """(graph index, label, names to switch) for each switch of this kind, in program order."""
    from kiln.lower.lowerings import LOWERINGS
    from kiln.lower.schedule import Kernel

    items: list[tuple[int, str, frozenset[str]]] = []
    if kind == "no_fusion":
        for g, low in enumerate(lowered):
            for step in low.compiled.program.steps:
                if isinstance(step, Kernel) and len(step.nodes) > 1:
                    items.append((g, f"graph {g} {step.name}", frozenset(n.name for n in step.nodes)))
        return items
    lowerable = {str(op) for op in LOWERINGS}
    seen: set[str] = set()
    for low in lowered:
        if kind == "aten_fallback":
            names = sorted(op for op in low.ops if op in lowerable)
        else:
            names = sorted(str(n.target) for n in low.aten.graph.nodes
                           if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                           and str(n.target) not in lowerable)
        for name in names:
            if name not in seen:
                seen.add(name)
                items.append((-1, name, frozenset({name})))  # -1: the op is switched in every graph
    return items


def _switches(kind: str, chosen: Sequence[tuple[int, str, frozenset[str]]], graphs: int
              ) -> dict[int, dict[str, frozenset[str]]]:
    out: dict[int, dict[str, frozenset[str]]] = {}
    for g, _, names in chosen:
        for target in (range(graphs) if g == -1 else (g,)):
            per = out.setdefault(target, {})
            per[kind] = per.get(kind, frozenset()) | names
    return out


def _search(session: _Session, kind: str, items: list, graphs: int) -> tuple[Any, bool] | None:
    """Binary search for the first item whose switch (with those before it) fixes the run; then
    checks it alone. Returns (item, fixes alone) or None when switching all of them fixes nothing."""
    if not items:
        return None
    what = SUBSYSTEM[kind]

    def fixed(chosen: Sequence[Any], label: str) -> bool:
        return session.run(_lowering_backend(_switches(kind, chosen, graphs)), label) is None

    if not fixed(items, f"{what}: all {len(items)} switched"):
        return None
    lo, hi = 0, len(items)  # switching items[:hi] fixes the run, items[:lo] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fixed(items[:mid], f"{what}: first {mid} of {len(items)} switched"):
            hi = mid
        else:
            lo = mid
    culprit = items[hi - 1]
    alone = hi == 1 or fixed([culprit], f"{what}: only {culprit[1]} switched")
    return culprit, alone


def _kernel_sources(lowered: list[_Lowered], node_names: set[str], graph: int | None) -> tuple[str, list[str]]:
    """The C++ of the kernels that cover any of these FX nodes, and the nodes they fused."""
    from kiln.lower.schedule import Kernel, ScatterKernel

    texts: list[str] = []
    covered: list[str] = []
    for g, low in enumerate(lowered):
        if graph is not None and g != graph:
            continue
        for step in low.compiled.program.steps:
            if not isinstance(step, (Kernel, ScatterKernel)):
                continue
            origins = list(dict.fromkeys(step.origins() if isinstance(step, Kernel) else step.node.origins))
            if node_names & set(origins):
                texts.append(f"// graph {g}\n" + kernel_function(low.compiled.cpp_source, step.name))
                covered += [o for o in origins if o not in covered]
    return "\n".join(texts), covered


def kernel_function(cpp_source: str, name: str) -> str:
    """One kernel's C++ function (with the comment above it) out of a compiled graph's source."""
    match = re.search(rf"^// {re.escape(name)}: .*?^}}\n", cpp_source, flags=re.M | re.S)
    return match.group(0) if match else f"// {name}: source not found"


def bisect(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BisectResult:
    """Find the stage, then the pass, kernel or op, at which compiling fn changes what it computes.

    Runs fn many times on copies of the inputs; kiln's in-memory caches for fn are left as they were
    (each run compiles with its own backend object)."""
    session = _Session(fn, args, kwargs)
    stages = [("capture", _named_backend("eager")), ("aot_autograd", _named_backend("aot_eager"))]
    for stage, backend in stages:
        why = session.run(backend, f"backend={backend.__name__}")
        if why is not None:
            result = BisectResult(stage, why, trials=session.trials)
            if stage == "aot_autograd" and session.run(
                    _aot_eager_with("save_all"), "aot_eager, partition=save_all") is None:
                result.subsystem, result.culprit = "partition", "the min-cut partitioner (save_all matches eager)"
            return result
    lowered: list[_Lowered] = []
    why = session.run(_lowering_backend({}, lowered), "backend=inductor")
    if why is None:
        return BisectResult(None, trials=session.trials)
    result = BisectResult("lowering", why, trials=session.trials)
    graphs = max(len(lowered), 1)
    for kind in SWITCH_ORDER:
        found = _search(session, kind, _items(kind, lowered), graphs)
        if found is None:
            continue
        (g, label, names), alone = found
        result.subsystem = SUBSYSTEM[kind]
        result.culprit = label if alone else f"{label} (fixes the run only together with the switches before it)"
        if kind == "no_fusion":
            result.kernel_source, result.nodes = _fusion_details(lowered[g], label.split()[-1])
            result.kernel_nodes = list(result.nodes)
        else:
            # the ATen graph's nodes calling the op; a decomposition's own nodes are named after them
            nodes = [n.name for low in lowered for n in low.aten.graph.nodes if str(n.target) in names]
            result.nodes = list(dict.fromkeys(nodes))
            wanted = set(result.nodes) | {d for low in lowered for n in result.nodes
                                          for d in low.decomposed.get(n, [])}
            result.kernel_source, result.kernel_nodes = _kernel_sources(lowered, wanted, None)
        break
    return result


def _fusion_details(low: _Lowered, kernel_name: str) -> tuple[str, list[str]]:
    from kiln.lower.schedule import Kernel

    for step in low.compiled.program.steps:
        if isinstance(step, Kernel) and step.name == kernel_name:
            return kernel_function(low.compiled.cpp_source, step.name), list(dict.fromkeys(step.origins()))
    return "", []


def _aot_eager_with(partition: str) -> Callable[..., Any]:
    from kiln.autograd import aot_autograd
    from kiln.autograd.backend import run_eagerly

    aot = aot_autograd(run_eagerly, run_eagerly, partition=partition)

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        return aot(gm, example_inputs)

    backend.__name__ = f"aot_eager({partition})"
    return backend
