"""A frame that runs eagerly still has its callees compiled, as torch.compile skips one frame only.

When capture gives a frame up (an error on the path is_compiling() chose, a frame reading its own
frame object, a torch mode manager entered by hand, a frame that traced no tensor op, an internal
error), torch.compile runs that frame's bytecode in CPython while the frames it calls are still
compiled on their own. Before, Kiln ran the whole subtree eagerly: 0 graphs where torch.compile
makes one per callee (transformers' SwitchTransformers: 0 against 10). Each case here compares
the values (and gradients) with eager and the graph count with the real torch.compile's.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import warnings

import pytest
import torch
import torch._dynamo
from torch import nn

import kiln
from eager_compare import dynamo_graphs
from kiln.log import KilnWarning


# ---- callees --------------------------------------------------------------------------------------

def plain(x):
    return torch.sin(x) * 2 + 1


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.lin(x)) + x


class Scaler:
    def __init__(self, k: float) -> None:
        self.k = k

    def apply(self, x):
        return torch.cos(x) * self.k


def _make_closure(k: float):
    def scaled(x):
        return torch.exp(-x * x) * k
    return scaled


BLOCK = Block()
SCALER = Scaler(3.0)
CLOSURE = _make_closure(0.5)


def with_break(x):
    y = torch.sin(x) + 1
    torch._dynamo.graph_break()
    return y * torch.cos(x)


def offset(x, by):
    return torch.sigmoid(x) + by


CALLEES = {
    "function": plain,
    "partial": functools.partial(offset, by=2.0),
    "module": BLOCK,
    "method": SCALER.apply,
    "closure": CLOSURE,
    "own_break": with_break,
}


# ---- frames that are given up, each calling `CALL(x)` --------------------------------------------

CALL = plain  # each test sets the callee its frames call (a global, as in user code)


def on_compiling_path(x, m=None):
    y = CALL(x)  # before the read: a break inside CALL makes the frame a resume function (eager's path)
    if not torch.compiler.is_compiling():
        m = x + 1
    return y * m[0]


NAMES: list[str] = []


def reads_own_frame(x):
    NAMES.append(sys._getframe().f_code.co_name)  # torch.compile breaks here, Kiln gives the frame up
    return CALL(x)


def manager_by_hand(x):
    stack = contextlib.ExitStack()
    stack.__enter__()
    stack.enter_context(torch.no_grad())
    stack.__exit__(None, None, None)
    return CALL(x) - 1


def no_ops_first(x, flag=False):
    if flag:
        return CALL(x)
    return x


FRAMES = {
    "compiling_path": (on_compiling_path, [()]),
    "frame_introspection": (reads_own_frame, [()]),
    "frame_eager": (manager_by_hand, [()]),
    "no_tensor_ops": (no_ops_first, [(False,), (True,), (True,)]),
}


def _calls(fn, extra, x):
    return [fn(x, *e) for e in extra]


def _kiln_graphs(fn, extra, x):
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    return _calls(compiled, extra, x), backend.frame_count


# A break inside the callee on the is_compiling() path makes the frame a chain of resume functions,
# none of them given up (the one reading is_compiling() is eager's path): nothing to test there.
PAIRS = [(kind, callee) for kind in sorted(FRAMES) for callee in sorted(CALLEES)
         if (kind, callee) != ("compiling_path", "own_break")]


@pytest.mark.parametrize("kind,callee", PAIRS)
def test_callees_of_a_given_up_frame_are_compiled(kind, callee, monkeypatch) -> None:
    monkeypatch.setitem(globals(), "CALL", CALLEES[callee])
    fn, extra = FRAMES[kind]
    x = torch.randn(3, 4)
    want = _calls(fn, extra, x)
    got, graphs = _kiln_graphs(fn, extra, x)
    torch.testing.assert_close(got, want)
    assert kiln.stats()["fallbacks"] >= 1
    dynamo = dynamo_graphs(fn, lambda compiled: _calls(compiled, extra, x))
    assert graphs == dynamo, (graphs, dynamo)
    assert graphs >= 1


@pytest.mark.parametrize("callee", ["function", "module", "closure"])
def test_gradients_through_compiled_callees(callee, monkeypatch) -> None:
    monkeypatch.setitem(globals(), "CALL", CALLEES[callee])
    results = []
    for wrap in (lambda f: f, lambda f: kiln.compile(f, backend="aot_eager")):
        kiln.reset()
        BLOCK.zero_grad()
        x = torch.randn(3, 4, requires_grad=True)
        with torch.no_grad():
            x.copy_(torch.linspace(-1, 1, 12).view(3, 4))
        on = wrap(on_compiling_path)
        on(x).sum().backward()
        results.append((x.grad.clone(), [p.grad.clone() for p in BLOCK.parameters() if p.grad is not None]))
    (gx, gp), (kx, kp) = results
    torch.testing.assert_close(kx, gx)
    torch.testing.assert_close(kp, gp)
    assert kiln.stats()["graphs"] >= 1


# ---- recursion, generators, comprehensions, nested compiles -------------------------------------

def recursive(x, n):
    if not torch.compiler.is_compiling():
        m = x
    else:
        m = None
    if n == 0:
        return plain(x) * m[0]
    return plain(recursive(x, n - 1)) + m[0]


def test_a_frame_calling_itself_through_a_compiled_callee() -> None:
    x = torch.randn(2, 3)
    want = recursive(x, 3)
    got, graphs = _kiln_graphs(recursive, [(3,)], x)
    torch.testing.assert_close(got[0], want)
    assert graphs == dynamo_graphs(recursive, lambda c: c(x, 3)) == 1


def deep(x, n):
    if not torch.compiler.is_compiling():
        m = x
    else:
        m = None
    return x * m[0] if n == 0 else deep(x, n - 1) + plain(x)


def test_deep_recursion_adds_no_frames_per_level() -> None:
    """Eager runs 300 levels under a recursion limit of 400; each level of the skipped frame is
    called straight from the routed call site (no entry frames), so Kiln does too."""
    x = torch.randn(2)
    old = sys.getrecursionlimit()
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    compiled = kiln.compile(deep, backend=backend)
    compiled(x, 2)  # the frame is given up (and plain compiled) on a shallow call
    here = len(__import__("inspect").stack(0))
    sys.setrecursionlimit(here + 300 + 60)
    try:
        want = deep(x, 300)
        got = compiled(x, 300)
    finally:
        sys.setrecursionlimit(old)
    torch.testing.assert_close(got, want)
    assert backend.frame_count == 1


def gen_of(x):
    for i in range(2):
        yield plain(x) + i


def consumes_generator(x, m=None):
    if not torch.compiler.is_compiling():
        m = x
    ys = list(gen_of(x))
    return sum(BLOCK(y) for y in ys) * m[0] + sum([plain(y) for y in ys])


def test_generators_and_comprehensions_of_a_given_up_frame() -> None:
    x = torch.randn(3, 4)
    want = consumes_generator(x)
    got, graphs = _kiln_graphs(consumes_generator, [()], x)
    torch.testing.assert_close(got[0], want)
    assert graphs == dynamo_graphs(consumes_generator, lambda c: c(x)) == 2


def test_a_generator_function_compiled_itself_runs_eagerly_whole() -> None:
    """kiln.compile of a generator function: its body runs after the call returned, where
    torch.compile compiles nothing (0 graphs), so its callees stay eager."""
    def gen(x):
        yield plain(x)
        yield BLOCK(x)

    x = torch.randn(3, 4)
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    got = list(kiln.compile(gen, backend=backend)(x))
    torch.testing.assert_close(got, list(gen(x)))
    assert backend.frame_count == dynamo_graphs(gen, lambda c: list(c(x))) == 0
    # ... while a generator called by a given-up frame has its callees compiled (the test above)
    _, graphs = _kiln_graphs(consumes_generator, [()], x)
    assert graphs == 2


def test_nested_kiln_compile_and_library_callees() -> None:
    """A callee kiln.compile made keeps its own backend; torch's own modules and functions
    (nn.Linear, F.gelu) are not compiled, as torch.compile skips torch's files."""
    inner_backend = kiln.backends.CountingBackend()
    inner = kiln.compile(lambda y: torch.relu(y) + 2, backend=inner_backend)
    lin = nn.Linear(4, 4)

    def library(x, m=None):
        if not torch.compiler.is_compiling():
            m = x
        return lin(x) + nn.functional.gelu(x) + plain(x) * m[0]

    def nested(x, m=None):
        if not torch.compiler.is_compiling():
            m = x
        return inner(x) + plain(x) * m[0]

    x = torch.randn(3, 4)
    want = library(x)
    got, graphs = _kiln_graphs(library, [()], x)
    torch.testing.assert_close(got[0], want)
    assert graphs == dynamo_graphs(library, lambda c: c(x)) == 1  # plain's
    want = nested(x)
    got, graphs = _kiln_graphs(nested, [()], x)
    torch.testing.assert_close(got[0], want)
    assert graphs == 1 and inner_backend.frame_count >= 1  # plain's; the lambda only under its own backend


