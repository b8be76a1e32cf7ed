"""Dict views during capture: `d.keys()`, `d.values()` and `d.items()` as live views of their dict.

A view holds no items of its own: its length, membership, iteration (forwards and reversed) and
set operations read the dict as it is when they run, so a view taken before the dict changes sees
the change, as in CPython. Keys views, and items views whose values are constants, support the
set operators (`&`, `|`, `-`, `^`) and comparisons; a view returned from the frame or live at a
graph break is rebuilt as the view of its dict. Corresponds to the DictKeysVariable,
DictValuesVariable and DictItemsVariable of torch/_dynamo/variables/dicts.py.
"""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Sequence

from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.dict import DictVariable, key_of, key_variable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.variables.iterator import IteratorVariable
    from kiln.capture.tracer import Tracer

VIEW_KINDS = ("keys", "values", "items")
_VIEW_TYPES = {kind: type(getattr({}, kind)()) for kind in VIEW_KINDS}


class DictViewVariable(Variable):
    """`dict_var.<kind>()`: every question is answered from the dict's current items."""

    def __init__(self, dict_var: DictVariable, kind: str) -> None:
        assert kind in VIEW_KINDS, kind
        self.dict_var = dict_var
        self.kind = kind

    def describe(self) -> str:
        return f"{self.kind} view of {self.dict_var.describe()}"

    def python_type(self) -> type:
        return _VIEW_TYPES[self.kind]

    def truth(self, tx: "Tracer") -> bool:
        return bool(self.dict_var.items)

    def length(self, tx: "Tracer") -> Variable:
        return ConstantVariable(len(self.dict_var.items))

    def iterate(self, tx: "Tracer") -> list[Variable]:
        from kiln.capture.variables.sequence import TupleVariable

        items = self.dict_var.items
        if self.kind == "keys":
            return [key_variable(tx, k) for k in items]
        if self.kind == "values":
            return list(items.values())
        return [TupleVariable([key_variable(tx, k), v]) for k, v in items.items()]

    def open_iterator(self, tx: "Tracer") -> "IteratorVariable | None":
        return self.dict_var.live_iterator(tx, self.kind)

    def as_set(self, tx: "Tracer") -> set[Any] | None:
        """The view as a Python set (keys; items whose values are constants), else None."""
        if self.kind == "keys":
            return set(self.dict_var.items)
        if self.kind == "items" and all(v.is_constant() for v in self.dict_var.items.values()):
            return {(k, v.as_constant()) for k, v in self.dict_var.items.items()}
        return None

    def getattr(self, tx: "Tracer", name: str) -> Variable:

        if name == "mapping":
            raise Unsupported("the `mapping` of a dict view", kind="unsupported_attribute")
        if not hasattr(self.python_type(), name):
            from kiln.capture.variables.exception import raise_in_trace
            message = f"{self.python_type().__name__!r} object has no attribute {name!r}"
            raise raise_in_trace(AttributeError(message), f"{message} (raised natively)")
        return BoundMethodVariable(self, name)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.iterator import IteratorVariable

        if kwargs:
            raise Unsupported(f"{self.python_type().__name__}.{name} with keyword arguments", kind="unsupported_call")
        if name == "__len__" and not args:
            return self.length(tx)
        if name == "__iter__" and not args:
            live = self.dict_var.live_iterator(tx, self.kind)
            return live if live is not None else IteratorVariable(self.iterate(tx))
        if name == "__reversed__" and not args:
            live = self.dict_var.live_iterator(tx, self.kind, reverse=True)
            return live if live is not None else IteratorVariable(list(reversed(self.iterate(tx))))
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(self.contains(tx, args[0]))
        if name == "isdisjoint" and len(args) == 1:
            mine = self._constant_set(tx)
            return ConstantVariable(mine.isdisjoint(_constant_items(tx, args[0])))
        if name in _SET_METHODS and len(args) == 1:
            return view_operator(tx, _SET_METHODS[name], self, args[0])
        raise Unsupported(f"{self.python_type().__name__}.{name}", kind="unsupported_call")

    def contains(self, tx: "Tracer", item: Variable) -> bool:
        items = self.dict_var.items
        if self.kind == "keys":
            return key_of(item) in items
        if self.kind == "items":
            pair = tx.iterate(item) if _is_pair(item) else None
            if pair is None or len(pair) != 2:
                return False
            key = key_of(pair[0])
            if key not in items:
                return False
            candidates = [items[key]]
            needle = pair[1]
        else:
            candidates = list(items.values())
            needle = item
        for candidate in candidates:
            same = tx.known_equal(needle, candidate)
            if same is None:
                raise Unsupported(f"`in` comparing {needle.describe()} with a dict's values", kind="unsupported")
            if same:
                return True
        return False

    def _constant_set(self, tx: "Tracer") -> set[Any]:
        mine = self.as_set(tx)
        if mine is None:
            raise Unsupported(f"set operations on a {self.kind} view of values unknown at trace time",
                              kind="unsupported")
        return mine

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.reconstruct(self.dict_var)}.{self.kind}()"


