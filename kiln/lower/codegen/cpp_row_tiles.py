"""Row kernels over short rows, run a tile of rows at a time so that their per-row scalar steps run
in vector lanes across the tile (a log_softmax's log of each row's sum, a softmax's reciprocal).

The row kernel (cpp_kernel.py) runs every block of one row before the next row: its scalar steps
are one scalar call per row (kiln_logf through libmvec), which a short row cannot hide (a
log_softmax over 512x16 floats spent a third of its time on them). Here the loop blocks between two
scalar blocks run row by row over the tile, each row's passes together as in the row kernel, their
results kept in tile-wide arrays; each scalar block then runs once over the tile as a simd loop.
A mixin of KernelWriter (cpp_kernel.py), as SumKernels is; ATen's vectorized log_softmax over the
last dim takes the log of a chunk of rows' sums at once for the same reason.
"""
from __future__ import annotations

import re
from typing import Sequence

import sympy

from kiln.lower.codegen.cpp import CTYPE, PARALLEL_MIN, _speculable, cexpr, compute
from kiln.lower.codegen.cpp_loops import OMP_REDUCTION, KernelParts, Span, _block_node, _spill
from kiln.lower.ir import Load, Reduction, walk
from kiln.lower.schedule import Block, Kernel, kernel_vars

_CHECKS = re.compile(r"kiln_record|kiln_index_ok|kiln_zero_divisor|omp atomic")  # not in a simd loop
_PLAIN_LOAD = re.compile(r"^[\w:]+ t\d+ = \w+\[[^\]]*\];$")
ROW_TILE = 16  # rows per tile: one 512-bit vector of float results per scalar step
ROW_TILE_MAX_INNER = 128  # row lengths up to this run in tiles (a longer row's passes hide its scalar steps)


