"""The capture -> backend verifier: every graph a backend sees is checked, and broken ones are named."""
from __future__ import annotations

import operator

import pytest
import torch
import torch.fx

import kiln
from kiln.backends import CountingBackend
from kiln.capture.verify import verify_captured_graph
from kiln.errors import VerificationError


def _captured(fn, *args) -> torch.fx.GraphModule:
    backend = CountingBackend()
    kiln.compile(fn, backend=backend, fullgraph=True)(*args)
    (gm,) = backend.graphs
    return gm


def test_captured_graphs_pass():
    gm = _captured(lambda x, y: (x.sin() + y).relu().sum(0), torch.randn(3, 4), torch.randn(4))
    verify_captured_graph(gm)


def test_missing_example_value_is_named():
    gm = _captured(lambda x: x.cos() * 2, torch.randn(3))
    node = next(n for n in gm.graph.nodes if n.op == "call_method")
    del node.meta["example_value"]
    with pytest.raises(VerificationError, match=rf"\[capture\] graph node {node.name} .* no traced value"):
        verify_captured_graph(gm)


def test_non_tuple_output_and_foreign_node_kinds_are_rejected():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = torch.empty(2)
    y = graph.call_function(operator.neg, (x,))
    y.meta["example_value"] = torch.empty(2)
    graph.output(y)
    with pytest.raises(VerificationError, match="returns Node, not a tuple"):
        verify_captured_graph(torch.fx.GraphModule(torch.nn.Module(), graph))
    module = torch.nn.Module()
    module.lin = torch.nn.Linear(2, 2)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = torch.empty(2)
    y = graph.call_module("lin", (x,))
    y.meta["example_value"] = torch.empty(2)
    graph.output((y,))
    with pytest.raises(VerificationError, match="is a call_module"):
        verify_captured_graph(torch.fx.GraphModule(module, graph))


def test_a_broken_graph_never_reaches_the_backend(monkeypatch):
    # The verifier runs before the backend: under fullgraph the error reaches the user, naming the stage.
    import kiln.capture.output_graph as output_graph

    def drop_values(gm):
        for node in gm.graph.nodes:
            node.meta.pop("example_value", None)
        verify_captured_graph(gm)

    monkeypatch.setattr(output_graph, "verify_captured_graph", drop_values)
    backend = CountingBackend()
    with pytest.raises(VerificationError, match=r"\[capture\]"):
        kiln.compile(lambda x: x + 1, backend=backend, fullgraph=True)(torch.randn(2))
    assert backend.graphs == []
