"""`globals()` in a traced frame: the module's own namespace, read and written by name.

`globals()["NAME"]` reads the global as LOAD_GLOBAL does (a pending write of the trace first, then
the module's value, guarded by its source), and `globals()["NAME"] = v` is a global write in the
side-effect log, as STORE_GLOBAL is: a later `NAME` in the frame (or in the code after a break) sees
it. Anything else (iteration, `in`, a name the module lacks) runs natively after a break, on the
real namespace. Corresponds to the globals() handling of torch/_dynamo/variables/builtin.py.
"""
from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any, Sequence

from kiln.capture.trace_rules import builtin_rule
from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.sources import GlobalSource
    from kiln.capture.tracer import Tracer


class GlobalsDictVariable(Variable):
    """The dict `globals()` returns for the code `tx` runs."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.source = None

    def describe(self) -> str:
        return "globals() of the traced code"

    def python_type(self) -> type:
        return dict

    def identity(self) -> Any:
        return self.namespace

    def _source(self, tx: "Tracer", key: Variable) -> "GlobalSource":
        name = key.as_constant() if key.is_constant() else None
        source = tx.global_source(name) if isinstance(name, str) and tx.f_globals is self.namespace else None
        if source is None:
            raise Unsupported(f"globals()[{key.describe()}]", kind="unsupported")
        return source

    def _read(self, tx: "Tracer", key: Variable) -> Variable | None:
        source = self._source(tx, key)
        pending = tx.side_effects.pending_global(source)
        if pending is not None:
            return pending
        if source.global_name in self.namespace:
            return tx.wrap(self.namespace[source.global_name], source)
        return None

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__getitem__" and len(args) == 1 and not kwargs:
            found = self._read(tx, args[0])
            if found is None:  # a KeyError, raised natively (the module may define it by then)
                raise Unsupported(f"globals()[{args[0].describe()}] of a name the module lacks", kind="unsupported")
            return found
        if name == "get" and len(args) in (1, 2) and not kwargs:
            found = self._read(tx, args[0])
            if found is None:
                raise Unsupported(f"globals().get({args[0].describe()}) of a name the module lacks", kind="unsupported")
            return found
        if name == "__setitem__" and len(args) == 2 and not kwargs:
            tx.side_effects.store_global(self._source(tx, args[0]), args[1])
            return ConstantVariable(None)
        raise Unsupported(f"globals().{name}", kind="unsupported_call")

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name in ("get", "__getitem__", "__setitem__"):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"globals().{name}", kind="unsupported_attribute")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return glue.constant(self.namespace)


@builtin_rule(builtins.globals)
def globals_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    if args or kwargs:
        raise Unsupported("globals() takes no arguments (raised natively)", kind="unsupported")
    return GlobalsDictVariable(tx.f_globals)