# ---- what stays as it was ------------------------------------------------------------------------

class _Raises(nn.Module):
    def forward(self, x):
        LOG.append("callee")
        if x.shape[0] == 3:
            raise ValueError("three rows")
        return x.sin()


LOG: list[str] = []


def raising_frame(x, m=None):
    if not torch.compiler.is_compiling():
        m = x
    LOG.append("frame")
    return _RAISES(x) * m[0]


_RAISES = _Raises()


def test_exceptions_and_side_effects_are_eagers() -> None:
    kiln.reset()
    compiled = kiln.compile(raising_frame, backend="eager")
    for x in (torch.randn(2, 4), torch.randn(3, 4)):
        outcomes = []
        for f in (raising_frame, compiled):
            LOG.clear()
            try:
                outcomes.append(("ok", f(x), list(LOG)))
            except ValueError as exc:
                outcomes.append(("raised", str(exc), list(LOG)))
        (ek, ev, elog), (kk, kv, klog) = outcomes
        assert (ek, elog) == (kk, klog)
        torch.testing.assert_close(kv, ev) if ek == "ok" else None
        assert ev == kv if ek == "raised" else True
    assert kiln.stats()["graphs"] >= 1  # the module's forward, compiled
    kiln.reset()
    with pytest.raises(kiln.errors.GraphBreakError):  # fullgraph=True: giving the frame up is an error
        kiln.compile(raising_frame, fullgraph=True)(torch.randn(2, 4))


