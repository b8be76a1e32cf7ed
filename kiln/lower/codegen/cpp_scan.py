"""C++ kernels that carry a value from one element to the next: cumulative sums and products (a
serial loop along the scanned dim, the other dims in parallel, tiled or several rows side by side)
and scatters (stores in ATen's order, accumulating adds with atomics when the team has threads).

A mixin of KernelWriter (codegen/cpp_kernel.py), which supplies how reads are collected, how a
kernel function is wrapped and which buffers it reads and writes. Corresponds to the scan and
scatter parts of torch/_inductor/codegen/cpp.py.
"""
from __future__ import annotations

import sympy
import torch

from kiln.lower.codegen.cpp import CTYPE, PARALLEL_MIN, CppBodyWriter, cexpr, compute
from kiln.lower.codegen.cpp_loops import KernelParts, _ivars, _loops, _tiled_outer_loops
from kiln.lower.ir import Scan
from kiln.lower.schedule import Kernel, ScatterKernel, kernel_vars

SCAN_TILE = 64  # points of a scan's tile, where that leaves SCAN_MIN_TILES tiles to share among threads
SCAN_MIN_TILES = 64
SCAN_LINE = 16  # points of a scan's tile otherwise: one line of floats per step
SCAN_ROWS = 4  # rows of a scan along rows run side by side: one row's adds waited on each other (0.96x eager -> 1.2x)


