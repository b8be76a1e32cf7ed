"""Control-flow operators of `torch._higher_order_ops` during capture: cond, while_loop, map, scan
and associative_scan (and `torch.cond`).

Each is traced into the one graph by running its body functions inline, where that gives eager's
result:
- `cond` with a predicate known at trace time (a Python bool, a size comparison, a tensor whose
  value capture knows) inlines the branch taken; a predicate that depends on tensor data makes a
  graph-level cond whose branches are subgraphs (cond_graph.py), as torch.compile keeps it.
- `while_loop` is unrolled while its predicate is known at trace time (a counter made in the
  frame: constant folding knows it); a data-dependent predicate over tensor carries makes a
  graph-level while_loop (cond_graph.py), as torch.compile keeps it.
- `map` and `scan` are unrolled over the static length of their scanned dim (a dynamic length is
  specialized and guarded), one call of the body per slice, as eager's implementations run them.
- `associative_scan` (combine_mode="generic", the CPU mode) follows eager's algorithm: log-depth
  rounds of combine calls on every other element. The combine runs on whole batches of elements,
  as eager's vmap runs it, when a trial shows it is elementwise (pointwise ops only, the same
  graph at two batch sizes); any other combine is called once per element in the same order.
Eager's checks are kept: a body that returns an alias of an input or writes one in place, or whose
carry changes shape or dtype, is a break, so the call raises eager's error natively.
Corresponds to torch/_dynamo/variables/higher_order_ops.py.
"""
from __future__ import annotations

import inspect
import operator
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._higher_order_ops.associative_scan import associative_scan
from torch._higher_order_ops.cond import cond
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

from kiln.capture.sources import Source
from kiln.capture.variables import cond_graph
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.exception import RaisedInTrace
from kiln.capture.variables.sequence import ListVariable, TupleVariable
from kiln.capture.variables.symint import SymIntVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer

_NAMES = {cond: "cond", while_loop: "while_loop", hop_map: "map", scan: "scan", associative_scan: "associative_scan"}
_MAX_ITERATIONS = 1024  # an unrolled while_loop longer than this is not worth a graph
_MAX_ELEMENTS = 4096  # a map/scan/per-element associative_scan over more slices than this breaks


def is_higher_order_function(value: Any) -> bool:
    try:
        return value in _NAMES
    except TypeError:  # unhashable
        return False


def _break(what: str, why: str) -> Unsupported:
    return Unsupported(f"{what}: {why}", kind="higher_order")


class HigherOrderFunctionVariable(Variable):
    """One of the control-flow functions; calling it traces its body functions inline."""

    def __init__(self, fn: Any, source: Source | None = None) -> None:
        self.fn = fn
        self.source = source
        self.name = _NAMES[fn]

    def describe(self) -> str:
        return f"torch._higher_order_ops.{self.name}"

    def python_type(self) -> type:
        return type(self.fn)

    def as_python_value(self) -> Any:
        return self.fn

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise _break(self.name, f"{exc} (raised natively)") from exc
        bound.apply_defaults()
        a = {k: _as_variable(tx, v) for k, v in bound.arguments.items()}
        rules: dict[str, Callable[..., Variable]] = {
            "cond": _cond, "while_loop": _while_loop, "map": _map, "scan": _scan,
            "associative_scan": _associative_scan}
        return rules[self.name](tx, **a)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return self.source.name() if self.source is not None else glue.constant(self.fn)


# ------------------------------------------------------------------------------ shared helpers

def _as_variable(tx: "Tracer", value: Any) -> Variable:
    """A bound argument as a Variable: `*args` bind as a tuple of Variables, defaults as values."""
    if isinstance(value, Variable):
        return value
    if isinstance(value, tuple) and all(isinstance(v, Variable) for v in value):
        return TupleVariable(list(value))
    return tx.wrap(value, None)


def _flatten(tx: "Tracer", tree: Variable) -> tuple[list[Variable], Variable]:
    """Leaves and TreeSpec of a tree, through the tracer's pytree (kiln/capture/variables/pytree.py)."""
    leaves, spec = tx.iterate(tx.wrap(pytree.tree_flatten, None).call(tx, [tree], {}))
    return tx.iterate(leaves), spec


