"""Exception opcodes: RAISE_VARARGS, PUSH_EXC_INFO, POP_EXCEPT, CHECK_EXC_MATCH, RERAISE, WITH_EXCEPT_START.

CPython 3.11 has no block stack: a raising instruction is looked up in the code's exception table
and the handler's code does the rest with these opcodes. The tracer runs them over the exception
Variable (kiln/capture/variables/exception.py), so a `try/except/finally` or a `with` block whose
exception is raised and caught inside the frame stays in the graph. A raise that no traced frame
catches is a graph break where it was raised. Corresponds to the exception handlers of
torch/_dynamo/symbolic_convert.py.
"""
from __future__ import annotations

import dis
from typing import TYPE_CHECKING

from kiln.capture.opcodes.table import opcode
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.exception import (
    ExceptionVariable,
    RaisedInTrace,
    as_exception,
    exception_matches,
    handled_exception,
    raise_in_trace,
)
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.base import Variable


def exception_cause(tx: "Tracer", cause: Variable) -> Variable:
    """What `raise X from cause` stores in X.__cause__: None, an exception, or a new instance of an
    exception class; anything else is the TypeError CPython raises there."""
    if isinstance(cause, ExceptionVariable) or cause.is_constant() and cause.as_constant() is None:
        return cause
    try:
        real = cause.as_python_value()
    except Unsupported:  # not known at trace time: as_exception says what it cannot raise
        return as_exception(tx, cause)
    if isinstance(real, type) and issubclass(real, BaseException):
        return as_exception(tx, cause)
    error = TypeError("exception causes must derive from BaseException")
    raise raise_in_trace(error, f"TypeError: {error} (raised natively)")


@opcode
def RAISE_VARARGS(tx: "Tracer", instr: dis.Instruction) -> None:
    reason = "{} raised in the frame and not caught there (raised natively)"
    if instr.arg == 0:
        exc = handled_exception(tx)
        if not isinstance(exc, ExceptionVariable):
            raise Unsupported("a bare `raise` with no exception being handled (raised natively)", kind="unsupported")
        raise RaisedInTrace(exc, reason.format(exc.exc_type.__name__), reraised=True)
    cause = tx.pop() if instr.arg == 2 else None
    exc = as_exception(tx, tx.pop())
    if cause is not None:  # `raise X from Y`: Y, or a new Y() when Y is an exception class
        exc.set_cause(exception_cause(tx, cause))
    raise RaisedInTrace(exc, reason.format(exc.exc_type.__name__))


@opcode
def PUSH_EXC_INFO(tx: "Tracer", instr: dis.Instruction) -> None:
    exc = tx.pop()
    tx.push(tx.handled[-1] if tx.handled else ConstantVariable(None))
    tx.push(exc)
    tx.handled.append(exc)


@opcode
def POP_EXCEPT(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.pop()  # the exception handled before this handler, restored as the current one
    if tx.handled:
        tx.handled.pop()


@opcode
def CHECK_EXC_MATCH(tx: "Tracer", instr: dis.Instruction) -> None:
    match = tx.pop()
    tx.push(ConstantVariable(exception_matches(tx.stack[-1], match)))


@opcode
def RERAISE(tx: "Tracer", instr: dis.Instruction) -> None:
    exc = tx.pop()
    if instr.arg:
        tx.pop()  # the offset of the instruction that first raised (only the traceback uses it)
    if not isinstance(exc, ExceptionVariable):
        raise Unsupported(f"re-raising {exc.describe()}", kind="unsupported")
    raise RaisedInTrace(exc, f"{exc.exc_type.__name__} raised in the frame and not caught there (raised natively)",
                        reraised=True)


@opcode
def WITH_EXCEPT_START(tx: "Tracer", instr: dis.Instruction) -> None:
    # Stack: exit function, lasti, previous exception, exception. `__exit__(type, value, traceback)`.
    exc = tx.stack[-1]
    exit_fn = tx.stack[-4]
    # the traceback is not None: the exception was raised (a manager's __exit__ may test `tb is None`)
    tb = exc.traceback_variable() if isinstance(exc, ExceptionVariable) else ConstantVariable(None)
    args = [tx.wrap_result(exc.python_type()), exc, tb]
    tx.push(tx.call(exit_fn, args, {}))
