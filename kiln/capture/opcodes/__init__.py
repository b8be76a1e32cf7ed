"""The opcode table: one handler per CPython 3.11 opcode the tracer can run symbolically.

Handlers are plain functions `handler(tx, instr)` registered with `@opcode`, which checks that the
function's name is an opcode of this interpreter (`dis.opmap`). The families live in sibling
modules (names, stack, calls, build, operators, control, exceptions, matching); importing this package fills the table.
An opcode without a handler is an unsupported instruction (a graph break or an eager frame).
Corresponds to the handler methods of torch/_dynamo/symbolic_convert.py.
"""
from __future__ import annotations

import dis
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

Handler = Callable[["Tracer", dis.Instruction], None]
OPCODES: dict[str, Handler] = {}


def opcode(fn: Handler) -> Handler:
    """Register `fn` as the handler of the opcode it is named after."""
    name = fn.__name__
    if name not in dis.opmap:
        raise ValueError(f"{name} is not an opcode of this Python ({sorted(dis.opmap)[:5]}...)")
    if name in OPCODES:
        raise ValueError(f"opcode {name} already has a handler")
    OPCODES[name] = fn
    return fn


from kiln.capture.opcodes import build, calls, control, exceptions, matching, names, operators, stack  # noqa: E402,F401

__all__ = ["OPCODES", "opcode"]
