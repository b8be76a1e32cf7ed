"""The loop-level IR: buffers with layouts, and loop nests whose bodies are expression trees.

Lowering (kiln.lower.lowerings) turns each ATen node into these records; the scheduler groups them
into kernels and the C++ codegen prints them. A body is a tree of `Value`s (Load, Const, Op,
Masked, Index) evaluated at one point of the iteration space, whose index variables are sympy
symbols `i0, i1, ...` (and `r0, ...` over a reduction). Corresponds to torch/_inductor/ir.py.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Sequence

import sympy
import torch
from torch.utils import _pytree as pytree

from kiln.errors import VerificationError
from kiln.symbolic.expr import FloorDiv, ModularIndexing  # the index arithmetic shares the size vocabulary


def index_vars(prefix: str, n: int) -> tuple[sympy.Symbol, ...]:
    """Loop variables of one iteration space; integer and non-negative so sympy can simplify."""
    return tuple(sympy.Symbol(f"{prefix}{k}", integer=True, nonnegative=True) for k in range(n))


def simplify_index(expr: sympy.Expr) -> sympy.Expr:
    """Fold `a*FloorDiv(x, a) + ModularIndexing(x, a)` back into `x` (left by reshapes of lazy values)."""
    expr = sympy.expand(expr)
    if not isinstance(expr, sympy.Add):
        return expr
    for _ in range(8):
        terms = list(expr.args)
        changed = False
        for t in terms:
            coeff, rest = t.as_coeff_Mul()
            mods = [f for f in sympy.Mul.make_args(rest) if isinstance(f, ModularIndexing)]
            if len(mods) != 1:
                continue
            mod = mods[0]
            x, a = mod.args
            other = rest / mod
            partner = sympy.expand(coeff * other * a * FloorDiv(x, a))
            if partner in terms:
                expr = sympy.expand(expr - t - partner + coeff * other * x)
                changed = True
                break
        if not changed or not isinstance(expr, sympy.Add):
            break
    return expr


# ----------------------------------------------------------------------------- values (bodies)

class Value:
    """A scalar expression evaluated at one point of a loop nest; `dtype` is its C type's torch dtype."""

    dtype: torch.dtype

    @functools.cached_property
    def _hash(self) -> int:
        return hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return self._hash

    def children(self) -> tuple["Value", ...]:
        return ()


@dataclass(frozen=True, eq=True)
class Const(Value):
    value: bool | int | float
    dtype: torch.dtype

    __hash__ = Value.__hash__


@dataclass(frozen=True, eq=True)
class Index(Value):
    """An index expression used as a value (iota, masks of pads and cats)."""

    expr: sympy.Expr
    dtype: torch.dtype = torch.int64

    __hash__ = Value.__hash__


@dataclass(frozen=True, eq=True)
class Load(Value):
    """buffer[index + extra]; `extra` is an int64 Value for indirect (data-dependent) indexing."""

    buffer: str
    index: sympy.Expr
    dtype: torch.dtype
    extra: Value | None = None

    __hash__ = Value.__hash__

    def children(self) -> tuple[Value, ...]:
        return () if self.extra is None else (self.extra,)


@dataclass(frozen=True, eq=True)
class Op(Value):
    """A loop-level op from kiln.lower.ops applied to argument values."""

    name: str
    args: tuple[Value, ...]
    dtype: torch.dtype
    param: object = None  # a static parameter (the target dtype of a cast, a seed offset)

    __hash__ = Value.__hash__

    def children(self) -> tuple[Value, ...]:
        return self.args


@dataclass(frozen=True, eq=True)
class Masked(Value):
    """`body` where `mask` holds, else `other`; `body` is only evaluated under the mask (pads, cats)."""

    mask: Value
    body: Value
    other: Value
    dtype: torch.dtype

    __hash__ = Value.__hash__

    def children(self) -> tuple[Value, ...]:
        return (self.mask, self.body, self.other)


def walk(value: Value) -> list[Value]:
    """Every node of a value DAG once, children before parents."""
    seen: set[int] = set()
    out: list[Value] = []

    def visit(v: Value) -> None:
        if id(v) in seen:
            return
        seen.add(id(v))
        for c in v.children():
            visit(c)
        out.append(v)

    visit(value)
    return out


# ----------------------------------------------------------------------------- buffers

