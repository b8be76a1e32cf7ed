"""Python-language classes of bug found by the 15th probe (Dynamo-style programs, probe/p_q_*.py):
each test runs eagerly and through kiln.compile(backend="eager") and compares values, raised
exceptions and side effects, and where it matters the number of graphs.

- identity of instances from outside the frame: guarded by type only, `arg is GLOBAL`, `id(a) ==
  id(b)` and a dict keyed by the object must be guarded by identity (the next call's object differs);
- `tensor == number` / `t1 == t2` are elementwise: `3 in [t]`, `[1, t].index(t)` are not decided
  False at trace time (eager raises, or the answer depends on the data);
- a list iterator reads the list as it is at each step (items appended or removed in the body);
- `globals()["NAME"]` reads and writes the module's namespace (it was run in the glue's namespace);
- an IntEnum / IntFlag / float enum member passed to a graph op is its number (FX printed `P.None`);
- an Enum class's own `_missing_` hook is inlined instead of breaking;
- `super().prop` of a property runs the base's getter instead of breaking.
"""
from __future__ import annotations

import enum
import itertools
import operator
from typing import Any, Callable, Sequence

import pytest
import torch

import kiln
from eager_compare import outcome, run, same_outcome
from semantics_oracle import same

X = torch.arange(3.0) - 1.0


def run_stateful(build: Callable[[], tuple[Callable[..., Any], Callable[[], Any]]], calls: Sequence[tuple]) -> None:
    """Programs with side effects: a fresh program for eager and for compiled; the observed state
    after every call must match."""
    fn_e, obs_e = build()
    fn_c, obs_c = build()
    kiln.reset()
    compiled = kiln.compile(fn_c, backend="eager")
    for i, args in enumerate(calls):
        want = outcome(fn_e, *args)
        got = outcome(compiled, *args)
        assert same_outcome(got, want, text=False), f"call {i}: compiled gave {got!r}, eager {want!r}"
        assert same(obs_c(), obs_e()), f"call {i}: state {obs_c()!r}, eager {obs_e()!r}"


# ------------------------------------------------------------ identity of instances from outside
class Token:
    pass


SENTINEL = Token()
OTHER = Token()


def is_sentinel(x, o):
    return x * (2 if o is SENTINEL else 3)


def test_is_against_a_global_instance_is_guarded() -> None:
    run(is_sentinel, [(X, SENTINEL), (X, Token()), (X, SENTINEL), (X, OTHER)])


def test_is_between_two_instance_arguments() -> None:
    def f(x, p, q):
        return x + (1 if p is q else 0)
    run(f, [(X, SENTINEL, OTHER), (X, SENTINEL, SENTINEL), (X, OTHER, SENTINEL)])

    class Box:
        def __init__(self, k):
            self.k = k

    def g(x, b, o):
        return x * b.k + (o is SENTINEL)
    # only the instance compared by `is` is guarded by identity: new Boxes reuse the graph
    run(g, [(X, Box(2), OTHER), (X, Box(2), OTHER), (X, Box(2), SENTINEL)], graphs=2)


def test_id_of_instance_arguments_compared() -> None:
    def f(x, p):
        return x + (1 if id(p) == id(SENTINEL) else 0)
    run(f, [(X, OTHER), (X, SENTINEL), (X, Token())])


def test_attribute_holding_an_instance_compared_by_is() -> None:
    class Cfg:
        def __init__(self, mode):
            self.mode = mode

    def f(x, cfg):
        return x - (1 if cfg.mode is SENTINEL else 0)
    run(f, [(X, Cfg(SENTINEL)), (X, Cfg(Token())), (X, Cfg(SENTINEL))])


# ------------------------------------------------------------ tensor == number is elementwise
def in_list_with_number(x):
    a = [x, x * 2]
    return a[1], 3 in a


def index_after_a_number(x):
    a = [1, x * 2, x]
    return a[1], a.index(x)


def in_list_of_other_tensors(x):
    a = [None, "s", x * 2]
    return a[2], x in a


def contains_operator(x):
    a = [x * 2]
    return a[0], operator.contains(a, 1.5)


# one-element values for which the elementwise comparison is True (it was decided False)
@pytest.mark.parametrize("fn, one", [(in_list_with_number, 1.5), (index_after_a_number, 0.0),
                                     (in_list_of_other_tensors, 0.0), (contains_operator, 0.75)])
@pytest.mark.parametrize("n", [3, 1])
def test_tensor_compared_with_a_number_in_a_container(fn, one, n) -> None:
    x = torch.full((1,), one) if n == 1 else X
    run(fn, [(x,)], breaks=True)  # the comparison's truth is the tensor's: a break (eager raises for 3)


# ------------------------------------------------------------ list iterators see mutation
def test_loop_appends_to_the_list_it_walks() -> None:
    def f(x):
        l = [1, 2]
        for v in l:
            if len(l) < 5:
                l.append(v + 10)
        return x * len(l), l
    run(f, [(X,)])


