"""Graph breaks on real-world patterns, checked against eager and against torch._dynamo.explain.

Each corpus function breaks in a common way (prints in loops, .item() control flow, helpers breaking
levels deep, numpy, data-dependent ifs and whiles, nonzero/unique/masks, breaks in with and try
blocks, custom ops without a fake impl, kiln.disable'd calls, logging). For each one, kiln.compile(fn,
backend="eager") gives eager's outputs, exceptions and side effects in order (prints, logging and list
appends share one event list); kiln.explain counts no more graphs and breaks than Dynamo where Dynamo
captured anything, runs no frame eagerly (breaks in loops/try/with are captured and resumed), and names
lines marked `# BREAK` (or `# CALLS`: a call to a helper that breaks; `# MAY`: acceptable).
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import linecache
import logging
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest
import torch
from torch import nn

import kiln

pytestmark = pytest.mark.skipif(
    not (hasattr(kiln, "compile") and hasattr(kiln, "explain") and hasattr(kiln, "disable")
         and importlib.util.find_spec("kiln.capture.tracer") is not None),
    reason="kiln.compile / kiln.explain / kiln.disable / the capture tracer have not landed",
)

EVENTS: list[Any] = []


class _EventStream:
    """sys.stdout stand-in: each write becomes an event, so prints and appends share one order."""

    def write(self, text: str) -> int:
        if text:
            EVENTS.append(("stdout", text))
        return len(text)

    def flush(self) -> None:
        pass


class _EventHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        EVENTS.append(("log", record.levelname, record.getMessage()))


logger = logging.getLogger("kiln_test_corpus")
logger.setLevel(logging.INFO)
logger.propagate = False
logger.addHandler(_EventHandler())


def randn(*shape: int, seed: int = 0, requires_grad: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).requires_grad_(requires_grad)


@dataclass
class Case:
    fn: Callable[..., Any]
    inputs: list[Callable[[], tuple]]
    helpers: tuple[Callable[..., Any], ...] = ()  # functions whose lines may carry the breaks
    dynamo_fn: Callable[..., Any] | None = None  # the oracle's twin (e.g. torch._dynamo.disable)
    dynamo_config: dict[str, Any] = field(default_factory=dict)
    hint: str | None = None  # a word the hint of some break must contain (the rewrite it suggests)

    @property
    def name(self) -> str:
        return self.fn.__name__


CASES: list[Case] = []


def case(*inputs: Callable[[], tuple], **kw: Any) -> Callable:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        CASES.append(Case(fn, list(inputs), **kw))
        return fn
    return register


def one(n: int = 4, seed: int = 0) -> Callable[[], tuple]:
    return lambda: (randn(n, seed=seed),)


# ===================================================================================== prints


@case(one())
def print_between_ops(x):
    y = x.sin() * 2
    print("halfway", y.shape)  # BREAK
    return y.cos() + x


@case(one())
def print_in_for_loop(x):
    for i in range(3):
        x = x * 2 + i
        print("step", i)  # BREAK
    return x.sum()


@case(one())
def print_in_while_loop(x):
    i = 0
    while i < 3:
        x = x.relu() + 1
        print("iteration", i)  # BREAK
        i += 1
    return x


@case(one())
def print_tensor_value(x):
    y = x.exp()
    print(f"mean={y.mean():.4f}")  # BREAK
    return y / y.sum()


# ============================================================================ .item() and bool


@case(one(seed=0), one(seed=1), one(seed=3), hint="tensor")
def item_control_flow(x):
    y = x * 3
    s = y.sum().item()  # BREAK
    if s > 0:
        return y + s
    return y - s


@case(one(), hint="tensor")
def item_in_loop(x):
    total = x.new_zeros(())
    for i in range(3):
        v = x[i].item()  # BREAK
        total = total + v * x[i]
    return total


@case(one(seed=0), one(seed=2))
def bool_of_tensor(x):
    y = x.sin()
    if bool(y.max() > 0.5):  # BREAK
        return y + 1
    return y - 1


@case(one())
def math_on_tensor(x):
    y = x.sin()
    s = math.sqrt(y.abs().sum())  # BREAK
    return y * s


@case(one())
def tolist_then_python(x):
    y = x.sin()
    values = y.tolist()  # BREAK
    return y * len(values) + values[0]


@case(one())
def item_in_comprehension(x):
    y = x.sin()
    values = [v.item() for v in y]  # BREAK
    return y * values[0]


# ==================================================================== data-dependent branches


@case(one(seed=0), one(seed=1), one(seed=2), one(seed=5), hint="torch.where")
def tensor_if(x):
    y = x * 2
    if y.sum() > 0:  # BREAK
        return y.sin()
    return y.cos()


@case(lambda: (randn(4) * 8,), lambda: (randn(4) * 0.1,), lambda: (randn(4, seed=7) * 20,))
def tensor_while(x):
    x = x + 0
    while x.norm() > 1:  # BREAK
        x = x / 2
    return x


@case(lambda: (randn(2, 2), 1.5), lambda: (randn(2, 2, seed=4), -0.5))
def nested_loops_tensor_if(x, scale):
    total = x.sum() * 0
    for i in range(2):
        for j in range(2):
            if x[i, j] > 0:  # BREAK
                total = total + x[i, j] * scale
    return total


@case(one(seed=0), one(seed=1))
def branch_then_keyword_call(x):
    y = x.tanh()
    if y.mean() > 0:  # BREAK
        lo = 0.1
    else:
        lo = -0.1
    return torch.clamp(y, min=lo, max=0.5) + torch.full_like(y, fill_value=lo)


# ================================================================= data-dependent output shapes


@case(one(8), hint="nonzero")
def nonzero_then_ops(x):
    y = x.cos()
    idx = torch.nonzero(y > 0)  # BREAK
    return idx.sum() + y


@case(one(8))
def boolean_mask(x):
    y = x.sin()
    z = y[y > 0]  # BREAK
    return z.sum() * y


@case(lambda: (randn(8) * 3,), hint="unique")
def unique_values(x):
    y = x.round()
    u = torch.unique(y)  # BREAK
    return y * u.numel()


# =============================================================================== helpers


def leaf_prints(x):
    x = x + 1
    print("leaf", x.shape)  # BREAK
    return x * 2


def middle(x):
    y = leaf_prints(x.sin())  # CALLS
    return y - 1


@case(one(), helpers=(leaf_prints,))
def helper_breaks_one_level(x):
    x = x.sin()
    y = leaf_prints(x)  # CALLS
    return y.cos()


@case(one(), helpers=(middle, leaf_prints))
def helper_breaks_two_levels(x):
    y = x * 3
    z = middle(y)  # CALLS
    return z + y


def scalar_of(t):
    return t.abs().max().item()  # BREAK


def normalize(t):
    m = scalar_of(t)  # CALLS
    return t / m


@case(one(), one(seed=9), helpers=(normalize, scalar_of))
def helper_item_deep(x):
    y = x + 1
    return normalize(y) * 2  # CALLS


def clip_if_large(t, *, limit):
    if t.abs().max() > limit:  # BREAK
        return t.clamp(-limit, limit)
    return t


@case(lambda: (randn(4) * 3,), lambda: (randn(4) * 0.1,), helpers=(clip_if_large,))
def helper_called_twice_with_kwargs(x):
    y = clip_if_large(x * 2, limit=1.0)  # CALLS
    z = clip_if_large(y + x, limit=0.5)  # CALLS
    return y + z


@case(lambda: (randn(8, 4), randn(4, 2), randn(8, 2)))
def training_step_with_loss_print(inp, w, target):
    pred = inp @ w
    loss = ((pred - target) ** 2).mean()
    print(f"loss {loss.item():.4f}")  # BREAK
    return loss * 2, pred.detach()


def stats_of(t):
    values = t.tolist()  # BREAK
    return {"max": max(values), "n": len(values)}


@case(one(6), helpers=(stats_of,))
def helper_returns_python_stats(x):
    y = x.exp()
    info = stats_of(y)  # CALLS
    return y / info["max"], info["n"]


# ================================================================================= numpy
# Kiln traces the common numpy API on arrays from tensors (kiln/capture/variables/numpy_functions.py,
# tested in test_numpy_trace.py); what it lacks (numpy.fft) and numpy on Python scalars are breaks,
# compared with Dynamo's numpy tracer off (trace_numpy=False), under which they break in both.


@case(one(), dynamo_config={"trace_numpy": False})
def numpy_roundtrip(x):
    y = x.sin()
    a = np.fft.rfft(np.exp(y.numpy())).real  # BREAK
    return torch.from_numpy(a.copy()) + 1


@case(one(), dynamo_config={"trace_numpy": False})
def numpy_scalar_math(x):
    y = x.sin()
    s = float(np.float32(3.0) * 2)  # BREAK
    return y * s


# ============================================================================ with blocks


class Recorder:
    def __enter__(self):
        EVENTS.append("enter")
        return self

    def __exit__(self, *exc):
        EVENTS.append(("exit", exc[0]))
        return False


@case(lambda: (randn(4, requires_grad=True),))
def break_in_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("no grad inside")  # BREAK
        z = y + 1
    return z, z.requires_grad, (x * 2).requires_grad


@case(lambda: (randn(4, requires_grad=True),))
def break_in_enable_grad_inside_no_grad(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
            print("grad on again")  # BREAK
            c = b + 1
        d = a + c
    return d, c.requires_grad, d.requires_grad


@case(one())
def break_in_user_context_manager(x):
    y = x + 1
    with Recorder():  # MAY
        z = y * 2
        print("inside recorder")  # BREAK
        z = z + 1
    return z


# ============================================================================= try blocks


@case(one())
def break_in_try_finally(x):
    try:
        y = x + 1
        print("in try")  # BREAK
        y = y * 2
    finally:
        EVENTS.append("finally")
    return y


@case(one(), lambda: (-randn(4).abs(),))
def break_in_try_then_raise(x):
    try:
        y = x.sin()
        print("before check")  # BREAK
        if (y > 0).all():  # BREAK
            raise ValueError("all positive")
        y = y * 2
    except ValueError as e:
        EVENTS.append(("caught", str(e)))
        y = x.cos()
    return y


# ============================================================= custom ops, disabled functions


@torch.library.custom_op("kiln_test_corpus::double_no_fake", mutates_args=())
def double_no_fake(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@case(one(), hint="register_fake")
def custom_op_without_fake(x):
    y = x.sin()
    z = double_no_fake(y)  # BREAK
    return z.cos()


def _side_helper(t):
    EVENTS.append(("side", round(float(t.sum()), 4)))
    return t * 2


def _uses_disabled(disable: Callable) -> Callable:
    side = disable(_side_helper)

    def uses_disabled(x):
        y = x + 1
        z = side(y)  # BREAK
        return z - y
    return uses_disabled


CASES.append(Case(_uses_disabled(getattr(kiln, "disable", lambda f: f)), [one()],
                  dynamo_fn=_uses_disabled(torch._dynamo.disable)))


# ============================================================================ logging, random


@case(one())
def logging_between_ops(x):
    y = x.sin()
    logger.info("shape is %s", tuple(y.shape))  # BREAK
    return y.cos()


@case(one())
def python_random(x):
    y = x.sin()
    r = random.random()  # BREAK
    return y * r


# ========================================================= side effects on inputs and objects


class Counter:
    def __init__(self):
        self.calls = 0


@case(lambda: (randn(4), [], Counter()))
def mutations_across_break(x, acc, counter):
    x.mul_(2)
    acc.append(x.sum())
    counter.calls += 1
    print("mutated")  # BREAK
    x.add_(1)
    acc.append(x.mean())
    counter.calls += 1
    return x.sum()


@case(one())
def dict_of_results(x):
    out = {"sin": x.sin()}
    print("first half done")  # BREAK
    out["cos"] = x.cos()
    return out


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        h = self.fc(x).relu()
        self.calls += 1
        print("block", self.calls)  # BREAK
        return self.fc(h)


_BLOCK = Block()


@case(lambda: (randn(2, 4),))
def module_with_print(x):
    return _BLOCK(x) * 2  # CALLS


class Doubler(nn.Module):
    def forward(self, x):
        return x * 2


class PrintingDoubler(Doubler):
    def forward(self, x):
        h = x.sin()
        print("printing doubler")  # BREAK
        return super().forward(h) + 1


_PRINTING = PrintingDoubler()


@case(one(), helpers=(PrintingDoubler.forward,))
def module_calls_super_after_break(x):
    return _PRINTING(x) - x  # CALLS


# ===================================================================================== runner


@contextlib.contextmanager
def events() -> Any:
    EVENTS.clear()
    with contextlib.redirect_stdout(_EventStream()):
        yield EVENTS


def run(fn: Callable, args: tuple) -> tuple[str, Any, list]:
    random.seed(1234)
    _BLOCK.calls = 0
    with events() as ev:
        try:
            out = fn(*args)
            result = ("ok", out)
        except Exception as exc:  # compared with eager's exception below
            result = ("raised", (type(exc), str(exc)))
    return result[0], (result[1], args), list(ev)


def assert_same(got: Any, want: Any, path: str = "out") -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got)}"
        assert got.requires_grad == want.requires_grad, f"{path}: requires_grad"
        torch.testing.assert_close(got.detach(), want.detach(), msg=lambda m: f"{path}: {m}")
    elif isinstance(want, np.ndarray):
        np.testing.assert_allclose(got, want)
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{path}: {got!r} vs {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys {list(got)} vs {list(want)}"
        for k in want:
            assert_same(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, Counter):
        assert got.calls == want.calls, f"{path}.calls"
    elif isinstance(want, float):
        assert got == pytest.approx(want), path
    else:
        assert got == want, f"{path}: {got!r} vs {want!r}"


def assert_same_events(got: list, want: list) -> None:
    assert len(got) == len(want), f"events differ:\n kiln:  {got}\n eager: {want}"
    for g, w in zip(got, want):
        assert_same(g, w, "event")


@pytest.fixture(autouse=True)
def fresh_kiln():
    kiln.reset()
    yield
    kiln.reset()


IDS = [c.name for c in CASES]


@pytest.mark.parametrize("c", CASES, ids=IDS)
def test_matches_eager_outputs_and_side_effects(c: Case) -> None:
    compiled = kiln.compile(c.fn, backend="eager")
    for n, make in enumerate(c.inputs * 2):  # every input twice: first capture, then cache hits
        want = run(c.fn, make())
        got = run(compiled, make())
        assert got[0] == want[0], f"input {n}: kiln {got[0]} {got[1][0]}, eager {want[0]} {want[1][0]}"
        assert_same(got[1], want[1], f"input {n}")
        assert_same_events(got[2], want[2])


_dynamo_results: dict[str, Any] = {}


def dynamo_explain(c: Case) -> Any:
    """torch._dynamo.explain on the case's first input; None when the oracle itself errors."""
    if c.name not in _dynamo_results:
        import torch._dynamo as dynamo
        dynamo.reset()
        try:
            with dynamo.config.patch(**c.dynamo_config), events():
                _dynamo_results[c.name] = dynamo.explain(c.dynamo_fn or c.fn)(*c.inputs[0]())
        except Exception:  # e.g. a custom op with no fake impl: Dynamo gives up, Kiln must not
            _dynamo_results[c.name] = None
        dynamo.reset()
    return _dynamo_results[c.name]