def _unflatten(tx: "Tracer", leaves: Sequence[Variable], spec: Variable) -> Variable:
    return tx.wrap(pytree.tree_unflatten, None).call(tx, [ListVariable(leaves), spec], {})


def _op(tx: "Tracer", target: Any, *args: Any, **kwargs: Any) -> TensorVariable:
    """One graph op making a tensor (the data movement around the bodies: select, stack, movedim)."""
    wrap = lambda v: v if isinstance(v, Variable) else tx.wrap_result(v)  # noqa: E731
    out = tx.call_op("call_function", target, [wrap(a) for a in args], {k: wrap(v) for k, v in kwargs.items()})
    assert isinstance(out, TensorVariable), out
    return out


def _tensors(what: str, leaves: list[Variable], role: str) -> list[TensorVariable]:
    for leaf in leaves:
        if not isinstance(leaf, TensorVariable):
            raise _break(what, f"{role} must be tensors, got {leaf.describe()} (raised natively)")
    return [leaf for leaf in leaves if isinstance(leaf, TensorVariable)]


def _static_length(tx: "Tracer", size: Any, what: str) -> int:
    """A scanned dim's length as an int: a dynamic one is specialized (the ShapeEnv guards it)."""
    n = int(size)
    if n > _MAX_ELEMENTS:
        raise _break(what, f"unrolling {n} slices (more than {_MAX_ELEMENTS})")
    return n


def _call_body(tx: "Tracer", what: str, fn: Variable, args: list[Variable], inputs: Sequence[Variable],
               kwargs: dict[str, Variable] | None = None, aliases_ok: bool = False,
               writes_ok: bool = False) -> Variable:
    """Call a body function, with eager's checks on what it does to its tensor inputs: no output
    may alias one (unless `aliases_ok`: vmap's body may), none may be written in place (unless
    `writes_ok`: vmap's body may; torch rejects both for the other higher-order ops)."""
    tensors = [i for i in inputs if isinstance(i, TensorVariable)]
    versions = [version_of(t.example) for t in tensors]
    tx.side_effects.open_body()
    try:
        out = fn.call(tx, args, kwargs or {})
    except Unsupported as exc:
        if exc.kind == "higher_order" or isinstance(exc, RaisedInTrace):
            raise  # already a reason of ours, or the body raised: the exception leaves the call as it is
        tx.state.innermost = tx
        raise _break(what, f"its body cannot be traced ({exc.reason}); the call runs eagerly") from exc
    finally:
        # writes the body undid itself (functional_call's swap of a module's parameters) are no change
        unchanged = tx.side_effects.close_body()
    if not writes_ok and any(version_of(t.example) != v for t, v in zip(tensors, versions)):
        raise _break(what, "its body writes an input in place (eager raises)")
    if not unchanged:
        raise _break(what, "its body changes state outside the function")
    for leaf in [] if aliases_ok else _flatten(tx, out)[0]:
        if isinstance(leaf, TensorVariable) and any(_is_alias_of(leaf.example, t.example) for t in tensors):
            raise _break(what, "its body returns an alias of an input (eager raises)")
    return out


def version_of(t: torch.Tensor) -> int | None:
    """A tensor's version counter; None for an inference tensor, which has none (nor can be
    written outside inference mode)."""
    return None if t.is_inference() else t._version


def _is_alias_of(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch._C._is_alias_of(a, b))  # type: ignore[attr-defined]  # not in torch's stubs


def _known_truth(tx: "Tracer", pred: Variable, what: str) -> bool | None:
    """The value of a predicate when capture knows it (and guards it); None when it depends on data."""
    if isinstance(pred, TensorVariable):
        if pred.constant is None:
            return None
        tx.output.guards.extend(pred.constant_guards)
        return bool(pred.constant)
    if isinstance(pred, SymIntVariable) or pred.is_constant():
        return pred.truth(tx)
    raise _break(what, f"a predicate of type {pred.describe()} (raised natively)")


def _same_meta(a: Variable, b: Variable) -> bool:
    if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
        ea, eb = a.example, b.example
        return ea.shape == eb.shape and ea.dtype == eb.dtype and ea.device == eb.device
    return type(a) is type(b) or not (isinstance(a, TensorVariable) or isinstance(b, TensorVariable))


# ------------------------------------------------------------------------------ cond and while_loop

