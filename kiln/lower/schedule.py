"""The `schedule` pass: group the LoopIR's buffers into kernels (fusion) and order the program.

A kernel iterates an outer range O (parallel) and, per outer point, runs blocks: loops over an
inner range R holding pointwise nodes over O+R and reductions over R, and scalar blocks of
pointwise nodes over O. Buffers are taken in program order and join the open kernel when their
ranges fit and every in-kernel buffer they read is read at the point it was written; so a
pointwise chain, a softmax or a layer norm (with what follows it) each become one kernel.
Buffers read only inside their kernel never touch memory. Corresponds to torch/_inductor/scheduler.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import sympy

from kiln.lower.ir import (Buffer, BufferRef, Extern, Load, LoopIR, Pointwise, Reduction, Scatter, Value,
                           index_vars, walk)


@dataclass(frozen=True)
class Block:
    """One inner loop ('loop': nodes over O+R and reductions over R) or a 'scalar' block over O."""

    kind: str
    nodes: tuple[Buffer, ...]


@dataclass(frozen=True)
class Kernel:
    name: str
    outer: tuple[sympy.Expr, ...]
    inner: tuple[sympy.Expr, ...]
    blocks: tuple[Block, ...]
    local: frozenset[str] = frozenset()  # buffers kept in registers, never stored
    scratch: frozenset[str] = frozenset()  # buffers kept in a per-thread row buffer, never in memory

    @property
    def nodes(self) -> tuple[Buffer, ...]:
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
    """Map the node's own index variables to kernel variables, or None if its ranges do not fit."""
    xs, ys = kernel_vars(len(outer), len(inner))
    if isinstance(node, Reduction):
        if tuple(node.ranges) == tuple(outer) and tuple(node.reduction_ranges) == tuple(inner):
            return {**dict(zip(index_vars("i", len(xs)), xs)), **dict(zip(index_vars("r", len(ys)), ys))}
        return None
    assert isinstance(node, Pointwise)
    for ranges, kvars in ((tuple(outer) + tuple(inner), xs + ys), (tuple(outer), xs)):
        order = _match(tuple(node.ranges), ranges)
        if order is not None:
            return {v: kvars[k] for v, k in zip(index_vars("i", len(order)), order)}
    return None


def _match(ranges: tuple, kernel_ranges: tuple) -> list[int] | None:
    """A bijection from a pointwise node's dims to kernel dims of equal size (identity when it
    fits): a pointwise loop may run in any order, and in-kernel reads are checked after."""
    if ranges == kernel_ranges:
        return list(range(len(ranges)))
    if len(ranges) != len(kernel_ranges):
        return None
    free = list(range(len(kernel_ranges)))
    order = []
    for k, size in enumerate(ranges):
        pick = k if k in free and kernel_ranges[k] == size else next(
            (j for j in free if kernel_ranges[j] == size), None)
        if pick is None:
            return None
        free.remove(pick)
        order.append(pick)
    return order


def store_index(node: Buffer, sub: dict) -> sympy.Expr:
    return sympy.expand(node.layout.index(index_vars("i", len(node.layout.sizes))).xreplace(sub))


@dataclass
class _OpenKernel:
    outer: tuple[sympy.Expr, ...]
    inner: tuple[sympy.Expr, ...]
    blocks: list[tuple[str, list[Buffer]]] = field(default_factory=list)
    stores: dict[str, sympy.Expr] = field(default_factory=dict)  # buffer -> store index in kernel vars

    def place(self, node: Buffer) -> bool:
        """Add `node` if it fits (ranges and in-kernel reads); returns whether it did."""
        sub = node_substitution(node, self.outer, self.inner)
        if sub is None:
            return False
        produced_in_last: set[str] = set()
        if self.blocks and self.blocks[-1][0] == "loop":
            produced_in_last = {n.name for n in self.blocks[-1][1] if isinstance(n, Reduction)}
        reads_last_reduction = False
        for v in walk(node.body):
            if isinstance(v, Load) and v.buffer in self.stores:
                if v.extra is not None or sympy.expand(v.index.xreplace(sub)) != self.stores[v.buffer]:
                    return False
                reads_last_reduction |= v.buffer in produced_in_last
        scalar = isinstance(node, Pointwise) and len(node.ranges) == len(self.outer) and (
            len(self.inner) > 0 or not self.blocks)
        kind = "scalar" if scalar and self.inner else "loop"
        if self.blocks and self.blocks[-1][0] == kind and not (kind == "loop" and reads_last_reduction):
            self.blocks[-1][1].append(node)
        else:
            self.blocks.append((kind, [node]))
        self.stores[node.name] = store_index(node, sub)
        return True