def substitute(value: Value, sub: dict) -> Value:
    """`value` with the index variables in `sub` replaced (simultaneously) in every index it holds:
    the loads' indices, index values and what masks and indirect loads are made of."""
    memo: dict[int, Value] = {}

    def go(v: Value) -> Value:
        if id(v) in memo:
            return memo[id(v)]
        if isinstance(v, Load):
            out: Value = Load(v.buffer, v.index.xreplace(sub), v.dtype, None if v.extra is None else go(v.extra))
        elif isinstance(v, Index):
            out = Index(v.expr.xreplace(sub), v.dtype)
        elif isinstance(v, Op):
            out = Op(v.name, tuple(go(a) for a in v.args), v.dtype, v.param)
        elif isinstance(v, Masked):
            out = Masked(go(v.mask), go(v.body), go(v.other), v.dtype)
        else:
            out = v
        memo[id(v)] = out
        return out

    return go(value)


def contiguous_strides(sizes: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    """Row-major strides, a size-0 dim counted as 1 as torch counts it (`torch.empty(4, 0)` has
    strides (1, 1)): no element of an empty tensor is addressed, but its strides are seen."""
    strides: list[sympy.Expr] = []
    acc: sympy.Expr = sympy.Integer(1)
    for s in reversed(sizes):
        strides.append(acc)
        acc = acc * (sympy.Integer(1) if s == 0 else s)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Layout:
    """Where the elements of a strided buffer live: element index = offset + sum(i_k * stride_k)."""

    dtype: torch.dtype
    sizes: tuple[sympy.Expr, ...]
    strides: tuple[sympy.Expr, ...]
    offset: sympy.Expr = sympy.Integer(0)

    @staticmethod
    def contiguous(dtype: torch.dtype, sizes: Sequence[sympy.Expr]) -> "Layout":
        sizes = tuple(sympy.sympify(s) for s in sizes)
        return Layout(dtype, sizes, contiguous_strides(sizes))

    def index(self, idx: Sequence[sympy.Expr]) -> sympy.Expr:
        assert len(idx) == len(self.sizes), (idx, self.sizes)
        return self.offset + sum((i * s for i, s in zip(idx, self.strides) if s != 0), sympy.Integer(0))

    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.sizes) if self.sizes else sympy.Integer(1)

    def storage_size(self) -> sympy.Expr:
        """Elements the allocation needs: offset + 1 + sum((size-1)*stride)."""
        if any(s == 0 for s in self.sizes):
            return sympy.Integer(0)
        return self.offset + 1 + sum(((sz - 1) * st for sz, st in zip(self.sizes, self.strides)), sympy.Integer(0))


@dataclass(frozen=True)
class Buffer:
    """Base of every named buffer; `origins` are the FX node names it was lowered from."""

    name: str
    layout: Layout
    origins: tuple[str, ...]


@dataclass(frozen=True)
class InputBuffer(Buffer):
    position: int = 0  # placeholder index in the graph


@dataclass(frozen=True)
class ConstantBuffer(Buffer):
    """A tensor constant of the graph (get_attr), passed to kernels like an input."""

    tensor: torch.Tensor = field(default=None, compare=False)  # type: ignore[assignment]


@dataclass(frozen=True)
class Pointwise(Buffer):
    """buffer[layout.index(i)] = body(i) for i over `ranges` (= layout.sizes)."""

    body: Value = None  # type: ignore[assignment]

    @property
    def ranges(self) -> tuple[sympy.Expr, ...]:
        return self.layout.sizes


@dataclass(frozen=True)
class Reduction(Buffer):
    """buffer[layout.index(i)] = reduce_{r} body(i, r); `ranges` are the kept dims (layout.sizes)."""

    body: Value = None  # type: ignore[assignment]
    reduction_ranges: tuple[sympy.Expr, ...] = ()
    reduction_type: str = "sum"  # sum prod max min argmax argmin any all

    @property
    def ranges(self) -> tuple[sympy.Expr, ...]:
        return self.layout.sizes


@dataclass(frozen=True)
class Scan(Buffer):
    """buffer[layout.index(i)] = combine of body(j) over j equal to i except j[dim] <= i[dim]
    (cumsum, cumprod); `ranges` = layout.sizes. Accumulated in `acc_dtype` (ATen's CPU cumulative
    kernels keep a double for float32)."""

    body: Value = None  # type: ignore[assignment]
    dim: int = 0
    scan_type: str = "sum"  # sum prod
    acc_dtype: torch.dtype = torch.float64

    @property
    def ranges(self) -> tuple[sympy.Expr, ...]:
        return self.layout.sizes


@dataclass(frozen=True)
class Scatter(Buffer):
    """In place: target[index(i) + extra] (=|+=) value(i) for i over `ranges`; the result is `target`.
    With a `mask` (the bounds checks of the indirect part), the store happens only where it holds."""

    target: str = ""
    ranges: tuple[sympy.Expr, ...] = ()
    index: sympy.Expr = sympy.Integer(0)
    extra: Value | None = None
    body: Value = None  # type: ignore[assignment]
    mode: str | None = None  # None (store) or "add"
    mask: Value | None = None


