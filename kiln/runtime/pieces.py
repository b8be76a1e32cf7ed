"""A graph split into pieces, each compiled apart and called in its place: the runtime side of a split.

Where it sits: two stages split a captured graph with torch.fx's split_module and compile each piece
on its own: kiln.capture.distributed (at DDP's bucket boundaries) and kiln.autograd.cond (around a
graph-level cond or while_loop, whose branches run as Python between compiled pieces). Input: the
split GraphModule, the original graph (whose node metadata the backends read), the fake examples and
the fake mode they belong to, and a stage's `compile_piece`. Output: the split module, its pieces
replaced by CompiledPiece modules. Dynamo's counterpart is DDPOptimizer's submodule compiler.
A split around conds follows the artifact protocol (kiln.runtime.artifact, kind "split"): the outer
graph as data (SplitNode records in a small grammar: placeholders, pieces, branch getters, the cond
and while_loop runners, getitem, the output) beside each piece's own recipe; the loader checks the
nodes against that grammar and makes the graph with torch.fx, so no stored text is ever run.
"""
from __future__ import annotations

import contextlib
import keyword
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx

from kiln.runtime.artifact import RECIPE_ATTR, Recipe, describe, loader, rebuild
from kiln.runtime.records import record_type


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


def run_cond(pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any], operands: Sequence[Any],
             facts: tuple = ()) -> Any:
    """A graph-level cond at run time: one compiled branch, picked by the predicate's value.
    `facts`: each branch's gradient facts (`gradient_facts`), then the positions of the operands
    either branch reads; () where unknown (a split stored before them)."""
    taken = bool(pred)
    results = (true_fn if taken else false_fn)(*operands)
    if not facts:
        return _with_zero_gradients(results, operands, (), None)
    return _with_zero_gradients(results, operands, facts[1 - taken], facts[2])


def run_while(cond_fn: Callable[..., Any], body_fn: Callable[..., Any], carried: Sequence[Any],
              additional: Sequence[Any], facts: tuple = ()) -> Any:
    """A graph-level while_loop at run time: the compiled body until the compiled predicate is
    false; with no iteration, copies of the carried values (as eager's while_loop returns). Every
    operand requiring grad gets zeros beside the body's gradients (an iteration's results that
    carry no gradient cut the chain to the earlier ones: which operands the body reaches on its
    first call does not say which the backward reaches); the results are copied only where the
    body saves one for its backward (`facts`: the cond_fn's and the body's gradient facts)."""
    values = tuple(carried)
    ran = False
    while bool(cond_fn(*values, *additional)[0]):
        values = tuple(body_fn(*values, *additional))
        ran = True
    body = facts[1] if facts else ()
    if not ran:  # fresh copies: nothing else holds them
        values, body = tuple(v.clone() for v in values), (0,)
    return _with_zero_gradients(values, (*carried, *additional), body[:1], facts[2] if facts else None)


def gradient_facts(compiled: Any) -> tuple[int, ...]:
    """What a compiled branch's backward does, known when it is compiled (AotRuntime's
    `gradient_facts`): (1 if its forward saves for the backward a tensor sharing storage with one
    of its results, else 0; then the positions of the inputs its backward gives a gradient). ()
    where unknown (a branch holding a cond, a graph run op by op): every operand requiring grad
    gets zeros and the results are copied."""
    facts = getattr(compiled, "gradient_facts", None)
    return tuple(int(k) for k in facts) if isinstance(facts, tuple) and facts else ()


