"""The lowering table: one entry per ATen overload, filled by `@register` beside each rule.

A rule takes the LoweringContext and the node's lowered arguments (TensorValue for tensors, sympy
expressions for sizes, plain Python for the rest) and returns a lazy TensorValue (a loader: index
-> body Value), a tuple of them, or a size. Lazy values compose, which is how pointwise chains end
up inlined into one loop; `ctx.realize` turns one into a buffer. Corresponds to
torch/_inductor/lowering.py's `lowerings` dict and TensorBox.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import sympy
import torch

from kiln.lower import ops
from kiln.symbolic.expr import FloorDiv, ModularIndexing, adopt_torch_functions
from kiln.symbolic.node import expr_of
from kiln.lower.ir import (BufferRef, Buffer, Extern, Layout, Load, Op, Pointwise, Reduction, SymExpr, Value,
                           contiguous_strides, index_vars, simplify_index, substitute, walk)

Loader = Callable[[Sequence[sympy.Expr]], Value]

LOWERINGS: dict[Any, Callable[..., Any]] = {}


def register(*overloads: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Fill the table: `@register(aten.add.Tensor, aten.add.Scalar)` above the rule."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for o in overloads:
            assert isinstance(o, torch._ops.OpOverload), o
            assert o not in LOWERINGS, f"two lowerings for {o}"
            LOWERINGS[o] = fn
        return fn

    return wrap


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half and bfloat16 are computed in float32 inside kernels and rounded on store, as ATen's CPU
    vectorized kernels do per op."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


SUPPORTED_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool})



def contiguous_last(body: Value, reduced: tuple[sympy.Expr, ...]) -> tuple[Value, tuple[sympy.Expr, ...]]:
    """The reduced dims of `body` reordered so that the innermost one is contiguous in memory where
    another one is and it is not: the dims by decreasing stride (the largest coefficient any load
    gives them). A group norm's statistics of an NHWC activation reduce over (C/G, H*W) with C/G
    the stride-1 dim; in the logical order the reduction kernel's vector loop went across groups,
    8 floats apart, or along H*W, a row apart, instead of along the channels of a group. Order
    matters to the rounding of a sum only (the reduction is of one associative operation)."""
    rs = index_vars("r", len(reduced))
    if len(reduced) < 2 or not all(r.is_number for r in reduced):
        return body, reduced
    largest = [0] * len(rs)
    contiguous = [False] * len(rs)
    for v in walk(body):
        if not isinstance(v, Load):
            continue
        index = sympy.expand(v.index)
        if any(node.has(*rs) for node in index.atoms(FloorDiv, ModularIndexing)):
            return body, reduced  # a reshape's index arithmetic: no single stride per dim
        for k, r in enumerate(rs):
            c = index.coeff(r)
            if not c.is_number or index.coeff(r, 2) != 0:
                return body, reduced
            largest[k] = max(largest[k], abs(int(c)))
            contiguous[k] |= c == 1
    if contiguous[-1] or not any(contiguous):
        return body, reduced
    # dims no load walks go outermost; the others by decreasing stride, ties in their order
    order = sorted(range(len(rs)), key=lambda k: -(largest[k] or float("inf")))
    if not contiguous[order[-1]]:
        return body, reduced
    body = substitute(body, {rs[old]: rs[new] for new, old in enumerate(order)})
    return body, tuple(reduced[k] for k in order)

@dataclass
class TensorValue:
    """A tensor during lowering: its dtype, sizes and a loader; `view` is set when it is a strided
    view of a buffer (so externs and outputs can use it without a copy)."""

    dtype: torch.dtype
    sizes: tuple[sympy.Expr, ...]
    loader: Loader
    view: BufferRef | None = None
    origins: tuple[str, ...] = ()  # FX nodes inlined into this value (for kernel comments)

    def load(self, idx: Sequence[sympy.Expr]) -> Value:
        return self.loader(idx)

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    def load_for(self, idx: Sequence[sympy.Expr], reader: torch.dtype) -> Value:
        """The value at `idx` as an op whose inputs promote to `reader` sees it. A half-typed
        value computed within the kernel is in float32 there; eager stored it rounded to its type
        before a wider op read it (`(h + i) + d`, `(h * 0.1).sum(dtype=torch.float32)`)."""
        value = self.loader(idx)
        if self.dtype in (torch.float16, torch.bfloat16) and self.view is None and reader != self.dtype:
            value = ops.cast(ops.op("to_dtype", value, param=self.dtype), torch.float32)
        return value


def strided_value(ref: BufferRef) -> TensorValue:
    layout = ref.layout
    dtype = compute_dtype(layout.dtype)

    def loader(idx: Sequence[sympy.Expr]) -> Value:
        return Load(ref.name, simplify_index(layout.index(idx)), dtype)

    return TensorValue(layout.dtype, layout.sizes, loader, ref)


def to_expr(x: Any) -> sympy.Expr:
    """A size (int or SymInt) as a sympy expression (kiln.symbolic's expr_of, or the node's expr);
    also a SymFloat (a float argument kept symbolic), whose expression is over `zf` symbols."""
    if isinstance(x, (torch.SymInt, torch.SymFloat)):
        # a SymInt of the real torch.compile carries torch's own sympy functions: adopt Kiln's
        return adopt_torch_functions(sympy.sympify(expr_of(x)))
    if isinstance(x, sympy.Basic):
        return x
    return sympy.Integer(int(x))


def stride_hint(stride: int | torch.SymInt) -> int:
    """A stride's example value, to order dims outermost first (an unbacked one: 0, no order known)."""
    if not isinstance(stride, torch.SymInt):
        return int(stride)
    hint = getattr(stride.node, "hint", None)
    return hint if isinstance(hint, int) else 0


