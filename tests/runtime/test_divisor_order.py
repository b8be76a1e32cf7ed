"""A `//`, `%` or `/` by an int or float argument that is 0 in a call of a graph captured with it
nonzero: eager raises at the division, after what the frame did before it (in-place updates of
arguments and buffers, list appends, attribute writes). Inside a graph the division would raise
before the functionalized graph's input writes and before the glue replays the frame's side
effects (and a lowered wrapper tests the divisor before its first kernel), so the glue tests the
divisor before the call and runs the frame eagerly for that call (kiln.capture.deferred_checks):
same exception and text, same state afterwards, and no extra graph (torch.compile's count).
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import kiln


def outcome(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - compared with eager's
        return ("raised", type(exc), str(exc))


def same_outcome(got: Any, want: Any, text: bool = True) -> bool:
    if got[0] != want[0]:
        return False
    return torch.equal(got[1], want[1]) if want[0] == "ok" else got[1:] == want[1:]

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]
INT_CALLS = [(7, 2), (9, 4), (5, 0), (-3, 2), (0, 0), (8, -3)]
FLOAT_CALLS = [(7.5, 2.0), (3.5, 1.5), (1.0, 0.0), (-2.5, 0.5), (2.0, -0.0)]
LOG: list[Any] = []


class Holder:
    count = 0


HOLDER = Holder()


def update_then_floordiv(x, a, b):
    x.add_(1)
    return x * (a // b)


def update_then_mod(x, a, b):
    x.mul_(2)
    y = x + 1
    return y * (a % b)


def append_then_truediv(x, a, b):
    LOG.append(a)
    x.add_(1)
    return x * (a / b)


def attribute_then_divide(x, a, b):
    HOLDER.count += 1
    LOG.append(x.sum())
    return x + (a - 1) // b


def derived_divisor(x, a, b):
    x.sub_(1)
    return x * (a % (b * 2))


def break_then_divide(x, a, b):
    x.add_(1)
    torch._dynamo.graph_break()
    LOG.append(b)
    x.add_(1)
    return x * (a // b)


PROGRAMS = [update_then_floordiv, update_then_mod, append_then_truediv, attribute_then_divide, derived_divisor,
            break_then_divide]


def _state() -> tuple:
    return list(LOG), HOLDER.count


def _compare(fn: Callable[..., Any], calls: list[tuple], backend: str) -> int:
    kiln.reset()
    counter = kiln.backends.CountingBackend(kiln.backends.lookup(backend))
    compiled = kiln.compile(fn, backend=counter)
    for a, b in calls:
        LOG.clear()
        HOLDER.count = 0
        x_eager, x_kiln = torch.ones(3), torch.ones(3)
        want = outcome(fn, x_eager, a, b)
        want_state = _state()
        LOG.clear()
        HOLDER.count = 0
        got = outcome(compiled, x_kiln, a, b)
        assert same_outcome(got, want, text=True), (a, b, got, want)
        assert torch.equal(x_kiln, x_eager), (a, b, x_kiln, x_eager)
        assert repr(_state()) == repr(want_state), (a, b, _state(), want_state)
    assert kiln.stats()["fallbacks"] == 0
    return counter.frame_count


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_zero_divisor_after_effects_int(fn, backend):
    graphs = _compare(fn, INT_CALLS, backend)
    assert graphs == (3 if fn is break_then_divide else 2)  # before the break: one graph reads neither number
    assert kiln.stats()["check_reruns"] >= 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [update_then_floordiv, update_then_mod, append_then_truediv, derived_divisor],
                         ids=lambda f: f.__name__)
def test_zero_divisor_after_effects_float(fn, backend):
    assert _compare(fn, FLOAT_CALLS, backend) == 2


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x, a, b):
        self.steps.add_(1)
        return x * (a // b) + self.steps


@pytest.mark.parametrize("backend", BACKENDS)
def test_buffer_updated_before_the_division(backend):
    eager, model = Counter(), Counter()
    compiled = kiln.compile(model, backend=backend)
    for a, b in INT_CALLS:
        want = outcome(eager, torch.ones(2), a, b)
        got = outcome(compiled, torch.ones(2), a, b)
        assert same_outcome(got, want, text=True), (a, b, got, want)
        assert torch.equal(model.steps, eager.steps), (a, b, model.steps, eager.steps)
    assert kiln.stats()["fallbacks"] == 0


def test_zero_divisor_at_the_first_call():
    """A first call that divides by zero: the division runs natively after the graph before it."""
    kiln.reset()
    compiled = kiln.compile(update_then_floordiv, backend="eager")
    for a, b in [(5, 0), (7, 2), (9, 4), (3, 0)]:
        x_eager, x_kiln = torch.ones(3), torch.ones(3)
        want = outcome(update_then_floordiv, x_eager, a, b)
        got = outcome(compiled, x_kiln, a, b)
        assert same_outcome(got, want, text=True) and torch.equal(x_kiln, x_eager), (a, b, got, want)


def test_a_zero_divisor_reruns_the_frame_without_a_new_graph():
    kiln.reset()
    counter = kiln.backends.CountingBackend()
    compiled = kiln.compile(update_then_floordiv, backend=counter)
    for a, b in [(7, 2), (9, 4)]:
        compiled(torch.ones(3), a, b)
    x = torch.ones(3)
    with pytest.raises(ZeroDivisionError, match="integer division or modulo by zero"):
        compiled(x, 1, 0)
    assert torch.equal(x, torch.full((3,), 2.0))
    assert kiln.stats()["check_reruns"] == 1 and counter.frame_count == 2
    assert torch.equal(compiled(torch.ones(3), 5, 2), torch.full((3,), 4.0))  # the graph again
    assert kiln.stats()["check_reruns"] == 1 and counter.frame_count == 2


STORED = """
import json, torch, kiln

def f(x, a, b):
    x.add_(1)
    return x * (a // b)

compiled = kiln.compile(f, options={"opt_level": "-O1"})
x = torch.ones(3)
outs = [compiled(x, a, b).tolist() for a, b in [(7, 2), (9, 4), (5, 3)]]
try:
    compiled(x, 1, 0)
except ZeroDivisionError as exc:
    outs.append(str(exc))
outs.append(x.tolist())
stats = kiln.stats()
print(json.dumps({"outs": outs, "disk_hits": stats["disk_hits"], "frames": stats["frames"]}))
"""


@pytest.mark.cpp
def test_a_frame_with_divisor_checks_is_served_from_disk(tmp_path: Any) -> None:
    """The glue's `if (<divisor>) == 0: <divides_by_zero>()` is in the stored glue's grammar (and the
    lowered wrapper's own `raise ZeroDivisionError(<text>)` in the wrapper's): a second process
    captures nothing and still answers a zero divisor as eager, after the in-place update."""
    from tests.reliability import cache_harness as harness

    code, cache = harness.snapshot(tmp_path), tmp_path / "cache"
    want = [[6.0] * 3, [6.0] * 3, [4.0] * 3, "integer division or modulo by zero", [5.0] * 3]
    first, log = harness.run(code, cache, STORED)
    assert first["outs"] == want and first["frames"] >= 1, first
    assert "not stored" not in log, log[-3000:]
    second, log = harness.run(code, cache, STORED)
    assert second["outs"] == want and second["frames"] == 0 and second["disk_hits"] >= 1, (second, log[-3000:])
