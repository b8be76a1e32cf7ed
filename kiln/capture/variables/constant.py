"""Python constants known at trace time: numbers (numpy scalars too), strings, None, dtypes, devices, Ellipsis.

Arithmetic on them happens while tracing (it leaves no node in the graph); a constant read from an
input is guarded by value where it was read (see builder.py). Methods of constants (`str.format`,
`dtype.is_floating_point`, ...) run at trace time when every argument is a constant too.
Corresponds to torch/_dynamo/variables/constant.py.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from kiln.capture.sources import Source
from kiln.capture.variables.base import BoundMethodVariable, Variable, constant_args
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer

# numpy's scalars (np.int64 from np.lcm, the np.bool_ of comparing one) are constants like Python
# numbers: arithmetic on them runs at trace time with numpy's own rules (np.float64 is a float
# subclass already; np.int64, np.float32 and np.bool_ are not).
CONSTANT_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
                  torch.layout, torch.memory_format, type(Ellipsis), type(NotImplemented), range, slice,
                  np.integer, np.floating, np.complexfloating, np.bool_)


def is_constant_value(value: Any) -> bool:
    """True for values ConstantVariable holds (tuples of constants are TupleVariables instead)."""
    return isinstance(value, CONSTANT_TYPES) and not isinstance(value, torch.SymInt)


class ConstantVariable(Variable):
    """A Python constant; `value` is the real object."""

    # exception.raise_in_trace: what an operation on constants raised, raised in the trace
    raise_in_trace: "Callable[[BaseException, str], Exception] | None" = None

    def __init__(self, value: Any, source: Source | None = None) -> None:
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"constant {self.value!r}"

    def python_type(self) -> type:
        return type(self.value)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.value

    def truth(self, tx: "Tracer") -> bool:
        return bool(self.value)

    def length(self, tx: "Tracer") -> Variable:
        return ConstantVariable(_run_on_constants(len, self.value))

    def iterate(self, tx: "Tracer") -> list[Variable]:
        if isinstance(self.value, (str, bytes, range)):
            return [ConstantVariable(v) for v in self.value]
        return super().iterate(tx)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        try:
            attr = getattr(self.value, name)
        except AttributeError as exc:
            if ConstantVariable.raise_in_trace is not None:  # eager's own error (`None.shape`), raised in the trace
                raise ConstantVariable.raise_in_trace(exc, f"AttributeError: {exc} (raised natively)") from exc
            raise Unsupported(f"{self.describe()} has no attribute {name!r}", kind="unsupported_attribute") from exc
        if callable(attr):
            return BoundMethodVariable(self, name)
        return ConstantVariable(attr)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        consts = constant_args(args, kwargs)
        if consts is None and isinstance(self.value, (str, bytes)) and name == "join" and len(args) == 1 and not kwargs:
            # `sep.join(str(s) for s in x.shape)`: a generator or list whose items are known now
            items = tx.iterate(args[0])
            if all(i.is_constant() for i in items):
                consts = ([[i.as_constant() for i in items]], {})
        if consts is None:
            if isinstance(self.value, str) and name == "format":
                raise Unsupported("formatting a string with a tensor or traced value",
                                  kind="format_tensor")
            raise Unsupported(f"{type(self.value).__name__}.{name} with non-constant arguments",
                              kind="unsupported_call")
        method = getattr(self.value, name)
        return tx.wrap_result(_run_on_constants(method, *consts[0], **consts[1]))

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return glue.constant(self.value)


def _run_on_constants(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args)` at trace time; what it raises (`len(5)`, `"ab".index("z")`) is raised in the
    trace, where the frame's own handlers may catch it (exception.raise_in_trace, set below by
    that module, which imports this one)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        if ConstantVariable.raise_in_trace is None:
            raise
        raise ConstantVariable.raise_in_trace(exc, f"{type(exc).__name__}: {exc} (raised natively)") from exc


class ItemConstantVariable(ConstantVariable):
    """A constant held by a container from outside the frame (`cfg["lr"]`, `sizes[2]`): guarded by
    value only once the trace reads it, so that a change to an item the program never read does
    not recompile (the container's length or keys are guarded where it was wrapped). Until then,
    rebuilding it reads it again from its source."""

    def __init__(self, value: Any, source: Source, guard: Callable[[], None]) -> None:
        self._value = value
        self.source = source
        self._guard: Callable[[], None] | None = guard

    @property  # type: ignore[override]  # a plain attribute on ConstantVariable
    def value(self) -> Any:
        if self._guard is not None:
            guard, self._guard = self._guard, None
            guard()
        return self._value

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self._guard is not None and self.source is not None:
            return self.source.name()
        return super().reconstruct(glue)


class DeferredTextVariable(ConstantVariable):
    """A string formatted from symbolic sizes (`f"got {image.shape[-2:]}"`), made, and the sizes
    guarded by value, only when the trace or the glue reads it: a message that only an assertion
    which holds would show (torchvision's `torch._assert(len(val) == 2, f"...")`) costs no
    specialization, as torch.compile's lazily formatted strings cost none. A text the trace never
    read and the glue must rebuild (returned, stored, printed after the graph) is formatted by the
    glue from the sizes the graph returns (`render`), as torch.compile formats after its graph: no
    size is guarded by value, one graph serves every size."""

    def __init__(self, make: Callable[[], str], render: Callable[["GlueBuilder"], str] | None = None) -> None:
        self._make: Callable[[], str] | None = make
        self._text = ""
        self.source = None
        self.render = render

    @property  # type: ignore[override]  # a plain attribute on ConstantVariable
    def value(self) -> Any:
        if self._make is not None:
            make, self._make = self._make, None
            self._text = make()
        return self._text

    def python_type(self) -> type:
        return str

    def describe(self) -> str:
        return "string formatted from sizes" if self._make is not None else super().describe()

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self._make is not None and self.render is not None:
            return self.render(glue)
        return super().reconstruct(glue)


def literal_or_none(value: Any) -> str | None:
    """A Python literal for simple constants (what the glue prints inline), else None."""
    # Exact types only: a subclass (numpy's float64 is a float) prints as `np.float64(1.0)`, which
    # the glue cannot evaluate; it is bound by name instead and keeps its type.
    if value is None or value is Ellipsis or type(value) in (bool, int, str, bytes):
        return repr(value)
    if type(value) is float and math.isfinite(value):
        return repr(value)
    return None
