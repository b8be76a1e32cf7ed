"""Structural pattern matching (`match` / `case`): MATCH_SEQUENCE, MATCH_MAPPING, GET_LEN, MATCH_KEYS, MATCH_CLASS.

CPython compiles a `case` into type tests and reads of the subject; the tracer answers the type
tests from the subject's Python type (which its Variable guards, as `isinstance` relies on) and does
the reads with its own `len`, membership, subscript and attribute rules, so a `match` on
arguments, containers and objects known at trace time stays in the graph and each case's guards
are those of the reads it made. Corresponds to the MATCH_* handlers of torch/_dynamo/symbolic_convert.py.
"""
from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from kiln.capture.code import oparg
from kiln.capture.opcodes.table import opcode
from kiln.capture.variables.base import Variable
from kiln.capture.variables.builtin import BuiltinVariable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.dict import DictVariable
from kiln.capture.variables.operators import contains, subscript
from kiln.capture.variables.sequence import TupleVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

# type flags CPython's own MATCH_* instructions test (Include/object.h)
SEQUENCE_FLAG = 1 << 5  # Py_TPFLAGS_SEQUENCE: list, tuple, range, deque, Sequence subclasses and registrants
MAPPING_FLAG = 1 << 6  # Py_TPFLAGS_MAPPING: dict, Mapping subclasses and registrants
MATCH_SELF_FLAG = 1 << 22  # _Py_TPFLAGS_MATCH_SELF: int(x), str(x) ... match the subject itself


@opcode
def MATCH_SEQUENCE(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(ConstantVariable(bool(tx.stack[-1].python_type().__flags__ & SEQUENCE_FLAG)))


@opcode
def MATCH_MAPPING(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(ConstantVariable(bool(tx.stack[-1].python_type().__flags__ & MAPPING_FLAG)))


@opcode
def GET_LEN(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(tx.call(BuiltinVariable(len), [tx.stack[-1]], {}))


@opcode
def MATCH_KEYS(tx: "Tracer", instr: dis.Instruction) -> None:
    """Push the values of the keys (a tuple) when the subject has them all, else None."""
    keys, subject = tx.stack[-1], tx.stack[-2]
    if not isinstance(subject, DictVariable):
        # CPython calls the mapping's own `get`; a user mapping's is not run here
        raise Unsupported(f"a mapping pattern matched against {subject.describe()}", kind="unsupported")
    values: list[Variable] = []
    for key in _items(keys):
        if not contains(tx, subject, key):
            tx.push(ConstantVariable(None))
            return
        values.append(subscript(tx, subject, key))
    tx.push(TupleVariable(values))


@opcode
def MATCH_CLASS(tx: "Tracer", instr: dis.Instruction) -> None:
    """`case C(p0, p1, k=p)`: the subject's attributes the patterns match (a tuple), or None when the
    subject is not a C or lacks one of them. A malformed pattern (CPython's TypeErrors) is left to
    eager: the frame breaks there and CPython raises its own error."""
    names = tx.pop().as_constant()
    cls_var = tx.pop()
    subject = tx.pop()
    cls = cls_var.as_python_value()
    if not isinstance(cls, type):
        raise _malformed("called match pattern must be a class")
    if not issubclass(subject.python_type(), cls):
        tx.push(ConstantVariable(None))
        return
    count = oparg(instr)
    attributes: list[Variable] = []
    wanted: list[str] = []
    if count:
        if _has_match_args(tx, cls_var, cls):
            match_args = tx.getattr(cls_var, "__match_args__").as_constant()
            if type(match_args) is not tuple:
                raise _malformed(f"{cls.__name__}.__match_args__ must be a tuple (got {type(match_args).__name__})")
            match_self = False
        else:
            match_args, match_self = (), bool(cls.__flags__ & MATCH_SELF_FLAG)
        allowed = 1 if match_self else len(match_args)
        if allowed < count:
            plural = "" if allowed == 1 else "s"
            raise _malformed(f"{cls.__name__}() accepts {allowed} positional sub-pattern{plural} ({count} given)")
        if match_self:
            attributes.append(subject)
        else:
            for name in match_args[:count]:
                if not isinstance(name, str):
                    raise _malformed(f"__match_args__ elements must be strings (got {type(name).__name__})")
                wanted.append(name)
    wanted.extend(names)
    seen: set[str] = set()
    for name in wanted:
        if name in seen:
            raise _malformed(f"{cls.__name__}() got multiple sub-patterns for attribute {name!r}")
        seen.add(name)
        if not tx.has_attr(subject, name):
            tx.push(ConstantVariable(None))
            return
        attributes.append(tx.getattr(subject, name))
    tx.push(TupleVariable(attributes))


def _has_match_args(tx: "Tracer", cls_var: Variable, cls: type) -> bool:
    """Whether the class defines `__match_args__`; a builtin type's attributes are fixed: asked of it."""
    if isinstance(cls_var, BuiltinVariable):
        return hasattr(cls, "__match_args__")
    return tx.has_attr(cls_var, "__match_args__")


def _items(keys: Variable) -> list[Variable]:
    """The keys of a mapping pattern: a constant tuple (literal keys) or a built one (value patterns)."""
    if isinstance(keys, TupleVariable):
        return list(keys.items)
    return [ConstantVariable(k) for k in keys.as_constant()]


def _malformed(why: str) -> Unsupported:
    return Unsupported(f"a class pattern CPython rejects: {why}", kind="unsupported")
