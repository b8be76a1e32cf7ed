"""Activation checkpointing inside compiled code: `torch.utils.checkpoint.checkpoint` is traced.

The body goes into the one graph with its nodes tagged as a checkpointed region; every case is
compiled with the "eager", "aot_eager" and "inductor" backends and must give eager's outputs and
gradients (inputs and parameters), with torch._dynamo.explain's graph and break counts as the
oracle. A body that cannot be traced makes the whole call a graph break that runs eagerly (as
torch.compile does), still with eager's gradients.
"""
from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import kiln
from kiln.errors import GraphBreakError

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]

torch.manual_seed(0)
LIN1 = torch.nn.Linear(8, 8)
LIN2 = torch.nn.Linear(8, 8)
PARAMS = [*LIN1.parameters(), *LIN2.parameters()]


def _block(x, scale=1.0):
    return LIN2(torch.relu(LIN1(x)).sin() * scale)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, *, shift=0.0):
        return torch.tanh(self.fc(x)) + shift

    def half(self, x):
        return self.forward(x) * 0.5


BLOCK = Block()
PARAMS.extend(BLOCK.parameters())


def _save_mm(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.addmm.default else CheckpointPolicy.PREFER_RECOMPUTE


def _reentrant(x):
    return checkpoint(_block, x, use_reentrant=True).cos().sum()


def _non_reentrant(x):
    return checkpoint(_block, x, use_reentrant=False).cos().sum()


def _kwargs_and_rng_flags(x):
    out = checkpoint(_block, x, scale=3.0, use_reentrant=False, preserve_rng_state=False,
                     determinism_check="none", debug=False)
    return out.sum()


def _nested(x):
    inner = lambda t: checkpoint(_block, t, use_reentrant=False).tanh() * 2  # noqa: E731
    return checkpoint(inner, x, use_reentrant=False).pow(2).sum()


def _nested_reentrant(x):
    return checkpoint(lambda t: checkpoint(LIN1, t, use_reentrant=True).relu(), x, use_reentrant=True).sum()


def _two_regions(x):
    h = checkpoint(LIN1, x, use_reentrant=False)
    return checkpoint(LIN2, h.relu(), use_reentrant=False).exp().sum()


def _module_and_method(x):
    a = checkpoint(BLOCK, x, use_reentrant=False, shift=1.0)
    b = checkpoint(BLOCK.half, a, use_reentrant=True)
    return (a * b).sum()


def _closure(x):
    w = x.mean(0, keepdim=True)

    def body(t):
        return torch.sigmoid(t * w) + LIN1(t)
    return checkpoint(body, x, use_reentrant=False).sum()


def _tuple_output(x):
    a, b = checkpoint(lambda t: (LIN1(t).relu(), t * 2), x, use_reentrant=False)
    return a.sum() + b.sum()


def _sac_op_list(x):
    ctx = functools.partial(create_selective_checkpoint_contexts, [torch.ops.aten.addmm.default])
    return checkpoint(_block, x, use_reentrant=False, context_fn=ctx).cos().sum()


def _sac_policy_fn(x):
    ctx = functools.partial(create_selective_checkpoint_contexts, _save_mm)
    return checkpoint(_block, x, use_reentrant=False, context_fn=ctx).cos().sum()


def _sac_lambda_policy(x):
    ctx = functools.partial(create_selective_checkpoint_contexts,
                            lambda c, op, *a, **k: op == torch.ops.aten.addmm.default)
    return checkpoint(_block, x, use_reentrant=False, context_fn=ctx).cos().sum()


CASES = {f.__name__.strip("_"): f for f in (
    _reentrant, _non_reentrant, _kwargs_and_rng_flags, _nested, _nested_reentrant, _two_regions,
    _module_and_method, _closure, _tuple_output, _sac_op_list, _sac_policy_fn, _sac_lambda_policy)}


def _run(fn, x0: torch.Tensor) -> tuple[torch.Tensor, list]:
    x = x0.clone().requires_grad_()
    for p in PARAMS:
        p.grad = None
    out = fn(x)
    out.backward()
    return out.detach(), [x.grad] + [None if p.grad is None else p.grad.clone() for p in PARAMS]


def _assert_same(got, want) -> None:
    torch.testing.assert_close(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_outputs_and_gradients(name: str, backend: str) -> None:
    fn = CASES[name]
    x0 = torch.randn(4, 8)
    want = _run(fn, x0)
    kiln.reset()
    got = _run(kiln.compile(fn, backend=backend), x0)
    _assert_same(got, want)
    stats = kiln.stats()
    assert stats["graphs"] == 1 and stats["graph_breaks"] == 0, stats


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_graph_like_dynamo(name: str) -> None:
    import torch._dynamo

    fn = CASES[name]
    x = torch.randn(4, 8, requires_grad=True)
    torch._dynamo.reset()
    oracle = torch._dynamo.explain(fn)(x)
    kiln.reset()
    ours = kiln.explain(fn)(x)
    assert ours.graph_count == oracle.graph_count == 1
    assert ours.graph_break_count == oracle.graph_break_count == 0


def test_region_nodes_are_tagged_in_the_captured_graph() -> None:
    kiln.reset()
    graphs = kiln.explain(_nested)(torch.randn(4, 8, requires_grad=True)).graphs
    nodes = [n for n in graphs[0].graph.nodes if n.op in ("call_function", "call_method")]
    tagged = [n for n in nodes if "recompute" in n.meta]
    # the body (two linears, relu, sin, mul, tanh, mul) is tagged; pow and sum after it are not
    assert len(tagged) == 7 and all(n.meta["recompute"] is CheckpointPolicy.PREFER_RECOMPUTE for n in tagged)
    assert len({n.meta["ac_graph_id"] for n in tagged}) == 1  # the inner region takes the outer id
    assert [n.target for n in nodes if n not in tagged] == ["pow", "sum"]


def test_selective_policy_is_carried_to_aot() -> None:
    kiln.reset()
    graph = kiln.explain(_sac_policy_fn)(torch.randn(4, 8, requires_grad=True)).graphs[0]
    policies = {n.meta.get("checkpoint_policy") for n in graph.graph.nodes if "recompute" in n.meta}
    assert policies == {_save_mm}


def test_reentrant_without_an_input_that_requires_grad_gives_no_gradient() -> None:
    # eager: the autograd.Function's output does not require grad, so LIN1 gets no gradient
    def fn(x):
        return checkpoint(LIN1, x.detach(), use_reentrant=True).sum() + x.sum()

    x0 = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad"):
        want = _run(fn, x0)
    kiln.reset()
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad"):
        got = _run(kiln.compile(fn, backend="aot_eager"), x0)
    _assert_same(got, want)
    assert got[1][1] is None  # LIN1.weight


def _with_print(x):
    def body(t):
        print("inside the checkpoint")
        return LIN1(t).relu()
    return checkpoint(body, x, use_reentrant=False).sum()


def _with_item(x):
    return checkpoint(lambda t: LIN1(t) * t.sum().item(), x, use_reentrant=False).sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", [_with_print, _with_item], ids=["print", "item"])
def test_untraceable_body_breaks_on_the_whole_call_and_runs_eagerly(fn, backend: str, capsys) -> None:
    x0 = torch.randn(4, 8)
    want = _run(fn, x0)
    capsys.readouterr()
    kiln.reset()
    got = _run(kiln.compile(fn, backend=backend), x0)
    _assert_same(got, want)
    if fn is _with_print:
        assert capsys.readouterr().out.count("inside the checkpoint") == 2  # forward and recompute, as eager
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        explained = kiln.explain(fn)(x0.clone().requires_grad_())
    reasons = [b.reason for b in explained.break_reasons]
    assert reasons and all(r.startswith("checkpointed function cannot be traced") for r in reasons), reasons
    assert all(b.lineno == fn.__code__.co_firstlineno + (4 if fn is _with_print else 1)
               for b in explained.break_reasons)


def test_untraceable_body_under_fullgraph_names_the_checkpoint() -> None:
    kiln.reset()
    with pytest.raises(GraphBreakError, match="checkpointed function cannot be traced"):
        kiln.compile(_with_item, backend="eager", fullgraph=True)(torch.randn(4, 8, requires_grad=True))


def test_exception_in_the_body_reaches_the_callers_handler() -> None:
    def fn(x):
        try:
            return checkpoint(lambda t: t[10], x, use_reentrant=False)
        except IndexError:
            return x * 2

    x = torch.randn(4, 8, requires_grad=True)
    kiln.reset()
    torch.testing.assert_close(kiln.compile(fn, backend="aot_eager")(x), x * 2)


def test_reentrant_keyword_arguments_raise_as_eager() -> None:
    def fn(x):
        return checkpoint(_block, x, scale=2.0, use_reentrant=True)

    kiln.reset()
    with pytest.raises(ValueError, match="Unexpected keyword arguments"):
        kiln.compile(fn, backend="eager")(torch.randn(4, 8, requires_grad=True))


def test_custom_context_fn_runs_eagerly() -> None:
    # a context_fn that is not selective checkpointing cannot be honoured inside a graph
    def contexts():
        return torch.autograd.graph.save_on_cpu(), torch.autograd.graph.save_on_cpu()

    def fn(x):
        return checkpoint(_block, x, use_reentrant=False, context_fn=contexts).sum()

    x0 = torch.randn(4, 8)
    want = _run(fn, x0)
    kiln.reset()
    _assert_same(_run(kiln.compile(fn, backend="aot_eager"), x0), want)
    assert kiln.stats()["graph_breaks"] >= 1


def test_dropout_in_a_region_gives_eagers_values_and_gradients() -> None:
    # eager's checkpoint replays the RNG, so the recomputed mask is the forward's; Kiln saves the mask
    w = torch.randn(64, requires_grad=True)

    def fn(x):
        return checkpoint(lambda t: F.dropout(t * w, p=0.5, training=True).sin(), x, use_reentrant=False).sum()

    x0 = torch.randn(8, 64)
    results = []
    for compiled in (fn, kiln.compile(fn, backend="aot_eager")):
        kiln.reset()
        x = x0.clone().requires_grad_()
        w.grad = None
        torch.manual_seed(3)
        out = compiled(x)
        out.backward()
        results.append((out.detach(), x.grad, w.grad.clone()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


@pytest.mark.cpp
def test_dropout_mask_of_the_compiled_backward_is_the_forwards() -> None:
    # the inductor draws its own random numbers (as torch.compile's does); the backward must use
    # the mask the forward drew: d out / d x = mask / (1 - p) * 3 * w
    w = torch.randn(64, requires_grad=True)

    def fn(x):
        return checkpoint(lambda t: F.dropout(t * w, p=0.5, training=True) * 3, x, use_reentrant=False)

    x = torch.randn(8, 64, requires_grad=True)
    kiln.reset()
    y = kiln.compile(fn, backend="inductor")(x)
    y.sum().backward()
    mask = (y != 0).to(y.dtype)
    assert 0.2 < mask.mean().item() < 0.8
    torch.testing.assert_close(x.grad, mask * 2 * 3 * w.detach())


def test_missing_use_reentrant_warns_and_is_reentrant() -> None:
    def fn(x):
        return checkpoint(_block, x).sum()

    x0 = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="use_reentrant"):
        want = _run(fn, x0)
    kiln.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _run(kiln.compile(fn, backend="aot_eager"), x0)
    assert any("use_reentrant" in str(w.message) and w.filename == __file__ for w in caught)
    _assert_same(got, want)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)])
def test_dynamic_sizes_in_regions(backend: str) -> None:
    def fn(x):
        h = checkpoint(lambda t: torch.relu(LIN1(t)) * t.shape[0], x, use_reentrant=False)
        return checkpoint(lambda t: t.sin().cumsum(0), h, use_reentrant=False).sum()

    kiln.reset()
    compiled = kiln.compile(fn, backend=backend, dynamic=True)
    for n in (4, 6, 9):
        x0 = torch.randn(n, 8)
        _assert_same(_run(compiled, x0), _run(fn, x0))
    assert kiln.stats()["recompiles"] == 0
