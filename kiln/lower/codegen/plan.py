"""Plan codegen: a graph's native wrapper as data for the boundary extension's plan runner.

The native wrapper (native_wrapper.py) prints one C++ function per graph, which costs a compile of
seconds over ATen's headers before a graph can run natively. This writer makes the same decisions
(it is a NativeWrapperWriter: the same memory plan, relayouts, views, kernel order, externs, frees,
outputs and checks) but writes them as a `kiln.runtime.native.Plan`: a stream of int64 words that the
boundary extension (kiln/runtime/boundary.cpp, namespace kiln_plan; built once per torch and Python)
interprets. Sizes are small integer programs in reverse Polish over the graph's size symbols, with
kiln_floordiv / kiln_mod semantics; kernels are called through their `kiln_plan_<name>` entries
(cpp_kernel.plan_entries); every extern goes through the dispatcher boxed, its operator found once
when the plan is bound. What a plan cannot express (a float symbol inside an expression, an argument
kind it does not spell) raises Unsupported: that graph keeps the compiled native wrapper's path.
Corresponds to nothing in Inductor (its C++ wrapper is always compiled per graph).
"""
from __future__ import annotations

import ctypes
import re
import time
from array import array
from dataclasses import dataclass
from typing import Any, Callable

import sympy
import torch

from kiln import compile_time, log
from kiln.lower.checks import ERROR_RECORD, describe_site, sites_of
from kiln.lower.codegen import native_wrapper
from kiln.lower.codegen.cpp_kernel import generate
from kiln.lower.codegen.native_wrapper import _SCALAR_TYPES, NativeWrapperWriter, Unsupported
from kiln.lower.ir import BufferRef, ConstantBuffer, InputBuffer, Layout, SymExpr
from kiln.lower.schedule import ExternCall, Kernel, KernelProgram, ScatterKernel, check_stored_program
from kiln.runtime import build, native, records
from kiln.runtime.folded_weights import MEMO_TENSOR_INPUTS
from kiln.runtime.plan import WrapperPlan
from kiln.symbolic.expr import FloorDiv, ModularIndexing, is_float_symbol, is_truth_value
from kiln.symbolic.floats import is_float_valued

# the opcodes, expression tokens, value and kernel-argument kinds of boundary.cpp's kiln_plan namespace
(NARGS, ARG_TENSOR, ARG_INT, ARG_FLOAT, SYM_INT, SYM_SIZE, SYM_STRIDE, SYM_FLOAT, SET, TAKE, RELAYOUT, CONST, SEED,
 ALLOC, ALIAS, VIEW, RESET, KERNEL, EXTERN, BIND_SIZE, OUT, CHECK_STRIDES, CHECK_RESULT, FOLD, FOLD_DONE) = range(1, 26)
(T_CONST, T_REG, T_ADD, T_MUL, T_FLOORDIV, T_MOD, T_NEG, T_MIN, T_MAX, T_ABS, T_DIV, T_REM, T_EQ, T_NE, T_LT, T_LE,
 T_GT, T_GE, T_AND, T_OR, T_NOT, T_SELECT) = range(22)
(V_NONE, V_INT, V_DOUBLE, V_FREG, V_BOOL, V_TENSOR, V_INT_LIST, V_DOUBLE_LIST, V_BOOL_LIST, V_TENSOR_LIST,
 V_OPT_TENSOR_LIST, V_DEVICE, V_STRING, V_DTYPE, V_LAYOUT, V_MEMORY_FORMAT, V_OPT_SCALAR_LIST) = range(17)
A_PTR, A_INT, A_FREG, A_ERROR = range(4)

_RELATIONS = {sympy.Eq: T_EQ, sympy.Ne: T_NE, sympy.Lt: T_LT, sympy.Le: T_LE, sympy.Gt: T_GT, sympy.Ge: T_GE}
_MEMORY_FORMATS = {torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2,
                   torch.channels_last_3d: 3}
_INT64 = (-2 ** 63, 2 ** 63 - 1)


