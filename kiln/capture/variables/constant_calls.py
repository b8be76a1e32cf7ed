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

from kiln.capture.variables.constant import is_constant_value
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.base import Variable

# the functions, and the class methods by (class, name): `int.from_bytes` is a new object per read
_FUNCTIONS = (bytes, struct.pack, struct.unpack, struct.calcsize, struct.unpack_from)
_CLASS_METHODS = {(int, "from_bytes"), (bytes, "fromhex"), (bytes, "maketrans"), (str, "maketrans")}
_RESULTS = (bytes, int, tuple, dict)


def folds_on_constants(obj: Any) -> bool:
    if any(obj is fn for fn in _FUNCTIONS):
        return True
    owner = getattr(obj, "__self__", None)
    return isinstance(owner, type) and (owner, getattr(obj, "__name__", None)) in _CLASS_METHODS


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
