"""Python-language classes of bug found by the 16th probe (Dynamo-style programs kept outside the
repository): each test runs eagerly and through kiln.compile(backend="eager") and compares values,
raised exceptions and side effects, and where it matters the number of graphs.

- `id()` of a list, dict or set: its Python value is rebuilt on every read, so `id(a) == id(a)` was
  False and a dict keyed by `id(a)` raised KeyError; it is the container's identity now;
- `enumerate(lst)` across a graph break in its loop: the resume got a tuple of the numbered items
  left, so items appended or removed after the break were not seen (a wrong answer); it gets an
  enumerate over a live iterator of the same list now;
- `zip(lst, ...)` read every column to its end when made, so items appended to the list in the
  loop body (with or without a break) were not reached (a wrong answer); each row reads one item
  of each column when asked for now, a list's by index;
- sorted/min/max of instances of user classes (or of a key's results that are) broke the graph;
  they run Python's own sort with each comparison the class's traced dunder, in eager's order;
- abs/round/pow of an instance of a user class broke the graph: they run its dunders;
- `getattr(obj, name, default)` looked the attribute up twice (a __getattr__ or property with side
  effects ran twice), and the graph_break check of a callee probed `__qualname__`/`__wrapped__`
  through a user class's __getattr__ (its side effects ran at trace time);
- `a is b` between a list made in the frame and another list was unsupported when the lists held
  tensors (the whole frame ran eagerly): a list made in the frame is no other list.
"""
from __future__ import annotations

import collections
from typing import Any, Callable

import torch

import kiln
from eager_compare import run
from semantics_oracle import same

X = torch.arange(3.0) - 1.0
gb = torch._dynamo.graph_break


# ------------------------------------------------------------ id() of containers made in the frame
def test_id_of_the_same_list_is_equal() -> None:
    def f(x):
        a = [1]
        b = a
        c = [1]
        return x + (id(a) == id(b)) + (id(a) == id(c)) * 10 + (id(a) == id(a)) * 100
    run(f, [(X,)], graphs=1)


def test_id_of_dict_and_set_compared() -> None:
    def f(x):
        d = {"a": 1}
        s = {1, 2}
        e = d
        return x + (id(d) == id(e)) + (id(s) == id(s)) * 10 + (id(d) != id(s)) * 100
    run(f, [(X,)], graphs=1)


def test_dict_keyed_by_id_of_containers() -> None:
    # the memo pattern of deepcopy-like code: was a KeyError (each id() a fresh number)
    def f(x):
        a = [1]
        b = {}
        seen = {id(a): 1, id(b): 2}
        return x + seen[id(a)] + seen[id(b)] * 10 + (id(a) in seen) * 100
    run(f, [(X,)])


def test_id_of_argument_list_against_global() -> None:
    target = [1, 2]
    key = id(target)

    def f(x, lst):
        return x + (id(lst) == key)
    run(f, [(X, target), (X, [1, 2]), (X, target)], breaks=True)


def test_id_of_argument_dict_aliases() -> None:
    def f(x, d, e):
        return x + (id(d) == id(e))
    shared = {"a": 1}
    run(f, [(X, shared, shared), (X, shared, {"a": 1})])


# ------------------------------------------------------------ enumerate over a list across a break
def enumerate_append_after_break(x):
    l = [1, 2, 3]
    for i, v in enumerate(l):
        gb()
        x = x + v * i
        if i == 0:
            l.append(10)
    return x, l


def enumerate_remove_with_start(x):
    l = [1, 2, 3, 4, 5]
    for i, v in enumerate(l, start=2):
        x = x * 2 + v * i
        gb()
        if v == 2:
            l.remove(3)
    return x, l


def enumerate_pop_in_body(x):
    l = [1, 2, 3, 4]
    for i, v in enumerate(l):
        x = x + v + i
        gb()
        l.pop()
    return x, l


def enumerate_argument_append(x, l):
    for i, v in enumerate(l):
        x = x + v * (i + 1)
        gb()
        if len(l) < 4:
            l.append(v * 10)
    return x, l


def test_enumerate_sees_appends_after_a_break() -> None:
    run(enumerate_append_after_break, [(X,), (X,)], breaks=True)


def test_enumerate_with_start_sees_removes_after_a_break() -> None:
    run(enumerate_remove_with_start, [(X,), (X,)], breaks=True)


