"""The capture -> backend seam, checked: the torch-level GraphModule a backend is handed.

OutputGraph.compile calls `verify_captured_graph(gm)` on every graph just before the backend sees it;
it is one pass over the nodes, cheap enough to stay on always. It checks what docs/seams.md promises
a backend: placeholders first, then only function and method calls (and get_attr of a cond's branch graphs), every value traced (a fake
`meta["example_value"]`), every argument defined before its use, one output node returning a tuple.
Raises kiln.errors.VerificationError naming the first offending node. Counterpart: torch.fx's
Graph.lint, which Dynamo's output graph runs in debug builds.
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.errors import VerificationError

STAGE = "capture"
_CALLS = ("call_function", "call_method")


def verify_captured_graph(gm: torch.fx.GraphModule) -> None:
    """Raise VerificationError unless `gm` keeps the promise of the torch.compile backend contract."""
    seen: set[torch.fx.Node] = set()
    calls_started = False
    outputs = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if calls_started:
                _fail(node, "is a placeholder after the first call; a backend binds inputs by position")
        elif node.op in _CALLS:
            calls_started = True
        elif node.op == "get_attr" and isinstance(getattr(gm, node.target, None), torch.fx.GraphModule):
            seen.add(node)  # a graph-level cond's branch: a subgraph, not a value
            continue
        elif node.op == "output":
            outputs += 1
            if not isinstance(node.args[0], tuple):
                _fail(node, f"returns {type(node.args[0]).__name__}, not a tuple")
        else:
            _fail(node, f"is a {node.op}; a captured graph holds only placeholders, calls and one output")
        if node.op != "output" and "example_value" not in node.meta:
            _fail(node, "has no traced value (meta['example_value'])")
        for arg in node.all_input_nodes:
            if arg not in seen:
                _fail(node, f"reads {arg.name} before it is defined")
        seen.add(node)
    if outputs != 1:
        raise VerificationError(STAGE, f"graph has {outputs} output nodes, expected one")


def _fail(node: torch.fx.Node, what: str) -> Any:
    raise VerificationError(STAGE, f"graph node {node.name} ({node.op} {node.target}) {what}")
