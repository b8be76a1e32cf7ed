"""Environment variables read by traced code: `os.environ.get(key, default)`, `key in os.environ`,
`os.environ[key]` and `os.getenv`. The value is read at trace time and guarded by value, as a
configuration flag of the code path (torch.compile reads them too)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

from kiln.capture.guards import Guard
from kiln.capture.sources import EnvironSource, Source
from kiln.capture.variables.base import Variable, constant_args
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


class EnvironReadVariable(Variable):
    """`os.environ.get(key, default)` (and `in`, `[]`): the variable is read at trace time and
    guarded by value, as a configuration flag of the code path (torch.compile reads it too)."""

    def __init__(self, environ: Variable | None, name: str) -> None:
        self.environ = environ
        self.name = name

    def describe(self) -> str:
        return f"os.environ.{self.name}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        consts = constant_args(list(args), kwargs)
        if consts is None or kwargs or not consts[0] or not isinstance(consts[0][0], str):
            raise Unsupported(f"os.environ.{self.name} with a key unknown at trace time", kind="unsupported_call")
        key = consts[0][0]
        value = os.environ.get(key)
        tx.state.output.guards.append(Guard(EnvironSource(key).name(), "check_value", value))
        if self.name == "__contains__":
            return tx.wrap(value is not None, None)
        if value is None and self.name == "__getitem__":
            raise Unsupported(f"KeyError {key!r} (raised natively)", kind="unsupported")
        if value is None:
            return args[1] if len(args) > 1 else tx.wrap(None, None)
        return tx.wrap(value, None)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        assert self.environ is not None
        return f"{self.environ.reconstruct(glue)}.{self.name}"


class GetenvVariable(EnvironReadVariable):
    """`os.getenv(key, default)`: `os.environ.get(key, default)` under another name."""

    def __init__(self, source: Source | None) -> None:
        super().__init__(None, "get")  # its own reconstruct: os.getenv
        self.source = source

    def describe(self) -> str:
        return "os.getenv"

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return glue.constant(os.getenv)
