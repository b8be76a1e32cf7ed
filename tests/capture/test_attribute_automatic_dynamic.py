"""Ints and floats read from attributes become symbolic once they change, as torch.compile's do.

torch.compile makes a number it reads from an argument's attribute (a user object's step counter,
a dataclass config field, a slot, a function attribute, a class attribute read through an
instance) dynamic after its first change (automatic dynamic), while ints of nn.Modules and of
module globals stay constants (a new value recompiles) and floats of globals become dynamic too.
Each case runs the same calls under eager, kiln.compile and the real torch.compile (with a compile
counter): values and the object's state after each call must equal eager's, and Kiln must compile
no more often than torch.compile (and, where torch specializes, exactly as often).
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import pytest
import torch
from torch import nn

import torch._dynamo.testing

import kiln

G_STEPS = 3
G_SCALE = 1.5


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape \
            and torch.allclose(got, want)
    if isinstance(want, (tuple, list)):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    return bool(got == want) and type(got) is type(want)


def _state_of(obj: Any) -> Any:
    """The numbers an object holds (through nested objects and lists), to compare with eager's."""
    if isinstance(obj, (int, float, str)):
        return obj
    if isinstance(obj, list):
        return [_state_of(item) for item in obj]
    if hasattr(obj, "__dict__") and not isinstance(obj, nn.Module):
        return {k: _state_of(v) for k, v in vars(obj).items() if not callable(v)}
    if hasattr(obj, "__slots__"):
        return {name: getattr(obj, name) for name in obj.__slots__}
    return None


def _compile_counts(fn: Callable, make_state: Callable[[], Any], n: int,
                    between: Callable[[Any, int], None] | None = None,
                    backend: str = "eager") -> tuple[int, int]:
    """(kiln's compiles, torch.compile's frames) over n calls fn(state, x), each compared with eager."""
    x = torch.randn(4)
    eager_state, kiln_state, torch_state = make_state(), make_state(), make_state()
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()
    reference = torch.compile(fn, backend=counter)
    for i in range(n):
        if i and between is not None:
            for state in (eager_state, kiln_state, torch_state):
                between(state, i)
        want = fn(eager_state, x)
        got = compiled(kiln_state, x)
        assert _same(got, want), f"call {i}: kiln gave {got!r}, eager {want!r}"
        assert _state_of(kiln_state) == _state_of(eager_state), f"call {i}: state differs"
        reference(torch_state, x)
    ours = int(kiln.stats()["compiles"])
    torch._dynamo.reset()
    return ours, counter.frame_count


class Stepper:
    def __init__(self) -> None:
        self.step = 0
        self.scale = 0.5


def step_and_scale(obj: Stepper, x: torch.Tensor) -> torch.Tensor:
    obj.step += 1
    return x * obj.step


def read_step(obj: Stepper, x: torch.Tensor) -> torch.Tensor:
    return x + obj.step


def read_scale(obj: Stepper, x: torch.Tensor) -> torch.Tensor:
    return x * obj.scale


def branch_on_step(obj: Stepper, x: torch.Tensor) -> torch.Tensor:
    if obj.step > 4:  # a branch on the symbol is a guard on it
        return x - obj.step
    return x + obj.step


def range_over_step(obj: Stepper, x: torch.Tensor) -> torch.Tensor:
    for _ in range(obj.step % 3 + 1):  # a range bound is an int the trace needs as a Python int
        x = x + 1
    return x


class Counted:
    count = 5
    factor = 0.25

    def __init__(self) -> None:
        self.bias = 1


def read_class_counter(obj: Counted, x: torch.Tensor) -> torch.Tensor:
    return x * obj.count + obj.factor


def bump_class_counter(obj: Counted, i: int) -> None:
    type(obj).count += 1
    type(obj).factor += 0.5


def read_global_class_counter(obj: Any, x: torch.Tensor) -> torch.Tensor:
    return x * Counted.count


class Slotted:
    __slots__ = ("n", "lr")

    def __init__(self) -> None:
        self.n = 2
        self.lr = 0.1


def read_slots(obj: Slotted, x: torch.Tensor) -> torch.Tensor:
    return x * obj.n - obj.lr


@dataclasses.dataclass
class Config:
    depth: int = 2
    alpha: float = 0.5


def read_config(cfg: Config, x: torch.Tensor) -> torch.Tensor:
    return x * cfg.depth + cfg.alpha


def read_function_attribute(fn: Any, x: torch.Tensor) -> torch.Tensor:
    return x * fn.k


def read_int_global(_: Any, x: torch.Tensor) -> torch.Tensor:
    return x * G_STEPS


def read_float_global(_: Any, x: torch.Tensor) -> torch.Tensor:
    return x * G_SCALE


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n = 2
        self.f = 0.5
        self.cfg = Config()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.n


class ScaledByFloat(Scaled):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.f


class ScaledByConfig(Scaled):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.cfg.depth  # an int reached through a module stays a constant


def call_module(module: Scaled, x: torch.Tensor) -> torch.Tensor:
    return module(x)


class Holder:
    def __init__(self) -> None:
        self.inner = Stepper()
        self.items = [Stepper()]


def read_nested(holder: Holder, x: torch.Tensor) -> torch.Tensor:
    holder.inner.step += 2
    return x * holder.inner.step + holder.items[0].step


def bump_nested(holder: Holder, i: int) -> None:
    holder.items[0].step += 3


def size_from_step(obj: Stepper, x: torch.Tensor) -> torch.Tensor:
    return x + torch.ones(obj.step % 2 + 2).sum() + x.new_zeros(obj.step).numel()


