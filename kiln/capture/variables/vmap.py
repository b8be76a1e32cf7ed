"""`torch.vmap` (`torch.func.vmap`) during capture: the mapped function traced once, on one sample.

`torch.vmap(fn, in_dims, out_dims)` is inlined down to the `vmap_impl(fn, in_dims, out_dims,
randomness, chunk_size, *args, **kwargs)` call its wrapper makes (a wrapper made in the frame, or
one made at import, as `@torch.vmap` leaves it); that call is this variable's. The body `fn` is
traced on one sample of each batched argument (`select(x, dim, 0)`), with eager's checks on bodies
(no state changed outside the function: kiln/capture/variables/higher_order.py's `_call_body`), then
moved out of the frame's graph into a subgraph (cond_graph.py) that takes the samples and every
other value the body reads (closed-over tensors, parameters, sizes). One node replaces the call:
`run_vmap(subgraph, in_dims, out_dims, randomness, chunk_size, *inputs)`, torch.vmap of the
subgraph over the real batched arguments, the closed-over values unbatched. AOT autograd traces
through it as through eager's vmap (its batching rules give the batched ATen ops), so the lowering
sees ordinary ops. Out_dims capture cannot map onto the flat outputs (a nested spec, a None for
an output) make a break: the call runs eagerly.
Corresponds to the functorch vmap support in torch/_dynamo/variables/higher_order_ops.py.
"""
from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree

from kiln.capture.sources import Source
from kiln.capture.variables import cond_graph
from kiln.capture.variables.base import Variable
from kiln.capture.variables.higher_order import _as_variable, _call_body, _flatten, _op, _unflatten, version_of
from kiln.capture.variables.pytree import TreeSpecVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer


def is_vmap_impl(value: Any) -> bool:
    """functorch's vmap_impl, known by name (Kiln does not import torch._functorch; the builder guards
    the function's identity)."""
    return isinstance(value, types.FunctionType) and value.__module__ == "torch._functorch.vmap" \
        and value.__qualname__ == "vmap_impl"


def run_vmap(body: torch.fx.GraphModule, in_dims: tuple, out_dims: tuple, randomness: str,
             chunk_size: int | None, *inputs: Any) -> Any:
    """What a graph's vmap node runs: the traced body under torch.vmap."""
    return torch.vmap(body, in_dims=in_dims, out_dims=out_dims, randomness=randomness,
                      chunk_size=chunk_size)(*inputs)


def run_vmap_writing(body: torch.fx.GraphModule, in_dims: tuple, out_dims: tuple, randomness: str,
                     chunk_size: int | None, *inputs: Any) -> Any:
    """run_vmap of a body that writes a batched argument in place (eager allows it): the node stays
    in the graph when nothing reads its result."""
    return run_vmap(body, in_dims, out_dims, randomness, chunk_size, *inputs)


run_vmap_writing.kiln_side_effect = True  # type: ignore[attr-defined]


def _break(why: str) -> Unsupported:
    return Unsupported(f"torch.vmap: {why}", kind="higher_order")


def _constant(v: Variable, what: str) -> Any:
    if not v.is_constant():
        raise _break(f"{what} is {v.describe()}, not a value capture knows; the call runs eagerly")
    return v.as_constant()


def _leaf_dims(tx: "Tracer", args: Sequence[Variable], in_dims: Any) -> tuple[list[list[Variable]], list[Any], list[list[Any]]]:
    """Each positional argument's leaves, spec and per-leaf batch dim (None: not batched): in_dims
    is an int or a tuple with a prefix of each argument's structure (a dict of dims for a dict), as
    eager broadcasts it."""
    if not isinstance(in_dims, (int, tuple)):
        raise _break(f"in_dims of type {type(in_dims).__name__} (raised natively)")
    leaves, specs = [], []
    for arg in args:
        flat, spec = _flatten(tx, arg)
        leaves.append(flat)
        specs.append(spec)
    if isinstance(in_dims, tuple) and len(in_dims) != len(args):
        raise _break(f"in_dims has {len(in_dims)} entries for {len(args)} arguments (raised natively)")
    whole = pytree.TreeSpec(tuple, None, [spec.spec for spec in specs if isinstance(spec, TreeSpecVariable)])
    if whole.num_children != len(args):
        raise _break("an argument capture cannot flatten; the call runs eagerly")
    flat_dims = pytree._broadcast_to_and_flatten(in_dims, whole)
    if flat_dims is None or not all(d is None or isinstance(d, int) for d in flat_dims):
        raise _break(f"in_dims {in_dims!r} does not fit the arguments (raised natively)")
    dims, start = [], 0
    for flat in leaves:
        dims.append(list(flat_dims[start:start + len(flat)]))
        start += len(flat)
    return leaves, specs, dims


