"""The minifier: shrink a graph a stage gets wrong to the few nodes that still go wrong the same way.

`minify(fn, *args)` runs fn compiled, records every graph handed to the lowering (ATen level) and
to the backend (torch level) with the real inputs of its first call, and picks the first graph a
stage fails on (kiln.debug.repro.graph_failure: a crash, or values off against a float64 run).
`minify_graph` then shrinks it by delta debugging: cut the graph after one node, turn sets of
nodes into inputs (their real values as placeholders, what they read falls away), then drop
inputs and shrink their sizes, keeping each change that fails the same way. The result writes a
standalone repro.py. Counterpart: torch/_functorch/fx_minifier.py and the repro/ minifier drivers.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.utils import _pytree as pytree

from kiln import config
from kiln.debug.repro import Failure, concrete, graph_failure, input_spec, random_inputs, write_repro


@dataclass
class MinifyResult:
    """The smallest failing graph found, its inputs, and how it fails."""

    stage: str
    failure: Failure
    gm: torch.fx.GraphModule
    inputs: list[Any]
    original_nodes: int
    trials: int
    log: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> int:
        return count_nodes(self.gm)

    def write(self, path: str) -> str:
        """Write repro.py (at a folder or file path); returns its path."""
        note = f"Minified by kiln.debug.minify from {self.original_nodes} to {self.nodes} nodes."
        return write_repro(self.gm, self.inputs, self.stage, self.failure, path, note=note)

    def __str__(self) -> str:
        return (f"minify: stage {self.stage!r}: {self.failure}\n"
                f"{self.original_nodes} -> {self.nodes} nodes in {self.trials} trials\n{self.gm.code.strip()}")


def count_nodes(gm: torch.fx.GraphModule) -> int:
    return sum(n.op == "call_function" for n in gm.graph.nodes)


# ---------------------------------------------------------------------------------------------------
# Graph edits: each returns a new (graph, inputs) and leaves its arguments alone


def _rebuild(graph: torch.fx.Graph, inputs: dict[str, Any]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """Drop dead nodes and unused placeholders; a GraphModule and its inputs in placeholder order.
    Metadata is dropped too: after an edit it may describe sizes that are no longer there."""
    graph.eliminate_dead_code()
    for node in list(graph.nodes):
        if node.op == "placeholder" and not node.users:
            graph.erase_node(node)
    for node in graph.nodes:
        node.meta.pop("val", None)
        node.meta.pop("example_value", None)
        node.meta.pop("tensor_meta", None)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    return gm, [inputs[n.name] for n in graph.nodes if n.op == "placeholder"]


def _copy(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> tuple[torch.fx.Graph, dict[str, Any], dict]:
    graph = torch.fx.Graph()
    mapping: dict[torch.fx.Node, torch.fx.Node] = {}
    out = graph.graph_copy(gm.graph, mapping)
    graph.output(out)
    names = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for old, value in zip(placeholders, inputs):
        names[mapping[old].name] = value
    return graph, names, mapping


def normalize(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """A plain copy whose module constants (get_attr) are inputs, so that a repro needs no state."""
    graph, values, mapping = _copy(gm, inputs)
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    for node in list(graph.nodes):
        if node.op == "get_attr":
            with graph.inserting_before(first):
                ph = graph.placeholder(f"const_{node.name}")
            values[ph.name] = getattr(gm, node.target)
            node.replace_all_uses_with(ph)
            graph.erase_node(node)
    return _rebuild(graph, values)


def values_of(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> dict[str, Any]:
    """Every node's value when the graph runs eagerly on these inputs (what a cut node becomes)."""
    env: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            out = super().run_node(n)
            env[n.name] = out
            return out

    with torch.no_grad():
        Recorder(gm).run(*[x.detach() if isinstance(x, torch.Tensor) else x for x in inputs])
    return env


