"""Calling an Enum class on a value in the trace (`Color(3)`): the member, or eager's ValueError
raised in the frame (used by user_object.py, which also inlines a class's own `_missing_` hook)."""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from kiln.capture.variables.base import Variable

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer


def enum_member(tx: "Tracer", cls: enum.EnumMeta, value: Any) -> Variable:
    """The member of `cls` whose value is `value` (a class's members are fixed once it is made), or
    the ValueError eager raises, raised in the frame."""
    from kiln.capture.variables.exception import raise_in_trace

    try:
        member: Any = cls(value)
    except ValueError as exc:
        raise raise_in_trace(exc, f"{exc} (raised natively)") from None
    return tx.wrap_result(member)