class FunctorchCallVariable(Variable):
    """One of functorch's implementation functions (the call a transform's wrapper makes), fixed for
    the process: a subclass traces the call into a subgraph (vmap here, grad in func_grad.py)."""

    name = "torch.func"

    def __init__(self, fn: Any, source: Source | None = None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return self.name

    def python_type(self) -> type:
        return type(self.fn)

    def as_python_value(self) -> Any:
        return self.fn

    def reconstruct(self, glue: Any) -> str:
        return self.source.name() if self.source is not None else glue.constant(self.fn)


class VmapImplVariable(FunctorchCallVariable):
    """torch._functorch.vmap.vmap_impl: calling it traces the mapped function once, into a subgraph."""

    name = "torch.vmap"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise _break(f"{exc} (raised natively)") from exc
        a = bound.arguments
        fn = a["func"]
        in_dims = _constant(_as_variable(tx, a["in_dims"]), "in_dims")
        out_dims = _constant(_as_variable(tx, a["out_dims"]), "out_dims")
        randomness = _constant(_as_variable(tx, a["randomness"]), "randomness")
        chunk_size = _constant(_as_variable(tx, a["chunk_size"]), "chunk_size")
        positional = [_as_variable(tx, v) for v in a.get("args", ())]
        keywords = {k: _as_variable(tx, v) for k, v in a.get("kwargs", {}).items()}
        return _trace_vmap(tx, fn, in_dims, out_dims, randomness, chunk_size, positional, keywords)


def _versions(graph: torch.fx.Graph) -> dict[torch.fx.Node, int | None]:
    """The version counter of each tensor the graph holds so far (placeholders' start at 0)."""
    return {n: version_of(n.meta["example_value"]) for n in graph.nodes
            if isinstance(n.meta.get("example_value"), torch.Tensor)}


def _trace_vmap(tx: "Tracer", fn: Variable, in_dims: Any, out_dims: Any, randomness: Any, chunk_size: Any,
                args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    if not args:
        raise _break("no positional arguments to map over (raised natively)")
    leaves, specs, dims = _leaf_dims(tx, args, in_dims)
    graph = tx.output.graph
    before_samples = set(graph.nodes)
    sizes: list[Any] = []
    sample_args, samples, batched_dims, originals = [], [], [], []
    for flat, spec, per_leaf in zip(leaves, specs, dims):
        made = []
        for leaf, dim in zip(flat, per_leaf):
            if dim is None:
                made.append(leaf)
                continue
            if not isinstance(leaf, TensorVariable):
                raise _break(f"a batched argument of type {leaf.describe()} (raised natively)")
            rank = leaf.example.dim()
            if not -rank <= dim < rank:
                raise _break(f"in_dim {dim} for a {rank}-d tensor (raised natively)")
            dim = dim % rank
            size = leaf.example.shape[dim]
            if size == 0:
                raise _break("a batch of size 0 (raised natively)")
            sizes.append(size)
            sample = _op(tx, torch.select, leaf, dim, 0)
            made.append(sample)
            samples.append(sample)
            originals.append(leaf)
            batched_dims.append(dim)
        sample_args.append(_unflatten(tx, made, spec))
    if not samples:
        raise _break("no argument is batched (raised natively)")
    if any(size != sizes[0] for size in sizes[1:]):  # guarded where sizes are symbols
        raise _break("batched arguments of different sizes (raised natively)")
    sample_nodes = [n for n in graph.nodes if n not in before_samples]
    before = set(graph.nodes)
    versions = _versions(graph)
    out = _call_body(tx, "torch.vmap", fn, sample_args, samples, kwargs, aliases_ok=True, writes_ok=True)
    # the body wrote a tensor from outside it (a sample: its batch; a closed-over one)
    target = run_vmap if all(versions.get(n, 0) == v for n, v in _versions(graph).items()
                             if v is not None and (n in versions or n.op == "placeholder")) else run_vmap_writing
    out_leaves, out_spec = _flatten(tx, out)
    if not out_leaves or not all(isinstance(leaf, TensorVariable) for leaf in out_leaves):
        raise _break("the mapped function must return tensors (raised natively)")
    if isinstance(out_dims, int):
        flat_out_dims = (out_dims,) * len(out_leaves)
    elif isinstance(out_dims, (tuple, list)) and len(out_dims) == len(out_leaves) and all(
            isinstance(d, int) for d in out_dims):
        flat_out_dims = tuple(out_dims)
    else:
        raise _break(f"out_dims {out_dims!r} is a spec capture does not map; the call runs eagerly")
    body_nodes = [n for n in graph.nodes if n not in before and n.op != "placeholder"]
    results = [leaf.node for leaf in out_leaves if isinstance(leaf, TensorVariable)]
    inputs = cond_graph.outside_inputs([body_nodes], [s.node for s in samples])
    # a result the body did not make (an input returned as it is) comes out of the subgraph's placeholder
    for r in results:
        if r not in body_nodes and r not in inputs:
            inputs.append(r)
    flat_in_dims = tuple(batched_dims) + (None,) * (len(inputs) - len(samples))
    name = f"vmap_body_{len(tx.output.subgraphs)}"
    body = cond_graph.make_subgraph(tx.output, inputs, body_nodes, results, name)
    # the node maps over the batched tensors themselves, where the body read their samples
    call_inputs = [batched.node for batched in originals] + inputs[len(samples):]
    examples = [n.meta.get("example_value") for n in call_inputs]
    fake = tx.output.run_fake("call_function", target,
                              (body, flat_in_dims, flat_out_dims, randomness, chunk_size, *examples), {})
    if tx.output.inference_depth or tx.output.inference_made:  # eager's inference tensors, as any op's
        tx.output.follow_inference("call_function", target, (body, *examples), {}, fake)
    fakes = fake if isinstance(fake, tuple) else (fake,)
    tx.output.subgraphs[name] = body
    for node in reversed(sample_nodes + body_nodes):
        graph.erase_node(node)
    getter = graph.get_attr(name)
    node = tx.output.create_node("call_function", target,
                                 (getter, flat_in_dims, flat_out_dims, randomness, chunk_size, *call_inputs), {},
                                 fakes)
    return _unflatten(tx, tx.iterate(tx.wrap_op_result(node, fakes)), out_spec)
