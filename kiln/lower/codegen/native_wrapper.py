"""Native wrapper codegen: the whole graph's wrapper as one C++ function (mode="reduce-overhead" on CPU).

The Python wrapper (codegen/wrapper.py) spends one Python line per allocation, per kernel (a ctypes
call with a data_ptr() per buffer) and per extern; for small graphs that is most of a call. This
writer makes the same decisions (the same memory plan, relayouts, views, kernel order and checks,
reusing WrapperWriter's analyses) but prints C++ over ATen's API: `at::empty_strided` allocations,
each kernel a direct call through the kernel table, each extern an `at::_ops::<op>::call` typed by
its schema (an operator outside ATen's C++ API, as oneDNN's or kiln's own, through the dispatcher
with a stack of IValues), `reset()` where the Python wrapper says `del`. kiln.runtime.native builds
it and calls it from Python in one step. A graph this writer cannot express (an extern that is not an operator
overload or takes an argument kind it does not spell, a kernel argument that is not a pointer or an
int64) keeps the Python wrapper, with the reason under KILN_LOGS=perf_hints.
Corresponds to torch/_inductor/codegen/cpp_wrapper_cpu.py.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import concurrent.futures
import functools
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

import sympy
import torch
from torch.utils import _pytree as pytree

from kiln import compile_time, log
from kiln.lower.checks import ERROR_RECORD, describe_site, sites_of, zero_division_text
from kiln.lower.codegen.wrapper import WrapperWriter
from kiln.lower.ir import BufferRef, ConstantBuffer, InputBuffer, Layout, SymExpr
from kiln.lower.codegen.cpp_kernel import generate
from kiln.lower.schedule import ExternCall, Kernel, KernelProgram, ScatterKernel, check_stored_program
from kiln.runtime import build, native, records
from kiln.runtime.folded_weights import MEMO_TENSOR_INPUTS
from kiln.runtime.plan import WrapperPlan
from kiln.symbolic.expr import is_float_symbol, is_truth_value
from kiln.symbolic.floats import is_float_valued
from kiln.symbolic.render import render_c as render_kernel_c


def _has_float_symbol(e: Any) -> bool:
    """Whether a size or scalar expression reads a float argument (kiln.symbolic.expr's float symbols)."""
    return any(is_float_symbol(str(s)) for s in getattr(sympy.sympify(e), "free_symbols", ()))


class Unsupported(Exception):
    """Something the native wrapper cannot express; the graph keeps its Python wrapper."""


def render_c(e: sympy.Basic) -> str:
    """render.render_c, refused where it calls the kernel prelude's float division helpers (Python's
    float `//` and `%` of scalar arguments), which the wrapper's prelude (aten_helpers.cpp) lacks."""
    text = render_kernel_c(e)
    if "kiln_floordiv_float" in text or "kiln_fmod_float" in text:
        raise Unsupported(f"Python's float // or % in {e}")
    return text


def cexpr(e: Any) -> str:
    return f"int64_t({render_c(sympy.sympify(e))})"


def _ints(xs: Any) -> str:
    return "{" + ", ".join(cexpr(x) for x in xs) + "}"


_SCALAR_TYPES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
                 torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
                 torch.uint8: "Byte", torch.bool: "Bool", torch.complex64: "ComplexFloat",
                 torch.complex128: "ComplexDouble"}
_MEMORY_FORMATS = {torch.contiguous_format: "Contiguous", torch.channels_last: "ChannelsLast",
                   torch.channels_last_3d: "ChannelsLast3d", torch.preserve_format: "Preserve"}

@functools.cache
def _helpers() -> str:
    """The C++ helpers the plan runner shares (kiln/runtime/aten_helpers.cpp)."""
    return native.aten_helpers()


_PRELUDE = r"""// the graph's wrapper as one function (kiln.lower.codegen.native_wrapper; run by kiln.runtime.native)
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/arange.h>
%(includes)s
#include <algorithm>
#include <utility>
#include <array>
#include <limits>
#include <optional>
#include <string>
#include <vector>

%(helpers)s
static inline std::vector<c10::SymInt> kiln_symints(std::initializer_list<int64_t> xs) {
  return std::vector<c10::SymInt>(xs.begin(), xs.end());
}
static inline c10::List<std::optional<at::Tensor>> kiln_optional_tensors(std::initializer_list<std::optional<at::Tensor>> xs) {
  c10::List<std::optional<at::Tensor>> out;
  for (const auto& x : xs) out.push_back(x);
  return out;
}
static inline c10::List<std::optional<at::Scalar>> kiln_optional_scalars(
    std::initializer_list<std::optional<at::Scalar>> xs) {
  c10::List<std::optional<at::Scalar>> out;
  for (const auto& x : xs) out.push_back(x);
  return out;
}
static int kiln_fail(int64_t kind, std::string text, int64_t* error_kind, std::string* message) {
  *error_kind = kind;
  *message = std::move(text);
  return 1;
}
"""


