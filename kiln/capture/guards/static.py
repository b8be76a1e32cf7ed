"""Guards whose outcome is fixed once other guards of the same set pass: left out of the generated check.

A check_id guard proves that the value at its source IS one object (and, for a function, that its
`__code__` and `__defaults__` are the objects bound in the check). From there some further reads can
never give another answer: the attributes of a code object, the items of a tuple or a string, a
function's `__closure__` (read-only). A guard whose source is such a read from a proven source
(`type(m).forward.__closure__[0].cell_contents.__code__.co_varnames[3]`, checked after the identity
of the function it starts from) has an outcome fixed by the proof, as long as what it checks cannot
change on the object read either: its value deeply immutable (str, int, tuples of them, code) for a
type, length or value check; its identity alone for an identity or None check. Such a guard is
evaluated once here, on the proven object; where it passes it is left out of the generated function
(the check function is a conjunction: whenever the function passes, the proving guard passed, and
then the left-out guard passes too). Where it fails it stays (and the set cannot pass at all).

An aliasing guard over sources that all resolve so (the cells of two closures proven to be the
same function) is fixed the same way.

The indices left out are written in the generated source's first line; a source reused from another
process (kiln.capture.persist) is used only where the same guards are fixed there too.
"""
from __future__ import annotations

import re
import types
from typing import Any, Sequence

from kiln.capture.guards.identity import GONE
from kiln.capture.guards.kinds import Check, Guard

_STEP_RE = re.compile(r"\['([^'\\]*)'\]|\[(-?\d+)\]|\.([A-Za-z_]\w*)")
_UNSET = object()

# Values whose type, length and equality no program can change
_LEAVES = frozenset({str, bytes, int, float, complex, bool, type(None), type(Ellipsis)})
_CODE_ATTRS = frozenset({"co_varnames", "co_names", "co_consts", "co_freevars", "co_cellvars", "co_name",
                         "co_qualname", "co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_flags",
                         "co_nlocals", "co_filename", "co_firstlineno", "co_code", "co_stacksize"})
_VALUE_KINDS = frozenset({"check_type", "check_len", "check_value"})
_IDENTITY_KINDS = frozenset({"check_id", "check_none", "check_not_none"})

HEADER = "# kiln: guards fixed by others, left out:"


def _deeply_immutable(value: Any, depth: int = 0) -> bool:
    kind = type(value)
    if kind in _LEAVES or kind is types.CodeType:
        return True
    if (kind is tuple or kind is frozenset) and depth < 8:
        return all(_deeply_immutable(v, depth + 1) for v in value)
    return False


def _step(value: Any, key: str | None, index: str | None, attr: str | None) -> Any:
    """The value one step further when it can never change for this `value`, else _UNSET."""
    kind = type(value)
    if attr is not None:
        if kind is types.CodeType and attr in _CODE_ATTRS:
            return getattr(value, attr)
        if kind is types.FunctionType and attr == "__closure__":  # read-only: fixed per function
            return value.__closure__
        return _UNSET
    if index is not None and kind in (tuple, str, bytes):
        try:
            return value[int(index)]
        except IndexError:
            return _UNSET
    return _UNSET


def _proven(guards: Sequence[Guard]) -> dict[str, Any]:
    """Source -> the object every passing check finds there (check_id guards, function contents)."""
    proven: dict[str, Any] = {}
    for guard in guards:
        if guard.kind != "check_id" or not guard.source or guard.expected is GONE:
            continue
        obj = guard.expected
        proven[guard.source] = obj
        if isinstance(obj, types.FunctionType):  # kinds._function_contents checks these by identity
            proven[guard.source + ".__code__"] = obj.__code__
            proven[guard.source + ".__defaults__"] = obj.__defaults__
    return proven


