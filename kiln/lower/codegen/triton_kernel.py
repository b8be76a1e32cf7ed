"""Triton kernels: each scheduled Kernel as one @triton.jit function around the bodies of codegen/triton.py.

A pointwise kernel is flat: each program takes XBLOCK consecutive elements of its whole range
(the tail masked). A kernel with reductions (or values per outer point) tiles [XBLOCK, RBLOCK]:
XBLOCK outer points per program, the inner range either in one tile ("persistent", when a row
fits: every value stays in registers from one block to the next) or in a loop of RBLOCK chunks
with per-lane accumulators ("looped"), chosen from the sizes. Scans loop along their dim carrying a
running value; scatters store (serially) or add atomically. `generate` makes the module of a
KernelProgram and its launch table. Corresponds to torch/_inductor/codegen/triton.py's kernels.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import sympy
import torch

from kiln.lower.codegen.triton import PRELUDE, TL, TritonBodyWriter, compute, index_in_range, texpr, to_storage
from kiln.lower.ir import Buffer, Const, Pointwise, Reduction, Scan, Scatter, Value, index_vars
from kiln.lower.schedule import Kernel, KernelProgram, ScatterKernel, kernel_vars, node_substitution

PERSISTENT_MAX = 1024  # inner sizes up to this run as one tile per row (a static size only)
LOOP_RBLOCK = 256  # chunk of a looped reduction or scan
TILE_ELEMENTS = 2048  # XBLOCK * RBLOCK of a reduction tile
FLAT_XBLOCK = 1024  # elements per program of a pointwise kernel
BIG_INDEX = 2 ** 62  # "no index yet" in arg reductions

ACC_INIT = {"sum": "0", "prod": "1", "any": "0", "all": "1"}


@dataclass(frozen=True)
class Launch:
    """How the wrapper calls one kernel: its arguments in order and its grid.

    `xnumel` is the flat outer range (programs = ceil(xnumel / XBLOCK), or one program for a
    `serial` kernel); `index_check`: the kernel takes an int32 flag it sets when an index was out of
    range, which the wrapper turns into eager's error; `error_sites`: it takes the int64[3] error
    record of the C++ path's checks (site, value, bound) too."""

    name: str
    buffers: tuple[str, ...]
    symbols: tuple[str, ...]
    seed: bool
    xnumel: sympy.Expr
    xblock: int
    rblock: int | None
    serial: bool
    index_check: bool
    origins: tuple[str, ...]
    error_sites: tuple[int, ...] = ()  # kiln.lower.checks sites it records failures of in `kiln_err`
    kind: str = "flat"  # flat, persistent, looped, scan, serial or atomic (what autotuning may change)


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _decompose(flat: str, vars_: Sequence[sympy.Symbol], sizes: Sequence[sympy.Expr]) -> list[str]:
    """Lines giving each variable of a row-major range from its flat index."""
    lines, stride = [], sympy.Integer(1)
    strides = []
    for s in reversed(sizes):
        strides.append(stride)
        stride = stride * s
    strides.reverse()
    for k, (v, size, st) in enumerate(zip(vars_, sizes, strides)):
        if size == 1:
            lines.append(f"{v} = 0")
            continue
        text = flat if st == 1 else f"({flat} // {texpr(st)})"
        lines.append(f"{v} = {text}" if k == 0 else f"{v} = {text} % {texpr(size)}")
    return lines


def _rtype(n: Reduction) -> str:
    if n.layout.dtype == torch.bool and n.reduction_type in ("max", "min"):
        return "any" if n.reduction_type == "max" else "all"
    return n.reduction_type