def _split_arguments(schema: str) -> list[str]:
    """The argument types of a schema string in order ('*' dropped), alias annotations removed."""
    inner = schema[schema.index("(") + 1:schema.rindex(") ->")]
    inner = re.sub(r"\((?:[a-z]!?|[a-z] -> \*)\)", "", inner)
    parts, depth, quote, cur = [], 0, False, ""
    for ch in inner:
        if ch == '"':
            quote = not quote
        if not quote and ch in "[(":
            depth += 1
        if not quote and ch in "])":
            depth -= 1
        if ch == "," and depth == 0 and not quote:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return [p.split(" ")[0] for p in parts if p != "*"]


class NativeWrapperWriter(WrapperWriter):
    """The C++ text of a graph's wrapper, from the decisions the Python wrapper makes."""

    def __init__(self, program: KernelProgram, signatures: dict[str, tuple[list[str], list[str], bool]],
                 argtypes: dict[str, list[Any]]) -> None:
        super().__init__(program, signatures)
        self.argtypes = argtypes
        self.kernel_order: list[str] = []
        self.constants: list[torch.Tensor] = []
        self.includes: set[str] = set()
        self.tensors: list[str] = []  # every tensor local, declared at the top
        self.handles: list[str] = []  # the dispatcher handles of boxed externs
        self.body: list[str] = []
        self.source = ""  # the text `write` returned

    # -- values ------------------------------------------------------------------------------------

    def _tensor(self, name: str) -> None:
        if name not in self.tensors:
            self.tensors.append(name)

    def ref(self, r: BufferRef) -> str:
        base = self.layouts.get(r.name)
        if base is not None and base == r.layout:
            return r.name
        sizes, strides = _ints(r.layout.sizes), _ints(r.layout.strides)
        if r.layout.offset == 0:  # as_strided keeps the tensor's own storage offset when given none
            return f"{r.name}.as_strided({sizes}, {strides})"
        return f"{r.name}.as_strided({sizes}, {strides}, {r.name}.storage_offset() + {cexpr(r.layout.offset)})"

    def _scalar(self, v: Any) -> str:
        if isinstance(v, SymExpr):
            if _has_float_symbol(v.expr) or is_float_valued(sympy.sympify(v.expr)):
                # a float argument's expression, or a float one of sizes (s0 / 3): a double
                return f"double({render_c(sympy.sympify(v.expr))})"
            if is_truth_value(sympy.sympify(v.expr)):
                return f"static_cast<bool>({cexpr(v.expr)})"  # a comparison: True/False, not 1/0
            return cexpr(v.expr)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return f"int64_t({v}LL)" if -2 ** 63 < v < 2 ** 63 else self._no(f"the int {v}")
        if isinstance(v, float):
            if math.isnan(v):
                return "std::numeric_limits<double>::quiet_NaN()"
            if math.isinf(v):
                return ("" if v > 0 else "-") + "std::numeric_limits<double>::infinity()"
            return float.hex(v)
        return self._no(f"the value {v!r}")

    @staticmethod
    def _no(what: str) -> str:
        raise Unsupported(what)

    def _value(self, kind: str, v: Any) -> str:
        """A C++ expression of schema type `kind` (as the schema string spells it) for value `v`."""
        if kind.endswith("?") and not kind.endswith("[]?") and "[" not in kind:
            if v is None:
                return "std::nullopt"
            base = kind[:-1]
            inner = self._value(base, v)
            ctype = {"Tensor": "at::Tensor", "int": "int64_t", "SymInt": "c10::SymInt", "float": "double",
                     "bool": "bool", "Scalar": "at::Scalar", "ScalarType": "at::ScalarType",
                     "Layout": "at::Layout", "Device": "at::Device", "MemoryFormat": "at::MemoryFormat",
                     "str": "c10::string_view"}.get(base)
            return f"std::optional<{ctype}>({inner})" if ctype else self._no(f"an argument of type {kind}")
        if kind.endswith("?"):  # an optional list: int[1]?, SymInt[]?, float[]?
            if v is None:
                return "std::nullopt"
            base = kind[:-1]
            ref = {"int": "at::OptionalIntArrayRef(at::IntArrayRef(", "SymInt":
                   "at::OptionalSymIntArrayRef(c10::SymIntArrayRef(", "float": "std::optional<at::ArrayRef<double>>(at::ArrayRef<double>("}
            head = base.split("[")[0]
            if head not in ref:
                return self._no(f"an argument of type {kind}")
            return f"{ref[head]}{self._value(base, v)}))"
        if kind == "Tensor":
            if not isinstance(v, BufferRef):
                return self._no(f"a Tensor argument given {type(v).__name__}")
            return self.ref(v)
        if kind in ("int", "SymInt", "float", "bool"):
            if kind == "float" and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            if kind in ("int", "SymInt") and not isinstance(v, (int, SymExpr)):
                return self._no(f"an int argument given {v!r}")
            if kind in ("int", "SymInt", "bool") and isinstance(v, SymExpr) and _has_float_symbol(v.expr):
                return self._no(f"an {kind} argument given the float expression {v.expr}")
            return self._scalar(v)
        if kind == "Scalar":
            return f"at::Scalar({self._scalar(v)})"
        if kind == "ScalarType":
            if v not in _SCALAR_TYPES:
                return self._no(f"the dtype {v}")
            return f"at::ScalarType::{_SCALAR_TYPES[v]}"
        if kind == "Layout":
            return "at::Layout::Strided" if v == torch.strided else self._no(f"the layout {v}")
        if kind == "MemoryFormat":
            return f"at::MemoryFormat::{_MEMORY_FORMATS[v]}" if v in _MEMORY_FORMATS else self._no(f"{v}")
        if kind == "Device":
            if not isinstance(v, torch.device):
                return self._no(f"the device {v!r}")
            return f"at::Device(std::string({json.dumps(str(v))}))"
        if kind == "str":
            if not isinstance(v, str) or not v.isascii():
                return self._no(f"the string {v!r}")
            return f"c10::string_view({json.dumps(v)})"
        if kind.endswith("]"):
            base, size = kind[:-1].split("[")
            items = list(v) if isinstance(v, (list, tuple)) else [v] if isinstance(v, (int, SymExpr)) else None
            if items is None:
                return self._no(f"a list argument given {v!r}")
            if base == "int":
                return "std::vector<int64_t>{" + ", ".join(self._value("int", x) for x in items) + "}"
            if base == "SymInt":
                return "kiln_symints({" + ", ".join(self._value("int", x) for x in items) + "})"
            if base == "float":
                return "std::vector<double>{" + ", ".join(self._value("float", x) for x in items) + "}"
            if base == "bool" and size:
                return f"std::array<bool, {len(items)}>{{{{" + ", ".join(self._value("bool", x) for x in items) + "}}"
            if base == "Tensor":
                return "std::vector<at::Tensor>{" + ", ".join(self._value("Tensor", x) for x in items) + "}"
            if base == "Scalar?":  # oneDNN's pointwise ops: the activation's parameters
                return "kiln_optional_scalars({" + ", ".join(
                    "std::nullopt" if x is None else f"std::optional<at::Scalar>({self._value('Scalar', x)})"
                    for x in items) + "})"
            if base == "Tensor?":
                return "kiln_optional_tensors({" + ", ".join(
                    "std::nullopt" if x is None else f"std::optional<at::Tensor>({self._value('Tensor', x)})"
                    for x in items) + "})"
        return self._no(f"an argument of type {kind}")

    # -- statements --------------------------------------------------------------------------------

    def write(self) -> str:
        ir = self.program.ir
        L = self.body
        inputs = sorted((b for b in ir.buffers if isinstance(b, InputBuffer)), key=lambda b: b.position)
        nargs = max([b.position + 1 for b in inputs] + [p + 1 for p, _ in ir.symbols.values()] + [ir.input_count])
        L.append(f"  if (nargs != {nargs}) return kiln_fail(3, \"the compiled graph takes {nargs} arguments, \" "
                 f"+ std::to_string(nargs) + \" given\", error_kind, message);")
        tensor_positions = {b.position for b in inputs} | {p for p, d in ir.symbols.values() if d is not None}
        float_positions = {p for sym, (p, d) in ir.symbols.items() if d is None and is_float_symbol(str(sym))}
        int_positions = {p for p, d in ir.symbols.values() if d is None} - float_positions
        if tensor_positions & (int_positions | float_positions) or int_positions & float_positions:
            raise Unsupported("an argument read both as a tensor and as a number")
        for p in sorted(tensor_positions):
            L.append(f"  if (!args[{p}].isTensor()) return kiln_fail(5, \"argument {p} of the compiled graph "
                     f"is not a tensor\", error_kind, message);")
        for p in sorted(int_positions):  # a bool is an int here, as in the Python wrapper's arithmetic
            L.append(f"  if (args[{p}].isBool()) args[{p}] = int64_t(args[{p}].toBool());")
            L.append(f"  if (!args[{p}].isInt()) return kiln_fail(5, \"argument {p} of the compiled graph "
                     f"is not an int\", error_kind, message);")
        for p in sorted(float_positions):  # an int or a bool given for a float: its value, as Python's arithmetic
            L.append(f"  if (args[{p}].isBool()) args[{p}] = double(args[{p}].toBool());")
            L.append(f"  if (args[{p}].isInt()) args[{p}] = double(args[{p}].toInt());")
            L.append(f"  if (!args[{p}].isDouble()) return kiln_fail(5, \"argument {p} of the compiled graph "
                     f"is not a float\", error_kind, message);")
        self.bound = {str(sym) for sym in ir.symbols}
        for sym, (pos, dim) in ir.symbols.items():
            if pos in float_positions:
                L.append(f"  const double {sym} = args[{pos}].toDouble();")
            elif dim is None:
                L.append(f"  const int64_t {sym} = args[{pos}].toInt();")
            elif dim >= 0:
                L.append(f"  const int64_t {sym} = args[{pos}].toTensor().size({dim});")
            else:
                L.append(f"  const int64_t {sym} = args[{pos}].toTensor().stride({-1 - dim});")
        for sym, expr in ir.derived:  # solved from an input size that is an expression in it
            L.append(f"  const int64_t {sym} = {cexpr(expr)};")
            self.bound.add(sym)
        for divisor, kind in ir.divisors:  # the graph's own `a // b` raised here (LoopIR.divisors)
            # kind 4 is ZeroDivisionError (kiln.runtime.native.ERROR_KINDS)
            # rendered as it is, not cast to int64 as sizes are: a float divisor of 0.25 is not 0
            L.append(f"  if (({render_c(sympy.sympify(divisor))}) == 0) "
                     f"return kiln_fail(4, \"{zero_division_text(kind)}\", error_kind, message);")
        for b in inputs:
            self._tensor(b.name)
            L.append(f"  {b.name} = std::move(args[{b.position}]).toTensor();")
            self.layouts[b.name] = b.layout
            if all(s.is_number for s in b.layout.strides) and b.layout.sizes:
                expected = _ints(b.layout.strides)
                L.append(f"  if (!{b.name}.strides().equals({expected})) {b.name} = kiln_relayout({b.name}, {expected});")
        for buf in ir.buffers:
            if isinstance(buf, ConstantBuffer):
                L.append(f"  const at::Tensor& {buf.name} = constants[{len(self.constants)}].toTensor();")
                self.constants.append(buf.tensor)
                self.layouts[buf.name] = buf.layout
        if ir.seed_needed:
            self.includes.add("randint")
            L.append("  const int64_t seed = at::randint(-(int64_t(1) << 62), int64_t(1) << 62, {}, "
                     "at::TensorOptions().dtype(at::kLong)).item<int64_t>();")
        checked = any(ERROR_RECORD in bufs for bufs, _, _ in self.signatures.values())
        if checked:
            L.append(f"  int64_t {ERROR_RECORD}[3] = {{0, 0, 0}};")
        self.emit_steps(lambda dead: L.append("  " + " ".join(f"{n}.reset();" for n in dead)))
        L.append(f"  outs->reserve({len(ir.outputs)});")
        for o in ir.outputs:
            if isinstance(o, BufferRef):
                L.append(f"  outs->emplace_back({self.ref(o)});")
            elif o is None:
                L.append("  outs->emplace_back();")
            elif isinstance(o, (SymExpr, bool, int, float)):
                L.append(f"  outs->emplace_back({self._scalar(o)});")
            else:
                raise Unsupported(f"a graph output {o!r}")
        L.append("  return 0;")
        sites = sites_of(self._bodies()) if checked else set()
        return self._assemble(sites)

    def frees(self, name: str) -> bool:
        return name in self.tensors  # an at::Tensor variable of the function (not a raw pointer)

    def _assemble(self, sites: set[int]) -> str:
        special = {"randint": "ATen/ops/randint.h", "dispatcher": "ATen/core/dispatch/Dispatcher.h"}
        includes = "\n".join(f"#include <{special.get(name, f'ATen/ops/{name}_ops.h')}>"
                             for name in sorted(self.includes))
        out = [_PRELUDE % {"includes": includes, "helpers": _helpers()}]
        out += self._error_function(sites)
        out.append("extern \"C\" int kiln_graph(c10::IValue* args, int64_t nargs, std::vector<c10::IValue>* outs, "
                   "void* const* kernels, const c10::IValue* constants, int64_t* error_kind, std::string* message) {")
        if self.tensors:
            out.append(f"  at::Tensor {', '.join(self.tensors)};")
        out += self.body
        out.append("}")
        return "\n".join(out) + "\n"

    @staticmethod
    def _error_function(sites: set[int]) -> list[str]:
        """kiln_kernel_error: the exception eager raises for a kernel's failed check (checks.py)."""
        if not sites:
            return []
        out = ["static int kiln_kernel_error(const int64_t* err, int64_t* error_kind, std::string* message) {",
               "  const std::string value = std::to_string(err[1]), size = std::to_string(err[2]);"]
        for site in sorted(sites):
            error, template = describe_site(site)
            pieces = re.split(r"(\{value\}|\{size\})", template)
            text = " + ".join("value" if p == "{value}" else "size" if p == "{size}" else f"std::string({json.dumps(p)})"
                              for p in pieces if p)
            out.append(f"  if (err[0] == {site}) return kiln_fail({native.ERROR_KINDS[error.__name__]}, {text}, "
                       "error_kind, message);")
        out.append('  return kiln_fail(2, "kiln: kernel check " + std::to_string(err[0]) + " failed (value " + value '
                   '+ ", bound " + size + ")", error_kind, message);')
        out.append("}")
        return out

    def _alloc(self, name: str, layout: Layout) -> None:
        self._tensor(name)
        target = self.input_writes.get(name)
        if target is not None:
            self.layouts[name] = layout
            self.body.append(f"  {name} = {target};  // the new value of {target}, computed in its storage")
            return
        donor = self.plan.reuse.get(name)
        if donor is not None:
            same = self.layouts[donor] == layout
            view = donor if same else f"{donor}.as_strided({_ints(layout.sizes)}, {_ints(layout.strides)})"
            self.layouts[name] = layout
            tail = f" {donor}.reset();" if donor in self.plan.kept else ""
            self.body.append(f"  {name} = {view};{tail}  // reuse")
            return
        self.layouts[name] = layout
        dtype = _SCALAR_TYPES.get(layout.dtype) or self._no(f"a buffer of dtype {layout.dtype}")
        self.body.append(f"  {name} = at::empty_strided({_ints(layout.sizes)}, {_ints(layout.strides)}, "
                         f"at::TensorOptions().dtype(at::ScalarType::{dtype}));")

    def _kernel(self, step: Kernel | ScatterKernel) -> None:
        bufs, syms, seed = self.signatures[step.name]
        for t in self.argtypes[step.name]:
            if t not in (ctypes.c_void_p, ctypes.c_int64, ctypes.c_double):
                raise Unsupported(f"kernel {step.name} takes a {t.__name__} argument")
        nodes = step.nodes if isinstance(step, Kernel) else ()
        for n in nodes:
            if n.name in bufs and n.name not in self.layouts:
                self._alloc(n.name, n.layout)
        index = len(self.kernel_order)
        self.kernel_order.append(step.name)
        params = (["void*"] * len(bufs) + ["double" if is_float_symbol(s) else "int64_t" for s in syms]
                  + (["int64_t"] if seed else []))
        call = [b if b == ERROR_RECORD else f"{b}.data_ptr()" for b in bufs] + list(syms) + (["seed"] if seed else [])
        origins = ", ".join(dict.fromkeys(step.origins() if isinstance(step, Kernel) else step.node.origins))
        self.body.append(f"  reinterpret_cast<void (*)({', '.join(params)})>(kernels[{index}])({', '.join(call)});"
                         f"  // {step.name}: {origins}")
        if ERROR_RECORD in bufs:
            self.body.append(f"  if ({ERROR_RECORD}[0]) return kiln_kernel_error({ERROR_RECORD}, error_kind, message);")

    def _extern(self, step: ExternCall) -> None:
        n = step.node
        op = n.op
        if not isinstance(op, torch._ops.OpOverload):
            raise Unsupported(f"the extern {op} is not an operator overload")
        if op.namespace != "aten":
            return self._boxed_extern(step)
        schema = op._schema
        name = schema.name.split("::", 1)[1]
        struct = name + (f"_{schema.overload_name}" if schema.overload_name else "")
        header = _header_declaring(name, struct)
        if header is None:  # declared in no header ATen ships: the dispatcher still knows the op
            return self._boxed_extern(step)
        self.includes.add(header)
        values = self._arguments(n)
        origins = ", ".join(n.origins)
        out = self.out_overload(step)
        if out is not None:  # a matmul writing into the buffer the plan gives it (WrapperWriter.out_overload)
            rname, layout, _ = n.results[0]
            self._alloc(rname, layout)
            self.body.append(f"  at::_ops::{name}_{out._schema.overload_name}::call({', '.join(values + [rname])});"
                             f"  // {n.name}: {origins}")
            return
        call = f"at::_ops::{struct}::call({', '.join(values)})"
        returns = [str(r.type) for r in schema.returns]
        results = list(n.results)
        for rname, _, _ in results:
            self._tensor(rname)
        if not results:
            self.body.append(f"  {call};  // {origins}")
        else:
            self.body.append(f"  {{  // {n.name}: {origins}")
            self.body.append(f"    auto ret = {call};")
            for rname, layout, path in results:
                if not path:
                    access = "ret"
                elif len(returns) > 1:
                    access = f"std::get<{path[0]}>(ret)" + "".join(f"[{p}]" for p in path[1:])
                else:
                    access = "ret" + "".join(f"[{p}]" for p in path)
                self.body.append(f"    {rname} = {access};")
            self.body.append("  }")
        self._bind_results(results, op)

    def _arguments(self, n: Any) -> list[str]:
        """The C++ expressions of an extern's arguments in schema order, typed as its schema says
        (defaults filled in)."""
        op = n.op
        schema = op._schema
        kinds = _split_arguments(str(schema))
        if len(kinds) != len(schema.arguments):
            raise Unsupported(f"the schema of {op} did not parse")
        kwargs = dict(n.kwargs)
        values = []
        for k, (arg, kind) in enumerate(zip(schema.arguments, kinds)):
            if k < len(n.args) and not arg.kwarg_only:
                v = n.args[k]
            elif arg.name in kwargs:
                v = kwargs[arg.name]
            elif arg.has_default_value():
                v = arg.default_value
            else:
                raise Unsupported(f"{op}: no value for {arg.name}")
            if kind == "ScalarType" or kind == "ScalarType?":
                if isinstance(v, int) and not isinstance(v, bool):  # a default spelled as its number
                    v = _DTYPE_NUMBERS.get(v, v)
            values.append(self._value(kind, v))
        if len(n.args) > len([a for a in schema.arguments if not a.kwarg_only]):
            raise Unsupported(f"{op}: more positional arguments than its schema")
        return values

    def _boxed_extern(self, step: ExternCall) -> None:
        """An operator outside ATen's generated C++ API (oneDNN's mkldnn::*, kiln::fold_conv_bn, a
        user's torch.library op): called through the dispatcher with a stack of IValues, its
        handle looked up once per process (a function-local static)."""
        n = step.node
        op = n.op
        assert isinstance(op, torch._ops.OpOverload)
        schema = op._schema
        returns = [str(r.type) for r in schema.returns]  # alias annotations are not part of the type
        for rname, _, path in n.results:
            kind = returns[path[0]] if path and len(returns) > 1 else returns[0] if returns else None
            if kind not in ("Tensor", "List[Tensor]"):
                raise Unsupported(f"{op} returns {kind}")
        values = self._arguments(n)
        self.includes.add("dispatcher")
        handle = f"kiln_op_{len(self.handles)}"
        self.handles.append(handle)
        origins = ", ".join(n.origins)
        self.body.append(f"  {{  // {n.name}: {origins}")
        self.body.append(f"    static const c10::OperatorHandle {handle} = c10::Dispatcher::singleton()"
                         f".findSchemaOrThrow({json.dumps(schema.name)}, {json.dumps(schema.overload_name)});")
        memo = self._fold_memo(n, values, handle)
        if memo:
            self.body.append(f"    if (!kiln_fold_hit({memo}, {memo}_in, {n.results[0][0]}, {n.results[1][0]})) {{")
        self.body.append("    std::vector<c10::IValue> stack{" + ", ".join(f"c10::IValue({v})" for v in values) + "};")
        self.body.append(f"    {handle}.callBoxed(stack);")
        for rname, _, path in n.results:
            self._tensor(rname)
            index = path[0] if path and len(returns) > 1 else 0
            rest = path[1:] if path and len(returns) > 1 else path
            if returns[index] == "List[Tensor]":
                if len(rest) != 1:
                    raise Unsupported(f"{op}: a result at {path}")
                self.body.append(f"    {rname} = stack[{index}].toTensorList().get({rest[0]});")
            else:
                if rest:
                    raise Unsupported(f"{op}: a result at {path}")
                self.body.append(f"    {rname} = stack[{index}].toTensor();")
        if memo:
            self.body.append(f"    kiln_fold_remember({memo}, {memo}_in, {n.results[0][0]}, {n.results[1][0]});")
            self.body.append("    }")
        self.body.append("  }")
        self._bind_results(n.results, op)

    @staticmethod
    def fold_memo_applies(n: Any) -> bool:
        """Whether a call of kiln::fold_conv_bn* or kiln::pack_conv_weight is told unchanged by its
        leading tensor inputs alone (MEMO_TENSOR_INPUTS, up to six): its other arguments hold no
        symbolic size, and it has its two results."""
        count = MEMO_TENSOR_INPUTS.get(n.op)
        if count is None or len(n.results) != 2:
            return False
        return [tuple(path) for _, _, path in n.results] == [(0,), (1,)] and not pytree.tree_any(
            lambda a: isinstance(a, (SymExpr, sympy.Basic)), (list(n.args[count:]), dict(n.kwargs)))

    def _fold_memo(self, n: Any, values: list[str], handle: str) -> str | None:
        """For kiln::fold_conv_bn* and kiln::pack_conv_weight: declares the call site's KilnFoldMemo
        (aten_helpers.cpp) and its six tensor inputs (undefined past the op's own), returns the memo's
        name; None where it does not apply (fold_memo_applies) or an input is a view made for the call."""
        if not self.fold_memo_applies(n):
            return None
        count = MEMO_TENSOR_INPUTS[n.op]
        inputs = []
        for v in values[:count]:
            inner = v.removeprefix("std::optional<at::Tensor>(").removesuffix(")") if v.startswith("std::optional") else v
            if v == "std::nullopt":
                inputs.append("at::Tensor()")
            elif inner.isidentifier():
                inputs.append(inner)
            else:  # a view made for the call: a new tensor each time, never the one remembered
                return None
        inputs += ["at::Tensor()"] * (6 - count)
        memo = handle.replace("kiln_op_", "kiln_fold_memo_")
        self.body.append(f"    static KilnFoldMemo {memo};")
        self.body.append(f"    const std::array<at::Tensor, 6> {memo}_in{{{', '.join(inputs)}}};")
        return memo

    def _bind_results(self, results: Any, op: Any) -> None:
        """After an extern: its results' layouts, unbacked sizes bound, dtype and sizes checked
        against the fake's (kiln.errors.ExternMismatchError: error kind 6 where nothing outside
        the graph was written yet, else 7), strides re-laid out."""
        for rname, layout, path in results:
            self.layouts[rname] = layout
            for d, size in enumerate(layout.sizes):
                if getattr(size, "is_Symbol", False) and str(size) not in self.bound:
                    self.body.append(f"  const int64_t {size} = {rname}.size({d});")  # an unbacked size
                    self.bound.add(str(size))
            check = self.result_check(rname, layout, op, path)
            if check is None:
                continue
            dtype = f"at::ScalarType::{_SCALAR_TYPES.get(layout.dtype) or self._no(f'a result of dtype {layout.dtype}')}"
            sizes = _ints(layout.sizes)
            wrong = f"{rname}.scalar_type() != {dtype}"
            expected = "nullptr"
            if check[1]:
                wrong += f" || !{rname}.sizes().equals({sizes})"
                expected = "&expected"
            self.body.append(f"  if ({wrong}) {{")
            if expected != "nullptr":
                self.body.append(f"    const std::vector<int64_t> sizes{sizes}; const at::IntArrayRef expected(sizes);")
            self.body.append(f"    return kiln_fail({6 if self.clean else 7}, kiln_result_mismatch({json.dumps(str(op))}, "
                             f"{rname}, {dtype}, {expected}), error_kind, message);")
            self.body.append("  }")
            if layout.sizes:
                strides = _ints(layout.strides)
                self.body.append(f"  if (!{rname}.strides().equals({strides})) {rname} = kiln_relayout({rname}, {strides});")