def _cond(tx: "Tracer", pred: Variable, true_fn: Variable, false_fn: Variable, operands: Variable) -> Variable:
    if pred.is_constant() and isinstance(pred.as_constant(), (bool, int, float)):
        # a Python number: eager calls the branch directly, without checking the operands
        branch = true_fn if pred.as_constant() else false_fn
        return branch.call(tx, tx.iterate(operands), {})
    if not isinstance(pred, (TensorVariable, SymIntVariable)):
        raise _break("cond", f"the predicate must be a bool or a tensor, got {pred.describe()} (raised natively)")
    if not isinstance(operands, (TupleVariable, ListVariable)):
        raise _break("cond", "operands must be a tuple or list (raised natively)")
    leaves = _tensors("cond", _flatten(tx, operands)[0], "operands")
    if isinstance(pred, TensorVariable) and pred.example.numel() != 1:
        raise _break("cond", "the predicate must be a bool or a one-element tensor (raised natively)")
    taken = _known_truth(tx, pred, "cond")
    if taken is None:
        assert isinstance(pred, TensorVariable)
        return _graph_cond(tx, pred, true_fn, false_fn, operands, leaves)
    # eager traces both branches and requires their outputs to agree: the other branch is traced
    # for that check, and what it recorded is dropped
    graph = tx.output.graph
    before = set(graph.nodes)
    other = _call_body(tx, "cond", false_fn if taken else true_fn, tx.iterate(operands), list(leaves))
    other_leaves = _flatten(tx, other)[0]
    for node in reversed(list(graph.nodes)):
        if node not in before and node.op != "placeholder":
            graph.erase_node(node)
    out = _call_body(tx, "cond", true_fn if taken else false_fn, tx.iterate(operands), list(leaves))
    out_leaves = _flatten(tx, out)[0]
    if len(out_leaves) != len(other_leaves) or not all(_same_meta(a, b) for a, b in zip(out_leaves, other_leaves)):
        raise _break("cond", "its branches return different structures or tensor metadata (raised natively)")
    return out


def _graph_cond(tx: "Tracer", pred: TensorVariable, true_fn: Variable, false_fn: Variable, operands: Variable,
                leaves: list[TensorVariable]) -> Variable:
    """A predicate that depends on data: both branches traced, then moved into subgraphs of one
    graph-level cond (kiln/capture/variables/cond_graph.py), decided when the graph runs."""
    graph = tx.output.graph
    traced = []
    for fn in (true_fn, false_fn):
        before = set(graph.nodes)
        out_leaves, spec = _flatten(tx, _call_body(tx, "cond", fn, tx.iterate(operands), list(leaves)))
        nodes = [n for n in graph.nodes if n not in before and n.op != "placeholder"]
        results = _tensors("cond", out_leaves, "branch outputs")
        traced.append((nodes, results, spec))
    (t_nodes, t_out, t_spec), (f_nodes, f_out, f_spec) = traced
    if (len(t_out) != len(f_out) or t_spec.as_python_value() != f_spec.as_python_value()
            or not all(_same_meta(a, b) for a, b in zip(t_out, f_out))):
        raise _break("cond", "its branches return different structures or tensor metadata (raised natively)")
    outside = cond_graph.outside_inputs([t_nodes, f_nodes], [leaf.node for leaf in leaves])
    for nodes, results, _ in traced:
        _no_returned_input("cond", "a branch", nodes, results, outside)
    made = _result_fakes(tx, t_out, f_out)
    node = cond_graph.insert_cond(tx.output, pred.node, [leaf.node for leaf in leaves],
                                  [(t_nodes, [r.node for r in t_out]), (f_nodes, [r.node for r in f_out])],
                                  tuple(made))
    return _unflatten(tx, tx.iterate(tx.wrap_op_result(node, tuple(made))), t_spec)


