"""Leftovers found by probes, each a class of cases compared with eager (values, raised errors with
eager's text, side effects) and, for graph counts and mark_dynamic outcomes, with the real
torch.compile as the oracle.

- reversed() over a dict or its views that grows or shrinks during the loop raises eager's
  RuntimeError, with and without a graph break in the body;
- a set iterator live across a graph break follows a same-size change of the set (discard then
  add) as eager's iterator does;
- in-place layout changes (t_, squeeze_, as_strided_, resize_ ...) of a view of an input, or of the
  input more than once, move the input's version counter as eager's do;
- an as_strided after the first link of a view chain, then an in-place op, compiles and updates
  the base;
- `x.shape == (4, 9)` with a mark_dynamic dim is decided by the static pair, as Dynamo decides it;
- a cell read out of a closure made in the frame (`g.__closure__[0].cell_contents`) is the real
  cell's contents, and `is` against it is guarded.
"""
from __future__ import annotations

import collections
from typing import Any, Callable

import pytest
import torch

import kiln
from eager_compare import check
from semantics_oracle import same
from torch_oracle import torch_graph_count

gb = torch._dynamo.graph_break


def zeros() -> tuple:
    return (torch.zeros(2),)


# ------------------------------------------------------------------ reversed() over a changing dict

def rev_grow(x):
    d = {1: 1, 2: 2}
    for k in reversed(d):
        x = x + k
        d[k + 10] = 1
    return x, d


def rev_grow_break(x):
    d = {1: 1, 2: 2}
    for k in reversed(d):
        x = x + k
        gb()
        d[k + 10] = 1
    return x, d


def rev_keys_shrink(x):
    d = {1: 1, 2: 2, 3: 3}
    for k in reversed(d.keys()):
        x = x + k
        del d[k]
    return x, d


def rev_keys_shrink_break(x):
    d = {1: 1, 2: 2, 3: 3}
    for k in reversed(d.keys()):
        x = x + k
        gb()
        del d[k]
    return x, d


def rev_values_grow(x):
    d = {1: 1, 2: 2}
    for v in reversed(d.values()):
        x = x + v
        d[v + 10] = 1
    return x, d


def rev_items_pop_break(x):
    d = collections.OrderedDict(a=1, b=2)
    for k, v in reversed(d.items()):
        x = x * 2 + v
        gb()
        d.pop(k)
    return x, dict(d)


def rev_same_size(x):
    # eager's reversed iterator walks down the entries: the key added at the end is not reached
    d = {1: 1, 2: 2, 3: 3}
    for k in reversed(d):
        x = x + k
        if k == 3:
            del d[1]
            d[7] = 7
    return x, d


def rev_same_size_break(x):
    d = {1: 1, 2: 2, 3: 3}
    for k in reversed(d):
        x = x + k
        gb()
        if k == 3:
            del d[1]
            d[7] = 7
    return x, d


def rev_value_set(x):
    d = {1: 1, 2: 2}
    for k in reversed(d):
        x = x + d[k]
        d[k] = 5
    return x, d


@pytest.mark.parametrize("fn", [rev_grow, rev_grow_break, rev_keys_shrink, rev_keys_shrink_break, rev_values_grow,
                                rev_items_pop_break, rev_same_size, rev_same_size_break, rev_value_set],
                         ids=lambda f: f.__name__)
def test_reversed_dict_changed_during_iteration(fn):
    check(fn, zeros)


def rev_passed(x, d):
    for k in reversed(d):
        x = x + k
        d[k + 10] = 1
    return x


def test_reversed_passed_dict_grown():
    check(rev_passed, lambda: (torch.zeros(2), {1: 1, 2: 2}))


def rev_sum(x, d):
    for k in reversed(d):
        x = x * 2 + d[k]
    return x


def rev_items_break(x, d):
    for k, v in reversed(d.items()):
        x = x * 2 + v
        gb()
    return x


def make_dict_args() -> tuple:
    return (torch.zeros(2), {"a": 1, "b": 2, "c": 3})


def test_reversed_dict_graph_count_matches_torch():
    check(rev_sum, make_dict_args)
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    kiln.compile(rev_sum, backend=backend)(*make_dict_args())
    assert backend.frame_count == torch_graph_count(rev_sum, [make_dict_args()]) == 1


def test_reversed_dict_items_across_a_break():
    # Dynamo runs this frame eagerly (no graph); Kiln compiles each piece, with eager's values
    check(rev_items_break, make_dict_args)


# ------------------------------------------------------------------ a set changed at the same size

def set_swap_break(x):
    s = {1, 2, 3}
    out = []
    for v in s:
        x = x + v
        gb()
        if v == 1:
            s.discard(3)
            s.add(5)
        out.append(v)
    return x, out, s


def set_swap_colliding_break(x):
    s = {17, 1, 9, 25, 33}
    out = []
    for v in s:
        x = x + v
        gb()
        if v == 1:
            s.discard(25)
            s.add(41)
        out.append(v)
    return x, out, s


