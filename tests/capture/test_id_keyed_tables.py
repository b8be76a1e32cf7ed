"""Tables built outside the compiled code and keyed by `id()` of a parameter, a buffer or a global
tensor (`scales[id(p)]`, per-parameter learning rates, an EMA's shadow table): the trace reads the
number the table holds, guarding that the same tensor object is still there (Dynamo's ID_MATCH).
Before: every lookup was a graph break ("dict key id() of tensor ... is not a constant"): 5 graphs
for a two-layer model where Dynamo makes 1.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from eager_compare import dynamo_graphs

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))


def _scaled_sum(m, table):
    def f(x):
        tot = 0
        for p in m.parameters():
            tot = tot + p.sum() * table[id(p)]
        return x * tot
    return f


def _named_lookup(m, table):
    def f(x):
        return sum(x * p.mean() * table.get(id(p), -1.0) for _, p in m.named_parameters())
    return f


def _buffers(m, table):
    def f(x):
        return x + sum(b.float().sum() * table[id(b)] for b in m.buffers())
    return f


def _membership(m, table):
    def f(x):
        return torch.stack([x.sum() * (2.0 if id(p) in table else 0.5) for p in m.parameters()])
    return f


def _ema_shadow(m, table):
    shadow = {id(p): p.detach().clone() for p in m.parameters()}

    def f(x):
        with torch.no_grad():
            for p in m.parameters():
                shadow[id(p)].mul_(0.9).add_(p, alpha=0.1)
        return x * shadow[id(m[0].weight)].sum()
    return f


def _table(m, every=1):
    return {id(p): float(i + 1) for i, p in enumerate(list(m.parameters()) + list(m.buffers())) if i % every == 0}


PROGRAMS = {"scaled_sum": (_scaled_sum, 1), "named_get": (_named_lookup, 2), "buffers": (_buffers, 1),
            "membership": (_membership, 2), "ema_shadow": (_ema_shadow, 1)}


def _dynamo_graphs(name) -> int:
    make, every = PROGRAMS[name]
    m = _model()
    return dynamo_graphs(make(m, _table(m, every)), lambda compiled: compiled(torch.ones(3)))


@pytest.mark.ci_slice({"name": "scaled_sum", "backend": "inductor"})
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_table_keyed_by_id_is_read_in_one_graph(name, backend) -> None:
    make, every = PROGRAMS[name]
    m, ref = _model(), _model()
    got_f, want_f = make(m, _table(m, every)), make(ref, _table(ref, every))
    kiln.reset()
    compiled = kiln.compile(got_f, backend=backend)
    for _ in range(2):  # ema_shadow changes its table: the second call reads what the first wrote
        torch.testing.assert_close(compiled(torch.ones(3)), want_f(torch.ones(3)))
    assert kiln.stats()["graph_breaks"] == 0
    assert kiln.stats()["graphs"] == _dynamo_graphs(name) == 1


def test_a_replaced_parameter_recompiles_and_misses_as_eager_does() -> None:
    m = _model()
    table = _table(m)
    f = _scaled_sum(m, table)
    kiln.reset()
    compiled = kiln.compile(f)
    torch.testing.assert_close(compiled(torch.ones(3)), f(torch.ones(3)))
    m[0].weight = torch.nn.Parameter(torch.randn(3, 3))  # not in the table: eager's KeyError
    with pytest.raises(KeyError):
        f(torch.ones(3))
    with pytest.raises(KeyError):
        compiled(torch.ones(3))
    table[id(m[0].weight)] = 5.0
    torch.testing.assert_close(compiled(torch.ones(3)), f(torch.ones(3)))
    assert kiln.stats()["recompiles"] >= 1


def test_the_guard_does_not_keep_a_dropped_model_alive() -> None:
    import gc
    import weakref

    m = _model()
    f = _scaled_sum(m, _table(m))
    kiln.reset()
    kiln.compile(f)(torch.ones(3))
    ref = weakref.ref(m[0].weight)
    del f, m
    gc.collect()
    assert ref() is None


def test_an_arguments_id_stays_a_break_not_a_guard_on_each_new_tensor() -> None:
    """A tensor passed in is a new object on every call: keying by its id() is not pinned (a guard on
    it would recompile per call); a dict made in the frame with it still gives eager's value."""
    def g(x):
        d = {id(x): 2.0}
        return x * d[id(x)]

    kiln.reset()
    compiled = kiln.compile(g)
    for _ in range(3):
        x = torch.ones(2)
        torch.testing.assert_close(compiled(x), g(x))
    assert kiln.stats()["recompiles"] == 0