def _while_loop(tx: "Tracer", cond_fn: Variable, body_fn: Variable, carried_inputs: Variable) -> Variable:
    if not isinstance(carried_inputs, (TupleVariable, ListVariable)):
        raise _break("while_loop", "carried_inputs must be a tuple or list (raised natively)")
    for leaf in _flatten(tx, carried_inputs)[0]:
        if not (isinstance(leaf, (TensorVariable, SymIntVariable))
                or isinstance(leaf, ConstantVariable) and isinstance(leaf.value, int)):
            raise _break("while_loop", "carried inputs must be tensors or ints (raised natively)")
    carried: Variable = carried_inputs
    for iteration in range(_MAX_ITERATIONS + 1):
        items = tx.iterate(carried)
        before = set(tx.output.graph.nodes)
        pred = cond_fn.call(tx, items, {})
        if isinstance(pred, TensorVariable) and not (pred.example.dim() == 0 and pred.example.dtype == torch.bool):
            raise _break("while_loop", "cond_fn must return a boolean scalar tensor or a bool (raised natively)")
        go = _known_truth(tx, pred, "while_loop")
        if go is None:
            for node in reversed([n for n in tx.output.graph.nodes if n not in before and n.op != "placeholder"]):
                tx.output.graph.erase_node(node)  # traced again below, into cond_fn's subgraph
            return _graph_while(tx, cond_fn, body_fn, carried)
        if not go:
            if iteration == 0:  # eager returns copies of the inputs
                leaves, spec = _flatten(tx, carried)
                return _unflatten(tx, [_op(tx, torch.clone, v) if isinstance(v, TensorVariable) else v
                                       for v in leaves], spec)
            return carried
        if iteration == _MAX_ITERATIONS:
            break
        new = _call_body(tx, "while_loop", body_fn, items, _flatten(tx, carried)[0])
        new_items = tx.iterate(new)
        if len(new_items) != len(items) or not all(_same_meta(a, b) for a, b in
                                                   zip(_flatten(tx, new)[0], _flatten(tx, carried)[0])):
            raise _break("while_loop", "body_fn's outputs differ from carried_inputs in structure or metadata "
                                       "(raised natively)")
        carried = new
    raise _break("while_loop", f"more than {_MAX_ITERATIONS} iterations to unroll")


def _graph_while(tx: "Tracer", cond_fn: Variable, body_fn: Variable, carried: Variable) -> Variable:
    """A predicate that depends on data: cond_fn and body_fn traced once each, then moved into the
    subgraphs of one graph-level while_loop (cond_graph.py), run until the predicate is false."""
    graph = tx.output.graph
    leaves, spec = _flatten(tx, carried)
    if not all(isinstance(leaf, TensorVariable) for leaf in leaves):
        raise _break("while_loop", "its predicate depends on tensor data and it carries a number; the call "
                                   "runs eagerly")
    tensors = _tensors("while_loop", leaves, "carried inputs")
    traced = []
    for fn in (cond_fn, body_fn):
        before = set(graph.nodes)
        out = _flatten(tx, _call_body(tx, "while_loop", fn, tx.iterate(carried), list(tensors)))[0]
        traced.append(([n for n in graph.nodes if n not in before and n.op != "placeholder"], out))
    (cond_nodes, pred), (body_nodes, new) = traced
    if len(pred) != 1 or not isinstance(pred[0], TensorVariable) or pred[0].node not in cond_nodes:
        raise _break("while_loop", "cond_fn must return a boolean scalar tensor or a bool (raised natively)")
    if len(new) != len(tensors) or not all(_same_meta(a, b) for a, b in zip(new, tensors)):
        raise _break("while_loop", "body_fn's outputs differ from carried_inputs in structure or metadata "
                                   "(raised natively)")
    results = _tensors("while_loop", new, "body_fn's outputs")
    outside = cond_graph.outside_inputs([cond_nodes, body_nodes], [leaf.node for leaf in tensors])
    _no_returned_input("while_loop", "body_fn", body_nodes, results, outside)
    made = _result_fakes(tx, tensors, results)
    node = cond_graph.insert_while_loop(tx.output, [leaf.node for leaf in tensors], (cond_nodes, pred[0].node),
                                        (body_nodes, [r.node for r in results]), tuple(made))
    return _unflatten(tx, tx.iterate(tx.wrap_op_result(node, tuple(made))), spec)


# ------------------------------------------------------------------------------ map and scan

