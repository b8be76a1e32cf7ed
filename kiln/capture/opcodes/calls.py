"""Calls and function creation: KW_NAMES, CALL, CALL_FUNCTION_EX, MAKE_FUNCTION, LOAD_BUILD_CLASS.

A call asks the callee's Variable to handle it (inline a user function, record a torch op, fold a
builtin, ...). The root tracer remembers the keyword names of the pending call, which the glue needs
when the call itself is the graph-break instruction. Corresponds to the CALL handlers of
torch/_dynamo/symbolic_convert.py.
"""
from __future__ import annotations

import builtins
import dis
from typing import TYPE_CHECKING, cast

from kiln.capture.code import oparg
from kiln.capture.opcodes.table import opcode
from kiln.capture.variables.base import NullVariable, Variable
from kiln.capture.variables.dict import DictVariable
from kiln.capture.variables.functions import CellVariable, NestedFunctionVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer


@opcode
def KW_NAMES(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.kw_names = tuple(tx.code.co_consts[oparg(instr)])


def split_call(stack_items: list[Variable], kw_names: tuple[str, ...]) -> tuple[Variable, list[Variable], dict[str, Variable]]:
    """(callable, positional args, keyword args) from the n+2 stack items of a 3.11 CALL n."""
    first, second, *args = stack_items
    if isinstance(first, NullVariable):
        fn = second
    else:
        fn, args = first, [second, *args]
    n_kw = len(kw_names)
    kwargs = dict(zip(kw_names, args[len(args) - n_kw:])) if n_kw else {}
    positional = args[: len(args) - n_kw]
    return fn, positional, kwargs


@opcode
def CALL(tx: "Tracer", instr: dis.Instruction) -> None:
    items = tx.popn(oparg(instr) + 2)
    kw_names, tx.kw_names = tx.kw_names or (), None
    fn, args, kwargs = split_call(items, kw_names)
    tx.push(tx.call(fn, args, kwargs))


@opcode
def LOAD_BUILD_CLASS(tx: "Tracer", instr: dis.Instruction) -> None:
    # a `class` statement in the frame: its CALL of __build_class__ is a graph break at that call
    # (the class is made natively by the glue, the code before and after it traced), not a frame
    # run eagerly for want of this instruction
    tx.push(tx.wrap(builtins.__build_class__, None))


@opcode
def CALL_FUNCTION_EX(tx: "Tracer", instr: dis.Instruction) -> None:
    kwargs_var = tx.pop() if oparg(instr) & 1 else None
    args_var = tx.pop()
    fn = tx.pop()
    if tx.stack and isinstance(tx.stack[-1], NullVariable):
        tx.pop()
    args = tx.iterate(args_var)
    kwargs: dict[str, Variable] = {}
    if kwargs_var is not None:
        if not isinstance(kwargs_var, DictVariable):
            raise Unsupported(f"**{kwargs_var.describe()}", kind="unsupported_call")
        kwargs = {str(k): v for k, v in kwargs_var.items.items()}
    tx.push(tx.call(fn, args, kwargs))


@opcode
def MAKE_FUNCTION(tx: "Tracer", instr: dis.Instruction) -> None:
    code = tx.pop().as_python_value()
    flags = oparg(instr)
    # the closure tuple holds what LOAD_CLOSURE pushed: cells of tx.cells
    closure = cast(list[CellVariable], tx.iterate(tx.pop())) if flags & 0x08 else None
    annotations = tx.pop() if flags & 0x04 else None  # 3.11: a tuple of names and values, alternating
    kwdefaults = {str(k): v for k, v in _map_items(tx.pop()).items()} if flags & 0x02 else {}
    defaults = tuple(tx.iterate(tx.pop())) if flags & 0x01 else ()
    made = NestedFunctionVariable(code, tx.f_globals, code.co_qualname, defaults, kwdefaults, closure)
    if annotations is not None:
        pairs = tx.iterate(annotations)
        made.special["__annotations__"] = DictVariable(
            {pairs[i].as_constant(): pairs[i + 1] for i in range(0, len(pairs), 2)})
    tx.push(made)


def _map_items(var: Variable) -> dict:
    assert isinstance(var, DictVariable)  # keyword defaults come from BUILD_MAP or BUILD_CONST_KEY_MAP
    return var.items
