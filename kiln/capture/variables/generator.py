"""Generator objects during capture: stepped one `yield` at a time, as CPython runs them.

A generator made in the frame runs its body in a child tracer paused at each `yield`
(GeneratorVariable), as CPython's frame is: `next`, `send`, `throw` and `close` resume it exactly
where eager's would, and its body and its consumer take turns. Running the body ahead to its end
instead is eager's answer only when nothing can tell the difference, and too much can: a log or a
print of the body interleaves with the consumer's, the body reads a list, dict, attribute, global,
cell or tensor the consumer changes between steps (or the reverse), a loop leaves it early, it
never ends. So every generator is stepped. A stepped generator cannot be rebuilt mid-run after a
graph break, nor returned from the frame (a clean break). Corresponds to
torch/_dynamo/variables/iter.py's generator support.
"""
from __future__ import annotations

import types
from typing import TYPE_CHECKING, Sequence

from kiln.capture import code as code_mod
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.context_manager import GeneratorYielded
from kiln.capture.variables.exception import (
    ExceptionVariable,
    RaisedInTrace,
    catch_in_frame,
    construct_exception,
    raise_in_trace,
)
from kiln.capture.variables.iterator import IteratorVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer

_METHODS = ("send", "throw", "close")


class GeneratorVariable(IteratorVariable):
    """A generator whose body runs in `frame` (a child tracer with suspend_at_yield set), paused
    at its last `yield`."""

    def __init__(self, frame: "Tracer") -> None:
        super().__init__([])
        self.frame = frame
        self.started = False
        self.finished = False
        self.result: Variable = ConstantVariable(None)  # what `return` gave: StopIteration.value

    def describe(self) -> str:
        return f"generator {self.frame.code.co_qualname} (stepped)"

    def python_type(self) -> type:
        return types.GeneratorType

    def identity(self) -> object:
        return self

    # -- stepping ------------------------------------------------------------------------------
    def _run(self) -> Variable | None:
        """Run the body to its next `yield` (its value) or its end (None)."""
        frame = self.frame
        caller = frame.state.innermost  # the tracer whose next()/send() resumed it
        try:
            self.result = frame.run()
        except GeneratorYielded as yielded:
            return yielded.value
        except RaisedInTrace as raised:
            self.finished = True
            if issubclass(raised.exception.exc_type, StopIteration):
                # PEP 479: a StopIteration escaping a generator's body is a RuntimeError from it
                error = ExceptionVariable(RuntimeError, [ConstantVariable("generator raised StopIteration")])
                error.set_cause(raised.exception)
                error.context = raised.exception
                raise RaisedInTrace(error, "RuntimeError: generator raised StopIteration (raised natively)") from None
            raise
        finally:
            frame.state.innermost = caller
        self.finished = True
        return None

    def _paused_in_yield_from(self) -> bool:
        ins = self.frame.current
        after = self.frame.next_ip
        following = self.frame.instructions[after] if after < len(self.frame.instructions) else None
        return ins is not None and ins.opname == "YIELD_VALUE" and following is not None \
            and following.opname == "RESUME" and following.arg == 2

    def paused_in_cleanup(self) -> bool:
        """Started, not finished, and paused where closing it would run code of its body."""
        ins = self.frame.current
        if not self.started or self.finished or ins is None:
            return False
        return code_mod.handler_at(self.frame.code, ins.offset) is not None or self._paused_in_yield_from()

    def resume(self, sent: Variable) -> Variable | None:
        """`gen.send(sent)` (next() sends None): the next yielded value, or None at the end. Only the
        call that ran the body to its end keeps what `return` gave (StopIteration.value); a
        finished generator stepped again stops with None, as eager's does."""
        if self.finished:
            self.result = ConstantVariable(None)
            return None
        frame = self.frame
        if not self.started:
            if not (sent.is_constant() and sent.as_constant() is None):
                error = TypeError("can't send non-None value to a just-started generator")
                raise raise_in_trace(error, f"TypeError: {error} (raised natively)")
            self.started = True
        else:
            frame.ip = frame.next_ip
            frame.push(sent)  # what the paused `yield` evaluates to
        return self._run()

    def throw(self, tx: "Tracer", exc: ExceptionVariable) -> Variable | None:
        """`gen.throw(exc)`: raised at the paused `yield`, under the body's own handlers."""
        if not self.started or self.finished:
            self.finished = True
            raise RaisedInTrace(exc)
        if self._paused_in_yield_from():
            raise Unsupported("throwing into a generator paused inside `yield from`", kind="generator")
        frame = self.frame
        if not catch_in_frame(frame, RaisedInTrace(exc)):
            self.finished = True
            raise RaisedInTrace(exc)
        frame.ip = frame.next_ip
        return self._run()

    def next_item(self) -> Variable | None:
        return self.resume(ConstantVariable(None))

    # -- the protocol --------------------------------------------------------------------------
    def stop_error(self) -> RaisedInTrace:
        """The StopIteration the step that found the generator finished raises."""
        return self._stop()

    def _stop(self) -> RaisedInTrace:
        # CPython raises a bare StopIteration() for `return None` (args == ()), StopIteration(value) else
        returned_none = self.result.is_constant() and self.result.as_constant() is None
        error = ExceptionVariable(StopIteration, [] if returned_none else [self.result])
        return RaisedInTrace(error, "StopIteration (raised natively)")

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__next__" and not args:
            item = self.next_item()
            if item is None:
                raise self._stop()
            return item
        if name == "send" and len(args) == 1 and not kwargs:
            item = self.resume(args[0])
            if item is None:
                raise self._stop()
            return item
        if name == "throw" and len(args) == 1 and not kwargs:
            exc = args[0]
            if not isinstance(exc, ExceptionVariable):
                kind = exc.as_python_value()
                if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                    raise Unsupported(f"throwing {exc.describe()} into a generator", kind="generator")
                exc = construct_exception(tx, kind, [], {})
            item = self.throw(tx, exc)
            if item is None:
                raise self._stop()
            return item
        if name == "close" and not args and not kwargs:
            return self.close(tx)
        if name == "__iter__":
            return self
        raise Unsupported(f"generator.{name}", kind="unsupported_call")

    def close(self, tx: "Tracer") -> Variable:
        """`gen.close()`: GeneratorExit at the paused `yield`; yielding again is eager's RuntimeError."""
        if not self.started or self.finished:
            self.finished = True
            return ConstantVariable(None)
        exit_exc = construct_exception(tx, GeneratorExit, [], {})
        try:
            item = self.throw(tx, exit_exc)
        except RaisedInTrace as raised:
            if raised.exception is exit_exc or issubclass(raised.exception.exc_type, (GeneratorExit, StopIteration)):
                self.finished = True
                return ConstantVariable(None)
            raise
        if item is not None:
            error = RuntimeError("generator ignored GeneratorExit")
            raise raise_in_trace(error, f"RuntimeError: {error} (raised natively)")
        return ConstantVariable(None)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.functions import BoundMethodVariable

        if name in _METHODS or name in ("__next__", "__iter__"):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of {self.describe()}", kind="unsupported_attribute")

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return self.step_to_the_end()

    def remaining(self) -> list[Variable]:
        raise Unsupported(f"the items left in {self.describe()}", kind="generator")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        raise Unsupported(f"{self.describe()} live across a graph break (paused mid-body)", kind="generator")