def _map(tx: "Tracer", f: Variable, xs: Variable, args: Variable) -> Variable:
    flat_xs, xs_spec = _flatten(tx, xs)
    leaves = _tensors("map", flat_xs, "mapped xs")
    _tensors("map", _flatten(tx, args)[0], "extra arguments")
    if any(leaf.example.dim() == 0 for leaf in leaves):
        raise _break("map", "mapped xs must have a leading dim (raised natively)")
    sizes = {int(leaf.example.shape[0]) for leaf in leaves}
    if len(sizes) != 1 or 0 in sizes:
        raise _break("map", "mapped xs need one non-zero leading size (raised natively)")
    n = _static_length(tx, leaves[0].example.shape[0], "map")
    marker = _last_node(tx)
    results = []
    for i in range(n):
        slices = [_op(tx, torch.select, leaf, 0, i) for leaf in leaves]
        out = _call_body(tx, "map", f, [_unflatten(tx, slices, xs_spec), *tx.iterate(args)], slices)
        results.append(_flatten(tx, out))
    return _zero_grads_of_operands(tx, marker, [*leaves, *_flatten(tx, args)[0]], _stack(tx, "map", results))


def _stack(tx: "Tracer", what: str, results: list[tuple[list[Variable], Variable]]) -> Variable:
    """Outputs of every slice stacked along a new dim 0, in the first output's structure."""
    first, spec = results[0]
    columns = []
    for k in range(len(first)):
        column = [leaves[k] for leaves, _ in results]
        _tensors(what, column, "outputs")
        columns.append(_op(tx, torch.stack, ListVariable(column), 0))
    if any(len(leaves) != len(first) for leaves, _ in results):
        raise _break(what, "the body returns different structures for different slices (raised natively)")
    return _unflatten(tx, columns, spec)


def _scan(tx: "Tracer", combine_fn: Variable, init: Variable, xs: Variable, dim: Variable,
          reverse: Variable) -> Variable:
    init_leaves, init_spec = _flatten(tx, init)
    flat_xs, xs_spec = _flatten(tx, xs)
    if not flat_xs:
        return TupleVariable([init, ListVariable([])])
    if not init_leaves:
        raise _break("scan", "init needs at least one leaf (raised natively)")
    _tensors("scan", init_leaves, "init leaves")
    leaves = _tensors("scan", flat_xs, "xs leaves")
    d, backwards = dim.as_constant(), reverse.as_constant()
    if not isinstance(d, int) or not isinstance(backwards, bool):
        raise _break("scan", "dim must be an int and reverse a bool (raised natively)")
    ndim = leaves[0].example.dim()
    if not -ndim <= d < ndim or any(leaf.example.dim() <= d % ndim or leaf.example.shape[d] == 0 for leaf in leaves):
        raise _break("scan", "every xs leaf needs a non-empty dim to scan (raised natively)")
    d %= ndim
    marker = _last_node(tx)
    moved = [leaf if d == 0 else _op(tx, torch.movedim, leaf, d, 0) for leaf in leaves]
    if backwards:
        moved = [_op(tx, torch.flip, leaf, [0]) for leaf in moved]
    n = _static_length(tx, moved[0].example.shape[0], "scan")
    carry, carry_spec = list(init_leaves), init_spec
    ys: list[tuple[list[Variable], Variable]] = []
    for i in range(n):
        slices = [_op(tx, torch.select, leaf, 0, i) for leaf in moved]
        out = _call_body(tx, "scan", combine_fn,
                         [_unflatten(tx, carry, carry_spec), _unflatten(tx, slices, xs_spec)], [*carry, *slices])
        parts = tx.iterate(out)
        if len(parts) != 2:
            raise _break("scan", "combine_fn must return (next carry, output) (raised natively)")
        returned = [leaf for leaf in _flatten(tx, out)[0] if isinstance(leaf, TensorVariable)]
        if any(_is_alias_of(a.example, b.example) for k, a in enumerate(returned) for b in returned[k + 1:]):
            raise _break("scan", "combine_fn returns two results that alias each other (eager raises)")
        new_carry, carry_spec = _flatten(tx, parts[0])
        if len(new_carry) != len(init_leaves) or not all(_same_meta(a, b) for a, b in zip(new_carry, init_leaves)):
            raise _break("scan", "the carry combine_fn returns differs from init in structure or metadata "
                                 "(raised natively)")
        carry = new_carry
        ys.append(_flatten(tx, parts[1]))
    stacked_leaves, ys_spec = _flatten(tx, _stack(tx, "scan", ys))
    if backwards:
        stacked_leaves = [_op(tx, torch.flip, y, [0]) for y in stacked_leaves]
    if d != 0:
        stacked_leaves = [_op(tx, torch.movedim, y, 0, d) if isinstance(y, TensorVariable) and d < y.example.dim()
                          else y for y in stacked_leaves]
    result = TupleVariable([_unflatten(tx, carry, carry_spec), _unflatten(tx, stacked_leaves, ys_spec)])
    return _zero_grads_of_operands(tx, marker, [*init_leaves, *leaves], result)


