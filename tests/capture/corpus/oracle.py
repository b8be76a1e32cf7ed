"""Run one corpus case eagerly, through the real torch.compile and through Kiln, and judge Kiln.

Each engine gets a fresh program (the case's builder, after the seeds are reset) and records, per
call: the outputs, the arguments and the compiled module afterwards (in-place updates, attribute
writes) and the case's observed side effects, all snapshotted at that moment; or the exception the
call raised. Prints are captured for every engine. torch.compile runs with backend
`CompileCounter` (eager's ops, counting graphs); Kiln with backend="eager". Kiln's outcome is one of
PASS, WRONG (a silent difference from eager: the worst), ERROR (an internal error: a fallback
warning, or an exception with Kiln's compile note), BREAK (a graph break under fullgraph=True),
CRASH (any other exception eager does not raise) and COUNT (graph count differs from
torch.compile's where the case asks for equal counts). torch.compile's outcome is read from
corpus/torch_outcomes.json where it was recorded for the code as it is (corpus/recorded.py).
"""
from __future__ import annotations

import contextlib
import io
import math
import random
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

import kiln
from kiln.errors import GraphBreakError
from kiln.log import KilnWarning

from .program import Call, Case, Program
from .recorded import TorchOutcome, recorded

PASS, WRONG, ERROR, BREAK, CRASH, COUNT = "pass", "wrong", "error", "break", "crash", "count"
KILN_NOTE = "while kiln compiled"


@dataclass(frozen=True)
class TensorSnap:
    dtype: torch.dtype
    shape: tuple[int, ...]
    requires_grad: bool
    values: torch.Tensor

    def __repr__(self) -> str:
        return f"tensor({self.values.tolist()}, {self.dtype}{', grad' if self.requires_grad else ''})"


@dataclass(frozen=True)
class Raised:
    error: BaseException

    def __repr__(self) -> str:
        lines = [line.strip() for line in str(self.error).splitlines() if line.strip()]
        return f"raised {type(self.error).__name__}: {' / '.join(lines[:3])[:240]}"


_MODULE_INTERNALS = {"training", "_parameters", "_buffers", "_modules"}


def snapshot(value: Any, depth: int = 0) -> Any:
    """A copy of `value` as it is now, comparable across engines (objects by type and attributes)."""
    if depth > 8:
        return "..."
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, torch.dtype, torch.device,
                                          torch.Size, range, slice)):
        return value
    if isinstance(value, torch.Tensor):
        return TensorSnap(value.dtype, tuple(value.shape), value.requires_grad, value.detach().clone())
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, value.tolist())
    if isinstance(value, np.generic):
        return ("np", str(value.dtype), value.item())
    if isinstance(value, tuple):
        return (type(value).__qualname__, tuple(snapshot(v, depth + 1) for v in value))
    if isinstance(value, list) or type(value).__name__ == "deque":
        return (type(value).__qualname__, [snapshot(v, depth + 1) for v in value])
    if isinstance(value, dict):
        return (type(value).__qualname__, [(snapshot(k, depth + 1), snapshot(v, depth + 1)) for k, v in value.items()])
    if isinstance(value, (set, frozenset)):
        return (type(value).__qualname__, sorted((snapshot(v, depth + 1) for v in value), key=repr))
    if isinstance(value, torch.nn.Module):
        state = {k: snapshot(v, depth + 1) for k, v in value.state_dict(keep_vars=True).items()}
        plain = {k: snapshot(v, depth + 1) for k, v in vars(value).items()
                 if k not in _MODULE_INTERNALS and not k.startswith("_") and not callable(v)}
        return ("module", type(value).__qualname__, value.training, state, plain)
    if isinstance(value, type):
        return ("class", value.__qualname__)
    if callable(value) and not hasattr(value, "__dict__"):
        return ("callable", getattr(value, "__qualname__", type(value).__qualname__))
    if hasattr(value, "__dict__") and not callable(value):
        return ("object", type(value).__qualname__, snapshot(dict(vars(value)), depth + 1))
    if callable(value):
        return ("callable", getattr(value, "__qualname__", type(value).__qualname__))
    if type(value).__eq__ is not object.__eq__:
        return _Eq(value)  # slots or a C type: its own __eq__ compares it
    return ("object", type(value).__qualname__)


