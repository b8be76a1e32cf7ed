"""A graph split into pieces, each compiled apart and called in its place: the runtime side of a split.

Where it sits: two stages split a captured graph with torch.fx's split_module and compile each piece
on its own: kiln.capture.distributed (at DDP's bucket boundaries) and kiln.autograd.cond (around a
graph-level cond or while_loop, whose branches run as Python between compiled pieces). Input: the
split GraphModule, the original graph (whose node metadata the backends read), the fake examples and
the fake mode they belong to, and a stage's `compile_piece`. Output: the split module, its pieces
replaced by CompiledPiece modules. Dynamo's counterpart is DDPOptimizer's submodule compiler.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch
import torch.fx


class CompiledPiece(torch.nn.Module):
    """One compiled piece of a split graph, standing where split_module put the piece's module."""

    def __init__(self, compiled: Callable[..., Any], name: str) -> None:
        super().__init__()
        self.compiled = compiled
        self.piece_name = name

    def forward(self, *args: Any) -> Any:
        return self.compiled(*args)


def annotate_piece(piece: torch.fx.GraphModule, args: Sequence[Any], meta: dict[str, dict]) -> None:
    """Give the piece's nodes the metadata backends read: capture's own where the node came from
    the original graph, and the fake value that reaches each placeholder."""
    placeholders = [n for n in piece.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, args):
        node.meta.update(meta.get(node.name, {}))
        node.meta["example_value"] = value
    for node in piece.graph.nodes:
        if node.op != "placeholder" and node.name in meta:
            node.meta.update(meta[node.name])


def compile_pieces(split: torch.fx.GraphModule, original: torch.fx.GraphModule, examples: Sequence[Any],
                   fake_mode: Any, compile_piece: Callable[[torch.fx.GraphModule, list], tuple[Any, Any]]) -> None:
    """Run `split` on the fake `examples` (under `fake_mode` where there is one); each piece, its
    metadata filled in, goes to `compile_piece(piece, args)`, which returns the piece's outputs on
    those args and the compiled callable to stand in its place (or None: the piece stays, changed
    in place by compile_piece)."""
    meta = {node.name: node.meta for node in original.graph.nodes}

    class PieceCompiler(torch.fx.Interpreter):
        def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
            piece = self.module.get_submodule(target)
            assert isinstance(piece, torch.fx.GraphModule)  # split_module makes every piece one
            annotate_piece(piece, args, meta)
            outputs, compiled = compile_piece(piece, list(args))
            if compiled is not None:
                delattr(self.module, target)
                setattr(self.module, target, CompiledPiece(compiled, target))
            return outputs

    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        PieceCompiler(split).run(*examples)
    split.recompile()


def run_and_compile(compiler: Callable[[torch.fx.GraphModule, list], Any]) -> Callable[[torch.fx.GraphModule, list],
                                                                                        tuple[Any, Any]]:
    """The plain `compile_piece`: the piece's outputs by interpreting it, and `compiler`'s callable."""
    def compile_piece(piece: torch.fx.GraphModule, args: list) -> tuple[Any, Any]:
        outputs = torch.fx.Interpreter(piece).run(*args)
        return outputs, compiler(piece, args)
    return compile_piece