# Eager runs map and scan as one autograd Function over their operands and every tensor the body
# reads (its lifted closure): each of them that requires grad gets a gradient, zeros where no
# result depends on it differentiably (the body ignores it, or reads it through .detach()). The
# unrolled trace has no such Function, so those tensors are tied to each result by a zero that
# carries their gradient: `r - sum(t.flatten()[0:0])` is r to the bit (x - 0.0 is x, -0.0 and
# inf and nan included) and gives t exactly zeros. A tensor read only for its sizes is no operand.
_SIZE_QUERIES = frozenset({"size", "stride", "dim", "numel", "storage_offset", "is_contiguous",
                           torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default})


def _last_node(tx: "Tracer") -> torch.fx.Node | None:
    return next(iter(reversed(tx.output.graph.nodes)), None)


def _body_reads(tx: "Tracer", marker: torch.fx.Node | None) -> list[TensorVariable]:
    """Tensors made before `marker` (or placeholders lifted since) that the ops after it consume."""
    graph = tx.output.graph
    made = []
    node = marker.next if marker is not None else next(iter(graph.nodes), None)
    while node is not None and node.op != "root":
        if node.op != "placeholder":
            made.append(node)
        node = node.next
    inside = set(made)
    reads: dict[torch.fx.Node, TensorVariable] = {}
    for node in made:
        if node.target in _SIZE_QUERIES:
            continue
        for arg in node.all_input_nodes:
            example = arg.meta.get("example_value")
            if arg not in inside and arg not in reads and isinstance(example, torch.Tensor):
                reads[arg] = TensorVariable(arg, example)
    return list(reads.values())


def _zero_grads_of_operands(tx: "Tracer", marker: torch.fx.Node | None, operands: Sequence[Variable],
                            result: Variable) -> Variable:
    tied: dict[torch.fx.Node, TensorVariable] = {}
    for t in [*operands, *_body_reads(tx, marker)]:
        if isinstance(t, TensorVariable) and t.example.requires_grad and t.example.is_floating_point():
            tied.setdefault(t.node, t)
    if not tied or not torch.is_grad_enabled():
        return result
    leaves, spec = _flatten(tx, result)
    for k, leaf in enumerate(leaves):
        if isinstance(leaf, TensorVariable) and leaf.example.is_floating_point():
            zeros = [_op(tx, torch.sum, _op(tx, torch.narrow, _op(tx, torch.flatten, t), 0, 0, 0),
                         dtype=leaf.example.dtype) for t in tied.values()]
            total = zeros[0]
            for z in zeros[1:]:
                total = _op(tx, torch.add, total, z)
            leaves[k] = _op(tx, torch.sub, leaf, total)
    return _unflatten(tx, leaves, spec)


# ------------------------------------------------------------------------------ associative_scan

