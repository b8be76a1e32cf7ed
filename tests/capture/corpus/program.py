"""What one corpus case is: a builder of a fresh program, and the registry of every case.

A case is a function decorated with `@case(category, ...)` that returns a `Program`: the subject to
compile (a function or an nn.Module), the arguments of each call, what to change between calls
(recompile cases), and what side effects to observe. The builder runs once per engine (eager, the
real torch.compile, Kiln), after the seeds are reset, so each engine starts from the same fresh
objects, closures and inputs. The oracle that runs them lives in corpus/oracle.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch


@dataclass
class Call:
    """Positional and keyword arguments of one call (a plain tuple in `Program.calls` means no keywords)."""

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def kw(*args: Any, **kwargs: Any) -> Call:
    return Call(args, kwargs)


@dataclass
class Program:
    """One program of a case, built fresh for each engine.

    subject: what gets compiled: a function, a bound method or an nn.Module.
    calls: the arguments of each call, in order (a tuple, or a Call for keywords).
    between: run before call i (i >= 1) with the subject as the engine sees it (the compiled module,
        so `setattr` on it is tested too) and i: mutates globals, closures, containers, attributes.
    observe: after every call, the side effects to compare (a list the program appends to, an
        object's attributes, a global), snapshotted like outputs.
    drive: replaces `calls` for programs that need more than calls (backward passes, hooks, dir()):
        takes the subject as the engine sees it and returns what to compare.
    """

    subject: Any
    calls: Sequence[tuple | Call] = ((),)
    between: Callable[[Any, int], None] | None = None
    observe: Callable[[], Any] | None = None
    drive: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Case:
    name: str
    category: str
    build: Callable[[], Program]
    fullgraph: bool
    counts: bool  # Kiln's graph count must equal torch.compile's (recompile and call-order cases)


CASES: dict[str, Case] = {}


def case(category: str, *, fullgraph: bool = True, counts: bool = False) -> Callable[[Callable[[], Program]], Callable[[], Program]]:
    """Register the decorated builder as a case named after it; fullgraph=True compiles with fullgraph."""

    def register(build: Callable[[], Program]) -> Callable[[], Program]:
        name = build.__name__
        if name in CASES:
            raise ValueError(f"two corpus cases are named {name!r}")
        CASES[name] = Case(name, category, build, fullgraph, counts)
        return build

    return register


def t(*shape: int, dtype: torch.dtype = torch.float32, requires_grad: bool = False) -> torch.Tensor:
    """A random input from the global generator (the oracle seeds it before each build)."""
    if dtype.is_floating_point:
        value = torch.randn(*shape, dtype=dtype)
    else:
        value = torch.randint(-5, 10, shape, dtype=dtype)
    return value.requires_grad_(requires_grad)


def fn_program(fn: Callable[..., Any], *calls: tuple | Call, **kwargs: Any) -> Program:
    """The common shape: a function called with the given arguments (once, with (), if none)."""
    return Program(fn, calls or ((),), **kwargs)
