"""The instructions the glue can run natively as one Python statement when they are the break
(kiln/capture/glue.py): each one's count of values popped and pushed, and its statement over the
expressions of the popped values."""
from __future__ import annotations

import dis
from typing import Callable

from kiln.capture import code as code_mod

_COMPARE_TEXT = {"<": "<", "<=": "<=", "==": "==", "!=": "!=", ">": ">", ">=": ">="}


def _format_value(ins: dis.Instruction, args: list[str]) -> str:
    flags = code_mod.oparg(ins)
    conversion = {0: "", 1: "str", 2: "repr", 3: "ascii"}[flags & 0x03]
    value = f"{conversion}({args[0]})" if conversion else args[0]
    return f"format({value}, {args[1]})" if flags & 0x04 else f"format({value})"


# Instructions the glue can run natively as one Python statement when they are the break:
# name -> (values popped, values pushed, the statement over the popped values' expressions).
NATIVE_INSTRUCTIONS: dict[str, tuple[Callable[[dis.Instruction], int], int, Callable[[dis.Instruction, list[str]], str]]] = {
    "BINARY_SUBSCR": (lambda i: 2, 1, lambda i, a: f"{a[0]}[{a[1]}]"),
    "BINARY_OP": (lambda i: 2, 1, lambda i, a: f"{a[0]} {i.argrepr.rstrip('=')} {a[1]}"),
    "COMPARE_OP": (lambda i: 2, 1, lambda i, a: f"{a[0]} {_COMPARE_TEXT[i.argval]} {a[1]}"),
    "CONTAINS_OP": (lambda i: 2, 1, lambda i, a: f"{a[0]} {'not in' if i.arg else 'in'} {a[1]}"),
    "UNARY_NEGATIVE": (lambda i: 1, 1, lambda i, a: f"-{a[0]}"),
    "UNARY_POSITIVE": (lambda i: 1, 1, lambda i, a: f"+{a[0]}"),
    "UNARY_INVERT": (lambda i: 1, 1, lambda i, a: f"~{a[0]}"),
    "UNARY_NOT": (lambda i: 1, 1, lambda i, a: f"not {a[0]}"),
    "LOAD_ATTR": (lambda i: 1, 1, lambda i, a: f"{a[0]}.{i.argval}"),
    "GET_ITER": (lambda i: 1, 1, lambda i, a: f"iter({a[0]})"),
    "FORMAT_VALUE": (lambda i: 2 if code_mod.oparg(i) & 0x04 else 1, 1, _format_value),
    "STORE_SUBSCR": (lambda i: 3, 0, lambda i, a: f"{a[1]}[{a[2]}] = {a[0]}"),
    "STORE_ATTR": (lambda i: 2, 0, lambda i, a: f"{a[1]}.{i.argval} = {a[0]}"),
    # An exception the frame raises and does not catch: raised by the glue (nothing resumes).
    "RAISE_VARARGS": (lambda i: code_mod.oparg(i), 0, lambda i, a: " ".join(["raise", *a[:1], *(["from", a[1]] if len(a) > 1 else [])])),
}