def dense_layout(meta: torch.Tensor) -> Layout:
    """The output layout eager would give (from the meta strides) when it is dense, else contiguous.
    A dense meta's strides are kept whole, a size-1 dim's included: eager's preserve_format copies
    (`.to(dtype)`, `.clone()`, `.bool()` of a (1, 7) view with strides (129, 1)) keep (129, 1)."""
    sizes = tuple(to_expr(s) for s in meta.shape)
    strides = tuple(to_expr(s) for s in meta.stride())
    # outermost first, by the strides' example values: a symbolic stride (s0 of a transposed
    # [s1, s0] input) orders by its hint, not as 0
    hints = [stride_hint(s) for s in meta.stride()]
    order = sorted(range(len(sizes)), key=lambda k: hints[k], reverse=True)
    expected = contiguous_strides([sizes[k] for k in order])
    if all(sympy.expand(strides[k] - e) == 0 or sizes[k] == 1 for k, e in zip(order, expected)):
        return Layout(meta.dtype, sizes, strides)
    return Layout.contiguous(meta.dtype, sizes)


def stride_order_layout(meta: torch.Tensor) -> Layout:
    """dense_layout, except that a meta that is not dense (a slice of a transpose) gets dense strides
    in its own order of strides, not contiguous ones: what eager's `empty_like` gives it, so a random
    op drawing into it (`uniform(x.t()[1:])`) fills its elements in eager's order."""
    layout = dense_layout(meta)
    hints = [stride_hint(s) for s in meta.stride()]
    order = sorted(range(meta.dim()), key=lambda k: hints[k], reverse=True)
    if list(layout.strides) != list(contiguous_strides(layout.sizes)) or order == sorted(order):
        return layout
    sizes = tuple(to_expr(s) for s in meta.shape)
    strides: list[sympy.Expr] = [sympy.Integer(0)] * len(sizes)
    for k, stride in zip(order, contiguous_strides([sizes[k] for k in order])):
        strides[k] = stride
    return Layout(meta.dtype, sizes, tuple(strides))



