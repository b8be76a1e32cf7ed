"""C++ kernel functions: the loop nests of each scheduled Kernel around the bodies of codegen/cpp.py.

A row kernel runs its outer range under `#pragma omp parallel for` and, per outer point, its blocks:
simd loops over the inner range holding pointwise stores and reductions (per-thread accumulators with
OpenMP reduction clauses, NaN tracked on the side for max/min), and scalar statements. A reduction
over a strided dim is tiled across outputs instead (codegen/cpp_loops.py). `generate` makes the one
translation unit of a KernelProgram. Corresponds to the kernel classes of torch/_inductor/codegen/cpp.py.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import sympy
import torch

from kiln.lower.checks import ERROR_RECORD
from kiln.lower.codegen.cpp import CTYPE, PARALLEL_MIN, CppBodyWriter, _speculable, cexpr, compute, prelude
from kiln.lower.codegen.cpp_loops import (COLUMN_CHUNK, MAX_CUT_LOOPS, OMP_REDUCTION, Span, TileKernels, _block_node,
                                          _blocked_copy, chunked_sums, _column_reduction, _itemsize, _ivars,
                                          _linear, _loops, _reduce_init, _simd_loops, _tiled_rows, inner_cut,
                                          serial_at_one_thread, taking_side)
from kiln.lower.codegen.cpp_row_tiles import RowTileKernels, row_tiles
from kiln.lower.codegen.cpp_scan import ScanKernels
from kiln.lower.codegen.cpp_sums import SUM_CHUNK, SumKernels, _lane_sums, _short_row_lanes
from kiln.lower.codegen.memory import aliasing_args, in_place_donors
from kiln.lower.ir import (Buffer, FloorDiv, Index, Load, Masked, ModularIndexing, Op, Pointwise, Reduction,
                           Value, contiguous_strides, walk)
from kiln.lower.schedule import (Block, Kernel, KernelProgram, ScatterKernel, column_split, kernel_substitution,
                                 kernel_vars, node_substitution)
from kiln.symbolic.expr import is_float_symbol


def _accumulators(reds: Sequence[Reduction], accs: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """For the reductions of a loop: the declarations before it, the statements after it (a max or
    min that saw a NaN becomes NaN), and the loop's OpenMP reduction clauses."""
    pre, post, clauses = [], [], []
    for n in reds:
        T = CTYPE[compute(n.body.dtype)] if n.reduction_type in ("argmax", "argmin") else CTYPE[compute(n.layout.dtype)]
        if n.reduction_type in ("argmax", "argmin"):
            pre.append(f"{T} best_{n.name} = 0; int64_t {accs[n.name]} = 0;")
            continue
        dtype = n.layout.dtype
        rtype = n.reduction_type
        if dtype == torch.bool and rtype in ("max", "min"):
            rtype = "any" if rtype == "max" else "all"
        pre.append(f"{T} {accs[n.name]} = {_reduce_init(rtype, dtype)};")
        clauses.append(f"reduction({OMP_REDUCTION[rtype]}:{accs[n.name]})")
        if rtype in ("max", "min") and dtype.is_floating_point:
            pre.append(f"int nan_{n.name} = 0;")
            clauses.append(f"reduction(|:nan_{n.name})")
            post.append(f"if (nan_{n.name}) {accs[n.name]} = std::numeric_limits<{T}>::quiet_NaN();")
    return pre, post, clauses