@dataclass(frozen=True)
class Extern(Buffer):
    """A call into ATen (mm, convolution, or a fallback); args hold BufferRef / SymExpr / plain values.

    `results` names each tensor the call returns: (buffer name, layout, path into the returned
    tuple); a single-tensor op has one result with path (). `layout` is the first result's.
    """

    op: object = None
    args: tuple = ()
    kwargs: tuple = ()  # sorted (name, value) pairs
    results: tuple[tuple[str, Layout, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class BufferRef:
    """A strided view of a buffer, as an extern argument (materialized with as_strided if needed)."""

    name: str
    layout: Layout


@dataclass(frozen=True)
class SymExpr:
    """A symbolic size used as a plain value (an extern's int argument, a SymInt output)."""

    expr: sympy.Expr


@dataclass(frozen=True)
class LoopIR:
    """The whole lowered graph: buffers in execution order, graph outputs, and the size symbols."""

    buffers: tuple[Buffer, ...]
    outputs: tuple[object, ...]  # BufferRef, SymExpr or a Python constant, one per graph output
    symbols: dict[str, tuple[int, int | None]]  # size symbol -> (input position, dim or None for SymInt)
    seed_needed: bool = False
    output_spec: str | None = None  # pytree spec (treespec_dumps) when the outputs nest, else None
    input_count: int = 0  # the graph's placeholders, also plain ints after the last one read
    # (output index, input position): output k is the new value of that input, which the runtime
    # writes back into it after the call (an optimizer's parameters and state); the wrapper may
    # compute it into the input's own storage instead (memory.input_writes)
    input_updates: tuple[tuple[int, int], ...] = ()
    # size symbols solved from the input sizes that `symbols` reads (kiln.lower.graph.solve_symbols),
    # in binding order: (symbol, expression over symbols bound before it)
    derived: tuple[tuple[str, sympy.Expr], ...] = ()
    # (divisor, checks.zero_division_kind): a `//`, `%` or `/` of Python numbers in the graph
    # whose divisor is an int or float argument; the wrapper raises before its first step when one
    # is 0, as the graph's Python arithmetic would (a kernel computing it would not raise)
    divisors: tuple[tuple[sympy.Expr, str], ...] = ()

    def unbacked_symbols(self) -> tuple[str, ...]:
        """Sizes no input gives: the symbols of a data-dependent size (nonzero's count, unique's
        length) that an extern call's result introduces. The wrapper binds each from the result's
        real size once the call has run; kernels after it take it as an argument."""
        found: dict[str, None] = {}
        for b in self.buffers:
            if isinstance(b, Extern):
                for _, layout, _ in b.results:
                    for size in layout.sizes:
                        if isinstance(size, sympy.Symbol) and str(size) not in self.symbols \
                                and all(str(size) != name for name, _ in self.derived):
                            found[str(size)] = None
        return tuple(found)

    def size_symbols(self) -> set[str]:
        """Every size symbol kernels may use: the inputs' and the unbacked ones."""
        return set(self.symbols) | {name for name, _ in self.derived} | set(self.unbacked_symbols())

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)


# ----------------------------------------------------------------------------- printer, verifier

def format_value(v: Value) -> str:
    if isinstance(v, Const):
        return repr(v.value)
    if isinstance(v, Index):
        return f"index({v.expr})"
    if isinstance(v, Load):
        extra = "" if v.extra is None else f" + {format_value(v.extra)}"
        return f"{v.buffer}[{v.index}{extra}]"
    if isinstance(v, Masked):
        return f"masked({format_value(v.mask)}, {format_value(v.body)}, {format_value(v.other)})"
    assert isinstance(v, Op)
    args = ", ".join(format_value(a) for a in v.args)
    param = "" if v.param is None else f", {v.param}"
    return f"{v.name}({args}{param})"


def format_buffer(b: Buffer) -> str:
    lay = b.layout
    head = f"{b.name}: {str(lay.dtype).replace('torch.', '')}{list(lay.sizes)} strides={list(lay.strides)}"
    origin = f"  # {', '.join(b.origins)}" if b.origins else ""
    if isinstance(b, InputBuffer):
        return f"{head} = input {b.position}{origin}"
    if isinstance(b, ConstantBuffer):
        return f"{head} = constant{origin}"
    if isinstance(b, Pointwise):
        return f"{head} = pointwise {format_value(b.body)}{origin}"
    if isinstance(b, Reduction):
        return (f"{head} = {b.reduction_type} over {list(b.reduction_ranges)} of "
                f"{format_value(b.body)}{origin}")
    if isinstance(b, Scan):
        return f"{head} = cumulative {b.scan_type} over dim {b.dim} of {format_value(b.body)}{origin}"
    if isinstance(b, Scatter):
        how = "+=" if b.mode == "add" else "="
        extra = "" if b.extra is None else f" + {format_value(b.extra)}"
        where = "" if b.mask is None else f" where {format_value(b.mask)}"
        return (f"{head} = scatter {b.target}[{b.index}{extra}] {how} {format_value(b.body)} "
                f"over {list(b.ranges)}{where}{origin}")
    assert isinstance(b, Extern)
    return f"{head} = extern {b.op}{origin}"


def format_ir(ir: LoopIR) -> str:
    lines = [format_buffer(b) for b in ir.buffers]
    lines.append(f"return {ir.outputs}")
    return "\n".join(lines)


_STAGE = "lower_to_loop_ir"  # the pass named by a VerificationError of the loop IR


def _check_size_symbols(b: Buffer, bound: set[str]) -> None:
    """`b`'s sizes, strides, ranges and extern arguments use only size symbols in `bound` (an
    input's own layout is where symbols come from: what reads it is checked)."""
    if isinstance(b, InputBuffer):
        return
    exprs: list[Any] = []
    if not isinstance(b, Extern):
        exprs += [*b.layout.sizes, *b.layout.strides, b.layout.offset]
    exprs += list(getattr(b, "reduction_ranges", ())) + list(getattr(b, "ranges", ()))
    if isinstance(b, Extern):
        for a in pytree.tree_leaves((b.args, b.kwargs)):
            if isinstance(a, BufferRef):
                exprs += [*a.layout.sizes, *a.layout.strides, a.layout.offset]
            elif isinstance(a, SymExpr):
                exprs.append(a.expr)
    unknown = {str(x) for e in exprs for x in getattr(sympy.sympify(e), "free_symbols", ())} - bound
    if unknown:
        raise VerificationError(_STAGE, f"{b.name} has sizes in the symbols {sorted(unknown)}, which no input of "
                                        "the graph gives (a size, a stride, a SymInt) and no earlier extern returns")


def verify_ir(ir: LoopIR) -> None:
    """Each buffer is defined once, each load reads a buffer defined earlier, bodies use only their
    own loop variables, and every size symbol a layout, range or extern argument uses is one the
    wrapper binds (an input's, a solved one, or an earlier extern's unbacked size): a kernel that
    names another fails to build. Explicit checks, not asserts: `python -O` must not turn the seam off."""
    defined: set[str] = set()
    bound: set[str] = {str(s) for s in ir.symbols} | {name for name, _ in ir.derived}
    for b in ir.buffers:
        if b.name in defined:
            raise VerificationError(_STAGE, f"{b.name} is defined twice")
        _check_size_symbols(b, bound)
        bodies: list[Value] = []
        allowed: set[str] = set(bound)
        if isinstance(b, (Pointwise, Reduction, Scan)):
            bodies.append(b.body)
            allowed |= {f"i{k}" for k in range(len(b.layout.sizes))}
            if isinstance(b, Reduction):
                allowed |= {f"r{k}" for k in range(len(b.reduction_ranges))}
        if isinstance(b, Scatter):
            bodies += [b.body] + [v for v in (b.extra, b.mask) if v is not None]
            allowed |= {f"i{k}" for k in range(len(b.ranges))}
            if b.target not in defined:
                raise VerificationError(_STAGE, f"{b.name} scatters into undefined {b.target}")
        for body in bodies:
            for v in walk(body):
                if isinstance(v, Load):
                    if v.buffer not in defined:
                        raise VerificationError(_STAGE, f"{b.name} reads {v.buffer} before it is defined")
                exprs = [v.index] if isinstance(v, Load) else [v.expr] if isinstance(v, Index) else []
                for e in exprs:
                    bad = {str(s) for s in e.free_symbols} - allowed
                    if bad:
                        raise VerificationError(_STAGE, f"{b.name} uses unknown index symbols {bad}")
        if isinstance(b, Extern):
            for a in pytree.tree_leaves((b.args, b.kwargs)):
                if isinstance(a, BufferRef):
                    if a.name not in defined:
                        raise VerificationError(_STAGE, f"{b.name} reads {a.name} before it is defined")
            defined |= {name for name, _, _ in b.results}
            bound |= {str(s) for _, layout, _ in b.results for s in layout.sizes if isinstance(s, sympy.Symbol)}
        defined.add(b.name)
    for o in ir.outputs:
        if isinstance(o, BufferRef):
            if o.name not in defined:
                raise VerificationError(_STAGE, f"output {o.name} is not defined")
