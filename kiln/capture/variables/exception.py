"""Exceptions raised and caught inside the traced frame: the exception value and its unwinding.

An exception that the traced code raises at trace time (a `raise ValueError(...)`, a `KeyError` of
a dict lookup on a traced dict, a builtin that raised on constants) becomes a `RaisedInTrace`; the
tracer looks the raising instruction up in the code's exception table (`catch_in_frame`) and jumps
to the handler as CPython would, so `try/except/finally` and `with` exits run symbolically. One no
frame catches stays an `Unsupported`: the instruction becomes a graph break and raises natively.
Corresponds to torch/_dynamo/variables/misc.py (ExceptionVariable) and the exception-table
handling of torch/_dynamo/symbolic_convert.py.
"""
from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any, Sequence

from kiln.capture.guards import Guard, ProcessQuery
from kiln.capture.trace_rules import builtin_rule
from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable, is_constant_value
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


class ExceptionVariable(Variable):
    """An exception instance made during the trace: its class, its `args` (what the constructor
    got, as BaseException.__new__ stores them, until a `super().__init__(...)` sets them) and the
    attributes a Python `__init__` set on it."""

    def __init__(self, exc_type: type[BaseException], args: Sequence[Variable]) -> None:
        self.exc_type = exc_type
        self.args = list(args)
        self.attrs: dict[str, Variable] = {}
        self.python_init = _python_method(exc_type, "__init__") is not None
        # the chain CPython keeps on the exception: `raise ... from cause` sets __cause__ (and
        # __suppress_context__); raising while another is handled sets __context__ to that one
        self.cause: Variable = ConstantVariable(None)
        self.context: Variable = ConstantVariable(None)
        self.suppress_context = False
        self.raised = False  # raised in the frame: it has a traceback, which capture does not build
        # raised where no handler of the traced frames runs: its __context__ is what the caller
        # handles (sys.exception() where the compiled function is called), None or a break when read
        self.context_of_caller = False
        self.traceback: Variable | None = None  # a TracebackVariable, or None set by with_traceback(None)

    @staticmethod
    def of(exc: BaseException) -> "ExceptionVariable":
        """The Variable of a real exception raised at trace time on constants."""
        args = [ConstantVariable(a) if is_constant_value(a) else ConstantVariable(repr(a)) for a in exc.args]
        return ExceptionVariable(type(exc), args)

    def describe(self) -> str:
        return f"{self.exc_type.__name__} exception"

    def python_type(self) -> type:
        return self.exc_type

    def identity(self) -> Any:
        return self

    def is_constant(self) -> bool:
        # `str(e)`, `repr(e)`, `e.args[0] == ...` fold at trace time when the arguments are known
        # (and building it again runs no Python code of its class).
        return not self.python_init and not self.attrs and not self.raised and not self._chained() \
            and all(a.is_constant() for a in self.args)

    def truth(self, tx: "Tracer") -> bool:
        # an exception is true unless its class says otherwise (`if exc_value:` in an __exit__)
        if _python_owner(self.exc_type, "__bool__") is None and _python_owner(self.exc_type, "__len__") is None:
            return True
        return super().truth(tx)

    def _chained(self) -> bool:
        return not (self.cause.is_constant() and self.context.is_constant()) or self.suppress_context

    def as_constant(self) -> Any:
        if not self.is_constant():
            return super().as_constant()
        return self.exc_type(*(a.as_constant() for a in self.args))

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.sequence import TupleVariable  # sequence.py reaches this module

        if name in self.attrs:
            return self.attrs[name]
        if name == "args":
            return TupleVariable(list(self.args))
        if name == "__class__":
            return tx.wrap_result(self.exc_type)
        if name == "__cause__":
            return self.cause
        if name == "__context__":
            if self.context_of_caller and self.context.is_constant() and self.context.as_constant() is None:
                return callers_handled(tx, "the __context__ of an exception raised in the frame")
            return self.context
        if name == "__suppress_context__":
            return ConstantVariable(self.suppress_context)
        if name in ("with_traceback", "add_note") and _python_owner(self.exc_type, name) is None:
            return BoundMethodVariable(self, name)  # BaseException's own, answered by call_method
        if name == "value" and issubclass(self.exc_type, StopIteration) and _python_owner(self.exc_type, name) is None:
            return self.args[0] if self.args else ConstantVariable(None)  # what StopIteration's init stores
        if name == "__traceback__":
            return self.traceback_variable()
        owner = _python_owner(self.exc_type, name)
        if owner is not None:  # a method, property or constant of the user's exception class
            static = owner.__dict__[name]
            bound = tx.class_attribute(static, self, self.exc_type, name)
            if bound is not None:
                return bound
            tx.guard_class_attribute(self.exc_type, name, static)
            return tx.wrap(static, None)
        raise Unsupported(f"attribute {name!r} of a {self.describe()}", kind="unsupported_attribute")

    def traceback_variable(self) -> Variable:
        """`exc.__traceback__`: None until raised; then one traceback object, opaque to the trace."""
        if self.traceback is not None:
            return self.traceback
        if not self.raised:
            return ConstantVariable(None)
        if self.traceback is None:
            self.traceback = TracebackVariable(self)
        return self.traceback

    def set_cause(self, cause: Variable) -> None:
        """`exc.__cause__ = cause` (and `raise exc from cause`): it also suppresses the context."""
        if not (isinstance(cause, ExceptionVariable) or cause.is_constant() and cause.as_constant() is None):
            error = TypeError("exception cause must be None or derive from BaseException")
            raise raise_in_trace(error, f"TypeError: {error} (raised natively)")
        self.cause = cause
        self.suppress_context = True

    def chain_to(self, handled: Variable | None) -> None:
        """What raising this exception does to its `__context__` while `handled` is being handled:
        set to it, cutting the cycle CPython cuts when this exception is already in handled's chain."""
        if not isinstance(handled, ExceptionVariable) or handled is self:
            return
        link = handled
        while isinstance(link.context, ExceptionVariable):
            if link.context is self:
                link.context = ConstantVariable(None)
                break
            link = link.context
        self.context = handled

    def set_attribute(self, name: str, value: Variable) -> None:
        """`self.code = code` in the exception's Python `__init__` (nothing outside sees it yet)."""
        if name == "__cause__":
            self.set_cause(value)
        elif name == "__context__":
            if not (isinstance(value, ExceptionVariable) or value.is_constant() and value.as_constant() is None):
                error = TypeError("exception context must be None or derive from BaseException")
                raise raise_in_trace(error, f"TypeError: {error} (raised natively)")
            self.context = value
        elif name == "__suppress_context__":
            self.suppress_context = value.truth_value() if hasattr(value, "truth_value") else bool(value.as_constant())
        elif name == "args":
            from kiln.capture.variables.sequence import BaseSequenceVariable
            if not isinstance(value, BaseSequenceVariable):
                raise Unsupported("setting an exception's args to a value that is not a sequence", kind="unsupported")
            self.args = list(value.items)
        elif name.startswith("__"):
            raise Unsupported(f"setting {name} of an exception", kind="unsupported")
        else:
            self.attrs[name] = value

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        method = _python_method(self.exc_type, name)
        if method is not None:
            return tx.bind_method(method, self).call(tx, args, kwargs)
        if name in ("__str__", "__repr__") and not args and all(a.is_constant() for a in self.args):
            # the builtin base's own text from args alone (no Python __init__ runs again)
            real = self.exc_type.__new__(self.exc_type)
            real.args = tuple(a.as_constant() for a in self.args)
            return ConstantVariable(str(real) if name == "__str__" else repr(real))
        if name == "with_traceback" and len(args) == 1 and not kwargs:
            tb = args[0]
            if not (isinstance(tb, TracebackVariable) or tb.is_constant() and tb.as_constant() is None):
                raise Unsupported(f"with_traceback({tb.describe()})", kind="unsupported")
            self.traceback = tb
            return self
        if name == "add_note" and len(args) == 1 and not kwargs and _python_owner(self.exc_type, name) is None:
            if not (args[0].is_constant() and isinstance(args[0].as_constant(), str)):
                raise Unsupported("add_note() of a value that is not a constant string (raised natively)",
                                  kind="unsupported")
            from kiln.capture.variables.sequence import ListVariable
            notes = self.attrs.setdefault("__notes__", ListVariable([]))
            notes.call_method(tx, "append", [args[0]], {})
            return ConstantVariable(None)
        if name == "__init__":  # BaseException.__init__ (super().__init__(...)): it sets args
            if kwargs:
                raise Unsupported(f"{self.exc_type.__name__}.__init__ with keyword arguments (raised natively)",
                                  kind="unsupported")
            self.args = list(args)
            return ConstantVariable(None)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        parts = ", ".join(glue.reconstruct(a) for a in self.args)
        if not self.python_init and not self._chained():
            made = f"{glue.constant(self.exc_type)}({parts})"
            return f"{glue.constant(with_traceback_of_raise)}({made}, {self._keeps_context()})" if self.raised else made
        # its __init__ ran in the trace: made without running it again, with its args and attributes
        cls, name = glue.constant(self.exc_type), glue.fresh("exc")
        glue.line(f"{name} = {cls}.__new__({cls})")
        glue.line(f"{name}.args = ({parts}{',' if len(self.args) == 1 else ''})")
        for attr, value in self.attrs.items():
            glue.line(f"{name}.{attr} = {glue.reconstruct(value)}")
        if self._chained():
            glue.line(f"{name}.__context__ = {glue.reconstruct(self.context)}")
            glue.line(f"{name}.__cause__ = {glue.reconstruct(self.cause)}")
            glue.line(f"{name}.__suppress_context__ = {self.suppress_context}")
        if self.raised:
            glue.line(f"{name} = {glue.constant(with_traceback_of_raise)}({name}, {self._keeps_context()})")
        return name

    def _keeps_context(self) -> bool:
        """False where the glue's own raise gives it eager's __context__: the caller's exception."""
        return not (self.context_of_caller and self.context.is_constant() and self.context.as_constant() is None)


