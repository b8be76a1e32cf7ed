"""Runtime checks in generated kernels: index bounds and integer division by zero, as eager checks.

Lowerings that index with loaded values (index, gather, index_select, embedding, take, index_put,
scatter, index_add, index_copy, index_fill)
guard each access with the loop op `index_ok` (reductions without an identity use it too, on a reduced
size that may be 0 only at run time); integer `//`, `%`, fmod and truncating division test
their divisor. A failed check skips the access and records the first failure in the kernel's error
record `kiln_err` (site, value, bound); the wrapper raises the exception eager raises after the
kernel returns, so a kernel never touches memory outside a tensor and never traps.
Corresponds to Inductor's indirect-indexing bounds checks (`check_bounds`, device_assert).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import sympy
import torch

from kiln.lower import ops
from kiln.lower.ir import Const, Index, Op, Value, walk

ERROR_RECORD = "kiln_err"  # the kernel argument (int64[3]: site, value, bound) and the wrapper's variable
ZERO_DIVISION_SITE = 1
_MAX_DIMS = 64  # an index site is 2 + kind * _MAX_DIMS + dim


@dataclass(frozen=True)
class CheckKind:
    """How eager checks one indexing op: which exception, whether -size <= i < 0 means i + size."""

    op: str
    error: type[Exception]
    wrap_negative: bool
    message: str  # eager's whole text, formatted with value, dim, size


# What ATen raises for each: the class users catch and eager's own text (eager names neither the
# index nor the size for index_select, embedding and a 1-d index_add: Kiln says what eager says).
_BOUNDS = "index {value} is out of bounds for dimension {dim} with size {size}"
_IN_SELF = "index out of range in self"
CHECK_KINDS: tuple[CheckKind, ...] = (
    CheckKind("index", IndexError, True, _BOUNDS),
    CheckKind("index_put", IndexError, True, _BOUNDS),
    CheckKind("gather", RuntimeError, False, _BOUNDS),
    CheckKind("scatter", RuntimeError, False, _BOUNDS),
    CheckKind("index_select", IndexError, False, _IN_SELF),
    CheckKind("embedding", IndexError, False, _IN_SELF),
    CheckKind("index_add", IndexError, False, _IN_SELF),
    CheckKind("index_copy", IndexError, False, "index_copy_(): " + _BOUNDS),
    CheckKind("index_fill", IndexError, True, _BOUNDS),
    # take's index is into the flattened tensor, and its text says so
    CheckKind("take", IndexError, True, "out of range: tried to access index {value} on a tensor of {size} elements."),
    # index_select on CPU checks dim 1 of a tensor of 2 or more dims (and any dim of an empty one)
    # on another path, which raises RuntimeError
    CheckKind("index_select_dim1", RuntimeError, False, "INDICES element is out of DATA bounds, id={value} axis_dim={size}"),
    # index_add along the first or last dim of a tensor of 2 or more dims runs as a scatter_add there
    CheckKind("index_add_nd", RuntimeError, False, _BOUNDS),
    # reductions without an identity over a dim (or a whole tensor) whose size is only known when
    # the graph runs (data-dependent, or computed from an int argument): `index_ok(0, size)` fails
    # where the size is 0, and the wrapper raises what eager raises
    *(CheckKind(f"{op}_empty_dim", IndexError, False,
                f"{op}(): Expected reduction dim {{dim}} to have non-zero size.")
      for op in ("max", "min", "amax", "amin", "argmax", "argmin")),
    *(CheckKind(f"{op}_empty", RuntimeError, False, f"{op}(): Expected reduction dim to be specified for "
                "input.numel() == 0. Specify the reduction dim with the 'dim' argument.")
      for op in ("max", "min", "amax", "amin")),
    *(CheckKind(f"{op}_empty", IndexError, False,
                f"{op}(): Expected reduction dim to be specified for input.numel() == 0.")
      for op in ("argmax", "argmin")),
    CheckKind("aminmax_empty_dim", IndexError, False, "aminmax: Expected reduction dim {dim} to have non-zero size."),
    CheckKind("aminmax_empty", RuntimeError, False, "aminmax(): cannot compute aminmax over an empty dimension as "
              "the operation has no identity."),
    *(CheckKind(f"norm{sign}inf_empty_dim", RuntimeError, False, f"linalg.vector_norm cannot compute the {sign}inf "
                "norm on the dimension {dim}because this dimension is empty and the operation does not have an "
                "identity") for sign in ("", "-")),
    *(CheckKind(f"norm{sign}inf_empty", RuntimeError, False, f"linalg.vector_norm cannot compute the {sign}inf norm "
                "on an empty tensor because the operation does not have an identity")
      for sign in ("", "-")),
)
_KIND_NUMBER = {k.op: n for n, k in enumerate(CHECK_KINDS)}


@dataclass(frozen=True)
class IndexCheck:
    """The static parameter of an `index_ok` op: which op indexes, along which dim of its tensor."""

    op: str
    dim: int

    @property
    def kind(self) -> CheckKind:
        return CHECK_KINDS[_KIND_NUMBER[self.op]]

    @property
    def site(self) -> int:
        """A number fixed by (op, dim) alone, so kernels and wrappers built apart agree on it."""
        return 2 + _KIND_NUMBER[self.op] * _MAX_DIMS + self.dim

    def __str__(self) -> str:
        return f"{self.op} dim {self.dim}"


def checked_index(v: Value, size: sympy.Expr, op: str, dim: int) -> tuple[Value, Value]:
    """(whether `v` indexes a dim of `size` the way eager accepts it, v made non-negative); the
    first records a failure in the kernel's error record."""
    check = IndexCheck(op, dim)
    v = ops.cast(v, torch.int64)
    n = ops.cast(Index(sympy.sympify(size)), torch.int64)
    ok = ops.op("index_ok", v, n, param=check)
    if check.kind.wrap_negative:
        v = ops.op("where", ops.op("lt", v, ops.constant(0, torch.int64)), ops.op("add", v, n), v)
    return ok, v