class TritonKernelWriter:
    """Renders one Kernel or ScatterKernel as a Triton function; records what it reads and writes."""

    def __init__(self, storage: dict[str, torch.dtype], extents: dict[str, sympy.Expr],
                 size_symbols: set[str]) -> None:
        self.storage = storage
        self.size_symbols = size_symbols
        self.extents = {name: texpr(e) for name, e in extents.items()}
        self.wide_index = any(not e.is_number or int(e) >= 2 ** 31 for e in extents.values())
        self.counter = [0]
        self.reads: list[str] = []
        self.writes: list[str] = []
        self.checks: list[str] = []
        self.error_sites: set[int] = set()
        self.lines: list[str] = []

    # ------------------------------------------------------------------ pieces

    def _note(self, names: list[str], name: str) -> None:
        if name not in names:
            names.append(name)

    def _writer(self, sub: dict, locals_: dict, mask: str, zeros: str) -> TritonBodyWriter:
        return TritonBodyWriter(self.storage, sub, locals_, self.counter, mask, zeros, self.extents, self.checks,
                                self.error_sites)

    def _emit(self, lines: list[str], depth: int) -> None:
        self.lines += ["    " * depth + line for line in lines]

    def _value(self, n: Pointwise | Reduction | Scan | Scatter, w: TritonBodyWriter,
               hidden: frozenset[str]) -> str:
        from kiln.lower.ir import Load, walk
        for v in walk(n.body):
            if isinstance(v, Load) and v.buffer not in hidden:
                self._note(self.reads, v.buffer)
        value = w.value(n.body)
        if isinstance(n.body, Const):  # a literal still needs a tile to be stored or reduced
            value = w.tmp(f"tl.full([], {value}, {TL[compute(n.body.dtype)]})", n.body.dtype)
        return value

    def _flag_lines(self, zeros: str, start: int) -> list[str]:
        """A store of 1 into the index flag for each lane whose index was out of range."""
        return [f"tl.store(index_error + {zeros}, 1, {c})" for c in self.checks[start:]]

    def _store(self, w: TritonBodyWriter, n: Buffer, value: str, mask: str, zeros: str) -> list[str]:
        self._note(self.writes, n.name)
        index = n.layout.index(index_vars("i", len(n.layout.sizes)))
        value = to_storage(value, self.storage[n.name])
        return [f"tl.store({n.name} + ({w.index(index)} + {zeros}), {value}, {mask})"]

    # ------------------------------------------------------------------ kernels

    def kernel(self, k: Kernel) -> tuple[str, Launch]:
        if k.blocks and k.blocks[0].kind == "scan":
            return self.scan_kernel(k)
        if not any(isinstance(n, Reduction) for n in k.nodes) and all(b.kind == "loop" for b in k.blocks):
            return self.flat_kernel(k)
        return self.row_kernel(k)

    def flat_kernel(self, k: Kernel) -> tuple[str, Launch]:
        """Pointwise work only: one flat range over outer+inner, XBLOCK elements per program."""
        xs, ys = kernel_vars(len(k.outer), len(k.inner))
        total = sympy.Mul(*k.outer, *k.inner)
        xblock = min(FLAT_XBLOCK, _pow2(int(total))) if total.is_number else FLAT_XBLOCK
        head = [f"xnumel = {texpr(total)}",
                f"xindex = {self._offset(total)} + tl.arange(0, XBLOCK)",
                "xmask = xindex < xnumel",
                "zeros = tl.zeros([XBLOCK], tl.int32)"]
        head += _decompose("xindex", xs + ys, tuple(k.outer) + tuple(k.inner))
        self._emit(head, 1)
        locals_: dict = {}
        for n in k.nodes:
            self._pointwise(n, k, locals_, "xmask", "zeros", 1)
        return self._finish(k.name, k.origins(), total, xblock, None, False, "flat")

    def _offset(self, total: sympy.Expr) -> str:
        # past 2**31 elements (or an unknown count), in the range or in any tensor of the program
        # (an address into a large input), index arithmetic needs 64 bits
        if total.is_number and int(total) < 2 ** 31 and not self.wide_index:
            return "tl.program_id(0) * XBLOCK"
        return "tl.program_id(0).to(tl.int64) * XBLOCK"

    def _rbase(self) -> str:
        return "tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if self.wide_index else "")

    def _pointwise(self, n: Buffer, k: Kernel, locals_: dict, mask: str, zeros: str, depth: int,
                   hidden: frozenset[str] | None = None) -> None:
        assert isinstance(n, Pointwise)  # a kernel's nodes besides its reductions (schedule.place)
        sub = node_substitution(n, k.outer, k.inner)
        assert sub is not None
        w = self._writer(sub, locals_, mask, zeros)
        start = len(self.checks)
        value = self._value(n, w, k.local | k.scratch if hidden is None else hidden)
        lines = [f"# {n.name} <- {', '.join(n.origins)}"] + w.lines + self._flag_lines(zeros, start)
        key = sympy.expand(n.layout.index(index_vars("i", len(n.ranges))).xreplace(sub))
        locals_[(n.name, key)] = value  # later nodes read the register, not memory
        if hidden is None:
            hidden = k.local | k.scratch
        if n.name not in hidden:
            lines += self._store(w, n, value, mask, zeros)
        self._emit(lines, depth)

    def row_kernel(self, k: Kernel) -> tuple[str, Launch]:
        """Reductions (and values per outer point): [XBLOCK, RBLOCK] tiles."""
        xs, ys = kernel_vars(len(k.outer), len(k.inner))
        xnumel, rnumel = sympy.Mul(*k.outer), sympy.Mul(*k.inner)
        persistent = rnumel.is_number and int(rnumel) <= PERSISTENT_MAX
        rblock = _pow2(int(rnumel)) if persistent else LOOP_RBLOCK
        xblock = max(1, TILE_ELEMENTS // rblock)
        if xnumel.is_number:
            xblock = min(xblock, _pow2(int(xnumel)))
        head = [f"xnumel = {texpr(xnumel)}", f"rnumel = {texpr(rnumel)}",
                f"xindex = {self._offset(xnumel * rnumel)} + tl.arange(0, XBLOCK)[:, None]",
                "xmask = xindex < xnumel",
                "zeros_x = tl.zeros([XBLOCK, 1], tl.int32)",
                "zeros_xr = tl.zeros([XBLOCK, RBLOCK], tl.int32)"]
        head += _decompose("xindex", xs, k.outer)
        rhead = [f"rindex = {self._rbase()}", "rmask = rindex < rnumel"] + _decompose("rindex", ys, k.inner)
        if persistent:
            head += rhead
        self._emit(head, 1)
        locals_: dict = {}
        # a row kept in registers needs no memory; a looped kernel stores it for its later loops
        hidden = k.local | (k.scratch if persistent else frozenset())
        stored_here: set[str] = set()
        for blk in k.blocks:
            if blk.kind == "scalar":
                for n in blk.nodes:
                    self._pointwise(n, k, locals_, "xmask", "zeros_x", 1, hidden)
                    stored_here.add(n.name)
                continue
            reads = {v.buffer for n in blk.nodes for v in _loads(_block_node(n).body)}
            if reads & stored_here and not persistent:
                # stored by other threads of this program: wait until their stores are visible
                self._emit(["tl.debug_barrier()"], 1)
            self._loop_block(k, blk.nodes, locals_, persistent, rhead, hidden)
            stored_here |= {n.name for n in blk.nodes}
        return self._finish(k.name, k.origins(), xnumel, xblock, rblock, False,
                            "persistent" if persistent else "looped")

    def _loop_block(self, k: Kernel, nodes: Sequence[Buffer], locals_: dict, persistent: bool,
                    rhead: list[str], hidden: frozenset[str]) -> None:
        reds = [n for n in nodes if isinstance(n, Reduction)]
        depth = 1 if persistent else 2
        if not persistent:
            init = []
            for r in reds:
                init += self._acc_init(r)
            self._emit(init + ["for roffset in range(0, rnumel, RBLOCK):"], 1)
            self._emit([f"rindex = roffset + {self._rbase()}", "rmask = rindex < rnumel"]
                       + rhead[2:], 2)
        inner = locals_ if persistent else dict(locals_)  # a loop's values live only inside it
        for n in nodes:
            if not isinstance(n, Reduction):
                self._pointwise(n, k, inner, "xmask & rmask", "zeros_xr", depth, hidden)
                continue
            sub = node_substitution(n, k.outer, k.inner)
            assert sub is not None  # a reduction's ranges are its kernel's
            w = self._writer(sub, inner, "xmask & rmask", "zeros_xr")
            start = len(self.checks)
            value = self._value(n, w, hidden)
            lines = [f"# {n.name} <- {', '.join(n.origins)}"] + w.lines + self._flag_lines("zeros_xr", start)
            lines += self._accumulate(n, value, persistent)
            self._emit(lines, depth)
        for n in reds:
            result = self._final(n)
            self._emit(result, 1)
            sub = node_substitution(n, k.outer, k.inner)
            assert sub is not None
            key = sympy.expand(n.layout.index(index_vars("i", len(n.ranges))).xreplace(sub))
            locals_[(n.name, key)] = f"red_{n.name}"
            if n.name not in k.local:
                w = self._writer(sub, locals_, "xmask", "zeros_x")
                self._emit(self._store(w, n, f"red_{n.name}", "xmask", "zeros_x"), 1)

    def _acc_type(self, n: Reduction) -> str:
        rt = _rtype(n)
        if rt in ("any", "all"):
            return "tl.int8"
        if rt in ("argmax", "argmin"):
            return TL[compute(n.body.dtype)] if n.body.dtype != torch.bool else "tl.int8"
        return TL[compute(n.layout.dtype)]

    def _identity(self, n: Reduction) -> str:
        """The value a masked-off lane contributes."""
        rt, T = _rtype(n), self._acc_type(n)
        if rt in ACC_INIT:
            return ACC_INIT[rt]
        floating = T in ("tl.float32", "tl.float64")
        if rt in ("max", "argmax"):
            return "float('-inf')" if floating else f"{_int_limit(T, low=True)}"
        return "float('inf')" if floating else f"{_int_limit(T, low=False)}"

    def _acc_init(self, n: Reduction) -> list[str]:
        lines = [f"acc_{n.name} = tl.full([XBLOCK, RBLOCK], {self._identity(n)}, {self._acc_type(n)})"]
        if _rtype(n) in ("argmax", "argmin"):
            lines.append(f"idx_{n.name} = tl.full([XBLOCK, RBLOCK], {BIG_INDEX}, tl.int64)")
        return lines

    def _accumulate(self, n: Reduction, value: str, persistent: bool) -> list[str]:
        rt, T, acc = _rtype(n), self._acc_type(n), f"acc_{n.name}"
        v = f"({value} != 0).to(tl.int8)" if rt in ("any", "all") else f"{value}.to({T})"
        masked = f"tl.where(xmask & rmask, {v}, {self._identity(n)})"
        if rt in ("argmax", "argmin"):
            idx = f"idx_{n.name}"
            if persistent:
                return [f"{acc} = {masked}", f"{idx} = tl.where(xmask & rmask, rindex.to(tl.int64), {BIG_INDEX})"]
            better = ">" if rt == "argmax" else "<"
            floating = T in ("tl.float32", "tl.float64")
            # strictly better, or the first NaN (then sticky): each lane keeps its first best index
            cond = (f"(({acc} == {acc}) & ((new {better} {acc}) | (new != new)))" if floating
                    else f"(new {better} {acc})")
            return [f"new = {v}",
                    f"take = xmask & rmask & (({idx} == {BIG_INDEX}) | {cond})",
                    f"{acc} = tl.where(take, new, {acc})",
                    f"{idx} = tl.where(take, rindex.to(tl.int64), {idx})"]
        if persistent:
            return [f"{acc} = {masked}"]
        combine = {"sum": f"{acc} + masked", "prod": f"{acc} * masked", "any": f"tl.maximum({acc}, masked)",
                   "all": f"tl.minimum({acc}, masked)"}
        if rt in ("max", "min"):
            better = ">" if rt == "max" else "<"
            if T in ("tl.float32", "tl.float64"):  # NaN propagates: once a lane holds NaN it keeps it
                return [f"masked = {masked}", f"{acc} = tl.where((masked {better} {acc}) | (masked != masked), masked, {acc})"]
            return [f"masked = {masked}", f"{acc} = tl.where(masked {better} {acc}, masked, {acc})"]
        return [f"masked = {masked}", f"{acc} = {combine[rt]}"]

    def _final(self, n: Reduction) -> list[str]:
        """Lines reducing the accumulator tile across lanes into red_<name>, [XBLOCK, 1]."""
        rt, T, acc, out = _rtype(n), self._acc_type(n), f"acc_{n.name}", f"red_{n.name}"
        floating = T in ("tl.float32", "tl.float64")
        if rt == "sum":
            return [f"{out} = tl.sum({acc}, 1, keep_dims=True)"]
        if rt == "prod":
            return [f"{out} = tl.reduce({acc}, 1, kiln_prod, keep_dims=True)"]
        if rt in ("any", "all"):
            fn = "tl.max" if rt == "any" else "tl.min"
            return [f"{out} = {fn}({acc}, 1, keep_dims=True) != 0"]
        if rt in ("max", "min"):
            fn = "tl.max" if rt == "max" else "tl.min"
            if not floating:
                return [f"{out} = {fn}({acc}, 1, keep_dims=True)"]
            return [f"nan_{n.name} = tl.max(({acc} != {acc}).to(tl.int8), 1, keep_dims=True)",
                    f"{out} = {fn}(tl.where({acc} != {acc}, {self._identity(n)}, {acc}), 1, keep_dims=True)",
                    f"{out} = tl.where(nan_{n.name} != 0, float('nan'), {out})"]
        # argmax / argmin: the best value over the lanes that saw one, then the least index holding it
        fn = "tl.max" if rt == "argmax" else "tl.min"
        idx = f"idx_{n.name}"
        lines = [f"valid = {idx} != {BIG_INDEX}"]
        if floating:
            lines += [f"isnan = valid & ({acc} != {acc})",
                      "anynan = tl.max(isnan.to(tl.int8), 1, keep_dims=True) != 0",
                      f"best = {fn}(tl.where(valid & ~isnan, {acc}, {self._identity(n)}), 1, keep_dims=True)",
                      f"hit = valid & tl.where(anynan, isnan, {acc} == best)"]
        else:
            lines += [f"best = {fn}(tl.where(valid, {acc}, {self._identity(n)}), 1, keep_dims=True)",
                      f"hit = valid & ({acc} == best)"]
        lines += [f"{out} = tl.min(tl.where(hit, {idx}, {BIG_INDEX}), 1, keep_dims=True)",
                  f"{out} = tl.where({out} == {BIG_INDEX}, 0, {out})"]
        return lines

    def scan_kernel(self, k: Kernel) -> tuple[str, Launch]:
        """A cumulative sum or product: XBLOCK rows per program, a loop along the scanned dim in
        chunks, each chunk's prefix combined with the running value of the chunks before it."""
        n = k.blocks[0].nodes[0]
        assert isinstance(n, Scan)
        xs, ys = kernel_vars(len(k.outer), 1)
        own = index_vars("i", len(n.ranges))
        rest = iter(xs)
        sub = {v: ys[0] if d == n.dim else next(rest) for d, v in enumerate(own)}
        xnumel, rnumel = sympy.Mul(*k.outer), k.inner[0]
        rblock = min(LOOP_RBLOCK, _pow2(int(rnumel))) if rnumel.is_number else LOOP_RBLOCK
        xblock = max(1, TILE_ELEMENTS // rblock)
        if xnumel.is_number:
            xblock = min(xblock, _pow2(int(xnumel)))
        A = TL[n.acc_dtype]
        one = "1" if n.scan_type == "prod" else "0"
        head = [f"xnumel = {texpr(xnumel)}", f"rnumel = {texpr(rnumel)}",
                f"xindex = {self._offset(xnumel * rnumel)} + tl.arange(0, XBLOCK)[:, None]",
                "xmask = xindex < xnumel",
                "zeros_xr = tl.zeros([XBLOCK, RBLOCK], tl.int32)"]
        head += _decompose("xindex", xs, k.outer)
        head += [f"carry = tl.full([XBLOCK, 1], {one}, {A})", "for roffset in range(0, rnumel, RBLOCK):"]
        self._emit(head, 1)
        w = self._writer(sub, {}, "xmask & rmask", "zeros_xr")
        start = len(self.checks)
        value = self._value(n, w, frozenset())
        body = [f"rindex = roffset + {self._rbase()}", "rmask = rindex < rnumel", f"{ys[0]} = rindex",
                f"# {n.name} <- {', '.join(n.origins)}"] + w.lines + self._flag_lines("zeros_xr", start)
        body.append(f"chunk = tl.where(xmask & rmask, {value}.to({A}), {one})")
        if n.scan_type == "sum":
            body += ["running = tl.cumsum(chunk, 1) + carry", "carry = carry + tl.sum(chunk, 1, keep_dims=True)"]
        else:
            body += ["running = tl.cumprod(chunk, 1) * carry",
                     "carry = carry * tl.reduce(chunk, 1, kiln_prod, keep_dims=True)"]
        w2 = self._writer(sub, {}, "xmask & rmask", "zeros_xr")
        body += self._store(w2, n, "running", "xmask & rmask", "zeros_xr")
        self._emit(body, 2)
        return self._finish(k.name, k.origins(), xnumel, xblock, rblock, False, "scan")

    def scatter(self, k: ScatterKernel) -> tuple[str, Launch]:
        """Stores run in one program, chunk after chunk, so a later write to the same place wins as
        in ATen's serial loop; accumulating scatters run in parallel with atomic adds."""
        n = k.node
        own = index_vars("i", len(n.ranges))
        total = sympy.Mul(*n.ranges)
        xblock = min(FLAT_XBLOCK, _pow2(int(total))) if total.is_number else FLAT_XBLOCK
        serial = n.mode != "add"
        head = [f"xnumel = {texpr(total)}", "zeros = tl.zeros([XBLOCK], tl.int32)"]
        if serial:
            head.append("for xoffset in range(0, xnumel, XBLOCK):")
            first = ["xindex = xoffset + tl.arange(0, XBLOCK)"]
        else:
            first = [f"xindex = {self._offset(total)} + tl.arange(0, XBLOCK)"]
        self._emit(head, 1)
        w = self._writer({}, {}, "xmask", "zeros")
        start = len(self.checks)
        value = self._value(n, w, frozenset())
        address = f"{w.index(n.index)} + zeros"
        mask = "xmask"
        if n.extra is not None:
            for v in _loads(n.extra):
                self._note(self.reads, v.buffer)
            address = w.tmp(f"{address} + {w.value(n.extra)}", torch.int64)
            ok = w.tmp(index_in_range(w, n.extra, address, self.extents[n.target]), torch.bool)
            self.checks.append(f"xmask & ~{ok}")
            mask = f"xmask & {ok}"
        body = first + ["xmask = xindex < xnumel"] + _decompose("xindex", own, n.ranges)
        body += [f"# {n.name} <- {', '.join(n.origins)}"] + w.lines + self._flag_lines("zeros", start)
        self._note(self.writes, n.target)
        if n.mode == "add" and self.storage[n.target] == torch.bfloat16:
            body += _bf16_add(n.target, address, value, mask)
        else:
            fn = "tl.atomic_add" if n.mode == "add" else "tl.store"
            body.append(f"{fn}({n.target} + ({address}), {to_storage(value, self.storage[n.target])}, {mask})")
        self._emit(body, 2 if serial else 1)
        return self._finish(k.name, list(n.origins), total, xblock, None, serial, "serial" if serial else "atomic")

    def _finish(self, name: str, origins: Sequence[str], xnumel: sympy.Expr, xblock: int,
                rblock: int | None, serial: bool, kind: str) -> tuple[str, Launch]:
        reads = [b for b in self.reads if b not in self.writes]
        text = "\n".join(self.lines)
        symbols = tuple(sorted(set(re.findall(r"\b([a-z]+\d+)\b", text)) & self.size_symbols))
        seed = bool(re.search(r"\bseed\b", text))
        params = reads + self.writes + list(symbols) + (["seed"] if seed else [])
        params += ["index_error"] if self.checks else []
        params += ["kiln_err"] if self.error_sites else []
        params += ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if rblock is not None else [])
        fused = ", ".join(dict.fromkeys(origins))
        source = (f"@triton.jit\ndef {name}({', '.join(params)}):\n    # {name}: fused from {fused}\n{text}\n")
        launch = Launch(name, tuple(reads + self.writes), symbols, seed, sympy.sympify(xnumel), xblock, rblock,
                        serial, bool(self.checks), tuple(dict.fromkeys(origins)), tuple(sorted(self.error_sites)), kind)
        return source, launch


def _int_limit(T: str, *, low: bool) -> int:
    bits = {"tl.int64": 64, "tl.int32": 32, "tl.int16": 16, "tl.int8": 8, "tl.uint8": 8, "tl.int1": 1}[T]
    if T == "tl.uint8":
        return 0 if low else 255
    if T == "tl.int1":
        return 0 if low else 1
    return -(2 ** (bits - 1)) if low else 2 ** (bits - 1) - 1


def _bf16_add(target: str, address: str, value: str, mask: str) -> list[str]:
    """Lines adding `value` into a bfloat16 buffer at `address` in each lane of `mask`: a
    compare-and-swap of the 16-bit word until every lane's sum landed (the addend and each sum
    rounded to bfloat16, as ATen's loops add). Triton's atomic_add on bfloat16 is not everywhere,
    and its interpreter adds the words as integers. Lanes off the mask point at element 0 and swap
    0 for 0 there, a no-op: atomic_cas takes no mask; the loop runs only while a lane is pending,
    so an empty target is never touched."""
    return [f"addend = kiln_to_bf16({value}).to(tl.float32)",
            f"pending = {mask}",
            f"word = ({target} + tl.where(pending, {address}, 0)).to(tl.pointer_type(tl.int16), bitcast=True)",
            "while tl.max(pending.to(tl.int32), 0) > 0:",
            "    old = tl.load(word, pending, other=0)",
            "    total = old.to(tl.bfloat16, bitcast=True).to(tl.float32) + addend",
            "    seen = tl.atomic_cas(word, old, tl.where(pending, kiln_to_bf16(total).to(tl.int16, bitcast=True), old))",
            "    pending = pending & (seen != old)"]


def _block_node(n: Buffer) -> Pointwise | Reduction:
    """`n` as what a loop or scalar block holds: schedule.place admits only these there."""
    assert isinstance(n, (Pointwise, Reduction))
    return n


def _loads(body: Value) -> list:
    from kiln.lower.ir import Load, walk
    return [v for v in walk(body) if isinstance(v, Load)]


def generate(program: KernelProgram) -> tuple[str, dict[str, Launch]]:
    """The module source of every kernel of the program, and each kernel's launch record."""
    storage: dict[str, torch.dtype] = {}
    extents: dict[str, sympy.Expr] = {}
    for b in program.ir.buffers:
        storage[b.name] = b.layout.dtype
        extents[b.name] = b.layout.storage_size()
        for name, lay, _ in getattr(b, "results", ()):
            storage[name] = lay.dtype
            extents[name] = lay.storage_size()
    parts, launches = [PRELUDE], {}
    for step in program.steps:
        if isinstance(step, (Kernel, ScatterKernel)):
            w = TritonKernelWriter(storage, extents, program.ir.size_symbols())
            source, launch = w.kernel(step) if isinstance(step, Kernel) else w.scatter(step)
            parts.append(source)
            launches[step.name] = launch
    return "\n\n".join(parts), launches
