"""The ATen tracer and trace_aten: graphs are ATen-level, functional, decomposed on request, symbolic."""
from __future__ import annotations

import operator

import torch

from kiln.autograd import trace_aten
from kiln.fake import FakeTensorMode
from kiln.symbolic import ShapeEnv
from tests.autograd.conftest import traced

aten = torch.ops.aten


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 3),
                               torch.nn.LayerNorm(3))


def test_trace_aten_records_aten_overloads_and_runs_like_eager():
    model = _mlp()
    x = torch.randn(4, 6)
    gm = trace_aten(traced(model), [x])
    targets = _targets(gm)
    assert aten.addmm.default in targets and aten.native_layer_norm.default in targets
    assert all(isinstance(t, torch._ops.OpOverload) or t is operator.getitem for t in targets)
    assert torch.ops.prim.device.default not in targets  # metadata queries are not computation
    params = [p.detach() for p in model.parameters()]
    (out,) = gm(x, *params)
    torch.testing.assert_close(out, model(x))


def test_trace_aten_is_functional_and_returns_mutated_inputs_first():
    def f(x, y):
        x.add_(1)
        y[0:2].mul_(10)  # mutation through a view
        return (x * y).relu_()

    gm = trace_aten(traced(f), [torch.randn(3), torch.randn(3)])
    for target in _targets(gm):
        if isinstance(target, torch._ops.OpOverload):
            assert not target._schema.is_mutable, target
    x, y = torch.randn(3), torch.ones(3)
    new_x, new_y, out = gm(x, y)
    ex, ey = x.clone(), y.clone()
    expected = f(ex, ey)
    torch.testing.assert_close(new_x, ex)
    torch.testing.assert_close(new_y, torch.tensor([10.0, 10.0, 1.0]))
    torch.testing.assert_close(out, expected)


def test_core_decompositions_leave_core_ops():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SiLU())
    gm = trace_aten(traced(model), [torch.randn(2, 4)], decompositions="core")
    targets = _targets(gm)
    assert aten.silu.default not in targets and aten.t.default not in targets
    for t in targets:
        if isinstance(t, torch._ops.OpOverload):
            assert torch.Tag.core in t.tags or t in (aten.sym_size.int,), t


def test_symbolic_sizes_become_sym_size_nodes_and_arithmetic():
    mode = FakeTensorMode(shape_env=ShapeEnv())
    fake = mode.from_real(torch.randn(6, 8), source="x", dynamic_dims=[0])

    def f(x):
        return x.reshape(x.shape[0] * 2, 4).sum(1), x.shape[0] + 1

    gm = trace_aten(traced(f), [fake])
    targets = _targets(gm)
    assert aten.sym_size.int in targets
    assert operator.mul in targets or operator.add in targets
    for n in (3, 10):  # one graph serves every size
        x = torch.randn(n, 8)
        out, size = gm(x)
        torch.testing.assert_close(out, f(x)[0])
        assert size == n + 1


def test_lifted_module_state_becomes_placeholders():
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(3))
    gm = trace_aten(traced(model), [torch.randn(4, 3)])
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # input, weight, bias, running_mean, running_var, num_batches_tracked
    assert len(placeholders) == 6
    # training batch norm mutates three buffers: their new values come first
    assert len(gm.graph.output_node().args[0]) == 4


def test_forward_and_backward_graphs_keep_the_seam_promise():
    import pytest

    from kiln.autograd import aot_autograd, verify_aten_graph
    from kiln.errors import KilnError
    from tests.autograd.conftest import compile_fx

    graphs = []

    def verifying_compiler(gm, example_inputs):
        verify_aten_graph(gm)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        assert len(placeholders) == len(example_inputs)
        graphs.append(gm)
        return gm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.GELU(),
                                torch.nn.Dropout(0.2), torch.nn.Flatten(), torch.nn.Linear(12, 2))
    x = torch.randn(2, 2, 4, 4, requires_grad=True)
    compiled = compile_fx(model, x, backend=aot_autograd(verifying_compiler))
    compiled(x).sum().backward()
    assert len(graphs) == 2 and x.grad is not None

    bad = torch.fx.Graph()
    a = bad.placeholder("a")
    node = bad.call_function(aten.add_.Tensor, (a, a))
    node.meta["val"] = None
    bad.output((node,))
    with pytest.raises(KilnError, match="mutates"):
        verify_aten_graph(torch.fx.GraphModule(torch.nn.Module(), bad))


def test_size_arithmetic_nodes_carry_their_value():
    # Symbolic sizes reach the ATen graph as sym_size nodes plus operator.* arithmetic; the verifier,
    # on for every graph, needs meta["val"] on those too (a reshape to x.shape[0] * x.shape[1]).
    import kiln

    fn = kiln.compile(lambda x: x.reshape(x.shape[0] * x.shape[1]).sin(), backend="aot_eager", dynamic=True,
                      fullgraph=True)
    for shape in [(3, 4), (5, 6)]:
        x = torch.randn(*shape, requires_grad=True)
        torch.testing.assert_close(fn(x), x.reshape(-1).sin())