class PlanWriter(NativeWrapperWriter):
    """The plan of a graph's wrapper: `write()` fills `words` and the tables; `packed()` packs them."""

    def __init__(self, program: KernelProgram, signatures: dict[str, tuple[list[str], list[str], bool]],
                 argtypes: dict[str, list[Any]]) -> None:
        super().__init__(program, signatures, argtypes)
        self.words: list[int] = []
        self.memos = 0  # FOLD instructions written
        self.slots: dict[str, int] = {}
        self.regs: dict[str, int] = {}
        self.fregs: dict[str, int] = {}
        self.doubles: list[float] = []
        self.strings: list[str] = []
        self.ops: list[tuple[str, str]] = []
        self.dtypes: list[torch.dtype] = []
        self.sites: list[tuple[int, int, list[str]]] = []

    # -- tables ------------------------------------------------------------------------------------

    def _slot(self, name: str) -> int:
        return self.slots.setdefault(name, len(self.slots))

    def _reg(self, name: str) -> int:
        return self.regs.setdefault(name, len(self.regs))

    def _freg(self, name: str) -> int:
        return self.fregs.setdefault(name, len(self.fregs))

    def _double(self, v: float) -> int:
        self.doubles.append(float(v))
        return len(self.doubles) - 1

    def _string(self, s: str) -> int:
        self.strings.append(s)
        return len(self.strings) - 1

    def _dtype(self, d: torch.dtype) -> int:
        if d not in _SCALAR_TYPES:
            raise Unsupported(f"the dtype {d}")
        if d not in self.dtypes:
            self.dtypes.append(d)
        return self.dtypes.index(d)

    def _op(self, op: Any) -> int:
        schema = op._schema
        key = (schema.name, schema.overload_name)
        if key not in self.ops:
            self.ops.append(key)
        return self.ops.index(key)

    # -- expressions -------------------------------------------------------------------------------

    def expr(self, e: Any) -> list[int]:
        """An integer expression: [token count, tokens...] (reverse Polish)."""
        tokens: list[list[int]] = []
        self._tokens(sympy.sympify(e), tokens)
        return [len(tokens)] + [w for t in tokens for w in t]

    def exprs(self, xs: Any) -> list[int]:
        out = [len(xs)]
        for x in xs:
            out += self.expr(x)
        return out

    def _const(self, v: int, out: list[list[int]]) -> None:
        if not _INT64[0] <= v <= _INT64[1]:
            raise Unsupported(f"the int {v}")
        out.append([T_CONST, v])

    def _fold(self, args: Any, token: int, out: list[list[int]]) -> None:
        for k, a in enumerate(args):
            self._tokens(a, out)
            if k:
                out.append([token])

    def _tokens(self, e: Any, out: list[list[int]]) -> None:
        if e is sympy.true or e is sympy.false:
            return self._const(int(e is sympy.true), out)
        if e.is_Symbol:
            name = str(e)
            if name not in self.regs or is_float_symbol(name):
                raise Unsupported(f"the symbol {name} in an expression")
            out.append([T_REG, self.regs[name]])
            return None
        if e.is_Integer:
            return self._const(int(e), out)
        if isinstance(e, sympy.core.relational.Relational) and type(e) in _RELATIONS:
            self._fold(e.args, _RELATIONS[type(e)], out)
            return None
        if isinstance(e, sympy.Add):
            return self._fold(e.args, T_ADD, out)
        if isinstance(e, sympy.Mul):
            coeff, rest = e.as_coeff_Mul()
            if not coeff.is_Rational:
                raise Unsupported(f"the expression {e}")
            num: list[Any] = [sympy.Integer(coeff.p)] if coeff.p != 1 else []
            den: list[Any] = [sympy.Integer(coeff.q)] if coeff.q != 1 else []
            for factor in sympy.Mul.make_args(rest):
                if isinstance(factor, sympy.Pow) and factor.args[1].is_Number and factor.args[1] < 0:
                    den.append(sympy.Pow(factor.args[0], -factor.args[1]))
                else:
                    num.append(factor)
            self._fold(num or [sympy.Integer(1)], T_MUL, out)
            for d in den:  # C's truncating division, as render_c spells an integer quotient
                self._tokens(d, out)
                out.append([T_DIV])
            return None
        if isinstance(e, sympy.Pow):
            base, exp = e.args
            if not (exp.is_Integer and exp > 0):
                raise Unsupported(f"the power {e}")
            return self._fold([base] * int(exp), T_MUL, out)
        if isinstance(e, FloorDiv):
            return self._fold(e.args, T_FLOORDIV, out)
        if isinstance(e, (sympy.Mod, ModularIndexing)):
            return self._fold(e.args, T_MOD, out)
        if isinstance(e, (sympy.Min, sympy.Max)):
            return self._fold(e.args, T_MIN if isinstance(e, sympy.Min) else T_MAX, out)
        if isinstance(e, sympy.Abs):
            self._tokens(e.args[0], out)
            out.append([T_ABS])
            return None
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            n, d = sympy.fraction(sympy.together(e.args[0]))
            if d == 1 or not (n.is_integer and d.is_integer):
                raise Unsupported(f"the rounding {e}")
            if isinstance(e, sympy.floor):
                return self._fold([n, d], T_FLOORDIV, out)
            self._fold([-n, d], T_FLOORDIV, out)
            out.append([T_NEG])
            return None
        if isinstance(e, sympy.Piecewise) and len(e.args) == 2:
            (then, cond), (other, _) = e.args
            for part in (cond, then, other):
                self._tokens(part, out)
            out.append([T_SELECT])
            return None
        if isinstance(e, sympy.Not):
            self._tokens(e.args[0], out)
            out.append([T_NOT])
            return None
        if isinstance(e, (sympy.And, sympy.Or)):
            return self._fold(e.args, T_AND if isinstance(e, sympy.And) else T_OR, out)
        raise Unsupported(f"the expression {e}")

    def _float(self, e: Any) -> list[int]:
        """A float argument's value: only the symbol itself (a plan has no float arithmetic)."""
        e = sympy.sympify(e)
        if e.is_Symbol and str(e) in self.fregs:
            return [V_FREG, self.fregs[str(e)]]
        raise Unsupported(f"the float expression {e}")

    # -- values ------------------------------------------------------------------------------------

    def tensor(self, r: BufferRef) -> list[int]:
        """A tensor reference: [slot, 0], or a view of it [slot, 1, sizes, strides] ([slot, 2, ..., offset])."""
        if r.name not in self.slots:
            raise Unsupported(f"the buffer {r.name} before it is made")
        slot = self.slots[r.name]
        base = self.layouts.get(r.name)
        if base is not None and base == r.layout:
            return [slot, 0]
        shape = self.exprs(r.layout.sizes) + self.exprs(r.layout.strides)
        if r.layout.offset == 0:
            return [slot, 1] + shape
        return [slot, 2] + shape + self.expr(r.layout.offset)

    def _scalar_value(self, v: Any) -> list[int]:
        if isinstance(v, SymExpr) and is_truth_value(sympy.sympify(v.expr)):
            # a comparison of sizes the graph returns: a plan's expressions are int64 words, and the
            # caller must get True/False, not 1/0
            raise Unsupported(f"the symbolic bool {v.expr}")
        if isinstance(v, SymExpr):
            e = sympy.sympify(v.expr)
            floating = is_float_valued(e) or any(is_float_symbol(str(s)) for s in e.free_symbols)
            return self._float(e) if floating else [V_INT] + self.expr(e)
        if isinstance(v, bool):
            return [V_BOOL, int(v)]
        if isinstance(v, int):
            return [V_INT] + self.expr(v)
        if isinstance(v, float):
            return [V_DOUBLE, self._double(v)]
        raise Unsupported(f"the value {v!r}")

    def _value(self, kind: str, v: Any) -> Any:  # type: ignore[override]  # words, where the base class returns C++
        if kind.endswith("?"):
            return [V_NONE] if v is None else self._value(kind[:-1], v)
        if kind == "Tensor":
            if not isinstance(v, BufferRef):
                raise Unsupported(f"a Tensor argument given {type(v).__name__}")
            return [V_TENSOR] + self.tensor(v)
        if kind in ("int", "SymInt"):
            if isinstance(v, bool) or not isinstance(v, (int, SymExpr)):
                raise Unsupported(f"an int argument given {v!r}")
            return [V_INT] + self.expr(v.expr if isinstance(v, SymExpr) else v)
        if kind == "float":
            if isinstance(v, SymExpr):
                return self._float(v.expr)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return [V_DOUBLE, self._double(v)]
            raise Unsupported(f"a float argument given {v!r}")
        if kind == "bool":
            if not isinstance(v, bool):
                raise Unsupported(f"a bool argument given {v!r}")
            return [V_BOOL, int(v)]
        if kind == "Scalar":
            return self._scalar_value(v)
        if kind == "ScalarType":
            return [V_DTYPE, self._dtype(v)] if isinstance(v, torch.dtype) else self._no(f"the dtype {v}")
        if kind == "Layout":
            return [V_LAYOUT, 0] if v == torch.strided else self._no(f"the layout {v}")
        if kind == "MemoryFormat":
            return [V_MEMORY_FORMAT, _MEMORY_FORMATS[v]] if v in _MEMORY_FORMATS else self._no(f"{v}")
        if kind == "Device":
            return [V_DEVICE, self._string(str(v))] if isinstance(v, torch.device) else self._no(f"the device {v!r}")
        if kind == "str":
            return [V_STRING, self._string(v)] if isinstance(v, str) else self._no(f"the string {v!r}")
        if kind.endswith("]"):
            base = kind[:-1].split("[")[0]
            items = list(v) if isinstance(v, (list, tuple)) else [v] if isinstance(v, (int, SymExpr)) else None
            if items is None:
                raise Unsupported(f"a list argument given {v!r}")
            if base in ("int", "SymInt"):
                return [V_INT_LIST, len(items)] + [w for x in items for w in self._value("int", x)[1:]]
            if base == "float":
                floats = [float(x) for x in items if isinstance(x, (int, float)) and not isinstance(x, bool)]
                if len(floats) != len(items):
                    raise Unsupported(f"a float list given {v!r}")
                return [V_DOUBLE_LIST, len(items)] + [self._double(x) for x in floats]
            if base == "bool":
                return [V_BOOL_LIST, len(items)] + [self._value("bool", x)[1] for x in items]
            if base == "Tensor":
                return [V_TENSOR_LIST, len(items)] + [w for x in items for w in self._value("Tensor", x)[1:]]
            if base == "Scalar?":  # oneDNN's pointwise ops: the activation's parameters
                return [V_OPT_SCALAR_LIST, len(items)] + [w for x in items for w in self._value("Scalar?", x)]
            if base == "Tensor?":
                return [V_OPT_TENSOR_LIST, len(items)] + [
                    w for x in items for w in ([0] if x is None else [1] + self._value("Tensor", x)[1:])]
        raise Unsupported(f"an argument of type {kind}")

    # -- statements --------------------------------------------------------------------------------

    def write(self) -> str:
        ir = self.program.ir
        W = self.words
        inputs = sorted((b for b in ir.buffers if isinstance(b, InputBuffer)), key=lambda b: b.position)
        nargs = max([b.position + 1 for b in inputs] + [p + 1 for p, _ in ir.symbols.values()] + [ir.input_count])
        W += [NARGS, nargs]
        tensor_positions = {b.position for b in inputs} | {p for p, d in ir.symbols.values() if d is not None}
        float_positions = {p for sym, (p, d) in ir.symbols.items() if d is None and is_float_symbol(str(sym))}
        int_positions = {p for p, d in ir.symbols.values() if d is None} - float_positions
        if tensor_positions & (int_positions | float_positions) or int_positions & float_positions:
            raise Unsupported("an argument read both as a tensor and as a number")
        for positions, op in ((tensor_positions, ARG_TENSOR), (int_positions, ARG_INT), (float_positions, ARG_FLOAT)):
            for p in sorted(positions):
                W += [op, p]
        self.bound = {str(sym) for sym in ir.symbols}
        for sym, (pos, dim) in ir.symbols.items():
            if pos in float_positions:
                W += [SYM_FLOAT, self._freg(str(sym)), pos]
            elif dim is None:
                W += [SYM_INT, self._reg(str(sym)), pos]
            elif dim >= 0:
                W += [SYM_SIZE, self._reg(str(sym)), pos, dim]
            else:
                W += [SYM_STRIDE, self._reg(str(sym)), pos, -1 - dim]
        if ir.divisors:  # the compiled native wrapper tests them (LoopIR.divisors)
            raise Unsupported("a division by an int or float argument that may be 0")
        for sym, e in ir.derived:
            value = self.expr(e)
            W += [SET, self._reg(str(sym))] + value
            self.bound.add(str(sym))
        for b in inputs:
            self._tensor(b.name)
            W += [TAKE, self._slot(b.name), b.position]
            self.layouts[b.name] = b.layout
            if all(s.is_number for s in b.layout.strides) and b.layout.sizes:
                W += [RELAYOUT, self._slot(b.name)] + self.exprs(b.layout.strides)
        for buf in ir.buffers:
            if isinstance(buf, ConstantBuffer):
                W += [CONST, self._slot(buf.name), len(self.constants)]
                self.constants.append(buf.tensor)
                self.layouts[buf.name] = buf.layout
        if ir.seed_needed:
            W += [SEED, self._reg("seed")]
        checked = any(ERROR_RECORD in bufs for bufs, _, _ in self.signatures.values())
        self.emit_steps(lambda dead: W.extend(w for n in dead for w in (RESET, self._slot(n))))
        for o in ir.outputs:
            W.append(OUT)
            if isinstance(o, BufferRef):
                W += [V_TENSOR] + self.tensor(o)
            elif o is None:
                W.append(V_NONE)
            elif isinstance(o, (SymExpr, bool, int, float)):
                W += self._scalar_value(o)
            else:
                raise Unsupported(f"a graph output {o!r}")
        for site in sorted(sites_of(self._bodies()) if checked else set()):
            error, template = describe_site(site)
            pieces = ["\x01" if p == "{value}" else "\x02" if p == "{size}" else p
                      for p in re.split(r"(\{value\}|\{size\})", template) if p]
            self.sites.append((site, native.ERROR_KINDS[error.__name__], pieces))
        return ""

    def packed(self) -> native.Plan:
        return native.Plan(array("q", self.words).tobytes(), tuple(self.doubles), tuple(self.strings),
                           tuple(self.ops), tuple(self.dtypes), tuple((s, k, tuple(p)) for s, k, p in self.sites),
                           (len(self.slots), len(self.regs), len(self.fregs)), tuple(self.kernel_order))

    def _alloc(self, name: str, layout: Layout) -> None:
        self._tensor(name)
        target = self.input_writes.get(name)
        if target is not None:
            self.layouts[name] = layout
            self.words += [ALIAS, self._slot(name), self._slot(target)]
            return
        donor = self.plan.reuse.get(name)
        if donor is not None:
            if self.layouts[donor] == layout:
                self.words += [ALIAS, self._slot(name), self._slot(donor)]
            else:
                self.words += [VIEW, self._slot(name), self._slot(donor)] + self.exprs(layout.sizes) + self.exprs(
                    layout.strides)
            self.layouts[name] = layout
            if donor in self.plan.kept:
                self.words += [RESET, self._slot(donor)]
            return
        self.layouts[name] = layout
        self.words += [ALLOC, self._slot(name), self._dtype(layout.dtype)] + self.exprs(layout.sizes) + self.exprs(
            layout.strides)

    def _kernel(self, step: Kernel | ScatterKernel) -> None:
        bufs, syms, seed = self.signatures[step.name]
        for t in self.argtypes[step.name]:
            if t not in (ctypes.c_void_p, ctypes.c_int64, ctypes.c_double):
                raise Unsupported(f"kernel {step.name} takes a {t.__name__} argument")
        for n in step.nodes if isinstance(step, Kernel) else ():
            if n.name in bufs and n.name not in self.layouts:
                self._alloc(n.name, n.layout)
        args: list[int] = []
        for b in bufs:
            if b == ERROR_RECORD:
                args.append(A_ERROR)
            elif b in self.slots:
                args += [A_PTR, self.slots[b]]
            else:
                raise Unsupported(f"kernel {step.name} reads {b} before it is made")
        for s in syms:
            if is_float_symbol(s):
                if s not in self.fregs:
                    raise Unsupported(f"the float symbol {s}")
                args += [A_FREG, self.fregs[s]]
            else:
                args += [A_INT] + self.expr(sympy.Symbol(s))
        if seed:
            args += [A_INT] + self.expr(sympy.Symbol("seed"))
        self.words += [KERNEL, len(self.kernel_order), len(bufs) + len(syms) + int(seed)] + args
        self.kernel_order.append(step.name)

    def _extern(self, step: ExternCall) -> None:
        n = step.node
        op = n.op
        if not isinstance(op, torch._ops.OpOverload):
            raise Unsupported(f"the extern {op} is not an operator overload")
        values: list[list[int]] = self._arguments(n)  # type: ignore[assignment]  # words (_value)
        out = self.out_overload(step)
        if out is not None:  # writes into the buffer the memory plan gives it
            rname, layout, _ = n.results[0]
            self._alloc(rname, layout)
            values.append([V_TENSOR, self._slot(rname), 0])
            self.words += [EXTERN, self._op(out), len(values)] + [w for v in values for w in v] + [0]
            return
        returns = [str(r.type) for r in op._schema.returns]
        results: list[int] = []
        for rname, _, path in n.results:
            index = path[0] if path and len(returns) > 1 else 0
            rest = path[1:] if path and len(returns) > 1 else path
            kind = returns[index] if index < len(returns) else None
            if kind == "Tensor" and not rest:
                item = -1
            elif kind == "List[Tensor]" and len(rest) == 1:
                item = rest[0]
            else:
                raise Unsupported(f"{op}: a result of type {kind} at {path}")
            self._tensor(rname)
            results += [self._slot(rname), index, item]
        extern = [EXTERN, self._op(op), len(values)] + [w for v in values for w in v] + [len(n.results)] + results
        memo = self._fold_memo_words(n, values)
        if memo is None:
            self.words += extern
        else:  # FOLD skips the EXTERN and FOLD_DONE where its memo holds the results of these inputs
            done = [FOLD_DONE] + memo
            self.words += [FOLD] + memo + [len(extern) + len(done)] + extern + done
            self.memos += 1
        self._bind_results(n.results, op)

    def _fold_memo_words(self, n: Any, values: list[list[int]]) -> list[int] | None:
        """kiln::fold_conv_bn*'s and kiln::pack_conv_weight's memo operands (native_wrapper._fold_memo's,
        as words): the memo's number, the slots of its six tensor inputs (-1: None) and of its two
        results. None where an input is a view made for the call or another argument holds a symbolic size."""
        if not self.fold_memo_applies(n):
            return None
        count = MEMO_TENSOR_INPUTS[n.op]
        inputs = []
        for v in values[:count]:
            if v == [V_NONE]:
                inputs.append(-1)
            elif len(v) == 3 and v[0] == V_TENSOR and v[2] == 0:
                inputs.append(v[1])
            else:
                return None
        inputs += [-1] * (6 - count)  # the memo's slots past the op's own tensors: none
        return [self.memos] + inputs + [self._slot(n.results[0][0]), self._slot(n.results[1][0])]

    def _bind_results(self, results: Any, op: Any) -> None:
        for rname, layout, path in results:
            self.layouts[rname] = layout
            for d, size in enumerate(layout.sizes):
                if getattr(size, "is_Symbol", False) and str(size) not in self.bound:
                    self.words += [BIND_SIZE, self._reg(str(size)), self._slot(rname), d]  # an unbacked size
                    self.bound.add(str(size))
            check = self.result_check(rname, layout, op, path)
            if check is not None:  # dtype and sizes against the fake's (ExternMismatchError), strides
                sizes = self.exprs(layout.sizes) if check[1] else []
                self.words += [CHECK_RESULT, self._slot(rname), self._op(op), self._dtype(layout.dtype),
                               int(self.clean), int(check[1])] + sizes + self.exprs(layout.strides)


