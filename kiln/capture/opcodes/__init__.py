"""The opcode table: one handler per CPython 3.11 opcode the tracer can run symbolically.

Handlers are plain functions `handler(tx, instr)` registered with `@opcode` (opcodes/table.py),
which checks that the function's name is an opcode of this interpreter (`dis.opmap`). The families live in sibling
modules (names, stack, calls, build, operations, control, exceptions, matching); importing this package fills the table.
An opcode without a handler is an unsupported instruction (a graph break or an eager frame).
Corresponds to the handler methods of torch/_dynamo/symbolic_convert.py.
"""
from __future__ import annotations

from kiln.capture.opcodes.table import OPCODES, Handler, opcode
from kiln.capture.opcodes import build, calls, control, exceptions, matching, names, operations, stack  # noqa: F401 (fills the table)

__all__ = ["OPCODES", "Handler", "opcode"]