def _associative_scan(tx: "Tracer", combine_fn: Variable, xs: Variable, dim: Variable, reverse: Variable,
                      combine_mode: Variable) -> Variable:
    flat_xs, spec = _flatten(tx, xs)
    if not flat_xs:
        raise _break("associative_scan", "expected at least one xs leaf (raised natively)")
    leaves = _tensors("associative_scan", flat_xs, "xs leaves")
    mode, d, backwards = combine_mode.as_constant(), dim.as_constant(), reverse.as_constant()
    if mode == "pointwise":
        raise _break("associative_scan", "combine_mode='pointwise' needs CUDA or XPU tensors (raised natively)")
    if mode != "generic" or not isinstance(d, int) or not isinstance(backwards, bool):
        raise _break("associative_scan", "invalid combine_mode, dim or reverse (raised natively)")
    ndim = leaves[0].example.dim()
    if ndim == 0 or not -ndim <= d < ndim or any(leaf.example.dim() <= d % ndim for leaf in leaves):
        raise _break("associative_scan", "every xs leaf needs the scanned dim (raised natively)")
    d %= ndim
    if any(leaf.example.shape[d] == 0 for leaf in leaves):
        raise _break("associative_scan", "the scanned dim must not be empty (raised natively)")
    moved = [_op(tx, torch.movedim, leaf, d, 0) for leaf in leaves]
    if backwards:
        moved = [_op(tx, torch.flip, leaf, [0]) for leaf in moved]
    n = int(moved[0].example.shape[0])  # the rounds follow the length: a dynamic one is specialized

    def combine(left: Sequence[Variable], right: Sequence[Variable]) -> list[TensorVariable]:
        out = _call_body(tx, "associative_scan", combine_fn,
                         [_unflatten(tx, left, spec), _unflatten(tx, right, spec)], [])
        result = _tensors("associative_scan", _flatten(tx, out)[0], "combine_fn's outputs")
        if len(result) != len(left):
            raise _break("associative_scan", "combine_fn returns a different number of leaves (raised natively)")
        return result

    if _elementwise(tx, combine, moved):
        out = _batched_scan(tx, combine, moved)
    else:
        _static_length(tx, n, "associative_scan")
        per_element = _element_scan(combine, [[_op(tx, torch.select, leaf, 0, i) for leaf in moved] for i in range(n)])
        out = [_op(tx, torch.stack, ListVariable([e[k] for e in per_element]), 0) for k in range(len(moved))]
    if backwards:
        out = [_op(tx, torch.flip, leaf, [0]) for leaf in out]
    return _unflatten(tx, [_op(tx, torch.movedim, leaf, 0, d) for leaf in out], spec)


Combine = Callable[[Sequence[Variable], Sequence[Variable]], list[TensorVariable]]


def _slice(tx: "Tracer", t: Variable, start: int, stop: int | None, step: int = 1) -> TensorVariable:
    return _op(tx, torch.ops.aten.slice.Tensor, t, 0, start, stop, step)


def _batched_scan(tx: "Tracer", combine: Combine, elems: list[TensorVariable]) -> list[TensorVariable]:
    """Eager's generic_associative_scan along dim 0: pairs of neighbours combined in one call per
    round, the odd positions scanned recursively, then the even ones from them."""
    n = int(elems[0].example.shape[0])
    if n < 2:
        return elems
    odd = _batched_scan(tx, combine, combine([_slice(tx, e, 0, -1, 2) for e in elems],
                                             [_slice(tx, e, 1, None, 2) for e in elems]))
    lefts = [_slice(tx, o, 0, -1) for o in odd] if n % 2 == 0 else odd
    even = combine(lefts, [_slice(tx, e, 2, None, 2) for e in elems])
    even = [_op(tx, torch.cat, ListVariable([_slice(tx, e, 0, 1), r]), 0) if int(r.example.shape[0]) > 0
            else _slice(tx, e, 0, 1) for e, r in zip(elems, even)]
    return [_interleave(tx, a, b, n) for a, b in zip(even, odd)]


def _interleave(tx: "Tracer", even: TensorVariable, odd: TensorVariable, n: int) -> TensorVariable:
    """even[0], odd[0], even[1], odd[1], ... (n items; `odd` one shorter when n is odd)."""
    if int(even.example.shape[0]) == int(odd.example.shape[0]) + 1:
        odd = _op(tx, torch.cat, ListVariable([odd, _slice(tx, even, 0, 1)]), 0)  # a filler, sliced off below
    both = _op(tx, torch.stack, ListVariable([even, odd]), 1)
    return _slice(tx, _op(tx, torch.flatten, both, 0, 1), 0, n)