def _resolve(source: str, proven: dict[str, Any]) -> Any:
    """The fixed value at `source`: a proven proper prefix, then fixed steps only; else _UNSET. A
    function's `__code__` and `__defaults__` are proven by the function's identity guard, another
    guard than one at that source: the source itself may be one of those."""
    if source.endswith((".__code__", ".__defaults__")) and source in proven:
        return proven[source]
    for at in range(len(source) - 1, 0, -1):
        if source[at] not in ".[" or source[:at] not in proven:
            continue
        value, pos = proven[source[:at]], at
        while pos < len(source) and value is not _UNSET:
            match = _STEP_RE.match(source, pos)
            if match is None:
                return _UNSET
            value, pos = _step(value, *match.groups()), match.end()
        return value
    return _UNSET


def _holds(checks: list[Check], value: Any, constants: dict) -> bool:
    try:
        return all(eval(c.render("___value"), {**constants, "___value": value}) for c in checks)  # noqa: S307
    except Exception:
        return False


def fixed_guards(guards: Sequence[Guard], all_checks: Sequence[list[Check]], constants: dict) -> set[int]:
    """The indices of `guards` whose outcome the others fix, and which pass: to leave out."""
    proven = _proven(guards)
    if not proven:
        return set()
    fixed: set[int] = set()
    for index, (guard, checks) in enumerate(zip(guards, all_checks)):
        if guard.kind == "check_aliasing":
            if _aliasing_fixed(guard, proven):
                fixed.add(index)
            continue
        if not guard.source or (guard.kind not in _VALUE_KINDS and guard.kind not in _IDENTITY_KINDS):
            continue
        if guard.kind == "check_id" and isinstance(guard.expected, types.FunctionType):
            continue  # its contents (`__code__`, defaults) can be assigned
        value = _resolve(guard.source, proven)
        if value is _UNSET or (guard.kind in _VALUE_KINDS and not _deeply_immutable(value)):
            continue
        if _holds(checks, value, constants):
            fixed.add(index)
    return fixed


def _aliasing_fixed(guard: Guard, proven: dict[str, Any]) -> bool:
    """Whether every source of an aliasing guard resolves to a fixed object, and they alias as required."""
    groups = guard.expected
    objects = []
    for group in groups:
        values = [_resolve(source, proven) for source in group]
        if any(v is _UNSET for v in values) or any(v is not values[0] for v in values[1:]):
            return False
        objects.append(values[0])
    return len({id(o) for o in objects}) == len(objects)


def repeated_functions(guards: Sequence[Guard]) -> set[int]:
    """The indices of check_id guards on a function that an earlier check_id guard compares with
    the same function: where both identities hold, the function's contents (`__code__`, defaults)
    are one object's, checked once at the first (a transformer's layers share their classes' forwards)."""
    seen: set[int] = set()
    repeated: set[int] = set()
    for index, guard in enumerate(guards):
        if guard.kind == "check_id" and isinstance(guard.expected, types.FunctionType):
            if id(guard.expected) in seen:
                repeated.add(index)
            seen.add(id(guard.expected))
    return repeated


def identity_only(checks: list[Check]) -> list[Check]:
    """A function's identity check without its contents (`repeated_functions`). A weakly held
    function's check reads `name()`, None once freed: `is not None` keeps a None from passing there,
    which the contents check did before."""
    first = checks[0]
    if first.code.endswith("()"):
        first = Check(first.code + " is not None", first.why)
    return [first]


def header(fixed: set[int], once: set[int]) -> str:
    return f"{HEADER} {_ints(fixed)}{ONCE} {_ints(once)}\n"


def _ints(indices: set[int]) -> str:
    return ",".join(map(str, sorted(indices)))


ONCE = "; function contents checked at their first identity guard:"


def recorded(source: str) -> tuple[set[int], set[int]] | None:
    """(guards left out, identity guards without their function's contents) of a generated source,
    from its first line; None for a source without the line."""
    first = source.split("\n", 1)[0]
    if not first.startswith(HEADER) or ONCE not in first:
        return None
    fixed, once = first[len(HEADER):].split(ONCE)
    return _parse(fixed), _parse(once)


def _parse(text: str) -> set[int]:
    text = text.strip()
    return {int(i) for i in text.split(",")} if text else set()
