"""`id(value)` of a value whose identity is known at trace time but whose number is not: a tensor,
an object or container made in the frame.

The number itself differs on every call, so it never becomes a constant of the trace: the result
only answers `==` / `!=` / `is` against another such id (equal exactly when the two values are the
same object, as `a is b` is decided), and rebuilds as `id(value)` where the glue needs it. Any other
use of the number (arithmetic, formatting) is a clean break; so is a dict key or set item of an
input's id, while the id of a value made in the frame is a key hashed by the object's identity. Corresponds to the id()
handling of torch/_dynamo/variables/builtin.py.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

from kiln.capture.variables.base import Variable
from kiln.capture.variables.sequence import ListVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder

# One key per object whose id() the trace took: two ids of the same object share it, so comparing
# the keys by identity compares the objects. Held by the object's id with a weak reference to it
# (never compared with ==: a tensor's == is elementwise); an entry goes when its object dies.
_KEYS: dict[int, tuple["weakref.ref[Any]", object]] = {}


class ObjectIdVariable(Variable):
    """`id(target)`: `identity()` is a key shared by every id of the same object."""

    def __init__(self, target: Variable, key: object) -> None:
        self.target = target
        self.key = key
        self.source = None
        # set for a tensor read from outside (a parameter): guards that the source holds this very
        # tensor and gives its real number, for a dict built outside keyed by id() (`scales[id(p)]`)
        self.pin_number: "Callable[[], int] | None" = None

    def describe(self) -> str:
        return f"id() of {self.target.describe()} (a number known only when the program runs)"

    def python_type(self) -> type:
        return int

    def identity(self) -> Any:
        return self.key

    @property
    def keyed_by_identity(self) -> bool:
        """A dict key or set item hashed by the object's identity: only for an object made in the frame
        (an input's id may be a key of a dict built outside, holding the real number)."""
        return getattr(self.target, "source", None) is None

    def as_python_value(self) -> Any:
        raise Unsupported(f"using {self.describe()} as a number", kind="unsupported")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"id({glue.reconstruct(self.target)})"


def object_id(target: Variable) -> Variable:
    """`id(target)` for a value with a trace-time identity (see the module docstring)."""
    identity = target.identity()
    pin = getattr(target, "pin_identity", None)
    if pin is not None and identity is not None:
        pin()  # an outside instance guarded by type: its id() compares as this very object
    if identity is None and isinstance(target, ListVariable):
        # this Variable is the list (an immutable tuple is not); one from outside is told apart
        # from another such list under the guard_identity guard, when ids are compared (operators)
        identity = target
    if identity is None:
        raise Unsupported(f"id() of {target.describe()}", kind="unsupported")
    number = id(identity)
    held = _KEYS.get(number)
    if held is None or held[0]() is not identity:
        try:
            ref = weakref.ref(identity, lambda _: _KEYS.pop(number, None))
        except TypeError as exc:  # not weakly referable
            raise Unsupported(f"id() of {target.describe()}", kind="unsupported") from exc
        held = _KEYS[number] = (ref, object())
    return ObjectIdVariable(target, held[1])