class RowTileKernels(KernelParts):
    """row_tile_kernel, for the kernels _row_tiles picks."""

    cut_loops: int
    adaptive_threads: bool

    def _loop_block(self, blk: Block, k: Kernel, ys: Sequence[sympy.Symbol], locals_: dict, parallel: bool,
                    parallel_if: str, span: Span | None = None, hoisted: dict | None = None) -> list[str]:
        raise NotImplementedError  # KernelWriter's

    def _prefetch_next_row(self, k: Kernel, xs: Sequence[sympy.Symbol], ys: Sequence[sympy.Symbol]) -> list[str]:
        raise NotImplementedError  # KernelWriter's

    def row_tile_kernel(self, k: Kernel, in_output: dict[str, str], adaptive_max: int) -> tuple[str, list[str]]:
        """The kernel's outer loops with the last one in tiles of ROW_TILE rows; per tile, each run of
        loop blocks in one loop over the tile's rows, each scalar block in a simd loop over them."""
        xs, ys = kernel_vars(len(k.outer), len(k.inner))
        last, size = xs[-1], k.outer[-1]
        self.cut_loops = 0
        self.scratch = dict(in_output)  # a softmax's exponentials, kept in its output
        self.hidden = k.local | k.scratch
        total = sympy.Mul(*k.outer, *k.inner)
        parallel_if = f" if({cexpr(total)} >= {PARALLEL_MIN})" if not total.is_number else ""
        parallel = not (total.is_number and total < PARALLEL_MIN)
        self.adaptive_threads = not (total.is_number and total >= adaptive_max)
        body = [f"#pragma omp parallel for{f' collapse({len(xs)})' if len(xs) > 1 else ''}{parallel_if}"] if parallel else []
        for x, r in zip(xs[:-1], k.outer[:-1]):
            body.append(f"for (int64_t {x} = 0; {x} < {cexpr(r)}; {x}++) {{")
        body.append(f"for (int64_t xt = 0; xt < {cexpr(size)}; xt += {ROW_TILE}) {{")
        body.append(f"const int64_t xn = {cexpr(size)} - xt < {ROW_TILE} ? {cexpr(size)} - xt : {ROW_TILE};")
        locals_: dict = {}
        run: list[tuple[Block, dict | None]] = []
        for blk in (*k.blocks, None):
            if blk is not None and blk.kind == "loop":
                # what a block computes once per row (a log_softmax's log of the row's sum, hoisted out of
                # its last pass) runs over the tile before the block's rows, after the blocks it reads
                # (a plain load in the trial is a value of the run's, which it does not have yet: such a
                # block joins the run and hoists per row, as in the row kernel)
                trial = self._hoisted(blk.nodes, k, ys, dict(locals_), {})
                if run and all(_PLAIN_LOAD.match(line) for line in trial):
                    run.append((blk, None))
                    continue
                if run:
                    body += self._tile_rows(run, k, ys, locals_, parallel, parallel_if, last)
                    run = []
                shared: dict = {}
                hoisted = self._hoisted(blk.nodes, k, ys, locals_, shared)
                if hoisted:
                    body += self._tile_hoisted(hoisted, shared, last)
                run.append((blk, shared))
                continue
            if run:
                body += self._tile_rows(run, k, ys, locals_, parallel, parallel_if, last)
                run = []
            if blk is not None:
                body += self._tile_scalars(blk, k, locals_, last)
        body += ["}"] * len(xs)  # the tile loop and the outer loops before it
        return self._function(k.name, k.origins(), body), self.reads + self.writes

    def _tile_rows(self, run: list[tuple[Block, dict | None]], k: Kernel, ys: Sequence[sympy.Symbol], locals_: dict, parallel: bool,
                   parallel_if: str, last: sympy.Symbol) -> list[str]:
        """Loop blocks over each row of the tile in turn; the values they leave for later blocks (the
        reductions' results) copied into tile-wide arrays, read from there afterwards."""
        before = dict(locals_)
        lines = ["for (int64_t xi = 0; xi < xn; xi++) {", f"const int64_t {last} = xt + xi;"]
        if not locals_:  # the tile's first pass reads its rows from memory: the next row's on its way
            lines += self._prefetch_next_row(k, kernel_vars(len(k.outer), len(k.inner))[0], ys)
        for blk, shared in run:
            lines += self._loop_block(blk, k, ys, locals_, parallel, parallel_if, hoisted=shared)
        decls: list[str] = []
        nodes = {n.name: n for n in k.nodes}
        for key, value in list(locals_.items()):
            if before.get(key) == value:
                continue
            name = f"tile_{key[0]}_{len(decls)}"
            decls.append(f"{CTYPE[compute(nodes[key[0]].layout.dtype)]} {name}[{ROW_TILE}];")
            lines.append(f"{name}[xi] = {value};")
            locals_[key] = f"{name}[xi]"
        return decls + lines + ["}"]

    def _tile_hoisted(self, hoisted: list[str], shared: dict, last: sympy.Symbol) -> list[str]:
        """A block's hoisted statements over the tile's rows, their values kept tile-wide in `shared`."""
        names = {name for cache in shared.values() for name in cache.values()}
        decls, keep = _spill(hoisted, names, ROW_TILE)
        for cache in shared.values():
            for v, name in cache.items():
                cache[v] = keep.get(name, name)
        pragma = [] if any(_CHECKS.search(line) for line in hoisted) else ["#pragma omp simd"]
        loop = [*pragma, "for (int64_t xi = 0; xi < xn; xi++) {", f"const int64_t {last} = xt + xi;"]
        return decls + loop + hoisted + [f"tile_{t}[xi] = {t};" for t in keep] + ["}"]

    def _tile_scalars(self, blk: Block, k: Kernel, locals_: dict, last: sympy.Symbol) -> list[str]:
        """A scalar block as one simd loop over the tile's rows (its calls through their vector variants)."""
        lines: list[str] = []
        for n in blk.nodes:
            lines += self._node(n, k, locals_, None)
        decls, keep = _spill(lines, set(locals_.values()), ROW_TILE)
        for key, value in locals_.items():
            locals_[key] = keep.get(value, value)
        loop = ["#pragma omp simd", "for (int64_t xi = 0; xi < xn; xi++) {", f"const int64_t {last} = xt + xi;"]
        return decls + loop + lines + [f"tile_{t}[xi] = {t};" for t in keep] + ["}"]


def row_tiles(k: Kernel, in_output: dict[str, str]) -> bool:
    """Whether a row kernel runs in tiles of rows (row_tile_kernel): rows of a known length up to
    ROW_TILE_MAX_INNER, a scalar step between or after its loops that a lane may compute (no check,
    no integer division: cpp._speculable), reductions with OpenMP's clauses only, and no scratch row
    but those kept in the output."""
    if not k.outer or not k.inner or k.columns or not k.blocks:
        return False
    inner = sympy.Mul(*k.inner)
    if not inner.is_number or int(inner) > ROW_TILE_MAX_INNER or int(inner) < 2:
        return False
    if any(b.kind not in ("loop", "scalar") for b in k.blocks) or set(k.scratch) - set(in_output):
        return False
    if any(isinstance(n, Reduction) and n.reduction_type not in OMP_REDUCTION for n in k.nodes):
        return False
    scalars = [n for b in k.blocks if b.kind == "scalar" for n in b.nodes]
    if not all(_speculable(_block_node(n).body) for n in scalars):
        return False
    # a scalar step, or a pass that reads a reduction an earlier pass made (where _hoisted finds work)
    made: set[str] = set()
    for b in k.blocks:
        if b.kind == "loop" and made & {v.buffer for n in b.nodes for v in walk(n.body) if isinstance(v, Load)}:
            return True
        made |= {n.name for n in b.nodes if isinstance(n, Reduction)}
    return bool(scalars)
