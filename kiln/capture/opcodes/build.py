"""Building and taking apart containers: BUILD_*, LIST_APPEND/EXTEND, MAP_ADD, DICT_UPDATE/MERGE,
UNPACK_SEQUENCE/EX, FORMAT_VALUE and BUILD_STRING.

Containers hold tracked values; strings are built at trace time from constants only (formatting a
tensor is a graph break). Corresponds to the BUILD_*/UNPACK_* handlers of
torch/_dynamo/symbolic_convert.py.
"""
from __future__ import annotations

import dis
import enum
import types
from typing import TYPE_CHECKING, Any, Callable

import torch

from kiln.capture.code import oparg
from kiln.capture.opcodes.table import opcode
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable, DeferredTextVariable
from kiln.capture.variables.dict import DictVariable, pairs_of
from kiln.capture.variables.sets import SetVariable
from kiln.capture.variables.sequence import ListVariable, TupleVariable
from kiln.capture.variables.slice import SliceVariable
from kiln.capture.variables.symint import SymIntVariable
from kiln.capture.variables.number_builtins import number_value, text_of
from kiln.capture.variables.exception import ExceptionVariable
from kiln.capture.variables.user_object import NewObjectVariable, ObjectVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


@opcode
def BUILD_TUPLE(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(TupleVariable(tx.popn(oparg(instr))))


@opcode
def BUILD_LIST(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(ListVariable(tx.popn(oparg(instr))))


@opcode
def BUILD_SET(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(SetVariable.built(tx, tx.popn(oparg(instr))))


@opcode
def BUILD_MAP(tx: "Tracer", instr: dis.Instruction) -> None:
    items = tx.popn(2 * oparg(instr))
    made = DictVariable({})  # {k: v, ...} stores each pair in order, as `made[k] = v` does
    for i in range(0, len(items), 2):
        made.items[made._key(tx, items[i], write=True)] = items[i + 1]
    tx.push(made)


@opcode
def BUILD_CONST_KEY_MAP(tx: "Tracer", instr: dis.Instruction) -> None:
    keys = tx.pop().as_constant()
    values = tx.popn(oparg(instr))
    tx.push(DictVariable(dict(zip(keys, values))))


@opcode
def BUILD_SLICE(tx: "Tracer", instr: dis.Instruction) -> None:
    parts = tx.popn(oparg(instr))
    if len(parts) == 2:
        parts.append(ConstantVariable(None))
    tx.push(SliceVariable(*parts))


@opcode
def LIST_APPEND(tx: "Tracer", instr: dis.Instruction) -> None:
    value = tx.pop()
    tx.stack[-oparg(instr)].call_method(tx, "append", [value], {})


@opcode
def LIST_EXTEND(tx: "Tracer", instr: dis.Instruction) -> None:
    value = tx.pop()
    tx.stack[-oparg(instr)].call_method(tx, "extend", [value], {})


@opcode
def SET_ADD(tx: "Tracer", instr: dis.Instruction) -> None:
    value = tx.pop()
    tx.stack[-oparg(instr)].call_method(tx, "add", [value], {})


@opcode
def SET_UPDATE(tx: "Tracer", instr: dis.Instruction) -> None:
    value = tx.pop()
    tx.stack[-oparg(instr)].call_method(tx, "update", [value], {})  # CPython's set_update: a set merges


@opcode
def MAP_ADD(tx: "Tracer", instr: dis.Instruction) -> None:
    value = tx.pop()
    key = tx.pop()
    tx.stack[-oparg(instr)].call_method(tx, "__setitem__", [key, value], {})


@opcode
def DICT_UPDATE(tx: "Tracer", instr: dis.Instruction) -> None:
    value = tx.pop()
    tx.stack[-oparg(instr)].call_method(tx, "update", [value], {})


@opcode
def DICT_MERGE(tx: "Tracer", instr: dis.Instruction) -> None:
    value = tx.pop()
    target = tx.stack[-oparg(instr)]
    assert isinstance(target, DictVariable)  # the map BUILD_MAP made for this call's keywords
    new = pairs_of(tx, value)
    if set(new) & set(target.items):
        raise Unsupported("duplicate keyword argument in ** (raised natively)", kind="unsupported")
    target.items.update(new)


@opcode
def LIST_TO_TUPLE(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(TupleVariable(tx.iterate(tx.pop())))  # the list BUILD_LIST and LIST_EXTEND made


@opcode
def UNPACK_SEQUENCE(tx: "Tracer", instr: dis.Instruction) -> None:
    items, count = tx.iterate(tx.pop()), oparg(instr)
    if len(items) != count:
        raise Unsupported(f"unpacking {len(items)} values into {count} (raised natively)", kind="unsupported")
    for item in reversed(items):
        tx.push(item)


@opcode
def UNPACK_EX(tx: "Tracer", instr: dis.Instruction) -> None:
    before, after = oparg(instr) & 0xFF, oparg(instr) >> 8
    items = tx.iterate(tx.pop())
    if len(items) < before + after:
        raise Unsupported("not enough values to unpack (raised natively)", kind="unsupported")
    middle = ListVariable(items[before: len(items) - after])
    for item in reversed(items[len(items) - after:]):
        tx.push(item)
    tx.push(middle)
    for item in reversed(items[:before]):
        tx.push(item)


@opcode
def FORMAT_VALUE(tx: "Tracer", instr: dis.Instruction) -> None:
    flags = oparg(instr)
    spec = tx.pop().as_constant() if flags & 0x04 else ""
    value_var = tx.pop()
    number = number_value(value_var)
    if number is not None and not value_var.is_constant():
        conversion = flags & 0x03
        converters: dict[int, Callable[[Any], str]] = {1: str, 2: repr, 3: ascii}
        convert = converters.get(conversion)
        def formatted() -> str:
            with tx.output.shape_env.because(_SIZE_TEXT):
                value = number()
            return format(convert(value) if convert else value, spec)

        def render(glue: "GlueBuilder") -> str:
            value = glue.reconstruct(value_var)
            if convert is not None:
                value = f"{glue.constant(convert)}({value})"
            return f"{glue.constant(format)}({value}, {spec!r})"
        tx.push(DeferredTextVariable(formatted, render))
        return
    if value_var.is_constant():
        value = value_var.as_constant()
    elif isinstance(value_var, ObjectVariable) and isinstance(value_var.value, (type, types.ModuleType, enum.Enum)):
        value = value_var.value
    elif isinstance(value_var, (ObjectVariable, NewObjectVariable, ExceptionVariable)):
        # a user object's (or exception's) own __str__/__repr__/__format__, inlined
        conversion = flags & 0x03
        name = {1: "__str__", 2: "__repr__", 3: "__repr__"}.get(conversion, "__format__")
        text = text_of(tx, value_var, name, "" if conversion else spec).as_constant()
        if conversion == 3:
            text = text.encode("ascii", "backslashreplace").decode("ascii")  # ascii(): the repr, escaped
        tx.push(ConstantVariable(format(text, spec) if conversion else text))
        return
    else:
        raise Unsupported(f"formatting {value_var.describe()} into a string", kind="format_tensor")
    conversion = flags & 0x03
    if conversion == 1:
        value = str(value)
    elif conversion == 2:
        value = repr(value)
    elif conversion == 3:
        value = ascii(value)
    tx.push(ConstantVariable(format(value, spec)))


@opcode
def BUILD_STRING(tx: "Tracer", instr: dis.Instruction) -> None:
    parts = tx.popn(oparg(instr))
    if any(isinstance(p, DeferredTextVariable) for p in parts):
        def render(glue: "GlueBuilder") -> str:
            return "(" + " + ".join(glue.reconstruct(p) for p in parts) + ")"
        tx.push(DeferredTextVariable(lambda: "".join(p.as_constant() for p in parts), render))
        return
    tx.push(ConstantVariable("".join(p.as_constant() for p in parts)))


# Why a size formatted into a string read by the trace or the glue is guarded by value (torch.compile
# formats it after its graph, in its glue, so its graph keeps the size symbolic)
_SIZE_TEXT = "a string formatted from the size needs its value (one graph per value)"