def value_cost(v: Value) -> int:
    """Rough cost of recomputing a body: transcendental ops weigh more than adds and loads."""
    heavy = {"exp", "log", "tanh", "sin", "cos", "erf", "pow", "sigmoid", "log1p", "expm1", "atan2",
             "rand", "randn", "tan", "erfc", "lgamma"}
    cost = 0
    for n in walk(v):
        if isinstance(n, Load):
            cost += 1
        elif hasattr(n, "name"):
            cost += 6 if n.name in heavy else 1  # type: ignore[attr-defined]
    return cost


class LoweringContext:
    """State of one graph's lowering: the buffers made so far and the current node's metadata."""

    def __init__(self) -> None:
        self.buffers: list[Buffer] = []
        self._names = itertools.count()
        self.origins: tuple[str, ...] = ()
        self.meta: Any = None  # the current node's example value (a meta/fake tensor or tuple)
        self.node: Any = None  # the FX node being lowered (rules that look at its neighbours)
        self.random_offset = 0  # distinct stream per random op of the graph
        self.perf_hints: list[str] = []
        self.storage_offsets: dict[str, sympy.Expr] = {}  # input -> its storage offset (as_strided is absolute)
        self.pending_origins: tuple[str, ...] = ()  # origins of the lazy inputs of the current node
        self.relaid_out: set[str] = set()  # extern results stored in another layout than eager's (NHWC)
        self.divisors: list[tuple[sympy.Expr, str]] = []  # LoopIR.divisors

    def new_name(self) -> str:
        return f"buf{next(self._names)}"

    def add(self, buffer: Buffer) -> Buffer:
        self.buffers.append(buffer)
        return buffer

    # -- metadata of the node being lowered
    def out_dtype(self, k: int | None = None) -> torch.dtype:
        m = self.meta if k is None else self.meta[k]
        return m.dtype

    def out_sizes(self, k: int | None = None) -> tuple[sympy.Expr, ...]:
        m = self.meta if k is None else self.meta[k]
        return tuple(to_expr(s) for s in m.shape)

    # -- buffers
    def realize(self, tv: TensorValue, layout: Layout | None = None) -> TensorValue:
        """Compute `tv` into a new buffer (dense, in `layout` or contiguous); returns its view."""
        if tv.view is not None and layout is None:
            return tv
        layout = layout or Layout.contiguous(tv.dtype, tv.sizes)
        body = ops.cast(tv.load(index_vars("i", len(tv.sizes))), compute_dtype(tv.dtype))
        if (layout.dtype in (torch.float16, torch.bfloat16) and isinstance(body, Op) and body.name == "to_dtype"
                and isinstance(body.args[0], Op) and body.args[0].name == "to_dtype"
                and body.args[0].dtype == layout.dtype):
            body = ops.cast(body.args[0].args[0], compute_dtype(tv.dtype))  # rounded to the buffer's type (rounded_on_read): the store rounds it
        origins = tuple(dict.fromkeys(tv.origins + self.origins))
        buf = self.add(Pointwise(self.new_name(), layout, origins, body))
        return strided_value(BufferRef(buf.name, layout))

    def reduction(self, dtype: torch.dtype, ranges: Sequence[sympy.Expr], reduction_ranges: Sequence[sympy.Expr],
                  rtype: str, fn: Callable[[Sequence[sympy.Expr], Sequence[sympy.Expr]], Value]) -> TensorValue:
        """A Reduction buffer over `ranges` (kept) x `reduction_ranges`; fn(i, r) gives the element."""
        layout = Layout.contiguous(dtype, ranges)
        body = fn(index_vars("i", len(ranges)), index_vars("r", len(reduction_ranges)))
        reduced = tuple(sympy.sympify(r) for r in reduction_ranges)
        if rtype not in ("argmax", "argmin"):  # their ties go to the first point in the logical order
            body, reduced = contiguous_last(body, reduced)
        origins = tuple(dict.fromkeys(self.pending_origins + self.origins))
        if rtype not in ("argmax", "argmin"):
            body = ops.cast(body, compute_dtype(dtype))
        buf = self.add(Reduction(self.new_name(), layout, origins, body, reduced, rtype))
        return strided_value(BufferRef(buf.name, layout))

    def as_ref(self, tv: TensorValue) -> BufferRef:
        view = self.realize(tv).view
        assert view is not None
        return view

    def extern(self, op: Any, args: Sequence[Any], kwargs: dict[str, Any], reason: str | None = None) -> Any:
        """Call the ATen op itself on realized inputs; the result layout comes from the node's meta."""
        if reason is not None:
            self.perf_hints.append(f"{', '.join(self.origins)}: {op} runs as an ATen call ({reason})")

        def convert(a: Any) -> Any:
            if isinstance(a, TensorValue):
                return self.as_ref(a)
            if isinstance(a, sympy.Basic):
                return SymExpr(a)
            if isinstance(a, (list, tuple)):
                return type(a)(convert(x) for x in a)
            return a

        name = self.new_name()
        results: list[tuple[str, Layout, tuple[int, ...]]] = []

        def collect(m: Any, path: tuple[int, ...]) -> Any:
            if isinstance(m, torch.Tensor):
                lay = Layout(m.dtype, tuple(to_expr(s) for s in m.shape), tuple(to_expr(s) for s in m.stride()))
                rname = name if path == () else f"{name}_{'_'.join(map(str, path))}"
                results.append((rname, lay, path))
                return strided_value(BufferRef(rname, lay))
            if isinstance(m, (list, tuple)):
                return tuple(collect(x, path + (k,)) for k, x in enumerate(m))
            if isinstance(m, torch.SymInt):
                return to_expr(m)
            return m

        value = collect(self.meta, ())
        first = results[0][1] if results else Layout(torch.float32, (), ())
        self.add(Extern(name, first, self.origins, op, tuple(convert(a) for a in args),
                        tuple(sorted((k, convert(v)) for k, v in kwargs.items())), tuple(results)))
        return value


