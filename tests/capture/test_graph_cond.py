"""`torch.cond` and `while_loop` on a predicate that depends on tensor data
(kiln/capture/variables/cond_graph.py, kiln/autograd/cond.py): one graph holding a graph-level cond
(while_loop), as torch.compile makes, that runs either branch (any number of iterations) without
recompiling, under the "eager", "aot_eager" and "inductor" backends, with
eager's values and gradients through the branch taken. The real torch.compile with a counting
backend is the oracle for the graph and recompile counts.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._higher_order_ops import while_loop

import kiln
from kiln.backends import CountingBackend, lookup

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]
W = torch.randn(4, 5, requires_grad=True)
LIN = torch.nn.Linear(5, 5)


def _data_pred(x):
    y = x * 2
    return torch.cond(y.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (y,)) + 1


def _closure_over_weight(x):
    return torch.cond(x.mean() > 0, lambda t: t * W, lambda t: (t - W).exp(), (x,)) * 3


def _parameter_in_branch(x):
    return torch.cond(x[0, 0] > 0, lambda t: LIN(t).relu(), lambda t: LIN(t * 2), (x,)).sum(0)


def _tuple_results(x):
    a, b = torch.cond(x.sum() > 0, lambda t, u: (t + u, t * u), lambda t, u: (t - u, t / (u.abs() + 1)),
                      (x, x.cos()))
    return a * 2 + b


def _nested(x):
    def outer_true(t):
        return torch.cond(t.max() > 1.0, lambda s: s * 3, lambda s: s.neg(), (t,)) + 1

    return torch.cond(x.sum() > 0, outer_true, lambda t: t.tanh(), (x,))


def _combined_pred(x):
    flag = (x.abs().amax() > 0.5) & (x.sum() > 0)
    return torch.cond(flag, lambda t: (t * t).sum(0) + t.sum(0), lambda t: t.sum(0) * 2, (x,))


CASES = {f.__name__.strip("_"): f for f in (_data_pred, _closure_over_weight, _parameter_in_branch,
                                             _tuple_results, _nested, _combined_pred)}
# inputs that take each branch (and, for the nested cond, each inner branch)
INPUTS = [torch.full((4, 5), 0.7), -torch.full((4, 5), 0.7), torch.full((4, 5), 0.1),
          torch.linspace(-1, 2, 20).reshape(4, 5)]


def _params() -> list[torch.Tensor]:
    return [W, *LIN.parameters()]


def _run(fn, x0: torch.Tensor) -> list[torch.Tensor | None]:
    x = x0.clone().requires_grad_()
    for p in _params():
        p.grad = None
    out = fn(x)
    out.sum().backward()
    return [out.detach(), x.grad] + [None if p.grad is None else p.grad.clone() for p in _params()]


def _dynamo_graphs(fn) -> int:
    counter = CountingBackend()
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=counter)
    for x in INPUTS:
        compiled(x.clone().requires_grad_())
    return counter.frame_count


# CI: every program under inductor (capture, AOT and lowering), each backend on data_pred; the
# eager backends' runs of the others are `-m slow` (torch's eager cond compiles each one itself)
@pytest.mark.ci_slice({"name": "data_pred", "backend": "inductor"})
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_both_branches_in_one_graph_match_eager(name: str, backend: str) -> None:
    fn = CASES[name]
    kiln.reset()
    counter = CountingBackend(lookup(backend))
    compiled = kiln.compile(fn, backend=counter, fullgraph=True)
    for x in INPUTS:
        got, want = _run(compiled, x), _run(fn, x)
        for a, b in zip(got, want):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    stats = kiln.stats()
    assert (counter.frame_count, stats["recompiles"], stats["graph_breaks"]) == (1, 0, 0)
    assert any(n.target is torch.ops.higher_order.cond for n in counter.graphs[0].graph.nodes)


@pytest.mark.parametrize("name", sorted(CASES))
def test_graph_counts_match_torch_compile(name: str) -> None:
    fn = CASES[name]
    counter = CountingBackend()
    kiln.reset()
    compiled = kiln.compile(fn, backend=counter)
    for x in INPUTS:
        compiled(x.clone().requires_grad_())
    assert counter.frame_count == _dynamo_graphs(fn) == 1


def test_a_python_bool_predicate_stays_specialized() -> None:
    def fn(x, flag: bool):
        return torch.cond(flag, lambda t: t.sin(), lambda t: t.cos(), (x,))

    counter = CountingBackend()
    kiln.reset()
    compiled = kiln.compile(fn, backend=counter)
    x = torch.randn(3)
    for flag in (True, False, True):
        torch.testing.assert_close(compiled(x, flag), fn(x, flag))
    graph_nodes = [n for g in counter.graphs for n in g.graph.nodes]
    assert counter.frame_count == 2 and not any(n.target is torch.ops.higher_order.cond for n in graph_nodes)


def test_branches_of_different_shapes_raise_as_torch_compile() -> None:
    def fn(x):
        return torch.cond(x.sum() > 0, lambda t: t.sum(0), lambda t: t * 2, (x,))

    x = torch.randn(3, 4)
    torch._dynamo.reset()
    with pytest.raises(Exception):
        torch.compile(fn, backend="eager")(x)
    kiln.reset()
    with pytest.raises(Exception):
        kiln.compile(fn, backend="eager")(x)
    kiln.reset()
    with pytest.raises(kiln.errors.GraphBreakError, match="different structures or tensor metadata"):
        kiln.compile(fn, backend="eager", fullgraph=True)(x)


def test_branches_of_different_dtypes_raise() -> None:
    def fn(x):
        return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: (t * 2).double(), (x,))

    x = torch.randn(3, 4)
    with pytest.raises(Exception):
        fn(x)
    kiln.reset()
    with pytest.raises(Exception):
        kiln.compile(fn, backend="eager")(x)


def test_a_branch_with_a_side_effect_is_not_a_graph() -> None:
    seen: list[int] = []

    def fn(x):
        def true_fn(t):
            seen.append(1)
            return t * 2
        return torch.cond(x.sum() > 0, true_fn, lambda t: t * 3, (x,))

    kiln.reset()
    with pytest.raises(kiln.errors.GraphBreakError, match="changes state outside"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.ones(3))


def test_a_branch_returning_its_input_raises_as_eager() -> None:
    def fn(x):
        return torch.cond(x.sum() > 0, lambda t: t, lambda t: t * 3, (x,))

    x = torch.ones(3)
    with pytest.raises(Exception) as eager_error:
        fn(x)
    kiln.reset()
    with pytest.raises(type(eager_error.value)):
        kiln.compile(fn, backend="aot_eager")(x)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_sizes_that_change_reuse_one_dynamic_graph(backend: str) -> None:
    def fn(x):
        return torch.cond(x.sum() > 0, lambda t: t[1:] * t.shape[0], lambda t: t[:-1].cos(), (x,))

    counter = CountingBackend(lookup(backend))
    kiln.reset()
    compiled = kiln.compile(fn, backend=counter)
    for n in (4, 6, 8, 9):
        for sign in (1, -1):
            x = sign * torch.rand(n) + sign * 0.1
            torch.testing.assert_close(compiled(x), fn(x))
    assert counter.frame_count == 2  # the first size, then one dynamic graph (torch.compile: the same)


def _while_doubling(x):
    return while_loop(lambda v: v.abs().sum() < 50, lambda v: (v * 2,), (x * 1.0 + 0.01,))[0] - 1


def _while_counter_and_closure(x):
    def body(i, v):
        return i + 1, v * 1.5 + W
    i, v = while_loop(lambda i, v: (v.abs().sum() < 100) & (i < 20), body, (torch.tensor(0), x))
    return v * i


def _while_in_a_cond(x):
    return torch.cond(x.sum() > 0, lambda t: while_loop(lambda v: v.sum() < 40, lambda v: (v + t.abs(),),
                                                        (t.abs() + 0.1,))[0],
                      lambda t: t * 2, (x,))


WHILE_CASES = {f.__name__.strip("_"): f for f in (_while_doubling, _while_counter_and_closure, _while_in_a_cond)}


@pytest.mark.ci_slice({"name": "while_doubling", "backend": "inductor"})  # as test_both_branches_...
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(WHILE_CASES))
def test_while_loop_on_data_is_one_graph_matching_eager(name: str, backend: str) -> None:
    # inputs that make the loop run 1 to several times (eager's gradient through zero iterations
    # is twice the identity's in torch 2.13: not compared)
    fn = WHILE_CASES[name]
    kiln.reset()
    counter = CountingBackend(lookup(backend))
    compiled = kiln.compile(fn, backend=counter, fullgraph=True)
    for x in (torch.full((4, 5), 0.7), torch.full((4, 5), 0.1), torch.linspace(-1, 2, 20).reshape(4, 5)):
        for a, b in zip(_run(compiled, x), _run(fn, x)):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    stats = kiln.stats()
    assert (counter.frame_count, stats["recompiles"], stats["graph_breaks"]) == (1, 0, 0)


@pytest.mark.parametrize("name", sorted(WHILE_CASES))
def test_while_loop_graph_counts_match_torch_compile(name: str) -> None:
    fn = WHILE_CASES[name]
    counter = CountingBackend()
    kiln.reset()
    compiled = kiln.compile(fn, backend=counter)
    for x in INPUTS:
        compiled(x.clone().requires_grad_())
    assert counter.frame_count == _dynamo_graphs(fn) == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_while_loop_with_zero_iterations_returns_copies(backend: str) -> None:
    fn = _while_doubling
    x = torch.full((4, 5), 10.0)
    kiln.reset()
    got = kiln.compile(fn, backend=backend, fullgraph=True)(x)
    torch.testing.assert_close(got, fn(x))