@dataclass(frozen=True)
class _Eq:
    """An object without attributes to snapshot whose class defines __eq__: compared with it."""

    value: Any


def differ(got: Any, expected: Any, where: str = "") -> str | None:
    """The first difference between two snapshots, in words, or None."""
    if isinstance(expected, TensorSnap):
        if not isinstance(got, TensorSnap):
            return f"{where}: got {got!r}, expected {expected!r}"
        if (got.dtype, got.shape, got.requires_grad) != (expected.dtype, expected.shape, expected.requires_grad):
            return f"{where}: got {got.dtype} {got.shape} grad={got.requires_grad}, " \
                   f"expected {expected.dtype} {expected.shape} grad={expected.requires_grad}"
        if not torch.allclose(got.values, expected.values, rtol=1e-5, atol=1e-6, equal_nan=True) \
                if expected.dtype.is_floating_point or expected.dtype.is_complex \
                else not torch.equal(got.values, expected.values):
            return f"{where}: got {got!r}, expected {expected!r}"
        return None
    if isinstance(expected, Raised):
        if not isinstance(got, Raised) or type(got.error) is not type(expected.error):
            return f"{where}: got {got!r}, expected {expected!r}"
        return None
    if isinstance(expected, _Eq):
        if not isinstance(got, _Eq) or type(got.value) is not type(expected.value):
            return f"{where}: got {got!r}, expected {expected!r}"
        try:
            return None if bool(got.value == expected.value) else f"{where}: got {got.value!r}, expected {expected.value!r}"
        except Exception as exc:
            return f"{where}: comparing raised {exc!r}"
    if isinstance(expected, (tuple, list)):
        if type(got) is not type(expected) or len(got) != len(expected):
            return f"{where}: got {got!r}, expected {expected!r}"
        for k, (g, e) in enumerate(zip(got, expected)):
            why = differ(g, e, f"{where}[{k}]")
            if why:
                return why
        return None
    if isinstance(expected, dict):
        if not isinstance(got, dict) or list(got) != list(expected):
            return f"{where}: got {got!r}, expected {expected!r}"
        for k in expected:
            why = differ(got[k], expected[k], f"{where}.{k}")
            if why:
                return why
        return None
    if isinstance(expected, float) and isinstance(got, float) and math.isnan(expected) and math.isnan(got):
        return None
    if type(got) is not type(expected) or got != expected:
        return f"{where}: got {got!r}, expected {expected!r}"
    return None


@dataclass
class Run:
    observed: list[Any]  # per call: (output, arguments afterwards, subject afterwards, side effects) or Raised
    stdout: str
    graphs: int
    breaks: int
    warnings: list[str]


def _call(subject: Any, call: tuple | Call) -> Any:
    if isinstance(call, Call):
        return subject(*call.args, **call.kwargs)
    return subject(*call)


def _args_of(call: tuple | Call) -> Any:
    return (call.args, call.kwargs) if isinstance(call, Call) else call


