"""torch.vmap inside a compiled function: one graph (as torch.compile), eager's values, grads and errors.

Before, the call could not be traced (capture inlined torch.func's wrapper down to functorch's C
internals) and the whole frame ran eagerly: 0 graphs where torch.compile makes 1.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import kiln
from eager_compare import dynamo_graphs, grads_match_eager, one_graph_eager_values, under_grad_mode
from kiln.backends import CountingBackend

BACKENDS = ["inductor", "aot_eager", "eager"]


def _closure_tensor(x, w):
    return torch.vmap(lambda row: (row * w).sum().sin())(x)


def _in_dims_none(x, w):
    return torch.vmap(lambda a, b: a @ b, in_dims=(0, None))(x, w.expand(3, 3).contiguous())


def _in_dim_one_negative(x, w):
    return torch.vmap(lambda a, b: a * b + 1, in_dims=(1, -1))(x.t().contiguous(), w.unsqueeze(1).expand(3, 4))


def _out_dims_tuple(x, w):
    return torch.vmap(lambda a: (a.exp(), a.unsqueeze(0) * w), out_dims=(0, 1))(x)


def _nested(x, w):
    return torch.vmap(torch.vmap(lambda e: e * w.sum() + e ** 2))(x)


def _tuple_argument(x, w):
    return torch.vmap(lambda pair: pair[0] * pair[1], in_dims=((0, 0),))((x, x.flip(0)))


def _chunked(x, w):
    return torch.vmap(lambda row: row.softmax(-1) * w, chunk_size=2)(x)


def _keyword_unbatched(x, w):
    def body(row, scale=1.0):
        return row * scale
    return torch.vmap(body)(x, scale=w)


def _identity_and_outside(x, w):
    return torch.vmap(lambda row: (row, w), out_dims=(0, 0))(x)


@torch.vmap
def _made_at_import(row):
    return row.cumsum(-1) - row.mean()


def _global_wrapper(x, w):
    return _made_at_import(x) + w


FUNCS = [_closure_tensor, _in_dims_none, _in_dim_one_negative, _out_dims_tuple, _nested, _tuple_argument,
         _chunked, _keyword_unbatched, _identity_and_outside, _global_wrapper]


def _args(requires_grad=False):
    torch.manual_seed(0)
    return torch.randn(4, 3, requires_grad=requires_grad), torch.randn(3, requires_grad=requires_grad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", FUNCS, ids=lambda f: f.__name__)
def test_one_graph_eager_values(fn, backend):
    one_graph_eager_values(fn, backend, *_args())


@pytest.mark.parametrize("fn", [_closure_tensor, _out_dims_tuple, _nested, _global_wrapper], ids=lambda f: f.__name__)
def test_graph_count_matches_dynamo(fn):
    import torch._dynamo
    torch._dynamo.reset()
    counter = CountingBackend()
    x, w = _args()
    torch.compile(fn, backend=counter)(x, w)
    kiln.reset()
    kiln.compile(fn)(x, w)
    assert kiln.stats()["graphs"] == counter.frame_count == 1


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize("fn", [_closure_tensor, _in_dims_none, _out_dims_tuple, _nested, _chunked,
                                _keyword_unbatched, _global_wrapper], ids=lambda f: f.__name__)
def test_grads_match_eager(fn, backend):
    kiln.reset()
    grads_match_eager(fn, backend, *_args(requires_grad=True))


def test_module_mapped_with_parameter_grads():
    kiln.reset()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    ref = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    ref.load_state_dict(net.state_dict())

    def f(model, x):
        return torch.vmap(model)(x).sum(0)

    x = torch.randn(6, 3)
    out = kiln.compile(f, fullgraph=True)(net, x)
    out.sum().backward()
    f(ref, x).sum().backward()
    torch.testing.assert_close(out, f(ref, x))
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_dynamic_batch_sizes():
    kiln.reset()
    compiled = kiln.compile(_closure_tensor, dynamic=True, fullgraph=True)
    w = torch.randn(3)
    for n in (2, 5, 9):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x, w), _closure_tensor(x, w))
    assert kiln.stats()["graphs"] == 1


def test_closure_tensor_changed_between_calls_is_read_again():
    kiln.reset()
    scale = torch.ones(3)

    def f(x):
        return torch.vmap(lambda row: row * scale)(x)

    compiled = kiln.compile(f)
    x = torch.randn(2, 3)
    torch.testing.assert_close(compiled(x), x)
    scale.mul_(3)
    torch.testing.assert_close(compiled(x), x * 3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["sizes_differ", "returns_number", "random_in_error_mode", "dim_out_of_range",
                                  "in_dims_list", "in_dims_dict_mismatch", "in_dims_not_int"])
def test_eager_errors(case, backend):
    kiln.reset()

    def f(x, y):
        if case == "sizes_differ":
            return torch.vmap(lambda a, b: a + b)(x, y)
        if case == "returns_number":
            return torch.vmap(lambda a: 1.0)(x)
        if case == "random_in_error_mode":
            return torch.vmap(lambda a: a + torch.rand(()))(x)
        if case == "in_dims_list":
            return torch.vmap(lambda a: a * 2, in_dims=[0])(x)
        if case == "in_dims_dict_mismatch":
            return torch.vmap(lambda d: d["a"] * 2, in_dims=({"b": 0},))({"a": x})
        if case == "in_dims_not_int":
            return torch.vmap(lambda d: d["a"] * 2, in_dims=({"a": 0.5},))({"a": x})
        return torch.vmap(lambda a: a, in_dims=3)(x)

    x, y = torch.randn(4, 3), torch.randn(5, 3)
    with pytest.raises(Exception) as expected:
        f(x, y)
    with pytest.raises(type(expected.value)):
        kiln.compile(f, backend=backend)(x, y)


def test_body_with_side_effect_runs_as_eager():
    kiln.reset()
    seen = []

    def f(x):
        def body(row):
            seen.append(1)
            return row * 2
        return torch.vmap(body)(x)

    x = torch.randn(3, 2)
    torch.testing.assert_close(kiln.compile(f)(x), x * 2)
    assert seen == [1]  # eager's vmap calls the body once, on the whole batch


def _ensemble():
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)).eval() for _ in range(3)]
    params, buffers = torch.func.stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")

    def ensemble(params, buffers, x):
        def one(p, b, x):
            return torch.func.functional_call(base, (p, b), (x,))
        return torch.vmap(one, in_dims=(0, 0, None))(params, buffers, x)

    return ensemble, params, buffers


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_ensemble_over_stacked_parameters(backend):
    # functional_call swaps the module's parameters in and puts them back: no change the body leaves
    ensemble, params, buffers = _ensemble()
    x = torch.randn(5, 3)
    one_graph_eager_values(ensemble, backend, params, buffers, x)
    assert dynamo_graphs(ensemble, lambda compiled: compiled(params, buffers, x)) == 1


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x) * self.scale


_scaled = _Scaled()
_log: list = []


def _attribute_set_and_put_back(x, w):
    def body(row):
        old = _scaled.scale
        _scaled.scale = 3.0
        out = _scaled(row) + w
        _scaled.scale = old
        return out
    return torch.vmap(body)(x)


def _list_appended_and_popped(x, w):
    def body(row):
        _log.append(row.sum())
        return row * _log.pop() + w
    return torch.vmap(body)(x)


def _nested_put_back(x, w):
    return torch.vmap(lambda row: _attribute_set_and_put_back(row.unsqueeze(0).expand(2, 3), w).sum(0))(x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_attribute_set_and_put_back, _list_appended_and_popped, _nested_put_back],
                         ids=lambda f: f.__name__)
def test_state_the_body_puts_back_is_one_graph(fn, backend):
    one_graph_eager_values(fn, backend, *_args())
    assert _scaled.scale == 2.0 and _log == []
    assert dynamo_graphs(fn, lambda compiled: compiled(*_args())) == 1


def test_state_the_body_leaves_changed_runs_as_eager():
    kiln.reset()

    def f(x):
        def body(row):
            _scaled.scale = 5.0
            _log.append(1)
            _log.pop()
            return _scaled(row)
        return torch.vmap(body)(x)

    x = torch.randn(4, 3)
    try:
        got = kiln.compile(f)(x)
        assert _scaled.scale == 5.0
        _scaled.scale = 2.0
        torch.testing.assert_close(got, f(x))
    finally:
        _scaled.scale = 2.0
    assert kiln.stats()["graphs"] == 0 and _log == []


def _dict_in_dims(x, w):
    return torch.vmap(lambda d: d["a"] * d["b"], in_dims=({"a": 0, "b": None},))({"a": x, "b": w})


def _dict_in_dims_nested(x, w):
    def body(d, s):
        return d["p"][0] + d["p"][1] * s
    return torch.vmap(body, in_dims=({"p": (0, 1)}, None))({"p": (x, x.t().contiguous())}, w.sum())


def _writes_its_batch(x, w):
    y = x * 1
    torch.vmap(lambda row, s: row.add_(s), in_dims=(0, None))(y, w)
    return y


def _writes_a_row_and_returns(x, w):
    def body(row):
        row[0].mul_(3)
        return row.sin() + w
    return torch.vmap(body)(x.clone())


def _writes_argument_in_place(x, w):
    return torch.vmap(lambda row: row.mul_(2))(x)


def _bf16(x, w):
    return torch.vmap(lambda row: (row * w.bfloat16()).softmax(-1))(x.bfloat16())


def _fp16(x, w):
    return torch.vmap(lambda row: row @ w.half().unsqueeze(-1))(x.half())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_dict_in_dims, _dict_in_dims_nested, _writes_its_batch, _writes_a_row_and_returns,
                                _bf16, _fp16], ids=lambda f: f.__name__)
def test_more_one_graph_eager_values(fn, backend):
    one_graph_eager_values(fn, backend, *_args())
    assert dynamo_graphs(fn, lambda compiled: compiled(*_args())) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_body_writing_the_batched_argument_writes_the_caller_tensor(backend):
    kiln.reset()
    x, w = _args()
    x2 = x.clone()
    got = kiln.compile(_writes_argument_in_place, backend=backend, fullgraph=True)(x, w)
    want = _writes_argument_in_place(x2, w)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x, x2)
    assert kiln.stats()["graphs"] == 1


_buffer = torch.zeros(3)


def test_body_writing_a_closed_over_tensor_keeps_the_write():
    kiln.reset()

    def f(x):
        torch.vmap(lambda row: (_buffer.add_(1), row * 2)[1])(x)  # the result is not used
        return x + 1

    _buffer.zero_()
    kiln.compile(f, fullgraph=True)(torch.randn(4, 3))
    torch.testing.assert_close(_buffer, torch.ones(3))  # eager's vmap runs the body once
    assert kiln.stats()["graphs"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "enable_grad_in_no_grad"])
def test_under_an_outer_grad_mode(mode, backend):
    def f(x, w):
        def mapped():
            return torch.vmap(lambda row: (row * w).sin())(x)
        return under_grad_mode(mode, mapped)

    kiln.reset()
    x, w = _args(requires_grad=True)
    # an inference tensor leaving the frame: the block runs at a break, as for any op
    got, want = kiln.compile(f, backend=backend, fullgraph=mode != "inference_mode")(x, w), f(x, w)
    torch.testing.assert_close(got, want)
    assert got.requires_grad == want.requires_grad and got.is_inference() == want.is_inference()
    assert mode == "inference_mode" or kiln.stats()["graphs"] == 1 and kiln.stats()["fallbacks"] == 0


def _same_noise(x):
    return torch.vmap(lambda row: row + torch.rand(3), randomness="same")(x)


def _different_noise(x):
    return torch.vmap(lambda row: row * torch.randn(3), randomness="different")(x)


def _different_dropout(x):
    return torch.vmap(lambda row: torch.nn.functional.dropout(row, 0.5), randomness="different")(x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_same_noise, _different_noise, _different_dropout], ids=lambda f: f.__name__)
def test_randomness(fn, backend):
    kiln.reset()
    x = torch.ones(6, 3)
    torch.manual_seed(3)
    want = fn(x)
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    torch.manual_seed(3)
    got = compiled(x)
    rows_equal = bool((got == got[0]).all())
    assert rows_equal == (fn is _same_noise) == bool((want == want[0]).all())
    if backend != "inductor":  # inductor draws its own random numbers, as torch.compile's does
        torch.testing.assert_close(got, want)
