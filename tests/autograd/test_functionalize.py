"""Mutations of inputs are applied back once; outputs that alias inputs or each other stay aliases."""
from __future__ import annotations

import pytest
import torch

from kiln.errors import VerificationError
from tests.autograd.conftest import assert_same_state, compile_fx


def test_in_place_on_input_is_applied_exactly_once_per_call():
    def f(x):
        x.add_(1)
        return x * 2

    x = torch.zeros(3)
    compiled = compile_fx(f, x.clone())
    out = compiled(x)
    torch.testing.assert_close(x, torch.ones(3))
    torch.testing.assert_close(out, torch.full((3,), 2.0))
    compiled(x)
    torch.testing.assert_close(x, torch.full((3,), 2.0))


def test_mutation_through_a_view_and_of_a_second_input():
    def f(x, y):
        x[0:2].mul_(10)
        y.add_(x)
        return y.sum()

    x, y = torch.ones(3), torch.ones(3)
    compiled = compile_fx(f, x.clone(), y.clone())
    out = compiled(x, y)
    torch.testing.assert_close(x, torch.tensor([10.0, 10.0, 1.0]))
    torch.testing.assert_close(y, torch.tensor([11.0, 11.0, 2.0]))
    torch.testing.assert_close(out, torch.tensor(24.0))


def test_batchnorm_running_stats_and_counter_mutate_like_eager(twin):
    eager, model = twin(torch.nn.Sequential(torch.nn.BatchNorm1d(4, momentum=0.3)))
    x = torch.randn(8, 4) * 3 + 1
    compiled = compile_fx(model, x)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), eager(x))
    assert int(model[0].num_batches_tracked) == 3
    assert_same_state(eager, model, grads=False)


def test_output_that_is_a_view_of_an_input_aliases_it():
    def f(x):
        return x.view(-1), x.t()

    x = torch.randn(2, 3)
    compiled = compile_fx(f, x)
    flat, t = compiled(x)
    assert flat.data_ptr() == x.data_ptr() and t.stride() == (1, 3)
    flat[0] = 100.0  # a write through the output shows in the input, as in eager
    assert x[0, 0] == 100.0


def test_outputs_aliasing_each_other_and_an_input_returned_as_is():
    def f(x, y):
        z = x * 2
        return z, z.view(-1), y

    x, y = torch.randn(2, 2), torch.randn(2)
    compiled = compile_fx(f, x, y)
    z, flat, same = compiled(x, y)
    assert same is y
    assert flat.data_ptr() == z.data_ptr()
    z.add_(1)
    torch.testing.assert_close(flat, (x * 2 + 1).view(-1))


def test_view_output_of_input_carries_gradient():
    def f(x):
        return x.view(-1) * 1.0, x[0]

    x = torch.randn(2, 3, requires_grad=True)
    compiled = compile_fx(f, x)
    a, b = compiled(x)
    assert b.requires_grad and b._base is x
    (a.sum() + 3 * b.sum()).backward()
    expected = torch.ones(2, 3)
    expected[0] += 3
    torch.testing.assert_close(x.grad, expected)


def test_symbolic_view_of_input_is_rebuilt_for_each_size():
    from kiln.autograd import aot_eager
    from kiln.fake import FakeTensorMode
    from kiln.symbolic import ShapeEnv
    from tests.autograd.conftest import traced

    def f(x):
        return x[1:].view(-1), x.sum(0)

    mode = FakeTensorMode(shape_env=ShapeEnv())
    fake = mode.from_real(torch.randn(5, 3), source="x", dynamic_dims=[0])
    compiled = aot_eager(traced(f), [fake])
    for n in (4, 9):
        x = torch.randn(n, 3)
        flat, total = compiled(x)
        assert flat.shape == ((n - 1) * 3,) and flat.data_ptr() == x[1].data_ptr()
        torch.testing.assert_close(total, x.sum(0))


class _Heads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        logits = self.linear(x)
        return logits, logits.argmax(-1), logits.detach() * 2


def test_outputs_that_need_no_grad_stay_without_grad():
    model = _Heads()
    x = torch.randn(2, 4)
    logits, index, detached = compile_fx(model, x)(x)
    assert logits.requires_grad and not index.requires_grad and not detached.requires_grad
    assert index.dtype == torch.int64
    logits.sum().backward()
    torch.testing.assert_close(model.linear.bias.grad, torch.full((3,), 2.0))