@functools.lru_cache(maxsize=None)
def _header_declaring(name: str, struct: str) -> str | None:
    """The `ATen/ops/<header>_ops.h` that declares `at::_ops::<struct>`, or None. Most ops have a
    header of their own name; an in-place variant (bernoulli_) is declared in its out-of-place op's
    header and a functional variant (_native_batch_norm_legit_functional, which functionalization
    makes of an op that mutates its inputs) in the header of the op it was made from: the name cut
    back at each underscore, checked by reading the header for the struct itself."""
    folder = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "ops")
    stem = name.rstrip("_")
    candidates = [name, stem]
    while "_" in stem.strip("_"):
        stem = stem[:stem.rindex("_")]
        candidates.append(stem)
    declaration = f"struct TORCH_API {struct} {{"
    for header in dict.fromkeys(c for c in candidates if c.strip("_")):
        path = os.path.join(folder, f"{header}_ops.h")
        try:
            with open(path, encoding="utf-8") as f:
                if declaration in f.read():
                    return header
        except OSError:
            continue
    return None


_DTYPE_NUMBERS = {i: d for i, d in enumerate([torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                                              torch.float32, torch.float64])}


@dataclass
class NativeBuild:
    """A graph's native wrapper source and its library's build, started on a thread (`start`) so
    that the compiler runs while the kernel library builds; `choose` waits for it."""

    source: str
    kernels: tuple[str, ...]
    constants: list[torch.Tensor]
    output_spec: str | None
    library: concurrent.futures.Future