def set_swap_twice_break(x):
    s = {1, 2, 3, 4}
    out = []
    for v in s:
        x = x * 2 + v
        gb()
        if v < 3:
            s.discard(v + 2)
            s.add(v + 8)
        out.append(v)
    return x, out, s


@pytest.mark.parametrize("fn", [set_swap_break, set_swap_colliding_break, set_swap_twice_break],
                         ids=lambda f: f.__name__)
def test_set_same_size_change_after_a_break(fn):
    check(fn, zeros)


def set_swap_passed(x, s):
    out = []
    for v in s:
        x = x + v
        gb()
        if v == 1:
            s.discard(3)
            s.add(13)
        out.append(v)
    return x, out


def test_passed_set_same_size_change_after_a_break():
    check(set_swap_passed, lambda: (torch.zeros(2), {1, 2, 3}))


# ------------------------------------------------------------------ version counters of layout changes

LAYOUT_OPS = {
    "squeeze_": lambda v: v.squeeze_(),
    "squeeze_dim": lambda v: v.squeeze_(0),
    "unsqueeze_": lambda v: v.unsqueeze_(0),
    "t_": lambda v: v.t_(),
    "transpose_": lambda v: v.transpose_(0, 1),
    "swapdims_": lambda v: v.swapdims_(0, 1),
    "as_strided_": lambda v: v.as_strided_((2, 2), (1, 2)),
    "resize_smaller": lambda v: v.resize_(2),
    "resize_same": lambda v: v.resize_(v.shape),
}


def _versions(fn: Callable[..., Any], x: torch.Tensor) -> tuple[int, Any]:
    start = x._version
    out = fn(x)
    return x._version - start, out


# an input resized in place is refused (its frame runs eagerly), so not twice on the input
LAYOUT_CASES = [(op, where) for where in ("view", "input_twice", "view_then_data") for op in LAYOUT_OPS
                if not (where == "input_twice" and op.startswith("resize"))]


@pytest.mark.parametrize("op,where", LAYOUT_CASES, ids=lambda v: str(v))
def test_layout_change_moves_the_input_version(op, where):
    layout = LAYOUT_OPS[op]

    def fn(x):
        if where == "view":
            v = x[:]
            layout(v)
            return v * 2
        if where == "input_twice":
            layout(x)
            x.unsqueeze_(0)
            return x + 1
        v = x[:]
        layout(v)
        v.add_(1)
        return v * 2

    kiln.reset()
    x = torch.randn(1, 4)
    y = x.clone()
    want_bumps, want = _versions(fn, x)
    got_bumps, got = _versions(kiln.compile(fn, backend="aot_eager"), y)
    assert same(got, want)
    assert torch.equal(y, x) and y.shape == x.shape and y.stride() == x.stride()
    assert got_bumps == want_bumps, (got_bumps, want_bumps)
    assert kiln.stats()["fallbacks"] == 0


def test_layout_change_of_a_view_seen_by_a_saved_tensor_check():
    # the version a backward saved is the one eager's squeeze_ of a view moved
    w = torch.randn(1, 4, requires_grad=True)

    def fn(x):
        v = x[:]
        v.squeeze_(0)
        return v * 2

    for compiled in (fn, kiln.compile(fn, backend="aot_eager")):
        x = torch.randn(1, 4)
        loss = (w * x).sum()  # saves x for the backward of the multiplication
        compiled(x)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


# ------------------------------------------------------------------ as_strided in a view chain, then an update

def strided_of_view(x):
    x.view(-1).as_strided((2, 2), (2, 1)).mul_(2)
    return x + 0


def strided_of_slice(x):
    v = x[1:].as_strided((2, 2), (1, 2))
    v.zero_()
    return x.sum()


def strided_of_transpose(x):
    v = x.t().as_strided((2,), (3,), 2)
    v.fill_(7)
    return x.clone()


def strided_own_offset(x):
    v = x[1:, 1:].as_strided((2, 2), (4, 1), None)
    v.mul_(3)
    return x.sum(0)


def strided_twice(x):
    v = x[1].as_strided((2,), (1,)).as_strided((3,), (2,))
    v.sub_(1)
    return v + 0


def strided_of_intermediate(x):
    y = x.t() * 1
    y[1:].as_strided((2, 3), (1, 4), 2).add_(torch.ones(2, 3))
    return y * 1


@pytest.mark.parametrize("fn", [strided_of_view, strided_of_slice, strided_of_transpose, strided_own_offset,
                                strided_twice, strided_of_intermediate], ids=lambda f: f.__name__)
def test_as_strided_in_a_view_chain_then_updated(fn):
    with _no_kiln_warning():
        check(fn, lambda: (torch.arange(12.).reshape(3, 4),), backend="aot_eager")
    assert kiln.stats()["fallbacks"] == 0


