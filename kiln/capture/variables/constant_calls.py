"""Library calls that compute an immutable value from constants, answered at trace time.

`bytes([1, 2])`, `bytes("é", "utf-8")`, `int.from_bytes(b"..", "big")`, `bytes.fromhex("0a")`,
`struct.pack("<if", 3, 1.5)`, `struct.unpack(">H", b"..")`, `struct.calcsize(...)`: C functions
capture cannot run on traced values, but on constants (literals, lists and tuples of them) their
result is a constant too (bytes, an int, a tuple), the same in every call the guards admit. The
call is made once, at trace time; an error it raises is eager's to raise, so it stays a graph break
there (the real call then raises it).
"""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Sequence

from kiln.capture.trace_rules import builtin_rule
from kiln.capture.variables.constant import ConstantVariable, is_constant_value
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.base import Variable

# `int.from_bytes` is a new object per read, equal (and hashing equal) to every other read of it
_FUNCTIONS = (bytes, struct.pack, struct.unpack, struct.calcsize, struct.unpack_from, int.from_bytes,
              bytes.fromhex, bytes.maketrans)
_RESULTS = (bytes, int, tuple, dict)


def _literal(value: Any) -> bool:
    return is_constant_value(value) or type(value) in (list, tuple) and all(_literal(v) for v in value)


def _plain(var: "Variable") -> tuple[bool, Any]:
    """The value of a constant argument, a list or tuple of constants read as a list or tuple."""
    from kiln.capture.variables.sequence import ListVariable, TupleVariable

    if var.is_constant():
        value = var.as_constant()
        return _literal(value), value
    if isinstance(var, (ListVariable, TupleVariable)) and type(var) in (ListVariable, TupleVariable):
        items = [_plain(v) for v in var.items]
        if all(ok for ok, _ in items):
            values = [v for _, v in items]
            return True, (values if isinstance(var, ListVariable) else tuple(values))
    return False, None


def fold_constant_call(tx: "Tracer", obj: Any, args: Sequence["Variable"], kwargs: dict[str, "Variable"]
                       ) -> "Variable | None":
    """The call's result as a constant; None where an argument is not one (the call stays a break)."""
    read = [_plain(a) for a in args]
    named = {k: _plain(v) for k, v in kwargs.items()}
    if not all(ok for ok, _ in read) or not all(ok for ok, _ in named.values()):
        return None
    try:
        value = obj(*[v for _, v in read], **{k: v for k, (_, v) in named.items()})
    except Exception as exc:  # noqa: BLE001 - eager's error, raised by the real call at the break
        raise Unsupported(f"{getattr(obj, '__qualname__', obj)}() raised {type(exc).__name__} on these constants",
                          kind="unsupported_call") from exc
    if type(value) not in _RESULTS:
        return None
    return tx.wrap_result(value)


def _rule(fn: Any) -> Any:
    def constant_call_rule(tx: "Tracer", args: list["Variable"], kwargs: dict[str, "Variable"]) -> "Variable":
        folded = fold_constant_call(tx, fn, args, kwargs)
        if folded is None:
            raise Unsupported(f"{getattr(fn, '__qualname__', fn)}() on values known only at run time",
                              kind="unsupported_call")
        return folded
    return constant_call_rule


for _fn in _FUNCTIONS:
    builtin_rule(_fn)(_rule(_fn))


def constant_element(value: Any) -> bool:
    """A set element Kiln holds as a constant: a literal, or a plain tuple of such (hashable, with
    the same hash and equality in every process; its place in the set's table is guarded)."""
    return is_constant_value(value) or type(value) is tuple and all(constant_element(v) for v in value)


def constant_element_var(value: Any) -> "Variable":
    from kiln.capture.variables.sequence import TupleVariable

    if type(value) is tuple:
        return TupleVariable([constant_element_var(v) for v in value])
    return ConstantVariable(value)
