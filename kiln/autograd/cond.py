"""Graph-level conds and while_loops (`torch.ops.higher_order.cond` / `while_loop` nodes,
kiln/capture/variables/cond_graph.py) under AOT autograd: the graph is split around each, the pieces
between them and each one's two subgraphs are compiled by the backend on their own, and the cond
runs as a Python branch between its two compiled branches (the while_loop as a Python loop over its
compiled cond_fn and body_fn) when the graph runs.

Input: a captured GraphModule and its fake example inputs; output: a callable. Autograd flows
through the branch taken, as each compiled piece is an autograd function of its own. A branch
holding a cond of its own is split the same way. Corresponds to the cond lowering in
torch/_inductor/lowering.py (Inductor's Conditional IR node runs one of two subgraphs).
"""
from __future__ import annotations

import copy
import operator
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from kiln.fake import mode_of
from kiln.runtime.pieces import (CompiledPiece, compile_pieces, gradient_facts, persistable, run_and_compile, run_cond,
                                 run_while)

_COND = torch.ops.higher_order.cond
_WHILE = torch.ops.higher_order.while_loop
_CONTROL = (_COND, _WHILE)


def has_cond(gm: torch.fx.GraphModule) -> bool:
    """Whether `gm` holds a graph-level cond or while_loop."""
    return any(node.op == "call_function" and node.target in _CONTROL for node in gm.graph.nodes)


def _getters(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The get_attr nodes of a cond's branches or a while_loop's cond_fn and body_fn."""
    return list(node.args[1:3] if node.target is _COND else node.args[0:2])  # type: ignore[arg-type]


def _partitions(gm: torch.fx.GraphModule) -> dict[str, int]:
    """Each cond, with its branch getters and the getitems of its results, in a piece of its own;
    the ops between conds in the pieces between them."""
    part: dict[str, int] = {}
    index = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "get_attr":
            continue  # placed with the cond that reads it
        if node.op == "call_function" and node.target in _CONTROL:
            index += 1
            part[node.name] = index
            for getter in _getters(node):
                part[getter.name] = index
            index += 1
        elif node.op == "call_function" and node.target is operator.getitem and node.args[0].name in part \
                and node.args[0].target in _CONTROL:
            part[node.name] = part[node.args[0].name]
        else:
            part[node.name] = index
    return part


def compile_conds(gm: torch.fx.GraphModule, examples: Sequence[Any],
                  compiler: Callable[[torch.fx.GraphModule, list], Callable[..., Any]]) -> Callable[..., Any]:
    """`gm` with its conds run as Python branches between pieces `compiler` compiled."""
    part = _partitions(gm)
    split = split_module(gm, gm, lambda node: part[node.name], keep_original_order=True, tuple_return=True)
    fake_mode = mode_of([e for e in examples if isinstance(e, torch.Tensor)])
    plain = run_and_compile(compiler)

    def compile_piece(piece: torch.fx.GraphModule, args: list) -> tuple[Any, Any]:
        if has_cond(piece):
            return _compile_cond_piece(piece, args, compiler), None  # the piece stays, its branches compiled
        return plain(piece, args)

    compile_pieces(split, gm, examples, fake_mode, compile_piece)
    return persistable(split)  # a recipe of the split and its pieces: the frame cache stores it


def _compile_cond_piece(piece: torch.fx.GraphModule, args: Sequence[Any],
                        compiler: Callable[[torch.fx.GraphModule, list], Callable[..., Any]]) -> Any:
    """Trace the piece on fakes (the true branch gives the results' metadata: both agree), then
    compile each branch and make the cond node call run_cond (run_while), given each compiled
    graph's gradient facts: which operands its backward reaches, whether it saves a result."""
    node = next(n for n in piece.graph.nodes if n.op == "call_function" and n.target in _CONTROL)
    tracing = _OnFakes(piece)
    outputs = tracing.run(*args)
    found = tracing.found[0]
    if node.target is _COND:
        graphs, operands = found[1:3], list(found[3])
    else:  # cond_fn's one result made a tuple, as compiled graphs return
        graphs, operands = (_returning_tuple(found[0]), found[1]), [*found[2], *found[3]]
    facts = []
    for getter, graph in zip(_getters(node), graphs):
        compiled = compile_conds(graph, operands, compiler) if has_cond(graph) else compiler(graph, list(operands))
        facts.append(gradient_facts(compiled))
        delattr(piece, str(getter.target))
        setattr(piece, str(getter.target), CompiledPiece(compiled, str(getter.target)))
    node.target = run_cond if node.target is _COND else run_while
    # which operands need eager's zeros, which results a copy
    node.args = (*node.args, (*facts, tuple(k for k in range(len(operands)) if any(_reads(g, k) for g in graphs))))
    piece.recompile()
    return outputs


def _reads(graph: torch.fx.GraphModule, k: int) -> bool:
    """Whether `graph` reads its `k`-th input's values (more than its sizes): an operand that no
    branch reads is not one of eager's cond (capture drops it), whose gradient stays None."""
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    return k < len(placeholders) and any(not _size_query(user) for user in placeholders[k].users)


def _size_query(node: torch.fx.Node) -> bool:
    return node.op == "call_method" and node.target in ("size", "dim", "numel", "stride") or \
        node.op == "call_function" and node.target in (torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default) \
        or node.op == "call_function" and node.target is getattr and node.args[1:] in (("shape",), ("ndim",))


class _OnFakes(torch.fx.Interpreter):
    """Runs a graph on fakes, a cond (nested ones too) through its true branch; records each cond's
    arguments."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.found: list[tuple] = []

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if target is _COND:
            self.found.append(args)
            return _as_results(tuple(_OnFakes(args[1]).run(*args[3])), args[1:3], list(args[3]))
        if target is _WHILE:  # the body's results: the carried values' metadata
            self.found.append(args)
            operands = [*args[2], *args[3]]
            return _as_results(tuple(_OnFakes(args[1]).run(*operands)), args[0:2], operands)
        return super().call_function(target, args, kwargs)


def _as_results(values: tuple, graphs: Sequence[torch.fx.GraphModule], operands: list[Any]) -> tuple:
    """A cond's (while_loop's) fake results as run_cond gives them: with grad on and an operand that
    a graph reads requiring grad, every floating result requires grad, whatever the true branch (the
    body) gives (the pieces after it are compiled for results that do, not leaves)."""
    if not torch.is_grad_enabled() or not any(
            isinstance(t, torch.Tensor) and t.requires_grad and any(_reads(g, k) for g in graphs)
            for k, t in enumerate(operands)):
        return values
    return tuple(v.detach().requires_grad_().clone() if isinstance(v, torch.Tensor) and not v.requires_grad
                 and (v.is_floating_point() or v.is_complex()) else v for v in values)


def _returning_tuple(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph = copy.deepcopy(gm.graph)
    output = next(n for n in graph.nodes if n.op == "output")
    output.args = ((output.args[0],),)
    return torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)


