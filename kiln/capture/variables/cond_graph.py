"""A `torch.cond` (or a `while_loop`) on a predicate capture cannot know (it depends on tensor data)
kept as one graph-level op: both branches (cond_fn and body_fn) are traced into the frame's graph,
then moved out into two subgraphs, and one `torch.ops.higher_order.cond(pred, true_graph,
false_graph, inputs)` (`while_loop(cond_graph, body_graph, carried, additional)`) node takes their place.

Input: the nodes each branch added and the nodes it returns (kiln/capture/variables/higher_order.py
traced them). Output: the cond node, whose inputs are the operands followed by every other value a
branch reads from outside (closed-over tensors, parameters, sizes), so the subgraphs are closed.
The subgraphs are GraphModules held by the OutputGraph (`subgraphs`) and read by `get_attr` nodes,
as Dynamo's output graph holds them. Corresponds to speculate_subgraph in
torch/_dynamo/variables/higher_order_ops.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.fx

if TYPE_CHECKING:
    from kiln.capture.output_graph import OutputGraph


def outside_inputs(branches: Sequence[Sequence[torch.fx.Node]], first: Sequence[torch.fx.Node]) -> list[torch.fx.Node]:
    """The values the branches read from outside themselves: `first` (the operands) in order, then the
    others in the order the branches first read them."""
    found: dict[torch.fx.Node, None] = dict.fromkeys(first)
    for nodes in branches:
        inside = set(nodes)
        for node in nodes:
            for arg in node.all_input_nodes:
                if arg not in inside:
                    found.setdefault(arg)
    return list(found)


def make_subgraph(output: "OutputGraph", inputs: Sequence[torch.fx.Node], nodes: Sequence[torch.fx.Node],
              results: Sequence[torch.fx.Node] | torch.fx.Node, name: str) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta.update(node.meta)
    root = torch.nn.Module()
    for node in nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
        if node.op == "get_attr":  # a nested cond's own branches
            setattr(root, str(node.target), output.subgraphs[str(node.target)])
    graph.output(env[results] if isinstance(results, torch.fx.Node) else tuple(env[n] for n in results))
    return torch.fx.GraphModule(root, graph, class_name=name)


def insert_cond(output: "OutputGraph", pred: torch.fx.Node, operands: Sequence[torch.fx.Node],
                branches: Sequence[tuple[Sequence[torch.fx.Node], Sequence[torch.fx.Node]]],
                examples: tuple[Any, ...]) -> torch.fx.Node:
    """Move each branch's (nodes, results) out of the graph into a subgraph; returns the cond node,
    which returns `examples` (one fake per result)."""
    inputs = outside_inputs([nodes for nodes, _ in branches], operands)
    index = len(output.subgraphs) // 2
    attrs = []
    for (nodes, results), which in zip(branches, ("true", "false")):
        name = f"cond_{which}_{index}"
        output.subgraphs[name] = make_subgraph(output, inputs, nodes, results, name)
        attrs.append(name)
    for nodes, _ in reversed(branches):
        for node in reversed(nodes):
            output.graph.erase_node(node)
    getters = [output.graph.get_attr(name) for name in attrs]
    return output.create_node("call_function", torch.ops.higher_order.cond,
                              (pred, getters[0], getters[1], tuple(inputs)), {}, examples)


def insert_while_loop(output: "OutputGraph", carried: Sequence[torch.fx.Node],
                      cond: tuple[Sequence[torch.fx.Node], torch.fx.Node],
                      body: tuple[Sequence[torch.fx.Node], Sequence[torch.fx.Node]],
                      examples: tuple[Any, ...]) -> torch.fx.Node:
    """Move cond_fn's (nodes, predicate) and body_fn's (nodes, new carried values) into subgraphs of
    one `torch.ops.higher_order.while_loop(cond, body, carried, additional)` node; both subgraphs
    take the carried values, then the other values they read from outside (`additional`)."""
    inputs = outside_inputs([cond[0], body[0]], carried)
    index = len(output.subgraphs) // 2
    names = [f"while_cond_{index}", f"while_body_{index}"]
    output.subgraphs[names[0]] = make_subgraph(output, inputs, cond[0], cond[1], names[0])
    output.subgraphs[names[1]] = make_subgraph(output, inputs, body[0], body[1], names[1])
    for nodes in (body[0], cond[0]):
        for node in reversed(nodes):
            output.graph.erase_node(node)
    getters = [output.graph.get_attr(name) for name in names]
    return output.create_node("call_function", torch.ops.higher_order.while_loop,
                              (getters[0], getters[1], tuple(carried), tuple(inputs[len(carried):])), {}, examples)


def branch_results(nodes: Sequence[torch.fx.Node], results: Sequence[Any]) -> list[torch.fx.Node] | None:
    """The nodes of a branch's result tensors, or None when one was not made by the branch (an
    input returned as it is)."""
    inside = set(nodes)
    made = [getattr(r, "node", None) for r in results]
    if any(n is None or n not in inside for n in made):
        return None
    return [n for n in made if n is not None]