def all_of(conditions: list[Value]) -> Value:
    out = conditions[0]
    for c in conditions[1:]:
        out = ops.op("logical_and", out, c)
    return out


DIVISIONS = frozenset({"floordiv", "truncdiv", "mod", "fmod"})


def needs_divisor_check(v: Op) -> bool:
    """Integer division whose divisor is not a known non-zero constant (ATen raises on zero)."""
    if v.name not in DIVISIONS or v.args[0].dtype.is_floating_point:
        return False
    divisor = v.args[1]
    return not (isinstance(divisor, Const) and divisor.value != 0)


def sites_of(values: list[Value]) -> set[int]:
    """The check sites that bodies can fail at."""
    out: set[int] = set()
    for body in values:
        for v in walk(body):
            if isinstance(v, Op) and v.name == "index_ok":
                out.add(v.param.site)  # type: ignore[attr-defined]
            elif isinstance(v, Op) and needs_divisor_check(v):
                out.add(ZERO_DIVISION_SITE)
    return out


def describe_site(site: int) -> tuple[type[Exception], str]:
    """The exception class and message template (over value and size) of one site."""
    if site == ZERO_DIVISION_SITE:
        return RuntimeError, "ZeroDivisionError"
    kind = CHECK_KINDS[(site - 2) // _MAX_DIMS]
    dim = (site - 2) % _MAX_DIMS
    text = kind.message.replace("{dim}", str(dim))
    return kind.error, text


def error_function_source(sites: set[int]) -> list[str]:
    """Python lines defining `_kernel_error(err) -> Exception` for the wrapper (only builtins, so a
    wrapper rebuilt from the persistent cache needs nothing else)."""
    lines = ["def _kernel_error(err):",
             "    # the first failed check of a kernel: (site, value, bound), filled by kiln_record",
             "    site, value, size = err[0], err[1], err[2]"]
    for site in sorted(sites):
        error, message = describe_site(site)
        lines.append(f"    if site == {site}:")
        lines.append(f"        return {error.__name__}(f{message!r})")
    lines.append("    return RuntimeError(f'kiln: kernel check {site} failed (value {value}, bound {size})')")
    return lines


# C++ of the checks (part of the kernel prelude). The failure path is out of line and cold, so the
# loop body keeps one compare per check; compare-and-swap keeps the first failure whole when
# several threads fail at once (the wrapper reads the record after the parallel region joined).
# kiln_record is declared `const` although it writes the record: then the compiler may hoist the
# check of a loop-invariant index (an embedding row) out of the inner loop, which is what lets
# that loop vectorize. Its result is always used, so no call is dropped; it tests the failure
# itself, so a call the compiler runs speculatively records nothing; and nothing in a kernel
# reads the record, so no read can move across the write.
CPP_PRELUDE = r"""
static bool __attribute__((noinline, cold, const)) kiln_record(int64_t* err, int64_t site, int64_t value, int64_t bound, bool failed) {
  int64_t none = 0;
  if (failed && __atomic_compare_exchange_n(&err[0], &none, site, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    err[1] = value; err[2] = bound;
  }
  return !failed;
}
static inline bool kiln_index_ok(int64_t v, int64_t size, bool wrap, int64_t* err, int64_t site) {
  bool ok = wrap ? (v >= -size && v < size) : (v >= 0 && v < size);
  return __builtin_expect(ok, 1) ? true : kiln_record(err, site, v, size, !ok);
}
static inline int64_t kiln_zero_divisor(int64_t divisor, int64_t* err) {
  // 0, the quotient of a failed division; it comes out of the call so that the call stays
  return (int64_t)kiln_record(err, 1, 0, 0, divisor == 0);
}
"""


# A division of Python numbers in the graph (LoopIR.divisors), by kind: the text of the
# ZeroDivisionError that Python raises for it (CPython's own words, which differ per kind).
_PY_DIVISIONS = {"floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "truediv": lambda a, b: a / b}


def zero_division_kind(op: str, float_operands: bool) -> str:
    """The name LoopIR.divisors keeps for one division (an identifier: stored programs hold names)."""
    assert op in _PY_DIVISIONS, op
    return f"float_{op}" if float_operands else op


def zero_division_text(kind: str) -> str:
    """What Python says when the division `kind` (zero_division_kind) has a divisor of 0."""
    floats = kind.startswith("float_")
    try:
        _PY_DIVISIONS[kind.removeprefix("float_")](1.0 if floats else 1, 0)
    except ZeroDivisionError as exc:
        return str(exc)
    raise AssertionError(kind)


def render_index_ok(v: Op, a: list[str]) -> str:
    check = v.param
    assert isinstance(check, IndexCheck)
    wrap = "true" if check.kind.wrap_negative else "false"
    return f"kiln_index_ok({a[0]}, {a[1]}, {wrap}, {ERROR_RECORD}, {check.site})"


def guard_divisor(v: Op, a: Sequence[str], ctype: str, division: str) -> str:
    """`division` (C++ of an integer division) preceded by the divisor's zero test when needed."""
    if not needs_divisor_check(v):
        return division
    return f"({a[1]} == 0 ? {ctype}(kiln_zero_divisor({a[1]}, {ERROR_RECORD})) : {division})"