class _BadBackend:
    """Counts the graphs it compiles; refuses (an internal error) any graph with a cos in it."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, gm, example_inputs):
        if any(n.target in (torch.cos, torch.ops.aten.cos.default) for n in gm.graph.nodes):
            raise RuntimeError("backend refuses cos")
        self.count += 1
        return gm.forward


def internal_error_frame(x):
    return torch.cos(x) + plain(x)


def test_an_internal_error_warns_once_and_compiles_the_callees(monkeypatch) -> None:
    monkeypatch.setattr(kiln.config, "suppress_errors", True)
    x = torch.randn(3, 4)
    kiln.reset()
    backend = _BadBackend()
    compiled = kiln.compile(internal_error_frame, backend=backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", KilnWarning)
        for _ in range(3):
            torch.testing.assert_close(compiled(x), internal_error_frame(x))
    assert len([w for w in caught if issubclass(w.category, KilnWarning)]) == 1
    dynamo_backend = _BadBackend()
    torch._dynamo.reset()
    with warnings.catch_warnings(), torch._dynamo.config.patch(suppress_errors=True):
        warnings.simplefilter("ignore")
        torch.compile(internal_error_frame, backend=dynamo_backend)(x)
    assert backend.count == dynamo_backend.count == 1


def test_under_a_torch_function_mode_and_past_the_cache_limit_nothing_is_compiled(monkeypatch) -> None:
    """A torch function mode sees eager's calls, and past config.cache_size_limit a frame and its
    subtree run eagerly (torch.compile's RUN_ONLY): no callee is compiled anew there, while a
    given-up frame's callees are."""
    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def limited(x, n):
        return plain(x) + n

    x = torch.randn(3, 4)
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    with Mode():
        kiln.compile(on_compiling_path, backend=backend)(x)
    assert backend.frame_count == 0
    monkeypatch.setattr(kiln.config, "cache_size_limit", 1)
    compiled = kiln.compile(limited, backend=backend)
    compiled(x, 1)
    compiled(x, 2)  # past the limit: plain is not compiled as a frame of its own
    assert backend.frame_count == 1
    kiln.compile(on_compiling_path, backend=backend)(x)
    assert backend.frame_count == 2  # plain, now its own frame
