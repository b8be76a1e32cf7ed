"""The lowered wrapper takes every graph input: trailing plain-int placeholders that no kernel reads
(capture passes ints it only guards on) must not make the call fail with "too many values"."""
from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from kiln.lower import compile_graph

pytestmark = pytest.mark.cpp


def _graph_with_trailing_ints(unused_ints: int) -> fx.GraphModule:
    graph = fx.Graph()
    x = graph.placeholder("x")
    for k in range(unused_ints):
        graph.placeholder(f"n{k}")
    sin = graph.call_function(torch.ops.aten.sin.default, (x,))
    graph.output((graph.call_function(torch.ops.aten.mul.Tensor, (sin, 2.0)),))
    return fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("unused_ints", [0, 1, 3])
def test_trailing_int_inputs_no_kernel_reads(unused_ints: int) -> None:
    x = torch.randn(4, 5)
    ints = list(range(7, 7 + unused_ints))
    gm = _graph_with_trailing_ints(unused_ints)
    for node in gm.graph.nodes:  # the lowering reads metadata the way capture and AOT leave it
        if node.op == "placeholder":
            node.meta["val"] = x if node.name == "x" else ints[int(node.name[1:])]
    compiled = compile_graph(gm, [x, *ints])
    torch.testing.assert_close(compiled(x, *ints)[0], x.sin() * 2)