def truncate(gm: torch.fx.GraphModule, inputs: Sequence[Any], keep: Sequence[str]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The graph cut after the nodes named in `keep`: it returns just them."""
    graph, values, _ = _copy(gm, inputs)
    by_name = {n.name: n for n in graph.nodes}
    output = next(n for n in graph.nodes if n.op == "output")
    graph.erase_node(output)
    graph.output(tuple(by_name[k] for k in keep))
    return _rebuild(graph, values)


def cut(gm: torch.fx.GraphModule, inputs: Sequence[Any], names: Sequence[str],
        values: dict[str, Any]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The graph with the named nodes replaced by inputs holding their eager values."""
    graph, known, _ = _copy(gm, inputs)
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    by_name = {n.name: n for n in graph.nodes}
    placeholders = {}
    with graph.inserting_before(first):  # all before any erasure: `first` may be one of the cut nodes
        for name in names:
            placeholders[name] = graph.placeholder(f"{name}_in")
            known[placeholders[name].name] = values[name]
    for name in names:
        by_name[name].replace_all_uses_with(placeholders[name])
    for name in reversed(names):
        graph.erase_node(by_name[name])
    return _rebuild(graph, known)


def _tensor_nodes(gm: torch.fx.GraphModule, values: dict[str, Any]) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "call_function" and isinstance(values.get(n.name), torch.Tensor)]


# ---------------------------------------------------------------------------------------------------
# Delta debugging


class _Search:
    def __init__(self, stage: str, failure: Failure, max_trials: int) -> None:
        self.stage, self.failure, self.max_trials = stage, failure, max_trials
        self.trials = 0
        self.log: list[str] = []

    def fails(self, gm: torch.fx.GraphModule, inputs: Sequence[Any], what: str) -> bool:
        if self.trials >= self.max_trials:
            return False
        self.trials += 1
        try:
            got = graph_failure(gm, inputs, self.stage)
        except Exception as exc:  # a candidate the checker cannot even run is no repro
            got = Failure("exception", type(exc).__name__, "while checking")
        same = self.failure.same_as(got)
        self.log.append(f"{what}: {count_nodes(gm)} nodes, {'still fails' if same else 'passes or differs'}")
        return same


def minify_graph(gm: torch.fx.GraphModule, inputs: Sequence[Any], stage: str = "lower", *,
                 max_trials: int = 150) -> MinifyResult:
    """Shrink a graph `stage` fails on (raises ValueError if it does not fail)."""
    gm, inputs = normalize(gm, inputs)
    failure = graph_failure(gm, inputs, stage)
    if failure is None:
        raise ValueError(f"stage {stage!r} does not fail on this graph: nothing to minify")
    search = _Search(stage, failure, max_trials)
    original = count_nodes(gm)
    gm, inputs = _truncate_step(search, gm, inputs)
    gm, inputs = _cut_step(search, gm, inputs)
    gm, inputs = _shrink_inputs(search, gm, inputs)
    return MinifyResult(stage, failure, gm, list(inputs), original, search.trials, search.log)


def _truncate_step(search: _Search, gm: torch.fx.GraphModule, inputs: list) -> tuple[torch.fx.GraphModule, list]:
    """Return just one node: binary search for the shortest failing prefix (its last node must be
    one that matters), then try that node alone."""
    values = values_of(gm, inputs)
    order = _tensor_nodes(gm, values)
    if len(order) <= 1:
        return gm, inputs

    def prefix(k: int) -> tuple[torch.fx.GraphModule, list]:
        inside = set(order[:k])
        live = [n for n in order[:k] if any(u.name not in inside for u in _node(gm, n).users)]
        return truncate(gm, inputs, live or order[k - 1:k])

    lo, hi = 0, len(order)  # prefix(hi) is the whole graph, up to outputs: it fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        candidate = prefix(mid)
        if search.fails(*candidate, f"prefix of {mid} nodes"):
            hi = mid
        else:
            lo = mid
    single = truncate(gm, inputs, [order[hi - 1]])
    if search.fails(*single, f"only {order[hi - 1]} returned"):
        return single
    return prefix(hi) if hi < len(order) else (gm, inputs)


def _node(gm: torch.fx.GraphModule, name: str) -> torch.fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name)