_kiln_results: dict[str, Any] = {}


def kiln_explain(c: Case) -> Any:
    """kiln.explain on the case's first input (once per case: two tests read it)."""
    if c.name not in _kiln_results:
        kiln.reset()
        with events():
            _kiln_results[c.name] = kiln.explain(c.fn)(*c.inputs[0]())
    return _kiln_results[c.name]


def _oracle_captured(oracle: Any) -> bool:
    return oracle is not None and oracle.graph_count > 0


def _real_fallbacks(ours: Any) -> list[Any]:
    # A frame that traced no tensor op runs eagerly by design (Dynamo compiles no graph for it
    # either); only the frames that gave up on capture count.
    return [fb for fb in ours.fallbacks if "no tensor ops" not in fb.reason]


@pytest.mark.parametrize("c", CASES, ids=IDS)
def test_counts_no_worse_than_dynamo(c: Case) -> None:
    ours = kiln_explain(c)
    oracle = dynamo_explain(c)
    if not _oracle_captured(oracle):
        pytest.skip("Dynamo captured nothing here (it skips frames that break in loops, try and user "
                    "`with` blocks, and errors on custom ops without a fake impl); see the next test")
    assert not _real_fallbacks(ours), f"frames ran eagerly where Dynamo captured:\n{ours}\ndynamo:\n{oracle}"
    assert 1 <= ours.graph_count <= oracle.graph_count, f"kiln:\n{ours}\ndynamo:\n{oracle}"
    assert ours.graph_break_count <= oracle.graph_break_count, f"kiln:\n{ours}\ndynamo:\n{oracle}"


