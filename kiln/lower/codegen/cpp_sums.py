"""Float sums in C++ kernels, written for speed and for accuracy: a row's sum in lanes of partial
sums (GCC's `omp simd reduction(+)` adds the vector's lanes one after another), a short stride-1
dim's sum in a lane per index, and long sums in two levels (float chunks joined in double: one
float accumulator over 1e5 copies of 0.1 lost 1.3e-4 relative, eager's cascade 8e-8).

A mixin of KernelWriter (cpp_kernel.py), as ScanKernels is; the shared declarations are KernelParts'.
"""
from __future__ import annotations

from typing import Sequence

import sympy
import torch

from kiln.lower.codegen.cpp import CTYPE, cexpr, compute
from kiln.lower.codegen.cpp_loops import KernelParts, Span, _itemsize, _loops
from kiln.lower.ir import Load, Reduction, walk
from kiln.lower.schedule import Block, Kernel

SUM_LANES = 16  # partial sums of a row's float sum, at least (one 512-bit register, two of 256)
SUM_REGISTERS = 2  # independent chains of adds per lane block: one add's latency bounded a plain sum
SUM_CHUNK = 1024  # elements of a two-level float sum's partial (_chunked_sum_loops)
SUM_CHUNK_BLOCKS = 64  # blocks a lane adds before the chunk's sum joins the lane's (rows of 1024 floats: one chunk)