def with_traceback_of_raise(exc: BaseException, keep_context: bool) -> BaseException:
    """`exc` (remade by the glue) raised and caught once, so it has a traceback as an exception the
    frame raised has (`e.__traceback__ is not None` in the caller), its chaining left as it was;
    unless `keep_context` is False: the raise here chains it to what the caller handles, as eager's
    raise in the frame did."""
    context, cause, suppress = exc.__context__, exc.__cause__, exc.__suppress_context__
    try:
        raise exc
    except BaseException:  # noqa: BLE001 - the one just raised
        pass
    if keep_context:
        exc.__context__ = context
    exc.__cause__, exc.__suppress_context__ = cause, suppress
    return exc


def callers_handled(tx: "Tracer", what: str) -> Variable:
    """The exception the caller of the compiled function handles, where no handler of the traced
    frames runs: None now is guarded to stay None (the guard runs where the compiled function is
    called); an exception there is a break (`what` is read natively)."""
    if sys.exception() is not None:
        raise Unsupported(f"{what}, read while the caller handles an exception", kind="unsupported_call")
    tx.state.output.guards.append(Guard("", "check_query", ProcessQuery(sys.exception, (), None,
                                                                       "the exception the caller handles")))
    return ConstantVariable(None)


class TracebackVariable(Variable):
    """The traceback of an exception raised in the frame. Capture does not build its frames: it is
    an object that is not None and is itself, and reading into it (or keeping it past the frame)
    is a break."""

    def __init__(self, exception: ExceptionVariable) -> None:
        self.exception = exception

    def describe(self) -> str:
        return f"the traceback of a {self.exception.describe()}"

    def python_type(self) -> type:
        return types.TracebackType

    def identity(self) -> Any:
        return self

    def truth(self, tx: "Tracer") -> bool:
        return True