_BUILDERS = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-native-build")


def write_native(program: KernelProgram, signatures: dict[str, tuple[list[str], list[str], bool]]
                 ) -> NativeWrapperWriter | None:
    """The writer after writing the graph's native wrapper, or None (the reason logged) when the
    graph keeps its Python wrapper."""
    probe = WrapperWriter(program, signatures)
    probe.write()  # the kernels' ctypes argument kinds, as the Python wrapper passes them
    writer = NativeWrapperWriter(program, signatures, probe.globals.get("_argtypes", {}))
    try:
        writer.source = writer.write()
    except Unsupported as exc:
        log.artifact("perf_hints", f"native wrapper not used, the Python wrapper runs instead: {exc}")
        return None
    return writer


def start(program: KernelProgram, signatures: dict[str, tuple[list[str], list[str], bool]],
          wrapper: WrapperPlan) -> NativeBuild | None:
    """Write the native wrapper and start building it, where the plan builds it up front and it can
    be written (else None)."""
    if not wrapper.native_up_front:
        return None
    writer = write_native(program, signatures)  # its time counts in the caller's pass
    if writer is None:
        return None
    library = _BUILDERS.submit(native.load_graph_library, writer.source)
    return NativeBuild(writer.source, tuple(writer.kernel_order), writer.constants, program.ir.output_spec, library)