class ScanKernels(KernelParts):
    """The scan and scatter kernels of KernelWriter (codegen/cpp_kernel.py)."""

    def scan_kernel(self, k: Kernel) -> tuple[str, list[str]]:
        """A cumulative sum or product: the other dims in parallel, a serial loop along the scanned
        dim carrying the running value (in the node's accumulator type) from one element to the next.
        Where the last other dim is the contiguous one (a cumsum over dim 0 of a row-major matrix), a
        tile of its points is scanned at once, the tile's simd loop inside the scanned dim's, one
        accumulator per point: one column at a time strode through memory a line per element
        (1024x256 floats: 0.98x eager -> 3.4x); each point's adds keep their order, so the values
        are those of one column at a time. (Tiles of strided rows made GCC gather and scatter:
        a cumsum over rows ran 5x slower.)"""
        n = k.blocks[0].nodes[0]
        assert isinstance(n, Scan)
        xs, ys = kernel_vars(len(k.outer), 1)
        own = _ivars(len(n.ranges))
        rest = iter(xs)
        sub = {v: ys[0] if d == n.dim else next(rest) for d, v in enumerate(own)}
        self.scratch, self.hidden = {}, frozenset()
        A = CTYPE[n.acc_dtype]
        init = f"{A}({'0' if n.scan_type == 'sum' else '1'})"
        tiled = bool(k.outer) and sympy.expand(n.layout.index(own).xreplace(sub)).coeff(xs[-1]) == 1
        op = "+" if n.scan_type == "sum" else "*"
        self._collect_reads(CppBodyWriter(self.storage, sub, {}, self.counter), n.body, frozenset())
        self._note(self.writes, n.name)

        def step(point_sub: dict, acc: str) -> list[str]:
            """One point's element of the scan: its value, added into `acc`, and stored."""
            w = CppBodyWriter(self.storage, point_sub, {}, self.counter)
            value = w.value(n.body)
            lines = w.lines + [f"{acc} {op}= static_cast<{A}>({value});"]
            w = CppBodyWriter(self.storage, point_sub, {}, self.counter)
            w.store(n.name, n.layout.index(own), f"static_cast<{CTYPE[compute(n.layout.dtype)]}>({acc})")
            return lines + w.lines

        scan_loop = f"for (int64_t {ys[0]} = 0; {ys[0]} < {cexpr(k.inner[0])}; {ys[0]}++) {{"
        origin = f"// {n.name} <- {', '.join(n.origins)}"
        if tiled:
            size = cexpr(k.outer[-1])
            tiles = sympy.Mul(*k.outer[:-1]) * sympy.ceiling(k.outer[-1] / SCAN_TILE)
            # wide where that leaves enough tiles for the threads, else one line of floats
            width = SCAN_TILE if tiles.is_number and tiles >= SCAN_MIN_TILES else SCAN_LINE
            body = _tiled_outer_loops(xs, k) + [
                f"for (int64_t xt = 0; xt < {size}; xt += {width}) {{",
                f"const int64_t xn = {size} - xt < {width} ? {size} - xt : {width};",
                f"{A} acc[{width}]; for (int xi = 0; xi < {width}; xi++) acc[xi] = {init};", scan_loop,
                "#pragma omp simd", "for (int64_t xi = 0; xi < xn; xi++) {", f"const int64_t {xs[-1]} = xt + xi;", origin]
            body += step(sub, "acc[xi]")
            # the tile's loop, the scanned dim's, the tiles', the outer ones
            return self._function(k.name, k.origins(), body + ["}", "}", "}"] + ["}"] * (len(xs) - 1)), \
                self.reads + self.writes
        total = sympy.Mul(*k.outer, *k.inner)
        pragma = None
        if k.outer and not (total.is_number and total < PARALLEL_MIN):
            pragma = "#pragma omp parallel for@collapse" + ("" if total.is_number else f" if({cexpr(total)} >= {PARALLEL_MIN})")
        body, span = [], None
        if k.outer:
            # SCAN_ROWS points of the last other dim scanned side by side (each its own chain of
            # adds, interleaved in one loop), then the points left over one at a time
            last, size = xs[-1], k.outer[-1]
            full = size - size % SCAN_ROWS if size.is_number else sympy.Symbol(f"(({cexpr(size)}) / {SCAN_ROWS} * {SCAN_ROWS})")
            if not (full.is_number and full == 0):
                points = [sympy.Symbol(f"{last}_{j}", integer=True, nonnegative=True) for j in range(SCAN_ROWS)]
                body += _tiled_outer_loops(xs, k) + [f"for (int64_t xg = 0; xg < {cexpr(full)}; xg += {SCAN_ROWS}) {{"]
                body += [f"const int64_t {p} = xg + {j}; {A} acc{j} = {init};" for j, p in enumerate(points)]
                body += [scan_loop, origin]
                for j, p in enumerate(points):
                    body += step({v: p if e == last else e for v, e in sub.items()}, f"acc{j}")
                body += ["}", "}"] + ["}"] * (len(xs) - 1)
            span = (full, size)
            if sympy.expand(size - full) == 0:
                return self._function(k.name, k.origins(), body), self.reads + self.writes
        body += _loops(xs, k.outer, pragma, span)[0] + [f"{A} acc = {init};", scan_loop, origin]
        body += step(sub, "acc") + ["}"] + ["}"] * len(xs)
        return self._function(k.name, k.origins(), body), self.reads + self.writes

    def scatter(self, k: ScatterKernel) -> tuple[str, list[str]]:
        n = k.node
        vars_ = _ivars(len(n.ranges))
        w = CppBodyWriter(self.storage, {}, {}, self.counter)
        self._collect_reads(w, n.body, frozenset())
        for part in (n.extra, n.mask):
            if part is not None:
                self._collect_reads(w, part, frozenset())
        # accumulating scatters run in parallel (atomic adds), but only when there is enough work
        # to pay for starting the threads; stores stay serial (the last write must win, as in ATen)
        total = sympy.Mul(*n.ranges)
        # an add into a half type rounds after each element: it runs in ATen's order, on one thread
        half = self.storage[n.target] in (torch.bfloat16, torch.float16)
        parallel = n.mode == "add" and not half and bool(n.ranges) and not (total.is_number and total < PARALLEL_MIN)

        def loop(atomic: bool) -> list[str]:
            w = CppBodyWriter(self.storage, {}, {}, self.counter)
            value = w.value(n.body)
            extra = "" if n.extra is None else f" + {w.value(n.extra)}"
            if n.mask is not None:  # a failed bounds check skips the store (the wrapper raises after)
                w.lines.append(f"if ({w.value(n.mask)}) {{")
            w.store(n.target, n.index, value, n.mode, extra, atomic=atomic)
            if n.mask is not None:
                w.lines.append("}")
            o, c = _loops(vars_, n.ranges, "#pragma omp parallel for@collapse num_threads(kiln_nt)" if atomic else None)
            return o + [f"// {n.name} <- {', '.join(n.origins)}"] + w.lines + c

        self._note(self.writes, n.target)
        if parallel:
            # one thread adds plainly: an atomic float add is a compare-and-swap loop, several times
            # the cost of the add (an embedding backward's scatter-add spent most of its time there)
            enough = "" if total.is_number else f" && {cexpr(total)} >= {PARALLEL_MIN}"
            body = ["const int kiln_nt = kiln_threads();", f"if (kiln_nt > 1{enough}) {{"] + loop(True) + \
                ["} else {"] + loop(False) + ["}"]
        else:
            body = loop(False)
        return self._function(k.name, list(n.origins), body), self.reads + self.writes