def _handled_in_trace(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """The exception sys.exc_info() and sys.exception() answer: inside an `except` block of the
    traced frames, the one being handled. With none handled there, the caller's (its own except
    block may be running; contextlib.ExitStack.__exit__ asks): None now is guarded to stay None
    (the guard runs where the compiled function is called), an exception there is a break."""
    if args or kwargs:
        raise Unsupported("sys.exc_info()/sys.exception() with arguments (raised natively)", kind="unsupported_call")
    handled = current_handled(tx)
    if isinstance(handled, ExceptionVariable):
        return handled
    return callers_handled(tx, "sys.exc_info() outside an except block of the traced frames")


@builtin_rule(sys.exc_info)
def exc_info_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.sequence import TupleVariable

    handled = _handled_in_trace(tx, args, kwargs)
    if not isinstance(handled, ExceptionVariable):
        return TupleVariable([handled, handled, handled])
    return TupleVariable([tx.wrap_result(handled.exc_type), handled, handled.traceback_variable()])


@builtin_rule(sys.exception)
def exception_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    return _handled_in_trace(tx, args, kwargs)


def _python_owner(exc_type: type, name: str) -> type | None:
    """The class of `exc_type`'s MRO written in Python that defines `name` (builtins end the search)."""
    for klass in exc_type.__mro__:
        if klass.__module__ == "builtins":
            return None
        if name in klass.__dict__:
            return klass
    return None


def _python_method(exc_type: type, name: str) -> Any:
    owner = _python_owner(exc_type, name)
    method = None if owner is None else owner.__dict__[name]
    return method if isinstance(method, types.FunctionType) else None


class RaisedInTrace(Unsupported):
    """The traced code raised `exception` at trace time. A handler of the frame (or of a caller
    being traced) catches it; if none does it is an ordinary Unsupported: the break raises natively."""

    def __init__(self, exception: ExceptionVariable, reason: str | None = None, *, reraised: bool = False) -> None:
        super().__init__(reason or f"{exception.exc_type.__name__} raised (raised natively)", kind="unsupported")
        self.exception = exception
        # a re-raise (bare `raise`, RERAISE) leaves the exception's __context__ as it is; a new raise
        # chains it to the exception being handled where it is raised (done once, by the tracer)
        self.chained = reraised


def raise_in_trace(exc: BaseException, reason: str) -> RaisedInTrace:
    """A RaisedInTrace for a real exception that a trace-time computation on constants raised."""
    return RaisedInTrace(ExceptionVariable.of(exc), reason)


ConstantVariable.raise_in_trace = raise_in_trace


def no_attribute(kind: type, name: str) -> RaisedInTrace:
    """The AttributeError CPython raises for `obj.name` when `obj`'s type has no such attribute
    and its instances hold none of their own (hasattr() reads it as False)."""
    message = f"{kind.__name__!r} object has no attribute {name!r}"
    return raise_in_trace(AttributeError(message), f"{message} (raised natively)")


def construct_exception(tx: "Tracer", exc_type: type, args: Sequence[Variable],
                        kwargs: dict[str, Variable]) -> ExceptionVariable:
    """`ValueError("bad")` in traced code. A Python `__init__` of the class is inlined on the new
    exception (BaseException.__new__ already stored the arguments as `args`); a Python `__new__`
    is not traced: calling such a class stays a break."""
    if _python_owner(exc_type, "__new__") is not None:
        raise Unsupported(f"constructing the exception {exc_type.__name__} (its __new__ is Python code)",
                          kind="unsupported_call")
    made = ExceptionVariable(exc_type, args)
    init = _python_method(exc_type, "__init__")
    if init is not None:
        tx.guard_class_attribute(exc_type, "__init__", init)
        tx.bind_method(init, made).call(tx, list(args), kwargs)
        return made
    if kwargs:
        raise Unsupported(f"constructing the exception {exc_type.__name__} with keyword arguments",
                          kind="unsupported_call")
    return made


def as_exception(tx: "Tracer", value: Variable) -> ExceptionVariable:
    """What `raise value` raises: an exception instance, or a class called without arguments."""
    if isinstance(value, ExceptionVariable):
        return value
    try:
        real = value.as_python_value()
    except Unsupported:
        real = None
    if isinstance(real, type) and issubclass(real, BaseException):
        return construct_exception(tx, real, [], {})
    raise Unsupported(f"raising {value.describe()}", kind="unsupported")


def catch_in_frame(tx: "Tracer", raised: RaisedInTrace) -> bool:
    """Unwind `tx` to the handler covering its current instruction, as CPython's exception table
    says: drop the stack to the handler's depth, push the raising offset if asked (`lasti`), push
    the exception and jump. False when no handler of this code covers the instruction."""
    from kiln.capture import code as code_mod

    ins = tx.current
    if ins is None:
        return False
    handler = code_mod.handler_at(tx.code, ins.offset)
    if handler is None:
        return False
    del tx.stack[handler.depth:]
    if handler.lasti:
        tx.push(ConstantVariable(ins.offset))
    tx.push(raised.exception)
    tx.kw_names = None
    tx.jump(handler.target)
    tx.state.innermost = tx
    return True


def exception_matches(exc: Variable, match: Variable) -> bool:
    """`except match:` for the exception `exc` (a class or a tuple of classes)."""
    kind = exc.python_type()
    try:
        target = match.as_python_value()
    except Unsupported:
        from kiln.capture.variables.sequence import TupleVariable
        if not isinstance(match, TupleVariable):
            raise
        target = tuple(item.as_python_value() for item in match.items)
    if not (isinstance(target, type) or isinstance(target, tuple)):
        raise Unsupported(f"`except` on {match.describe()}", kind="unsupported")
    return issubclass(kind, target)


def handled_exception(tx: "Tracer") -> Variable:
    """The exception being handled (what a bare `raise` re-raises): innermost first, callers next."""
    handled = current_handled(tx)
    if handled is None:
        raise Unsupported("a bare `raise` with no exception being handled (raised natively)", kind="unsupported")
    return handled


def current_handled(tx: "Tracer") -> Variable | None:
    """sys.exception() where `tx` runs: the innermost exception whose handler is running, or None."""
    frame: Any = tx
    while frame is not None:
        if frame.handled:
            return frame.handled[-1]
        frame = frame.parent
    return None


def note_raised(tx: "Tracer", raised: RaisedInTrace) -> None:
    """Where `raised` was raised (the first frame that sees it): it now has a traceback, and a new
    raise chains it to the exception being handled there, as CPython's raise does."""
    raised.exception.raised = True
    if not raised.chained:
        raised.chained = True
        handled = current_handled(tx)
        raised.exception.context_of_caller = handled is None
        raised.exception.chain_to(handled)


__all__ = ["ExceptionVariable", "RaisedInTrace", "as_exception", "catch_in_frame", "construct_exception",
           "current_handled", "exception_matches", "handled_exception", "note_raised", "raise_in_trace"]
