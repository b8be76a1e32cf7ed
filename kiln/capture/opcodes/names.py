"""Loading and storing names: locals, constants, globals, closure cells, attributes, imports.

Locals live in the tracer's symbolic locals; globals are read from the function's module (guarded
through their `G[...]` source) and written through the side-effect log; cells are CellVariables.
Corresponds to the LOAD_*/STORE_* handlers of torch/_dynamo/symbolic_convert.py.
"""
from __future__ import annotations

import builtins
import dis
from typing import TYPE_CHECKING

from kiln.capture.opcodes.table import opcode
from kiln.capture.variables.attribute_deletion import delete_attribute
from kiln.capture.variables.base import NullVariable
from kiln.capture.variables.functions import CellVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer


@opcode
def LOAD_FAST(tx: "Tracer", instr: dis.Instruction) -> None:
    name = instr.argval
    if name in tx.lazy_locals and name not in tx.locals and tx.ip + 1 < len(tx.instructions):
        at = tx.ip + 1
        if tx.instructions[at].opname == "JUMP_FORWARD":  # a resume's prologue jumps into the body
            at = tx.index_of[tx.instructions[at].argval]
        following = tx.instructions[at]
        if following.opname == "STORE_FAST" and following.offset != tx.stop_offset:
            # `a = b` of a value the trace has not read (a resume function storing the result of
            # the break's call, or moving a passed local): the copy stays unread too, so nothing
            # is guarded on it before it is used (a bool that only travels on to the next break)
            target = following.argval
            tx.locals.pop(target, None)
            tx.lazy_locals[target] = tx.lazy_locals[name]
            tx.lazy_sources[target] = tx.lazy_sources.get(name, name)
            tx.next_ip = at + 1
            return
    tx.push(tx.read_local(name))


@opcode
def STORE_FAST(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.lazy_locals.pop(instr.argval, None)
    tx.lazy_sources.pop(instr.argval, None)
    tx.locals[instr.argval] = tx.pop()


@opcode
def DELETE_FAST(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.lazy_locals.pop(instr.argval, None)
    tx.lazy_sources.pop(instr.argval, None)
    tx.locals.pop(instr.argval, None)


@opcode
def LOAD_CONST(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(tx.wrap_result(instr.argval))


@opcode
def LOAD_GLOBAL(tx: "Tracer", instr: dis.Instruction) -> None:
    if (instr.arg or 0) & 1:  # LOAD_GLOBAL always has an arg; its low bit asks for a NULL first
        tx.push(NullVariable())
    tx.push(tx.load_global(instr.argval))


@opcode
def STORE_GLOBAL(tx: "Tracer", instr: dis.Instruction) -> None:
    source = tx.global_source(instr.argval)
    if source is None:
        raise Unsupported(f"writing global {instr.argval!r} of code with private globals", kind="unsupported")
    tx.side_effects.store_global(source, tx.pop())


@opcode
def MAKE_CELL(tx: "Tracer", instr: dis.Instruction) -> None:
    # An argument captured by an inner function starts as a local and becomes a cell here.
    name = instr.argval
    bound = name in tx.locals or name in tx.lazy_locals
    value = tx.read_local(name) if bound else None
    tx.locals.pop(name, None)
    tx.cells[name] = CellVariable(value)


@opcode
def COPY_FREE_VARS(tx: "Tracer", instr: dis.Instruction) -> None:
    pass  # the tracer installed the closure's cells when it set up the frame


@opcode
def LOAD_CLOSURE(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(tx.cells[instr.argval])


@opcode
def LOAD_DEREF(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(tx.cells[instr.argval].load(tx))


@opcode
def STORE_DEREF(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.cells[instr.argval].store(tx, tx.pop())


@opcode
def LOAD_CLASSDEREF(tx: "Tracer", instr: dis.Instruction) -> None:
    LOAD_DEREF(tx, instr)


@opcode
def LOAD_ATTR(tx: "Tracer", instr: dis.Instruction) -> None:
    obj = tx.pop()
    tx.push(tx.getattr(obj, instr.argval))


@opcode
def LOAD_METHOD(tx: "Tracer", instr: dis.Instruction) -> None:
    # CPython pushes (method, self) or (NULL, bound); the tracer always takes the second shape.
    obj = tx.pop()
    tx.push(NullVariable())
    tx.push(tx.getattr(obj, instr.argval))


@opcode
def STORE_ATTR(tx: "Tracer", instr: dis.Instruction) -> None:
    obj = tx.pop()
    value = tx.pop()
    tx.setattr(obj, instr.argval, value)


@opcode
def DELETE_ATTR(tx: "Tracer", instr: dis.Instruction) -> None:
    delete_attribute(tx, tx.pop(), instr.argval)


@opcode
def IMPORT_NAME(tx: "Tracer", instr: dis.Instruction) -> None:
    fromlist = tx.pop().as_constant()
    level = tx.pop().as_constant()
    module = builtins.__import__(instr.argval, tx.f_globals, None, fromlist, level)
    tx.push(tx.wrap_result(module))


@opcode
def IMPORT_FROM(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(tx.getattr(tx.stack[-1], instr.argval))
