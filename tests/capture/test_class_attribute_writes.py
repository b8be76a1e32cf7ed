"""Class attributes set inside the compiled frame (`C.k = 9`, `type(self).count += 1`, a classmethod
setting `cls.x`): recorded as side effects and replayed after the graph, as torch.compile does, with
later reads in the frame (through the class, a subclass, an instance made in the frame or passed in,
a method reading `self.k`) seeing the new value, and the guards of the next call the replayed one.
Writes that do more than bind a name in a class dict (a metaclass __setattr__, a special method, a
value that would bind as a method on an instance read later) stay graph breaks with a reason.
Oracles: eager for values, exceptions and the classes' state after each call; torch._dynamo.explain
for graph and break counts."""
from __future__ import annotations

import enum
from typing import Any, Callable

import pytest
import torch

import kiln


class C:
    k = 1
    count = 0
    x = 0

    @classmethod
    def set_x(cls, v):
        cls.x = v

    def get(self):
        return self.k


class D(C):
    pass


class Counted(torch.nn.Module):
    count = 0

    def forward(self, x):
        type(self).count += 1
        return x * type(self).count + self.count


class Color(enum.Enum):
    RED = 1


def _reset() -> None:
    C.k, C.count, C.x = 1, 0, 0
    Counted.count = 0
    for name in ("fresh", "scale"):
        if name in C.__dict__:
            delattr(C, name)
    D.__dict__.get("k") is not None and delattr(D, "k")


def _state() -> tuple:
    return (C.k, C.count, C.x, C.__dict__.get("fresh"), D.__dict__.get("k"), Counted.count)


def read_through_class_subclass_and_instances(x):
    C.k = 9
    outside = OUTSIDE
    return x + C.k + D.k + D().k + C().get() + outside.k + outside.get()


OUTSIDE = D()


def counter(x):
    C.count += 1
    return x * C.count


def classmethod_sets(x):
    C.set_x(3)
    return x + C.x


def new_attribute(x):
    C.fresh = x.shape[0] * 2
    return x + C.fresh


def instance_value_shadows(x):
    obj = C()
    obj.k = 5
    C.k = 7
    return x + obj.k + C.k


def write_on_subclass_only(x):
    D.k = 4
    return x + D.k + C.k + D().get()


def write_then_break(x):
    C.k = C.k + 2
    print("break")
    return x + C.k


def write_then_raise(x):
    C.count = C.count + 10
    if x.sum() > -1e9:
        raise ValueError("after the write")
    return x


PROGRAMS = [read_through_class_subclass_and_instances, counter, classmethod_sets, new_attribute,
            instance_value_shadows, write_on_subclass_only, write_then_break, write_then_raise]


def _calls(fn: Callable[..., Any], n: int = 3) -> tuple[list[Any], list[tuple]]:
    outs, states = [], []
    for i in range(n):
        try:
            outs.append(fn(torch.full((3,), float(i))))
        except ValueError as exc:
            outs.append((ValueError, str(exc)))
        states.append(_state())
    return outs, states


@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_class_attribute_writes_match_eager_and_torch_compile(fn, capsys):
    _reset()
    expected, expected_states = _calls(fn)
    _reset()
    kiln.reset()
    got, states = _calls(kiln.compile(fn))
    assert states == expected_states
    for a, b in zip(got, expected):
        if isinstance(b, tuple):
            assert a == b
        else:
            torch.testing.assert_close(a, b)
    if fn is write_then_raise:
        return  # explain runs the frame, which raises
    _reset()
    torch._dynamo.reset()
    real = torch._dynamo.explain(fn)(torch.ones(3))
    _reset()
    kiln.reset()
    ours = kiln.explain(fn)(torch.ones(3))
    _reset()
    assert (ours.graph_count, ours.graph_break_count) == (real.graph_count, real.graph_break_count)
    assert not any("setting attribute" in b.reason for b in ours.break_reasons)


def test_a_module_counting_calls_on_its_class():
    _reset()
    m = Counted()
    expected = [m(torch.ones(2)) for _ in range(3)]
    _reset()
    kiln.reset()
    compiled = kiln.compile(m)
    got = [compiled(torch.ones(2)) for _ in range(3)]
    assert Counted.count == 3
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    _reset()
    kiln.reset()
    ours = kiln.explain(m)(torch.ones(2))
    _reset()
    assert (ours.graph_count, ours.graph_break_count, ours.break_reasons) == (1, 0, [])
    _reset()


def method_put_on_class(x):
    C.scale = lambda self: 3
    return x * C().scale()


def enum_member_write(x):
    Color.RED = 2  # EnumMeta.__setattr__ raises
    return x


def special_method_write(x):
    C.__len__ = lambda self: 4
    return x * len(C())


@pytest.mark.parametrize("fn, reason", [
    (method_put_on_class, "binds"),
    (enum_member_write, "metaclass"),
    (special_method_write, "special attribute"),
])
def test_writes_that_change_behaviour_stay_breaks_with_eager_results(fn, reason):
    _reset()
    try:
        expected: Any = fn(torch.ones(2))
    except AttributeError as exc:
        expected = (AttributeError, str(exc))
    after = _state()
    _reset()
    if "__len__" in C.__dict__:
        del C.__len__
    kiln.reset()
    ours = kiln.explain(fn)(torch.ones(2)) if not isinstance(expected, tuple) else None
    _reset()
    if "__len__" in C.__dict__:
        del C.__len__
    kiln.reset()
    try:
        got: Any = kiln.compile(fn)(torch.ones(2))
    except AttributeError as exc:
        got = (AttributeError, str(exc))
    assert _state() == after
    if isinstance(expected, tuple):
        assert got == expected
    else:
        torch.testing.assert_close(got, expected)
        assert ours is not None and reason in repr(ours)  # a break, or the frame's fallback reason
    _reset()
    if "__len__" in C.__dict__:
        del C.__len__