def test_enumerate_sees_pops_after_a_break() -> None:
    run(enumerate_pop_in_body, [(X,), (X,)], breaks=True)


def test_enumerate_over_an_argument_list_mutated_after_a_break() -> None:
    run(enumerate_argument_append, [(X, None), (X, None)], breaks=True, fresh=lambda: (X, [1, 2]))


def test_enumerate_of_a_deque_built_list_across_break_unchanged() -> None:
    # no mutation: the numbers and items as eager's, and the loop does not compile once per position
    def f(xs):
        acc = xs[0] * 0
        for i, t in enumerate(list(collections.deque(xs))):
            acc = acc + t * i
            gb()
        return acc
    xs = [torch.randn(3) for _ in range(12)]
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    assert same(compiled(xs), f(xs))
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["compiles"] <= 5, kiln.stats()


# ------------------------------------------------------------ zip over a list read row by row
def zip_append_in_body(x):
    l = [1, 2, 3]
    for a, b in zip(l, range(5)):
        if len(l) < 5:
            l.append(a * 10)
        x = x + a * b
    return x, l


def zip_append_after_break(x):
    l = [1, 2, 3]
    for a, b in zip(l, range(5)):
        gb()
        if len(l) < 5:
            l.append(a * 10)
        x = x + a * b
    return x, l


def zip_two_lists_grown_before_rest(x):
    l = [1, 2, 3]
    m = [4, 5]
    z = zip(l, m)
    first = next(z)
    l.append(9)
    m.append(7)
    return x + first[0], list(z)


def zip_stops_at_first_exhausted_column(x):
    l = [1, 2]
    m = [5]
    it = iter(l)
    rows = list(zip(it, m))
    return x + len(rows), rows, list(it)


def test_zip_sees_appends_in_the_loop_body() -> None:
    run(zip_append_in_body, [(X,)], graphs=1)


def test_zip_sees_appends_after_a_break() -> None:
    run(zip_append_after_break, [(X,)], breaks=True)


def test_zip_rows_read_lazily() -> None:
    run(zip_two_lists_grown_before_rest, [(X,)], graphs=1)


def test_zip_consumes_the_earlier_columns_as_eager() -> None:
    run(zip_stops_at_first_exhausted_column, [(X,)], graphs=1)


def test_zip_of_argument_lists_across_breaks_compiles_a_few_times() -> None:
    def f(xs, ys):
        acc = xs[0] * 0
        for a, b in zip(xs, ys):
            acc = acc + a * b
            gb()
        return acc
    xs = [torch.randn(3) for _ in range(12)]
    ys = [torch.randn(3) for _ in range(10)]
    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    assert same(compiled(xs, ys), f(xs, ys))
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["compiles"] <= 5, kiln.stats()


# ------------------------------------------------------------ user objects ordered by their own dunders
class Prio:
    log: list = []

    def __init__(self, p, t):
        self.p = p
        self.t = t

    def __lt__(self, other):
        Prio.log.append((self.p, other.p))
        return self.p < other.p


class Both:
    def __init__(self, v):
        self.v = v

    def __gt__(self, other):
        Prio.log.append(("gt", self.v, other.v))
        return self.v > other.v

    def __lt__(self, other):
        Prio.log.append(("lt", self.v, other.v))
        return self.v < other.v


def run_logged(fn: Callable[..., Any], *args: Any) -> None:
    """One graph, no break, and the dunders called in eager's order."""
    Prio.log = []
    want = fn(*args)
    want_log, Prio.log = Prio.log, []
    run(fn, [args], graphs=1)
    Prio.log = []
    kiln.reset()
    kiln.compile(fn, backend="eager")(*args)
    assert Prio.log == want_log


def test_sorted_user_objects_by_lt() -> None:
    def f(x):
        ps = [Prio(3, x), Prio(1, x * 2), Prio(2, x * 3), Prio(1, x * 4)]
        return sorted(ps)[0].t, [q.p for q in sorted(ps, reverse=True)], [q.t for q in sorted(ps)]
    run_logged(f, X)


def test_sorted_by_key_returning_user_objects() -> None:
    def f(x):
        items = [(x, 3), (x * 2, 1), (x * 3, 2)]
        return [t for t, _ in sorted(items, key=lambda it: Prio(it[1], None))]
    run_logged(f, X)


