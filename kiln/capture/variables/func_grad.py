"""`torch.func.grad` and `torch.func.grad_and_value` during capture: the function traced once.

As with vmap (vmap.py), the wrapper these return is inlined down to the call it makes,
`grad_impl(func, argnums, has_aux, args, kwargs)` (`grad_and_value_impl`); that call is this
variable's. The function is traced on the arguments themselves, with the checks on bodies of
higher_order.py's `_call_body` (no state changed outside it), and moved into a subgraph taking the
tensor leaves of the positional arguments, then every other value it reads (closed-over tensors,
parameters). One node replaces the call: `run_grad(subgraph, leaf_argnums, n_leaves, *inputs)`,
torch.func.grad_and_value of the subgraph over the leaves of the differentiated arguments, which
returns every leaf's gradient, the value and the aux leaves flat; capture rebuilds the structures
eager returns. AOT autograd traces through functorch's grad transform as eager runs it (nested
grads and a backward through the result included). A function capture cannot trace, an argument
passed twice or a value read from a non-tensor differentiated argument make a break: the call runs
eagerly. Corresponds to the functorch grad support in torch/_dynamo/variables/higher_order_ops.py.
"""
from __future__ import annotations

import inspect
import os
import types
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.fx

from kiln.capture.sources import Source
from kiln.capture.trace_rules import NATIVE_FUNCTIONS
from kiln.capture.variables import cond_graph
from kiln.capture.variables.base import Variable
from kiln.capture.variables.higher_order import _as_variable, _call_body, _flatten, _unflatten
from kiln.capture.variables.sequence import TupleVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.capture.variables.vmap import FunctorchCallVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

# functorch's implementations, known by name (Kiln does not import torch._functorch; the builder
# guards the function's identity)
_IMPLS = {"grad_impl": "torch.func.grad", "grad_and_value_impl": "torch.func.grad_and_value"}


def is_grad_impl(value: Any) -> bool:
    return isinstance(value, types.FunctionType) and value.__module__ == "torch._functorch.eager_transforms" \
        and value.__qualname__ in _IMPLS


_EAGER_TRANSFORMS = os.path.join(os.path.dirname(torch.__file__), "_functorch", "eager_transforms.py")


def is_native_transform(value: Any) -> bool:
    """torch.func's other transforms (jacrev, jacfwd, hessian, vjp, jvp, linearize, functionalize)
    and the functions they return: capture does not trace them (inlined, their forward-AD levels
    and nesting counters went out of step with the graph: jvp raised, linearize returned wrong
    values), so each call runs natively at a graph break. Known by their code's file and qualified
    name, which functools.wraps does not change."""
    code = getattr(value, "__code__", None)
    return isinstance(value, types.FunctionType) and code is not None and code.co_filename == _EAGER_TRANSFORMS \
        and code.co_qualname not in _IMPLS


NATIVE_FUNCTIONS.append(is_native_transform)


def run_grad(body: torch.fx.GraphModule, leaf_argnums: tuple[int, ...], n_leaves: int, *inputs: Any) -> tuple:
    """What a graph's grad node runs: (the gradient of each differentiated leaf, the value, the aux
    leaves), flat, from torch.func.grad_and_value of the traced function."""
    leaves, others = inputs[:n_leaves], inputs[n_leaves:]

    def value_and_aux(*xs: Any) -> tuple[Any, tuple]:
        out = body(*xs, *others)
        return out[0], tuple(out[1:])

    grads, (value, aux) = torch.func.grad_and_value(value_and_aux, argnums=leaf_argnums, has_aux=True)(*leaves)
    return (*grads, value, *aux)


def _break(what: str, why: str) -> Unsupported:
    return Unsupported(f"{what}: {why}", kind="higher_order")


class GradImplVariable(FunctorchCallVariable):
    """grad_impl / grad_and_value_impl: calling one traces the function once, into a subgraph."""

    def __init__(self, fn: Any, source: Source | None = None) -> None:
        super().__init__(fn, source)
        self.name = _IMPLS[fn.__qualname__]

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise _break(self.name, f"{exc} (raised natively)") from exc
        a = {k: _as_variable(tx, v) for k, v in bound.arguments.items()}
        for what in ("argnums", "has_aux"):
            if not a[what].is_constant():
                raise _break(self.name, f"{what} is {a[what].describe()}; the call runs eagerly")
        argnums, has_aux = a["argnums"].as_constant(), a["has_aux"].as_constant()
        positional = tx.iterate(a["args"])
        keywords = a["kwargs"]
        if not (keywords.is_constant() and keywords.as_constant() == {}):
            raise _break(self.name, "keyword arguments to the differentiated function; the call runs eagerly")
        return _trace_grad(tx, self.name, a["func"], argnums, bool(has_aux), positional,
                           with_value=self.fn.__qualname__ == "grad_and_value_impl")


