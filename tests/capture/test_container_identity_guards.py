"""Identity of containers from outside the frame (arguments, globals, attributes, closure cells,
items of other containers): every decision the trace makes by which object a list, dict, set or
deque is (`is`, `is not`, id(), two arguments being one list so that a change through one shows
through the other) is guarded, as the identity of tensors is (the same list passed twice is one
Variable whose paths an aliasing guard ties; two lists told apart are guarded to stay apart), and
a trace that decides nothing by identity gains no guard that recompiles when the aliasing flips
(kiln/capture/variables/builder.py: _CONTAINERS, container_alias_guards; operators._identity)."""
from __future__ import annotations

import collections
import copy
import warnings
from typing import Any, Callable

import torch

import kiln
from kiln.log import KilnWarning

X = torch.zeros(2)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(p, q) for p, q in zip(a, b))
    return bool(a == b)


def check(fn: Callable[..., Any], makers: list[Callable[[], tuple]], observe: Callable[[tuple], Any] = lambda a: None,
          between: Callable[[], None] | None = None) -> Any:
    """Each maker builds fresh arguments (and sets any global state) twice: one set runs eagerly,
    the other compiled; the results and what `observe` sees afterwards (the arguments, mutated in
    place) must agree. Returns the compiled function."""
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)  # an internal error would run eagerly and pass
        for i, make in enumerate(makers):
            args = make()
            want = fn(*args)
            want_state = copy.deepcopy(observe(args))
            args = make()
            got = compiled(*args)
            got_state = observe(args)
            assert _same(got, want), f"call {i}: compiled gave {got!r}, eager {want!r}"
            assert _same(got_state, want_state), f"call {i}: state {got_state!r}, eager {want_state!r}"
    return compiled


def _shared() -> tuple:
    lst = [1, 2]
    return X, lst, lst


def _apart() -> tuple:
    return X, [1, 2], [1, 2]


FLIPS = [_shared, _apart, _shared, _apart, _shared]


# ------------------------------------------------------------------ arguments
def test_is_between_two_list_arguments() -> None:
    check(lambda x, l, m: x + (l is m), FLIPS)


def test_is_not_and_id_between_two_list_arguments() -> None:
    def f(x, l, m):
        return x + (l is not m) + 10 * (id(l) == id(m)) + 100 * (id(m) != id(l))
    check(f, [_apart, _shared, _apart, _shared])


def test_is_between_dict_set_and_deque_arguments() -> None:
    def f(x, a, b):
        return x + (a is b)
    for kind in (dict, set, collections.deque):
        def one(kind: Any = kind) -> tuple:
            v = kind([(1, 2)]) if kind is dict else kind([1])
            return X, v, v

        def two(kind: Any = kind) -> tuple:
            return (X,) + tuple(kind([(1, 2)]) if kind is dict else kind([1]) for _ in range(2))
        check(f, [one, two, one, two])


def test_id_of_dict_arguments_compared() -> None:
    def f(x, a, b):
        return x + (id(a) == id(b))
    d = {"k": 1}
    check(f, [lambda: (X, d, d), lambda: (X, d, {"k": 1}), lambda: (X, d, d)])


def test_append_through_one_list_is_seen_through_the_other() -> None:
    def f(x, l, m):
        l.append(3)
        return x + len(m) + m[-1]
    check(f, FLIPS, observe=lambda a: a[1:])


def test_append_through_the_second_is_seen_through_the_first() -> None:
    def f(x, l, m):
        m.append(5)
        m.pop(0)
        return x + len(l) + l[0]
    check(f, [_apart, _shared, _apart, _shared], observe=lambda a: a[1:])


def test_dict_written_through_one_argument_read_through_the_other() -> None:
    def f(x, a, b):
        a["k"] = 7
        return x + b["k"]

    def one() -> tuple:
        d = {"k": 1}
        return X, d, d
    check(f, [one, lambda: (X, {"k": 1}, {"k": 1}), one], observe=lambda a: a[1:])


def test_no_identity_decision_no_recompile_when_aliasing_flips() -> None:
    # traced on two lists, nothing decided by identity nor changed: no guard on their aliasing
    def f(x, l, m):
        return x + l[0] + m[1]
    check(f, FLIPS[1:] + FLIPS)
    assert kiln.stats()["recompiles"] == 0
    # traced on one list passed twice (one Variable, items read by the first path): one more
    # capture for two lists, and both serve every later call
    check(f, FLIPS + FLIPS)
    assert kiln.stats()["recompiles"] == 1


