"""The end-to-end harness: run a corpus program eagerly, through kiln.compile and through the real
torch.compile, and compare what each did.

A `Program` is a fresh function or nn.Module plus the calls to make on it (built anew for every
run from fixed seeds, so in-place updates in one run never leak into another). Each run records,
per call, the output, the program's observable state (buffers, mutated inputs, gradients) and the
cumulative number of graphs handed to the backend: a counting backend wraps Kiln's named backend,
and the same counting wraps torch.compile's eager backend as the oracle of graph and recompile
counts (the role of torch._dynamo.testing.CompileCounter).
"""
from __future__ import annotations

import contextlib
import importlib
import io
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree


@dataclass
class Program:
    fn: Callable  # what gets compiled: a function or an nn.Module
    calls: list[tuple[tuple, dict]]  # (args, kwargs) of each call, in order
    state: Callable[[], Any] = lambda: None  # what a call may have changed besides its output
    backward: bool = False  # after each call, sum the tensor outputs and run backward
    grads_of: list[torch.Tensor] = field(default_factory=list)  # leaves whose .grad is compared


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], Program]
    breaks: bool = False  # has graph breaks: Kiln may use fewer graphs than torch.compile, never more
    tol: float = 1e-5


CASES: dict[str, Case] = {}


def case(name: str | None = None, *, breaks: bool = False, tol: float = 1e-5) -> Callable:
    """Register a program builder in the corpus under its function name (or `name`)."""

    def register(build: Callable[[], Program]) -> Callable[[], Program]:
        key = name or build.__name__
        if key in CASES:
            raise ValueError(f"duplicate e2e case {key!r}")
        CASES[key] = Case(key, build, breaks, tol)
        return build

    return register


@dataclass
class Run:
    outputs: list[Any]  # per call: (output, state after the call, grads after backward)
    graphs: list[int]  # cumulative graphs compiled after each call
    stdout: str  # what the calls printed, in order
    warnings: list[str] = field(default_factory=list)  # first line of each warning raised (fallbacks)


def counting(inner: Callable) -> tuple[Callable, list[int]]:
    """A backend that counts the graphs it is given and delegates to `inner`."""
    count = [0]

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        count[0] += 1
        return inner(gm, example_inputs)

    return backend, count


def _snapshot(value: Any) -> Any:
    """A copy of `value` that later in-place updates cannot change."""
    return pytree.tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, value)


def run_program(program: Program, wrap: Callable[[Callable], Callable], count: list[int] | None = None) -> Run:
    fn = wrap(program.fn)
    outputs, graphs = [], []
    printed = io.StringIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for args, kwargs in program.calls:
            _call(program, fn, args, kwargs, printed, outputs)
            graphs.append(count[0] if count is not None else 0)
    messages = list(dict.fromkeys(str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()))
    return Run(outputs, graphs, printed.getvalue(), messages)


def _call(program: Program, fn: Callable, args: tuple, kwargs: dict, printed: io.StringIO, outputs: list) -> None:
    for leaf in program.grads_of:
        leaf.grad = None
    with contextlib.redirect_stdout(printed):
        out = fn(*args, **kwargs)
    grads = None
    if program.backward:
        tensors = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        sum(t.sum() for t in tensors).backward()
        grads = [leaf.grad for leaf in program.grads_of]
    outputs.append(_snapshot((out, program.state(), grads)))


def assert_same_results(expected: Run, got: Run, tol: float) -> None:
    assert got.stdout == expected.stdout, "printed output differs from eager"
    for i, (want, have) in enumerate(zip(expected.outputs, got.outputs, strict=True)):
        want_leaves, want_spec = pytree.tree_flatten(want)
        have_leaves, have_spec = pytree.tree_flatten(have)
        assert have_spec == want_spec, f"call {i}: structure differs from eager:\n{have_spec}\nvs\n{want_spec}"
        for a, b in zip(have_leaves, want_leaves):
            if isinstance(b, torch.Tensor):
                assert isinstance(a, torch.Tensor), f"call {i}: got {type(a).__name__} where eager has a tensor"
                torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"call {i}: {m}")
            else:
                assert a == b, f"call {i}: {a!r} != eager's {b!r}"


def torch_oracle(program: Program) -> Run:
    """The real torch.compile with a counting eager backend: the reference graph counts."""
    import torch._dynamo

    torch._dynamo.reset()
    backend, count = counting(lambda gm, example_inputs: gm.forward)
    try:
        return run_program(program, lambda fn: torch.compile(fn, backend=backend), count)
    finally:
        torch._dynamo.reset()


KILN_BACKEND_NEEDS = {  # what each backend runs through; without it kiln.backends substitutes "eager"
    "eager": [("kiln.capture", "capture_frame")],
    "aot_eager": [("kiln.capture", "capture_frame"), ("kiln.autograd", "aot_eager")],
    "inductor": [("kiln.capture", "capture_frame"), ("kiln.autograd", "aot_autograd"),
                 ("kiln.lower", "compile_graph")],
}


def missing_stage(backend: str) -> str | None:
    """Why Kiln's `backend` cannot run yet (its stage has not landed), or None when it can. A stage
    that exists but fails to import raises here, so the test fails instead of skipping."""
    for module, attr in KILN_BACKEND_NEEDS[backend]:
        try:
            found = getattr(importlib.import_module(module), attr, None)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise  # the stage exists but is broken: that must fail, not skip
            return f"{module} does not exist yet"
        if found is None:
            return f"{module}.{attr} does not exist yet"
    return None


def kiln_run(program: Program, backend: str) -> Run:
    import kiln
    import kiln.backends

    kiln.reset()
    counted, count = counting(kiln.backends.lookup(backend))
    try:
        return run_program(program, lambda fn: kiln.compile(fn, backend=counted), count)
    finally:
        kiln.reset()
