"""Dict keys whose class writes __hash__ and __eq__ in Python (a user key class, a frozen dataclass),
in a dict from outside the frame or a set made in it: looked up as CPython's dict and set do, the same object first, then
each key of an equal hash compared with ==, with the key's __hash__ and __eq__ traced (what they
read is guarded). The builder keys such a dict's entries by HashedKey (the object and the hash the
dict stored); DictVariable asks key_for (its key_resolver, set here) for the key each read or write finds. Corresponds to the
user-defined-object keys of torch/_dynamo/variables/dicts.py (HashableTracker).
"""
from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture.variables.base import Variable
from kiln.capture.variables.dict import DictVariable, IdentityKey, key_of, key_variable
from kiln.capture.variables.object_protocol import python_equal, python_hash
from kiln.capture.variables.sets import SetVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer


class HashedKey(IdentityKey):
    """A key of a dict from outside whose class defines its own __hash__ and __eq__ in Python (a
    user object): it hashes as the real dict stored it and is the same key as itself only. Any
    other value looked up goes through key_for, which traces __hash__ and __eq__ as
    CPython's lookup calls them (identity first, then equal hashes, then ==)."""

    __slots__ = ("stored_hash",)
    by_hash = True

    def __init__(self, var: Variable, obj: Any, stored_hash: int) -> None:
        super().__init__(var, obj)
        self.stored_hash = stored_hash

    def __hash__(self) -> int:
        return self.stored_hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashedKey) and other.obj is self.obj


def hashes_in_python(kind: Any) -> bool:
    """Whether instances of `kind` hash with a __hash__ written in Python (and compare with a
    Python __eq__): a user class's, what a dict lookup must trace."""
    if not isinstance(kind, type) or issubclass(kind, torch.Tensor):
        return False
    return isinstance(inspect.getattr_static(kind, "__hash__", None), types.FunctionType) \
        and isinstance(inspect.getattr_static(kind, "__eq__", None), types.FunctionType)


class Absent:
    """What a lookup gives for a key the dict does not hold (never a key of its items)."""

    __slots__ = ("var", "hash")
    absent = True

    def __init__(self, var: Variable, hash_: int | None = None) -> None:
        self.var = var
        self.hash = hash_  # the traced __hash__ of a user-hashed var (None: var hashes natively)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return other is self


def _resolve(tx: "Tracer", d: DictVariable | SetVariable, var: Variable) -> Any:
    """The key of `items` that looking `var` up finds: key_of(var), except where a user class's
    __hash__/__eq__ decides (var's class, or keys of this dict, hash in Python): CPython's order,
    the same object first, then each key of an equal hash compared with ==, both traced
    (object_protocol.python_hash/python_equal), so what they read is guarded. An Absent where
    no key matches."""
    try:
        kind = var.python_type()
    except Unsupported:
        kind = None
    user_keys = [k for k in d.items if isinstance(k, HashedKey)]
    if kind is None or not hashes_in_python(kind):
        key = key_of(var)
        if user_keys and any(k.stored_hash == hash(key) for k in user_keys):
            raise Unsupported(f"looking up {var.describe()} in a dict whose user-object key of the same hash "
                              f"would be compared with it", kind="unsupported")
        return key
    real = var.identity()
    for k in user_keys:
        if real is not None and k.obj is real:
            return k
    wanted = python_hash(tx, var, kind)
    for k in list(d.items):
        stored = k.stored_hash if isinstance(k, HashedKey) else hash(k)
        if stored == wanted and python_equal(tx, var, key_variable(tx, k)):
            return k
    return Absent(var, wanted)


def key_for(tx: "Tracer", d: DictVariable | SetVariable, var: Variable, write: bool = False) -> Any:
    """key_of(var), or the key _resolve finds where user hashing decides. A user-hashed key the
    dict does not hold, added (`write`), becomes a HashedKey of the hash its __hash__ gave: the
    object itself (one from outside, or the Variable of one made in the frame) is that key."""
    if not any(isinstance(k, HashedKey) for k in d.items):
        try:
            kind = var.python_type()
        except Unsupported:
            kind = None
        if not hashes_in_python(kind):
            return key_of(var)
    key = _resolve(tx, d, var)
    if write and isinstance(key, Absent):
        if key.hash is None:
            raise Unsupported(f"adding {var.describe()} to a dict with a user-hashed key of the same hash",
                              kind="unsupported")
        obj = var.identity()
        if obj is None:
            raise Unsupported(f"adding the user-hashed key {var.describe()} to a dict", kind="unsupported")
        return HashedKey(var, obj, key.hash)
    return key


DictVariable.key_resolver = key_for
SetVariable.key_resolver = key_for