def _trace_grad(tx: "Tracer", what: str, fn: Variable, argnums: Any, has_aux: bool, args: list[Variable],
                with_value: bool, runner: Any = run_grad, options: dict[str, Any] | None = None) -> Variable:
    """Trace `fn` once into a subgraph and put one `runner` node in the graph (run_grad, or a jacobian's
    runner from func_jacobian.py: the same inputs and the same flat results, the derivative of each
    differentiated leaf, the value, the aux leaves); `options` are the runner's keywords (a
    jacobian's chunk_size, randomness), constants kept on the node."""
    options = dict(options or {})
    numbers = (argnums,) if isinstance(argnums, int) else argnums
    if not (isinstance(numbers, tuple) and numbers and all(isinstance(n, int) for n in numbers)):
        raise _break(what, f"argnums {argnums!r} (raised natively)")
    if not all(-len(args) <= n < len(args) for n in numbers):
        raise _break(what, f"argnums {argnums!r} for {len(args)} arguments (raised natively)")
    numbers = tuple(n % len(args) for n in numbers)
    flat_args = [_flatten(tx, arg) for arg in args]
    leaves: list[TensorVariable] = []
    leaf_argnums: list[int] = []
    spans: dict[int, tuple[int, int]] = {}
    for i, (flat, _spec) in enumerate(flat_args):
        start = len(leaves)
        for leaf in flat:
            if isinstance(leaf, TensorVariable):
                if i in numbers:
                    leaf_argnums.append(len(leaves))
                leaves.append(leaf)
            elif i in numbers:
                raise _break(what, f"a differentiated argument holds {leaf.describe()} (raised natively)")
        spans[i] = (start, len(leaves))
    if len({id(leaf.node) for leaf in leaves}) != len(leaves):
        raise _break(what, "a tensor passed twice; the call runs eagerly")
    graph = tx.output.graph
    before = set(graph.nodes)
    out = _call_body(tx, what, fn, args, leaves, aliases_ok=True)
    if has_aux:
        items = tx.iterate(out) if isinstance(out, TupleVariable) else None
        if items is None or len(items) != 2:
            raise _break(what, "with has_aux=True the function must return a (output, aux) tuple (raised natively)")
        value, aux = items
    else:
        value, aux = out, TupleVariable([])
    aux_leaves, aux_spec = _flatten(tx, aux)
    if not isinstance(value, TensorVariable) or not all(isinstance(v, TensorVariable) for v in aux_leaves):
        raise _break(what, "the function must return a tensor (and tensors as aux); the call runs eagerly")
    results = [value.node] + [v.node for v in aux_leaves if isinstance(v, TensorVariable)]
    body_nodes = [n for n in graph.nodes if n not in before and n.op != "placeholder"]
    inputs = cond_graph.outside_inputs([body_nodes], [leaf.node for leaf in leaves])
    for r in results:  # a result the function did not make (an argument returned as aux)
        if r not in body_nodes and r not in inputs:
            inputs.append(r)
    name = f"grad_body_{len(tx.output.subgraphs)}"
    body = cond_graph.make_subgraph(tx.output, inputs, body_nodes, results, name)
    examples = [n.meta.get("example_value") for n in inputs]
    fakes = tx.output.run_fake("call_function", runner, (body, tuple(leaf_argnums), len(leaves), *examples), options)
    if tx.output.inference_depth or tx.output.inference_made:  # eager's inference tensors, as any op's
        tx.output.follow_inference("call_function", runner, (body, *examples), options, fakes)
    tx.output.subgraphs[name] = body
    for node in reversed(body_nodes):
        graph.erase_node(node)
    getter = graph.get_attr(name)
    node = tx.output.create_node("call_function", runner, (getter, tuple(leaf_argnums), len(leaves), *inputs),
                                 options, fakes)
    flat = tx.iterate(tx.wrap_op_result(node, fakes))
    grads_by_leaf = dict(zip(leaf_argnums, flat))
    grads = []
    for n in numbers:
        flat_arg, spec = flat_args[n]
        start, _ = spans[n]
        grads.append(_unflatten(tx, [grads_by_leaf[start + k] for k in range(len(flat_arg))], spec))
    grad_value: Variable = grads[0] if isinstance(argnums, int) else TupleVariable(grads)
    value_out = flat[len(leaf_argnums)]
    aux_out = _unflatten(tx, flat[len(leaf_argnums) + 1:], aux_spec)
    if with_value:
        return TupleVariable([grad_value, TupleVariable([value_out, aux_out]) if has_aux else value_out])
    return TupleVariable([grad_value, aux_out]) if has_aux else grad_value