def test_fresh_lists_each_call_reuse_the_captures() -> None:
    # the guards name no list: a new shared pair and a new distinct pair pass the two captures made
    check(lambda x, l, m: x + (l is m), FLIPS + FLIPS)
    assert kiln.stats()["recompiles"] == 1


# ------------------------------------------------------------------ globals
GLIST: list = [1, 2]


def _global_is(x, l):
    return x + (l is GLIST)


def test_global_list_is_argument() -> None:
    other = [1, 2]
    check(_global_is, [lambda: (X, GLIST), lambda: (X, other), lambda: (X, GLIST), lambda: (X, other)])


def _global_append(x, l):
    GLIST.append(1)
    out = x + len(l)
    GLIST.pop()
    l.append(0)
    return out + len(GLIST)


def test_global_list_mutated_and_argument_read() -> None:
    def fresh() -> tuple:
        GLIST[:] = [1, 2]
        return X, [1, 2]

    def shared() -> tuple:
        GLIST[:] = [1, 2]
        return X, GLIST
    check(_global_append, [fresh, shared, fresh, shared], observe=lambda a: (a[1], GLIST))


# ------------------------------------------------------------------ attributes
class Holder:
    def __init__(self, a: list, b: list) -> None:
        self.a, self.b = a, b


def test_attributes_of_an_object_compared_by_identity() -> None:
    def f(x, h):
        return x + (h.a is h.b)

    def one() -> tuple:
        lst = [1]
        return X, Holder(lst, lst)
    check(f, [one, lambda: (X, Holder([1], [1])), one, lambda: (X, Holder([1], [1]))])


def test_attribute_list_mutated_and_argument_read() -> None:
    def f(x, h, l):
        h.a.append(2)
        return x + len(l)

    def one() -> tuple:
        lst = [1]
        return X, Holder(lst, []), lst
    check(f, [lambda: (X, Holder([1], []), [1]), one, lambda: (X, Holder([1], []), [1]), one],
          observe=lambda a: (a[1].a, a[2]))


# ------------------------------------------------------------------ closures
def _closure_over(cell_list: list) -> Callable[..., Any]:
    def f(x, l):
        return x + (l is cell_list) + 10 * (id(cell_list) == id(l))
    return f


def test_closure_cell_list_is_argument() -> None:
    held = [1, 2]
    f = _closure_over(held)
    check(f, [lambda: (X, held), lambda: (X, [1, 2]), lambda: (X, held), lambda: (X, [1, 2])])


def test_closure_cell_list_appended_argument_read() -> None:
    held: list = [1]

    def f(x, l):
        held.append(2)
        out = x + len(l)
        held.pop()
        return out
    check(f, [lambda: (X, [1]), lambda: (X, held), lambda: (X, [1]), lambda: (X, held)], observe=lambda a: (a[1], held))


# ------------------------------------------------------------------ nested containers
def test_item_of_one_list_is_the_other_argument() -> None:
    def f(x, outer, m):
        return x + (outer[0] is m) + 10 * (outer[1] is not m)

    inner = [1]  # the same list every call: only which item of `outer` it is changes
    check(f, [lambda: (X, [inner, [1]], inner), lambda: (X, [[1], inner], inner), lambda: (X, [inner, [1]], inner),
              lambda: (X, [[1], [1]], inner), lambda: (X, [[1], inner], inner)])


def test_nested_list_appended_seen_through_a_dict_value() -> None:
    def f(x, outer, d):
        outer[0].append(9)
        return x + len(d["v"])

    def one() -> tuple:
        inner = [1]
        return X, [inner], {"v": inner}
    check(f, [one, lambda: (X, [[1]], {"v": [1]}), one], observe=lambda a: a[1:])


def test_tuple_of_lists_items_compared() -> None:
    def f(x, t):
        return x + (t[0] is t[1])

    def one() -> tuple:
        inner = [1]
        return X, (inner, inner)
    check(f, [one, lambda: (X, ([1], [1])), one, lambda: (X, ([1], [1]))])


def test_tuple_arguments_compared_by_identity() -> None:
    # tuples from outside get a Variable per read: `t is u` follows their real objects, guarded
    def f(x, t, u):
        return x + (t is u) + 10 * (t is not u)
    lst = [1]
    shared, consts = (lst,), (1, 2)
    check(f, [lambda: (X, shared, shared), lambda: (X, shared, (lst,)), lambda: (X, shared, shared),
              lambda: (X, consts, consts), lambda: (X, consts, (1, 3)), lambda: (X, consts, consts)])
