"""Control-flow operators inside compiled code: cond, while_loop, map, scan and associative_scan.

Each case runs with fullgraph=True under the "eager", "aot_eager" and "inductor" backends and must
give eager's outputs and gradients; torch._dynamo.explain's counts are the oracle. A predicate that
depends on tensor data is a graph-level cond or while_loop (tests/capture/test_graph_cond.py); a
while_loop that also carries a number is a graph break that runs eagerly: that case checks eager's
values and the break's reason instead.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch._higher_order_ops import associative_scan, cond, map as hop_map, scan, while_loop

import kiln
from kiln.errors import GraphBreakError

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]
W = torch.randn(5, requires_grad=True)


def _add(a, b):
    return a + b


def _linear_recurrence(left, right):
    (a_l, b_l), (a_r, b_r) = left, right
    return a_l * a_r, a_r * b_l + b_r


def _assoc_sum(x):
    return associative_scan(_add, x, dim=1, combine_mode="generic").sin()


def _assoc_tuple_reverse(x):
    return associative_scan(_linear_recurrence, (x.sigmoid(), x.cos()), dim=0, reverse=True,
                            combine_mode="generic")[1]


def _assoc_closure(x):
    return associative_scan(lambda a, b: torch.maximum(a, b) * W, x * 1.0, dim=0, combine_mode="generic")


def _assoc_matmul(x):  # not elementwise: one combine call per element
    mats = x.reshape(4, 5, 1) * x.reshape(4, 1, 5) * 0.2
    return associative_scan(lambda a, b: a @ b, mats, dim=0, combine_mode="generic").sum(-1)


def _scan_sum(x):
    carry, ys = scan(lambda c, xi: (c * 0.5 + xi, (c * xi).sin()), torch.zeros(5), x)
    return carry * 2 + ys.sum(0)


def _scan_dim_reverse_tree(x):
    def step(c, xs):
        return {"s": c["s"] + xs[0] * W[:4]}, (xs[1] * 2, c["s"].clone())
    carry, (ys1, ys2) = scan(step, {"s": torch.zeros(4)}, (x, x.exp()), dim=1, reverse=True)
    return carry["s"].sum() + ys1 + ys2.sum()


def _while_counter(x):
    return while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2 + W), (torch.tensor(0), x))[1]


def _while_int_carry(x):
    return while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, v.sin()), (0, x))[1]


def _while_zero_iterations(x):
    return while_loop(lambda i, v: i > 5, lambda i, v: (i + 1, v * 2), (torch.tensor(0), x))[1] + 1


def _map_with_args(x):
    return hop_map(lambda row, s: row * s + W, x, torch.tensor(2.0))


def _map_tree(x):
    out = hop_map(lambda d: {"o": d["a"].sin(), "p": (d["a"] * d["b"],)}, {"a": x, "b": x.cos()})
    return out["o"] + out["p"][0]


def _cond_python_bool(x):
    return cond(x.shape[0] > 2, lambda t: t.sin(), lambda t: t.cos(), (x,)) * 2


def _torch_cond_constant(x):
    return torch.cond(False, lambda t, u: t.sin() + u, lambda t, u: t.cos() - u, (x, W)) + 1


CASES = {f.__name__.strip("_"): f for f in (
    _assoc_sum, _assoc_tuple_reverse, _assoc_closure, _assoc_matmul, _scan_sum, _scan_dim_reverse_tree,
    _while_counter, _map_with_args, _map_tree, _cond_python_bool, _torch_cond_constant)}
# Compared on values only: eager's while_loop refuses an int carry when a tensor requires grad, and
# its gradient through zero iterations is 2 where the identity's is 1 (torch 2.13)
VALUE_CASES = {f.__name__.strip("_"): f for f in (_while_int_carry, _while_zero_iterations)}


def _run(fn, x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    x = x0.clone().requires_grad_()
    W.grad = None
    out = fn(x)
    out.sum().backward()
    return out.detach(), x.grad, None if W.grad is None else W.grad.clone()


# CI: every program under inductor (capture, AOT and lowering), each backend on scan_sum; the rest `-m slow`
@pytest.mark.ci_slice({"name": "scan_sum", "backend": "inductor"})
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_in_one_graph(name: str, backend: str) -> None:
    fn = CASES[name]
    x0 = torch.randn(4, 5)
    want = _run(fn, x0)
    kiln.reset()
    got = _run(kiln.compile(fn, backend=backend, fullgraph=True), x0)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert kiln.stats()["graphs"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(VALUE_CASES))
def test_values_match_eager_in_one_graph(name: str, backend: str) -> None:
    fn = VALUE_CASES[name]
    x = torch.randn(4, 5)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(fn, backend=backend, fullgraph=True)(x), fn(x))
    assert kiln.stats()["graphs"] == 1


@pytest.mark.parametrize("name", sorted({**CASES, **VALUE_CASES}))
def test_graph_counts_match_dynamo(name: str) -> None:
    import torch._dynamo

    fn = {**CASES, **VALUE_CASES}[name]
    x = torch.randn(4, 5, requires_grad=name in CASES)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oracle = torch._dynamo.explain(fn)(x)
    kiln.reset()
    ours = kiln.explain(fn)(x)
    assert (ours.graph_count, ours.graph_break_count) == (oracle.graph_count, oracle.graph_break_count) == (1, 0)


@pytest.mark.parametrize("name", ["assoc_sum", "assoc_tuple_reverse", "scan_sum", "map_with_args"])
def test_aot_eager_is_bit_exact(name: str) -> None:
    # the same ops in the same order as eager's implementation (for associative_scan, the combine
    # on batches of elements, as eager's vmap runs it)
    fn = CASES[name]
    x0 = torch.randn(4, 5)
    kiln.reset()
    assert torch.equal(kiln.compile(fn, backend="aot_eager", fullgraph=True)(x0), fn(x0))


def _combine_calls(fn, x: torch.Tensor) -> int:
    kiln.reset()
    graph = kiln.explain(fn)(x).graphs[0]
    return sum(1 for n in graph.graph.nodes if n.target in (torch.maximum, "maximum"))


def test_elementwise_combine_runs_on_batches() -> None:
    # eager's rounds: log2(n) calls going down and as many coming back, whatever the length
    fn = lambda x: associative_scan(torch.maximum, x, dim=0, combine_mode="generic")  # noqa: E731
    assert _combine_calls(fn, torch.randn(64, 3)) <= 2 * 6
    out = kiln.compile(fn, backend="aot_eager")(x := torch.randn(37, 3))
    torch.testing.assert_close(out, torch.cummax(x, 0).values)


def test_combine_reading_a_size_runs_per_element() -> None:
    # a combine that reads its argument's leading size is not elementwise: under eager's vmap it
    # sees the element's size, so Kiln calls it once per element
    def fn(x):
        return associative_scan(lambda a, b: a + b * a.shape[0], x, dim=0, combine_mode="generic")

    x = torch.randn(6, 3)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(fn, backend="aot_eager", fullgraph=True)(x), fn(x))


def _while_on_data(x):
    return while_loop(lambda v: v.sum() < 50, lambda v: (v * 2,), (x.abs() + 0.5,))[0] - 1


def _while_int_carry_on_data(x):
    return while_loop(lambda i, v: v.sum() < 50, lambda i, v: (i + 1, v * 2), (0, x.abs() + 0.5))[1] - 1


def test_data_dependent_predicate_with_a_number_carry_breaks_and_runs_eagerly() -> None:
    # a graph-level while_loop carries tensors only (tests/capture/test_graph_cond.py)
    fn = _while_int_carry_on_data
    x0 = torch.randn(4, 5)
    for sign in (1, -1):
        kiln.reset()
        torch.testing.assert_close(kiln.compile(fn, backend="aot_eager")(sign * x0), fn(sign * x0))
    kiln.reset()
    reasons = [b.reason for b in kiln.explain(fn)(x0).break_reasons]
    assert reasons and all("predicate depends on tensor data" in r for r in reasons), reasons
    kiln.reset()
    with pytest.raises(GraphBreakError, match="predicate depends on tensor data"):
        kiln.compile(fn, backend="eager", fullgraph=True)(x0)


@pytest.mark.parametrize("fn", [
    lambda x: scan(lambda c, xi: (c + xi, c), torch.zeros(5), x),
    lambda x: hop_map(lambda r: r[1:], x),
    lambda x: while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, v), (torch.tensor(0), x)),
    lambda x: cond(torch.tensor(True), lambda t: t.add_(1), lambda t: t * 2, (x.clone(),)),
], ids=["scan_alias", "map_view", "while_alias", "cond_mutation"])
def test_bodies_eager_rejects_still_raise(fn) -> None:
    x = torch.randn(4, 5)
    with pytest.raises(Exception) as eager_error:
        fn(x)
    kiln.reset()
    with pytest.raises(type(eager_error.value)):
        kiln.compile(fn, backend="eager")(x)


def test_associative_scan_pointwise_mode_raises_as_eager_on_cpu() -> None:
    fn = lambda x: associative_scan(_add, x, dim=0)  # noqa: E731
    kiln.reset()
    with pytest.raises(ValueError, match="CUDA or XPU"):
        kiln.compile(fn, backend="eager")(torch.randn(3, 2))


def test_dynamic_length_is_specialized_and_guarded() -> None:
    fn = lambda x: scan(lambda c, xi: (c + xi, c * xi), torch.zeros(2), x)[1]  # noqa: E731
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager", dynamic=True)
    for n in (3, 5, 3):
        x = torch.randn(n, 2)
        torch.testing.assert_close(compiled(x), fn(x))
    assert kiln.stats()["recompiles"] == 1


@pytest.mark.parametrize("training", [False, True])
def test_mamba_uses_associative_scan_in_one_graph(training: bool) -> None:
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.MambaConfig(vocab_size=99, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
                            conv_kernel=4, use_mambapy=False, use_associative_scan=True)
    model = tf.MambaForCausalLM(config).train(training)
    ids = torch.randint(1, 99, (2, 8), generator=torch.Generator().manual_seed(1))

    def step(call):
        model.zero_grad()
        if not training:
            with torch.no_grad():
                return call(ids, use_cache=False).logits, {}
        loss = call(ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want = step(model)
    kiln.reset()
    got = step(kiln.compile(model, backend="aot_eager"))
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert kiln.stats()["graphs"] == 1 and kiln.stats()["graph_breaks"] == 0


def test_comparison_of_a_counter_made_in_the_frame_is_known() -> None:
    # what lets while_loop's cond_fn be decided: `i < 3` on a tensor counter the frame made is
    # folded; the same test on a tensor passed in stays an op (a break where it is branched on)
    def counter(x):
        i = torch.tensor(0)
        while i < 3:
            x = x * 2
            i = i + 1
        return x

    def passed_in(x, n):
        return x * 2 if n < 3 else x

    kiln.reset()
    assert kiln.explain(counter)(torch.ones(2)).graph_break_count == 0
    torch.testing.assert_close(kiln.compile(counter, backend="eager")(torch.ones(2)), counter(torch.ones(2)))
    kiln.reset()
    assert kiln.explain(passed_in)(torch.ones(2), torch.tensor(1)).graph_break_count == 1
