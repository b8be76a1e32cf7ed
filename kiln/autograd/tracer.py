"""The ATen dispatch tracer: a TorchDispatchMode that records every ATen op it sees into an fx.Graph.

It sits below autograd and functionalization, so what it records is the functional ATen program
(forward, and backward when autograd.grad runs inside it). Tensors map to the nodes that made them;
symbolic sizes map to `sym_size` nodes of the tensor they came from plus `operator.*` arithmetic.
Input: tensors (fake or real) bound to placeholders. Output: an fx.Graph of torch.ops.aten overloads.
PyTorch counterpart: torch/fx/experimental/proxy_tensor.py (make_fx's ProxyTorchDispatchMode).
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable, Mapping

import sympy
import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.weak import WeakIdKeyDictionary

from kiln.autograd.decompose import KILN_DECOMPOSITIONS
from kiln.errors import KilnError
from kiln.fake.composites import eager_decomposition
from kiln.fake.value_checks import raises_on_values
from kiln.symbolic.expr import BitwiseOp, FloorDiv, ModularIndexing, adopt_torch_functions, is_integral
from kiln.symbolic.floats import GRAPH_OPERATION, FloatFloorDiv, FloatLog2, FloatSqrt, RoundHalfEven, ToFloat, TruncToInt
from kiln.symbolic.node import sym_floordiv, sym_log2

aten = torch.ops.aten

# Metadata queries: answered by running them, never recorded (they are not computation, and the
# recipes measured dozens of prim.device calls per trace).
METADATA_OPS = frozenset({
    torch.ops.prim.device.default, torch.ops.prim.layout.default,
    aten.sym_size.default, aten.sym_size.int, aten.sym_stride.default, aten.sym_stride.int,
    aten.sym_numel.default, aten.sym_storage_offset.default, aten.is_contiguous.default,
    aten.is_contiguous.memory_format, aten.is_strides_like_format.default,
    aten.is_non_overlapping_and_dense.default, aten.size.default, aten.stride.default,
    aten.numel.default, aten.dim.default,
})

# a comparison inside a symbolic expression, as the operator the graph applies to its operands
_RELATIONS: dict[type, Callable[[Any, Any], Any]] = {
    sympy.StrictGreaterThan: operator.gt, sympy.GreaterThan: operator.ge, sympy.StrictLessThan: operator.lt,
    sympy.LessThan: operator.le, sympy.Eq: operator.eq, sympy.Ne: operator.ne,
}


def expr_of(x: torch.SymInt | torch.SymFloat | torch.SymBool) -> sympy.Basic:
    """The sympy expression behind a symbolic scalar: Kiln's SymNode and torch's both carry `.expr`,
    so graphs that the real Dynamo hands us (torch's symbols) trace the same way as Kiln's."""
    expr = getattr(x.node, "expr", None)
    if expr is None:
        raise KilnError(f"cannot read the expression of symbolic value {x!r}")
    return expr


def size_hint(x: int | torch.SymInt) -> int:
    """A concrete example value for a size (its hint), used to weigh tensors in bytes."""
    if isinstance(x, int):
        return x
    node = x.node
    hint = getattr(node, "hint", None)
    if isinstance(hint, int):
        return hint
    for name in ("require_hint", "size_hint"):
        method = getattr(node, name, None)
        if callable(method):
            try:
                return int(method())
            except Exception:  # an unbacked symbol has no hint; fall through to the guess
                pass
    shape_env = getattr(node, "shape_env", None)
    if shape_env is not None and hasattr(shape_env, "size_hint"):
        try:
            return int(shape_env.size_hint(expr_of(x)))
        except Exception:
            pass
    return 64  # unbacked sizes: a stand-in weight, only used for partitioning costs


def is_symbolic(x: Any) -> bool:
    """Whether x is a symbolic scalar (a size or int the graph must compute, not a constant)."""
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))


class AtenTracer(TorchDispatchMode):
    """Records ATen ops into `self.graph`; `decompositions` maps an OpOverload to a Python function
    that is run (and traced through) instead of recording the op."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Otherwise TorchDispatchMode wraps __torch_dispatch__ in torch._dynamo.disable, whose
        # first call imports Dynamo (slow). This mode never runs under Dynamo.
        return False

    def __init__(self, decompositions: Mapping[Any, Callable] | None = None) -> None:
        super().__init__()
        self.graph = fx.Graph()
        self.decompositions = {**KILN_DECOMPOSITIONS, **(decompositions or {})}
        self.node_of: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.sym_node_of: dict[sympy.Basic, fx.Node] = {}
        # symbol -> (node of a tensor, dim) where the symbol is that tensor's size; sym_size nodes
        # are only emitted when a symbol is actually used, so static graphs stay clean.
        self.sym_source: dict[sympy.Symbol, tuple[fx.Node, int]] = {}
        self.constants: dict[str, torch.Tensor] = {}
        self._names: set[str] = set()

    # ---- binding values to nodes ------------------------------------------------------------
    def placeholder(self, name: str, value: Any) -> fx.Node:
        node = self.graph.placeholder(name)
        node.meta["val"] = value
        if isinstance(value, torch.Tensor):
            self._bind_tensor(value, node)
        elif is_symbolic(value):
            expr = expr_of(value)
            if isinstance(expr, sympy.Symbol) and expr not in self.sym_node_of:
                self.sym_node_of[expr] = node
        return node

    def _bind_tensor(self, t: torch.Tensor, node: fx.Node) -> None:
        self.node_of[t] = node
        for dim, size in enumerate(t.shape):
            if isinstance(size, torch.SymInt):
                expr = expr_of(size)
                if isinstance(expr, sympy.Symbol) and expr not in self.sym_source:
                    self.sym_source[expr] = (node, dim)
        if t.layout == torch.strided:
            # a stride with a symbol of its own (past a padded row of a dynamic input:
            # kiln.fake.convert.symbolic_strides), stored as -1 - dim
            for dim, stride in enumerate(t.stride()):
                if isinstance(stride, torch.SymInt):
                    expr = expr_of(stride)
                    if isinstance(expr, sympy.Symbol) and expr not in self.sym_source:
                        self.sym_source[expr] = (node, -1 - dim)

    def _bind_outputs(self, out: Any, node: fx.Node) -> None:
        node.meta["val"] = out
        if isinstance(out, torch.Tensor):
            self._bind_tensor(out, node)
        elif isinstance(out, (tuple, list)):
            for i, item in enumerate(out):
                if isinstance(item, torch.Tensor):
                    item_node = self.graph.call_function(operator.getitem, (node, i))
                    item_node.meta["val"] = item
                    self._bind_tensor(item, item_node)

    def alias_value(self, new: torch.Tensor, old: torch.Tensor) -> None:
        """Take `new` (a fake made outside the trace) for the node of `old`: the same value with
        other metadata, as functionalization gives an input its own layout back."""
        self.node_of[new] = self.arg_of(old)

    def arg_of(self, x: Any) -> Any:
        """The graph value standing for `x` in a recorded call: a node, or `x` itself if constant."""
        if isinstance(x, torch.Tensor):
            node = self.node_of.get(x)
            if node is None:
                node = self._lift_constant(x)
            return node
        if is_symbolic(x):
            return self.sym_arg(x)
        return x

    def _lift_constant(self, t: torch.Tensor) -> fx.Node:
        """A tensor the graph did not make (a real constant): stored on the module as an attribute."""
        if getattr(t, "fake_mode", None) is not None or t.device.type == "meta":
            # a fake that no traced op produced would be baked into the graph as a constant that
            # has no data; this is a tracing bug, not something to run
            raise KilnError(f"the AOT tracer met a fake tensor it did not trace: {t!r}")
        name = f"_tensor_constant{len(self.constants)}"
        self.constants[name] = t
        node = self.graph.get_attr(name)
        node.meta["val"] = t
        self.node_of[t] = node
        return node

    def sym_arg(self, x: torch.SymInt | torch.SymFloat | torch.SymBool) -> Any:
        expr = sympy.sympify(expr_of(x))
        return self.node_of_expr(expr)

    def node_of_expr(self, expr: sympy.Basic) -> Any:
        """Emit (once) the arithmetic computing `expr` from symbol nodes; plain numbers stay numbers."""
        if expr.is_Integer:
            return int(expr)
        if expr.is_Number:
            return float(expr)
        if expr is sympy.true or expr is sympy.false:
            return bool(expr)
        if expr in self.sym_node_of:
            return self.sym_node_of[expr]
        node = self._build_expr(expr)
        self.sym_node_of[expr] = node
        return node

    def _build_expr(self, expr: sympy.Basic) -> fx.Node:
        if isinstance(expr, sympy.Symbol):
            if expr not in self.sym_source:
                raise KilnError(f"symbol {expr} is not the size of any traced tensor or an input")
            tensor_node, dim = self.sym_source[expr]
            if dim < 0:
                node = self.graph.call_function(aten.sym_stride.int, (tensor_node, -1 - dim))
                node.meta["val"] = tensor_node.meta["val"].stride()[-1 - dim]
                return node
            node = self.graph.call_function(aten.sym_size.int, (tensor_node, dim))
            node.meta["val"] = tensor_node.meta["val"].shape[dim]
            return node
        adopted = adopt_torch_functions(expr)  # PyTorch's own FloorDiv/PythonMod/... as Kiln's
        if adopted is not expr:
            return self.node_of_expr(adopted)
        args = [self.node_of_expr(a) for a in expr.args]
        # a float operation (kiln.symbolic.floats) is the one Python operation, on ints as eager's
        if isinstance(expr, ToFloat):
            return self._arith(torch.sym_float, (args[0],))
        if isinstance(expr, FloatSqrt):
            return self._arith(torch.sym_sqrt, (args[0],))
        if isinstance(expr, FloatLog2):
            return self._arith(sym_log2, (args[0],))
        if isinstance(expr, RoundHalfEven):
            return self._arith(round, (args[0],))
        if isinstance(expr, TruncToInt):
            return self._arith(torch.sym_int, (args[0],))
        if isinstance(expr, FloatFloorDiv):
            return self._arith(sym_floordiv, tuple(args))
        if type(expr) in GRAPH_OPERATION:
            return self._arith(GRAPH_OPERATION[type(expr)], tuple(args))
        if isinstance(expr, sympy.Add):
            return self._fold(operator.add, args)
        if isinstance(expr, sympy.Mul):
            return self._fold(operator.mul, args)
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
            return self._arith(operator.pow, (args[0], int(expr.exp)))
        if isinstance(expr, sympy.Pow):  # a float result: a float argument's powers, or n ** -1
            if expr.exp == sympy.Rational(1, 2):
                return self._arith(torch.sym_sqrt, (args[0],))
            if expr.exp == -1:
                return self._arith(operator.truediv, (1.0, args[0]))
            return self._arith(operator.pow, (args[0], float(expr.exp) if expr.exp.is_number else args[1]))
        if isinstance(expr, BitwiseOp):  # Python's own &, |, ^, <<, >> on the ints
            return self._arith(expr.apply_int, tuple(args))
        if isinstance(expr, FloorDiv):
            return self._arith(operator.floordiv, tuple(args))
        if isinstance(expr, (ModularIndexing, sympy.Mod)):  # Python's `%`, as on SymInts
            return self._arith(operator.mod, tuple(args))
        if isinstance(expr, (sympy.floor, sympy.ceiling)) and not is_integral(expr.args[0]):
            # of a float argument's expression (int(f), arange's length): Python's int-valued math
            fn = math.floor if isinstance(expr, sympy.floor) else math.ceil
            return self._arith(fn, (args[0],))
        if isinstance(expr, sympy.floor):
            inner = expr.args[0]
            num, den = inner.as_numer_denom()
            return self._arith(operator.floordiv, (self.node_of_expr(num), self.node_of_expr(den)))
        if isinstance(expr, sympy.Abs):  # of a float argument's expression
            return self._arith(operator.abs, (args[0],))
        relation = _RELATIONS.get(type(expr))
        if relation is not None:  # a comparison of sizes or int arguments the graph returns or uses
            return self._arith(relation, tuple(args))
        if isinstance(expr, sympy.Not):
            return self._arith(torch.sym_not, (args[0],))
        if isinstance(expr, (sympy.And, sympy.Or)):
            return self._fold(operator.and_ if isinstance(expr, sympy.And) else operator.or_, args)
        if isinstance(expr, sympy.Max):
            return self._fold(torch.sym_max, args)
        if isinstance(expr, sympy.Min):
            return self._fold(torch.sym_min, args)
        raise KilnError(f"cannot express symbolic size {expr} ({type(expr).__name__}) as graph arithmetic")

    def _fold(self, fn: Callable, args: list[Any]) -> fx.Node:
        acc = args[0]
        for a in args[1:]:
            acc = self._arith(fn, (acc, a))
        return acc

    def _arith(self, fn: Callable, args: tuple) -> fx.Node:
        """One arithmetic node on sizes, with its value traced like every other node (the seam
        to the lowering promises `meta["val"]` everywhere)."""
        node = self.graph.call_function(fn, args)
        node.meta["val"] = fn(*(a.meta["val"] if isinstance(a, fx.Node) else a for a in args))
        return node

    # ---- the mode ------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in METADATA_OPS:
            return func(*args, **kwargs)
        # Kiln's eager version of a composite (dropout, the RNNs) before any table's Python one
        decomposition = eager_decomposition(func) or self.decompositions.get(func)
        if decomposition is not None:
            with self:
                out = decomposition(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), "CompositeImplicitAutograd"):
            # Below autograd, CIA ops (to.dtype, reshape called from backward formulas) can still
            # arrive packed; decomposing here keeps the graph in ops that have real kernels.
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if func is aten.native_batch_norm.default and args[5] and args[3] is not None:
            # its running-stat update is not in its schema, so functionalization cannot see it and
            # the graph would silently drop it (kiln.autograd.decompose reroutes the usual callers)
            raise KilnError("native_batch_norm in training mode reached the AOT tracer below "
                            "functionalization; its running-stat update would be lost")
        out = func(*args, **kwargs)
        node = self.graph.create_node("call_function", func, tree_map(self.arg_of, tuple(args)),
                                      tree_map(self.arg_of, dict(kwargs)),
                                      name=func.overloadpacket.__name__.strip("_") or None)
        self._bind_outputs(out, node)
        if is_symbolic(out):
            expr = sympy.sympify(expr_of(out))
            if isinstance(expr, sympy.Symbol):
                self.sym_node_of.setdefault(expr, node)
        return out

    def output(self, values: list[Any]) -> fx.Node:
        return self.graph.output(tuple(self.arg_of(v) if v is not None else None for v in values))


def graph_module(tracer: AtenTracer) -> fx.GraphModule:
    """Wrap the traced graph in a GraphModule holding the lifted constants."""
    owner = torch.nn.Module()
    for name, value in tracer.constants.items():
        owner.register_buffer(name, value)
    # an op that checks its inputs' values (an index, an integer divisor) raises in eager even when
    # nothing reads its result: it stays
    tracer.graph.eliminate_dead_code(lambda node: node.is_impure() or raises_on_values(node))
    gm = fx.GraphModule(owner, tracer.graph)
    gm.recompile()
    return gm