def choose(fn: Callable[..., Any], program: KernelProgram, signatures: dict[str, tuple[list[str], list[str], bool]],
           lib: Any, wrapper: WrapperPlan, dump: Callable[[str, str], None],
           started: NativeBuild | None = None) -> Callable[..., Any]:
    """`fn` (the graph's Python wrapper), or its native wrapper where the plan builds it up front and
    it can be written (the build `started` before, or one started now). Its time here counts as the pass
    `build_native_wrapper` (KILN_LOGS=compile_time); a build that fails leaves `fn`."""
    begin = time.perf_counter()
    pending = started if started is not None else start(program, signatures, wrapper)
    if pending is None:
        return _tiered(fn, program, signatures, lib, wrapper)
    try:
        native_fn = native.make_native(pending.library.result(), lib, pending.kernels, pending.output_spec,
                                       constants=pending.constants)
    except (build.BuildError, OSError) as exc:
        log.warn(f"kiln: the native wrapper did not build, the Python wrapper runs instead: {str(exc)[:2000]}")
        return fn
    finally:
        compile_time.add("build_native_wrapper", time.perf_counter() - begin)
    source = pending.source
    dump("codegen_native_wrapper.cpp", source)
    log.artifact("output_code", lambda: f"// native wrapper\n{source}")
    return native_fn