@pytest.mark.parametrize("c", CASES, ids=IDS)
def test_no_frame_runs_eagerly(c: Case) -> None:
    """More than Dynamo gives: breaks inside loops, try and with blocks still capture."""
    ours = kiln_explain(c)
    assert not _real_fallbacks(ours), f"frames ran eagerly:\n{ours}"
    assert ours.graph_count >= 1, str(ours)


def _marked_lines(fns: tuple[Callable, ...], marker: str) -> set[tuple[str, int]]:
    out = set()
    for fn in fns:
        fn = inspect.unwrap(fn)
        lines, start = inspect.getsourcelines(fn)
        out |= {(inspect.getsourcefile(fn), start + i) for i, text in enumerate(lines)
                if text.rstrip().endswith(marker)}
    return out


def _case_functions(c: Case) -> tuple[Callable, ...]:
    fns = (c.fn, *c.helpers)
    if c.fn is module_with_print:
        fns += (Block.forward,)
    return fns


@pytest.mark.parametrize("c", CASES, ids=IDS)
def test_breaks_name_the_right_lines(c: Case) -> None:
    ours = kiln_explain(c)
    fns = _case_functions(c)
    must = _marked_lines(fns, "# BREAK")
    may = must | _marked_lines(fns, "# CALLS") | _marked_lines(fns, "# MAY")
    assert must, "corpus function without a # BREAK line"
    recorded = {(r.filename, r.lineno) for r in ours.break_reasons}
    for r in ours.break_reasons:
        assert r.source_line.strip() == linecache.getline(r.filename, r.lineno).strip(), str(r)
    fallbacks = _real_fallbacks(ours)
    # A frame run eagerly must still name the line that made it so ("... at file:line)").
    by_fallback = {(f, int(n)) for fb in fallbacks for f, n in re.findall(r"at (\S+?):(\d+)\)", fb.reason)}
    named = recorded | by_fallback
    oracle = dynamo_explain(c)
    captured_more = oracle is not None and 0 < ours.graph_count < oracle.graph_count
    if fallbacks:  # capture stopped at the first break of that frame: it must be a marked one
        assert must & named, f"no marked break named:\n{ours}"
    elif not captured_more:  # a break Kiln keeps inside a graph need not be reported
        assert must <= named, f"breaks not reported: {sorted(must - named)}\n{ours}"
    if oracle is None or oracle.graph_count <= 0 or ours.graph_count > oracle.graph_count:
        # Where the counts cannot vouch for Kiln, every break must be one the corpus expects.
        assert named <= may, f"breaks at unexpected lines: {sorted(named - may)}\n{ours}"
    if c.hint and (must & recorded):
        hints = " ".join(r.suggestion or "" for r in ours.break_reasons if (r.filename, r.lineno) in must)
        assert c.hint in hints, f"no hint mentions {c.hint!r}:\n{ours}"


