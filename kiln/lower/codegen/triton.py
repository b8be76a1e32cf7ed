"""Triton codegen, the expression level: index expressions, one rendering per loop op, and
TritonBodyWriter, which prints a body Value as Triton statements over blocks of elements.

Where the C++ path evaluates a body at one point, here every temporary is a block (the kernel's
[XBLOCK] or [XBLOCK, RBLOCK] tile); loads are masked by the tile's bounds and by any enclosing
`Masked`, so a pad or a tail never reads outside a tensor. Half types load into float32, as in
the C++ path. Transcendental math goes through `libdevice` (kiln.runtime.triton_build binds it).
The kernel structure around these bodies is in codegen/triton_kernel.py. Corresponds to the
TritonOverrides and TritonKernel expression printing of torch/_inductor/codegen/triton.py.
"""
from __future__ import annotations

from typing import Sequence

import sympy
import torch

from kiln.lower.codegen.body import BodyWriter, RenderTable, arg_dtype
from kiln.lower.ir import Const, Index, Load, Masked, Op, Value
from kiln.symbolic.expr import adopt_torch_functions
from kiln.symbolic.render import render_triton

TL = {torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
      torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
      torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1"}


def compute(dtype: torch.dtype) -> torch.dtype:
    """The dtype a value of `dtype` is computed in: half types in float32, as the C++ path does."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def texpr(e: sympy.Expr) -> str:
    """An index expression in Triton over the kernel's variables and size arguments (the one
    printer's Triton mode; PyTorch's own sympy functions, found in sizes handed over by the real
    torch.compile, are first replaced by Kiln's), parenthesized unless it is a name or a number:
    callers splice it next to `//` and `%`."""
    text = render_triton(adopt_torch_functions(sympy.sympify(e)))
    return text if text.isidentifier() or text.isdigit() else f"({text})"


# ----------------------------------------------------------------------------- the op table

RENDER = RenderTable()
renders = RENDER.renders


def _is_float(v: Op) -> bool:
    return arg_dtype(v).is_floating_point


LIBDEVICE_UNARY = ("exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh asinh acosh "
                   "atanh erf erfc lgamma sqrt rsqrt").split()


def _tile(text: str, dtype: torch.dtype) -> str:
    """A literal argument made a 0-d tensor: libdevice functions take tensors only."""
    if text.isidentifier() and text not in ("True", "False"):
        return text
    return f"tl.full([], {text}, {TL[compute(dtype)]})"


@renders(*LIBDEVICE_UNARY)
def _libdevice_unary(v: Op, a: Sequence[str]) -> str:
    if _is_float(v):
        return f"libdevice.{v.name}({_tile(a[0], arg_dtype(v))})"
    return f"libdevice.{v.name}({_tile(a[0], arg_dtype(v))}.to(tl.float32))"  # integers: float math, as in C++


@renders("atan2", "hypot", "copysign")
def _libdevice_binary(v: Op, a: Sequence[str]) -> str:
    return f"libdevice.{v.name}({_tile(a[0], arg_dtype(v))}, {_tile(a[1], arg_dtype(v))})"


@renders("floor", "ceil", "trunc", "round")
def _rounding(v: Op, a: Sequence[str]) -> str:
    if not _is_float(v):
        return a[0]
    return f"libdevice.{'nearbyint' if v.name == 'round' else v.name}({_tile(a[0], arg_dtype(v))})"  # half to even


@renders("add", "sub", "mul", "bitwise_and", "bitwise_or", "bitwise_xor", "lshift", "rshift",
         "eq", "ne", "lt", "le", "gt", "ge")
def _infix(v: Op, a: Sequence[str]) -> str:
    if arg_dtype(v) == torch.bool and v.name in ("add", "mul"):
        return f"({a[0]} {'|' if v.name == 'add' else '&'} {a[1]})"
    sign = {"add": "+", "sub": "-", "mul": "*", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^",
            "lshift": "<<", "rshift": ">>", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
    return f"({a[0]} {sign[v.name]} {a[1]})"


@renders("truediv")
def _truediv(v: Op, a: Sequence[str]) -> str:
    # Triton's `/` on integers gives a float; the loop op keeps C's truncating integer division
    return f"({a[0]} / {a[1]})" if _is_float(v) else _division_call("truncdiv", v, a)


@renders("neg")
def _neg(v: Op, a: Sequence[str]) -> str:
    return f"(-{a[0]})"


@renders("abs")
def _abs(v: Op, a: Sequence[str]) -> str:
    return a[0] if arg_dtype(v) == torch.bool else f"tl.abs({a[0]})"


@renders("sigmoid")
def _sigmoid(v: Op, a: Sequence[str]) -> str:
    return f"(1.0 / (1.0 + libdevice.exp(-{_tile(a[0], arg_dtype(v))})))"


@renders("reciprocal")
def _reciprocal(v: Op, a: Sequence[str]) -> str:
    return f"(1.0 / {a[0]})"


@renders("frac")
def _frac(v: Op, a: Sequence[str]) -> str:
    return f"({a[0]} - libdevice.trunc({_tile(a[0], arg_dtype(v))}))"


@renders("sign")
def _sign(v: Op, a: Sequence[str]) -> str:
    T = TL[compute(arg_dtype(v))]
    return f"((0 < {a[0]}).to({T}) - ({a[0]} < 0).to({T}))"  # sign(NaN) is 0, as in ATen


@renders("relu")
def _relu(v: Op, a: Sequence[str]) -> str:
    return f"tl.where({a[0]} < 0, 0, {a[0]})"  # keeps NaN and -0.0, as clamp_min does


@renders("bitwise_not")
def _bitwise_not(v: Op, a: Sequence[str]) -> str:
    return f"({a[0]} == 0)" if arg_dtype(v) == torch.bool else f"(~{a[0]})"


@renders("isnan", "isinf", "isfinite", "signbit", "logical_not")
def _predicate(v: Op, a: Sequence[str]) -> str:
    x, fl = a[0], _is_float(v)
    if v.name == "isnan":
        return f"({x} != {x})"  # false for integers too
    if v.name == "isinf":
        return f"(tl.abs({x}) == float('inf'))" if fl else f"({x} != {x})"
    if v.name == "isfinite":
        return f"(({x} - {x}) == 0)" if fl else f"({x} == {x})"
    if v.name == "signbit":
        return f"(libdevice.signbit({_tile(x, arg_dtype(v))}) != 0)" if fl else f"({x} < 0)"
    return f"({x} == 0)"


@renders("logical_and", "logical_or", "logical_xor")
def _logical(v: Op, a: Sequence[str]) -> str:
    sign = {"logical_and": "&", "logical_or": "|", "logical_xor": "!="}[v.name]
    return f"(({a[0]} != 0) {sign} ({a[1]} != 0))"


@renders("floordiv", "truncdiv", "mod", "fmod")
def _division(v: Op, a: Sequence[str]) -> str:
    return _division_call(v.name, v, a)


# an unsigned type has no -1 to special-case (its all-ones pattern, uint8's 255, is an ordinary
# divisor, and Triton refuses to compare an unsigned tile with a negative literal) and truncation
# and floor agree: one quotient helper and one remainder helper serve all four ops
UNSIGNED_DIVISION = {"floordiv": "kiln_div_uint", "truncdiv": "kiln_div_uint",
                     "mod": "kiln_mod_uint", "fmod": "kiln_mod_uint"}


def _division_call(name: str, v: Op, a: Sequence[str]) -> str:
    if _is_float(v):
        return f"kiln_{name}_float({a[0]}, {a[1]})"
    if not arg_dtype(v).is_signed and arg_dtype(v) != torch.bool:
        return f"{UNSIGNED_DIVISION[name]}({a[0]}, {a[1]})"
    return f"kiln_{name}_int({a[0]}, {a[1]})"


@renders("pow")
def _pow(v: Op, a: Sequence[str]) -> str:
    if not _is_float(v):
        return f"kiln_pow_int({_tile(a[0], arg_dtype(v))}, {a[1]})"
    return f"libdevice.pow({_tile(a[0], arg_dtype(v))}, {_tile(a[1], arg_dtype(v))})"


@renders("maximum", "minimum", "fmax", "fmin")
def _extremum(v: Op, a: Sequence[str]) -> str:
    x, y = a
    pick_y = f"({x} < {y})" if v.name in ("maximum", "fmax") else f"({x} > {y})"
    if not _is_float(v):
        return f"tl.where({pick_y}, {y}, {x})"
    nan_x, nan_y = _nan_test(v.args[0], x), _nan_test(v.args[1], y)
    if v.name in ("maximum", "minimum"):  # NaN wins; ties (-0.0 vs 0.0) keep the first operand
        return f"tl.where({_either(nan_x, '~' + _either(nan_y, pick_y))}, {x}, {y})"
    return f"tl.where({_either(nan_y, '~' + _either(nan_x, pick_y))}, {x}, {y})"  # NaN loses


def _nan_test(arg: Value, text: str) -> str | None:
    """Whether `arg` is NaN, in Triton, or None when it never is. A literal is tested here: the
    interpreter cannot `|` the comparison of two 0-d tensors (a float64 constant) with a tile."""
    if isinstance(arg, Const):
        return None if arg.value == arg.value else "True"
    return f"({text} != {text})"


def _either(a: str | None, b: str) -> str:
    return b if a is None else f"({a} | {b})"


@renders("where")
def _where(v: Op, a: Sequence[str]) -> str:
    return f"tl.where({a[0]}, {a[1]}, {a[2]})"


# float -> integer: through int32 or int64, then (for the narrow types) keeping the low bits
FLOAT_TO_INT = {torch.int64: (64, None), torch.int32: (32, None), torch.int16: (32, "tl.int16"),
                torch.int8: (32, "tl.int8"), torch.uint8: (64, "tl.uint8")}


@renders("to_dtype")
def _to_dtype(v: Op, a: Sequence[str]) -> str:
    target = v.param
    assert isinstance(target, torch.dtype)
    if target == torch.bool:
        return f"({a[0]} != 0)"
    x = _tile(a[0], arg_dtype(v))  # a literal has no .to()
    if target in (torch.float16, torch.bfloat16):  # round to the half type, keep computing in float32
        return f"{to_storage(x, target)}.to(tl.float32)"
    if _is_float(v) and target in FLOAT_TO_INT:
        # Triton converts NaN and values out of range as the hardware does (the interpreter: as
        # numpy does): convert by the C++ path's rule instead, ATen's (kiln.lower.ops.integer_value)
        wide, narrow = FLOAT_TO_INT[target]
        low = -(2.0 ** (wide - 1))
        inside = f"({x} >= {low!r}) & ({x} < {-low!r})"
        out = f"tl.where({inside}, {x}, {low!r}).to(tl.int{wide})"
        return out if narrow is None else f"{out}.to({narrow})"
    return f"{x}.to({TL[target]})"


@renders("index_ok")
def _index_ok(v: Op, a: Sequence[str]) -> str:
    # the op's parameter (kiln.lower.checks.IndexCheck) says whether -size <= i < 0 is allowed too;
    # TritonBodyWriter records a failure in the kernel's error record beside this test
    low = f"-{a[1]}" if getattr(getattr(v.param, "kind", None), "wrap_negative", False) else "0"
    return f"(({a[0]} >= {low}) & ({a[0]} < {a[1]}))"


ZERO_DIVISION_SITE = 1  # the error-record site of an integer division by zero (as kiln.lower.checks)


def needs_divisor_check(v: Op) -> bool:
    """Integer division by something that is not a known non-zero constant: ATen raises on zero."""
    if v.name not in ("floordiv", "truncdiv", "mod", "fmod") or v.args[0].dtype.is_floating_point:
        return False
    return not (isinstance(v.args[1], Const) and v.args[1].value != 0)


def to_storage(value: str, dtype: torch.dtype) -> str:
    """A float32 value as the half type it is stored in, rounded to nearest even as ATen does."""
    if dtype == torch.bfloat16:
        return f"kiln_to_bf16({value})"
    if dtype == torch.float16:
        return f"{value}.to(tl.float16)"
    return value


@renders("aten_vector_lane")
def _aten_vector_lane(v: Op, a: Sequence[str]) -> str:
    # asked for on CPU tensors only, which reach Triton under its interpreter (kiln.config.cpu_backend):
    # the thread count is the one at code generation (the C++ prelude's kiln_aten_vector_lane reads it
    # at each call)
    p, row, total = a
    threads = torch.get_num_threads()
    share = f"(({total}) + {threads - 1}) // {threads}"
    share_start, row_start = f"(({p}) // {share} * {share})", f"(({p}) // ({row}) * ({row}))"
    start = f"tl.maximum({share_start}, {row_start})"
    end = f"tl.minimum({share_start} + {share}, {row_start} + ({row}))"
    return f"(({p}) - {start} < ({end} - {start}) // {v.param} * {v.param})"


@renders("rand", "randn")
def _random(v: Op, a: Sequence[str]) -> str:
    # Philox keyed by (seed, element counter): the same scheme as the C++ path (seed per call, counter
    # = the op's offset plus the element's number), with Triton's generator instead of splitmix
    return f"tl.{v.name}(seed, {a[0]}).to({TL[compute(v.dtype)]})"


PRELUDE = '''\
import triton
import triton.language as tl

from kiln.runtime.triton_build import math_library

libdevice = math_library()  # Triton's libdevice, or numpy versions under the interpreter


@triton.jit
def kiln_floordiv_int(a, b):
    # correct whichever way `//` rounds (C truncates; the interpreter floors): floor division. The
    # divisor 0 (ATen raises; recorded beside the call) and -1 (the type's minimum over -1
    # overflows: ATen wraps) never reach `//`
    safe = tl.where((b == 0) | (b == -1), 1, b)
    q = a // safe
    r = a - q * safe
    q = tl.where((r != 0) & ((r < 0) != (safe < 0)), q - 1, q)
    q = tl.where(b == -1, 0 - a, q)
    return tl.where(b == 0, 0, q)


@triton.jit
def kiln_truncdiv_int(a, b):
    safe = tl.where((b == 0) | (b == -1), 1, b)
    q = a // safe
    r = a - q * safe
    q = tl.where((r != 0) & ((r < 0) != (a < 0)), q + 1, q)
    q = tl.where(b == -1, 0 - a, q)
    return tl.where(b == 0, 0, q)


@triton.jit
def kiln_mod_int(a, b):
    return tl.where(b == 0, 0, a - kiln_floordiv_int(a, b) * b)


@triton.jit
def kiln_fmod_int(a, b):
    return tl.where(b == 0, 0, a - kiln_truncdiv_int(a, b) * b)


@triton.jit
def kiln_div_uint(a, b):
    safe = tl.where(b == 0, 1, b)
    return tl.where(b == 0, 0, a // safe)


@triton.jit
def kiln_mod_uint(a, b):
    safe = tl.where(b == 0, 1, b)
    return tl.where(b == 0, 0, a % safe)


@triton.jit
def kiln_truncdiv_float(a, b):
    return libdevice.trunc(a / b)


@triton.jit
def kiln_fmod_float(a, b):
    return libdevice.fmod(a, b)


@triton.jit
def kiln_mod_float(a, b):
    r = libdevice.fmod(a, b)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def kiln_floordiv_float(a, b):
    # ATen's div_floor: exact for representable quotients, a / b when b == 0
    m = libdevice.fmod(a, b)
    d = (a - m) / b
    d = tl.where((m != 0) & ((b < 0) != (m < 0)), d - 1, d)
    f = libdevice.floor(d)
    f = tl.where(d - f > 0.5, f + 1, f)
    f = tl.where(d == 0, libdevice.copysign(d * 0, a / b), f)
    return tl.where(b == 0, a / b, f)


@triton.jit
def kiln_pow_int(base, exp):
    # exponentiation by squaring over the 63 bits an int64 exponent can have
    result = tl.where(exp < 0, tl.where(base == 1, 1, tl.where(base == -1, tl.where((exp & 1) != 0, -1, 1), 0)),
                      1).to(base.dtype)
    e = tl.where(exp < 0, 0, exp)
    b = base
    for _ in tl.static_range(63):
        result = tl.where((e & 1) != 0, result * b, result)
        b = b * b
        e = e >> 1
    return result


@triton.jit
def kiln_prod(a, b):
    return a * b


@triton.jit
def kiln_to_bf16(x):
    # round to nearest even on the float32 bits first, so the conversion after it is exact: GPUs
    # round float32 -> bfloat16 themselves, Triton 3.9's interpreter truncates; both agree this way
    u = x.to(tl.uint32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, r.to(tl.float32, bitcast=True)).to(tl.bfloat16)


@triton.jit
def kiln_fail(err, site, value, bound, failed):
    # the kernel's error record (site, value, bound), read by the wrapper after the kernel; when
    # several lanes fail, the largest site wins and value/bound are one failing lane's
    where = failed.to(tl.int32) * 0
    tl.atomic_max(err + where, site, mask=failed)
    tl.store(err + 1 + where, value, mask=failed)
    tl.store(err + 2 + where, bound, mask=failed)
'''


# ----------------------------------------------------------------------------- bodies

class TritonBodyWriter(BodyWriter):
    """Emits Triton statements for body values, sharing common subexpressions.

    `mask` is the expression of the lanes that are in range (loads outside it read nothing);
    `zeros` names an int32 zero tile of the block's shape, added to every address so that a load
    whose index does not vary across the tile still gets a pointer of the tile's shape (Triton
    requires the pointer to have the mask's shape). `checks` collects, per indirect load, the
    condition that its index is in range (see kiln.lower.codegen.triton_kernel's index flag); the
    `index_ok` checks and integer divisions record failures in `kiln_err` as the C++ path does."""

    RENDER = RENDER

    def __init__(self, storage: dict[str, torch.dtype], sub: dict, locals_: dict, counter: list[int],
                 mask: str, zeros: str, extents: dict[str, str], checks: list[str],
                 error_sites: set[int]) -> None:
        super().__init__(storage, sub, locals_, counter)
        self.mask = mask
        self.zeros = zeros
        self.extents = extents  # buffer -> its element count, as an expression over the kernel's arguments
        self.checks = checks
        self.error_sites = error_sites  # sites of kiln.lower.checks this body can fail at

    def print_index(self, e: sympy.Expr) -> str:
        return texpr(e)

    def declaration(self, name: str, text: str, dtype: torch.dtype) -> str:
        return f"{name} = {text}"  # Triton infers the type

    def index_value(self, v: Index) -> str:
        return self.tmp(f"({self.index(v.expr)} + {self.zeros}).to({TL[v.dtype]})", v.dtype)

    def masked(self, v: Masked) -> str:
        if isinstance(v.mask, Const):
            return self.value(v.body if v.mask.value else v.other)
        # each side loads, and checks its indices, only in the lanes that take it: a
        # concatenation's part may index out of range at the other parts' positions
        mask = self.value(v.mask)
        body = self._branch(v.body, f"{self.mask} & {mask}")
        other = self._branch(v.other, f"{self.mask} & ~{mask}")
        return self.tmp(f"tl.where({mask}, {body}, {other})", v.dtype)

    def after_op(self, v: Op, args: Sequence[str], out: str) -> None:
        if v.name == "index_ok":
            site = v.param.site  # type: ignore[attr-defined]
            self.lines.append(f"kiln_fail(kiln_err, {site}, {args[0]}, {args[1]}, {self.mask} & ~{out})")
            self.error_sites.add(site)
        elif needs_divisor_check(v):
            self.lines.append(f"kiln_fail(kiln_err, {ZERO_DIVISION_SITE}, 0, 0, {self.mask} & ({args[1]} == 0))")
            self.error_sites.add(ZERO_DIVISION_SITE)

    def _branch(self, v: Value, mask: str) -> str:
        """`v` computed under the narrower lane mask `mask`; values made there stay there."""
        inner = TritonBodyWriter(self.storage, self.sub, self.locals, self.counter, mask, self.zeros,
                                 self.extents, self.checks, self.error_sites)
        inner.cache = dict(self.cache)
        result = inner.value(v)
        self.lines += inner.lines
        return result

    def load(self, v: Load, key: sympy.Expr) -> str:
        address = f"{texpr(key)} + {self.zeros}"
        mask = self.mask
        if v.extra is not None:
            address = self.tmp(f"{address} + {self.value(v.extra)}", torch.int64)
            ok = self.tmp(index_in_range(self, v.extra, address, self.extents[v.buffer]), torch.bool)
            self.checks.append(f"{mask} & ~{ok}")
            mask = f"{mask} & {ok}"  # an index out of range reads nothing (and raises after the kernel)
        raw = f"tl.load({v.buffer} + ({address}), {mask}, other=0)"
        if self.storage[v.buffer] in (torch.float16, torch.bfloat16):
            raw += ".to(tl.float32)"
        return self.tmp(raw, v.dtype)

    def const(self, v: Const) -> str:
        """A literal where Triton types it right (float32, bool), else a typed 0-d tensor."""
        if v.dtype == torch.bool:
            return "True" if v.value else "False"
        if v.dtype.is_floating_point:
            x = float(v.value)
            text = "float('nan')" if x != x else f"float('{'-' if x < 0 else ''}inf')" if x in (
                float("inf"), float("-inf")) else repr(x)
            if compute(v.dtype) == torch.float32:
                return text
            return f"tl.full([], {text}, {TL[v.dtype]})"
        return f"tl.full([], {int(v.value)}, {TL[v.dtype]})"


def _wrapped_dims(extra: Value) -> list[tuple[Value, sympy.Expr]]:
    """(wrapped index, dim size) for each `where(i < 0, i + size, i)` in an indirect address: the
    shape kiln.lower.lowerings.indexing gives each indexed dim."""
    found: list[tuple[Value, sympy.Expr]] = []
    stack = [extra]
    while stack:
        v = stack.pop()
        if isinstance(v, Op) and v.name == "where":
            cond, plus, same = v.args
            if (isinstance(cond, Op) and cond.name == "lt" and cond.args[0] == same and isinstance(plus, Op)
                    and plus.name == "add" and plus.args[0] == same):
                size = plus.args[1]
                if isinstance(size, Op) and size.name == "to_dtype":
                    size = size.args[0]
                if isinstance(size, Index):
                    found.append((v, size.expr))
                    continue
        stack.extend(v.children())
    return found


def index_in_range(w: TritonBodyWriter, extra: Value, address: str, extent: str) -> str:
    """The condition that an indirect load is in range: each indexed dim's wrapped index within its
    size (what eager checks), and the whole address within the buffer (so nothing outside is read)."""
    parts = [f"({address} >= 0) & ({address} < {extent})"]
    for wrapped, size in _wrapped_dims(extra):
        i = w.value(wrapped)
        parts.append(f"({i} >= 0) & ({i} < {w.index(size)})")
    return " & ".join(parts)
