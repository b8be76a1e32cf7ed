"""map and scan give every operand and every tensor their body reads a gradient, as eager's one
autograd Function over them does: zeros (not None) for one the results do not depend on
differentiably (the body ignores it, or reads it only through .detach()), None for one read only
for its sizes. Kiln unrolls both into the graph and ties each such tensor to the results by an
exact zero (kiln/capture/variables/higher_order.py); the results keep eager's values to the bit.
Checked against eager and the real torch.compile(backend="aot_eager")."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan

import kiln


def map_reads_detached(xs, w):
    return hop_map(lambda x: x * w.detach(), xs)


def map_detached_then_ops(xs, w):
    return hop_map(lambda x: (x * w.detach().exp()).sum(0, keepdim=True), xs)


def map_two_closures(xs, w, v):
    return hop_map(lambda x: x * w.detach() * v, xs)


def map_ignores_x(xs, w):
    return hop_map(lambda x: w * 2, xs)


def map_detaches_everything(xs, w):
    return hop_map(lambda x: x.detach() * w.detach(), xs)


def map_reads_sizes_only(xs, w):
    return hop_map(lambda x: x * w.size(0), xs)


def scan_reads_detached(init, xs, w):
    def body(c, x):
        n = c + x * w.detach()
        return n, n.clone()
    return scan(body, init, xs)[1]


def scan_ignores_xs(init, xs):
    return scan(lambda c, x: (c + 1, c * 2), init, xs)[1]


def scan_ignores_carry(init, xs):
    return scan(lambda c, x: (x + 1, x * 2), init, xs)[1]


def scan_carry_through_detached(init, xs, w):
    return scan(lambda c, x: (c * w.detach() + x, c + x), init, xs)[1]


CASES = [
    (map_reads_detached, [(3, 2), (2,)]),
    (map_detached_then_ops, [(3, 2), (2,)]),
    (map_two_closures, [(3, 2), (2,), (2,)]),
    (map_ignores_x, [(3, 2), (2,)]),
    (map_detaches_everything, [(3, 2), (2,)]),
    (map_reads_sizes_only, [(3, 2), (2,)]),
    (scan_reads_detached, [(2,), (3, 2), (2,)]),
    (scan_ignores_xs, [(2,), (3, 2)]),
    (scan_ignores_carry, [(2,), (3, 2)]),
    (scan_carry_through_detached, [(2,), (3, 2), (2,)]),
]


def _grads(fn, shapes, seed=0):
    torch.manual_seed(seed)
    args = [torch.randn(*s, requires_grad=True) for s in shapes]
    out = fn(*args)
    out.sum().backward()
    return out.detach(), [a.grad for a in args]


def _same_grads(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g is None) == (w is None), (got, want)
        if w is not None:
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("fn, shapes", CASES, ids=[fn.__name__ for fn, _ in CASES])
def test_grads_of_body_operands_match_eager(fn, shapes):
    want_out, want = _grads(fn, shapes)
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to eager
        out, got = _grads(kiln.compile(fn, backend="aot_eager"), shapes)
    torch.testing.assert_close(out, want_out)
    _same_grads(got, want)


@pytest.mark.parametrize("fn, shapes", CASES[:2] + CASES[6:7], ids=lambda v: getattr(v, "__name__", ""))
def test_torch_compile_gives_the_same_zeros(fn, shapes):
    torch._dynamo.reset()
    _, theirs = _grads(torch.compile(fn, backend="aot_eager", fullgraph=True), shapes)
    kiln.reset()
    _, ours = _grads(kiln.compile(fn, backend="aot_eager"), shapes)
    _same_grads(ours, theirs)


@pytest.mark.cpp
def test_the_tie_leaves_results_bit_exact_under_inductor():
    def f(xs, w):
        return hop_map(lambda x: x * w.detach(), xs)

    xs = torch.tensor([[-0.0, float("inf")], [float("nan"), 1.5]], requires_grad=True)
    w = torch.tensor([1.0, -1.0], requires_grad=True)
    kiln.reset()
    got = kiln.compile(f)(xs, w)
    want = f(xs, w)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(torch.signbit(got), torch.signbit(want))
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    got.sum().backward()
    assert torch.equal(w.grad, torch.zeros(2))


def test_no_tie_without_grad():
    kiln.reset()
    backend = kiln.backends.CountingBackend()
    xs, w = torch.randn(3, 2), torch.randn(2)
    out = kiln.compile(map_reads_detached, backend=backend)(xs, w)
    torch.testing.assert_close(out, map_reads_detached(xs, w))
    assert not any(n.target is torch.narrow for g in backend.graphs for n in g.graph.nodes)


def _scan_returns_one_tensor_twice(init, xs, w):
    def body(c, x):
        n = c * w.detach() + x
        return n, n
    return scan(body, init, xs)[1]


def _scan_returns_a_view_of_its_carry(init, xs):
    def body(c, x):
        n = c + x
        return n, n.view(-1)
    return scan(body, init, xs)[1]


@pytest.mark.parametrize("fn, shapes", [(_scan_returns_one_tensor_twice, [(2,), (3, 2), (2,)]),
                                        (_scan_returns_a_view_of_its_carry, [(2,), (3, 2)])],
                         ids=["same tensor", "view"])
def test_scan_results_aliasing_each_other_raise_as_eager(fn, shapes):
    # eager's scan refuses a combine_fn whose results alias each other (a carry also returned as
    # the output): a break, so that the call raises natively, not values eager never gives
    args = [torch.randn(*s) for s in shapes]
    with pytest.raises(Exception, match="aliasing") as want:
        fn(*args)
    kiln.reset()
    with pytest.raises(type(want.value), match="aliasing"):
        kiln.compile(fn, backend="aot_eager")(*args)