class SumKernels(KernelParts):
    """The sum loops of a row kernel's blocks (KernelWriter._loop_block picks one)."""

    def _short_row_lane_loops(self, blk: Block, k: Kernel, ys: Sequence[sympy.Symbol], locals_: dict,
                              shared: dict, reds: Sequence[Reduction], accs: dict[str, str]) -> list[str]:
        """Float sums over several inner dims whose innermost (the contiguous one) is short: each
        element is added into the lane of its innermost index, the lanes added once the nest ends.
        With `omp simd reduction(+)` on an inner loop of 8 (a group norm's channels of a group, the
        pixels outside), GCC added the 8 into one scalar per pixel, a chain of dependent adds, 4x
        eager's time for the statistics of a (1, 64, 32, 32) NHWC activation. Float lanes of more
        than SUM_CHUNK elements in all add in double (each lane's chain is long: its error grows
        with it, as _chunked_sum_loops's partials would)."""
        size = int(k.inner[-1])
        lanes = {n.name: f"lanes_{accs[n.name]}" for n in reds}
        types = {n.name: CTYPE[compute(n.layout.dtype)] for n in reds}
        total = sympy.Mul(*k.inner)
        long = not total.is_number or int(total) > SUM_CHUNK
        lane_types = {name: "double" if long and T == "float" else T for name, T in types.items()}
        body = [f"{types[n.name]} {accs[n.name]};" for n in reds] + ["{"]
        body += [f"alignas(64) {lane_types[name]} {lane}[{size}] = {{}};" for name, lane in lanes.items()]
        o, c = _loops(ys[:-1], k.inner[:-1], None)
        body += o + ["#pragma omp simd", f"for (int64_t {ys[-1]} = 0; {ys[-1]} < {size}; {ys[-1]}++) {{"]
        loop_locals = dict(locals_)
        for n in blk.nodes:
            acc = f"{lanes[n.name]}[{ys[-1]}]" if n.name in lanes else None
            body += ["  " + line for line in self._node(n, k, loop_locals, acc, shared)]
        body += ["}"] + c
        for n in reds:
            total_text = ' + '.join(f'{lanes[n.name]}[{j}]' for j in range(size))
            body.append(f"{accs[n.name]} = {types[n.name]}({total_text});")
        return body + ["}"]

    def _lane_sum_loops(self, blk: Block, k: Kernel, ys: Sequence[sympy.Symbol], locals_: dict, shared: dict,
                        reds: Sequence[Reduction], accs: dict[str, str]) -> list[str]:
        """A loop whose reductions are all floating-point sums, as blocks of SUM_LANES elements each
        added into its own lane of an array, then a remainder loop, then the lanes added as a tree.
        GCC's `omp simd reduction(+)` adds the vector's lanes one after another when the loop ends
        (it may not reassociate floats): sixteen dependent adds per row, a tenth of a softmax over
        rows of 128 (0.93x -> 1.05x eager); the array stays in registers across the blocks. A block
        is SUM_REGISTERS times what one 512-bit register holds of the narrowest type the loop reads
        or writes (32 floats, 64 bfloat16s): with 16 lanes over bfloat16 loads GCC made 256-bit
        vectors and kept the lanes in memory (a bf16 softmax ran 1.3x longer), and one register's
        chain of dependent adds bounded a plain sum (mean over 8x32000: 1.17x -> 1.37x eager)."""
        (y,), (size,) = ys, k.inner
        lanes_n = self._sum_lanes(blk)
        full = size - size % lanes_n if size.is_number else None
        full_text = str(full) if full is not None else f"({cexpr(size)}) / {lanes_n} * {lanes_n}"
        lanes = {n.name: f"lanes_{accs[n.name]}" for n in reds}
        types = {n.name: CTYPE[compute(n.layout.dtype)] for n in reds}
        chunk = lanes_n * SUM_CHUNK_BLOCKS
        chunked = full is None or full > chunk
        # the lanes of a long row take its chunks' float sums in double: in float they lost 3.5e-6
        # relative over a row of 1e6 copies of 0.1
        lane_types = {name: "double" if chunked and T == "float" else T for name, T in types.items()}
        body = [f"{types[n.name]} {accs[n.name]};" for n in reds] + ["{"]
        body += [f"alignas(64) {lane_types[name]} {lane}[{lanes_n}] = {{}};" for name, lane in lanes.items()]
        body.append(f"const int64_t kiln_full = {full_text};")

        def loop(start: str, count: str, into: dict[str, str]) -> list[str]:
            lines = ["#pragma omp simd", f"for (int64_t kiln_lane = 0; kiln_lane < {count}; kiln_lane++) {{",
                     f"const int64_t {y} = {start} + kiln_lane;"]
            loop_locals = dict(locals_)
            loop_shared = {key: dict(values) for key, values in shared.items()}  # the hoisted values
            for n in blk.nodes:
                acc = f"{into[n.name]}[kiln_lane]" if n.name in into else None
                lines += self._node(n, k, loop_locals, acc, loop_shared)
            return lines + ["}"]

        if not chunked:
            body += [f"for (int64_t kiln_block = 0; kiln_block < kiln_full; kiln_block += {lanes_n}) {{"]
            body += loop("kiln_block", str(lanes_n), lanes) + ["}"]
        else:
            # a long row's lanes take the sums of chunks, not every element: one long chain of adds
            # per lane lost 7x more than ATen's cascade sum over rows of 32000 floats
            parts = {name: lane.replace("lanes_", "part_", 1) for name, lane in lanes.items()}
            body += [f"for (int64_t kiln_chunk = 0; kiln_chunk < kiln_full; kiln_chunk += {chunk}) {{"]
            body += [f"alignas(64) {types[name]} {part}[{lanes_n}] = {{}};" for name, part in parts.items()]
            body.append(f"const int64_t kiln_chunk_end = kiln_chunk + {chunk} < kiln_full ? kiln_chunk + {chunk} : kiln_full;")
            body += [f"for (int64_t kiln_block = kiln_chunk; kiln_block < kiln_chunk_end; kiln_block += {lanes_n}) {{"]
            body += loop("kiln_block", str(lanes_n), parts) + ["}"]
            for name, part in parts.items():
                body += ["#pragma omp simd", f"for (int kiln_lane = 0; kiln_lane < {lanes_n}; kiln_lane++) "
                         f"{lanes[name]}[kiln_lane] += {part}[kiln_lane];"]
            body.append("}")
        if full is None or full != size:
            body += loop("kiln_full", f"{cexpr(size)} - kiln_full", lanes)
        half = lanes_n // 2
        while half >= 1:
            for lane in lanes.values():
                body += ["#pragma omp simd", f"for (int kiln_lane = 0; kiln_lane < {half}; kiln_lane++) "
                         f"{lane}[kiln_lane] += {lane}[kiln_lane + {half}];"]
            half //= 2
        body += [f"{accs[name]} = {types[name]}({lane}[0]);" for name, lane in lanes.items()]
        return body + ["}"]

    def _chunked_sum_loops(self, blk: Block, k: Kernel, ys: Sequence[sympy.Symbol], locals_: dict, shared: dict,
                           reds: Sequence[Reduction], accs: dict[str, str], pragma: str | None,
                           span: Span | None) -> list[str]:
        """A loop whose reductions are all float sums (not in lanes: a whole-tensor sum, one over
        several inner dims), as a two-level sum: chunks of about SUM_CHUNK elements, each summed into
        float lanes (_lane_blocks), the lanes added into a double. One accumulator per vector lane
        over the whole range lost 1.3e-4 relative over 1e5 copies of 0.1 (ATen's cascade sum: 8e-8);
        a lane's chain is SUM_CHUNK / _sum_lanes adds. A chunk is a run of the last dim, or, where the
        trailing dims hold SUM_CHUNK elements or fewer, all of them under a run of the dim before.
        With `pragma` the leading dims and the chunks are shared among threads."""
        lanes_n = self._sum_lanes(blk)
        # a lane adds SUM_CHUNK / lanes_n elements of a chunk: a short innermost dim (the channels of
        # a channels-last tensor) fills as many lanes as it is long, so its chunks are shorter
        last = k.inner[-1]
        limit = SUM_CHUNK * min(max(int(last), 1), lanes_n) // lanes_n if span is None and last.is_number else SUM_CHUNK
        cut = len(ys)
        while span is None and cut > 0 and sympy.Mul(*k.inner[cut - 1:]).is_number and \
                int(sympy.Mul(*k.inner[cut - 1:])) <= limit:
            cut -= 1
        d = cut - 1  # the chunked dim (the caller made sure that the whole is over SUM_CHUNK)
        size = max(limit // int(sympy.Mul(*k.inner[cut:])), 1)
        start, stop = span if span is not None else (sympy.Integer(0), k.inner[d])
        lo, hi = cexpr(start), cexpr(stop)
        outer = {n.name: f"outer_{n.name}" for n in reds}
        parts = {n.name: f"part_{n.name}" for n in reds}
        types = {n.name: CTYPE[compute(n.layout.dtype)] for n in reds}
        body = [f"{types[n.name]} {accs[n.name]};" for n in reds] + ["{"]
        body += [f"double {name} = 0;" for name in outer.values()]
        if pragma is not None:
            collapse = f" collapse({d + 1})" if d > 0 else ""
            clauses = " ".join(f"reduction(+:{name})" for name in outer.values())
            body.append(pragma.replace("@collapse", collapse).replace("@reduction", clauses))
        o, c = _loops(ys[:d], k.inner[:d], None)
        o += [f"for (int64_t kiln_chunk = {lo}; kiln_chunk < {hi}; kiln_chunk += {size}) {{",
              f"const int64_t kiln_chunk_end = kiln_chunk + {size} < {hi} ? kiln_chunk + {size} : {hi};"]
        c = ["}"] + c
        body += o + [f"alignas(64) {types[name]} {part}[{lanes_n}] = {{}};" for name, part in parts.items()]
        if cut == len(ys):
            body += self._lane_blocks(blk, k, ys[d], "kiln_chunk", "kiln_chunk_end", lanes_n, locals_, shared, parts)
        else:
            # the chunk's rows of the trailing dims, their innermost (the stride-1 one) in lane blocks
            inner_o, inner_c = _loops(ys[cut:-1], k.inner[cut:-1], None)
            body += [f"for (int64_t {ys[d]} = kiln_chunk; {ys[d]} < kiln_chunk_end; {ys[d]}++) {{"] + inner_o
            body += self._lane_blocks(blk, k, ys[-1], "0", cexpr(k.inner[-1]), lanes_n, locals_, shared, parts)
            body += inner_c + ["}"]
        for name, part in parts.items():
            body.append(f"for (int kiln_lane = 0; kiln_lane < {lanes_n}; kiln_lane++) {outer[name]} += {part}[kiln_lane];")
        body += c + [f"{accs[name]} = {types[name]}({outer[name]});" for name in outer]
        return body + ["}"]

    def _lane_blocks(self, blk: Block, k: Kernel, y: sympy.Symbol, start: str, stop: str, lanes_n: int,
                     locals_: dict, shared: dict, parts: dict[str, str]) -> list[str]:
        """y over [start, stop) adding the sums into `parts`' lanes: blocks of lanes_n elements, each
        into its own lane, then the remainder into the first lanes. The lanes do not depend on the
        compiler: a chunk's `omp simd reduction(+)` over a stride-1 dim GCC left as one chain of
        scalar adds (in order, as a float reduction it may not reorder), and a strided dim (a
        transposed input's) does not vectorize at all: 1024 dependent float adds, 9.5e-6 relative
        over copies of 0.1 (lanes of 32: 3e-8), and one add's latency per element."""
        body = ["{", f"const int64_t kiln_blocks_end = {start} + ({stop} - {start}) / {lanes_n} * {lanes_n};"]

        def loop(head: list[str]) -> list[str]:
            loop_locals = dict(locals_)
            loop_shared = {key: dict(values) for key, values in shared.items()}  # the hoisted values
            lines = list(head)
            for n in blk.nodes:
                acc = f"{parts[n.name]}[kiln_lane]" if n.name in parts else None
                lines += self._node(n, k, loop_locals, acc, loop_shared)
            return lines + ["}"]

        body += [f"for (int64_t kiln_block = {start}; kiln_block < kiln_blocks_end; kiln_block += {lanes_n}) {{"]
        body += loop(["#pragma omp simd", f"for (int64_t kiln_lane = 0; kiln_lane < {lanes_n}; kiln_lane++) {{",
                      f"const int64_t {y} = kiln_block + kiln_lane;"]) + ["}"]
        body += loop([f"for (int64_t {y} = kiln_blocks_end; {y} < {stop}; {y}++) {{",
                      f"const int64_t kiln_lane = {y} - kiln_blocks_end;"])
        return body + ["}"]

    def _sum_lanes(self, blk: Block) -> int:
        """Lanes of a block's sums: SUM_REGISTERS 512-bit registers of the narrowest type its loop
        loads or stores (of floats, if all are wider)."""
        names = {n.name for n in blk.nodes} | {v.buffer for n in blk.nodes for v in walk(n.body) if isinstance(v, Load)}
        narrowest = min((_itemsize(self.storage[name]) for name in names if name in self.storage), default=4)
        return max(SUM_LANES, 64 // narrowest) * SUM_REGISTERS


def _lane_sums(reds: Sequence[Reduction], k: Kernel) -> bool:
    """Whether a loop block of a row kernel adds its floating-point sums in lanes (_lane_sum_loops):
    only sums (a max's lanes would be combined after every block), over one inner dim at least
    SUM_LANES long, in a kernel whose rows are its outer loop (not one loop shared among threads)."""
    if not reds or not k.outer or len(k.inner) != 1 or k.columns:
        return False
    if not all(n.reduction_type == "sum" and compute(n.layout.dtype) in (torch.float32, torch.float64) for n in reds):
        return False
    size = k.inner[0]
    return not size.is_number or int(size) >= SUM_LANES


def _short_row_lanes(reds: Sequence[Reduction], k: Kernel) -> bool:
    """Whether a loop block of a row kernel adds its floating-point sums into lanes of its innermost
    dim (_short_row_lane_loops): only sums, over several inner dims, the innermost of a known size
    below SUM_LANES (from 2), in a kernel whose rows are its outer loop."""
    if not reds or not k.outer or len(k.inner) < 2 or k.columns:
        return False
    if not all(n.reduction_type == "sum" and compute(n.layout.dtype) in (torch.float32, torch.float64) for n in reds):
        return False
    size = k.inner[-1]
    return bool(size.is_number) and 2 <= int(size) < SUM_LANES
