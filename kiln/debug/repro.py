"""A failing FX graph as a program of its own: run a stage on it, judge it, write it as repro.py.

`graph_failure(gm, inputs, stage)` runs one stage ("lower": kiln.lower.compile_graph on an ATen
graph; "aot": AOT autograd with eager ATen graphs, "inductor": the whole backend, both on a
torch-level graph) and says how its result differs from running `gm` eagerly (an exception, or
values beyond tolerance against a float64 run). `write_repro` writes a standalone repro.py: the
graph as Python, the inputs' metadata (random values, or saved ones when random values do not fail),
the stage, and a check that exits non-zero while the bug is there. With KILN_REPRO_AFTER=capture|
aot|lower the backend writes one by itself when a stage fails (see `watch`). Counterpart:
torch/_dynamo/repro/after_dynamo.py and after_aot.py.
"""
from __future__ import annotations

import copy
import os
import textwrap
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.utils import _pytree as pytree

from kiln import config
from kiln.debug.accuracy import Outcome, clone_inputs, compare
from kiln.log import warn
from kiln.runtime.overlap import strided_copy

STAGES = ("lower", "aot", "inductor")
REPRO_AFTER = ("capture", "aot", "lower")


@dataclass(frozen=True)
class Failure:
    """How a stage's run of a graph went wrong: an exception (its type) or wrong values."""

    kind: str  # "exception" or "accuracy"
    exc_type: str | None
    message: str

    def same_as(self, other: "Failure | None") -> bool:
        return other is not None and self.kind == other.kind and self.exc_type == other.exc_type

    def __str__(self) -> str:
        return f"{self.exc_type}: {self.message}" if self.kind == "exception" else f"wrong result: {self.message}"


def compile_stage(stage: str, gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
    """The callable a stage makes of `gm` (its inputs are real tensors standing in for examples)."""
    if stage == "lower":
        from kiln.lower import compile_graph

        return compile_graph(gm, list(inputs))
    if stage == "aot":
        from kiln.autograd import aot_eager

        return aot_eager(gm, list(inputs))
    if stage == "inductor":
        from kiln.backends import inductor

        return inductor(gm, list(inputs))
    raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")


def _run_eagerly(gm: torch.fx.GraphModule, inputs: Sequence[Any], dtype: torch.dtype | None = None) -> Outcome:
    try:
        out = gm(*clone_inputs(list(inputs), dtype))
    except Exception as exc:
        return Outcome(error=exc)
    return Outcome([o.detach() if isinstance(o, torch.Tensor) else o for o in pytree.tree_leaves(out)])


def graph_failure(gm: torch.fx.GraphModule, inputs: Sequence[Any], stage: str) -> Failure | None:
    """How `stage` fails on gm with these inputs, or None when it matches gm run eagerly (a graph
    that fails eagerly too is no failure of the stage: None)."""
    reference = _run_eagerly(gm, inputs)
    if reference.failed:
        return None
    reference64 = _run_eagerly(gm, inputs, torch.float64)
    try:
        # the stage runs unwatched: a repro written from inside this check would check itself again
        with config.patch(repro_after=None, report_dir=None):
            compiled = compile_stage(stage, copy.deepcopy(gm), inputs)
            out = compiled(*clone_inputs(list(inputs)))
    except Exception as exc:  # a crash of the stage, while compiling or running what it made
        first = str(exc).strip().splitlines()
        return Failure("exception", type(exc).__name__, first[0][:300] if first else "")
    result = Outcome([o.detach() if isinstance(o, torch.Tensor) else o for o in pytree.tree_leaves(out)])
    why = compare(reference, result, None if reference64.failed else reference64)
    return None if why is None else Failure("accuracy", None, why)


# ---------------------------------------------------------------------------------------------------
# Inputs: metadata, random values of that metadata


def input_spec(x: Any) -> tuple:
    """What a repro needs to make an input like x: ("tensor", sizes, strides, dtype, requires_grad)
    or ("value", x) for an int, float or bool."""
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(int(s) for s in x.shape), tuple(int(s) for s in x.stride()), str(x.dtype),
                bool(x.requires_grad))
    if isinstance(x, (torch.SymInt, torch.SymFloat)):
        raise ValueError("a symbolic size as a graph input: minify works on static graphs only")
    return ("value", x)


