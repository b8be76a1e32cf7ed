"""The base of every tracked value: what the tracer keeps on its stack and in its locals.

A `Variable` stands for one Python value of the frame being captured. It answers what the tracer
asks of it (attributes, calls, iteration, truth, its type) at trace time, and knows one Python
expression that rebuilds its value at run time (`reconstruct`, used by the glue after a graph break
or for the return value). The counterpart of torch/_dynamo/variables/base.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from kiln.capture.sources import Source
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.iterator import IteratorVariable


class Variable:
    """One traced value. `source` is where it was read from (None for values made during the trace)."""

    source: Source | None = None
    # Set by the builder on a container from outside (list, dict, set, deque, tuple): called with
    # the source of another such container and whether the trace decided the two are one object
    # (`is`, id()), it guards that they stay so (an aliasing guard, no object named).
    guard_identity: "Callable[[Source, bool], None] | None" = None

    # ------------------------------------------------------------------ what it is
    def python_type(self) -> type:
        raise Unsupported(f"type() of {self.describe()} is not known at trace time", kind="unsupported_builtin")

    def is_constant(self) -> bool:
        """True when the value is a plain Python constant known at trace time."""
        return False

    def as_constant(self) -> Any:
        """The trace-time Python value; Unsupported when there is none (a tensor, a symbolic int)."""
        raise Unsupported(f"{self.describe()} is not a constant at trace time", kind="unsupported_builtin")

    def as_python_value(self) -> Any:
        """The real object behind the variable when one exists (constants, modules, functions)."""
        return self.as_constant()

    def identity(self) -> Any:
        """The object that `is` and hashing by identity see at trace time (a tensor's fake, the
        real object of a value from outside), or None when there is none to compare."""
        return None

    def describe(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return self.describe()

    # ------------------------------------------------------------------ what the tracer asks
    def getattr(self, tx: "Tracer", name: str) -> "Variable":
        raise Unsupported(f"attribute {name!r} of {self.describe()}", kind="unsupported_attribute")

    def call(self, tx: "Tracer", args: Sequence["Variable"], kwargs: dict[str, "Variable"]) -> "Variable":
        raise Unsupported(f"calling {self.describe()}", kind="unsupported_call")

    def call_method(self, tx: "Tracer", name: str, args: Sequence["Variable"],
                    kwargs: dict[str, "Variable"]) -> "Variable":
        return self.getattr(tx, name).call(tx, args, kwargs)

    def iterate(self, tx: "Tracer") -> list["Variable"]:
        raise Unsupported(f"iterating over {self.describe()}", kind="unsupported_iter")

    def open_iterator(self, tx: "Tracer") -> "IteratorVariable | None":
        """`iter(value)` when the value makes its own iterator (a user class's `__iter__`, which
        may be stepped lazily); None: an iterator over what `iterate` gives."""
        return None

    def each_item(self, tx: "Tracer") -> Iterator["Variable"]:
        """The items of `iter(value)` read one at a time, as a consumer that acts on each item
        before it reads the next one (list.extend) reads them: a generator's body runs between."""
        opened = self.open_iterator(tx)
        if opened is None:
            yield from self.iterate(tx)
            return
        item = opened.next_item()
        while item is not None:
            yield item
            item = opened.next_item()

    def truth(self, tx: "Tracer") -> bool:
        """`bool(value)` at trace time (a jump on it); Unsupported if it depends on tensor data."""
        return bool(self.as_constant())

    def length(self, tx: "Tracer") -> "Variable":
        raise Unsupported(f"len() of {self.describe()}", kind="unsupported_builtin")

    # ------------------------------------------------------------------ rebuilding it at run time
    def reconstruct(self, glue: "GlueBuilder") -> str:
        """A Python expression (over L, G, F and the glue's names) that evaluates to this value."""
        if self.source is not None:
            return self.source.name()
        raise Unsupported(f"cannot rebuild {self.describe()} after a graph break", kind="reconstruct")


class NullVariable(Variable):
    """The NULL that CPython 3.11 pushes below a callable (PUSH_NULL, LOAD_GLOBAL's low bit)."""

    def describe(self) -> str:
        return "NULL"


class BoundMethodVariable(Variable):
    """`obj.name` for a method of a tracked value (a list, a dict, a tensor, a constant)."""

    def __init__(self, obj: Variable, name: str) -> None:
        self.obj = obj
        self.name = name

    def describe(self) -> str:
        return f"method {self.name} of {self.obj.describe()}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return self.obj.call_method(tx, self.name, args, kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        obj = glue.reconstruct(self.obj)
        if self.name.isidentifier():
            # a number's literal needs parentheses before the dot: `(2).__class__`, `(-1.5).real`
            return f"{obj}.{self.name}" if obj[:1].isalpha() or obj[:1] == "_" else f"({obj}).{self.name}"
        return f"getattr({obj}, {self.name!r})"


def constant_args(args: Sequence[Variable], kwargs: dict[str, Variable]) -> tuple[list[Any], dict[str, Any]] | None:
    """The args as Python constants when every one of them is a constant, else None."""
    if all(a.is_constant() for a in args) and all(v.is_constant() for v in kwargs.values()):
        return [a.as_constant() for a in args], {k: v.as_constant() for k, v in kwargs.items()}
    return None