def zero_one_step(obj: Stepper, x: torch.Tensor) -> torch.Tensor:
    return x * obj.step + (obj.step == 1)


def _tagged_function() -> Any:
    def tagged(y: torch.Tensor) -> torch.Tensor:
        return y
    tagged.k = 2  # type: ignore[attr-defined]
    return tagged


def _bump(attr: str, by: Any) -> Callable[[Any, int], None]:
    def bump(state: Any, i: int) -> None:
        setattr(state, attr, getattr(state, attr) + by)
    return bump


def _set_global(name: str, values: list) -> Callable[[Any, int], None]:
    def change(state: Any, i: int) -> None:
        globals()[name] = values[i % len(values)]
    return change


CASES = {
    # name: (fn, make_state, between, exact): `exact` where Kiln must compile exactly as often
    "step counter written by the frame": (step_and_scale, Stepper, None, True),
    "step counter written outside": (read_step, Stepper, _bump("step", 1), True),
    "float attribute": (read_scale, Stepper, _bump("scale", 0.25), True),
    "branch on the counter": (branch_on_step, Stepper, _bump("step", 1), False),
    "range over the counter": (range_over_step, Stepper, _bump("step", 1), False),
    "sizes from the counter": (size_from_step, Stepper, _bump("step", 1), False),
    "counter through 0 and 1": (zero_one_step, Stepper, _bump("step", 1), False),
    "slots": (read_slots, Slotted, lambda s, i: (_bump("n", 1)(s, i), _bump("lr", 0.1)(s, i)), True),
    "dataclass fields": (read_config, Config, lambda s, i: (_bump("depth", 1)(s, i), _bump("alpha", 0.5)(s, i)),
                         True),
    "function attribute": (read_function_attribute, _tagged_function, _bump("k", 1), True),
    "nested objects and lists": (read_nested, Holder, bump_nested, True),
    "int global": (read_int_global, Stepper, _set_global("G_STEPS", [3, 4, 5, 6, 7, 8]), True),
    "float global": (read_float_global, Stepper, _set_global("G_SCALE", [1.5, 2.5, 3.5, 4.5, 5.5, 6.5]), True),
    "nn.Module int attribute": (call_module, Scaled, _bump("n", 1), True),
    "nn.Module float attribute": (call_module, ScaledByFloat, _bump("f", 0.5), True),
    "int of an object held by an nn.Module": (call_module, ScaledByConfig,
                                              lambda s, i: _bump("depth", 1)(s.cfg, i), True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_recompiles_like_torch(name: str) -> None:
    fn, make_state, between, exact = CASES[name]
    ours, theirs = _compile_counts(fn, make_state, 6, between)
    assert ours <= theirs, f"kiln compiled {ours} times, torch.compile {theirs}"
    if exact:
        assert ours == theirs, f"kiln compiled {ours} times, torch.compile {theirs}"


@pytest.fixture
def restore_counted():
    saved = (Counted.count, Counted.factor)
    yield
    Counted.count, Counted.factor = saved


def test_class_attribute_read_through_an_instance(restore_counted: None) -> None:
    ours, theirs = _compile_counts(read_class_counter, Counted, 6, bump_class_counter)
    assert ours == theirs == 2


def test_class_attribute_read_through_a_global_stays_constant(restore_counted: None) -> None:
    ours, theirs = _compile_counts(read_global_class_counter, Counted, 5, bump_class_counter)
    assert ours == theirs == 5


GLOBAL_CONFIG = Config()


def read_global_config(_: Any, x: torch.Tensor) -> torch.Tensor:
    return x * GLOBAL_CONFIG.alpha + Counted.factor


def read_global_config_int(_: Any, x: torch.Tensor) -> torch.Tensor:
    return x * GLOBAL_CONFIG.depth


def bump_global_config(state: Any, i: int) -> None:
    if state is _FIRST_STATE[0]:  # the three runs share the globals: change them once per call
        GLOBAL_CONFIG.alpha += 0.5
        GLOBAL_CONFIG.depth += 1
        Counted.factor += 0.5


_FIRST_STATE: list[Any] = [None]


@pytest.mark.parametrize("fn, expected", [(read_global_config, 2), (read_global_config_int, 5)])
def test_attributes_read_through_globals(restore_counted: None, fn: Callable, expected: int) -> None:
    # floats read through a global become symbolic once they change; ints stay constants
    saved = dataclasses.replace(GLOBAL_CONFIG)
    try:
        def first() -> Stepper:
            state = Stepper()
            if _FIRST_STATE[0] is None:
                _FIRST_STATE[0] = state
            return state
        _FIRST_STATE[0] = None
        ours, theirs = _compile_counts(fn, first, 5, bump_global_config)
        assert ours == theirs == expected
    finally:
        GLOBAL_CONFIG.alpha, GLOBAL_CONFIG.depth = saved.alpha, saved.depth


def test_cache_size_limit_no_longer_reached_by_a_step_counter() -> None:
    # 12 calls > cache_size_limit (8): a constant step counter ran eagerly after the 8th
    ours, theirs = _compile_counts(step_and_scale, Stepper, 12, None)
    assert ours == theirs == 2


@pytest.mark.cpp
@pytest.mark.parametrize("name", ["step counter written by the frame", "float attribute", "dataclass fields"])
def test_default_backend(name: str) -> None:
    fn, make_state, between, _ = CASES[name]
    ours, theirs = _compile_counts(fn, make_state, 4, between, backend="inductor")
    assert ours == theirs