Signatures = dict[str, tuple[list[str], list[str], bool]]


def write_plan(program: KernelProgram, signatures: Signatures) -> PlanWriter | None:
    """The writer after writing the graph's plan, or None (the reason logged) where a plan cannot
    express the graph: it keeps the compiled native wrapper's path."""
    begin = time.perf_counter()
    argtypes = {name: [ctypes.c_void_p] * len(bufs) + [ctypes.c_double if is_float_symbol(s) else ctypes.c_int64
                                                       for s in syms] + [ctypes.c_int64] * int(seed)
                for name, (bufs, syms, seed) in signatures.items()}
    writer = PlanWriter(program, signatures, argtypes)
    try:
        writer.write()
    except Unsupported as exc:
        log.artifact("perf_hints", f"native plan not used, the graph's own C++ wrapper is compiled instead: {exc}")
        return None
    finally:
        compile_time.add("write_plan", time.perf_counter() - begin)
    return writer


@dataclass
class PlannedGraph:
    """A graph that runs its plan from the start (mode="reduce-overhead", cpu_wrapper="native")."""

    writer: PlanWriter
    output_spec: str | None


def start(program: KernelProgram, signatures: Signatures, wrapper: WrapperPlan
          ) -> PlannedGraph | native_wrapper.NativeBuild | None:
    """native_wrapper.start, a plan in place of the compiled wrapper where the wrapper settings run
    plans (kiln.runtime.plan) and the plan can express the graph."""
    if not wrapper.native_up_front:
        return None
    writer = write_plan(program, signatures) if wrapper.native_plan else None
    if writer is not None:
        return PlannedGraph(writer, program.ir.output_spec)
    return native_wrapper.start(program, signatures, wrapper)


