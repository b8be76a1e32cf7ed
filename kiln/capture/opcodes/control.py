"""Control flow: jumps, loops (GET_ITER/FOR_ITER, unrolled), with-blocks, return, raise.

A conditional jump on a trace-time value just picks a side; on a tensor it is a data-dependent
branch (a graph break with a resume function for each side). Loops are unrolled because their
iterators are known. `with` enters the managers of context_manager.py (grad mode, autocast,
Python classes, @contextlib.contextmanager); raising and handling exceptions is exceptions.py.
Corresponds to the jump/iteration handlers of torch/_dynamo/symbolic_convert.py.
"""
from __future__ import annotations

import contextlib
import dis
import inspect
import types
from typing import TYPE_CHECKING

from torch.overrides import TorchFunctionMode
from torch.utils._device import DeviceContext
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.capture.deferred_checks import deferred_branch
from kiln.capture.opcodes.table import opcode
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.generator import send_to
from kiln.capture.variables.context_manager import (
    AutocastVariable,
    ContextExitVariable,
    GeneratorContextVariable,
    GeneratorYielded,
    LOCK_TYPES,
    LockExitVariable,
    ProfilerRangeVariable,
)
from kiln.capture.variables.functions import UserMethodVariable
from kiln.capture.variables.grad_mode import GradModeVariable, WithExitVariable
from kiln.capture.variables.iterator import IteratorVariable, open_iterator
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

# Managers whose __enter__ switches process state that the block's native code must see
_ENTERED_NATIVELY: tuple[type, ...] = (contextlib.redirect_stdout, contextlib.redirect_stderr, contextlib.chdir)


