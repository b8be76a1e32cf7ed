"""The `schedule` pass: group the LoopIR's buffers into kernels (fusion) and order the program.

A kernel iterates an outer range O (parallel) and, per outer point, runs blocks: loops over an
inner range R holding pointwise nodes over O+R and reductions over R, and scalar blocks of
pointwise nodes over O. Buffers are taken in program order and join the open kernel when their
ranges fit and every in-kernel buffer they read is read at the point it was written; so a
pointwise chain, a softmax or a layer norm (with what follows it) each become one kernel.
A node over a reshaped range (B*T, C after a (B, T) x (C) layer norm) joins through index arithmetic;
a node that fits no open kernel may join an earlier one once its inputs exist; a cumulative sum
or product (Scan) gets a kernel of its own. A sum over the outer range (a bias or layer-norm weight
gradient: the column sum of a [rows, C] gradient) joins the kernel that makes its rows, each thread
summing its own rows, when the code generator supports it; a sum that starts a kernel and reads
across its layout (train-mode BatchNorm's statistics of an NHWC activation) runs so too, its rows
outer. Buffers read only inside their kernel
never touch memory. Corresponds to torch/_inductor/scheduler.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import sympy
from torch.utils import _pytree as pytree

from kiln.errors import VerificationError
from kiln.lower.ir import (Buffer, BufferRef, ConstantBuffer, Extern, FloorDiv, Index, InputBuffer, Load, LoopIR,
                           ModularIndexing, Pointwise, Reduction, Scan, Scatter, Value, index_vars, verify_ir, walk)
from kiln.runtime.records import strings_in


LoopNode = Pointwise | Reduction | Scan  # what a kernel's blocks hold


@dataclass(frozen=True)
class Block:
    """One inner loop ('loop': nodes over O+R and reductions over R), a 'scalar' block over O, or a
    'scan': one Scan node, O being its other dims and R its scanned dim."""

    kind: str
    nodes: tuple[LoopNode, ...]


@dataclass(frozen=True)
class Kernel:
    name: str
    outer: tuple[sympy.Expr, ...]
    inner: tuple[sympy.Expr, ...]
    blocks: tuple[Block, ...]
    local: frozenset[str] = frozenset()  # buffers kept in registers, never stored
    scratch: frozenset[str] = frozenset()  # buffers kept in a per-thread row buffer, never in memory
    columns: frozenset[str] = frozenset()  # sums over the outer range, accumulated per thread (column_substitution)

    @property
    def nodes(self) -> tuple[LoopNode, ...]:
        return tuple(n for b in self.blocks for n in b.nodes)

    def origins(self) -> list[str]:
        return [o for n in self.nodes for o in n.origins]


@dataclass(frozen=True)
class ScatterKernel:
    name: str
    node: Scatter


@dataclass(frozen=True)
class ExternCall:
    node: Extern


@dataclass(frozen=True)
class KernelProgram:
    """What codegen consumes: the IR and its steps (kernels and extern calls) in order."""

    ir: LoopIR
    steps: tuple[Kernel | ScatterKernel | ExternCall, ...]


def kernel_vars(n_outer: int, n_inner: int) -> tuple[tuple[sympy.Symbol, ...], tuple[sympy.Symbol, ...]]:
    return index_vars("x", n_outer), index_vars("y", n_inner)


def node_substitution(node: Buffer, outer: Sequence[sympy.Expr], inner: Sequence[sympy.Expr]) -> dict | None:
    """Map the node's own index variables to kernel variables, or None if its ranges do not fit.
    An outer variable over a size-1 dim is written 0, as lowering writes a load along such a dim
    (one row's layer norm reads its mean at [0]), so that in-kernel reads match their stores."""
    sub = _substitution(node, outer, inner)
    ones = {x: sympy.Integer(0) for x, r in zip(kernel_vars(len(outer), 0)[0], outer) if r == 1}
    if sub is None or not ones:
        return sub
    return {v: sympy.sympify(e).xreplace(ones) for v, e in sub.items()}


def _substitution(node: Buffer, outer: Sequence[sympy.Expr], inner: Sequence[sympy.Expr]) -> dict | None:
    xs, ys = kernel_vars(len(outer), len(inner))
    if isinstance(node, Reduction):
        if tuple(node.ranges) == tuple(outer) and tuple(node.reduction_ranges) == tuple(inner):
            return {**dict(zip(index_vars("i", len(xs)), xs)), **dict(zip(index_vars("r", len(ys)), ys))}
        return None
    assert isinstance(node, Pointwise)
    own = index_vars("i", len(node.ranges))
    for ranges, kvars in ((tuple(outer) + tuple(inner), xs + ys), (tuple(outer), xs)):
        order = _match(tuple(node.ranges), ranges, storage_order(node))
        if order is not None:
            return {v: kvars[k] for v, k in zip(own, order)}
    for ranges, kvars in ((tuple(outer) + tuple(inner), xs + ys), (tuple(outer), xs)):
        exprs = _reshape(tuple(node.ranges), ranges, kvars)
        if exprs is not None:
            return dict(zip(own, exprs))
    return None


def column_split(node: Buffer, outer: Sequence[sympy.Expr], inner: Sequence[sympy.Expr]) -> int | None:
    """How many leading outer dims a sum over outer dims reduces (the rest of the outer dims and the
    inner ones are kept: a position-embedding gradient sums a [B, T, C] gradient over B only), or
    None when `node` is no such sum (column_substitution)."""
    if not isinstance(node, Reduction) or node.reduction_type != "sum" or not node.layout.dtype.is_floating_point:
        return None
    for split in range(len(outer), 0, -1):
        if _column_map(node, outer, inner, split) is not None:
            return split
    return None


def column_substitution(node: Buffer, outer: Sequence[sympy.Expr], inner: Sequence[sympy.Expr]) -> dict | None:
    """A sum over the kernel's outer range (or its leading dims) kept per remaining point (the bias
    gradient of a linear layer, the weight gradient of a layer norm: a column sum of the [rows, C]
    gradient the kernel makes), as a map of the node's variables (reduced dims to the leading outer
    dims, kept dims to the others), or None. Each thread sums the rows it runs into its own row of
    accumulators; the rows are added in thread order after the loop, so the result does not depend
    on which thread ran first."""
    split = column_split(node, outer, inner)
    return None if split is None else _column_map(node, outer, inner, split)


def _column_map(node: Buffer, outer: Sequence[sympy.Expr], inner: Sequence[sympy.Expr], split: int) -> dict | None:
    assert isinstance(node, Reduction)
    if not outer or not inner:
        return None
    xs, ys = kernel_vars(len(outer), len(inner))
    # size-1 outer dims are 0, as node_substitution writes them
    ones = {x: sympy.Integer(0) for x, r in zip(xs, outer) if r == 1}
    kept_ranges, kept_vars = tuple(outer[split:]) + tuple(inner), tuple(xs[split:]) + tuple(ys)
    # equal ranges map one to one (a size-1 dim keeps its variable, as a pointwise node's does)
    kept = list(kept_vars) if tuple(node.ranges) == kept_ranges else _reshape(tuple(node.ranges), kept_ranges, kept_vars)
    reduced = (list(xs[:split]) if tuple(node.reduction_ranges) == tuple(outer[:split])
               else _reshape(tuple(node.reduction_ranges), tuple(outer[:split]), xs[:split]))
    if kept is None or reduced is None:
        return None
    return {v: sympy.sympify(e).xreplace(ones) for v, e in
            zip(index_vars("i", len(node.ranges)) + index_vars("r", len(node.reduction_ranges)), kept + reduced)}


def kernel_substitution(k: "Kernel", node: Buffer) -> dict | None:
    """The variables of a node placed in kernel `k` as kernel variables."""
    if node.name in k.columns:
        return column_substitution(node, k.outer, k.inner)
    return node_substitution(node, k.outer, k.inner)


def covers_inner(node: Buffer, outer: Sequence[sympy.Expr], inner: Sequence[sympy.Expr]) -> bool:
    """Whether a node placed in a kernel runs over the inner range too (not a scalar node over O)."""
    if isinstance(node, Reduction) or not inner:
        return True
    sub = node_substitution(node, outer, inner)
    ys = set(kernel_vars(len(outer), len(inner))[1])
    return sub is not None and any(e.free_symbols & ys for e in sub.values())


def _reshape(ranges: tuple, kernel_ranges: tuple, kvars: Sequence[sympy.Symbol]) -> list[sympy.Expr] | None:
    """Each node dim as the row-major linear index over a run of consecutive kernel dims whose sizes
    multiply to its size (a node over (B*T, C) inside a kernel over (B, T) x (C), as a layer norm
    followed by a view makes); None when the dims do not group that way. Size-1 dims on either side
    are index 0."""
    exprs: list[sympy.Expr] = []
    k = 0
    for size in ranges:
        if size == 1:
            exprs.append(sympy.Integer(0))
            continue
        group: list[int] = []
        prod: sympy.Expr = sympy.Integer(1)
        while k < len(kernel_ranges) and sympy.expand(prod - size) != 0:
            if kernel_ranges[k] != 1:
                group.append(k)
                prod = prod * kernel_ranges[k]
            k += 1
            if prod.is_number and size.is_number and prod > size:
                return None
        if sympy.expand(prod - size) != 0 or not group:
            return None
        expr, stride = sympy.Integer(0), sympy.Integer(1)
        for j in reversed(group):
            expr, stride = expr + kvars[j] * stride, stride * kernel_ranges[j]
        exprs.append(sympy.expand(expr))
    if any(r != 1 for r in kernel_ranges[k:]):
        return None
    return exprs


MIN_STORAGE_INNER = 8  # a stride-1 dim shorter than this (an image's 3 channels) is no loop to vectorize


def storage_order(node: Buffer) -> tuple[int, ...]:
    """The node's dims from the outermost in memory to the innermost: by decreasing stride (ties and
    size-1 dims keep their place), so (0, 2, 3, 1) for an NCHW-sized buffer stored NHWC. The logical
    order where a size or stride is symbolic, or the stride-1 dim is shorter than MIN_STORAGE_INNER."""
    strides, sizes = node.layout.strides, node.layout.sizes
    dims = tuple(range(len(strides)))
    if not all(getattr(x, "is_number", False) for x in strides + sizes):
        return dims
    movable = [d for d in dims if sizes[d] != 1]
    ranked = sorted(movable, key=lambda d: -int(strides[d]))  # stable: equal strides keep their order
    if not ranked or ranked == movable or int(sizes[ranked[-1]]) < MIN_STORAGE_INNER:
        return dims
    it = iter(ranked)
    return tuple(next(it) if d in movable else d for d in dims)


def _match(ranges: tuple, kernel_ranges: tuple, order: Sequence[int] | None = None) -> list[int] | None:
    """A bijection from a pointwise node's dims to kernel dims of equal size (identity when it
    fits and the node is stored in its logical order): a pointwise loop may run in any order, and
    in-kernel reads are checked after. Dims of one size are taken in the node's storage order
    (`order`, outermost first), so a node stored NHWC in a kernel over (N, H, W) x (C) writes along
    the vectorized loop even when C equals H, and a node over (B, M, N) inside a reduction kernel
    over (M, N) x (B) walks memory as the reduction does, not transposed (which gathered and
    scattered along the vectorized loop)."""
    logical = order is None or list(order) == list(range(len(ranges)))
    if ranges == kernel_ranges and logical:
        return list(range(len(ranges)))
    if len(ranges) != len(kernel_ranges):
        return None
    out = [-1] * len(ranges)  # every dim is placed below: `order` is a permutation of them
    for k in (range(len(ranges)) if order is None else order):
        size = ranges[k]
        nth = sum(1 for j in out if j >= 0 and kernel_ranges[j] == size)
        same = [j for j, s in enumerate(kernel_ranges) if s == size]
        if nth >= len(same):
            return None
        out[k] = same[nth]
    return out


def store_index(node: Buffer, sub: dict) -> sympy.Expr:
    return sympy.expand(node.layout.index(index_vars("i", len(node.layout.sizes))).xreplace(sub))


@dataclass
class _OpenKernel:
    outer: tuple[sympy.Expr, ...]
    inner: tuple[sympy.Expr, ...]
    blocks: list[tuple[str, list[LoopNode]]] = field(default_factory=list)
    stores: dict[str, sympy.Expr] = field(default_factory=dict)  # buffer -> store index in kernel vars
    column_partials: bool = False  # whether sums over the outer range may join (codegen supports them)
    columns: set[str] = field(default_factory=set)

    def place(self, node: LoopNode) -> bool:
        """Add `node` if it fits (ranges and in-kernel reads); returns whether it did."""
        if self.blocks and self.blocks[0][0] == "scan":
            return False  # a cumulative loop runs serially along its dim: nothing else shares it
        sub = node_substitution(node, self.outer, self.inner)
        column = False
        if sub is None and self.column_partials:
            sub = column_substitution(node, self.outer, self.inner)
            column = sub is not None
        if sub is None:
            return False
        produced_in_last: set[str] = set()
        if self.blocks and self.blocks[-1][0] == "loop":
            produced_in_last = {n.name for n in self.blocks[-1][1] if isinstance(n, Reduction)}
        reads_last_reduction = False
        for v in walk(node.body):
            if isinstance(v, Load) and v.buffer in self.columns:
                return False  # a column sum is complete only once the whole kernel has run
            if isinstance(v, Load) and v.buffer in self.stores:
                if v.extra is not None or sympy.expand(v.index.xreplace(sub)) != self.stores[v.buffer]:
                    return False
                reads_last_reduction |= v.buffer in produced_in_last
        scalar = isinstance(node, Pointwise) and not covers_inner(node, self.outer, self.inner) and (
            len(self.inner) > 0 or not self.blocks)
        kind = "scalar" if scalar and self.inner else "loop"
        if self.blocks and self.blocks[-1][0] == kind and not (kind == "loop" and reads_last_reduction):
            self.blocks[-1][1].append(node)
        else:
            self.blocks.append((kind, [node]))
        self.stores[node.name] = store_index(node, sub)
        if column:
            self.columns.add(node.name)
        return True


def reads_across(node: Reduction) -> bool:
    """Whether a reduction walks memory across what it keeps: at least as many of its loads are
    contiguous along its last kept dim (stepping with a stride along its last reduced dim) as along
    its last reduced dim (a per-channel sum of NHWC tensors over N, H and W, perhaps next to the
    graph's contiguous incoming gradient; the column sum of a row-major [rows, C] matrix)."""
    kept, reduced = index_vars("i", len(node.ranges)), index_vars("r", len(node.reduction_ranges))
    if not kept or not reduced:
        return False
    across = along = 0
    for v in walk(node.body):
        if isinstance(v, Load):
            index = sympy.expand(v.index)
            if v.extra is not None or index.has(FloorDiv, ModularIndexing):
                return False
            along += index.coeff(reduced[-1]) == 1
            across += index.coeff(kept[-1]) == 1 and index.coeff(reduced[-1]) != 0
    return across > 0 and across >= along


COLUMN_MIN_KEPT = 8  # kept values per reduced point, side by side, from which a sum across the layout runs with its rows outer


def kept_inside(node: Reduction) -> bool:
    """Whether each reduced point's kept values that lie within the reduced dims' strides (for
    every load) number at least COLUMN_MIN_KEPT: the row loop of a sum across the layout with its
    rows outer walks them in vector lanes. Fewer (a mean over H and W, or a sum over N, H and W, of
    an NHWC tensor with 3 channels) leave that loop too short to vectorize, and its rows visit
    every image at each (h, w): 0.54x eager's speed over 16x3x224x224, 0.25x over 8x3x64x64."""
    kept, reduced = index_vars("i", len(node.ranges)), index_vars("r", len(node.reduction_ranges))
    inside: set[int] = set(range(len(kept)))
    for v in walk(node.body):
        if isinstance(v, Load):
            index = sympy.expand(v.index)
            steps = [sympy.Abs(index.coeff(r)) for r in reduced if index.coeff(r) != 0]
            for d, i in enumerate(kept):
                c = sympy.Abs(index.coeff(i))
                if c != 0 and any((c < s) == sympy.false for s in steps):  # unknown (dynamic sizes): inside
                    inside.discard(d)
    run = sympy.Mul(*(node.ranges[d] for d in inside))
    return not run.is_number or int(run) >= COLUMN_MIN_KEPT  # a dynamic size: as before, rows outer


def _start(node: Pointwise | Reduction, column_partials: bool = False) -> _OpenKernel:
    if isinstance(node, Reduction) and column_partials and len(node.reduction_ranges) > 1 and column_split(
            node, tuple(node.reduction_ranges), tuple(node.ranges)) is not None and reads_across(node) and kept_inside(node):
        # a sum across the layout over several reduced dims (train-mode BatchNorm's statistics of
        # an NHWC activation; a 2-D column sum keeps the tiled column kernel, which also holds the
        # max and mean beside it): the reduced dims become the outer loop, each thread adding its rows into its own row of
        # accumulators along the contiguous kept dim (column_substitution), instead of a loop per
        # kept point that gathers with a stride
        k = _OpenKernel(tuple(node.reduction_ranges), tuple(node.ranges), column_partials=True)
        if k.place(node):
            return k
    if isinstance(node, Reduction):
        k = _OpenKernel(tuple(node.ranges), tuple(node.reduction_ranges), column_partials=column_partials)
    else:  # loops in the order the node is stored, the innermost (vectorized) along its stride-1 dim
        ranges = tuple(node.layout.sizes[d] for d in storage_order(node))
        k = _OpenKernel(ranges[:-1], ranges[-1:], column_partials=column_partials)
    assert k.place(node)
    return k


def _regroup(k: _OpenKernel, node: Reduction) -> _OpenKernel | None:
    """A pointwise-only kernel over O+R taken over by a reduction over O x R."""
    if any(kind != "loop" or any(isinstance(n, Reduction) for n in nodes) for kind, nodes in k.blocks):
        return None
    if tuple(node.ranges) + tuple(node.reduction_ranges) != k.outer + k.inner:
        return None
    new = _OpenKernel(tuple(node.ranges), tuple(node.reduction_ranges), column_partials=k.column_partials)
    for _, nodes in k.blocks:
        for n in nodes:
            if not new.place(n):
                return None
    return new if new.place(node) else None


def _in_storage_order(k: _OpenKernel) -> _OpenKernel:
    """A kernel of pointwise nodes only, run again in the storage order of the last buffer it makes
    that is not stored in its logical order (an NHWC activation after a convolution, whose first
    node may be a temporary in NCHW order), when every node still fits; else `k` as it is."""
    nodes = [n for _, ns in k.blocks for n in ns]
    if k.columns or any(kind == "scan" for kind, _ in k.blocks) or not all(isinstance(n, Pointwise) for n in nodes):
        return k
    total = sympy.Mul(*k.outer, *k.inner)
    for n in reversed(nodes):
        order = storage_order(n)
        if list(order) == list(range(len(order))) or sympy.expand(n.layout.numel() - total) != 0:
            continue
        ranges = tuple(n.layout.sizes[d] for d in order)
        if ranges == k.outer + k.inner:
            return k
        new = _OpenKernel(ranges[:-1], ranges[-1:], column_partials=k.column_partials)
        return new if all(new.place(m) for m in nodes) else k
    return k


HOIST_WINDOW = 4  # steps a buffer may move up: further would keep its memory alive (and out of cache) longer


def _symbols_used(b: Pointwise | Reduction) -> set[str]:
    """The size symbols `b` reads: in its layout and ranges, its loads' indices and its body's index values."""
    exprs: list = [*b.layout.sizes, *b.layout.strides, b.layout.offset, *getattr(b, "reduction_ranges", ())]
    for v in walk(b.body):
        if isinstance(v, Load):
            exprs.append(v.index)
        elif isinstance(v, Index):
            exprs.append(v.expr)
    return {str(s) for e in exprs for s in getattr(e, "free_symbols", ())}


def schedule(ir: LoopIR, *, unfused: frozenset[str] = frozenset(), column_partials: bool = False) -> KernelProgram:
    """Greedy fusion in program order, then the choice of which buffers stay in registers.

    A buffer that fits neither the open kernel nor a regrouping of it may join an earlier kernel
    instead, when everything it reads exists by then (the copies that split q, k and v for attention
    sit on both sides of a bmm: they become one kernel); it never moves past a scatter, which writes
    in place. A buffer named in `unfused` gets a kernel of its own (the bisector's fusion switch).
    With `column_partials` (the C++ code generator's), a sum over the rows of what a kernel makes
    joins it (column_substitution) instead of reading it back in a kernel of its own."""
    fuser = _Fuser(ir, unfused, column_partials)
    for b in ir.buffers:
        fuser.add(b)
    fuser.close()
    return KernelProgram(ir, tuple(_mark_local(_named(fuser.steps), ir)))


class _Fuser:
    """The steps of a program as fusion builds them, buffer after buffer (see `schedule`)."""

    def __init__(self, ir: LoopIR, unfused: frozenset[str], column_partials: bool) -> None:
        self.unfused = unfused
        self.column_partials = column_partials
        self.steps: list[_OpenKernel | ScatterKernel | ExternCall] = []
        self.alone: set[int] = set()  # steps holding an unfused buffer: nothing may join them
        self.produced: dict[str, int] = {}  # buffer -> index in steps of what makes it
        self.bound_at: dict[str, int] = {}  # unbacked size symbol -> index of the extern whose result gives it
        self.open_kernel: _OpenKernel | None = None
        # A graph output lives to the end anyway: it may move up as far as its inputs allow (a saved
        # activation the min-cut partitioner hands the backward joins the kernel that reads its inputs,
        # instead of a kernel of its own at the end of the forward).
        self.outputs = {o.name for o in ir.outputs if isinstance(o, BufferRef)}

    def add(self, b: Buffer) -> None:
        if isinstance(b, (Pointwise, Reduction)) and b.name in self.unfused:
            self.close()
            self._append(_start(b, self.column_partials), b.name)
            self.alone.add(len(self.steps) - 1)
        elif isinstance(b, (Pointwise, Reduction)):
            self._fuse(b)
        elif isinstance(b, Scan):
            self.close()
            ranges = tuple(b.ranges)
            self._append(_OpenKernel(ranges[:b.dim] + ranges[b.dim + 1:], ranges[b.dim:b.dim + 1], [("scan", [b])]),
                         b.name)
        elif isinstance(b, Scatter):
            self.close()
            self._append(ScatterKernel("", b), b.name)
        elif isinstance(b, Extern):
            self.close()
            self._append(ExternCall(b), *(name for name, _, _ in b.results), b.name)
            for _, layout, _ in b.results:
                for size in layout.sizes:
                    if isinstance(size, sympy.Symbol):
                        self.bound_at.setdefault(str(size), len(self.steps) - 1)

    def _append(self, step: _OpenKernel | ScatterKernel | ExternCall, *makes: str) -> None:
        self.steps.append(step)
        for name in makes:
            self.produced[name] = len(self.steps) - 1

    def _fuse(self, b: Pointwise | Reduction) -> None:
        """`b` into the open kernel, a regrouping of it, or an earlier kernel; else a new open kernel."""
        if self.open_kernel is not None and self.open_kernel.place(b):
            return
        if self.open_kernel is not None and isinstance(b, Reduction):
            regrouped = _regroup(self.open_kernel, b)
            if regrouped is not None:
                self.open_kernel = regrouped
                return
        if self._hoist(b):
            return
        self.close()
        self.open_kernel = _start(b, self.column_partials)

    def close(self) -> None:
        if self.open_kernel is not None:
            self._append(self.open_kernel, *(n.name for _, nodes in self.open_kernel.blocks for n in nodes))
        self.open_kernel = None

    def _hoist(self, b: Pointwise | Reduction) -> bool:
        """Whether `b` joined an earlier kernel."""
        reads = {v.buffer for v in walk(b.body) if isinstance(v, Load)}
        if self.open_kernel is not None and reads & set(self.open_kernel.stores):
            return False
        ready = max((self.produced.get(name, -1) for name in reads), default=-1)
        # a size an extern's result gives (nonzero's count) exists only once that extern has run
        ready = max([ready] + [self.bound_at[name] for name in _symbols_used(b) if name in self.bound_at])
        if b.name in self.outputs:
            # the earliest kernel that takes it, after the last scatter (which writes in place)
            first = max([ready, 0] + [s + 1 for s, step in enumerate(self.steps) if isinstance(step, ScatterKernel)])
            return any(self._join(s, b) for s in range(first, len(self.steps)))
        for s in range(len(self.steps) - 1, max(ready, 0, len(self.steps) - HOIST_WINDOW) - 1, -1):
            if isinstance(self.steps[s], ScatterKernel):
                return False
            if self._join(s, b):
                return True
        return False

    def _join(self, s: int, b: Pointwise | Reduction) -> bool:
        """Whether `b` joined the kernel of step `s`."""
        step = self.steps[s]
        if s in self.alone or not isinstance(step, _OpenKernel) or not step.place(b):
            return False
        self.produced[b.name] = s
        return True


def _named(steps: list[_OpenKernel | ScatterKernel | ExternCall]) -> list[Kernel | ScatterKernel | ExternCall]:
    """The finished steps, their kernels named in program order."""
    done: list[Kernel | ScatterKernel | ExternCall] = []
    count = 0
    for step in steps:
        if isinstance(step, _OpenKernel):
            step = _in_storage_order(step)
            blocks = tuple(Block(kind, tuple(nodes)) for kind, nodes in step.blocks)
            done.append(Kernel(f"kernel{count}", step.outer, step.inner, blocks, columns=frozenset(step.columns)))
            count += 1
        elif isinstance(step, ScatterKernel):
            done.append(ScatterKernel(f"kernel{count}", step.node))
            count += 1
        else:
            done.append(step)
    return done


def _mark_local(steps: list, ir: LoopIR) -> list:
    """A buffer stays in registers when it is no output and only its own kernel reads it, in the
    same block (or, for a reduction or scalar result, anywhere in the kernel after it)."""
    readers: dict[str, set[tuple[int, int]]] = {}
    for s, step in enumerate(steps):
        bodies: list[tuple[int, Value]] = []
        if isinstance(step, Kernel):
            bodies = [(k, n.body) for k, blk in enumerate(step.blocks) for n in blk.nodes]
        elif isinstance(step, ScatterKernel):
            bodies = [(0, v) for v in (step.node.body, step.node.extra, step.node.mask) if v is not None]
            readers.setdefault(step.node.target, set()).add((s, -1))
        else:
            for a in pytree.tree_leaves((step.node.args, step.node.kwargs)):
                if isinstance(a, BufferRef):
                    readers.setdefault(a.name, set()).add((s, -1))
        for k, body in bodies:
            for v in walk(body):
                if isinstance(v, Load):
                    readers.setdefault(v.buffer, set()).add((s, k))
    outputs = {o.name for o in ir.outputs if isinstance(o, BufferRef)}
    result = []
    for s, step in enumerate(steps):
        if not isinstance(step, Kernel):
            result.append(step)
            continue
        local, scratch = set(), set()
        for k, blk in enumerate(step.blocks):
            for n in blk.nodes:
                if n.name in outputs:
                    continue
                reads = readers.get(n.name, set())
                if not reads or any(r[0] != s for r in reads):
                    continue
                in_registers = isinstance(n, Reduction) or blk.kind == "scalar"
                if in_registers or all(r[1] == k for r in reads):
                    local.add(n.name)
                elif step.outer and isinstance(n, Pointwise) and covers_inner(n, step.outer, step.inner):
                    scratch.add(n.name)  # read by a later loop of the same outer point: one row suffices
        result.append(Kernel(step.name, step.outer, step.inner, step.blocks, frozenset(local), frozenset(scratch),
                             step.columns))
    return result


def verify_program(program: KernelProgram) -> None:
    """The schedule -> codegen seam, checked in one pass over the steps: every computed buffer of the
    IR is made by exactly one step, each step reads only inputs, constants and buffers made before
    it (or earlier in its own kernel), kernel names are unique, and a buffer kept in registers or a
    row buffer belongs to its kernel and is no graph output. Raises VerificationError."""
    computed = {b.name for b in program.ir.buffers if not isinstance(b, (InputBuffer, ConstantBuffer))}
    available = {b.name for b in program.ir.buffers if isinstance(b, (InputBuffer, ConstantBuffer))}
    outputs = {o.name for o in program.ir.outputs if isinstance(o, BufferRef)}
    made: set[str] = set()
    names: set[str] = set()

    def fail(message: str) -> None:
        raise VerificationError("schedule", message)

    def reads(step_name: str, body: Value | None) -> None:
        for v in walk(body) if body is not None else ():
            if isinstance(v, Load) and v.buffer not in available:
                fail(f"{step_name} reads {v.buffer} before a step makes it")

    def makes(step_name: str, buffer_name: str) -> None:
        if buffer_name in made:
            fail(f"{step_name} makes {buffer_name}, which an earlier step made")
        made.add(buffer_name)
        available.add(buffer_name)

    for step in program.steps:
        if isinstance(step, ExternCall):
            for a in pytree.tree_leaves((step.node.args, step.node.kwargs)):
                if isinstance(a, BufferRef) and a.name not in available:
                    fail(f"extern {step.node.name} reads {a.name} before a step makes it")
            makes(f"extern {step.node.name}", step.node.name)
            available.update(name for name, _, _ in step.node.results)
            continue
        if step.name in names:
            fail(f"two kernels are named {step.name}")
        names.add(step.name)
        if isinstance(step, ScatterKernel):
            if step.node.target not in available:
                fail(f"{step.name} scatters into {step.node.target} before a step makes it")
            for body in (step.node.body, step.node.extra, step.node.mask):
                reads(step.name, body)
            makes(step.name, step.node.name)
            continue
        nodes = {n.name for n in step.nodes}
        for n in step.nodes:
            reads(step.name, getattr(n, "body", None))
            makes(step.name, n.name)
        for n in step.nodes:
            if any(isinstance(v, Load) and v.buffer in step.columns for v in walk(n.body)):
                fail(f"{step.name}: {n.name} reads a column sum of its own kernel, complete only after it")
        for name in step.columns:
            node = next((n for n in step.nodes if n.name == name), None)
            if node is None or column_substitution(node, step.outer, step.inner) is None:
                fail(f"{step.name} accumulates {name} per thread, but it is no column sum of the kernel")
        for kept in step.local | step.scratch:
            if kept not in nodes or kept in outputs:
                fail(f"{step.name} keeps {kept} out of memory, but it is "
                     f"{'a graph output' if kept in outputs else 'not one of its nodes'}")
    missing = computed - made
    if missing:
        fail(f"no step makes {sorted(missing)}")


# Where a program holds strings that are values, not names: an extern's arguments and a graph's
# constant outputs (printed as literals: repr in the Python wrapper, escaped in the native one) and
# the outputs' pytree spec (parsed by torch's own reader, never printed into code). An extern's
# keyword names are names, checked on their own.
_VALUE_FIELDS = frozenset({"Extern.args", "Extern.kwargs", "LoopIR.outputs", "LoopIR.output_spec"})


def check_stored_program(program: object) -> KernelProgram:
    """A program read back from the disk cache, checked before code is generated from it: a
    KernelProgram whose every name is an identifier (code generators print names as they are, so a
    buffer named `x; system(...)` would be code) and that passes the IR and schedule verifiers.
    ValueError otherwise."""
    if not isinstance(program, KernelProgram) or not isinstance(program.ir, LoopIR):
        raise ValueError(f"not a kernel program: {type(program).__name__}")
    for owner, text in strings_in(program):
        if owner not in _VALUE_FIELDS and not text.isidentifier():
            raise ValueError(f"{owner} holds {text[:40]!r}, not a name")
    for b in program.ir.buffers:
        if isinstance(b, Extern) and not all(isinstance(kw, tuple) and len(kw) == 2 and isinstance(kw[0], str)
                                             and kw[0].isidentifier() for kw in b.kwargs):
            raise ValueError(f"{b.name}'s keyword arguments are not (name, value) pairs")
    try:
        verify_ir(program.ir)
        verify_program(program)
    except VerificationError as exc:
        raise ValueError(str(exc)) from exc
    return program


def format_program(program: KernelProgram) -> str:
    """The schedule as text: per step, a kernel's ranges and blocks with the buffers fused into it
    (those kept in registers or a row buffer marked), or an extern call."""
    lines = []
    for s in program.steps:
        if isinstance(s, Kernel):
            lines.append(f"{s.name}: outer {list(s.outer)} inner {list(s.inner)}")
            for blk in s.blocks:
                names = [n.name + (" (register)" if n.name in s.local else " (row)" if n.name in s.scratch
                                   else " (column)" if n.name in s.columns else "")
                         for n in blk.nodes]
                lines.append(f"    {blk.kind}: {', '.join(names)}")
        elif isinstance(s, ScatterKernel):
            lines.append(f"{s.name}: scatter {s.node.name} into {s.node.target}")
        else:
            lines.append(f"extern {s.node.name} = {s.node.op}  # {', '.join(s.node.origins)}")
    return "\n".join(lines) + "\n"