def test_corpus_markers_agree_with_dynamo() -> None:
    """The oracle's own break lines are among the marked ones, so the markers are not guesses."""
    checked = 0
    for c in CASES:
        oracle = dynamo_explain(c)
        if oracle is None or c.dynamo_fn is not None:
            continue
        may = _marked_lines(_case_functions(c), "# BREAK") | _marked_lines(_case_functions(c), "# CALLS")
        for reason in oracle.break_reasons:
            frame = reason.user_stack[-1]
            assert (frame.filename, frame.lineno) in may, f"{c.name}: Dynamo broke at {frame}"
            checked += 1
    assert checked >= 15


def inplace_on_leaf(w):
    y = w.sin()
    print("before the in-place update")
    w.add_(1)  # eager refuses: a leaf that requires grad cannot be updated in place
    return y


def test_exception_is_eagers_even_after_a_break() -> None:
    want = run(inplace_on_leaf, (randn(3, requires_grad=True),))
    got = run(kiln.compile(inplace_on_leaf, backend="eager"), (randn(3, requires_grad=True),))
    assert want[0] == "raised" and got[0] == "raised"
    assert got[1][0] == want[1][0]  # same exception type and message
    assert_same_events(got[2], want[2])


def test_kiln_logs_graph_breaks_prints_each_break_once() -> None:
    from kiln.capture import breaks
    from kiln import log

    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Collect()
    logging.getLogger("kiln").addHandler(handler)
    log.configure("graph_breaks")
    breaks.reset()
    try:
        compiled = kiln.compile(print_between_ops, backend="eager")
        with events():
            for n in (4, 4, 6):  # the third call recompiles and meets the same break again
                compiled(randn(n))
        assert kiln.stats()["graph_breaks"] >= 2, kiln.stats()
    finally:
        log.configure("")
        logging.getLogger("kiln").removeHandler(handler)
        breaks.reset()
    line = next(iter(_marked_lines((print_between_ops,), "# BREAK")))[1]
    printed = [m for m in seen if m.startswith("Graph break at")]
    assert len(printed) == 1, printed
    assert printed[0].splitlines()[0] == f"Graph break at {__file__}:{line}"
    assert 'print("halfway", y.shape)' in printed[0]
