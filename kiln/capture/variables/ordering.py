"""Ordering traced values, as `sorted`, `min` and `max` do: by constants known at trace time, by
a key function's results, or by symbolic sizes, each comparison of which the ShapeEnv decides
and guards as a relation (s0 < s1) rather than as values. Pairs whose first items are distinct
constants sort without comparing the rest (`sorted(d.items())` with tensor values). The rules are
registered in builtin.py's table. Corresponds to the sorted/min/max handling of
torch/_dynamo/variables/builtin.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from kiln.capture.variables.base import Variable
from kiln.capture.variables.sequence import ListVariable, TupleVariable, native
from kiln.capture.variables.symint import SymIntVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer


def sorted_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    items = tx.iterate(args[0])
    key = kwargs.get("key")
    if key is not None and not (key.is_constant() and key.as_constant() is None):
        # sorted by the key function's results, which must be known now; the sort is stable, as
        # Python's, so equal keys keep the items' order
        reverse = bool(kwargs["reverse"].as_constant()) if "reverse" in kwargs else False
        results = [key.call(tx, [item], {}) for item in items]
        if traced_numbers(results) or user_objects(results):
            return ListVariable([items[k] for k in _ordered(tx, results, reverse)])
        keys = [constant_of(result, "sorted() key") for result in results]
        order = _stable_order(keys, reverse)
        return ListVariable([items[k] for k in order])
    kwargs = {k: v for k, v in kwargs.items() if k != "key"}
    if all(i.is_constant() for i in items) and all(v.is_constant() for v in kwargs.values()):
        values = native(sorted, [i.as_constant() for i in items], **{k: v.as_constant() for k, v in kwargs.items()})
        return ListVariable([tx.wrap_result(v) for v in values])
    if traced_numbers(items) and set(kwargs) <= {"reverse"} and all(v.is_constant() for v in kwargs.values()):
        reverse = bool(kwargs["reverse"].as_constant()) if kwargs else False
        return ListVariable([items[k] for k in _ordered(tx, items, reverse)])
    if user_objects(items) and set(kwargs) <= {"reverse"} and all(v.is_constant() for v in kwargs.values()):
        # instances of user classes: Python's own sort runs, each comparison it makes the class's
        # traced __lt__ (in eager's order: the same result, the same side effects)
        reverse = bool(kwargs["reverse"].as_constant()) if kwargs else False
        return ListVariable([items[k] for k in _ordered(tx, items, reverse)])
    firsts = _distinct_constant_heads(tx, items)
    if firsts is not None and set(kwargs) <= {"reverse"} and all(v.is_constant() for v in kwargs.values()):
        # (key, tensor) pairs such as sorted(d.items()): distinct keys decide the order alone,
        # so the tensors are never compared
        order = sorted(range(len(items)), key=firsts.__getitem__,
                       reverse=bool(kwargs["reverse"].as_constant()) if kwargs else False)
        return ListVariable([items[k] for k in order])
    raise Unsupported("sorted() of values unknown at trace time", kind="unsupported_call")


def traced_numbers(values: Sequence[Variable]) -> bool:
    """Python numbers and symbolic ones (sizes, int and float arguments), some not constant."""
    return any(isinstance(v, SymIntVariable) for v in values) and all(
        isinstance(v, SymIntVariable) or v.is_constant() and isinstance(v.as_constant(), (int, float))
        for v in values)


def user_objects(values: Sequence[Variable]) -> bool:
    """Some of `values` are instances of user classes (compared by their own dunders)."""
    import types

    from kiln.capture.variables.user_object import NewObjectVariable, ObjectVariable

    return any(isinstance(v, NewObjectVariable) or isinstance(v, ObjectVariable)
               and not isinstance(v.value, (type, types.ModuleType)) for v in values)


class Ordered:
    """A traced number inside Python's own sort, max and min: each comparison they make is
    decided now by the ShapeEnv, which guards the relation (s0 < s1), not the values. A user
    object's comparison runs its traced dunder (__lt__, __gt__ or the reflected one)."""

    def __init__(self, tx: "Tracer", value: Variable) -> None:
        self.tx = tx
        self.value = value

    def _compare(self, symbol: str, other: "Ordered") -> bool:
        return self.tx.compare_op(symbol, self.value, other.value).truth(self.tx)

    def __lt__(self, other: "Ordered") -> bool:
        return self._compare("<", other)

    def __gt__(self, other: "Ordered") -> bool:
        return self._compare(">", other)


def _ordered(tx: "Tracer", values: Sequence[Variable], reverse: bool) -> list[int]:
    return sorted(range(len(values)), key=lambda i: Ordered(tx, values[i]), reverse=reverse)


def constant_of(var: Variable, what: str) -> Any:
    if isinstance(var, SymIntVariable):
        return var.specialize()  # guarded equal to its value, as any branch on a size is
    if not var.is_constant():
        raise Unsupported(f"{what} gave {var.describe()}, unknown at trace time", kind="unsupported_call")
    return var.as_constant()


def _stable_order(keys: list[Any], reverse: bool) -> list[int]:
    """The positions of `keys` in the order sorted() puts them (stable, also when reversed)."""
    try:
        return sorted(range(len(keys)), key=keys.__getitem__, reverse=reverse)
    except TypeError as exc:
        from kiln.capture.variables.exception import raise_in_trace
        raise raise_in_trace(exc, f"TypeError: {exc} (raised natively)") from exc


def _distinct_constant_heads(tx: "Tracer", items: list[Variable]) -> list[Any] | None:
    """The first elements of tuples `items` when all are distinct constants, else None."""
    if not all(isinstance(i, TupleVariable) and i.items and i.items[0].is_constant() for i in items):
        return None
    heads = [i.items[0].as_constant() for i in items]  # type: ignore[attr-defined]
    try:
        if len(set(heads)) != len(heads):
            return None
        sorted(heads)
    except TypeError:
        return None
    return heads