def choose(fn: Callable[..., Any], program: KernelProgram, signatures: Signatures, lib: Any,
           wrapper: WrapperPlan, dump: Callable[[str, str], None],
           started: PlannedGraph | native_wrapper.NativeBuild | None = None) -> Callable[..., Any]:
    """native_wrapper.choose, with plans: a graph `start`ed with a plan runs it at once (the boundary
    extension built here if no process built it before); under tier-up, a graph whose plan is
    expressible runs it from its first call once the extension is loaded (else from the first call
    after the background thread built it), with no C++ compiled for the graph."""
    if isinstance(started, PlannedGraph):
        begin = time.perf_counter()
        try:
            planned = native.bind_plan(native.boundary(), started.writer.packed(), lib, started.output_spec,
                                       started.writer.constants)
        except (build.BuildError, OSError, AttributeError, RuntimeError, ValueError) as exc:
            log.artifact("perf_hints", f"native plan not bound ({exc}); the graph's C++ wrapper is compiled instead")
            return native_wrapper.choose(fn, program, signatures, lib, wrapper, dump)
        finally:
            compile_time.add("build_native_wrapper", time.perf_counter() - begin)
        dump("codegen_native_plan.txt", describe(started.writer))
        kernels, spec, constants = tuple(started.writer.kernel_order), started.output_spec, started.writer.constants

        def ref() -> native.NativeRef | None:  # asked when the graph is persisted: a later process writes the plan again
            return None if constants else native.native_ref(records.dumps(program), None, lib, kernels, spec)

        return native.settled(fn, planned, f"a graph of {len(program.steps)} steps (plan)", ref)
    chosen = native_wrapper.choose(fn, program, signatures, lib, wrapper, dump, started)
    # A graph of one step has no compiled native wrapper to tier up to (its C++ build would not pay
    # back), but its plan costs nothing to build, and the Python wrapper around that one kernel call
    # (the thread check, stride checks, allocations from Python, the ctypes call) costs a few
    # microseconds per call: a small training graph's forward and backward are one kernel each.
    single = chosen is fn and len(program.steps) == 1 and wrapper.tiers_up()
    if not (isinstance(chosen, native.TieredWrapper) or single) or not wrapper.native_plan:
        return chosen
    writer = write_plan(program, signatures)
    if writer is None:
        return chosen
    dump("codegen_native_plan.txt", describe(writer))
    if isinstance(chosen, native.TieredWrapper):
        return native.tier_plan(fn, writer.packed, lambda: lib, program.ir.output_spec, writer.constants,
                                f"{chosen.name} (plan)", chosen.ref)
    kernels, constants = tuple(writer.kernel_order), writer.constants

    def stored_ref() -> native.NativeRef | None:  # a later process writes the plan again
        return None if constants else native.native_ref(records.dumps(program), None, lib, kernels,
                                                        program.ir.output_spec)

    return native.tier_plan(fn, writer.packed, lambda: lib, program.ir.output_spec, constants,
                            "a graph of 1 step (plan)", stored_ref)


def describe(writer: PlanWriter) -> str:
    """A plan as text, for KILN_DEBUG dumps: its tables and words."""
    plan = writer.packed()
    lines = [f"slots {plan.counts[0]}, int registers {plan.counts[1]}, float registers {plan.counts[2]}",
             f"kernels {list(plan.kernels)}", f"operators {list(plan.ops)}", f"dtypes {list(plan.dtypes)}",
             f"doubles {list(plan.doubles)}", f"strings {list(plan.strings)}", f"slots by name {writer.slots}",
             f"registers by name {writer.regs} {writer.fregs}", f"words {writer.words}"]
    return "\n".join(lines) + "\n"


def write_stored(record: bytes) -> native.Plan | None:
    """The plan of a graph whose program a later process read back from the cache (its NativeRef):
    written anew from the checked program, never read from disk; None where a plan cannot express it
    or the graph has constants."""
    try:
        program = check_stored_program(records.loads(record, packages=("kiln.lower.",)))
    except (records.RecordError, ValueError) as exc:
        raise build.BuildError(f"not a stored program: {exc}") from exc
    writer = write_plan(program, generate(program)[1])
    if writer is None or writer.constants:
        return None
    return writer.packed()


native.register_plan_writer(write_stored)