# the set methods of keys and items views, by the operator they stand for
_SET_METHODS = {"__and__": "&", "__or__": "|", "__sub__": "-", "__xor__": "^", "__rand__": "&",
                "__ror__": "|", "__rxor__": "^"}
_SET_OPERATORS = {"&": operator.and_, "|": operator.or_, "-": operator.sub, "^": operator.xor}
_SET_COMPARISONS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
                    ">": operator.gt, ">=": operator.ge, "eq": operator.eq, "ne": operator.ne,
                    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}


def _is_pair(var: Variable) -> bool:
    try:
        return issubclass(var.python_type(), tuple)
    except Unsupported:
        return False


def _constant_items(tx: "Tracer", var: Variable) -> set[Any]:
    """The elements of the other operand of a set operation, as Python values."""
    if isinstance(var, DictViewVariable):
        return var._constant_set(tx)
    if var.is_constant() or _set_like(var):  # a set (sets.py): its constant elements
        return set(var.as_constant())
    return {_hashable_constant(item) for item in tx.iterate(var)}


def _hashable_constant(var: Variable) -> Any:
    if var.is_constant():
        return var.as_constant()
    return key_of(var)


def involves_view(a: Variable, b: Variable) -> bool:
    return isinstance(a, DictViewVariable) or isinstance(b, DictViewVariable)


def view_operator(tx: "Tracer", symbol: str, a: Variable, b: Variable) -> Variable:
    """`a <symbol> b` where one side is a dict view: the set operators and comparisons of keys and
    items views (a values view compares by identity, as CPython's does)."""
    if symbol in _SET_COMPARISONS:
        fn = _SET_COMPARISONS[symbol]
        if any(isinstance(v, DictViewVariable) and v.kind == "values" for v in (a, b)):
            if symbol not in ("==", "!=", "eq", "ne"):
                raise Unsupported(f"{a.describe()} {symbol} {b.describe()}", kind="unsupported")
            return ConstantVariable((a is b) == (symbol in ("==", "eq")))
        if not _set_like(a) or not _set_like(b):
            # a view equals only a set-like value; ordering against anything else is a TypeError
            if symbol in ("==", "!=", "eq", "ne"):
                return ConstantVariable(symbol in ("!=", "ne"))
            raise Unsupported(f"{a.describe()} {symbol} {b.describe()} (raised natively)", kind="unsupported")
        return ConstantVariable(fn(_constant_items(tx, a), _constant_items(tx, b)))
    if symbol not in _SET_OPERATORS:
        raise Unsupported(f"{a.describe()} {symbol} {b.describe()} (raised natively)", kind="unsupported")
    if any(isinstance(v, DictViewVariable) and v.kind == "values" for v in (a, b)):
        raise Unsupported(f"{a.describe()} {symbol} {b.describe()} (raised natively)", kind="unsupported")
    # A view with any iterable gives a set, whichever side the view is on.
    return tx.wrap_result(_SET_OPERATORS[symbol](_constant_items(tx, a), _constant_items(tx, b)))


def _set_like(var: Variable) -> bool:
    if isinstance(var, DictViewVariable):
        return True
    try:
        return issubclass(var.python_type(), (set, frozenset))
    except Unsupported:
        return False
