"""Micro-benchmark: what a cached call costs on top of running the graph.

A function of two small tensors is compiled with backend="eager", by Kiln and by the real
torch.compile, and called until every compile is done. Then three things are timed: the compiled
call (guards checked, cached entry found, graph run), the captured graph's own code called
directly (`gm.forward`, what the eager backend runs), and the uncompiled function. The difference
of the first two is the price of the guards and the dispatch; Kiln's target is under 10 us (the
real torch.compile adds about 15 us on the 2-core machine).
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch

from benchmarks.timing import measure

NAME = "guard_overhead"
DESCRIPTION = "cached call of a 2-tensor fn vs its graph, backend=eager"


def add_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * y + x


def _capture_graph(compile_fn: Callable, reset: Callable[[], None], args: tuple) -> torch.fx.GraphModule:
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(gm)
        return gm.forward

    compile_fn(add_mul, backend=record)(*args)
    reset()
    if len(graphs) != 1:
        raise RuntimeError(f"expected one graph for add_mul, got {len(graphs)}")
    return graphs[0]


def _one_system(compile_fn: Callable, reset: Callable[[], None], args: tuple, quick: bool) -> dict:
    samples = 7 if quick else 31
    reset()
    gm = _capture_graph(compile_fn, reset, args)
    compiled = compile_fn(add_mul, backend="eager")
    expected = add_mul(*args)
    got = compiled(*args)
    if not torch.equal(got, expected):
        raise AssertionError("compiled add_mul returned a different result than eager")
    # interleaved samples: on a shared machine both sides of each pair see the same load, and the
    # median of the pairwise differences is the overhead
    pairs = [
        (measure(lambda: compiled(*args), warmup=20, samples=1, min_sample_s=0.005).us,
         measure(lambda: gm.forward(*args), warmup=20, samples=1, min_sample_s=0.005).us)
        for _ in range(samples)
    ]
    result = {
        "compiled_call_us": statistics.median(c for c, _ in pairs),
        "graph_call_us": statistics.median(g for _, g in pairs),
        "overhead_us": statistics.median(c - g for c, g in pairs),
    }
    reset()
    return result


def run(quick: bool, kiln_unavailable: str | None) -> dict:
    """`kiln_unavailable` is None when kiln.compile exists, else the reason it does not."""
    args = (torch.randn(4), torch.randn(4))
    eager = measure(lambda: add_mul(*args), warmup=50, samples=5 if quick else 25, min_sample_s=0.01)
    result: dict = {"eager_call_us": eager.us}
    result["torch"] = _one_system(torch.compile, torch._dynamo.reset, args, quick)
    if kiln_unavailable is not None:
        result["kiln"] = {"status": f"not available: {kiln_unavailable}"}
        return result
    import kiln

    try:
        result["kiln"] = _one_system(kiln.compile, kiln.reset, args, quick)
    except Exception as exc:
        result["kiln"] = {"status": f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    return result
