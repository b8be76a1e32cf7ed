"""The instance `__dict__` of an object from outside the frame, once the trace has it as a dict
(`vars(obj)`, `obj.__dict__`) and writes through it.

An attribute store or delete while the trace holds that dict (read before, not yet written) is a
store into it: the traced dict takes it too (`held_instance_dict`), so that reading the dict, or
writing it and so replaying its whole contents, sees the attribute's new value.

Writes through that dict are side effects of the dict (replayed as its new contents), not of the
attributes, so the two views must not disagree: an attribute read after such a write answers from
the written dict, and an attribute write or delete after it (or a read of `__dict__` after an
attribute write) is a clean break rather than a replay whose order could lose one of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.capture.variables.base import Variable
from kiln.capture.variables.dict import DictVariable

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer


def written_instance_dict(tx: "Tracer", obj: Any) -> DictVariable | None:
    """The traced dict of `obj.__dict__` when the trace changed it, else None."""
    var = held_instance_dict(tx, obj)
    if var is None or var.source is None or not tx.side_effects.touches(var.source):
        return None
    return var


def held_instance_dict(tx: "Tracer", obj: Any) -> DictVariable | None:
    """The traced dict of `obj.__dict__` when the trace read it (written or not), else None."""
    real = getattr(obj, "__dict__", None)
    if not isinstance(real, dict):
        return None
    cached = tx.state.wrapped.get(id(real))
    if cached is None or cached[0] is not real or not isinstance(cached[1], DictVariable):
        return None
    return cached[1]
