"""Backward graphs reordered for a lower peak of live memory (kiln/autograd/reorder.py): the
estimate falls where an order holds two large buffers at once needlessly, the values stay the same,
graphs with mutation keep their order, and a transformer block's measured training peak drops."""
from __future__ import annotations

import torch
import torch.fx as fx

from benchmarks.memory import peak_step_bytes
from examples.gpt import Block, GPTConfig
from kiln.autograd import partition as partition_module
from kiln.autograd.reorder import estimated_peak, reorder_for_peak_memory

aten = torch.ops.aten


def _mlp_backward_graph() -> fx.GraphModule:
    """The backward of gelu(h) @ W as autograd lists it: the input gradient's matmul, then the
    recomputed activation for the weight gradient, then GELU's backward."""
    g = fx.Graph()
    grad, h, w = g.placeholder("grad"), g.placeholder("h"), g.placeholder("w")
    grad_act = g.call_function(aten.mm.default, (grad, w))  # [rows, hidden]: large
    act = g.call_function(aten.gelu.default, (h,))  # recomputed: large
    grad_t = g.call_function(aten.t.default, (grad,))
    grad_w = g.call_function(aten.mm.default, (grad_t, act))  # [out, hidden]: small
    grad_h = g.call_function(aten.gelu_backward.default, (grad_act, h))
    g.output((grad_h, grad_w))
    gm = fx.GraphModule(torch.nn.Module(), g)
    values = {"grad": torch.randn(256, 8), "h": torch.randn(256, 512), "w": torch.randn(8, 512)}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta["val"] = values[node.name]
        elif node.op == "call_function":
            args = [a.meta["val"] if isinstance(a, fx.Node) else a for a in node.args]
            node.meta["val"] = node.target(*args)
    gm.example_values = values  # type: ignore[assignment]
    return gm


def test_reorder_lowers_the_estimated_peak_and_keeps_the_values() -> None:
    gm = _mlp_backward_graph()
    values = gm.example_values
    expected = gm(values["grad"], values["h"], values["w"])
    before, after = reorder_for_peak_memory(gm)
    hidden = 256 * 512 * 4
    assert before >= 3 * hidden  # h, the input gradient and the recomputed activation at once
    assert after <= 2 * hidden + 256 * 8 * 4 + 2 * 8 * 512 * 4  # + grad, w and the weight gradient
    assert after == estimated_peak(list(gm.graph.nodes))
    order = [n for n in gm.graph.nodes if n.op == "call_function"]
    grad_w = gm.graph.output_node().args[0][1]
    grad_act = next(n for n in order if n.target is aten.mm.default and n is not grad_w)
    assert order.index(grad_w) < order.index(grad_act)  # the weight gradient frees the activation first
    got = gm(values["grad"], values["h"], values["w"])
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_graph_that_mutates_keeps_its_order() -> None:
    gm = _mlp_backward_graph()
    h = next(n for n in gm.graph.nodes if n.name == "h")
    out = gm.graph.output_node()
    with gm.graph.inserting_before(out):
        mutation = gm.graph.call_function(aten.add_.Tensor, (h, 1.0))
        mutation.meta["val"] = h.meta["val"]
    gm.recompile()
    names = [n.name for n in gm.graph.nodes]
    before, after = reorder_for_peak_memory(gm)
    assert before == after and [n.name for n in gm.graph.nodes] == names


def _block_step(reorder: bool):
    import kiln

    torch.manual_seed(0)
    block = Block(GPTConfig(block_size=64, n_head=2, n_embd=64, dropout=0.0)).train()
    x = torch.randn(4, 64, 64, generator=torch.Generator().manual_seed(1))
    real = partition_module.reorder_for_peak_memory
    if not reorder:
        partition_module.reorder_for_peak_memory = lambda gm, borrowed=frozenset(): (0, 0)
    try:
        kiln.reset()
        compiled = kiln.compile(block)

        def step():
            for p in block.parameters():
                p.grad = None
            compiled(x).square().mean().backward()
            return [p.grad for p in block.parameters()]

        step()
    finally:
        partition_module.reorder_for_peak_memory = real
    return block, x, step


def test_transformer_block_training_peak_is_lower_and_gradients_are_eagers(monkeypatch) -> None:
    monkeypatch.setattr("kiln.config.persistent_cache", False)
    _, _, plain = _block_step(reorder=False)
    block, x, reordered = _block_step(reorder=True)
    peak_plain, peak_reordered = peak_step_bytes(plain), peak_step_bytes(reordered)
    assert peak_plain is not None and peak_reordered is not None
    assert peak_reordered < peak_plain
    grads = reordered()
    for p in block.parameters():
        p.grad = None
    block(x).square().mean().backward()
    for got, p in zip(grads, block.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-5)
