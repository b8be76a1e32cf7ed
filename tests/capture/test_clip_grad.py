"""Gradient clipping and the multi-tensor plumbing under it, in one graph as torch.compile makes it.

`torch.nn.utils.clip_grad_norm_` groups its gradients with `torch._C._group_tensors_by_device_and_dtype`
(a C function: a graph break before, 2 graphs where Dynamo makes 1) and asks
`isinstance(parameters, types.GeneratorType)` of `module.parameters()` (a restart: "type() of
iterator is not known"). Capture answers both at trace time: the grouping from the tensors' device
and dtype (guarded with the tensors), in the order the real function gives; the generator type of
nn.Module's own parameters()/buffers()/children()... .
"""
from __future__ import annotations

import types

import pytest
import torch

import kiln
from eager_compare import dynamo_graphs

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]


def _model(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3)).to(dtype)


def _mixed_model() -> torch.nn.Module:
    m = _model()
    m[2].double()  # two dtypes: two groups
    return m


def _with_grads(m: torch.nn.Module) -> torch.nn.Module:
    x = torch.randn(5, 4, dtype=m[0].weight.dtype)
    h = m[1](m[0](x))
    m[2](h.to(m[2].weight.dtype)).sum().backward()
    return m


def _clip_norm(foreach):
    def f(m):
        return torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5, foreach=foreach)
    return f


def _clip_norm_inf(m):
    return torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1, norm_type=float("inf"))


def _clip_value(m):
    torch.nn.utils.clip_grad_value_(m.parameters(), 0.05)
    return m[0].weight.grad.sum()


def _get_total_norm(m):
    grads = [p.grad for p in m.parameters()]
    return torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)


def _train_step(m):
    out = m(torch.ones(3, 4)).square().mean()
    out.backward()
    norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    with torch.no_grad():
        for p in m.parameters():
            p -= 0.1 * p.grad
    return norm


PROGRAMS = {
    "norm_foreach": (_clip_norm(True), _model),
    "norm_loop": (_clip_norm(False), _model),
    "norm_default": (_clip_norm(None), _model),
    "norm_two_dtypes": (_clip_norm(True), _mixed_model),
    "norm_two_dtypes_loop": (_clip_norm(False), _mixed_model),
    "norm_inf": (_clip_norm_inf, _model),
    "value": (_clip_value, _model),
    "total_norm": (_get_total_norm, _mixed_model),
    "train_step": (_train_step, _model),
}


def _run(fn, make, compiled):
    m = make()
    if fn is not _train_step:
        _with_grads(m)
    out = (compiled or fn)(m)
    return out, [p.detach().clone() for p in m.parameters()], [None if p.grad is None else p.grad.clone()
                                                             for p in m.parameters()]


@pytest.mark.ci_slice({"name": "norm_two_dtypes", "backend": "inductor"})
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_clipping_is_one_graph_with_eagers_values(name, backend) -> None:
    fn, make = PROGRAMS[name]
    kiln.reset()
    got = _run(fn, make, kiln.compile(fn, backend=backend))
    want = _run(fn, make, None)
    torch.testing.assert_close(got, want)
    # the train step's backward() is a break in both (Dynamo: "Tensor.backward"); clipping is not
    dynamo = dynamo_graphs(fn, lambda compiled: _run(fn, make, compiled))
    assert kiln.stats()["graphs"] == dynamo == (2 if name == "train_step" else 1)


def test_grouping_is_answered_at_trace_time_in_the_real_order() -> None:
    """The dict the trace builds has the real function's keys in its order, the same tensors in
    each group, and the indices asked for."""
    def f(a, b, c):
        groups = torch._C._group_tensors_by_device_and_dtype([[a, b, c], [c, None, a]], True)
        return [(key, [len(lst) for lst in lists], idx) for key, (lists, idx) in groups.items()], \
            [t.sum() for (lists, _) in groups.values() for t in lists[0]]

    args = (torch.ones(2), torch.ones(3, dtype=torch.float64), torch.ones(4))
    kiln.reset()
    got = kiln.compile(f, fullgraph=True)(*args)
    assert got[0] == f(*args)[0]
    torch.testing.assert_close(got[1], f(*args)[1])


def test_grouping_that_eager_refuses_raises_eagers_error() -> None:
    def f(a):
        return torch._C._group_tensors_by_device_and_dtype([[None, a]], False)

    kiln.reset()
    with pytest.raises(RuntimeError, match="supposed to be defined"):
        f(torch.ones(2))
    with pytest.raises(RuntimeError, match="supposed to be defined"):
        kiln.compile(f)(torch.ones(2))


@pytest.mark.parametrize("method", ["parameters", "named_parameters", "buffers", "children", "modules"])
def test_a_modules_own_iterators_are_generators(method) -> None:
    m = torch.nn.BatchNorm1d(3)

    def f(x):
        it = getattr(m, method)()
        return x + 1, isinstance(it, types.GeneratorType), type(it) is types.GeneratorType

    kiln.reset()
    assert kiln.compile(f, fullgraph=True)(torch.ones(2))[1:] == f(torch.ones(2))[1:] == (True, True)


def test_an_overridden_parameters_keeps_its_own_type() -> None:
    class M(torch.nn.Linear):
        def parameters(self, recurse=True):
            return [self.weight]

    m = M(2, 2)

    def f(x):
        return x + 1, isinstance(m.parameters(), types.GeneratorType)

    kiln.reset()
    assert kiln.compile(f)(torch.ones(2))[1] is False


def test_a_passed_tuple_iterator_knows_its_type() -> None:
    def f(it, x):
        return x + 1, type(it).__name__, isinstance(it, types.GeneratorType)

    kiln.reset()
    out = kiln.compile(f, fullgraph=True)(iter((1, 2)), torch.ones(2))
    assert out[1:] == ("tuple_iterator", False)