def _start(node: Buffer) -> _OpenKernel:
    if isinstance(node, Reduction):
        k = _OpenKernel(tuple(node.ranges), tuple(node.reduction_ranges))
    else:
        ranges = tuple(node.layout.sizes)
        k = _OpenKernel(ranges[:-1], ranges[-1:])
    assert k.place(node)
    return k


def _regroup(k: _OpenKernel, node: Reduction) -> _OpenKernel | None:
    """A pointwise-only kernel over O+R taken over by a reduction over O x R."""
    if any(kind != "loop" or any(isinstance(n, Reduction) for n in nodes) for kind, nodes in k.blocks):
        return None
    if tuple(node.ranges) + tuple(node.reduction_ranges) != k.outer + k.inner:
        return None
    new = _OpenKernel(tuple(node.ranges), tuple(node.reduction_ranges))
    for _, nodes in k.blocks:
        for n in nodes:
            if not new.place(n):
                return None
    return new if new.place(node) else None


def schedule(ir: LoopIR) -> KernelProgram:
    """Greedy fusion in program order, then the choice of which buffers stay in registers."""
    steps: list[Kernel | ScatterKernel | ExternCall] = []
    open_kernel: _OpenKernel | None = None
    count = 0

    def close() -> None:
        nonlocal open_kernel, count
        if open_kernel is not None:
            blocks = tuple(Block(kind, tuple(nodes)) for kind, nodes in open_kernel.blocks)
            steps.append(Kernel(f"kernel{count}", open_kernel.outer, open_kernel.inner, blocks))
            count += 1
        open_kernel = None

    for b in ir.buffers:
        if isinstance(b, (Pointwise, Reduction)):
            if open_kernel is not None and open_kernel.place(b):
                continue
            if open_kernel is not None and isinstance(b, Reduction):
                regrouped = _regroup(open_kernel, b)
                if regrouped is not None:
                    open_kernel = regrouped
                    continue
            close()
            open_kernel = _start(b)
        elif isinstance(b, Scatter):
            close()
            steps.append(ScatterKernel(f"kernel{count}", b))
            count += 1
        elif isinstance(b, Extern):
            close()
            steps.append(ExternCall(b))
    close()
    return KernelProgram(ir, tuple(_mark_local(steps, ir)))


def _mark_local(steps: list, ir: LoopIR) -> list:
    """A buffer stays in registers when it is no output and only its own kernel reads it, in the
    same block (or, for a reduction or scalar result, anywhere in the kernel after it)."""
    readers: dict[str, set[tuple[int, int]]] = {}
    for s, step in enumerate(steps):
        bodies: list[tuple[int, Value]] = []
        if isinstance(step, Kernel):
            bodies = [(k, n.body) for k, blk in enumerate(step.blocks) for n in blk.nodes]
        elif isinstance(step, ScatterKernel):
            bodies = [(0, step.node.body)] + ([(0, step.node.extra)] if step.node.extra is not None else [])
            readers.setdefault(step.node.target, set()).add((s, -1))
        else:
            from torch.utils import _pytree as pytree
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
                elif step.outer and isinstance(n, Pointwise) and len(n.ranges) == len(step.outer) + len(step.inner):
                    scratch.add(n.name)  # read by a later loop of the same outer point: one row suffices
        result.append(Kernel(step.name, step.outer, step.inner, step.blocks, frozenset(local), frozenset(scratch)))
    return result


def format_program(program: KernelProgram) -> str:
    """The schedule as text: per step, a kernel's ranges and blocks with the buffers fused into it
    (those kept in registers or a row buffer marked), or an extern call."""
    lines = []
    for s in program.steps:
        if isinstance(s, Kernel):
            lines.append(f"{s.name}: outer {list(s.outer)} inner {list(s.inner)}")
            for blk in s.blocks:
                names = [n.name + (" (register)" if n.name in s.local else " (row)" if n.name in s.scratch else "")
                         for n in blk.nodes]
                lines.append(f"    {blk.kind}: {', '.join(names)}")
        elif isinstance(s, ScatterKernel):
            lines.append(f"{s.name}: scatter {s.node.name} into {s.node.target}")
        else:
            lines.append(f"extern {s.node.name} = {s.node.op}  # {', '.join(s.node.origins)}")
    return "\n".join(lines) + "\n"