def _with_zero_gradients(results: Any, operands: Sequence[Any], facts: tuple, read: tuple | None) -> Any:
    """The results of a cond or while_loop as eager's autograd op gives them: with grad on and an
    operand requiring grad that a branch reads (`read`: their positions; None, every operand), every
    floating result requires grad, and each such operand gets a gradient, zeros where the branch
    taken carries none (a closure read only by the other branch, or only by the loop's predicate,
    or detached); an operand no branch reads is not one of eager's op (capture drops it): it gets
    none. A compiled branch is an autograd function of its own, linked only to what it reads: the
    operands it gives a gradient (`facts[1:]`, known when it is compiled) need nothing more; the
    others are tied to every floating result, whichever the backward starts from. A result is copied only where the branch saved it (or a view of it) for
    its backward (`facts[0]`): eager's op saves none, so an in-place update of the result must not
    reach the branch's saved tensor (autograd would refuse the backward)."""
    if not torch.is_grad_enabled():
        return results
    wanted = [t for k, t in enumerate(operands)
              if isinstance(t, torch.Tensor) and t.requires_grad and (read is None or k in read)]
    if not wanted:
        return results
    if facts:
        copy = bool(facts[0])
        reached = {id(operands[k]) for k in facts[1:] if k < len(operands)}
        zeros = [t for t in wanted if id(t) not in reached]
    else:
        copy, zeros = True, wanted
    positions = [k for k, out in enumerate(results)
                 if isinstance(out, torch.Tensor) and (out.is_floating_point() or out.is_complex())]
    if not positions or not copy and not zeros and all(results[k].requires_grad for k in positions):
        return results
    tied = list(results)
    outs = _ZeroGradients.apply(copy, len(positions), *(results[k] for k in positions), *zeros)
    for k, out in zip(positions, outs):
        tied[k] = out
    return type(results)(tied) if isinstance(results, tuple) else tied


class _ZeroGradients(torch.autograd.Function):
    """The first `count` tensors given (a branch's floating results) passed through, each
    gradient passed back to its result, and zeros for the rest (operands the branch does not reach):
    added to whatever the branch gives them, the gradient eager's cond gives. Each result leaves as
    a copy where `copy` (the branch saved it for its backward), else detached: a Function's input
    returned as is becomes a view that refuses an in-place update, a detached alias does not (it
    shares the result's storage and version counter, as the branch's own result would)."""

    @staticmethod
    def forward(ctx: Any, copy: bool, count: int, *tensors: torch.Tensor) -> Any:
        ctx.layouts = [(t.shape, t.dtype, t.device) for t in tensors[count:]]
        return tuple(t.clone() if copy else t.detach() for t in tensors[:count])

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        return (None, None, *grads,
                *(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.layouts))


# ---------------------------------------------------------------------------------------------------
# A split as data (the artifact protocol's "split" kind)

# the functions a split's nodes may call, by the tag a record names them with (never by reference)
_FUNCTIONS: dict[str, Callable[..., Any]] = {"getitem": operator.getitem, "cond": run_cond, "while_loop": run_while}
# the submodule names split_module and capture's cond graphs give (a piece, a branch, a loop's functions)
_MODULE_NAME = re.compile(r"(submod|cond_true|cond_false|while_cond|while_body)_[0-9]{1,6}")
_NODE_NAME = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]{0,999}")  # no dunder: never a Python special name
_MAX_NODES = 10_000


@record_type
@dataclass(frozen=True)
class Use:
    """A node argument that is the value of the `index`-th node before it."""

    index: int


@record_type
@dataclass(frozen=True)
class SplitNode:
    """One node of a split's outer graph: `op` as torch.fx names it, its `name` (a placeholder's is
    the forward's parameter), `target` (a submodule's name, a tag of _FUNCTIONS, or ""), `args` of
    Use records, ints and tuples of them."""

    op: str
    name: str
    target: str
    args: tuple


class NotSplitData(ValueError):
    """A split that cannot be stored as data, or stored data that is not one (the caller compiles)."""