def _cut_step(search: _Search, gm: torch.fx.GraphModule, inputs: list) -> tuple[torch.fx.GraphModule, list]:
    """ddmin over the nodes: turn chunks of nodes into inputs, halving the chunk size each round."""
    values = values_of(gm, inputs)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    returned = {a.name for a in pytree.tree_leaves(output.args) if isinstance(a, torch.fx.Node)}
    # a returned node cut into an input leaves nothing for the stage to get wrong
    candidates = [n for n in _tensor_nodes(gm, values) if n not in returned]
    chunk = max(len(candidates) // 2, 1)
    while candidates and chunk >= 1:
        k = 0
        while k < len(candidates):
            part = candidates[k:k + chunk]
            trial = cut(gm, inputs, part, values)
            if search.fails(*trial, f"cut {', '.join(part)}"):
                gm, inputs = trial
                values = values_of(gm, inputs)
                alive = {n.name for n in gm.graph.nodes}
                candidates = [n for n in candidates if n in alive and n not in part]
            else:
                k += chunk
        if chunk == 1:
            break
        chunk //= 2
    return gm, inputs


def _shrink_inputs(search: _Search, gm: torch.fx.GraphModule, inputs: list) -> tuple[torch.fx.GraphModule, list]:
    """Make inputs contiguous, then halve sizes while the failure stays: every dim of one size at
    once across all inputs (broadcasting inputs share sizes), largest size first."""
    inputs = list(inputs)
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and not x.is_contiguous():
            trial = inputs[:i] + [x.contiguous()] + inputs[i + 1:]
            if search.fails(gm, trial, f"input {i} contiguous"):
                inputs = trial
    refused: set[int] = set()
    while True:
        sizes = sorted({s for x in inputs if isinstance(x, torch.Tensor) for s in x.shape if s > 1} - refused,
                       reverse=True)
        if not sizes:
            return gm, inputs
        size = sizes[0]
        trial = [_halve(x, size) if isinstance(x, torch.Tensor) else x for x in inputs]
        if search.fails(gm, trial, f"every dim of size {size} halved"):
            inputs = trial
        else:
            refused.add(size)


def _halve(x: torch.Tensor, size: int) -> torch.Tensor:
    for d in range(x.dim()):
        if x.shape[d] == size:
            x = x.narrow(d, 0, size // 2)
    return x.contiguous()


# ---------------------------------------------------------------------------------------------------
# From a program to its failing graph


@dataclass
class _Recorded:
    stage: str
    gm: torch.fx.GraphModule
    examples: list[Any]
    real: list[Any] | None = None


def _recording(stage: str, inner: Callable[..., Any], sink: list[_Recorded]) -> Callable[..., Any]:
    def compiler(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        record = _Recorded(stage, copy.deepcopy(gm), list(example_inputs))
        sink.append(record)
        compiled = inner(gm, example_inputs)

        def run(*args: Any) -> Any:
            if record.real is None:
                record.real = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
            return compiled(*args)

        return run

    return compiler


def record_graphs(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict) -> list[_Recorded]:
    """Every graph fn's compiled run handed to the backend (torch level, stage "inductor") and to
    the lowering (ATen level, stage "lower"), with the real inputs of their first call."""
    from kiln.api import compile_with
    from kiln.autograd import aot_autograd
    from kiln.capture import entry
    from kiln.capture.options import CompileOptions
    from kiln.lower import compile_graph

    sink: list[_Recorded] = []
    lowering = _recording("lower", compile_graph, sink)
    backend = _recording("inductor", aot_autograd(lowering, lowering), sink)
    options = CompileOptions(backend=backend, compiler=backend)
    with config.patch(suppress_errors=False, persistent_cache=False):
        try:
            out = compile_with(fn, options)(*args, **kwargs)
            for o in pytree.tree_leaves(out):  # a backward runs the backward graph
                if isinstance(o, torch.Tensor) and o.requires_grad:
                    o.float().sum().backward(retain_graph=True)
        except Exception:  # the failure itself; the graphs recorded so far are what minify needs
            pass
        finally:
            entry.drop_caches(options)
    return sink


def minify(fn: Callable[..., Any], *args: Any, max_trials: int = 150, **kwargs: Any) -> MinifyResult:
    """Find the first graph of fn's compiled run that a stage gets wrong and shrink it.

    ATen graphs are tried first (the lowering alone), then the captured graphs (AOT autograd with
    eager ATen graphs, then the whole backend). Raises ValueError when no graph fails."""
    recorded = record_graphs(fn, args, kwargs)
    order = [r for r in recorded if r.stage == "lower"] + [r for r in recorded if r.stage != "lower"]
    for record in order:
        try:
            inputs = record.real if record.real is not None else random_inputs(
                [input_spec(concrete(x)) for x in record.examples])
        except ValueError:  # symbolic sizes: this graph cannot be replayed with static inputs
            continue
        stages = ["lower"] if record.stage == "lower" else ["aot", "inductor"]
        for stage in stages:
            if graph_failure(*normalize(record.gm, inputs), stage) is not None:
                return minify_graph(record.gm, inputs, stage, max_trials=max_trials)
    raise ValueError("minify: no graph of this run fails in any stage (compiled output matches eager)")

