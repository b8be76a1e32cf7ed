"""The operator opcodes: BINARY_OP, COMPARE_OP, IS_OP, CONTAINS_OP, UNARY_*, subscripting.

Each pops its operands and pushes what the operator gives; the operators themselves (what `+`,
`<`, `in`, `is` and `[]` mean on each kind of value) are variables/operators.py, which the kinds
reach through the tracer. Corresponds to the operator handlers of torch/_dynamo/symbolic_convert.py.
"""
from __future__ import annotations

import dis
import operator
from typing import TYPE_CHECKING

from kiln.capture.opcodes.table import opcode
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.operators import binary_op, compare_op, contains, identity, subscript, unary_op
from kiln.capture.variables.tensor import TensorVariable

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer


@opcode
def BINARY_OP(tx: "Tracer", instr: dis.Instruction) -> None:
    b = tx.pop()
    a = tx.pop()
    symbol = instr.argrepr
    inplace = symbol.endswith("=")
    tx.push(binary_op(tx, symbol.rstrip("=") if inplace else symbol, a, b, inplace))


@opcode
def COMPARE_OP(tx: "Tracer", instr: dis.Instruction) -> None:
    b = tx.pop()
    a = tx.pop()
    tx.push(compare_op(tx, instr.argval, a, b))


@opcode
def IS_OP(tx: "Tracer", instr: dis.Instruction) -> None:
    b = tx.pop()
    a = tx.pop()
    tx.push(ConstantVariable(identity(a, b) != bool(instr.arg)))


@opcode
def CONTAINS_OP(tx: "Tracer", instr: dis.Instruction) -> None:
    container = tx.pop()
    item = tx.pop()
    tx.push(ConstantVariable(contains(tx, container, item) != bool(instr.arg)))


@opcode
def UNARY_NEGATIVE(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(unary_op(tx, operator.neg, tx.pop()))


@opcode
def UNARY_POSITIVE(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(unary_op(tx, operator.pos, tx.pop()))


@opcode
def UNARY_INVERT(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(unary_op(tx, operator.invert, tx.pop()))


@opcode
def UNARY_NOT(tx: "Tracer", instr: dis.Instruction) -> None:
    value = tx.pop()
    tx.push(ConstantVariable(not value.truth(tx)))


@opcode
def BINARY_SUBSCR(tx: "Tracer", instr: dis.Instruction) -> None:
    key = tx.pop()
    obj = tx.pop()
    tx.push(subscript(tx, obj, key))


@opcode
def STORE_SUBSCR(tx: "Tracer", instr: dis.Instruction) -> None:
    key = tx.pop()
    obj = tx.pop()
    value = tx.pop()
    if isinstance(obj, TensorVariable):
        tx.call_op("call_function", operator.setitem, [obj, key, value], {})
        return
    obj.call_method(tx, "__setitem__", [key, value], {})


@opcode
def DELETE_SUBSCR(tx: "Tracer", instr: dis.Instruction) -> None:
    key = tx.pop()
    obj = tx.pop()
    obj.call_method(tx, "__delitem__", [key], {})