def make_input(spec: tuple, gen: torch.Generator) -> Any:
    """A random input of this metadata (small non-negative integers, so they are valid indices)."""
    if spec[0] == "value":
        return spec[1]
    _, sizes, strides, dtype_name, requires_grad = spec
    dtype = getattr(torch, dtype_name.replace("torch.", ""))
    extent = 1 + sum((s - 1) * st for s, st in zip(sizes, strides) if s > 0)
    if dtype.is_floating_point or dtype.is_complex:
        storage = torch.randn(extent, generator=gen).to(dtype)
    elif dtype == torch.bool:
        storage = torch.randint(0, 2, (extent,), generator=gen).bool()
    else:
        storage = torch.randint(0, 2, (extent,), generator=gen).to(dtype)
    # a tensor of its own with exactly this layout (an expanded one's too: kiln.runtime.overlap)
    out = strided_copy(torch.as_strided(storage, sizes, strides), strides)
    return out.requires_grad_(requires_grad and out.is_floating_point())


def random_inputs(specs: Sequence[tuple], seed: int = 0) -> list[Any]:
    gen = torch.Generator().manual_seed(seed)
    return [make_input(spec, gen) for spec in specs]


# ---------------------------------------------------------------------------------------------------
# repro.py


def graph_source(gm: torch.fx.GraphModule) -> str:
    """gm's forward as a method body of the repro's module (refuses graphs naming Python objects)."""
    code = gm.graph.python_code("self")
    unknown = set(code.globals) - {"inf", "nan", "infj", "nanj", "NoneType", "torch", "device", "fx_pytree", "pytree"}
    if unknown:
        raise ValueError(f"the graph refers to objects a repro cannot name: {', '.join(sorted(unknown))}")
    return textwrap.indent(code.src.strip() + "\n", "    ")


def write_repro(gm: torch.fx.GraphModule, inputs: Sequence[Any], stage: str, failure: Failure, path: str,
                *, note: str = "") -> str:
    """Write repro.py at `path` (a folder or a file name); saves the inputs beside it when random
    inputs of the same metadata do not fail the same way. Returns the file's path."""
    if os.path.isdir(path) or not path.endswith(".py"):
        os.makedirs(path, exist_ok=True)
        path = os.path.join(path, "repro.py")
    specs = [input_spec(x) for x in inputs]
    saved = None
    if not failure.same_as(graph_failure(gm, random_inputs(specs), stage)):
        saved = os.path.splitext(path)[0] + "_inputs.pt"
        torch.save([x.detach() if isinstance(x, torch.Tensor) else x for x in inputs], saved)
    nodes = sum(n.op == "call_function" for n in gm.graph.nodes)
    text = REPRO_TEMPLATE.format(
        when=time.strftime("%Y-%m-%d %H:%M:%S"), stage=stage, nodes=nodes, failure=str(failure).replace('"""', "'''"),
        note=note, graph=graph_source(gm), specs=",\n    ".join(repr(s) for s in specs),
        saved=repr(os.path.basename(saved)) if saved else "None", kind=failure.kind, exc_type=failure.exc_type)
    with open(path, "w") as f:
        f.write(text)
    return path


REPRO_TEMPLATE = '''"""Repro written by kiln.debug ({when}): stage "{stage}" fails on this {nodes}-node graph.

{failure}
{note}
Run it: `python repro.py` exits with status 1 while the bug is there and 0 once it is fixed.
"""
import os
import sys

import torch
from math import inf, nan
infj, nanj = complex(0.0, inf), complex(0.0, nan)  # FX prints complex(inf, -inf) as (inf-infj)

from kiln.debug.repro import check_repro

device = torch.device
NoneType = type(None)


class Repro(torch.nn.Module):
{graph}

INPUTS = [
    {specs},
]
SAVED_INPUTS = {saved}  # the inputs themselves, when random ones of the same metadata do not fail

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    saved = os.path.join(here, SAVED_INPUTS) if SAVED_INPUTS else None
    sys.exit(check_repro(Repro(), INPUTS, stage="{stage}", kind="{kind}", exc_type={exc_type!r}, saved=saved))
'''


def check_repro(module: torch.nn.Module, specs: Sequence[tuple], *, stage: str, kind: str,
                exc_type: str | None, saved: str | None = None) -> int:
    """What a repro.py runs: 1 (and the failure printed) if the stage fails as recorded, else 0."""
    gm = torch.fx.symbolic_trace(module)
    inputs = torch.load(saved) if saved else random_inputs(specs)
    failure = graph_failure(gm, inputs, stage)
    expected = Failure(kind, exc_type, "")
    if expected.same_as(failure):
        print(f"FAILS (stage {stage}): {failure}")
        return 1
    print(f"passes: stage {stage} " + ("matches eager" if failure is None else f"fails differently: {failure}"))
    return 0