@opcode
def RETURN_VALUE(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.returned = tx.pop()


@opcode
def JUMP_FORWARD(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.jump(instr.argval)


@opcode
def JUMP_BACKWARD(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.jump(instr.argval)


@opcode
def JUMP_BACKWARD_NO_INTERRUPT(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.jump(instr.argval)


def _pop_jump_if(tx: "Tracer", instr: dis.Instruction, when: bool) -> None:
    value = tx.stack[-1]
    taken = deferred_branch(tx, value, instr, when)  # `if not ok.all(): raise ...` stays in the graph
    if taken is None:
        taken = value.truth(tx) == when  # raises (data-dependent branch) before the stack changes
    tx.pop()
    if taken:
        tx.jump(instr.argval)


def _pop_jump_if_none(tx: "Tracer", instr: dis.Instruction, when: bool) -> None:
    value = tx.pop()
    is_none = value.is_constant() and value.as_constant() is None
    if is_none == when:
        tx.jump(instr.argval)


@opcode
def POP_JUMP_FORWARD_IF_TRUE(tx: "Tracer", instr: dis.Instruction) -> None:
    _pop_jump_if(tx, instr, True)


@opcode
def POP_JUMP_FORWARD_IF_FALSE(tx: "Tracer", instr: dis.Instruction) -> None:
    _pop_jump_if(tx, instr, False)


@opcode
def POP_JUMP_BACKWARD_IF_TRUE(tx: "Tracer", instr: dis.Instruction) -> None:
    _pop_jump_if(tx, instr, True)


@opcode
def POP_JUMP_BACKWARD_IF_FALSE(tx: "Tracer", instr: dis.Instruction) -> None:
    _pop_jump_if(tx, instr, False)


@opcode
def POP_JUMP_FORWARD_IF_NONE(tx: "Tracer", instr: dis.Instruction) -> None:
    _pop_jump_if_none(tx, instr, True)


@opcode
def POP_JUMP_FORWARD_IF_NOT_NONE(tx: "Tracer", instr: dis.Instruction) -> None:
    _pop_jump_if_none(tx, instr, False)


@opcode
def POP_JUMP_BACKWARD_IF_NONE(tx: "Tracer", instr: dis.Instruction) -> None:
    _pop_jump_if_none(tx, instr, True)


@opcode
def POP_JUMP_BACKWARD_IF_NOT_NONE(tx: "Tracer", instr: dis.Instruction) -> None:
    _pop_jump_if_none(tx, instr, False)


@opcode
def JUMP_IF_TRUE_OR_POP(tx: "Tracer", instr: dis.Instruction) -> None:
    if tx.stack[-1].truth(tx):
        tx.jump(instr.argval)
    else:
        tx.pop()


@opcode
def JUMP_IF_FALSE_OR_POP(tx: "Tracer", instr: dis.Instruction) -> None:
    if not tx.stack[-1].truth(tx):
        tx.jump(instr.argval)
    else:
        tx.pop()


@opcode
def GET_ITER(tx: "Tracer", instr: dis.Instruction) -> None:
    value = tx.pop()
    tx.push(open_iterator(tx, value))


@opcode
def FOR_ITER(tx: "Tracer", instr: dis.Instruction) -> None:
    iterator = tx.stack[-1]
    if not isinstance(iterator, IteratorVariable):
        raise Unsupported(f"for-loop over {iterator.describe()}", kind="unsupported_iter")
    item = iterator.next_traced(tx)
    if item is None:
        tx.pop()
        tx.jump(instr.argval)
    else:
        tx.push(item)


@opcode
def BEFORE_WITH(tx: "Tracer", instr: dis.Instruction) -> None:
    ctx = tx.pop()
    if isinstance(ctx, GradModeVariable):
        tx.push(WithExitVariable(ctx))
        tx.push(ctx.enter(tx))
        return
    if isinstance(ctx, (AutocastVariable, GeneratorContextVariable, ProfilerRangeVariable)):
        tx.push(ContextExitVariable(ctx))
        tx.push(ctx.enter(tx))
        return
    kind = ctx.python_type()
    if kind in LOCK_TYPES:
        tx.push(LockExitVariable(ctx))
        tx.push(ConstantVariable(True))
        return
    if issubclass(kind, _ENTERED_NATIVELY):
        # redirect_stdout/redirect_stderr/chdir switch process state (sys.stdout, the working
        # directory) that native code inside the block must see: the glue enters the real manager
        # and the block resumes under it
        raise Unsupported(f"`with {kind.__name__}(...)` changes process state; it is entered natively",
                          kind="unsupported")
    if issubclass(kind, (TorchFunctionMode, TorchDispatchMode)) and not issubclass(kind, DeviceContext):
        # its __enter__ is Python, but the mode then sees every call of the block: the glue enters
        # it and the block runs natively under it (a compiled frame called there runs eagerly)
        family = "function" if issubclass(kind, TorchFunctionMode) else "dispatch"
        raise Unsupported(f"`with {kind.__qualname__}(...)`: a torch {family} mode sees every op of its block, "
                          "which runs eagerly under it", kind="torch_mode")
    enter = inspect.getattr_static(kind, "__enter__", None)
    exit_ = inspect.getattr_static(kind, "__exit__", None)
    if not (isinstance(enter, types.FunctionType) and isinstance(exit_, types.FunctionType)):
        raise Unsupported(f"`with` on {ctx.describe()} (grad-mode managers and Python classes are traced)",
                          kind="unsupported")
    # A manager written in Python: its __enter__ and __exit__ are inlined like any method.
    tx.push(UserMethodVariable(exit_, ctx))
    tx.push(UserMethodVariable(enter, ctx).call(tx, [], {}))


@opcode
def LOAD_ASSERTION_ERROR(tx: "Tracer", instr: dis.Instruction) -> None:
    tx.push(tx.wrap_result(AssertionError))


@opcode
def RETURN_GENERATOR(tx: "Tracer", instr: dis.Instruction) -> None:
    if not tx.suspend_at_yield:
        raise Unsupported("generators are not traced", kind="generator")
    tx.push(ConstantVariable(None))  # what the POP_TOP after it expects on the stack


@opcode
def YIELD_VALUE(tx: "Tracer", instr: dis.Instruction) -> None:
    if not tx.suspend_at_yield:
        raise Unsupported("yield outside an inlined generator", kind="generator")
    # paused here: resumed by the consumer's next()/send() (variables/generator.py) or by a
    # contextmanager's __exit__
    raise GeneratorYielded(tx.pop())


@opcode
def GET_YIELD_FROM_ITER(tx: "Tracer", instr: dis.Instruction) -> None:
    GET_ITER(tx, instr)


@opcode
def SEND(tx: "Tracer", instr: dis.Instruction) -> None:
    # `yield from`: the receiver's next item goes on to the YIELD_VALUE after; at its end both are
    # popped, its return value pushed, and the loop left
    value = tx.pop()
    item, result = send_to(tx, tx.stack[-1], value)
    if item is None:
        tx.pop()
        tx.push(result)
        tx.jump(instr.argval)
    else:
        tx.push(item)


