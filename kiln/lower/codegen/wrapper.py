"""Wrapper codegen: the Python function that runs a KernelProgram on real tensors.

It reads size symbols off the inputs, re-lays out an input whose strides differ from the ones the
kernels were built for, allocates each buffer or hands it the storage of a dead one (the memory plan,
kiln.lower.codegen.memory), calls kernels through cached ctypes function pointers and externs through
their ATen overloads in order, frees what dies early (`del`), and returns the outputs. The source is plain Python, printed by KILN_LOGS=output_code. The function follows the
runtime's artifact protocol with a kiln.runtime.kernel_wrapper.WrapperRecipe (source, globals by
name, kernel library), so the persistent frame cache can rebuild it in another process without
this package (lower imports the runtime's types; the runtime never imports lower). Corresponds to
torch/_inductor/codegen/wrapper.py (the Python wrapper).
"""
from __future__ import annotations

import cmath

import collections
import ctypes
import dataclasses
import math
import weakref
from typing import Any, Callable

import sympy
import torch
from torch.utils import _pytree as pytree

from kiln.lower.checks import ERROR_RECORD, error_function_source, sites_of, zero_division_text
from kiln.lower.codegen.memory import (Allocation, MemoryFacts, MemoryPlan, in_place_donors, input_writes,
                                       plan_memory)
from kiln.lower.ir import (BufferRef, ConstantBuffer, Extern, InputBuffer, Layout, Load, Pointwise, SymExpr,
                           contiguous_strides, index_vars, walk)
from kiln.lower.schedule import ExternCall, Kernel, KernelProgram, ScatterKernel
from kiln.runtime.kernel_wrapper import (bind_overloads, bind_threads, checked_result, positional,
                                         relayout as _relayout, tag, with_output_spec, wrapper_recipe)
from kiln.symbolic.expr import adopt_torch_functions, is_float_symbol
from kiln.symbolic.render import render_python


def pyexpr(e: Any) -> str:
    """A size expression as Python over the symbol variables of the wrapper (kiln.symbolic's printer)."""
    return render_python(adopt_torch_functions(sympy.sympify(e)))  # a meta kernel's sizes may hold torch's Max


def _tuple(xs: Any) -> str:
    items = [pyexpr(x) for x in xs]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _ints(xs: Any) -> tuple[int, ...] | None:
    if not all(sympy.sympify(x).is_Integer for x in xs):
        return None
    return tuple(int(x) for x in xs)


def _cheap_view(name: str, base: Layout, target: Layout) -> str | None:
    """A method call on `name` (laid out as `base`) that gives exactly `target`'s sizes, strides and
    start, or None. Each candidate is checked on a meta tensor, so the choice is exact by
    construction, not by reasoning about size-1 strides or expand rules."""
    if base.offset != 0 or target.offset != 0:
        return None
    b_sizes, b_strides = _ints(base.sizes), _ints(base.strides)
    t_sizes, t_strides = _ints(target.sizes), _ints(target.strides)
    if b_sizes is None or b_strides is None or t_sizes is None or t_strides is None:
        return None
    candidates: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = []
    if len(b_sizes) == 2 and len(t_sizes) == 2:
        candidates.append(("t()", lambda x: x.t()))
    if len(b_sizes) == len(t_sizes) > 0:
        pairs = list(zip(b_sizes, b_strides))
        perm: list[int] = []
        for pair in zip(t_sizes, t_strides):
            k = next((k for k, p in enumerate(pairs) if p == pair and k not in perm), None)
            if k is None:
                break
            perm.append(k)
        else:
            candidates.append((f"permute({', '.join(map(str, perm))})", lambda x: x.permute(perm)))
    shape = ", ".join(map(str, t_sizes)) if t_sizes else "()"
    candidates.append((f"view({shape})", lambda x: x.view(t_sizes)))
    candidates.append((f"expand({shape})", lambda x: x.expand(t_sizes)))
    probe = torch.empty_strided(b_sizes, b_strides, device="meta")
    for text, make in candidates:
        try:
            got = make(probe)
        except RuntimeError:
            continue
        if tuple(got.shape) == t_sizes and got.stride() == t_strides and got.storage_offset() == 0:
            return f"{name}.{text}"
    return None