def execute(case: Case, engine: str) -> Run:
    """Build the case's program fresh and run it on `engine` ("eager", "torch" or "kiln")."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    grad_mode, default_dtype = torch.is_grad_enabled(), torch.get_default_dtype()
    program: Program = case.build()
    counter = CompileCounter()
    if engine == "torch":
        torch._dynamo.reset()
        subject = torch.compile(program.subject, backend=counter, fullgraph=case.fullgraph)
    elif engine == "kiln":
        kiln.reset()
        subject = kiln.compile(program.subject, backend="eager", fullgraph=case.fullgraph)
    else:
        subject = program.subject
    observed: list[Any] = []
    stdout = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(stdout):
        warnings.simplefilter("always")
        try:
            if program.drive is not None:
                observed.append(_guarded(lambda: snapshot(program.drive(subject))))
            else:
                for i, call in enumerate(program.calls):
                    if i and program.between is not None:
                        observed.append(_guarded(lambda: program.between(subject, i)))
                    observed.append(_guarded(lambda: snapshot(_call(subject, call))))
                    after = snapshot(_args_of(call))
                    module = snapshot(program.subject) if isinstance(program.subject, torch.nn.Module) else None
                    observe = program.observe
                    effects = _guarded(lambda: snapshot(observe())) if observe is not None else None
                    observed.append((after, module, effects))
        finally:
            torch.set_grad_enabled(grad_mode)
            torch.set_default_dtype(default_dtype)
    if engine == "kiln":
        stats = kiln.stats()
        graphs, breaks = int(stats["graphs"]), int(stats["graph_breaks"])
    else:
        graphs, breaks = counter.frame_count, 0
    kiln_warnings = [str(w.message) for w in caught if issubclass(w.category, KilnWarning)]
    return Run(observed, stdout.getvalue(), graphs, breaks, kiln_warnings)


def _guarded(thunk: Any) -> Any:
    try:
        return thunk()
    except Exception as exc:  # the program's own exception is part of what must match
        return Raised(exc)


def first_difference(run: Run, eager: Run) -> tuple[Any, str] | None:
    """(what the compiled run saw at the first difference, the difference in words), or None."""
    for k, (got, expected) in enumerate(zip(run.observed, eager.observed)):
        why = differ(got, expected, f"step {k}")
        if why:
            return got, why
    if len(run.observed) != len(eager.observed):
        return None, f"{len(run.observed)} steps, eager had {len(eager.observed)}"
    if run.stdout != eager.stdout:
        return None, f"printed {run.stdout[:200]!r}, eager printed {eager.stdout[:200]!r}"
    return None


@dataclass(frozen=True)
class Outcome:
    case: Case
    torch_passes: bool
    torch_why: str | None
    kiln: str  # PASS, WRONG, ERROR, BREAK, CRASH or COUNT
    kiln_why: str | None
    torch_graphs: int
    kiln_graphs: int
    kiln_breaks: int


def torch_outcome(case: Case, live: bool = False) -> TorchOutcome:
    """torch.compile's outcome on `case`: recorded (corpus/recorded.py) where the record holds, else run."""
    if not live:
        known = recorded(case)
        if known is not None:
            return known
    eager, dynamo = execute(case, "eager"), execute(case, "torch")
    difference = first_difference(dynamo, eager)
    return TorchOutcome(difference is None, difference[1] if difference else None, dynamo.graphs)


def judge(case: Case, live_torch: bool = False) -> Outcome:
    torch_run = torch_outcome(case, live=live_torch)
    eager = execute(case, "eager")
    mine = execute(case, "kiln")
    verdict, why = PASS, None
    difference = first_difference(mine, eager)
    if difference is not None:
        got, why = difference
        if isinstance(got, Raised) and isinstance(got.error, GraphBreakError):
            verdict = BREAK
        elif isinstance(got, Raised) and any(KILN_NOTE in note for note in getattr(got.error, "__notes__", [])):
            verdict = ERROR
        elif isinstance(got, Raised) and not any(isinstance(e, Raised) and type(e.error) is type(got.error)
                                                 for e in eager.observed):
            verdict = CRASH
        else:
            verdict = WRONG
    elif mine.warnings:
        verdict, why = ERROR, mine.warnings[0][:300]
    elif case.counts and torch_run.passes and mine.graphs != torch_run.graphs:
        verdict, why = COUNT, f"{mine.graphs} graphs, torch.compile made {torch_run.graphs}"
    return Outcome(case, torch_run.passes, torch_run.why, verdict, why, torch_run.graphs, mine.graphs, mine.breaks)
