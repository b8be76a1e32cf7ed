"""The guards that keep apart what the trace saw apart (used by the glue when a capture ends): a
container or object from outside that the trace changed must stay a different object from the
others of its type that it read."""
from __future__ import annotations

from typing import TYPE_CHECKING

from kiln.capture.guards import Guard
from kiln.capture.variables.builder import _CONTAINERS
from kiln.capture.variables.user_object import ObjectVariable

if TYPE_CHECKING:
    from kiln.capture.tracer import CaptureState


def container_alias_guards(state: "CaptureState") -> list[Guard]:
    """The trace changed a container from outside in place (or set an attribute of an object from
    outside) and read others of its type: each of them must stay a different object (were `m` the
    list `l` appended to, its reads would see the append; were `b` the object `a` whose attribute
    was set, `b.k` would be the new value). What was one object shares one Variable (guarded in
    wrap_value)."""
    outside = [(value, var) for value, var in state.wrapped.values()
               if isinstance(var, _CONTAINERS) and var.source is not None]
    objects = [(value, var) for value, var in state.wrapped.values()
               if type(var) is ObjectVariable and var.source is not None and not isinstance(value, type)]
    effects = state.side_effects
    pairs: dict[frozenset[str], Guard] = {}
    for group, changed in ((outside, effects.mutated), (objects, lambda var: effects.writes_attributes_of(var.value))):
        for value, var in group:
            if not changed(var):
                continue
            for other_value, other in group:
                if other is not var and type(other_value) is type(value):
                    assert var.source is not None and other.source is not None
                    mine, theirs = var.source.name(), other.source.name()
                    pairs.setdefault(frozenset((mine, theirs)), Guard("", "check_aliasing", ((mine,), (theirs,))))
    return list(pairs.values())
