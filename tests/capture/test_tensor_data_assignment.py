"""`t.data = v` and writes through `t.data` inside a compiled function (kiln/capture/attribute_access.py,
`_set_data`): on a parameter or a tensor from outside the frame, `set_` under no_grad in the graph, as
torch.compile records it; one graph where torch.compile makes one (the real torch.compile with a
counting backend is the oracle), with eager's effects: the parameter object kept (an optimizer still
holds it), its requires_grad kept, its value and shape changed, and eager's values and gradients.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo

import kiln
from kiln.backends import CountingBackend, lookup

BACKENDS = ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.cpp)]


def _fresh_value(lin, x):
    lin.weight.data = torch.full((3, 3), 0.5)
    return lin(x)


def _computed_from_input(lin, x):
    lin.weight.data = x[:3].t() * 2
    lin.bias.data = x[0] + 1
    return lin(x).relu()


def _clipped(lin, x):  # weight clipping: the parameter read only to make its new data
    lin.weight.data = lin.weight.data.clamp(-0.1, 0.1)
    return lin(x)


def _new_shape(lin, x):
    lin.weight.data = torch.ones(4, 3)
    lin.bias.data = torch.zeros(4)
    return lin(x) * 2


def _copy_through_data(lin, x):
    lin.weight.data.copy_(x[:3] * 0.5)
    lin.bias.data.mul_(2)
    return lin(x)


def _module_to_its_own_dtype(lin, x):  # transformers' `self.classifier = self.classifier.to(dtype)`
    lin = lin.to(torch.float32)           # Module._apply: `p.data = p.to(float32)`, which is p itself
    return lin(x) * 3


def _data_set_to_itself(lin, x):
    lin.weight.data = lin.weight
    lin.bias.data = lin.bias.to(torch.float32)
    return lin(x) - 1


CASES = {f.__name__.strip("_"): f for f in (_fresh_value, _computed_from_input, _clipped, _new_shape,
                                             _copy_through_data, _module_to_its_own_dtype, _data_set_to_itself)}


def _linear() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 3)


def _run(fn, lin: torch.nn.Linear, x: torch.Tensor) -> dict:
    params = list(lin.parameters())
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    out = fn(lin, x)
    out.sum().backward()
    opt.step()
    return {"out": out.detach(), "params": [p.detach().clone() for p in lin.parameters()],
            "same objects": [a is b for a, b in zip(params, lin.parameters())],
            "requires_grad": [p.requires_grad for p in lin.parameters()],
            "optimizer holds them": [a is b for a, b in zip(opt.param_groups[0]["params"], lin.parameters())],
            "momentum": [opt.state[p]["momentum_buffer"].clone() for p in lin.parameters()]}


def _same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        for g, w in zip(got[key], want[key]) if isinstance(want[key], list) else [(got[key], want[key])]:
            if isinstance(w, torch.Tensor):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=lambda m: f"{key}: {m}")
            else:
                assert g == w, key


def _dynamo_graphs(fn, x: torch.Tensor) -> int:
    counter = CountingBackend()
    torch._dynamo.reset()
    torch.compile(fn, backend=counter)(_linear(), x)
    return counter.frame_count


X = torch.randn(5, 3)


# CI: every program under inductor (capture, AOT, lowering), each backend on the first; the rest `-m slow`
@pytest.mark.ci_slice({"name": sorted(CASES)[0], "backend": "inductor"})
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_one_graph_with_eager_effects(name: str, backend: str) -> None:
    fn = CASES[name]
    want = _run(fn, _linear(), X)
    kiln.reset()
    counter = CountingBackend(lookup(backend))
    got = _run(kiln.compile(fn, backend=counter), _linear(), X)
    _same(got, want)
    assert (counter.frame_count, kiln.stats()["graph_breaks"]) == (1, 0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_graph_counts_match_torch_compile(name: str) -> None:
    fn = CASES[name]
    counter = CountingBackend()
    kiln.reset()
    kiln.compile(fn, backend=counter)(_linear(), X)
    assert counter.frame_count == _dynamo_graphs(fn, X) == 1


def test_a_second_call_sees_the_new_shape() -> None:
    lin = _linear()
    compiled = kiln.compile(_new_shape, backend="aot_eager")
    kiln.reset()
    first = compiled(lin, X)
    second = compiled(lin, X)  # the weight is (4, 3) now: its guard fails, a new graph
    torch.testing.assert_close(first, second)
    assert lin.weight.shape == (4, 3) and lin.bias.shape == (4,)


def test_a_tensor_made_in_the_frame_breaks_as_torch_compile() -> None:
    def fn(x):
        t = torch.zeros(3)
        t.data = x * 2
        return t + 1

    x = torch.randn(3)
    counter = CountingBackend()
    kiln.reset()
    torch.testing.assert_close(kiln.compile(fn, backend=counter)(x), fn(x))
    assert counter.frame_count == _dynamo_graphs(lambda lin, x: fn(x), x) == 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_another_dtype_runs_natively(backend: str) -> None:
    def fn(lin, x):
        lin.weight.data = lin.weight.data.double()
        return lin.weight.sum() + x.sum()

    lin = _linear()
    weight = lin.weight
    kiln.reset()
    want = fn(_linear(), X)
    got = kiln.compile(fn, backend=backend)(lin, X)
    assert lin.weight is weight and lin.weight.dtype == torch.float64
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_parameter_read_before_the_store_keeps_eager_grads(backend: str) -> None:
    # the first linear's gradient reaches the parameter whose data the store then replaces; eager
    # sends both linears' gradients to the one parameter
    def fn(lin, x):
        y = lin(x).sum()
        lin.weight.data = torch.ones(3, 3)
        return lin(x) + y

    want = _run(fn, _linear(), X)
    kiln.reset()
    _same(_run(kiln.compile(fn, backend=backend), _linear(), X), want)