class KernelWriter(TileKernels, ScanKernels, SumKernels, RowTileKernels):
    """Renders one Kernel (or ScatterKernel) as a C++ function and records its argument list."""

    def __init__(self, storage: dict[str, torch.dtype], size_symbols: set[str]) -> None:
        self.storage = storage
        self.size_symbols = size_symbols
        self.counter = [0]
        self.cut_loops = 0  # loops the kernel's blocks were cut into so far (_cut_block)
        self.reads: list[str] = []
        self.writes: list[str] = []
        self.aliasing: frozenset[str] = frozenset()  # args the memory plan may give one storage: not __restrict__
        self.row_mask: tuple[str, frozenset] | None = None  # a padded row loop's lane test (_padded_row)

    def _note(self, names: list[str], name: str) -> None:
        if name not in names:
            names.append(name)

    def _collect_reads(self, w: CppBodyWriter, v: Value, local: frozenset[str]) -> None:
        from kiln.lower.ir import walk
        for n in walk(v):
            if isinstance(n, Load) and n.buffer not in local:
                self._note(self.reads, n.buffer)

    def kernel(self, k: Kernel) -> tuple[str, list[str]]:
        if k.blocks and k.blocks[0].kind == "scan":
            return self.scan_kernel(k)
        if _column_reduction(k):
            return self.column_kernel(k)
        if _tiled_rows(k):
            return self.tiled_rows_kernel(k)
        if _blocked_copy(k):
            return self.blocked_copy_kernel(k)
        in_output = {} if k.columns else _rows_in_output(k)
        if row_tiles(k, in_output):
            return self.row_tile_kernel(k, in_output, ADAPTIVE_THREADS_MAX)
        xs, ys = kernel_vars(len(k.outer), len(k.inner))
        locals_: dict = {}
        self.cut_loops = 0
        total = sympy.Mul(*k.outer, *k.inner)
        parallel_if = f" if({cexpr(total)} >= {PARALLEL_MIN})" if not total.is_number else ""
        parallel = not (total.is_number and total < PARALLEL_MIN)
        # a loop this long amortizes even a slow join of the second thread: it never adapts to load
        self.adaptive_threads = not (total.is_number and total >= ADAPTIVE_THREADS_MAX)
        self.scratch = {name: {x: sympy.Integer(0) for x in xs} for name in k.scratch if name not in in_output}
        self.scratch.update(in_output)
        self.hidden = k.local | k.scratch
        rows = self._scratch_rows(k, xs, ys)
        on_stack = all(size.is_number for size, _ in rows.values()) and sum(
            int(size) * _itemsize(self.storage[name]) for name, (size, _) in rows.items()) <= STACK_SCRATCH_BYTES
        body = self._outer_open(k, xs, rows, on_stack, parallel, parallel_if) + self._prefetch_next_row(k, xs, ys)
        for blk in k.blocks:
            if blk.kind == "scalar":
                for n in blk.nodes:
                    body += self._node(n, k, locals_, None)
            else:
                body += self._loop_block(blk, k, ys, locals_, parallel, parallel_if)
        if k.outer:
            if k.columns and self._flushed_columns(k):
                body += [f"if (++kiln_rows == {COLUMN_CHUNK}) {{", *self._columns_flush(k), "kiln_rows = 0;", "}"]
            body += ["}"] * len(k.outer)
        if k.columns:
            body += self._columns_close(k, ys, on_stack)
        elif k.outer and rows and not on_stack:
            body += [f"std::free({name});" for name in sorted(rows)] + ["}"]
        return self._function(k.name, k.origins(), body), self.reads + self.writes

    def _outer_open(self, k: Kernel, xs: Sequence[sympy.Symbol], rows: dict, on_stack: bool, parallel: bool,
                    parallel_if: str) -> list[str]:
        """The opening of a row kernel's outer loop nest, with its scratch rows and parallel region."""
        if k.columns:
            return self._columns_open(k, xs, rows, on_stack, parallel, parallel_if)
        if k.outer and rows and on_stack:
            # a row buffer on the stack of each outer iteration: the compiler sees it aliases nothing
            # (a malloc'd pointer shared through an OpenMP region does not vectorize as well)
            o, _ = _loops(xs, k.outer, f"#pragma omp parallel for@collapse{parallel_if}" if parallel else None)
            return o + [f"alignas(64) {T} {name}[{int(size)}];" for name, (size, T) in sorted(rows.items())]
        if k.outer and rows:
            # each thread gets one row buffer per scratch buffer, allocated once around the loop
            body = [f"#pragma omp parallel{parallel_if}" if parallel else "// one thread", "{"]
            for name, (size, T) in sorted(rows.items()):
                body.append(f"{T}* {name} = static_cast<{T}*>(std::malloc(sizeof({T}) * ({cexpr(size)})));")
            o, _ = _loops(xs, k.outer, "#pragma omp for@collapse" if parallel else None)
            return body + o
        if k.outer:
            o, _ = _loops(xs, k.outer, f"#pragma omp parallel for@collapse{parallel_if}" if parallel else None)
            return o
        return []

    def _prefetch_next_row(self, k: Kernel, xs: Sequence[sympy.Symbol], ys: Sequence[sympy.Symbol]) -> list[str]:
        """At the start of a row of a row reduction, prefetch the start of the next row of each input
        the row reads contiguously. A row's passes (a softmax's max, exp and scale) are compute-bound
        on data already in L1, and the hardware prefetcher, which follows one stream, does not fetch
        the next row while they run: each row began with a wait for memory (softmax over 4096x1024
        floats at 1 thread: 0.86x -> 1.0x eager). Prefetches do not fault, so the last row needs no
        test; at most PREFETCH_ROW_BYTES per input, so that long rows do not evict the current one."""
        if not k.outer or not k.inner or k.columns or not any(
                isinstance(n, Reduction) for blk in k.blocks if blk.kind != "scalar" for n in blk.nodes):
            return []
        last = xs[-1]
        strides = contiguous_strides(k.inner)
        starts: dict[tuple[str, sympy.Expr], sympy.Expr] = {}
        for blk in k.blocks:
            if blk.kind == "scalar":
                continue
            for node in blk.nodes:
                sub = kernel_substitution(k, node)
                if sub is None:
                    continue
                for v in walk(node.body):
                    if not isinstance(v, Load) or v.extra is not None or v.buffer in self.hidden:
                        continue
                    key = sympy.expand(v.index.xreplace(sub))
                    if key.atoms(FloorDiv, ModularIndexing):
                        continue
                    # the row is one contiguous run (the inner vars step as a row-major walk) that
                    # moves with the last outer variable (a broadcast input stays in cache anyway)
                    if any(sympy.diff(key, y) != st for y, st in zip(ys, strides)):
                        continue
                    step = sympy.diff(key, last)
                    if step == 0 or step.has(*xs, *ys):
                        continue
                    row_start = key.xreplace({y: sympy.Integer(0) for y in ys})
                    starts.setdefault((v.buffer, sympy.expand(row_start + step)), sympy.Mul(*k.inner))
        lines = []
        for (name, start), numel in sorted(starts.items(), key=str):
            nbytes = numel * _itemsize(self.storage[name])
            limit = cexpr(sympy.Min(nbytes, PREFETCH_ROW_BYTES))
            lines.append(f"for (int64_t kiln_pf = 0; kiln_pf < {limit}; kiln_pf += 64) "
                         f"__builtin_prefetch(reinterpret_cast<const char*>({name} + {cexpr(start)}) + kiln_pf);")
        return lines

    def _loop_block(self, blk: Block, k: Kernel, ys: Sequence[sympy.Symbol], locals_: dict, parallel: bool,
                    parallel_if: str, span: Span | None = None, hoisted: dict | None = None) -> list[str]:
        """One simd loop over the inner range (with `span`, over that part of its last dim): its
        accumulators, nodes, and the reductions' stores; with `hoisted`, the values _hoisted
        computed for it already (a row tile's, cpp_row_tiles.py)."""
        cut = inner_cut(blk.nodes, k, ys) if self.cut_loops < MAX_CUT_LOOPS else None
        if cut is not None:
            return self._cut_block(blk, k, ys, locals_, parallel, parallel_if, span, cut)
        split = _row_invariant_mask(blk, k, ys)
        if split is not None:
            # one loop per side of a mask the whole row shares (which input of a stack a row
            # copies): a mask the same on every lane kept GCC from vectorizing the masked loads
            node, masked = split
            sub = kernel_substitution(k, node)
            assert sub is not None  # _row_invariant_mask placed it
            w = CppBodyWriter(self.storage, sub, locals_, self.counter, self.scratch)
            cond = w.value(masked.mask)
            sides = [self._loop_block(Block(blk.kind, (dataclasses.replace(node, body=side),)), k, ys, locals_,
                                      parallel, parallel_if, span) for side in (masked.body, masked.other)]
            return w.lines + [f"if ({cond}) {{"] + sides[0] + ["} else {"] + sides[1] + ["}"]
        reds = [n for n in blk.nodes if isinstance(n, Reduction) and n.name not in k.columns]
        accs = {n.name: f"acc_{n.name}" for n in reds}
        accs.update({name: f"col_{name}[{self._column_place(k, name)[1]}]" for name in k.columns})
        pre, post, clauses = _accumulators(reds, accs)
        small = sympy.Mul(*k.inner).is_number and int(sympy.Mul(*k.inner)) <= SUM_CHUNK
        lanes_first = _lane_sums(reds, k) or (span is None and _short_row_lanes(reds, k))
        if chunked_sums(reds) and not k.columns and len(k.inner) >= 1 and not small and not lanes_first:
            parallel_sums = parallel and not k.outer
            pragma = f"#pragma omp parallel for@collapse @reduction{parallel_if}" if parallel_sums else None
            shared_sums: dict = {} if hoisted is None else hoisted
            body = self._hoisted(blk.nodes, k, ys, locals_, shared_sums) if hoisted is None else []
            body += self._chunked_sum_loops(blk, k, ys, locals_, shared_sums, reds, accs, pragma, span)
            return body + self._reduction_stores(k, reds, accs, locals_)
        if any(n.reduction_type in ("argmax", "argmin") for n in reds):
            o, c = _loops(ys, k.inner, None)  # a serial loop
        elif parallel and not k.outer:  # the inner range is all there is to share out among threads
            o, c = _loops(ys, k.inner, f"#pragma omp parallel for simd@collapse {' '.join(clauses)}{parallel_if}", span)
        else:
            o, c = _simd_loops(ys, k.inner, "#pragma omp simd@collapse " + " ".join(clauses), span)
        shared: dict = {} if hoisted is None else hoisted  # values already computed, per node substitution
        body = self._hoisted(blk.nodes, k, ys, locals_, shared) if hoisted is None else []
        if _lane_sums(reds, k):
            body += self._lane_sum_loops(blk, k, ys, locals_, shared, reds, accs)
        elif span is None and _short_row_lanes(reds, k):
            body += self._short_row_lane_loops(blk, k, ys, locals_, shared, reds, accs)
        else:
            padded = _padded_row(blk, k, reds, span, parallel)
            if padded is not None:
                # a short row run in whole vectors, the lanes past its end masked (_padded_row)
                o, c = _simd_loops(ys, (sympy.Integer(padded),), "#pragma omp simd@collapse " + " ".join(clauses))
                self.row_mask = (f"{ys[-1]} < {cexpr(k.inner[-1])}", frozenset(ys[-1:]))
            body += pre + o
            loop_locals = dict(locals_)  # values made in this loop are visible only inside it
            for n in blk.nodes:
                body += ["  " + line for line in self._node(n, k, loop_locals, accs.get(n.name), shared)]
            body += c + post
            self.row_mask = None
        return body + self._reduction_stores(k, reds, accs, locals_)

    def _reduction_stores(self, k: Kernel, reds: Sequence[Reduction], accs: dict[str, str], locals_: dict
                          ) -> list[str]:
        """After a loop: each reduction's result kept for later nodes of the row, or stored."""
        body: list[str] = []
        for n in reds:
            sub = node_substitution(n, k.outer, k.inner)
            assert sub is not None  # a reduction's ranges are its kernel's
            key = sympy.expand(n.layout.index(_ivars(len(n.ranges))).xreplace(sub))
            if n.name in k.local:
                locals_[(n.name, key)] = accs[n.name]
            else:
                self._note(self.writes, n.name)
                w = CppBodyWriter(self.storage, sub, locals_, self.counter, self.scratch)
                w.store(n.name, n.layout.index(_ivars(len(n.ranges))), accs[n.name])
                body += w.lines
        return body

    def _cut_block(self, blk: Block, k: Kernel, ys: Sequence[sympy.Symbol], locals_: dict, parallel: bool,
                   parallel_if: str, span: Span | None, cut: sympy.Expr) -> list[str]:
        """A loop block cut where a mask of its nodes flips (cpp_loops.inner_cut): one loop before
        the point with the mask's body, one from it with the other side, each cut again where
        another mask flips; a piece the point leaves empty is not written."""
        start, stop = span if span is not None else (sympy.Integer(0), k.inner[-1])
        lines: list[str] = []
        if cut.is_number and start.is_number and stop.is_number:
            point: sympy.Expr = sympy.Integer(min(max(int(cut), int(start)), int(stop)))
        else:
            point = sympy.Symbol(f"kiln_cut{self.counter[0]}", integer=True)
            self.counter[0] += 1
            lo, hi, c = cexpr(start), cexpr(stop), cexpr(cut)
            lines.append(f"const int64_t {point} = ({c}) < ({lo}) ? ({lo}) : (({c}) > ({hi}) ? ({hi}) : ({c}));")
        for below, piece in ((True, (start, point)), (False, (point, stop))):
            if sympy.expand(piece[1] - piece[0]) == 0:
                continue
            self.cut_loops += 1
            nodes = taking_side(blk.nodes, k, ys[-1], cut, below)
            lines += self._loop_block(Block(blk.kind, nodes), k, ys, locals_, parallel, parallel_if, piece)
        return lines

    def _columns_open(self, k: Kernel, xs: Sequence[sympy.Symbol], rows: dict, on_stack: bool, parallel: bool,
                      parallel_if: str) -> list[str]:
        """Before the outer loop of a kernel with column sums (schedule.column_substitution): one row
        of zeroed accumulators per thread, and the parallel region whose threads each take theirs;
        the outer loop is shared out statically."""
        threads = ("kiln_threads()" if self.adaptive_threads else "kiln_all_threads()") if parallel else "1"
        body = [f"const int kiln_nt = {threads};"]
        flushed = self._flushed_columns(k)
        for name in sorted(k.columns):
            T = "double" if flushed else CTYPE[compute(self.storage[name])]
            width = self._column_place(k, name)[0]
            body += [f"{T}* part_{name} = static_cast<{T}*>(std::malloc(sizeof({T}) * kiln_nt * {width}));",
                     f"for (int64_t j = 0; j < kiln_nt * {width}; j++) part_{name}[j] = {T}(0);"]
        if parallel:
            body.append(f"#pragma omp parallel num_threads(kiln_nt){parallel_if}")
        body.append("{")
        me = "omp_get_thread_num()" if parallel else "0"
        for name in sorted(k.columns):
            T = CTYPE[compute(self.storage[name])]
            width = self._column_place(k, name)[0]
            if flushed:
                # the thread's float row takes COLUMN_CHUNK rows, then joins its double row (_columns_flush)
                body += [f"double* __restrict__ whole_{name} = part_{name} + {me} * {width};",
                         f"{T}* __restrict__ col_{name} = static_cast<{T}*>(std::malloc(sizeof({T}) * {width}));",
                         f"for (int64_t j = 0; j < {width}; j++) col_{name}[j] = {T}(0);"]
            else:
                body.append(f"{T}* __restrict__ col_{name} = part_{name} + {me} * {width};")
        if flushed:
            body.append("int64_t kiln_rows = 0;")
        if k.scratch and not on_stack:
            for name, (size, T) in sorted(rows.items()):
                body.append(f"{T}* {name} = static_cast<{T}*>(std::malloc(sizeof({T}) * ({cexpr(size)})));")
        o, _ = _loops(xs, k.outer, "#pragma omp for@collapse schedule(static)" if parallel else None)
        body += o
        if k.scratch and on_stack:
            body += [f"alignas(64) {T} {name}[{int(size)}];" for name, (size, T) in sorted(rows.items())]
        return body

    def _columns_close(self, k: Kernel, ys: Sequence[sympy.Symbol], on_stack: bool) -> list[str]:
        """After the outer loop: each column sum is the threads' rows added in thread order (the same
        order every run), stored like any reduction result."""
        flushed = self._flushed_columns(k)
        body = [f"std::free({name});" for name in sorted(k.scratch) if not on_stack]
        if flushed:
            body += self._columns_flush(k) + [f"std::free(col_{name});" for name in sorted(k.columns)]
        body.append("}")
        for name in sorted(k.columns):
            n = next(node for node in k.nodes if node.name == name)
            T = CTYPE[compute(self.storage[name])]
            width, lin, kept_vars, kept_ranges = self._column_place(k, name)
            o, c = _loops(kept_vars, kept_ranges, None)
            body += o + [f"{'double' if flushed else T} sum_{name} = part_{name}[{lin}];",
                         f"for (int t = 1; t < kiln_nt; t++) sum_{name} += part_{name}[t * {width} + {lin}];"]
            sub = kernel_substitution(k, n)
            assert sub is not None
            w = CppBodyWriter(self.storage, sub, {}, self.counter)
            w.store(name, n.layout.index(_ivars(len(n.ranges))), f"{T}(sum_{name})")
            body += w.lines + c
            self._note(self.writes, name)
        return body + [f"std::free(part_{name});" for name in sorted(k.columns)]

    def _flushed_columns(self, k: Kernel) -> bool:
        """Whether a kernel's column sums are all summed in float, and so in two levels: each thread's
        float row over COLUMN_CHUNK rows at a time, added into its double row (one float chain over
        1200 rows lost 5.7e-6 relative)."""
        return chunked_sums([n for n in k.nodes if n.name in k.columns and isinstance(n, Reduction)])

    def _columns_flush(self, k: Kernel) -> list[str]:
        """A thread's float column rows added into its double ones, and zeroed."""
        lines = []
        for name in sorted(k.columns):
            width = self._column_place(k, name)[0]
            lines += ["#pragma omp simd", f"for (int64_t j = 0; j < {width}; j++) {{ whole_{name}[j] += col_{name}[j]; "
                      f"col_{name}[j] = 0; }}"]
        return lines

    def _column_place(self, k: Kernel, name: str) -> tuple[str, str, tuple, tuple]:
        """A column sum's accumulator row: its length, the position of the current point in it (both
        C), and the kernel variables and ranges it is kept over (the trailing outer dims it does not
        reduce, then the inner ones)."""
        node = next(n for n in k.nodes if n.name == name)
        split = column_split(node, k.outer, k.inner)
        assert split is not None  # the scheduler placed it as a column sum
        xs, ys = kernel_vars(len(k.outer), len(k.inner))
        kept_vars, kept_ranges = tuple(xs[split:]) + tuple(ys), tuple(k.outer[split:]) + tuple(k.inner)
        # the length in parentheses: it is multiplied into sizes and offsets (`kiln_nt * (s0 + 1)`)
        return f"({cexpr(sympy.Mul(*kept_ranges))})", _linear(kept_vars, kept_ranges), kept_vars, kept_ranges

    def _scratch_rows(self, k: Kernel, xs: Sequence[sympy.Symbol], ys: Sequence[sympy.Symbol]
                      ) -> dict[str, tuple[sympy.Expr, str]]:
        """Per scratch buffer: the elements one row needs and its C type."""
        rows = {}
        for name in k.scratch:
            if isinstance(self.scratch[name], str):  # kept in the output (_rows_in_output)
                continue
            node = _block_node(next(n for n in k.nodes if n.name == name))
            sub = node_substitution(node, k.outer, k.inner)
            idx = sympy.expand(node.layout.index(_ivars(len(node.ranges))).xreplace(sub).xreplace(self.scratch[name]))
            size = sympy.expand(idx.xreplace({y: r - 1 for y, r in zip(ys, k.inner)}) + 1)
            rows[name] = (size, CTYPE[self.storage[name]])
        return rows

    def _hoisted(self, nodes: Sequence[Buffer], k: Kernel, ys: Sequence[sympy.Symbol], locals_: dict,
                 shared: dict) -> list[str]:
        """Statements before a loop for the values of its nodes that do not change along the inner
        range (a row's target class, a scalar read through a pointer), put in `shared` for the
        nodes to reuse. Inside an OpenMP region GCC split a simd loop on such a condition and left
        the common half scalar (a cross-entropy backward ran 7x slower). Not hoisted: what runs
        only under a mask, indirect loads, bounds checks, buffers this loop writes; nothing when an
        inner size may be 0 (the loop would not read at all)."""
        if not all((s.is_number and s > 0) or s.is_positive for s in k.inner):
            return []
        unsafe = {n.name for n in nodes} | set(self.scratch)
        inner_vars = set(ys)
        lines: list[str] = []
        for buffer in nodes:
            n = _block_node(buffer)
            sub = kernel_substitution(k, n)
            assert sub is not None
            w = CppBodyWriter(self.storage, sub, locals_, self.counter, self.scratch)
            w.cache = shared.setdefault(tuple(sorted(sub.items(), key=str)), {})
            invariant: dict[int, bool] = {}
            guarded = {id(g) for m in walk(n.body) if isinstance(m, Masked) for side in (m.body, m.other)
                       for g in walk(side)}
            for v in walk(n.body):  # children first
                if isinstance(v, Masked) or id(v) in guarded:
                    ok = False
                elif isinstance(v, Load):
                    ok = v.extra is None and v.buffer not in unsafe and not (
                        sympy.sympify(v.index).xreplace(sub).free_symbols & inner_vars)
                elif isinstance(v, Index):
                    ok = not (sympy.sympify(v.expr).xreplace(sub).free_symbols & inner_vars)
                elif isinstance(v, Op):
                    ok = v.name not in ("index_ok", "rand", "randn") and all(invariant[id(a)] for a in v.args)
                else:
                    ok = True
                invariant[id(v)] = ok
            for v in walk(n.body):
                if invariant[id(v)] and isinstance(v, (Load, Op)):
                    w.value(v)  # children first, so each is computed once and its parents reuse it
            lines += w.lines
        return lines

    def _node(self, buffer: Buffer, k: Kernel, locals_: dict, acc: str | None, shared: dict | None = None
              ) -> list[str]:
        """The statements of one node; with `shared`, a value an earlier node of the same loop computed
        at the same point is reused (a GELU backward and the GELU output recomputed beside it share
        their erf), so each expensive call runs once per element."""
        n = _block_node(buffer)
        sub = kernel_substitution(k, n)
        assert sub is not None
        w = CppBodyWriter(self.storage, sub, locals_, self.counter, self.scratch)
        if shared is not None:
            w.cache = shared.setdefault(tuple(sorted(sub.items(), key=str)), {})
        if self.row_mask is not None:  # a padded lane loads 0, adds its reduction's identity, stores nothing
            w.guard, w.guard_vars = self.row_mask
        self._collect_reads(w, n.body, self.hidden)
        value = w.value(n.body)
        if self.row_mask is not None and isinstance(n, Reduction):
            identity = _IDENTITY[n.reduction_type].format(T=CTYPE[compute(n.body.dtype)])
            value = w.tmp(f"{self.row_mask[0]} ? {value} : {identity}", n.body.dtype)
        lines = [f"// {n.name} <- {', '.join(n.origins)}"] + w.lines
        if isinstance(n, Reduction):
            assert acc is not None  # the kernel made an accumulator for each of its reductions
            rt = n.reduction_type
            if n.layout.dtype == torch.bool and rt in ("max", "min"):
                rt = "any" if rt == "max" else "all"
            if rt in ("argmax", "argmin"):
                ys = kernel_vars(0, len(k.inner))[1]
                lin = cexpr(sum((y * s for y, s in zip(ys, contiguous_strides(k.inner))), sympy.Integer(0)))
                cmp = ">" if rt == "argmax" else "<"
                nan = f" || {value} != {value}" if n.body.dtype.is_floating_point else ""
                guard = f"best_{n.name} == best_{n.name} && " if n.body.dtype.is_floating_point else ""
                lines.append(f"if ({lin} == 0 || ({guard}({value} {cmp} best_{n.name}{nan}))) "
                             f"{{ best_{n.name} = {value}; {acc} = {lin}; }}")
            elif rt == "sum":
                lines.append(f"{acc} += {value};")
            elif rt == "prod":
                lines.append(f"{acc} *= {value};")
            elif rt == "any":
                lines.append(f"{acc} = {acc} || {value};")
            elif rt == "all":
                lines.append(f"{acc} = {acc} && {value};")
            else:
                cmp = ">" if rt == "max" else "<"
                lines.append(f"{acc} = {value} {cmp} {acc} ? {value} : {acc};")
                if n.layout.dtype.is_floating_point:
                    lines.append(f"{acc.replace('acc_', 'nan_', 1)} |= ({value} != {value});")
            return lines
        key = sympy.expand(n.layout.index(_ivars(len(n.ranges))).xreplace(sub))
        locals_[(n.name, key)] = value  # later nodes of this block read the register, not memory
        if n.name not in k.local:
            if n.name not in k.scratch:
                self._note(self.writes, n.name)
            w2 = CppBodyWriter(self.storage, sub, locals_, self.counter, self.scratch)
            w2.store(n.name, n.layout.index(_ivars(len(n.ranges))), value)
            lines += w2.lines if self.row_mask is None else [f"if ({self.row_mask[0]}) {line}" for line in w2.lines]
        return lines

    def _function(self, name: str, origins: list[str], body: list[str]) -> str:
        args = []
        if any(ERROR_RECORD in line for line in body):  # the kernel checks something (kiln.lower.checks)
            self._note(self.writes, ERROR_RECORD)
        self.reads = [b for b in self.reads if b not in self.writes]
        for b in self.reads + self.writes:
            const = "const " if b not in self.writes else ""
            restrict = "" if b in self.aliasing else " __restrict__"
            args.append(f"{const}{CTYPE[self.storage[b]]}*{restrict} {b}")
        # the thread count is the runtime's (torch.get_num_threads(), see the prelude), not OpenMP's
        threads = "kiln_threads()" if getattr(self, "adaptive_threads", True) else "kiln_all_threads()"
        body = serial_at_one_thread([line + f" num_threads({threads})" if line.startswith("#pragma omp parallel")
                                     and "num_threads(" not in line else line
                                     for line in body])
        text = "\n".join(body)
        syms = sorted(set(re.findall(r"\b([a-z]+\d+)\b", text)) & self.size_symbols)
        args += [f"double {s}" if is_float_symbol(s) else f"int64_t {s}" for s in syms]  # zf: float arguments
        if "seed" in text:
            args.append("int64_t seed")
        self.symbols = syms
        head = f"// {name}: fused from {', '.join(dict.fromkeys(origins))}\n"
        head += f"extern \"C\" void {name}({', '.join(args)}) {{\n"
        return head + _indent(body) + "}\n"