def test_max_min_of_user_objects() -> None:
    def f(x):
        gs = [Both(1), Both(5), Both(3)]
        return x + max(gs).v + min(gs).v * 10 + max(Both(2), Both(7)).v * 100
    run_logged(f, X)


def test_max_min_with_key_returning_user_objects() -> None:
    def f(x):
        ps = [Prio(2, x), Prio(9, x * 2), Prio(4, x * 3)]
        return max(ps, key=lambda p: Both(p.p)).t + min(ps, key=lambda p: Both(-p.p)).t
    run_logged(f, X)


def test_sorted_dataclass_order() -> None:
    import dataclasses

    @dataclasses.dataclass(order=True)
    class V:
        a: int
        b: int

    def f(x):
        vs = [V(2, 1), V(1, 5), V(1, 2)]
        return x + sorted(vs)[0].b, max(vs).a, [v.b for v in sorted(vs, reverse=True)]
    run(f, [(X,)], graphs=1)


# ------------------------------------------------------------ abs/round/pow of user objects
class Vec:
    def __init__(self, t):
        self.t = t

    def __neg__(self):
        return Vec(-self.t)

    def __abs__(self):
        return Vec(self.t.abs())

    def __round__(self, n=None):
        return Vec(torch.round(self.t, decimals=n or 0))

    def __pow__(self, k):
        return Vec(self.t ** k)

    def __rpow__(self, b):
        return Vec(b ** self.t)


def test_abs_round_pow_run_the_dunders() -> None:
    def f(x):
        return abs(-Vec(x)).t + round(Vec(x * 10), 1).t + round(Vec(x)).t + pow(Vec(x), 2).t + pow(2, Vec(x)).t
    run(f, [(X,)], graphs=1)


def test_abs_of_object_without_dunder_raises_type_error() -> None:
    class Plain:
        pass

    def f(x):
        try:
            abs(Plain())
        except TypeError:
            return x + 1
        return x
    run(f, [(X,)], breaks=True)


# ------------------------------------------------------------ attribute probes run a user __getattr__ once
class Logged:
    log: list = []

    def __getattr__(self, name):
        Logged.log.append(name)
        return len(name)


class Counted:
    def __init__(self):
        self.n = 0

    @property
    def tick(self):
        self.n += 1
        return self.n


LOGGED = Logged()


def test_getattr_hook_of_a_global_object_runs_as_eager() -> None:
    def f(x):
        return x + LOGGED.a + LOGGED.bb + getattr(LOGGED, "ccc", 5)
    Logged.log = []
    want = f(X)
    want_log, Logged.log = Logged.log, []
    kiln.reset()
    got = kiln.compile(f, backend="eager")(X)
    assert same(got, want) and Logged.log == want_log, (Logged.log, want_log)


def test_getattr_with_default_runs_a_property_once() -> None:
    def build():
        c = Counted()

        def f(x):
            return x + getattr(c, "tick", 0) + getattr(c, "missing", 7)
        return f, lambda: c.n
    fn_e, obs_e = build()
    fn_c, obs_c = build()
    kiln.reset()
    compiled = kiln.compile(fn_c, backend="eager")
    for _ in range(2):
        assert same(compiled(X), fn_e(X))
        assert obs_c() == obs_e()


def test_getattr_with_default_of_frame_object_hook_once() -> None:
    def f(x):
        log = []

        class O:
            def __getattr__(self, name):
                log.append(name)
                if name == "ok":
                    return 3
                raise AttributeError(name)
        o = O()
        return x + getattr(o, "ok", 1) + getattr(o, "no", 10), log
    run(f, [(X,)], breaks=True)


# ------------------------------------------------------------ `is` between two lists
def test_is_between_lists_made_in_the_frame() -> None:
    # two lists holding tensors: `is` was unsupported, and the whole frame ran eagerly
    import dataclasses

    @dataclasses.dataclass
    class C:
        items: list = dataclasses.field(default_factory=list)

    def f(x):
        a = C()
        b = C()
        a.items.append(x)
        k = [x]
        return sum(a.items) + len(b.items), a.items is b.items, a.items is a.items, k is a.items
    run(f, [(X,)], graphs=1)