def test_loop_removes_from_the_list_it_walks() -> None:
    def f(x):
        l = [1, 2, 3, 4]
        for v in l:
            l.remove(v)
        return x * len(l), l
    run(f, [(X,)])


def test_loop_over_an_input_list_appending_tensors() -> None:
    def build():
        lst = [X.clone(), X * 2]

        def f(x):
            out = x
            for v in lst:
                if len(lst) < 4:
                    lst.append(v * 2)
                out = out + v
            return out
        return f, lambda: list(lst)
    run_stateful(build, [(X,)])


def test_iterator_opened_then_list_popped_and_cleared() -> None:
    def f(x):
        l = [x, x * 2, x * 3]
        it = iter(l)
        a = next(it)
        l.pop()
        rest = list(it)
        m = [1, 2, 3]
        it2 = iter(m)
        next(it2)
        m.clear()
        return a, rest, list(it2)
    run(f, [(X,)])


def test_enumerate_and_insert_in_front() -> None:
    def f(x):
        l = [1, 2, 3]
        seen = []
        for i, v in enumerate(l):
            seen.append((i, v))
            if v == 1:
                l.insert(0, 0)
            if len(seen) > 5:
                break
        return x * len(seen), seen
    run(f, [(X,)])


# ------------------------------------------------------------ globals()
def test_globals_write_then_read_by_name() -> None:
    def f(x):
        globals()["_PROBE15_WRITTEN"] = 5
        return x * _PROBE15_WRITTEN  # noqa: F821 - defined by the line above
    run(f, [(X,)])
    del globals()["_PROBE15_WRITTEN"]


def test_globals_write_then_subscript_read_and_helper_get() -> None:
    def helper():
        return globals().get("_PROBE15_OTHER", 0)

    def f(x):
        globals()["_PROBE15_OTHER"] = 7
        return x * globals()["_PROBE15_OTHER"] + helper()
    run(f, [(X,)])
    del globals()["_PROBE15_OTHER"]


def test_globals_read_of_a_module_global_is_guarded() -> None:
    def f(x):
        return x * globals()["SCALE15"]
    global SCALE15
    SCALE15 = 2.0
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    assert same(compiled(X), X * 2.0)
    SCALE15 = 3.0
    assert same(compiled(X), X * 3.0)


SCALE15 = 1.0


# ------------------------------------------------------------ enum members as graph constants
class Perm(enum.IntFlag):
    R = 4
    W = 2
    X = 1


class Dim(enum.IntEnum):
    ROW = 0
    COL = 1


class Half(float, enum.Enum):
    HALF = 0.5


def test_intflag_combination_in_a_graph_op() -> None:
    def f(x):
        m = Perm.R | Perm.X
        return x * int(m) + (m & Perm.W), x + (Perm.R & Perm.X)
    run(f, [(X,)], graphs=1)


def test_intenum_and_float_enum_as_op_arguments() -> None:
    def f(x):
        y = x.view(1, 3)
        return y.sum(Dim.COL), torch.full((2,), Dim.COL), x * Half.HALF + Dim.COL + (Perm.W & Perm.X)
    run(f, [(X,)], graphs=1)


# ------------------------------------------------------------ an Enum's own _missing_
class Size(enum.Enum):
    S = 1
    L = 3

    @classmethod
    def _missing_(cls, v):
        return cls.L if v > 1 else None


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"

    @classmethod
    def _missing_(cls, v):
        for m in cls:
            if m.value == str(v).lower():
                return m
        return None


def test_enum_missing_hook_is_inlined() -> None:
    def f(x):
        return x * Size(7).value + Size(1).value
    run(f, [(X,)], graphs=1)


def test_enum_missing_hook_returning_none_raises_value_error() -> None:
    def f(x):
        try:
            Size(0)
        except ValueError as e:
            return x - 1, str(e)
        return x
    run(f, [(X,)], graphs=1)


def test_enum_missing_hook_looping_over_members() -> None:
    def f(x, s):
        return x * (2 if Mode(s) is Mode.FAST else 3)
    run(f, [(X, "FAST"), (X, "slow"), (X, "Slow")])


# ------------------------------------------------------------ super() of a property
def test_super_property_in_a_module_override() -> None:
    class Base(torch.nn.Module):
        @property
        def scale(self):
            return 2.0

        def forward(self, x):
            return x * self.scale

    class Sub(Base):
        @property
        def scale(self):
            return super().scale + 1

    m = Sub()
    run(m, [(X,)], graphs=1)


def test_super_property_chain_of_plain_classes() -> None:
    class A:
        @property
        def v(self):
            return 1

    class B(A):
        @property
        def v(self):
            return super().v + 10

    class C(B):
        @property
        def v(self):
            return super().v + 100

    def f(x):
        return x * C().v
    run(f, [(X,)], graphs=1)


def test_itertools_still_consume_lists_lazily() -> None:
    def f(x):
        l = [1, 2]
        out = []
        for a, b in zip(l, itertools.count()):
            out.append(a * b)
            if len(l) < 4:
                l.append(a + 10)
        return x * len(out), out
    run(f, [(X,)])