def test_as_strided_in_a_view_chain_gradient():
    def fn(x):
        y = x * 1
        y.view(-1).as_strided((2, 2), (2, 1), 3).mul_(2)
        return (y * y).sum()

    x = torch.arange(12.).reshape(3, 4).requires_grad_()
    kiln.reset()
    got = kiln.compile(fn, backend="aot_eager")(x)
    got.backward()
    got_grad, x.grad = x.grad, None
    want = fn(x)
    want.backward()
    assert torch.equal(got, want) and torch.equal(got_grad, x.grad)
    assert kiln.stats()["fallbacks"] == 0


class _no_kiln_warning:
    """Fails on a KilnWarning (an internal error that ran the frame eagerly)."""

    def __enter__(self) -> None:
        import warnings
        self._catch = warnings.catch_warnings(record=True)
        self._seen = self._catch.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc: Any) -> None:
        self._catch.__exit__(*exc)
        errors = [str(w.message) for w in self._seen if "internal error" in str(w.message)]
        assert not errors, errors


# ------------------------------------------------------------------ shape tuples under mark_dynamic

def shape_eq_other_static(x):
    return x + 1 if x.shape == (4, 9) else x - 1


def size_eq_other_static(x):
    return x + 1 if x.size() == torch.Size([4, 9]) else x - 1


def shape_ne_other_static(x):
    return x + 1 if x.shape != (4, 7) else x - 1


def tuple_shape_eq_other_static(x):
    return x + 1 if tuple(x.shape) == (4, 9) else x - 1


def shape_eq_longer(x):
    return x + 1 if x.shape == (4, 8, 1) else x - 1


def shape_tail_eq_other(x):
    return x + 1 if x.shape[1:] == (9,) else x - 1


def shape_eq_equal(x):
    return x + 1 if x.shape == (4, 8) else x - 1


def shape_eq_marked_differs(x):
    return x + 1 if x.shape == (3, 8) else x - 1


@pytest.mark.parametrize("fn", [shape_eq_other_static, size_eq_other_static, shape_ne_other_static,
                                tuple_shape_eq_other_static, shape_eq_longer, shape_tail_eq_other, shape_eq_equal,
                                shape_eq_marked_differs], ids=lambda f: f.__name__)
def test_shape_compare_under_mark_dynamic_matches_dynamo(fn):
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    x = torch.randn(4, 8)
    torch._dynamo.mark_dynamic(x, 0)
    try:
        want = ("ok", torch.compile(fn, backend=counter)(x))
    except Exception as exc:  # noqa: BLE001 - Dynamo's ConstraintViolationError
        want = ("raised", type(exc).__name__)
    finally:
        torch._dynamo.reset()
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    y = torch.randn(4, 8)
    kiln.mark_dynamic(y, 0)
    try:
        got = ("ok", kiln.compile(fn, backend=backend)(y))
    except kiln.symbolic.ConstraintViolation:
        got = ("raised", "ConstraintViolation")
    assert got[0] == want[0], (got, want)
    if got[0] == "ok":
        assert same(got[1], fn(y))
        assert backend.frame_count == counter.frame_count
        # the marked dim stays symbolic: another size reuses the graph
        z = torch.randn(6, 8)
        assert same(kiln.compile(fn, backend=backend)(z), fn(z))
        assert backend.frame_count == counter.frame_count


# ------------------------------------------------------------------ cells of closures made in the frame

def make_getter(l):
    return lambda: l


def cell_of_helper_closure(x, l, m):
    g = make_getter(l)
    return x + (1 if g.__closure__[0].cell_contents is m else 2)


def cell_of_own_closure(x, l, m):
    g = lambda: l  # noqa: E731
    return x + (1 if m is g.__closure__[0].cell_contents else 2)


def cell_held_across_break(x, l, m):
    g = lambda: l  # noqa: E731
    c = g.__closure__[0]
    gb()
    return x + (1 if c.cell_contents is m else 2)


def cell_contents_appended(x, l, m):
    g = make_getter(l)
    g.__closure__[0].cell_contents.append(3)
    return x + (1 if g() is m else 2)


@pytest.mark.parametrize("fn", [cell_of_helper_closure, cell_of_own_closure, cell_held_across_break,
                                cell_contents_appended], ids=lambda f: f.__name__)
def test_closure_cell_identity(fn):
    shared = [1]
    cases = [lambda: (torch.zeros(2), [1], [2]), lambda: (torch.zeros(2), shared, shared)]
    for order in (cases, cases[::-1]):
        kiln.reset()
        compiled = kiln.compile(fn, backend="eager")
        for make in order:
            eager_args, kiln_args = make(), make()
            if eager_args[1] is shared:
                before = list(shared)
                want = fn(*eager_args)
                shared[:] = before
            else:
                want = fn(*eager_args)
            got = compiled(*kiln_args)
            assert same(got, want), (fn.__name__, got, want)
            assert kiln_args[1] == eager_args[1]