def _dtype(d: torch.dtype) -> str:
    return str(d).replace("torch.", "torch_")


# Matmul externs whose ATen op has an out= overload: the wrapper allocates the result (or hands it a
# dead buffer's storage, as the memory plan decides) and the op writes into it, as Inductor's
# `extern_kernels.mm(a, b, out=buf)`. A fresh result per call would be one more allocation per
# matmul, at the top of the heap, which glibc hands back to the kernel and faults in again.
_OUT_OVERLOADS: dict[Any, Any] = {
    torch.ops.aten.mm.default: torch.ops.aten.mm.out,
    torch.ops.aten.addmm.default: torch.ops.aten.addmm.out,
    torch.ops.aten.bmm.default: torch.ops.aten.bmm.out,
    torch.ops.aten.baddbmm.default: torch.ops.aten.baddbmm.out,
}


class WrapperWriter:
    extern_outs = True  # whether matmul externs write into planned buffers (`out_overload`)

    def __init__(self, program: KernelProgram, signatures: dict[str, tuple[list[str], list[str], bool]],
                 profile: bool = False) -> None:
        self.program = program
        self.profile = profile  # time each kernel and count the bytes of its buffers (for benchmarks)
        self.signatures = signatures
        self.lines: list[str] = []
        self.layouts: dict[str, Layout] = {}
        self.globals: dict[str, Any] = {"torch": torch, "math": math, "_relayout": _relayout,
                                        "_checked_result": checked_result}
        self.plan = MemoryPlan()
        self.input_writes: dict[str, str] = {}  # output buffer -> the input whose storage it is computed in

    def ref(self, r: BufferRef) -> str:
        """An expression for a strided view of a buffer (the buffer itself when the layout matches).

        A view that a cheaper method (`t`, `permute`, `view`, `expand`) makes with exactly the wanted
        sizes and strides uses it: as_strided parses more arguments and costs about 1.5x per call,
        which small graphs pay on every weight transpose."""
        base = self.layouts.get(r.name)
        if base is not None and base == r.layout:
            return r.name
        if base is not None:
            cheap = _cheap_view(r.name, base, r.layout)
            if cheap is not None:
                return cheap
        if r.layout.offset == 0:  # as_strided keeps the tensor's own storage offset when given none
            return f"{r.name}.as_strided({_tuple(r.layout.sizes)}, {_tuple(r.layout.strides)})"
        return (f"{r.name}.as_strided({_tuple(r.layout.sizes)}, {_tuple(r.layout.strides)}, "
                f"{r.name}.storage_offset() + {pyexpr(r.layout.offset)})")

    def arg(self, a: Any) -> str:
        if isinstance(a, BufferRef):
            return self.ref(a)
        if isinstance(a, SymExpr):
            return pyexpr(a.expr)
        if isinstance(a, (list, tuple)):
            inner = ", ".join(self.arg(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
        if isinstance(a, torch.dtype):
            name = _dtype(a)
            self.globals[name] = a
            return name
        return self.literal(a)

    def literal(self, a: Any) -> str:
        """A constant as wrapper text: its repr where that reads back as the same value (ints,
        finite floats, strings, None), else a name bound to the value (`-inf` and `nan` print as
        names no wrapper defines; devices, layouts, memory formats have no literal at all)."""
        plain = a is None or isinstance(a, (bool, int, str)) or (
            isinstance(a, (float, complex)) and cmath.isfinite(a))
        if plain:
            return repr(a)
        name = f"const_{len(self.globals)}"
        self.globals[name] = a
        return name

    def write(self) -> str:
        ir = self.program.ir
        inputs = sorted((b for b in ir.buffers if isinstance(b, InputBuffer)), key=lambda b: b.position)
        # every argument the caller passes, also trailing plain ints that only a guard needed
        nargs = max([b.position + 1 for b in inputs] + [p + 1 for p, _ in ir.symbols.values()] + [ir.input_count])
        params = [f"arg{k}" for k in range(nargs)]
        L = self.lines
        checked = any(ERROR_RECORD in bufs for bufs, _, _ in self.signatures.values())
        if checked:  # kernels that check indices or divisors report through one record per call
            L += ["import ctypes as _ctypes", "_ErrorRecord = _ctypes.c_int64 * 3", ""]
            L += error_function_source(sites_of(self._bodies())) + ["", ""]
        # The wrapper takes its arguments as one list that it empties (kernel_wrapper.positional
        # puts the usual call(*args) in front): a caller that hands over its only references, as the
        # backward does with the saved activations, has each one freed once its last kernel ran.
        L.append("def call(args):")
        if self.signatures:  # torch.set_num_threads between calls reaches the kernels (runtime.kernel_wrapper)
            L.append("    if _torch_threads() != _threads_applied[0]: _follow_threads()")
        if params:
            L.append(f"    {', '.join(params)}, = args")
            L.append("    args.clear()")
        if checked:
            L.append(f"    {ERROR_RECORD} = _ErrorRecord()")
        self.bound = {str(sym) for sym in ir.symbols}
        for sym, (pos, dim) in ir.symbols.items():
            if dim is None:
                L.append(f"    {sym} = arg{pos}")
            elif dim >= 0:
                L.append(f"    {sym} = arg{pos}.size({dim})")
            else:
                L.append(f"    {sym} = arg{pos}.stride({-1 - dim})")
        for sym, expr in ir.derived:  # solved from an input size that is an expression in it
            L.append(f"    {sym} = {pyexpr(expr)}")
            self.bound.add(sym)
        for divisor, kind in ir.divisors:  # the graph's own `a // b` raised here (LoopIR.divisors)
            L.append(f"    if {pyexpr(divisor)} == 0: raise ZeroDivisionError({zero_division_text(kind)!r})")
        for b in inputs:
            self.layouts[b.name] = b.layout
            if all(s.is_number for s in b.layout.strides) and b.layout.sizes:
                expected = _tuple(b.layout.strides)
                L.append(f"    if {b.name}.stride() != {expected}: {b.name} = _relayout({b.name}, {expected})")
        for buf in ir.buffers:
            if isinstance(buf, ConstantBuffer):
                self.globals[buf.name] = buf.tensor
                self.layouts[buf.name] = buf.layout
        if ir.seed_needed:
            L.append("    seed = int(torch.randint(-2 ** 62, 2 ** 62, ()).item())")
        self.emit_steps(lambda dead: L.append(f"    del {', '.join(dead)}"))
        outs = [self.ref(o) if isinstance(o, BufferRef) else pyexpr(o.expr) if isinstance(o, SymExpr) else self.literal(o)
                for o in ir.outputs]
        L.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        return "\n".join(L) + "\n"

    def emit_steps(self, free: Callable[[list[str]], None]) -> None:
        """Plan the buffers, then write each step's call followed by `free(names)` of the buffers
        that die after it (never outputs, constants or buffers the plan keeps for a later step)."""
        ir = self.program.ir
        last_use = self._last_uses()
        outputs = {o.name for o in ir.outputs if isinstance(o, BufferRef)}
        self.facts = self._shared_facts(last_use, outputs)
        self.input_writes = self._unchecked_after(input_writes(self.facts, ir))
        self.plan = plan_memory(dataclasses.replace(self.facts, allocations=tuple(
            a for a in self.facts.allocations if a.name not in self.input_writes)))
        written = set(self.input_writes.values())  # an input read for the last time before its new value is computed in it
        inputs = {b.name for b in ir.buffers if isinstance(b, InputBuffer)}
        self.clean = True  # no step so far wrote into an input's storage (see ExternMismatchError)
        for s, step in enumerate(self.program.steps):
            self.step_index = s
            if isinstance(step, (Kernel, ScatterKernel)):
                self._kernel(step)
            else:
                self._extern(step)
            self.clean = self.clean and not self._writes_inputs(step, inputs)
            dead = sorted(n for n, last in last_use.items() if last == s and n not in outputs
                          and n in self.layouts and not n.startswith("const_") and n not in self.plan.kept
                          and n not in written and self.frees(n))
            if dead:
                free(dead)

    def _shared_facts(self, last_use: dict[str, int], outputs: set[str]) -> MemoryFacts:
        """`memory_facts`, computed once per program and signatures for every writer that takes them
        from this class unchanged (the Python wrapper, the native wrapper, the plan): the in-place
        analysis is most of a large graph's wrapper writing time."""
        same = (type(self).memory_facts is WrapperWriter.memory_facts and self.extern_outs
                and type(self).kernel_buffers is WrapperWriter.kernel_buffers
                and type(self).out_overload is WrapperWriter.out_overload)
        if not same:
            return self.memory_facts(last_use, outputs)
        key = id(self.program)
        found = _FACTS.get(key)
        if found is not None and found[0]() is self.program and found[1] == self.signatures \
                and found[2] == sorted(self.layouts):
            _FACTS.move_to_end(key)
            return found[3]
        facts = self.memory_facts(last_use, outputs)
        _FACTS[key] = (weakref.ref(self.program), dict(self.signatures), sorted(self.layouts), facts)
        while len(_FACTS) > 32:
            _FACTS.popitem(last=False)
        return facts

    def _writes_inputs(self, step: Kernel | ScatterKernel | ExternCall, inputs: set[str]) -> bool:
        """Whether `step` may write into the storage of a graph input: a kernel computing an
        input's new value in place, a scatter into one, or an extern whose schema mutates an
        argument (any: counted as a write, to be safe)."""
        if isinstance(step, Kernel):
            return any(n.name in self.input_writes for n in step.nodes)
        if isinstance(step, ScatterKernel):
            return step.node.target in inputs or step.node.target in self.input_writes
        op = step.node.op
        if not isinstance(op, torch._ops.OpOverload):
            return True
        return any(step.node.name in self.input_writes or r[0] in self.input_writes for r in step.node.results) \
            or any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)

    def result_check(self, name: str, layout: Layout, op: Any, path: tuple) -> tuple[str, bool] | None:
        """The condition under which extern result `name` is not what the graph was compiled for:
        a dtype or sizes other than its fake tensor's (an error: ExternMismatchError), or other
        strides (a relayout); and whether it compares the sizes. None for a result nothing reads
        (it may be missing, see read_later), or for one the kernel may leave undefined that is only
        returned (_UNDEFINED_RESULTS). The sizes of a result ATen's CPU kernel may leave empty
        (_UNSIZED_EXTRA_RESULTS) are not compared."""
        if not self.read_later(name):
            return None
        if path and path[0] in _UNDEFINED_RESULTS.get(op, ()) and self.facts.last_use.get(name, -1) <= self.step_index:
            return None  # only returned: None where the kernel left it undefined, as eager returns
        clauses = [f"{name}.dtype is not {self.arg(layout.dtype)}"]
        sized = not (path and op in _UNSIZED_EXTRA_RESULTS)
        if sized:
            clauses.append(f"{name}.shape != {_tuple(layout.sizes)}")
        if layout.sizes:
            clauses.append(f"{name}.stride() != {_tuple(layout.strides)}")
        return " or ".join(clauses), sized

    def frees(self, name: str) -> bool:
        """Whether the wrapper holds `name` in a variable it can drop (every buffer, here)."""
        return True

    def read_later(self, name: str) -> bool:
        """Whether an extern's result `name` is read after its own step, returned, or hands its
        storage to a later buffer. One that is none of these may be missing at run time where its
        metadata has it: the oneDNN RNN returns no workspace with grad mode off (an inference
        graph), and nothing would read one; its strides are not checked then."""
        return (name in self.facts.outputs or self.facts.last_use.get(name, -1) > self.step_index
                or name in self.plan.reuse.values())

    def kernel_buffers(self, step: Kernel) -> list[str]:
        """The buffers a kernel takes, in its argument order (what the wrapper allocates for it)."""
        return self.signatures[step.name][0]

    def memory_facts(self, last_use: dict[str, int], outputs: set[str]) -> MemoryFacts:
        """What the memory plan needs: the buffers this wrapper allocates (in the order `_kernel`
        allocates them), the extern results, last uses, outputs, and the names an extern's result
        may share storage with (its schema says the result aliases an argument)."""
        defined = set(self.layouts)
        allocations: list[Allocation] = []
        produced: list[tuple[str, int, int | None]] = []
        results: list[Allocation] = []
        aliases: list[frozenset[str]] = []
        for s, step in enumerate(self.program.steps):
            if isinstance(step, Kernel):
                bufs = self.kernel_buffers(step)
                for block in step.blocks:
                    for n in block.nodes:
                        if n.name in bufs and n.name not in defined:
                            defined.add(n.name)
                            inplace = in_place_donors(step, block.kind, n)
                            allocations.append(Allocation(n.name, s, n.layout.dtype, n.layout.storage_size(), inplace))
            elif isinstance(step, ExternCall) and self.out_overload(step) is not None:
                name, layout, _ = step.node.results[0]
                defined.add(name)
                allocations.append(Allocation(name, s, layout.dtype, layout.storage_size()))
            elif isinstance(step, ExternCall):
                node = step.node
                leaves = pytree.tree_leaves((node.args, node.kwargs))
                # a fresh tensor: no alias in the schema, and no device argument (the graph is on the CPU)
                fresh = not _may_alias(node.op) and not any(isinstance(a, torch.device) for a in leaves)
                for name, layout, path in node.results:
                    defined.add(name)
                    size = sympy.sympify(layout.storage_size())
                    nbytes = int(size) * layout.dtype.itemsize if size.is_Integer else None
                    produced.append((name, s, nbytes))
                    if fresh and layout.offset == 0 and not (path and node.op in _UNSIZED_EXTRA_RESULTS):
                        results.append(Allocation(name, s, layout.dtype, size))
                if _may_alias(node.op):
                    args = [a.name for a in leaves if isinstance(a, BufferRef)]
                    aliases.append(frozenset(args + [node.name] + [r[0] for r in node.results]))
        return MemoryFacts(tuple(allocations), tuple(produced), dict(last_use), frozenset(outputs), tuple(aliases),
                           len(self.program.steps), tuple(results))

    def _alloc(self, name: str, layout: Layout) -> None:
        target = self.input_writes.get(name)
        if target is not None:
            self.layouts[name] = layout
            self.lines.append(f"    {name} = {target}  # the new value of {target}, computed in its storage")
            return
        donor = self.plan.reuse.get(name)
        if donor is not None:
            # the donor is dead (memory.plan_memory), or read by this kernel only where it writes
            # (in place: its `del` follows the kernel); its storage is at least as large
            same = self.layouts[donor] == layout
            view = donor if same else f"{donor}.as_strided({_tuple(layout.sizes)}, {_tuple(layout.strides)})"
            self.layouts[name] = layout
            if donor in self.plan.kept:
                self.lines.append(f"    {name} = {view}; del {donor}  # reuse")
            else:
                self.lines.append(f"    {name} = {view}  # reuse in place")
            return
        self.layouts[name] = layout
        self.lines.append(f"    {name} = torch.empty_strided({_tuple(layout.sizes)}, {_tuple(layout.strides)}, "
                          f"dtype={self.arg(layout.dtype)})")

    def _kernel(self, step: Kernel | ScatterKernel) -> None:
        bufs, syms, seed = self.signatures[step.name]
        nodes = step.nodes if isinstance(step, Kernel) else ()
        for n in nodes:
            if n.name in bufs and n.name not in self.layouts:
                self._alloc(n.name, n.layout)
        call = [b if b == ERROR_RECORD else f"{b}.data_ptr()" for b in bufs] + list(syms) + (["seed"] if seed else [])
        origins = ", ".join(dict.fromkeys(step.origins() if isinstance(step, Kernel) else step.node.origins))
        if self.profile:
            self.lines.append("    _t = _clock()")
        self.lines.append(f"    {step.name}({', '.join(call)})  # {origins}")
        if self.profile:
            nbytes = " + ".join(f"{b}.numel() * {b}.element_size()" for b in bufs if b != ERROR_RECORD) or "0"
            self.lines.append(f"    _record({step.name!r}, _clock() - _t, {nbytes})")
        if ERROR_RECORD in bufs:  # the exception eager raises, once the kernel's threads are done
            self.lines.append(f"    if {ERROR_RECORD}[0]: raise _kernel_error({ERROR_RECORD})")
        self.globals.setdefault("_argtypes", {})[step.name] = (
            [ctypes.c_void_p] * len(bufs) + [ctypes.c_double if is_float_symbol(s) else ctypes.c_int64 for s in syms]
            + [ctypes.c_int64] * (1 if seed else 0))

    def out_overload(self, step: ExternCall) -> Any:
        """The out= overload a matmul extern writes its result through (None: it returns a fresh
        tensor): one result, which the graph wants dense and row-major, as the op makes it."""
        n = step.node
        out = _OUT_OVERLOADS.get(n.op) if self.extern_outs else None
        if out is None or len(n.results) != 1 or n.results[0][2]:
            return None
        layout = n.results[0][1]
        if layout.offset != 0 or tuple(layout.strides) != contiguous_strides(layout.sizes):
            return None
        return out

    def _extern(self, step: ExternCall) -> None:
        n = step.node
        out = self.out_overload(step)
        if out is not None:
            name, layout, _ = n.results[0]
            self._alloc(name, layout)
            opname = f"extern_{str(out).replace('.', '_')}"
            self.globals[opname] = out
            args = [self.arg(a) for a in n.args] + [f"{k}={self.arg(v)}" for k, v in n.kwargs] + [f"out={name}"]
            self.lines.append(f"    {opname}({', '.join(args)})  # {', '.join(n.origins)}")
            return
        opname = f"extern_{str(n.op).replace('.', '_')}"
        self.globals[opname] = n.op
        args = [self.arg(a) for a in n.args] + [f"{k}={self.arg(v)}" for k, v in n.kwargs]
        self.lines.append(f"    {n.name} = {opname}({', '.join(args)})  # {', '.join(n.origins)}")
        for name, layout, path in n.results:
            if path:
                self.lines.append(f"    {name} = {n.name}{''.join(f'[{p}]' for p in path)}")
            self.layouts[name] = layout
            for d, size in enumerate(layout.sizes):
                if getattr(size, "is_Symbol", False) and str(size) not in self.bound:
                    # an unbacked size (nonzero's count) is known once the op has run
                    self.lines.append(f"    {size} = {name}.size({d})")
                    self.bound.add(str(size))
            check = self.result_check(name, layout, n.op, path)
            if check is not None:
                sizes = _tuple(layout.sizes) if check[1] else "None"
                self.lines.append(f"    if {check[0]}: {name} = _checked_result({name}, {self.arg(layout.dtype)}, "
                                  f"{sizes}, {_tuple(layout.strides)}, {str(n.op)!r}, {self.clean})")

    def _unchecked_after(self, writes: dict[str, str]) -> dict[str, str]:
        """The input writes whose kernel no checking step follows or contains: eager raises an
        index or zero-division error before it stores, so a new value computed in an input's own
        storage by (or before) a kernel that then fails would leave the caller's tensor half
        overwritten. Those values go to a buffer of their own and reach the input only through
        the copy after a call that returned."""
        last_checked = max((s for s, step in enumerate(self.program.steps)
                            if sites_of(self._step_bodies(step))), default=-1)
        steps = {a.name: a.step for a in self.facts.allocations}
        return {out: source for out, source in writes.items() if steps.get(out, -1) > last_checked}

    def _step_bodies(self, step: Any) -> list[Any]:
        if isinstance(step, Kernel):
            return [n.body for n in step.nodes]
        if isinstance(step, ScatterKernel):
            return [v for v in (step.node.body, step.node.extra, step.node.mask) if v is not None]
        return []

    def _bodies(self) -> list[Any]:
        return [body for step in self.program.steps for body in self._step_bodies(step)]

    def _last_uses(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for s, step in enumerate(self.program.steps):
            names: list[str] = []
            if isinstance(step, Kernel):
                names = [v.buffer for n in step.nodes for v in walk(n.body) if isinstance(v, Load)]
                names += [n.name for n in step.nodes]
            elif isinstance(step, ScatterKernel):
                names = [v.buffer for v in walk(step.node.body) if isinstance(v, Load)] + [step.node.target]
                for part in (step.node.extra, step.node.mask):  # the scattered-to position reads buffers too
                    if part is not None:
                        names += [v.buffer for v in walk(part) if isinstance(v, Load)]
            else:
                names = [a.name for a in pytree.tree_leaves((step.node.args, step.node.kwargs))
                         if isinstance(a, BufferRef)] + [step.node.name] + [r[0] for r in step.node.results]
            for name in names:
                last[name] = s
        return last


# id(program) -> (a weak reference to it, its signatures, the names laid out before the steps, facts)
_FACTS: collections.OrderedDict[int, tuple[Any, dict, list[str], MemoryFacts]] = collections.OrderedDict()


# ops whose results after the first may be smaller than their metadata says: ATen's CPU BatchNorm
# returns empty statistics in inference, where the meta kernel returns one value per channel, and the
# oneDNN RNN layer no workspace at all with grad mode off; such a result must not donate its storage
# to a buffer of the meta's size
_UNSIZED_EXTRA_RESULTS = frozenset({torch.ops.aten._native_batch_norm_legit.default,
                                    torch.ops.aten._native_batch_norm_legit_no_training.default,
                                    torch.ops.aten.native_batch_norm.default,
                                    torch.ops.aten.mkldnn_rnn_layer.default,
                                    torch.ops.aten._native_multi_head_attention.default})
# results ATen's CPU kernel may leave undefined (None in Python) where the meta kernel returns an empty
# tensor: the attention weights of MultiheadAttention's fast path with need_weights=False
_UNDEFINED_RESULTS = {torch.ops.aten._native_multi_head_attention.default: frozenset({1})}


def _may_alias(op: Any) -> bool:
    """Whether an extern's result may share storage with its arguments: its schema marks a return
    as an alias (a view, or the mutated argument itself), or it is not an ATen overload at all."""
    if not isinstance(op, torch._ops.OpOverload):
        return True
    return any(r.alias_info is not None for r in op._schema.returns)


def make_wrapper(program: KernelProgram, signatures: dict[str, tuple[list[str], list[str], bool]],
                 lib: ctypes.CDLL | None, *, record: Callable[[str, float, int], None] | None = None
                 ) -> tuple[Callable[..., tuple], str]:
    """The wrapper function bound to the library's kernels, and its source; with `record`, a
    profiling variant that calls record(kernel name, seconds, bytes of its buffers) per kernel."""
    w = WrapperWriter(program, signatures, profile=record is not None)
    source = w.write()
    return bind_wrapper(w, source, lib, record=record), source


def bind_wrapper(w: WrapperWriter, source: str, lib: ctypes.CDLL | None, *,
                 record: Callable[[str, float, int], None] | None = None) -> Callable[..., tuple]:
    """The wrapper `w` wrote (`source`, from w.write(), which needs no library: it can be written
    while the kernels compile) bound to the library's kernels."""
    program = w.program
    env = dict(w.globals)
    if record is not None:
        import time
        env["_clock"] = time.perf_counter
        env["_record"] = record
    argtypes_by_kernel = env.pop("_argtypes", {})
    code = compile(source, "<kiln wrapper>", "exec")
    recipe = None
    if record is None:  # what kiln.capture.persist stores to rebuild this function in another process
        recipe = wrapper_recipe(source, env, argtypes_by_kernel, lib, program.ir.output_spec)
    bind_overloads(env)
    for name, argtypes in argtypes_by_kernel.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = None
        env[name] = fn
    if argtypes_by_kernel:
        assert lib is not None  # a program with kernels was built into a library
        bind_threads(env, lib)
    exec(code, env)
    # nested outputs (a list of splits): rebuild the structure the graph returns
    call = with_output_spec(positional(env["call"]), program.ir.output_spec)
    tag(call, recipe)
    return call
