"""`collections.namedtuple(name, fields)` called inside a compiled frame, with constant arguments.

Its Python builds the class's `__new__` with `eval`, which capture cannot trace (a graph break).
With constant arguments the class depends on nothing else, so it is made at trace time, named for
the frame's module as eager names it; its instances are then traced as any namedtuple's. Eager
makes a new class on every call, the compiled frame makes one per trace (torch.compile does the
same): a program that compares the classes of two calls' results sees one class.
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from kiln.capture.trace_rules import builtin_rule
from kiln.capture.variables.base import constant_args
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.base import Variable


@builtin_rule(collections.namedtuple)
def namedtuple_rule(tx: "Tracer", args: list["Variable"], kwargs: dict[str, "Variable"]) -> "Variable":
    consts = constant_args(args, kwargs)
    if consts is None:
        raise Unsupported("collections.namedtuple() with arguments known only at run time", kind="unsupported_call")
    positional, named = consts
    if "module" not in named:
        named["module"] = tx.f_globals.get("__name__", "__main__")  # eager reads its caller's globals
    try:
        made = collections.namedtuple(*positional, **named)  # type: ignore[misc]  # the caller's arguments
    except Exception as exc:  # noqa: BLE001 - eager's error, raised by the real call at a break
        raise Unsupported(f"collections.namedtuple() raised {type(exc).__name__}", kind="unsupported_call") from exc
    return tx.wrap_result(made)