ADAPTIVE_THREADS_MAX = 1 << 22  # elements from which a kernel never adapts to load (see kiln_threads)
STACK_SCRATCH_BYTES = 64 << 10  # row buffers of a kernel up to this size in all live on the stack
PREFETCH_ROW_BYTES = 4096  # of each input's next row, prefetched at the start of a row (L1 holds 32-48 KiB)


def _rows_in_output(k: Kernel) -> dict[str, str]:
    """Scratch rows a row kernel keeps in its output instead, each as the C place of the current
    point: a scratch buffer whose one reader is an output of the same dtype that reads it at the
    point it stores (a softmax's exponentials, scaled in place as ATen's kernel does). The pass
    that makes the row then writes the output's cold lines while it computes (exp), and the last
    pass rewrites lines in cache; written from a scratch row, the last pass waited on every cold
    line with nothing to overlap it (a softmax over 8x32000 floats spent a quarter of its time on
    that store). Not where the output may take the storage of an input read after that (_donors_read_by_then)."""
    iv = _ivars
    into = {}
    for name in sorted(k.scratch):
        made = next(n for n in k.nodes if n.name == name)
        # readers in the block that makes it take its value from a register (the row's sum)
        at = next(blk for blk in k.blocks if any(n is made for n in blk.nodes))
        later = [n for blk in k.blocks if blk is not at for n in blk.nodes]
        readers = [n for n in later if any(isinstance(v, Load) and v.buffer == name for v in walk(n.body))]
        if len(readers) != 1 or not isinstance(readers[0], Pointwise) or not _read_where_made(k, at, made):
            continue
        out = readers[0]
        if out.name in k.local | k.scratch or out.layout.dtype != made.layout.dtype:
            continue
        made_sub, out_sub = kernel_substitution(k, made), kernel_substitution(k, out)
        if made_sub is None or out_sub is None:
            continue
        here = sympy.expand(made.layout.index(iv(len(made.ranges))).xreplace(made_sub))
        if any(isinstance(v, Load) and v.buffer == name and (
                v.extra is not None or sympy.expand(v.index.xreplace(out_sub)) != here) for v in walk(out.body)):
            continue
        if not _donors_read_by_then(k, made, out):
            continue
        into[name] = f"{out.name}[{cexpr(sympy.expand(out.layout.index(iv(len(out.ranges))).xreplace(out_sub)))}]"
    return into


