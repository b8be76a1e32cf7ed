"""Stack shuffling and no-op opcodes: POP_TOP, COPY, SWAP, PUSH_NULL, NOP, RESUME, PRECALL, ...

These move tracked values around without looking at them. Corresponds to the trivial handlers of
torch/_dynamo/symbolic_convert.py.
"""
from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from kiln.capture.code import oparg
from kiln.capture.opcodes.table import opcode
from kiln.capture.variables.base import NullVariable

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer


@opcode
def NOP(tx: "Tracer", instr: dis.Instruction) -> None:
    pass


@opcode
def RESUME(tx: "Tracer", instr: dis.Instruction) -> None:
    pass


@opcode
def CACHE(tx: "Tracer", instr: dis.Instruction) -> None:
    pass


@opcode
def EXTENDED_ARG(tx: "Tracer", instr: dis.Instruction) -> None:
    pass  # dis folds it into the next instruction's argument


@opcode
def PRECALL(tx: "Tracer", instr: dis.Instruction) -> None:
    pass  # 3.11 specialization hook; CALL does the work


@opcode
def POP_TOP(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.pop()


@opcode
def PUSH_NULL(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(NullVariable())


@opcode
def COPY(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(tx.stack[-oparg(instr)])


@opcode
def SWAP(tx: "Tracer", instr: dis.Instruction) -> None:
    i = oparg(instr)
    tx.stack[-1], tx.stack[-i] = tx.stack[-i], tx.stack[-1]