def send_to(tx: "Tracer", receiver: Variable, value: Variable) -> tuple[Variable | None, Variable]:
    """SEND of `yield from`: the receiver's next item for `value` (None at its end) and, at its
    end, its return value."""
    if isinstance(receiver, GeneratorVariable):
        return receiver.resume(value), receiver.result
    if not isinstance(receiver, IteratorVariable):
        raise Unsupported(f"`yield from` {receiver.describe()}", kind="generator")
    if not (value.is_constant() and value.as_constant() is None):
        raise Unsupported(f"sending a value into {receiver.describe()} through `yield from`", kind="generator")
    return receiver.next_item(), ConstantVariable(None)


def run_generator(child: "Tracer") -> Variable:
    """A generator made by calling a generator function whose body `child` runs: nothing of the
    body runs until it is first resumed, as in eager."""
    child.suspend_at_yield = True
    made = GeneratorVariable(child)
    child.state.generators.append(made)
    return made


def close_dropped_at_return(root: "Tracer", generators: list[GeneratorVariable]) -> None:
    """The frame returned: eager then drops its locals in slot order, and a generator one of them
    holds that is paused inside a try/finally, an except block or a `with` is closed there, after
    the return value was made (what its cleanup changes in that value is seen by the caller). Such
    a generator lives at least that long, and no longer (one that outlives the frame cannot be
    rebuilt by the glue: refused anyway), so its close runs here in the trace. A generator dropped
    earlier (an iterator popped at a `break`, a rebound name, a callee's local) closes at a moment
    the trace does not see: left to refuse_unclosed_cleanups."""
    for name in root.code.co_varnames:
        held = root.locals.get(name)
        if isinstance(held, GeneratorVariable) and any(held is g for g in generators) and held.paused_in_cleanup():
            held.close(root)


def refuse_unclosed_cleanups(generators: list[GeneratorVariable]) -> None:
    """At the end of a trace (its return, or a graph break): eager closes a generator when its last
    reference goes, and a body paused inside a try/finally or a `with` (or delegating through
    `yield from`) runs its cleanup then. When that is cannot be told from the trace, so a
    generator left paused there is refused: the frame runs eagerly (under fullgraph, an error)."""
    for made in generators:
        if made.paused_in_cleanup():
            raise Unsupported(f"{made.describe()} left paused inside a try/finally or with block "
                              "(eager runs its cleanup when the generator is dropped)", kind="generator")