# ---------------------------------------------------------------------------------------------------
# KILN_REPRO_AFTER


_run_folder: dict[str, str] = {}  # config.repro_dir -> this process's folder under it


def repro_dir() -> str:
    """This process's folder of automatic repros (one per process, under config.repro_dir)."""
    if config.repro_dir not in _run_folder:
        _run_folder[config.repro_dir] = os.path.join(config.repro_dir, time.strftime("run_%Y%m%d_%H%M%S") + f"_{os.getpid()}")
    return _run_folder[config.repro_dir]


_written = [0]


def _write_automatic(gm: torch.fx.GraphModule, inputs: Sequence[Any], stage: str, failure: Failure) -> None:
    folder = os.path.join(repro_dir(), f"repro_{_written[0]}")
    _written[0] += 1
    try:
        path = write_repro(gm, inputs, stage, failure, folder, note="Written by KILN_REPRO_AFTER.")
    except Exception as exc:  # the stage's own failure matters more than the repro's
        warn(f"kiln: KILN_REPRO_AFTER could not write a repro: {type(exc).__name__}: {exc}")
        return
    warn(f"kiln: stage {stage!r} failed ({failure}); repro written to {path}")


def _examples(example_inputs: Sequence[Any], seed: int = 0) -> list[Any]:
    return random_inputs([input_spec(concrete(x)) for x in example_inputs], seed)


def concrete(x: Any) -> Any:
    """A real tensor of a fake's metadata (its values are never read)."""
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(tuple(int(s) for s in x.shape), tuple(int(s) for s in x.stride()), dtype=x.dtype)
    return x


def watch(stage_fn: Callable[..., Any], stage: str, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
    """Run `stage_fn(gm, example_inputs)`; when it raises, or what it returns raises (or, for the
    lowering under KILN_REPRO_AFTER=lower, returns values that differ from the graph run eagerly),
    write a repro of gm and re-raise. What the stage returns is wrapped only for that check."""
    saved = copy.deepcopy(gm)
    try:
        compiled = stage_fn(gm, example_inputs)
    except Exception as exc:
        first = str(exc).strip().splitlines()
        _write_automatic(saved, _examples(example_inputs), stage,
                         Failure("exception", type(exc).__name__, first[0][:300] if first else ""))
        raise
    checked = [False]

    def run(*args: Any) -> Any:
        if checked[0]:
            return compiled(*args)
        checked[0] = True
        real = clone_inputs(list(args))
        try:
            out = compiled(*args)
        except Exception as exc:
            first = str(exc).strip().splitlines()
            _write_automatic(saved, real, stage, Failure("exception", type(exc).__name__, first[0][:300] if first else ""))
            raise
        if config.repro_after == "lower" and stage == "lower":
            failure = graph_failure(saved, real, stage)
            if failure is not None:
                _write_automatic(saved, real, stage, failure)
        return out

    for name in ("aot_report", "kernel_count", "cpp_source", "wrapper_source"):
        if hasattr(compiled, name):  # keep what reports and benchmarks read off the compiled graph
            try:
                setattr(run, name, getattr(compiled, name))
            except AttributeError:
                pass
    return run


def watched_inductor(aot_autograd: Callable[..., Any], fw_compiler: Callable[..., Any],
                     bw_compiler: Callable[..., Any]) -> Callable[..., Any]:
    """The inductor backend as KILN_REPRO_AFTER asks: "capture" watches the whole backend on the
    captured graph, "aot" and "lower" watch the lowering of each ATen graph."""
    when = config.repro_after
    if when not in REPRO_AFTER:
        raise ValueError(f"KILN_REPRO_AFTER={when!r}: expected one of {', '.join(REPRO_AFTER)}")
    if when == "capture":
        backend = aot_autograd(fw_compiler, bw_compiler)
        return lambda gm, example_inputs: watch(backend, "inductor", gm, example_inputs)

    def watched(compiler: Callable[..., Any]) -> Callable[..., Any]:
        return lambda gm, example_inputs: watch(compiler, "lower", gm, example_inputs)

    return aot_autograd(watched(fw_compiler), watched(bw_compiler))


__all__ = ["Failure", "STAGES", "check_repro", "graph_failure", "input_spec", "random_inputs", "watch",
           "watched_inductor", "write_repro"]
