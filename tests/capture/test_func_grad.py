"""torch.func.grad / grad_and_value inside a compiled function: one graph (as torch.compile), eager's
values, gradients through them, and eager's errors.

Before, the call could not be traced and the whole frame ran eagerly (0 graphs where torch.compile
makes 1).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.func import functional_call

import kiln
from eager_compare import dynamo_graphs, grads_match_eager, one_graph_eager_values, under_grad_mode

BACKENDS = ["inductor", "aot_eager", "eager"]


def _simple(x, w):
    return torch.func.grad(lambda y: (y.sin() ** 2).sum())(x) * 2 + w


def _argnums_aux_value(x, w):
    fn = torch.func.grad_and_value(lambda a, b: ((a * b).sin().sum(), (a * 2,)), argnums=(0, 1), has_aux=True)
    (ga, gb), (value, aux) = fn(x * 2, w)
    return ga * 3 + gb.sum(), value, aux[0]


def _nested(x, w):
    return torch.func.grad(lambda a: torch.func.grad(lambda b: (b ** 3).sum())(a).sum())(x) + w


def _closure_and_dict_argument(x, w):
    def loss(params):
        return ((x @ params["w"].unsqueeze(-1)).tanh() * params["s"]).sum()
    g = torch.func.grad(loss)({"w": w, "s": x.mean()})
    return g["w"], g["s"]


def _negative_argnum(x, w):
    return torch.func.grad(lambda a, b: (a * b).pow(2).sum(), argnums=-1)(x, w)


def _per_sample_grads(x, w):
    def loss(weight, row):
        return (row @ weight).tanh().pow(2).sum()
    return torch.vmap(torch.func.grad(loss), in_dims=(None, 0))(w.unsqueeze(-1).expand(3, 2).contiguous(), x)


FUNCS = [_simple, _argnums_aux_value, _nested, _closure_and_dict_argument, _negative_argnum, _per_sample_grads]


def _args(requires_grad=False):
    torch.manual_seed(0)
    return torch.randn(4, 3, requires_grad=requires_grad), torch.randn(3, requires_grad=requires_grad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", FUNCS, ids=lambda f: f.__name__)
def test_one_graph_eager_values(fn, backend):
    one_graph_eager_values(fn, backend, *_args())


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize("fn", [_simple, _argnums_aux_value, _nested, _closure_and_dict_argument],
                         ids=lambda f: f.__name__)
def test_backward_through_the_gradient(fn, backend):
    kiln.reset()
    grads_match_eager(fn, backend, *_args(requires_grad=True))


def test_module_parameters_through_functional_call():
    kiln.reset()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 1))
    params = {k: v.detach() for k, v in net.named_parameters()}

    def f(params, x):
        return torch.func.grad(lambda p: functional_call(net, p, (x,)).sum())(params)

    x = torch.randn(5, 3)
    got, expected = kiln.compile(f)(params, x), f(params, x)
    assert got.keys() == expected.keys()
    for k in got:
        torch.testing.assert_close(got[k], expected[k])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["not_scalar", "argnum_out_of_range", "aux_not_pair", "int_argument"])
def test_eager_errors(case, backend):
    kiln.reset()

    def f(x, w):
        if case == "not_scalar":
            return torch.func.grad(lambda a: a * 2)(x)
        if case == "argnum_out_of_range":
            return torch.func.grad(lambda a: a.sum(), argnums=3)(x)
        if case == "aux_not_pair":
            return torch.func.grad(lambda a: a.sum(), has_aux=True)(x)
        return torch.func.grad(lambda a: a.float().sum())(x.long())

    x, w = _args()
    with pytest.raises(Exception) as expected:
        f(x, w)
    with pytest.raises(type(expected.value)):
        kiln.compile(f, backend=backend)(x, w)


def test_argument_passed_twice_runs_as_eager():
    kiln.reset()

    def f(x):
        return torch.func.grad(lambda a, b: (a * b).sum(), argnums=(0, 1))(x, x)

    x = torch.randn(3)
    got, expected = kiln.compile(f)(x), f(x)
    torch.testing.assert_close(got, expected)


def _per_sample_grads_through_functional_call():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    params = {k: v.detach() for k, v in net.named_parameters()}
    buffers = {k: v.detach() for k, v in net.named_buffers()}

    def loss_fn(params, buffers, x, y):
        out = functional_call(net, (params, buffers), (x.unsqueeze(0),))
        return ((out - y) ** 2).mean()

    def per_sample(params, buffers, x, y):
        return torch.vmap(torch.func.grad(loss_fn), in_dims=(None, None, 0, 0))(params, buffers, x, y)

    return per_sample, params, buffers


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_sample_grads_through_functional_call(backend):
    # functional_call's swap of the module's parameters, undone inside both bodies, is no change
    per_sample, params, buffers = _per_sample_grads_through_functional_call()
    x, y = torch.randn(5, 3), torch.randn(5, 1)
    one_graph_eager_values(per_sample, backend, params, buffers, x, y)
    assert dynamo_graphs(per_sample, lambda compiled: compiled(params, buffers, x, y)) == 1


def _jacrev(x, w):
    return torch.func.jacrev(lambda a: (a * w).sin())(x[0] * 2)


def _jacfwd_argnums(x, w):
    return torch.func.jacfwd(lambda a, b: (a * b).cos(), argnums=(0, 1))(x[1], w)


def _hessian(x, w):
    return torch.func.hessian(lambda a: (a * w).sin().sum())(x[0]) + 1


def _vjp(x, w):
    out, pullback = torch.func.vjp(lambda a: (a * w).sin(), x)
    return out, pullback(torch.ones_like(out))[0]


def _jvp(x, w):
    return torch.func.jvp(lambda a: (a * w).sin(), (x,), (torch.ones_like(x),))


def _linearize(x, w):
    out, push = torch.func.linearize(lambda a: (a * w).exp(), x)
    return out, push(torch.ones_like(x)), push(x)


_jacobian_made_at_import = torch.func.jacrev(lambda a: a.tanh() * 3)


def _transform_made_at_import(x, w):
    return _jacobian_made_at_import(x[0] + w)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_jacrev, _jacfwd_argnums, _hessian, _vjp, _jvp, _linearize, _transform_made_at_import],
                         ids=lambda f: f.__name__)
def test_other_transforms_run_natively_with_eager_values(fn, backend):
    # jacrev, jacfwd, hessian, vjp, jvp, linearize run at a graph break, the code around them compiled
    # (torch.compile traces all but linearize into one graph): no fallback of the frame. Inlined, jvp
    # and linearize raised where eager returns, the others made the whole frame run eagerly.
    kiln.reset()
    x, w = _args()
    torch.testing.assert_close(kiln.compile(fn, backend=backend)(x, w), fn(x, w))
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["graphs"] >= 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "enable_grad_in_no_grad"])
def test_under_an_outer_grad_mode(mode, backend):
    def f(x, w):
        def differentiated():
            return torch.func.grad(lambda a: (a * w).sin().sum())(x) * 2
        return under_grad_mode(mode, differentiated)

    kiln.reset()
    x, w = _args(requires_grad=True)
    # an inference tensor leaving the frame: the block runs at a break, as for any op
    got, want = kiln.compile(f, backend=backend, fullgraph=mode != "inference_mode")(x, w), f(x, w)
    torch.testing.assert_close(got, want)
    assert got.requires_grad == want.requires_grad and got.is_inference() == want.is_inference()
    assert mode == "inference_mode" or kiln.stats()["graphs"] == 1 and kiln.stats()["fallbacks"] == 0


def _fp16_aux(x, w):
    return torch.func.grad_and_value(lambda a: ((a @ w.half()).sum(), a.half()), has_aux=True)(x.half())


def _writes_a_copy(x, w):
    def loss(a):
        b = a * 1
        b.mul_(w)
        return b.sum()
    return torch.func.grad(loss)(x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_fp16_aux, _writes_a_copy], ids=lambda f: f.__name__)
def test_more_one_graph_eager_values(fn, backend):
    one_graph_eager_values(fn, backend, *_args())
    assert dynamo_graphs(fn, lambda compiled: compiled(*_args())) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16(backend):
    def f(x, w):
        return torch.func.grad(lambda a: (a * w.bfloat16()).tanh().sum())(x.bfloat16())

    kiln.reset()
    x, w = _args()
    got = kiln.compile(f, backend=backend, fullgraph=True)(x, w)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, f(x, w), atol=2e-2, rtol=3e-2)  # inductor computes in float32 inside
    assert kiln.stats()["graphs"] == 1


def test_body_writing_its_argument_raises_as_eager():
    kiln.reset()

    def f(x):
        def loss(a):
            a.mul_(2)
            return a.sum()
        return torch.func.grad(loss)(x)

    x = torch.randn(3)
    with pytest.raises(RuntimeError) as expected:
        f(x.clone())
    with pytest.raises(RuntimeError) as got:
        kiln.compile(f)(x.clone())
    assert str(got.value) == str(expected.value)
