"""Loop nests of the C++ kernels: the pieces every nest is made of, and the kernels that run a tile of
outer points at once instead of one row per point.

A row kernel (codegen/cpp_kernel.py) walks each outer point's inner range in a simd loop; that is
right when the inner range is the contiguous one. When the reduced dim is strided and the last kept
dim is the contiguous one (a sum or a softmax over dim 0 of a row-major matrix), the lanes must go
across outputs instead: `column_kernel` (one pass of reductions) and `tiled_rows_kernel` (a whole
row kernel: several passes, rows kept in scratch, scalar steps between them) loop over the reduced
dims outside and over a tile of outputs inside, each tile's data read back from cache. A pointwise
copy whose loads and store are contiguous along different dims (a transpose made contiguous) is
walked in square blocks (`blocked_copy_kernel`), so that neither side strides through memory a
whole line at a time.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import sympy
import torch

from kiln.lower.codegen.cpp import CTYPE, PARALLEL_MIN, CppBodyWriter, calls_math, cexpr, compute
from kiln.lower.ir import (Buffer, Const, FloorDiv, Index, Load, Masked, ModularIndexing, Op, Pointwise, Reduction,
                           Value, contiguous_strides, index_vars, walk)
from kiln.lower.schedule import Block, Kernel, kernel_substitution, kernel_vars, node_substitution

REDUCE_INIT = {"sum": "0", "prod": "1", "any": "false", "all": "true"}
OMP_REDUCTION = {"sum": "+", "prod": "*", "max": "max", "min": "min", "any": "||", "all": "&&"}


Span = tuple[sympy.Expr, sympy.Expr]  # [start, stop) of a loop's last variable, where not its whole range


def _loops(vars_: Sequence[sympy.Symbol], ranges: Sequence[sympy.Expr], pragma: str | None,
           span: Span | None = None) -> tuple[list[str], list[str]]:
    """Opening and closing lines of a perfect loop nest (no lines at all for zero dims); with
    `span`, the last variable runs over that part of its range only."""
    opens, closes = [], []
    if pragma and ranges:
        collapse = f" collapse({len(ranges)})" if len(ranges) > 1 else ""
        opens.append(pragma.replace("@collapse", collapse))
    for pos, (v, r) in enumerate(zip(vars_, ranges)):
        start, stop = span if span is not None and pos == len(ranges) - 1 else (sympy.Integer(0), r)
        opens.append(f"for (int64_t {v} = {cexpr(start)}; {v} < {cexpr(stop)}; {v}++) {{")
        closes.append("}")
    return opens, closes


def _simd_loops(vars_: Sequence[sympy.Symbol], ranges: Sequence[sympy.Expr], pragma: str,
                span: Span | None = None) -> tuple[list[str], list[str]]:
    """A loop nest whose innermost loop alone carries the simd `pragma` (no collapse): GCC turns an
    `omp simd collapse(2)` nest into one loop whose index steps carry a branch, and then vectorizes
    neither (a mean over H and W of an NCHW tensor ran scalar); the innermost loop walks the
    stride-1 dim, which is what the vector lanes want."""
    if len(ranges) <= 1:
        return _loops(vars_, ranges, pragma, span)
    o, c = _loops(vars_[:-1], ranges[:-1], None)
    last, close = _loops(vars_[-1:], ranges[-1:], pragma.replace("@collapse", ""), span)
    return o + last, close + c


def _reduce_init(rtype: str, dtype: torch.dtype) -> str:
    T = CTYPE[compute(dtype)]
    if rtype in REDUCE_INIT:
        return f"{T}({REDUCE_INIT[rtype]})" if dtype != torch.bool else REDUCE_INIT[rtype]
    if dtype == torch.bool:
        return "false" if rtype == "max" else "true"
    if dtype.is_floating_point:
        sign = "-" if rtype == "max" else ""
        return f"{sign}std::numeric_limits<{T}>::infinity()"
    return f"std::numeric_limits<{T}>::{'lowest' if rtype == 'max' else 'max'}()"


def chunked_sums(reds: Sequence[Reduction]) -> bool:
    """Whether a loop's reductions are all sums accumulated in float (of float32, bfloat16 or
    float16), which it adds in two levels: partials over chunks, the partials in double."""
    return bool(reds) and all(n.reduction_type == "sum" and compute(n.layout.dtype) == torch.float32 for n in reds)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


COLUMN_CHUNK = 32  # rows a column sum's float accumulators take before joining its double ones (at 128: 1.2e-6 relative)
TILE = 256  # outputs per column-reduction tile: each row read is 1 KiB contiguous, accumulators stay in L1


def _column_reduction(k: Kernel) -> bool:
    """Whether the reduction loop reads with a stride while the last outer dim is contiguous. A
    read that does not move with the last outer dim (the vector of a batched matrix-vector
    product, read along the reduction) is one value per row of the tile, whatever its stride."""
    if not k.outer or not k.inner or k.scratch or k.columns or not k.blocks or k.blocks[0].kind != "loop":
        return False
    if any(b.kind != "scalar" for b in k.blocks[1:]):
        return False
    nodes = k.blocks[0].nodes
    # Pointwise work fused before the reductions (a bias gradient's sum next to the activation
    # gradient it sums) runs inside the same tile loop; each element is still computed once.
    if not any(isinstance(n, Reduction) for n in nodes):
        return False
    if not all(n.reduction_type in OMP_REDUCTION for n in nodes if isinstance(n, Reduction)):
        return False
    xs, ys = kernel_vars(len(k.outer), len(k.inner))
    contiguous_outer = False
    for node in nodes:
        n = _block_node(node)
        sub = node_substitution(n, k.outer, k.inner)
        indices = [(v.index, v.extra) for v in walk(n.body) if isinstance(v, Load)]
        if not isinstance(n, Reduction) and n.name not in k.local:
            indices.append((n.layout.index(_ivars(len(n.ranges))), None))  # its store
        for index, extra in indices:
            idx = sympy.expand(index.xreplace(sub))
            if (extra is not None and not _fixed_in_tile(extra, sub, (*ys, xs[-1]))) or idx.has(FloorDiv, ModularIndexing):
                return False
            if idx.coeff(ys[-1]) == 1 and idx.has(xs[-1]):
                return False  # read along the reduction, but across the columns with a stride
            contiguous_outer |= idx.coeff(xs[-1]) == 1
    return contiguous_outer


def _fixed_in_tile(extra: object, sub: dict | None, moving: Sequence[sympy.Symbol]) -> bool:
    """Whether an indirect load's offset (a gathered row: an expert's weights picked per token)
    depends on none of `moving` (the reduction and tile vars): one row per outer point, read
    contiguously along the tile like any other load."""
    if sub is None:
        return False
    for v in walk(extra):  # type: ignore[arg-type]
        if isinstance(v, Load):
            expr = v.index
        elif isinstance(v, Index):
            expr = v.expr
        elif isinstance(v, (Op, Const)):
            continue
        else:
            return False
        if sympy.sympify(expr).xreplace(sub).free_symbols & set(moving):
            return False
    return True


def _tiled_outer_loops(xs: Sequence[sympy.Symbol], k: Kernel) -> list[str]:
    """The opening of a tiled kernel: one parallel loop collapsing the outer dims (the last one's
    loop, over tiles, is the caller's), unless the kernel is too small to share out."""
    total = sympy.Mul(*k.outer, *k.inner)
    lines: list[str] = []
    if not (total.is_number and total < PARALLEL_MIN):
        cond = "" if total.is_number else f" if({cexpr(total)} >= {PARALLEL_MIN})"
        lines.append(f"#pragma omp parallel for{' collapse(%d)' % len(xs) if len(xs) > 1 else ''}{cond}")
    for x, r in zip(xs[:-1], k.outer[:-1]):
        lines.append(f"for (int64_t {x} = 0; {x} < {cexpr(r)}; {x}++) {{")
    return lines


def _block_node(n: Buffer) -> Pointwise | Reduction:
    """`n` as what a loop or scalar block holds: schedule.place admits only these there."""
    assert isinstance(n, (Pointwise, Reduction))
    return n


def _linear(ys: Sequence[sympy.Symbol], inner: Sequence[sympy.Expr]) -> str:
    """The row-major position of an inner point, in C."""
    return cexpr(sum((y * s for y, s in zip(ys, contiguous_strides(inner))), sympy.Integer(0)))


def _ivars(n: int) -> tuple[sympy.Symbol, ...]:
    return index_vars("i", n)




class KernelParts:
    """What KernelWriter (codegen/cpp_kernel.py) supplies to the kernels its mixins write (the tiled
    ones here, scans and scatters in cpp_scan.py): its state, how a node's statements and reads are
    written and how a kernel function is wrapped."""

    storage: dict[str, torch.dtype]
    counter: list[int]
    scratch: dict
    hidden: frozenset[str]
    reads: list[str]
    writes: list[str]

    def _node(self, buffer: Buffer, k: Kernel, locals_: dict, acc: str | None, shared: dict | None = None
              ) -> list[str]:
        raise NotImplementedError  # KernelWriter's

    def _hoisted(self, nodes: Sequence[Buffer], k: Kernel, ys: Sequence[sympy.Symbol], locals_: dict,
                 shared: dict) -> list[str]:
        raise NotImplementedError  # KernelWriter's

    def _note(self, names: list[str], name: str) -> None:
        raise NotImplementedError  # KernelWriter's

    def _function(self, name: str, origins: list[str], body: list[str]) -> str:
        raise NotImplementedError  # KernelWriter's

    def _collect_reads(self, w: CppBodyWriter, v: Value, local: frozenset[str]) -> None:
        raise NotImplementedError  # KernelWriter's


class TileKernels(KernelParts):
    """The tiled kernels of KernelWriter, which shares with its row kernels how a node's statements
    are written and how a kernel function is wrapped."""

    def column_kernel(self, k: Kernel) -> tuple[str, list[str]]:
        """Reductions over a strided dim (sum over rows of a row-major matrix): vectorize across a
        tile of TILE outputs instead, so every load of the inner loop is contiguous."""
        xs, ys = kernel_vars(len(k.outer), len(k.inner))
        self.scratch, self.hidden = {}, k.local
        reds = [n for n in k.blocks[0].nodes if isinstance(n, Reduction)]
        last, size = xs[-1], k.outer[-1]
        body = _tiled_outer_loops(xs, k)
        # a known tile narrower than TILE (a sum over H and W of an NHWC tensor with 8 channels) is
        # its exact width, so its loops have a known trip count: one vector, no remainder loop
        # (a known 0, an empty tensor's, runs no tile but still needs arrays of a legal C++ length)
        width = int(size) if size.is_number and 0 < int(size) < TILE else TILE
        body.append(f"for (int64_t xt = 0; xt < {cexpr(size)}; xt += {width}) {{")
        body.append(f"const int64_t xn = {width};" if size.is_number and int(size) == width else
                    f"const int64_t xn = {cexpr(size)} - xt < {width} ? {cexpr(size)} - xt : {width};")
        accs = {}
        for n in reds:
            rtype = n.reduction_type
            dtype = n.layout.dtype
            if dtype == torch.bool and rtype in ("max", "min"):
                rtype = "any" if rtype == "max" else "all"
            T = CTYPE[compute(dtype)]
            accs[n.name] = f"acc_{n.name}[xi]"
            body.append(f"{T} acc_{n.name}[{width}]; for (int xi = 0; xi < {width}; xi++) "
                        f"acc_{n.name}[xi] = {_reduce_init(rtype, dtype)};")
            if rtype in ("max", "min") and dtype.is_floating_point:
                body.append(f"int nan_{n.name}[{width}] = {{0}};")
        chunked = chunked_sums(reds) and len(k.inner) > 0
        o, c = _loops(ys, k.inner, None)
        if chunked:
            # the rows in chunks of COLUMN_CHUNK, each summed into the tile's float accumulators, which
            # are added into double ones after it: one chain of 1e5 float adds per output lost 1.4e-4
            body += [f"double outer_{n.name}[{width}] = {{}};" for n in reds]
            first = cexpr(k.inner[0])
            body += [f"for (int64_t kiln_chunk = 0; kiln_chunk < {first}; kiln_chunk += {COLUMN_CHUNK}) {{",
                     f"const int64_t kiln_chunk_end = kiln_chunk + {COLUMN_CHUNK} < {first} ? kiln_chunk + {COLUMN_CHUNK} : {first};"]
            body += [f"for (int xi = 0; xi < {width}; xi++) acc_{n.name}[xi] = 0;" for n in reds]
            o[0] = f"for (int64_t {ys[0]} = kiln_chunk; {ys[0]} < kiln_chunk_end; {ys[0]}++) {{"
        body += o + ["#pragma omp simd", "for (int64_t xi = 0; xi < xn; xi++) {", f"const int64_t {last} = xt + xi;"]
        locals_: dict = {}
        loop_locals: dict = {}  # values made in the tile loop (pointwise nodes) feed later nodes
        for node in k.blocks[0].nodes:
            body += self._node(node, k, loop_locals, accs.get(node.name))
        body += ["}"] + c
        if chunked:
            for n in reds:
                body += ["#pragma omp simd", f"for (int64_t xi = 0; xi < xn; xi++) outer_{n.name}[xi] += acc_{n.name}[xi];"]
            body.append("}")
            accs = {n.name: f"{CTYPE[compute(n.layout.dtype)]}(outer_{n.name}[xi])" for n in reds}
        body += ["for (int64_t xi = 0; xi < xn; xi++) {", f"const int64_t {last} = xt + xi;"]
        for n in reds:
            if n.layout.dtype.is_floating_point and n.reduction_type in ("max", "min"):
                body.append(f"if (nan_{n.name}[xi]) {accs[n.name]} = std::numeric_limits<{CTYPE[compute(n.layout.dtype)]}>::quiet_NaN();")
            sub = node_substitution(n, k.outer, k.inner)
            assert sub is not None
            key = sympy.expand(n.layout.index(_ivars(len(n.ranges))).xreplace(sub))
            locals_[(n.name, key)] = accs[n.name]
            if n.name not in k.local:
                self._note(self.writes, n.name)
                w = CppBodyWriter(self.storage, sub, locals_, self.counter)
                w.store(n.name, n.layout.index(_ivars(len(n.ranges))), accs[n.name])
                body += w.lines
        for blk in k.blocks[1:]:
            for node in blk.nodes:
                body += self._node(node, k, locals_, None)
        body += ["}", "}"] + ["}"] * (len(xs) - 1)
        return self._function(k.name, k.origins(), body), self.reads + self.writes


    def tiled_rows_kernel(self, k: Kernel) -> tuple[str, list[str]]:
        """A row kernel whose rows are strided (`_tiled_rows`: a softmax over dim 0) run over a tile
        of W outer points at once: each block loops over the inner range outside and the tile inside
        (the simd loop, every load contiguous), the reductions' accumulators, the scalar steps'
        values and the scratch rows are W wide. The tile's data stays in cache between the passes,
        as a row's does in the row kernel."""
        xs, ys = kernel_vars(len(k.outer), len(k.inner))
        last, size = xs[-1], k.outer[-1]
        width = _tile_width(k, self.storage)
        self.hidden = k.local | k.scratch
        # a scratch row of the tile: the inner point's slot, W lanes wide (read only at that point)
        self.scratch = {name: f"{name}[({_linear(ys, k.inner)}) * {width} + xi]" for name in k.scratch}
        total = sympy.Mul(*k.outer, *k.inner)
        parallel = not (total.is_number and total < PARALLEL_MIN)
        body = [f"#pragma omp parallel{'' if total.is_number else f' if({cexpr(total)} >= {PARALLEL_MIN})'}"
                if parallel else "// one thread", "{"]
        for name in sorted(k.scratch):
            T = CTYPE[self.storage[name]]
            body.append(f"{T}* {name} = static_cast<{T}*>(std::malloc(sizeof({T}) * ({cexpr(sympy.Mul(*k.inner))}) * {width}));")
        if parallel:
            body.append(f"#pragma omp for{f' collapse({len(xs)})' if len(xs) > 1 else ''}")
        for x, r in zip(xs[:-1], k.outer[:-1]):
            body.append(f"for (int64_t {x} = 0; {x} < {cexpr(r)}; {x}++) {{")
        body.append(f"for (int64_t xt = 0; xt < {cexpr(size)}; xt += {width}) {{")
        body.append(f"const int64_t xn = {cexpr(size)} - xt < {width} ? {cexpr(size)} - xt : {width};")
        tile = [f"for (int64_t xi = 0; xi < xn; xi++) {{", f"const int64_t {last} = xt + xi;"]
        locals_: dict = {}
        for blk in k.blocks:
            if blk.kind == "scalar":
                lines: list[str] = []
                for n in blk.nodes:
                    lines += self._node(n, k, locals_, None)
                decls, keep = _spill(lines, set(locals_.values()), width)
                for key, value in locals_.items():
                    locals_[key] = keep.get(value, value)
                body += decls + tile + lines + [f"tile_{t}[xi] = {t};" for t in keep] + ["}"]
            else:
                body += self._tile_block(blk, k, xs, ys, locals_, width, tile)
        body += ["}"] * len(xs)  # the tile loop and the outer loops before it
        body += [f"std::free({name});" for name in sorted(k.scratch)] + ["}"]
        return self._function(k.name, k.origins(), body), self.reads + self.writes

    def _tile_block(self, blk: Block, k: Kernel, xs: Sequence[sympy.Symbol], ys: Sequence[sympy.Symbol],
                    locals_: dict, width: int, tile: list[str]) -> list[str]:
        """One loop block of tiled_rows_kernel: W accumulators per reduction, the values that do not
        change along the inner range computed once per tile point (kept W wide), then the inner
        loops around the tile's simd loop, then each reduction's result per tile point."""
        reds = [n for n in blk.nodes if isinstance(n, Reduction)]
        accs = {n.name: f"acc_{n.name}[xi]" for n in reds}
        body: list[str] = []
        for n in reds:
            rtype, dtype = _omp_type(n)
            T = CTYPE[compute(dtype)]
            body.append(f"{T} acc_{n.name}[{width}]; for (int xi = 0; xi < {width}; xi++) "
                        f"acc_{n.name}[xi] = {_reduce_init(rtype, dtype)};")
            if rtype in ("max", "min") and dtype.is_floating_point:
                body.append(f"int nan_{n.name}[{width}] = {{0}};")
        shared: dict = {}
        hoisted = self._hoisted(blk.nodes, k, ys, locals_, shared)
        if hoisted:
            names = {name for cache in shared.values() for name in cache.values()}
            decls, keep = _spill(hoisted, names, width)
            for cache in shared.values():
                for v, name in cache.items():
                    cache[v] = keep.get(name, name)
            body += decls + tile + hoisted + [f"tile_{t}[xi] = {t};" for t in keep] + ["}"]
        loop_locals = dict(locals_)  # values made in this loop are visible only inside it
        nodes = [line for node in blk.nodes for line in self._node(node, k, loop_locals, accs.get(node.name), shared)]
        if not reds and _stores_along_inner(k, blk):
            # a pass that only stores, into rows contiguous along the inner range (a softmax of a
            # transposed input written row-major): each tile point's row in a simd loop of its own,
            # its reads (the tile's, in cache) strided instead of its stores
            o, c = _simd_loops(ys, k.inner, "#pragma omp simd")
            return body + tile + o + nodes + c + ["}"]
        o, c = _loops(ys, k.inner, None)
        body += o + ["#pragma omp simd"] + tile + nodes + ["}"] + c
        if not reds:
            return body
        body += tile
        for n in reds:
            if n.layout.dtype.is_floating_point and n.reduction_type in ("max", "min"):
                body.append(f"if (nan_{n.name}[xi]) {accs[n.name]} = "
                            f"std::numeric_limits<{CTYPE[compute(n.layout.dtype)]}>::quiet_NaN();")
            sub = node_substitution(n, k.outer, k.inner)
            assert sub is not None  # a reduction's ranges are its kernel's
            key = sympy.expand(n.layout.index(_ivars(len(n.ranges))).xreplace(sub))
            locals_[(n.name, key)] = accs[n.name]
            if n.name not in k.local:
                self._note(self.writes, n.name)
                w = CppBodyWriter(self.storage, sub, locals_, self.counter)
                w.store(n.name, n.layout.index(_ivars(len(n.ranges))), accs[n.name])
                body += w.lines
        return body + ["}"]

    def blocked_copy_kernel(self, k: Kernel) -> tuple[str, list[str]]:
        """A pointwise kernel that reads along one dim and writes along another (`_blocked_copy`: a
        transpose made contiguous) walked in COPY_BLOCK x COPY_BLOCK squares of (last outer, last
        inner) points: the lines a square reads and the lines it writes both stay in L1 while it
        runs, where a row of the plain loop reads one element of each of its lines (1024x1024
        floats: 7x eager's time)."""
        xs, ys = kernel_vars(len(k.outer), len(k.inner))
        self.scratch, self.hidden = {}, k.local
        body = _tiled_outer_loops(xs, k)
        xl, yl, xr, yr = xs[-1], ys[-1], cexpr(k.outer[-1]), cexpr(k.inner[-1])
        body.append(f"for (int64_t xb = 0; xb < {xr}; xb += {COPY_BLOCK}) {{")
        for y, r in zip(ys[:-1], k.inner[:-1]):
            body.append(f"for (int64_t {y} = 0; {y} < {cexpr(r)}; {y}++) {{")
        body += [f"for (int64_t yb = 0; yb < {yr}; yb += {COPY_BLOCK}) {{",
                 f"const int64_t xe = xb + {COPY_BLOCK} < {xr} ? xb + {COPY_BLOCK} : {xr};",
                 f"const int64_t ye = yb + {COPY_BLOCK} < {yr} ? yb + {COPY_BLOCK} : {yr};"]
        staged = _staged_outputs(k, self.storage)
        # staged: the square computed along the loads' contiguous dim into tiles, then copied out
        outer, inner = ((yl, "yb", "ye"), (xl, "xb", "xe")) if staged else ((xl, "xb", "xe"), (yl, "yb", "ye"))
        slot = f"(({yl} - yb) * {COPY_BLOCK} + {xl} - xb)"
        body += [f"alignas(64) {CTYPE[self.storage[n.name]]} tile_{n.name}[{COPY_BLOCK * COPY_BLOCK}];" for n in staged]
        self.scratch = {n.name: f"tile_{n.name}[{slot}]" for n in staged}
        body += [f"for (int64_t {outer[0]} = {outer[1]}; {outer[0]} < {outer[2]}; {outer[0]}++) {{", "#pragma omp simd",
                 f"for (int64_t {inner[0]} = {inner[1]}; {inner[0]} < {inner[2]}; {inner[0]}++) {{"]
        locals_: dict = {}
        for blk in k.blocks:
            for n in blk.nodes:
                body += self._node(n, k, locals_, None)
        body += ["}", "}"]
        self.scratch = {}
        if staged:
            body += [f"for (int64_t {xl} = xb; {xl} < xe; {xl}++) {{", "#pragma omp simd",
                     f"for (int64_t {yl} = yb; {yl} < ye; {yl}++) {{"]
            for out in staged:
                node = _block_node(out)
                sub = kernel_substitution(k, node)
                assert sub is not None  # a blocked copy's nodes all have one (_blocked_copy)
                w = CppBodyWriter(self.storage, sub, {}, self.counter)
                w.store(node.name, node.layout.index(_ivars(len(node.ranges))), f"tile_{node.name}[{slot}]")
                body += w.lines
            body += ["}", "}"]
        body += ["}"] + ["}"] * (len(ys) - 1) + ["}"] + ["}"] * (len(xs) - 1)
        return self._function(k.name, k.origins(), body), self.reads + self.writes


COPY_BLOCK = 32  # points per side of a blocked copy's square: 32 lines read, 32 written, 8 KiB of floats


def _staged_outputs(k: Kernel, storage: dict[str, torch.dtype]) -> list[Buffer]:
    """The stored nodes of a blocked copy whose square is better computed along its last outer dim
    (where its loads are contiguous) into a tile, then copied out along the inner one: where the
    body calls a vector math function (softplus of a transposed input: with strided loads the loop
    did not vectorize and each element ran a whole libmvec call, 7x a contiguous softplus). Empty
    when a node reads what the kernel stores, or stores a type other than float32/float64."""
    stored: list[Buffer] = [n for n in k.nodes if n.name not in k.local]
    names = {n.name for n in stored}
    values = [v for n in k.nodes for v in walk(_block_node(n).body)]
    if any(isinstance(v, Load) and v.buffer in names for v in values):
        return []
    if any(storage[n.name] not in (torch.float32, torch.float64) for n in stored):
        return []
    return stored if any(calls_math(v) for v in values) else []
TILE_BYTES = 256 << 10  # a tiled row kernel's tile reads and keeps at most this much per pass (L2 holds 1-2 MiB)


def _omp_type(n: Reduction) -> tuple[str, torch.dtype]:
    """A reduction's kind as its accumulator runs it (a max of booleans is an any) and its dtype."""
    rtype, dtype = n.reduction_type, n.layout.dtype
    if dtype == torch.bool and rtype in ("max", "min"):
        rtype = "any" if rtype == "max" else "all"
    return rtype, dtype


_DECLARED = re.compile(r"^([\w:]+) (t\d+) = ")


def _spill(lines: list[str], wanted: set[str], width: int) -> tuple[list[str], dict[str, str]]:
    """Temporaries that `lines` (a tile loop's body) declare and later code reads (`wanted`): their
    W-wide arrays, declared before the tile loop, and the name of each one's slot of the current point."""
    decls, keep = [], {}
    for line in lines:
        m = _DECLARED.match(line)
        if m and m.group(2) in wanted:
            decls.append(f"{m.group(1)} tile_{m.group(2)}[{width}];")
            keep[m.group(2)] = f"tile_{m.group(2)}[xi]"
    return decls, keep


def _strided_rows(k: Kernel, nodes: Sequence[Buffer], stores: bool) -> bool | None:
    """Over the loads (and with `stores`, the stores to memory) of `nodes`: None when one is
    indirect, divides its index or steps by 1 along the last inner dim; else whether one steps by 1
    along the last outer dim. A scratch buffer read anywhere but where it was written also gives None."""
    xs, ys = kernel_vars(len(k.outer), len(k.inner))
    contiguous_outer = False
    for node in nodes:
        n = _block_node(node)
        sub = node_substitution(n, k.outer, k.inner)
        if sub is None:
            return None
        indices = []
        for v in walk(n.body):
            if not isinstance(v, Load) or v.buffer in k.local:
                continue
            if v.buffer in k.scratch:
                owner = next(m for m in k.nodes if m.name == v.buffer)
                here = kernel_substitution(k, owner)
                if v.extra is not None or here is None or sympy.expand(v.index.xreplace(sub)) != sympy.expand(
                        owner.layout.index(_ivars(len(owner.ranges))).xreplace(here)):
                    return None
                continue
            indices.append((v.index, v.extra))
        if stores and isinstance(n, Pointwise) and n.name not in k.local | k.scratch:
            indices.append((n.layout.index(_ivars(len(n.ranges))), None))
        for index, extra in indices:
            idx = sympy.expand(index.xreplace(sub))
            if extra is not None or idx.has(FloorDiv, ModularIndexing) or idx.coeff(ys[-1]) == 1:
                return None
            contiguous_outer |= idx.coeff(xs[-1]) == 1
    return contiguous_outer


def _stores_along_inner(k: Kernel, blk: Block) -> bool:
    """Whether a node of the block stores to memory contiguously along the last inner dim."""
    ys = kernel_vars(len(k.outer), len(k.inner))[1]
    for node in blk.nodes:
        sub = node_substitution(node, k.outer, k.inner)
        if isinstance(node, Pointwise) and sub is not None and node.name not in k.local | k.scratch:
            if sympy.expand(node.layout.index(_ivars(len(node.ranges))).xreplace(sub)).coeff(ys[-1]) == 1:
                return True
    return False


def _tiled_rows(k: Kernel) -> bool:
    """Whether a row kernel with reductions reads its rows with a stride where its last outer dim is
    contiguous (a softmax, a log_softmax, a variance over dim 0 of a row-major matrix): the row
    kernel's simd loop would stride through memory, a line per element (a softmax over dim 0 of
    1024x512 floats ran 14x eager's time), so tiled_rows_kernel runs it instead."""
    if not k.outer or not k.inner or k.columns or not k.blocks:
        return False
    if any(b.kind not in ("loop", "scalar") for b in k.blocks):
        return False
    looped = [n for b in k.blocks if b.kind == "loop" for n in b.nodes]
    reds = [n for n in looped if isinstance(n, Reduction)]
    if not reds or not all(n.reduction_type in OMP_REDUCTION for n in reds):
        return False
    return bool(_strided_rows(k, looped, stores=False))


def _blocked_copy(k: Kernel) -> bool:
    """Whether a pointwise kernel stores contiguously along its last inner dim while a load it makes
    is contiguous along the last outer dim instead (and not along the inner one), both at least a
    block long."""
    if not k.outer or not k.inner or k.scratch or k.columns:
        return False
    if any(b.kind != "loop" for b in k.blocks) or not all(isinstance(n, Pointwise) for n in k.nodes):
        return False
    if any(r.is_number and int(r) < COPY_BLOCK for r in (k.outer[-1], k.inner[-1])):
        return False  # the lines of a side shorter than a block already stay in cache (a conv weight's relayout)
    xs, ys = kernel_vars(len(k.outer), len(k.inner))
    stored = False
    for node in k.nodes:
        sub = node_substitution(node, k.outer, k.inner)
        if sub is None:
            return False
        if node.name not in k.local:
            idx = sympy.expand(node.layout.index(_ivars(len(node.ranges))).xreplace(sub))
            if idx.has(FloorDiv, ModularIndexing):
                return False
            stored |= idx.coeff(ys[-1]) == 1
    return stored and bool(_strided_rows(k, k.nodes, stores=False))


def _tile_width(k: Kernel, storage: dict[str, torch.dtype]) -> int:
    """Outer points per tile of tiled_rows_kernel: what the bytes of one point's inner range (the
    buffers its loops read, its scratch rows) allow within TILE_BYTES, a power of two from 16 to TILE
    (each inner step then reads at least 64 contiguous bytes of each input)."""
    names = {v.buffer for n in k.nodes for v in walk(n.body) if isinstance(v, Load) and v.buffer not in k.local}
    per_point = sum(_itemsize(storage[name]) for name in names if name in storage)
    inner = sympy.Mul(*k.inner)
    if not inner.is_number:
        return 64
    width = 16
    while width < TILE and width * 2 * int(inner) * max(per_point, 1) <= TILE_BYTES:
        width *= 2
    last = k.outer[-1]
    while last.is_number and width > 16 and width // 2 >= int(last):
        width //= 2
    return width


# ---------------------------------------------------------------------------------------------------
# One thread: no parallel region at all

_NUM_THREADS_RE = re.compile(r"\s*num_threads\(([A-Za-z_]\w*(?:\(\))?)\)")


def serial_at_one_thread(body: list[str]) -> list[str]:
    """`body` (a kernel's lines, each parallel pragma carrying its num_threads clause) with every
    parallel region behind a branch: the region as written when its team has more than one thread
    (and its `if` clause holds), else the same statement with no OpenMP region around it.

    libgomp enters a region even for a team of one (an `if` clause that fails, or
    torch.set_num_threads(1)), and leaving it costs a futex syscall: a few tenths of a microsecond
    per kernel, more than a small kernel's work. The serial copy drops the region's worksharing
    pragmas and keeps its simd ones (a `parallel for simd` becomes `simd` with its collapse and
    reduction clauses), so one thread runs the loop as the team of one did, lane sums combined in
    the same order, except that a `simd collapse(n)` goes to the innermost loop of its nest
    (_simd_innermost). A region already behind such a branch (the scatter's atomic loop, whose one-thread
    copy stores plainly) is left as it is, and so is one over ADAPTIVE_THREADS_MAX elements or more
    (its `kiln_all_threads()` clause): its work takes milliseconds, and the copy would only add to the
    library's build time (the serial copy costs build time in proportion to the kernels it doubles)."""
    out: list[str] = []
    i = 0
    while i < len(body):
        line = body[i]
        if not line.startswith("#pragma omp parallel") or (out and out[-1].startswith("if (kiln_nt > 1")) \
                or "num_threads(kiln_all_threads())" in line:
            out.append(line)
            i += 1
            continue
        end = _statement_end(body, i + 1)
        statement = body[i + 1:end]
        threads = _NUM_THREADS_RE.search(line)
        assert threads is not None, line  # KernelWriter._function gives every region its clause
        pragma, condition = _without_if_clause(line)
        # the size first: a small kernel never asks for the thread count (adaptive: a clock read)
        test = (f"({condition}) && " if condition else "") + f"{threads.group(1)} > 1"
        out += [f"if ({test}) {{", pragma, *statement, "} else {"]
        serial = _serial_pragma(pragma)
        statement = [s for s in statement if not s.startswith("#pragma omp for")]
        out += _simd_innermost(serial, statement) if serial else statement
        out.append("}")
        i = end
    return out


def _statement_end(lines: list[str], start: int) -> int:
    """The index after the statement opening at lines[start] (its braces balanced; one line if none)."""
    depth = 0
    for j in range(start, len(lines)):
        depth += lines[j].count("{") - lines[j].count("}")
        if depth <= 0:
            return j + 1
    raise AssertionError("a parallel region whose statement does not close")


def _without_if_clause(pragma: str) -> tuple[str, str | None]:
    """The pragma without its `if(...)` clause, and that clause's condition (None when it has none)."""
    start = pragma.find(" if(")
    if start < 0:
        return pragma, None
    depth, j = 0, start + 3
    for j in range(start + 3, len(pragma)):
        depth += {"(": 1, ")": -1}.get(pragma[j], 0)
        if depth == 0:
            break
    return pragma[:start] + pragma[j + 1:], pragma[start + 4:j]


_COLLAPSE_RE = re.compile(r" collapse\((\d+)\)")


def _simd_innermost(pragma: str, nest: list[str]) -> list[str]:
    """`pragma` (a serial `omp simd`) over the loop nest `nest`: a `collapse(n)` of it comes off and
    the pragma goes on the n-th loop, the innermost one it covered. GCC runs `omp simd collapse(2)`
    without a team as one loop whose index steps carry a branch, scalar (a max over a 256x512
    matrix at one thread took 30x the time of the same loop with the simd on its rows), where the
    `parallel for simd` it came from splits the collapsed range per thread and vectorizes it."""
    found = _COLLAPSE_RE.search(pragma)
    depth = int(found.group(1)) if found else 1
    if depth == 1:
        return [pragma, *nest]
    if len(nest) < depth or not all(line.lstrip().startswith("for (") for line in nest[:depth]):
        return [pragma, *nest]  # not a perfect nest as _loops writes one: kept as it was
    return nest[:depth - 1] + [_COLLAPSE_RE.sub("", pragma)] + nest[depth - 1:]


def _serial_pragma(pragma: str) -> str | None:
    """What of a parallel pragma one thread keeps: `simd` with its collapse and reduction clauses."""
    if not pragma.startswith("#pragma omp parallel for simd"):
        return None
    rest = _NUM_THREADS_RE.sub("", pragma[len("#pragma omp parallel for simd"):])
    return "#pragma omp simd" + rest


# ----------------------------------------------------------------------------- loops cut where a mask flips
#
# A concatenation along the inner dim (torch.cat of rows, a padded row) reads each part under a
# mask `i < start of the next part`: as one loop, every element evaluates the chain of masks and
# selects among masked loads (a cat of three 512x256 matrices along dim 1 ran at 0.78x eager's
# speed). Such a mask is true on a prefix of the inner range and false on the rest, so the loop is
# cut there into loops whose bodies take one side of it: each part becomes a plain copy loop (or
# the part's pointwise work), vectorized without a select, still fused with what consumes it.

MAX_CUT_LOOPS = 16  # loops one block may be cut into (each mask that flips inside a piece doubles it)


def _flip_point(mask: Value, sub: dict, y: sympy.Symbol) -> sympy.Expr | None:
    """Where `mask`, a comparison `e < b` of index values, turns from true to false along the loop
    variable `y`: e steps by exactly 1 along y and b does not move with y (at `e - b` = y + rest,
    the mask holds for y < -rest). None for any other mask."""
    if not isinstance(mask, Op) or mask.name != "lt":
        return None
    sides = []
    for a in mask.args:
        if isinstance(a, Index):
            sides.append(sympy.sympify(a.expr).xreplace(sub))
        elif isinstance(a, Const) and isinstance(a.value, int) and not isinstance(a.value, bool):
            sides.append(sympy.Integer(a.value))
        else:
            return None
    rest = sympy.expand(sides[0] - sides[1] - y)
    if y in rest.free_symbols or rest.has(FloorDiv, ModularIndexing):
        return None
    return sympy.expand(-rest)


def _flip_points(node: Pointwise, sub: dict, y: sympy.Symbol) -> dict[Value, sympy.Expr]:
    """The masks of `node`'s Masked values that flip along `y`, each with its point."""
    found: dict[Value, sympy.Expr] = {}
    for v in walk(node.body):
        if isinstance(v, Masked) and v.mask not in found:
            point = _flip_point(v.mask, sub, y)
            if point is not None:
                found[v.mask] = point
    return found


def inner_cut(nodes: Sequence[Buffer], k: Kernel, ys: Sequence[sympy.Symbol]) -> sympy.Expr | None:
    """Where to cut a loop block's innermost loop: the flip point of a mask one of its nodes takes a
    side of, in kernel variables, the same at every point of the inner range (only outer variables
    and sizes in it). Only blocks of pointwise nodes: no accumulator runs across the pieces."""
    if not ys or not all(isinstance(n, Pointwise) for n in nodes):
        return None
    for n in nodes:
        assert isinstance(n, Pointwise)
        sub = kernel_substitution(k, n)
        if sub is None:
            return None
        for point in _flip_points(n, sub, ys[-1]).values():
            if not point.free_symbols & set(ys):
                return point
    return None


def taking_side(nodes: Sequence[Buffer], k: Kernel, y: sympy.Symbol, point: sympy.Expr, below: bool
                ) -> tuple[Pointwise, ...]:
    """`nodes` on the piece of the loop where y < point (`below`) or y >= point: every Masked whose
    mask flips at `point` along y replaced by the side it takes there."""
    out: list[Pointwise] = []
    for n in nodes:
        assert isinstance(n, Pointwise)  # inner_cut admits only these
        sub = kernel_substitution(k, n)
        assert sub is not None  # inner_cut found every node's
        decided = {m for m, p in _flip_points(n, sub, y).items() if sympy.expand(p - point) == 0}
        out.append(dataclasses.replace(n, body=_decide(n.body, decided, below, {})) if decided else n)
    return tuple(out)


def _decide(v: Value, masks: set[Value], holds: bool, memo: dict[int, Value]) -> Value:
    """`v` with each Masked whose mask is in `masks` replaced by its body (`holds`) or its other side."""
    if id(v) in memo:
        return memo[id(v)]
    if isinstance(v, Masked) and v.mask in masks:
        out = _decide(v.body if holds else v.other, masks, holds, memo)
    elif isinstance(v, Masked):
        out = Masked(_decide(v.mask, masks, holds, memo), _decide(v.body, masks, holds, memo),
                     _decide(v.other, masks, holds, memo), v.dtype)
    elif isinstance(v, Op):
        out = dataclasses.replace(v, args=tuple(_decide(a, masks, holds, memo) for a in v.args))
    elif isinstance(v, Load) and v.extra is not None:
        out = dataclasses.replace(v, extra=_decide(v.extra, masks, holds, memo))
    else:
        out = v
    memo[id(v)] = out
    return out