def _tiered(fn: Callable[..., Any], program: KernelProgram, signatures: dict[str, tuple[list[str], list[str], bool]],
            lib: Any, wrapper: WrapperPlan) -> Callable[..., Any]:
    """`fn` behind a kiln.runtime.native.TieredWrapper that builds the native wrapper once the
    graph has run `wrapper.tier_up_after` times, where the plan tiers up (kiln.runtime.plan); `fn`
    itself where it does not, and for a graph of one step, whose Python wrapper is a single call."""
    after = wrapper.tier_up_after
    if not wrapper.tiers_up() or len(program.steps) < 2:
        return fn
    steps = len(program.steps)
    written: list[NativeWrapperWriter | None] = []

    def writer() -> NativeWrapperWriter | None:
        if not written:
            written.append(write_native(program, signatures))
        return written[0]

    def ref() -> native.NativeRef | None:  # asked when the graph is persisted
        w = writer()
        if w is None or w.constants:  # constant tensors keep a graph out of the persistent cache
            return None
        return native.native_ref(records.dumps(program), w.source, lib, tuple(w.kernel_order), program.ir.output_spec)

    def start_build() -> concurrent.futures.Future | None:
        w = writer()
        if w is None:
            return None
        source, kernels, constants = w.source, tuple(w.kernel_order), w.constants
        output_spec = program.ir.output_spec

        def build_and_bind() -> Callable[..., Any]:
            native_fn = native.make_native(native.load_graph_library(source), lib, kernels, output_spec,
                                           constants=constants)
            log.artifact("output_code", lambda: f"// native wrapper (tier-up)\n{source}")
            return native_fn

        return native.BACKGROUND.submit(build_and_bind)

    return native.TieredWrapper(fn, start_build, after, f"a graph of {steps} steps", ref)


def write_stored(record: bytes) -> tuple[str, tuple[str, ...]] | None:
    """(native wrapper source, kernel order) of a graph whose program a later process read back from
    the cache (kiln.runtime.native.NativeRef): always written anew from the checked program, never
    compiled from stored text; None when the writer cannot express it."""
    try:
        program = check_stored_program(records.loads(record, packages=("kiln.lower.",)))
    except (records.RecordError, ValueError) as exc:
        raise build.BuildError(f"not a stored program: {exc}") from exc
    writer = write_native(program, generate(program)[1])
    if writer is None or writer.constants:
        return None
    return writer.source, tuple(writer.kernel_order)


native.register_writer(write_stored)
