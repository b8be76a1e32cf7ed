"""The opcode table itself: `OPCODES` (opcode name -> handler) and the `@opcode` decorator that fills it.

The handler families (names, stack, calls, build, operations, control, exceptions, matching) import
this module to register themselves; the package `kiln.capture.opcodes` imports every family, so
importing the package fills the table. Kept apart from the package so that a family never imports the package that
imports it.
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