PAD_ROW_MAX = 32  # rows shorter than this, of a length no multiple of PAD_LANES, run padded (_padded_row)
PAD_LANES = 8  # floats in a 256-bit vector (a padded row of AVX-512 fills its 16 lanes as well at 16)
_IDENTITY = {"sum": "{T}(0)", "prod": "{T}(1)", "max": "-std::numeric_limits<{T}>::infinity()",
             "min": "std::numeric_limits<{T}>::infinity()"}


def _padded_row(blk: Block, k: Kernel, reds: Sequence[Reduction], span: Span | None, parallel: bool) -> int | None:
    """The padded length of a row kernel's simd loop over a short row of a known length that is no
    multiple of the vector (a log_softmax over 10 classes), or None: the loop runs whole vectors, a
    lane past the row's end loading 0 (a masked load), adding its reduction's identity and storing
    nothing. GCC otherwise finishes each row with scalar iterations (two scalar exps per row of 10:
    a log_softmax over 512x10 floats ran 0.53x eager's speed). Only floating-point reductions and
    values a made-up lane may compute (cpp._speculable: no checks, no integer division, no indirect
    load); rows up to PAD_ROW_MAX, where a masked load per vector costs less than the scalar tail."""
    if not k.outer or len(k.inner) != 1 or span is not None or k.columns or blk.kind != "loop":
        return None
    size = k.inner[0]
    if not size.is_number or int(size) >= PAD_ROW_MAX or int(size) % PAD_LANES == 0 or int(size) < 2:
        return None
    if any(n.reduction_type not in _IDENTITY or not n.layout.dtype.is_floating_point for n in reds):
        return None
    if not all(_speculable(_block_node(n).body) for n in blk.nodes):
        return None
    return -(-int(size) // PAD_LANES) * PAD_LANES


def _row_invariant_mask(blk: Block, k: Kernel, ys: Sequence[sympy.Symbol]) -> tuple[Pointwise, Masked] | None:
    """A loop block of one stored pointwise node whose value is a mask's choice, the mask the same
    along the inner range (no inner variable in its indices, no indirect load): the node and its
    Masked value."""
    if len(blk.nodes) != 1 or blk.kind != "loop" or not k.outer:
        return None
    node = blk.nodes[0]
    if not isinstance(node, Pointwise) or not isinstance(node.body, Masked) or node.name in k.local | k.scratch:
        return None
    sub = kernel_substitution(k, node)
    if sub is None:
        return None
    for v in walk(node.body.mask):
        if isinstance(v, Load) and (v.extra is not None or v.buffer in k.local | k.scratch):
            return None
        expr = v.index if isinstance(v, Load) else v.expr if isinstance(v, Index) else None
        if expr is not None and sympy.sympify(expr).xreplace(sub).free_symbols & set(ys):
            return None
    return node, node.body


def _read_where_made(k: Kernel, block: Block, made: Buffer) -> bool:
    """Whether the nodes of `block` read `made` only at the point it is stored (from a register)."""
    sub = kernel_substitution(k, made)
    assert sub is not None  # a scratch buffer is one of its kernel's nodes
    here = sympy.expand(_block_node(made).layout.index(_ivars(len(_block_node(made).ranges))).xreplace(sub))
    for n in block.nodes:
        n_sub = kernel_substitution(k, n)
        for v in walk(n.body):
            if isinstance(v, Load) and v.buffer == made.name and (
                    n_sub is None or v.extra is not None or sympy.expand(v.index.xreplace(n_sub)) != here):
                return False
    return True


def _donors_read_by_then(k: Kernel, made: Buffer, out: Buffer) -> bool:
    """Whether every buffer whose storage the memory plan may give `out` (memory.in_place_donors)
    has been read for good at each point when `made` is stored there instead of `out`: read in
    earlier blocks, or in `made`'s block by `made` or a node before it at that same element only."""
    block = next(i for i, blk in enumerate(k.blocks) if any(n is out for n in blk.nodes))
    donors = in_place_donors(k, k.blocks[block].kind, out) - {made.name}  # `made` lives there by design
    if not donors:
        return True
    at = next(i for i, blk in enumerate(k.blocks) if any(n is made for n in blk.nodes))
    nodes = k.blocks[at].nodes
    sub = kernel_substitution(k, made)
    assert sub is not None  # a scratch buffer is one of its kernel's nodes
    here = sympy.expand(_block_node(made).layout.index(_ivars(len(_block_node(made).ranges))).xreplace(sub))
    for pos, n in enumerate(nodes):
        n_sub = kernel_substitution(k, n)
        for v in walk(n.body):
            if not isinstance(v, Load) or v.buffer not in donors:
                continue
            if pos > nodes.index(made) or n_sub is None or v.extra is not None or \
                    sympy.expand(v.index.xreplace(n_sub)) != here:
                return False
    return not any(isinstance(v, Load) and v.buffer in donors
                   for blk in k.blocks[at + 1:] for n in blk.nodes for v in walk(n.body))


def _indent(lines: list[str]) -> str:
    out, depth = [], 1
    for line in lines:
        if line.startswith("}"):
            depth -= 1
        out.append("  " * depth + line)
        if line.endswith("{"):
            depth += 1
    return "\n".join(out) + "\n"


def generate(program: KernelProgram) -> tuple[str, dict[str, tuple[list[str], list[str], bool]]]:
    """The translation unit, and per kernel: (buffer args, size-symbol args, takes seed)."""
    storage: dict[str, torch.dtype] = {ERROR_RECORD: torch.int64}
    for b in program.ir.buffers:
        storage[b.name] = b.layout.dtype
        for name, lay, _ in getattr(b, "results", ()):
            storage[name] = lay.dtype
    parts, signatures = [], {}
    for step in program.steps:
        if isinstance(step, (Kernel, ScatterKernel)):
            w = KernelWriter(storage, program.ir.size_symbols())
            if isinstance(step, Kernel):
                w.aliasing = aliasing_args(step)
            src, bufs = w.kernel(step) if isinstance(step, Kernel) else w.scatter(step)
            parts.append(src)
            signatures[step.name] = (bufs, w.symbols, "seed" in src.split("{", 1)[0])
    kernels = "\n".join(parts)
    return prelude(kernels) + "\n" + kernels + plan_entries(list(signatures)), signatures


# A kernel's entry for the native plan runner (kiln.runtime.boundary's plan interpreter): one uniform
# signature, `kiln_plan_<kernel>(const int64_t* words)`, each argument a word (a pointer, an int64, or a
# double's bits), unpacked to the kernel's own parameter types by the compiler, not by guessing the ABI.
PLAN_ENTRY_PRELUDE = r"""
#include <cstring>
#include <type_traits>
#include <utility>
template <typename T> static inline T kiln_plan_word(int64_t w) {
  if constexpr (std::is_pointer_v<T>) { return reinterpret_cast<T>(w); }
  else if constexpr (std::is_floating_point_v<T>) { double d; std::memcpy(&d, &w, sizeof d); return T(d); }
  else { return T(w); }
}
template <typename... P, size_t... I>
static inline void kiln_plan_unpack(void (*f)(P...), const int64_t* w, std::index_sequence<I...>) {
  f(kiln_plan_word<P>(w[I])...);
}
template <typename... P> static inline void kiln_plan_call(void (*f)(P...), const int64_t* w) {
  kiln_plan_unpack(f, w, std::index_sequence_for<P...>{});
}
"""


def plan_entries(names: list[str]) -> str:
    """The plan runner's entry of each kernel in `names` (PLAN_ENTRY_PRELUDE)."""
    if not names:
        return ""
    return PLAN_ENTRY_PRELUDE + "".join(
        f'extern "C" void kiln_plan_{n}(const int64_t* w) {{ kiln_plan_call({n}, w); }}\n' for n in names)