# -- helpers shared by the rule modules

def broadcast_load(tv: TensorValue, idx: Sequence[sympy.Expr], reader: torch.dtype | None = None) -> Value:
    """Load `tv` at the trailing-aligned index `idx` of a broadcast result (for an op whose inputs
    promote to `reader`, when given: TensorValue.load_for)."""
    idx = list(idx)[len(idx) - tv.ndim:] if tv.ndim else []
    idx = [sympy.Integer(0) if s == 1 else i for i, s in zip(idx, tv.sizes)]
    return tv.load(idx) if reader is None else tv.load_for(idx, reader)


def broadcast_sizes(*shapes: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    n = max((len(s) for s in shapes), default=0)
    out: list[sympy.Expr] = []
    for k in range(n):
        size: sympy.Expr = sympy.Integer(1)
        for s in shapes:
            j = k - (n - len(s))
            if j >= 0 and s[j] != 1:
                size = s[j]
        out.append(size)
    return tuple(out)


def normalize_dim(dim: int, ndim: int) -> int:
    return dim + max(ndim, 1) if dim < 0 else dim


def wrapped_index(index: Any, size: sympy.Expr) -> sympy.Expr:
    """A select's index as ATen wraps it: -size <= index < 0 counts from the end. An int argument
    of a dynamic graph is a symbol whose sign is guarded (a negative one recompiles) but not known
    here: `index % size` is right for either sign (a raw -1 read and wrote before the tensor)."""
    index = sympy.sympify(index)
    if index.is_number:
        return index + size if index < 0 else index
    return index if index.is_nonnegative else ModularIndexing(index, size)


from kiln.lower.lowerings import pointwise, reductions, views, indexing, extern, convolution, batch_norm  # noqa: E402,F401  (fill the table)

__all__ = ["LOWERINGS", "register", "LoweringContext", "TensorValue", "strided_value", "to_expr",
           "value_cost", "compute_dtype", "SUPPORTED_DTYPES"]