def persistable(split: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`split` (its pieces compiled, conds running through run_cond / run_while) made to follow the
    artifact protocol: its recipe is asked for when the frame cache stores the frame."""
    setattr(split, RECIPE_ATTR, lambda: split_recipe(split))
    return split


def split_recipe(split: torch.fx.GraphModule) -> Recipe | None:
    """The "split" recipe of `split`, or None when a node or a piece cannot travel (a graph reading
    a module's tensor, a piece without a recipe)."""
    try:
        return _describe(split)
    except NotSplitData:
        return None


def _describe(split: torch.fx.GraphModule) -> Recipe:
    index: dict[torch.fx.Node, int] = {}
    nodes: list[SplitNode] = []
    modules: dict[str, Recipe] = {}
    for node in split.graph.nodes:
        target = ""
        if node.op in ("call_module", "get_attr"):
            target = str(node.target)
            if target not in modules:
                modules[target] = _piece_recipe(split, target)
        elif node.op == "call_function":
            target = next((tag for tag, fn in _FUNCTIONS.items() if fn is node.target), "")
            if not target:
                raise NotSplitData(f"a split calls {node.target!r}")
        elif node.op != "placeholder" and node.op != "output":
            raise NotSplitData(f"a split node of kind {node.op}")
        if node.kwargs:
            raise NotSplitData("a split node with keyword arguments")
        index[node] = len(nodes)
        nodes.append(SplitNode(node.op, node.name, target, _encode(node.args, index)))
    recipe = Recipe("split", {"nodes": tuple(nodes), "modules": modules})
    _check(recipe.fields)  # what would not be read back is not stored
    return recipe


def _piece_recipe(split: torch.fx.GraphModule, name: str) -> Recipe:
    module = getattr(split, name, None)
    if isinstance(module, CompiledPiece):
        recipe = describe(module.compiled)
    elif isinstance(module, torch.fx.GraphModule):  # a piece holding a cond: its branches compiled
        recipe = _describe(module)
    else:
        recipe = None
    if recipe is None:
        raise NotSplitData(f"piece {name} has no recipe ({type(module).__name__})")
    return recipe


def _encode(value: Any, index: dict[torch.fx.Node, int]) -> Any:
    if isinstance(value, torch.fx.Node):
        return Use(index[value])
    if isinstance(value, (tuple, list)):  # operands and results: unpacked with * or returned, as tuples
        return tuple(_encode(v, index) for v in value)
    if type(value) is int:
        return value
    raise NotSplitData(f"a split node argument {type(value).__name__}")


def _uses(value: Any, nodes: Sequence[SplitNode], before: int) -> list[SplitNode]:
    """The nodes a stored argument refers to; NotSplitData for anything but Use records, ints and
    tuples of them, or a reference to a later node or to the output."""
    if type(value) is Use:
        if type(value.index) is not int or not 0 <= value.index < before or nodes[value.index].op == "output":
            raise NotSplitData("a split node argument that refers to no earlier node")
        return [nodes[value.index]]
    if type(value) is tuple:
        return [u for v in value for u in _uses(v, nodes, before)]
    if type(value) is int:
        return []
    raise NotSplitData(f"a split node argument {type(value).__name__}")


def _flat_uses(value: Any) -> bool:
    return type(value) is tuple and all(type(v) is Use for v in value)


def _check(fields: dict[str, Any]) -> None:
    """NotSplitData unless `fields` is a split as _describe writes one: placeholders first, then
    pieces called on node values, branch getters of named pieces, the cond and while_loop runners
    taking two getters each in their own argument shape, getitem with a literal index, one output
    last; every name a plain identifier (a placeholder's becomes a parameter of the generated
    forward), every piece a recipe, each stored piece used."""
    nodes, modules = fields.get("nodes"), fields.get("modules")
    if type(nodes) is not tuple or not nodes or len(nodes) > _MAX_NODES or type(modules) is not dict:
        raise NotSplitData("a split recipe without its nodes and pieces")
    if not all(type(k) is str and _MODULE_NAME.fullmatch(k) and isinstance(v, Recipe) for k, v in modules.items()):
        raise NotSplitData("a split piece with a foreign name or no recipe")
    names: set[str] = set()
    used: set[str] = set()
    for i, node in enumerate(nodes):
        if type(node) is not SplitNode or type(node.name) is not str or type(node.target) is not str \
                or type(node.args) is not tuple:
            raise NotSplitData("a split node that is not a record")
        if not _NODE_NAME.fullmatch(node.name) or keyword.iskeyword(node.name) or node.name in names \
                or node.name == "self":
            raise NotSplitData(f"a split node named {node.name!r:.60}")
        names.add(node.name)
        uses = _uses(node.args, nodes, i)
        if node.op == "placeholder":
            ok = not node.args and not node.target and all(n.op == "placeholder" for n in nodes[:i])
        elif node.op in ("call_module", "get_attr"):
            ok = node.target in modules and (_flat_uses(node.args) if node.op == "call_module" else not node.args)
            used.add(node.target)
        elif node.op == "call_function":
            ok = _call_ok(node, nodes)
        else:
            ok = node.op == "output" and i == len(nodes) - 1 and not node.target and len(node.args) == 1 \
                and (type(node.args[0]) is Use or _flat_uses(node.args[0]))
        getters = [u for u in uses if u.op == "get_attr"]
        if not ok or getters and node.target not in ("cond", "while_loop"):
            raise NotSplitData(f"a split node {node.op} {node.target!r:.60} out of the grammar")
    if nodes[-1].op != "output" or used != set(modules):
        raise NotSplitData("a split without its output, or with a piece it never uses")


def _call_ok(node: SplitNode, nodes: Sequence[SplitNode]) -> bool:
    args = node.args

    def getter(value: Any) -> bool:
        return type(value) is Use and nodes[value.index].op == "get_attr"

    def value(v: Any) -> bool:
        return type(v) is Use and not getter(v)

    if node.target == "getitem":
        return len(args) == 2 and value(args[0]) and type(args[1]) is int
    # a fifth argument: the two graphs' gradient facts and the operands they read (absent in a
    # split stored before them)
    facts_ok = len(args) == 4 or len(args) == 5 and _facts_ok(args[4])
    if node.target == "cond":
        return facts_ok and value(args[0]) and getter(args[1]) and getter(args[2]) \
            and _flat_uses(args[3]) and not any(getter(a) for a in args[3])
    if node.target == "while_loop":
        return facts_ok and getter(args[0]) and getter(args[1]) and all(
            _flat_uses(a) and not any(getter(u) for u in a) for a in args[2:4])
    return False


def _facts_ok(facts: Any) -> bool:
    """Two tuples of gradient facts (`gradient_facts`: each empty, or a 0/1 flag then input
    positions), then the positions of the operands either graph reads."""
    return type(facts) is tuple and len(facts) == 3 and all(
        type(f) is tuple and all(type(k) is int and k >= 0 for k in f) for f in facts) and all(
        not f or f[0] in (0, 1) for f in facts[:2])


@loader("split")
def _load(fields: dict[str, Any]) -> torch.fx.GraphModule:
    """The split a recipe describes: its nodes checked (_check), its pieces rebuilt from their own
    recipes, its forward generated by torch.fx from the checked nodes."""
    try:
        _check(fields)
    except NotSplitData as exc:
        raise ValueError(f"a split recipe refused: {exc}") from exc
    root = torch.nn.Module()
    for name, recipe in fields["modules"].items():
        piece = rebuild(recipe)
        root.add_module(name, piece if isinstance(piece, torch.fx.GraphModule) else CompiledPiece(piece, name))
    graph = torch.fx.Graph()
    made: list[torch.fx.Node] = []

    def decode(value: Any) -> Any:
        return made[value.index] if type(value) is Use else tuple(decode(v) for v in value) \
            if type(value) is tuple else value

    for node in fields["nodes"]:
        if node.op == "placeholder":
            made.append(graph.placeholder(node.name))
        elif node.op == "output":
            made.append(graph.output(decode(node.args[0])))
        else:
            target = _FUNCTIONS[node.target] if node.op == "call_function" else node.target
            made.append(graph.create_node(node.op, target, decode(node.args), {}, name=node.name))
    split = torch.fx.GraphModule(root, graph)
    recipe = Recipe("split", fields)
    setattr(split, RECIPE_ATTR, lambda: recipe)
    return split