def test_in_place_on_a_non_leaf_input_that_requires_grad():
    def f(x, w):
        x.mul_(w)
        return (x * 2).sum()

    def run(fn):
        torch.manual_seed(0)
        a, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        x = a * 1.0  # a non-leaf: eager allows the in-place op and records it
        out = fn(x, w)
        (out + x.sum()).backward()  # x's later use must see the mutation's history
        return out.detach(), x.detach(), a.grad, w.grad

    torch.manual_seed(0)
    example = [torch.randn(3, requires_grad=True) * 1.0, torch.randn(3, requires_grad=True)]
    compiled = compile_fx(f, *example)
    for got, expected in zip(run(compiled), run(f)):
        torch.testing.assert_close(got, expected)


class _Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(5, 7, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(7, 1)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


def test_grad_mode_sensitive_kernels_get_grad_mode_in_the_forward(twin):
    # the CPU LSTM kernel returns the workspace its backward needs only when grad mode is on,
    # while autograd.Function.forward runs with it off
    eager, model = twin(_Recurrent())
    x = torch.randn(2, 4, 5)
    compile_fx(model, x)(x).sum().backward()
    eager(x).sum().backward()
    assert_same_state(eager, model)


def test_instance_norm_running_stats_are_functional_graph_outputs(twin):
    from kiln.autograd import trace_aten
    from tests.autograd.conftest import traced

    eager, model = twin(torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3),
                                            torch.nn.InstanceNorm1d(4, affine=True, track_running_stats=True)))
    x = torch.randn(2, 3, 8)
    gm = trace_aten(traced(model), [x])
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.native_batch_norm.default not in targets  # its update would be invisible
    compiled = compile_fx(model, x)
    for _ in range(2):
        compiled(x).sum().backward()
        eager(x).sum().backward()
    assert_same_state(eager, model)



def test_a_tensor_passed_twice_is_one_input():
    def bump_then_double(a, b):
        a.add_(1)
        return b * 2

    a = torch.zeros(3)
    compiled = compile_fx(bump_then_double, a, a)
    out = compiled(a, a)
    torch.testing.assert_close(a, torch.ones(3))  # bumped once, not once per argument
    torch.testing.assert_close(out, torch.full((3,), 2.0))  # b sees the bump through a

    def product(x, y):
        return (x * y).sum()

    w = torch.full((3,), 3.0, requires_grad=True)
    compile_fx(product, w, w)(w, w).backward()
    torch.testing.assert_close(w.grad, torch.full((3,), 6.0))  # d(w*w)/dw, counted once


def test_in_place_update_of_a_strided_input_is_a_data_mutation() -> None:
    # Found by tests/fuzz (seed 52): the new value of a sliced or transposed input has its own
    # strides, which used to be taken for a metadata mutation (the frame then ran eagerly).
    import kiln

    def scale(x):
        x.mul_(0.5)
        return x + 1

    for make in (lambda: torch.randn(8, 3)[::2], lambda: torch.randn(3, 4).t(), lambda: torch.randn(2, 5)[:, 1:4]):
        for backend in ("aot_eager", "inductor"):
            kiln.reset()
            x = make()
            base = x._base.clone()
            expected_x = base.as_strided(x.shape, x.stride(), x.storage_offset())
            got = kiln.compile(scale, backend=backend)(x)
            torch.testing.assert_close(got, scale(expected_x))
            torch.testing.assert_close(x._base, base)  # the whole base, not only the view
            assert kiln.stats()["fallbacks"] == 0


def test_updates_of_fresh_tensors_become_out_of_place():
    # `empty_like(x).fill_(1).sub_(x)`, as a decomposition below functionalization leaves it (silu's
    # backward): out-of-place, same values; an in-place update of an input stays (the verifier names it).
    import torch.fx

    from kiln.autograd.functionalize import functionalize_fresh_fills, verify_aten_graph

    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    empty = graph.call_function(aten.empty_like.default, (x,))
    filled = graph.call_function(aten.fill_.Scalar, (empty, 1))
    out = graph.call_function(aten.sub_.Tensor, (filled, x))
    bumped = graph.call_function(aten.add_.Tensor, (x, 1))
    graph.output((out, bumped))
    for node in graph.nodes:
        node.meta["val"] = torch.empty(3)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    functionalize_fresh_fills(gm)
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [
        aten.empty_like.default, aten.fill.Scalar, aten.sub.Tensor, aten.add_.Tensor]
    arg = torch.randn(3)
    torch.testing.assert_close(gm(arg.clone())[0], 1 - arg)
    with pytest.raises(VerificationError, match=r"\[aot_autograd\] ATen graph node add__tensor mutates"):
        verify_aten_graph(gm)
