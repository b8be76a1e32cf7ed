"""`isinstance(obj, P)` for a runtime-checkable typing.Protocol with data members (`k: int`).

typing's metaclass answers such a check by duck typing, not from the object's type: True when
the object has every member of the protocol (a callable member must not be set to None on it),
else when its class derives from the protocol by name. Traced here with the tracer's own
attribute lookups, so what the answer read is guarded as the program's reads would be;
issubclass() of such a protocol is a TypeError in Python and is left to the caller.
"""
from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Any

from kiln.capture.variables.base import Variable

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer


def is_data_protocol(cls: Any) -> bool:
    """A runtime-checkable Protocol class with at least one member that is not a method."""
    return (isinstance(cls, type) and getattr(cls, "_is_protocol", False)
            and getattr(cls, "_is_runtime_protocol", False)
            and not typing._is_callable_members_only(cls))  # type: ignore[attr-defined]


def protocol_instancecheck(tx: "Tracer", obj: Variable, cls: type) -> bool:
    """What typing's `_ProtocolMeta.__instancecheck__` answers for a data protocol."""
    members = sorted(typing._get_protocol_attrs(cls))  # type: ignore[attr-defined]
    satisfied = True
    for name in members:
        if not tx.has_attr(obj, name):
            satisfied = False
            break
        if callable(getattr(cls, name, None)):
            value = tx.getattr(obj, name)
            if value.is_constant() and value.as_constant() is None:
                satisfied = False
                break
    if satisfied:
        return True
    return cls in obj.python_type().__mro__