def _element_scan(combine: Combine, elems: list[list[TensorVariable]]) -> list[list[TensorVariable]]:
    """The same rounds as `_batched_scan`, one combine call per element (each element a leaf list)."""
    n = len(elems)
    if n < 2:
        return elems
    odd = _element_scan(combine, [combine(elems[i], elems[i + 1]) for i in range(0, n - 1, 2)])
    lefts = odd[:-1] if n % 2 == 0 else odd
    even = [elems[0]] + [combine(o, e) for o, e in zip(lefts, elems[2::2])]
    return [even[i // 2] if i % 2 == 0 else odd[i // 2] for i in range(n)]


# Elementwise ops whose result for a batch of elements is the batch of their results
_CONVERSIONS = frozenset({"float", "double", "half", "bfloat16", "int", "long", "bool", "to", "type_as"})
_OPERATORS = frozenset({operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
                        operator.mod, operator.pow, operator.neg, operator.pos, operator.abs, operator.and_,
                        operator.or_, operator.xor, operator.invert, operator.lt, operator.le, operator.gt,
                        operator.ge, operator.eq, operator.ne, operator.iadd, operator.imul, operator.isub,
                        operator.itruediv})


def _is_pointwise(node: torch.fx.Node) -> bool:
    target = node.target
    if target in _OPERATORS or (node.op == "call_method" and target in _CONVERSIONS):
        return True
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    packet = getattr(torch.ops.aten, name.rstrip("_") if node.op == "call_method" else name, None)
    overloads = packet.overloads() if isinstance(packet, torch._ops.OpOverloadPacket) else []
    return bool(overloads) and torch.Tag.pointwise in getattr(packet, overloads[0]).tags


def _elementwise(tx: "Tracer", combine: Combine, elems: Sequence[TensorVariable]) -> bool:
    """Whether calling the combine on batches of elements gives the batch of its per-element results
    (what eager's vmap gives): a trial on one element and on a batch of an unusual size must record
    the same pointwise ops with the same constants, on tensors no wider than an element. The trial's
    nodes are dropped."""
    ndim = elems[0].example.dim() - 1
    if any(e.example.dim() - 1 != ndim for e in elems):
        return False
    batch = 2 + max([int(s) for e in elems for s in e.example.shape[1:]] + [1])
    graph = tx.output.graph
    start = set(graph.nodes)
    try:
        single = [_op(tx, torch.select, e, 0, 0) for e in elems]
        alone = _trial(tx, combine, single, single, ndim)
        wide = [_op(tx, torch.Tensor.expand, s, batch, *s.example.shape) for s in single]
        batched = _trial(tx, combine, wide, wide, ndim + 1)
        return alone is not None and alone == batched
    except Unsupported:
        return False
    finally:
        for node in reversed(list(graph.nodes)):
            if node not in start and node.op != "placeholder":
                graph.erase_node(node)


def _trial(tx: "Tracer", combine: Combine, left: Sequence[TensorVariable], right: Sequence[TensorVariable],
           width: int) -> list[tuple] | None:
    """The combine's recorded ops, as comparable signatures; None if one is not elementwise."""
    graph = tx.output.graph
    before = set(graph.nodes)
    inputs = {v.node: k for k, v in enumerate([*left, *right]) if isinstance(v, TensorVariable)}
    combine(left, right)
    made = [n for n in graph.nodes if n not in before and n.op != "placeholder"]
    index = {n: k for k, n in enumerate(made)}
    signature = []
    for node in made:
        if not _is_pointwise(node):
            return None
        values = [node.meta.get("example_value")] + [a.meta.get("example_value") for a in node.all_input_nodes]
        if any(isinstance(v, torch.Tensor) and v.dim() > width for v in values):
            return None

        def name(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                return ("input", inputs[a]) if a in inputs else ("op", index[a]) if a in index else ("outer", a.name)
            return a
        signature.append((node.op, node.target, tuple(torch.fx.node.map_aggregate(node.args, name)),
                          tuple(sorted((k, torch.fx.node.map_aggregate(v, name)) for k, v in node.kwargs.items()))))
    return signature


def _no_returned_input(op: str, who: str, nodes: Any, results: Sequence[Any], outside: Sequence[Any]) -> None:
    """Break (eager raises) where a branch or body returns one of its inputs or an alias of one."""
    examples = [n.meta.get("example_value") for n in outside]
    if cond_graph.branch_results(nodes, results) is None or any(
            isinstance(e, torch.Tensor) and _is_alias_of(r.example, e) for r in results for e in examples):
        raise _break(op, f"{who} returns an input or an alias of one (raised natively)")


def _result_fakes(tx: Any, firsts: Sequence[Any], seconds: Sequence[Any]) -> tuple:
    """The op's results as fresh fakes (not a branch's own): each needs grad where either side's does."""
    made = []
    for a, b in zip(firsts, seconds):
        source = b.example if b.example.requires_grad and not a.example.requires_grad else a.example
        made.append(tx.output.run_fake("call_function", torch.clone, (source,), {}))
    return tuple(made)
