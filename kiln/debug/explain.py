"""kiln.explain: run a function once under capture and report what happened.

`explain(fn)(*args, **kwargs)` compiles fn with a recording backend and fresh caches, runs it once
(resume functions and callees included), and returns an ExplainOutput: the graphs, the graph
breaks with their reasons, file:line and hints, the op count and the guards. It reads the entry's
capture events and the backend's graphs; it changes no stage. Counterpart: torch._dynamo.explain.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kiln import backends
from kiln.capture import entry
from kiln.capture.breaks import BreakRecord, summarize_breaks
from kiln.capture.guards import Guard
from kiln.capture.options import CompileOptions


@dataclass
class FrameFallback:
    """A frame that ran eagerly as a whole, and why (an unsupported construct or an internal error)."""

    name: str
    filename: str
    lineno: int
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.filename}:{self.lineno}) ran eagerly: {self.reason}"


@dataclass
class ExplainOutput:
    """What one run under capture produced, with the fields of torch._dynamo.explain's output.

    `graph_break_count` follows torch._dynamo.explain (graph_count - 1, never below 0);
    `break_reasons` lists every break record, including breaks with no graph before them.
    """

    graphs: list[torch.fx.GraphModule]
    graph_count: int
    graph_break_count: int
    break_reasons: list[Any]  # kiln.capture.breaks.BreakRecord: reason, filename, lineno, suggestion
    op_count: int
    ops_per_graph: list[list[Any]]
    guards: list[Guard]
    fallbacks: list[FrameFallback] = field(default_factory=list)
    compile_time_s: float = 0.0

    @property
    def out_guards(self) -> list[Guard]:
        return self.guards

    def __str__(self) -> str:
        lines = [
            f"Graph Count: {self.graph_count}",
            f"Graph Break Count: {self.graph_break_count}",
            f"Op Count: {self.op_count}",
        ]
        lines.append(f"Break Reasons ({len(self.break_reasons)}):" if self.break_reasons else "Break Reasons: none")
        if self.break_reasons and all(isinstance(r, BreakRecord) for r in self.break_reasons):
            # A break inside a loop repeats once per iteration: one group per reason, with its count.
            lines.extend("  " + line for line in summarize_breaks(self.break_reasons).splitlines())
            records: list[Any] = []
        else:
            records = self.break_reasons
        for i, record in enumerate(records, 1):
            lines.append(f"  Break Reason {i}: {getattr(record, 'reason', record)}")
            lines.append(f"    at {getattr(record, 'filename', '?')}:{getattr(record, 'lineno', '?')}")
            source_line = getattr(record, "source_line", "")
            if source_line:
                lines.append(f"      {source_line.strip()}")
            if getattr(record, "suggestion", None):
                lines.append(f"    hint: {record.suggestion}")
        for fallback in self.fallbacks:
            lines.append(f"Eager frame: {fallback}")
        lines.append("Ops per Graph:")
        for i, ops in enumerate(self.ops_per_graph, 1):
            lines.append(f"  Graph {i} ({len(ops)} ops): " + ", ".join(_op_name(op) for op in ops))
        lines.append(f"Guards ({len(self.guards)}):")
        lines.extend(f"  {guard}" for guard in self.guards)
        lines.append(f"Compile Time: {self.compile_time_s:.3f} s")
        return "\n".join(lines)


def _op_name(target: Any) -> str:
    if isinstance(target, str):
        return f".{target}()"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", repr(target))
    if module.startswith("torch") and not module.startswith("torch._ops"):
        return f"torch.{name}" if module in ("torch", "torch.functional") else f"{module}.{name}"
    if module == "_operator":
        return f"operator.{name}"
    return name


def explain(fn: Callable[..., Any], *, backend: Any = "eager", dynamic: bool | None = None,
            capture: Callable[..., Any] | None = None) -> Callable[..., ExplainOutput]:
    """`explain(fn)(*args, **kwargs)`: run fn once under capture (eagerly where it breaks) and report.

    `capture` replaces the tracer (tests of the entry use it).
    """

    def run(*args: Any, **kwargs: Any) -> ExplainOutput:
        from kiln.api import compile_with  # debug sits above the api: kiln/__init__ exports explain from here

        recorder = backends.CountingBackend(backends.lookup(backend))
        options = CompileOptions(backend=recorder, compiler=recorder, dynamic=dynamic)
        events: list[entry.CaptureEvent] = []
        start = time.perf_counter()
        with entry.observing(events.append):
            compiled = compile_with(fn, options, capture)
            compiled(*args, **kwargs)
        elapsed = time.perf_counter() - start
        entry.drop_caches(options)
        return summarize(recorder.graphs, events, elapsed)

    return run


def summarize(graphs: list[torch.fx.GraphModule], events: list[entry.CaptureEvent],
              elapsed: float = 0.0) -> ExplainOutput:
    """An ExplainOutput from the graphs a backend saw and the entry's capture events."""
    if not graphs:  # a capture that did not go through the recording backend still has its graphs
        graphs = [gm for event in events if event.result is not None for gm in event.result.graphs]
    breaks: list[Any] = []
    guards: list[Guard] = []
    fallbacks: list[FrameFallback] = []
    for event in events:
        if event.result is not None:
            breaks.extend(event.result.breaks)
            guards.extend(event.result.guards)
        elif event.fallback_reason is not None:
            code = event.fn.__code__
            fallbacks.append(FrameFallback(event.fn.__qualname__, code.co_filename, code.co_firstlineno,
                                           event.fallback_reason))
    ops_per_graph = [[n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
                     for gm in graphs]
    return ExplainOutput(
        graphs=list(graphs),
        graph_count=len(graphs),
        graph_break_count=max(len(graphs) - 1, 0),
        break_reasons=breaks,
        op_count=sum(len(ops) for ops in ops_per_graph),
        ops_per_graph=ops_per_graph,
        guards=guards,
        fallbacks=fallbacks,
        compile_time_s=elapsed,
    )
