"""Sets and frozensets whose elements are tracked values, in eager's iteration order.

Elements are keyed as dict keys are (dict.py's key_of: constants, values hashed by identity); an
element whose class writes __hash__ and __eq__ in Python is found by tracing them (user_hashed_keys,
through `SetVariable.key_resolver`). A set from the caller that the frame mutates is rewritten by
the glue after the graph has run. Corresponds to the set kinds of torch/_dynamo/variables/dicts.py.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Sequence

from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.dict import DictVariable, IdentityKey, constant_keys, key_error, key_of, key_text, key_variable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.sources import Source
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.iterator import IteratorVariable


def _lazy(v: Variable) -> bool:
    """An iterator or a generator: its elements are read one at a time, with code run between."""
    from kiln.capture.variables.iterator import IteratorVariable
    return isinstance(v, IteratorVariable)


class SetVariable(Variable):
    """A set (or frozenset) of constants or of values hashed by identity (tensors); `items` maps
    each element's key to the element.

    Eager iterates a set of constants in the order of its hash table, which depends on how the set
    was built (one add at a time, or merged from another set, a dict) and on what was removed:
    `shadow` is a real set of the keys that goes through the same operations, and gives that
    order. An element whose class hashes in Python is in the shadow as its HashedKey (its traced
    hash; equal only to itself: no two elements of one set are equal), so the shadow keeps eager's
    table there too. Once an identity-hashed element is in, `shadow` is None and iteration follows
    insertion (eager's order then depends on addresses)."""

    # user_hashed_keys.key_for, set by that module (it imports this one): the key of the element a
    # lookup finds where a user class's __hash__/__eq__ decides
    key_resolver: "Callable[[Tracer, SetVariable, Variable, bool], Any] | None" = None

    def __init__(self, items: Sequence[Variable], set_type: type = set, source: "Source | None" = None,
                 shadow: set | None = None) -> None:
        self.items: dict[Any, Variable] = {}
        for item in items:
            self.items.setdefault(key_of(item), item)  # an equal element already there stays
        self.set_type = set_type
        self.source = source
        # The element operations (add, discard, pop, clear) the shadow went through, from empty for a
        # set made in the frame, since it was read for one from outside; None once another kind of
        # operation changed it. `removed`: an element left the table (its slot keeps a dummy, pop
        # moves a finger), which a copy of the table would not keep.
        self.log: list[tuple[str, tuple]] | None = [] if source is not None else None
        self.removed = False
        if shadow is None and _shadowable(self.items):
            shadow = set()
            for key in self.items:  # BUILD_SET and set(list) add one element at a time
                shadow.add(key)
            self.log = [("add", (key,)) for key in self.items]
        self.shadow = shadow if _shadowable(self.items) else None
        # A set from outside whose table Kiln does not have (its shadow is a copy, which may iterate
        # differently and holds no dummies): `items` keeps its iteration order, which an element's
        # removal keeps and `order_guard` guards when read; once the frame adds an element (where it
        # lands depends on the real table) or pops one (where pop looks), its order is not known.
        self.foreign = False
        self.order_guard: Callable[[], None] | None = None
        self.changed = False
        self.grown = False

    def made_foreign(self, order_guard: Callable[[], None] | None) -> "SetVariable":
        """This set stands for one from outside whose hash table Kiln cannot copy."""
        self.foreign, self.order_guard = True, order_guard
        return self

    def _real_order_read(self) -> None:
        if self.order_guard is not None:
            self.order_guard()
            self.order_guard = None

    def _table(self, why: str) -> set | None:
        """The shadow, as the table of a real operation that copies or iterates this set: for a
        foreign set only while the frame has not changed it and the copy iterates as it does (a
        copy of it is then a copy of the caller's, and an iteration sees eager's order)."""
        if self.foreign:
            if self.changed or self.shadow is None or list(self.shadow) != list(self.items):
                raise Unsupported(f"{why} a {self.describe()} from outside the frame that it changed or whose "
                                  "hash table Kiln cannot copy (eager's order follows that table)", kind="unsupported")
            self._real_order_read()
        return self.shadow

    @staticmethod
    def built(tx: "Tracer", items: Sequence[Variable], set_type: type = set) -> "SetVariable":
        """`{a, b, ...}` and set(iterable): the elements added one at a time, a user-hashed one
        found or added by its traced __hash__ and __eq__."""
        made = SetVariable([], set_type)
        for item in items:
            made._insert(tx, item)
        return made

    def _key(self, tx: "Tracer", var: Variable, write: bool = False) -> Any:
        resolver = SetVariable.key_resolver
        return key_of(var) if resolver is None else resolver(tx, self, var, write)

    def _insert(self, tx: "Tracer", item: Variable) -> None:
        key = self._key(tx, item, write=True)
        if key in self.items:
            return  # an equal element already there stays
        self.items[key] = item
        if self.shadow is not None:
            self.shadow = self._shadow_op("add", [key]) if _shadowable([key]) else None
        if self.log is not None:
            self.log.append(("add", (key,)))

    def _no_equal_strangers(self, tx: "Tracer", others: dict[Any, Variable]) -> None:
        """An operation with another set's elements, where a user-hashed one on either side is equal
        to a different object on the other: which object eager keeps (and the shadow's table) is not
        followed, so that is refused. Elements that are the same object, or not equal, are exact."""
        if not any(getattr(k, "by_hash", False) for k in (*self.items, *others)):
            return
        for key, var in others.items():
            found = self._key(tx, var)
            if found in self.items and found != key:
                raise Unsupported(f"a set operation between equal user-hashed elements that are different objects "
                                  f"({var.describe()})", kind="unsupported")

    def describe(self) -> str:
        return f"{self.set_type.__name__} of {len(self.items)}"

    def python_type(self) -> type:
        return self.set_type

    def identity(self) -> Any:
        return self

    def is_constant(self) -> bool:
        return constant_keys(self.items)

    def as_constant(self) -> Any:
        if not self.is_constant():
            return super().as_constant()
        return self.set_type(self.ordered_keys())

    def truth(self, tx: "Tracer") -> bool:
        return bool(self.items)

    def length(self, tx: "Tracer") -> Variable:
        return ConstantVariable(len(self.items))

    def ordered_keys(self) -> list[Any]:
        """The keys in the order eager iterates the set."""
        if self.foreign:
            if self.grown:
                raise Unsupported(f"the order of a {self.describe()} from outside the frame after the frame added to "
                                  "it or popped from it (it follows the caller's hash table, which Kiln cannot copy)",
                                  kind="unsupported")
            self._real_order_read()
            return list(self.items)
        if self.shadow is not None:
            return list(self.shadow)
        return list(self.items)

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return [self.items[k] for k in self.ordered_keys()]

    def open_iterator(self, tx: "Tracer") -> "IteratorVariable":
        """An iterator that raises eager's RuntimeError once the set's size changed."""
        made = DictVariable.iterator_kind  # live_iterators.ContainerIteratorVariable, sets too
        if made is None:
            from kiln.capture.variables.iterator import IteratorVariable
            return IteratorVariable(self.iterate(tx))
        return made(self, "set", lambda key: self.items[key], False)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.exception import no_attribute

        if not hasattr(self.set_type, name):
            raise no_attribute(self.set_type, name)
        return BoundMethodVariable(self, name)

    def _operand(self, tx: "Tracer", other: Variable) -> tuple[dict[Any, Variable], Any]:
        """Another operand's elements, and the real object eager would hand the set operation (a
        set, a dict or a sequence of keys: each takes its own path through CPython's set code);
        None for the latter once an element is hashed by identity."""
        if isinstance(other, SetVariable):
            self._no_equal_strangers(tx, other.items)
            return dict(other.items), other._table("a set operation with")
        if isinstance(other, DictVariable):
            keys = {k: key_variable(tx, k) for k in other.items}
            self._no_equal_strangers(tx, keys)
            return keys, dict.fromkeys(other.items) if _shadowable(other.items) else None
        found = SetVariable.built(tx, tx.iterate(other)).items
        self._no_equal_strangers(tx, found)
        if other.is_constant() and type(other.as_constant()) is frozenset:
            return found, other.as_constant()  # `{1, 2, 3}` is BUILD_SET + SET_UPDATE of a frozenset constant
        real = tuple(found) if other.python_type() is tuple else list(found)
        return found, real if _shadowable(found) else None

    def update_from(self, tx: "Tracer", other: Variable) -> "SetVariable":
        """This (empty, new) set filled as `set(other)` fills it."""
        self.items, real = self._operand(tx, other)
        self.shadow = set(real) if real is not None and _shadowable(self.items) else None
        # set(list) adds one element at a time; from a set or a dict CPython copies another table
        self.log = [("add", (key,)) for key in real] if isinstance(real, (list, tuple)) else None
        return self

    def _result(self, items: dict[Any, Variable], shadow: Any) -> tuple[dict[Any, Variable], set | None]:
        return items, shadow if _shadowable(items) else None

    def _replace(self, tx: "Tracer", items: dict[Any, Variable], shadow: set | None,
                 logged: tuple[str, tuple] | None = None) -> Variable:
        """The set's new elements and shadow after an in-place method; `logged`: the element
        operation it was (None: another kind)."""
        if self.set_type is not set:
            raise Unsupported(f"{self.set_type.__name__} has no in-place methods (raised natively)",
                              kind="unsupported")
        tx.side_effects.mutate(self)
        self.changed = True
        self.grown = self.grown or any(k not in self.items for k in items)
        self.removed = self.removed or any(k not in items for k in self.items)
        self.log = None if logged is None or self.log is None else [*self.log, logged]
        self.items, self.shadow = self._result(items, shadow)
        return ConstantVariable(None)

    def _made(self, items: dict[Any, Variable], shadow: set | None, set_type: type | None = None) -> "SetVariable":
        made = SetVariable([], set_type or self.set_type)
        made.items, made.shadow = self._result(items, shadow)
        made.log = None  # another table's operation made it (a copy holds no dummies: not `removed`)
        return made

    def _shadow_op(self, name: str, reals: list[Any]) -> Any:
        """The real set operation on the shadow: in place for the methods that change a set (only
        sets have them; the shadow then has the table eager's set has), else the new set it makes.
        None when some operand has no real form."""
        if self.shadow is None or any(r is None for r in reals):
            return None
        result = getattr(self.shadow, name)(*reals)
        return self.shadow if result is None else set(result) if isinstance(result, frozenset) else result

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.exception import raise_in_trace

        if kwargs:
            raise Unsupported(f"{self.set_type.__name__}.{name} with keyword arguments", kind="unsupported_call")
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(self._key(tx, args[0]) in self.items)
        if name == "__len__" and not args:
            return self.length(tx)
        if name == "__iter__" and not args:
            return self.open_iterator(tx)
        if name == "add" and len(args) == 1 and self.set_type is set:
            key = self._key(tx, args[0], write=True)
            if key not in self.items:
                items = {**self.items, key: args[0]}
                return self._replace(tx, items, self._shadow_op("add", [key]) if _shadowable([key]) else None,
                                     ("add", (key,)))
            return ConstantVariable(None)
        if name in ("discard", "remove") and len(args) == 1:
            key = self._key(tx, args[0])
            if key not in self.items:
                if name == "remove":
                    raise key_error(key, args[0])
                return ConstantVariable(None)
            return self._replace(tx, {k: v for k, v in self.items.items() if k != key},
                                 self._shadow_op("discard", [key]), ("discard", (key,)))
        if name == "pop" and not args:
            if not self.items:
                raise raise_in_trace(KeyError("pop from an empty set"), "KeyError: pop from an empty set (raised natively)")
            if self.foreign:
                raise Unsupported(f"set.pop on a {self.describe()} from outside the frame (which element it pops "
                                  "follows the caller's hash table, which Kiln cannot copy)", kind="unsupported")
            shadow = self.shadow
            first = shadow.pop() if shadow is not None else next(iter(self.items))  # where eager's pop looks
            popped = self.items[first]
            # (the shadow of a set from outside is a copy of it, which may not hold its dummies: where
            # its pop looks is not replayed on the real one)
            self._replace(tx, {k: v for k, v in self.items.items() if k != first}, shadow,
                          ("pop", ()) if self.source is None else None)
            return popped
        if name == "clear" and not args:
            return self._replace(tx, {}, self._shadow_op("clear", []) if self.shadow is not None else set(),
                                 ("clear", ()))
        if name == "copy" and not args:
            table = self._table("copying")
            return self._made(dict(self.items), None if table is None else table.copy())
        if name in ("update", "difference_update") and self.set_type is set and args and all(_lazy(a) for a in args):
            # an iterator or generator: each element added (discarded) as it is read, so one that
            # raises midway leaves the set changed by the elements before it, as eager's does
            for arg in args:
                for item in arg.each_item(tx):
                    self.call_method(tx, "add" if name == "update" else "discard", [item], {})
            return ConstantVariable(None)
        operands = [self._operand(tx, a) for a in args]
        others = [o[0] for o in operands]
        combined = _combine(name.removesuffix("_update"), self.items, others)
        if combined is not None:
            if not (name.endswith("_update") or name == "update"):
                self._table(f"{self.set_type.__name__}.{name} of")
            shadow = self._shadow_op(name, [o[1] for o in operands])
            if name.endswith("_update") or name == "update":
                reals = tuple(o[1] for o in operands)
                # a frozenset's shadow never changes: bound as it is, it replays what the shadow met
                stable = all(_replayable(real) or isinstance(arg, SetVariable) and arg.set_type is frozenset
                             and real is not None for arg, real in zip(args, reals))
                return self._replace(tx, combined, shadow, (name, reals) if stable else None)
            return self._made(combined, shadow)
        if name in ("issubset", "issuperset", "isdisjoint") and len(others) == 1:
            mine, theirs = set(self.items), set(others[0])
            answer = {"issubset": mine <= theirs, "issuperset": mine >= theirs,
                      "isdisjoint": not mine & theirs}[name]
            return ConstantVariable(answer)
        raise Unsupported(f"{self.set_type.__name__}.{name}", kind="unsupported_call")

    def binary(self, tx: "Tracer", symbol: str, other: Variable, inplace: bool) -> Variable:
        """`self <symbol> other` for the set operators | & - ^ (in place for `|=` & co. on a set)."""
        name = {"|": "union", "&": "intersection", "-": "difference", "^": "symmetric_difference"}.get(symbol)
        if not isinstance(other, SetVariable) or name is None:
            raise Unsupported(f"{self.describe()} {symbol} {other.describe()} (raised natively)", kind="unsupported")
        self._no_equal_strangers(tx, other.items)
        if not (inplace and self.set_type is set):
            self._table(f"`{symbol}` on")
        other._table(f"`{symbol}` with")
        combined = _combine(name, self.items, [other.items])
        assert combined is not None
        if inplace and self.set_type is set:
            self._replace(tx, combined, self._shadow_op(f"{name}_update" if name != "union" else "update", [other.shadow]))
            return self
        real = None
        if self.shadow is not None and other.shadow is not None:
            # the operator on real sets of the operands' types (frozenset | set is a frozenset)
            left, right = self.set_type(self.shadow), other.set_type(other.shadow)
            result = _OPERATORS[symbol](left, right)
            real = result if type(result) is set else set(result)
        return self._made(combined, real)

    def compare(self, symbol: str, other: Variable) -> bool:
        """`self <symbol> other` for == != < <= > >= between sets (subset order)."""
        if not isinstance(other, SetVariable):
            return symbol in ("!=", "ne")
        if any(getattr(k, "by_hash", False) for k in (*self.items, *other.items)):
            raise Unsupported("comparing sets of user-hashed elements", kind="unsupported")
        mine, theirs = set(self.items), set(other.items)
        ops = {"==": mine == theirs, "!=": mine != theirs, "<": mine < theirs, "<=": mine <= theirs,
               ">": mine > theirs, ">=": mine >= theirs}
        return {"eq": ops["=="], "ne": ops["!="], "lt": ops["<"], "le": ops["<="], "gt": ops[">"],
                "ge": ops[">="], **ops}[symbol]

    def replay(self, glue: "GlueBuilder", target: str) -> None:
        """The glue's update of a set from outside that the frame changed: its element operations
        run on it again when known (eager's table, dummies included), else its new elements."""
        if self.log is not None and _log_replayable(self.log):
            for name, args in self.log:
                glue.line(f"{target}.{name}({', '.join(glue.constant(a) for a in args)})")
            return
        tmp = glue.fresh("s")
        elements = "".join(key_text(glue, k) + ", " for k in self.items)
        glue.line(f"{tmp} = ({elements})")
        glue.line(f"{target}.clear()")
        glue.line(f"{target}.update({tmp})")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()
        if self.removed:
            # eager's table keeps the dummies of removed elements (and pop's finger), which later
            # adds see: rebuilt by the same element operations, or not at all
            if self.log is None or not _log_replayable(self.log):
                raise Unsupported(f"rebuilding a {self.describe()} whose elements were removed in the frame "
                                  "(eager's table order)", kind="reconstruct")
            return f"{glue.constant(replayed_set)}({glue.constant(tuple(self.log))})"
        if self.is_constant():
            if self.set_type is frozenset:
                return glue.constant(self.as_constant())
            # a copy per call (the bound set is never handed out), with the shadow's table layout
            return f"{glue.constant(self.shadow if self.shadow is not None else self.as_constant())}.copy()"
        parts = "".join(glue.reconstruct(self.items[k]) + ", " for k in self.ordered_keys())
        return f"{glue.constant(self.set_type)}(({parts}))"


# id -> (the set replayed_set made for the glue, its log): a set the glue handed to the next
# frame (the resume function after a break) has a table its copy would not keep; the builder
# replays it again for that frame's shadow (replayed_shadow_of)
_REPLAYED: dict[int, tuple[weakref.ref, tuple]] = {}


def replayed_set(log: tuple[tuple[str, tuple], ...]) -> set:
    """A set made by the operations of `log` from empty: eager's table, dummies included."""
    made = _replay(log)
    key = id(made)
    _REPLAYED[key] = (weakref.ref(made, lambda _: _REPLAYED.pop(key, None)), log)
    return made


def _replay(log: tuple[tuple[str, tuple], ...]) -> set:
    made: set = set()
    for name, args in log:
        getattr(made, name)(*args)
    return made


def replayed_shadow_of(value: set | frozenset) -> set | None:
    """The shadow of a set from outside that the glue rebuilt and that still iterates as the rebuild
    did: the rebuild again (its table, dummies included); None for any other set (whose table a
    copy does not have: SetVariable.made_foreign)."""
    known = _REPLAYED.get(id(value))
    if known is not None and known[0]() is value:
        again = _replay(known[1])
        if list(again) == list(value):
            return again
    return None


def _replayable(value: Any) -> bool:
    """An argument the log may keep, the glue binding it as it is: constants, and tuples, lists and
    frozensets of them (a frozenset of the code's constants: its own table, which update merges as
    eager's). The shadow of a set changes later: not one."""
    if isinstance(value, (tuple, list, frozenset)):
        return all(map(_replayable, value))
    return not isinstance(value, (IdentityKey, set, dict))


def _log_replayable(log: list[tuple[str, tuple]]) -> bool:
    """Whether the glue can run `log` again: every argument bindable (a frozenset operand's
    shadow too: a set of constants that no operation changes)."""
    return all(_replayable(a) or type(a) is set and all(map(_replayable, a))
                                   for _, args in log for a in args)


def _shadowable(keys: Any) -> bool:
    """Whether a real set of these keys has eager's table: constants, and user-hashed elements."""
    return all(getattr(k, "by_hash", True) for k in keys)


_OPERATORS = {"|": lambda a, b: a | b, "&": lambda a, b: a & b, "-": lambda a, b: a - b, "^": lambda a, b: a ^ b}


def _combine(name: str, mine: dict[Any, Variable], others: list[dict[Any, Variable]]) -> dict[Any, Variable] | None:
    """The elements of set operation `name` (union, intersection, difference, symmetric_difference),
    None for any other name. An element already in the result stays (CPython keeps the first)."""
    result = dict(mine)
    if name == "union" or name == "update":
        for other in others:
            for key, value in other.items():
                result.setdefault(key, value)
        return result
    if name == "intersection":
        for other in others:
            result = {k: v for k, v in result.items() if k in other}
        return result
    if name == "difference":
        for other in others:
            result = {k: v for k, v in result.items() if k not in other}
        return result
    if name == "symmetric_difference" and len(others) == 1:
        result = {k: v for k, v in mine.items() if k not in others[0]}
        result.update({k: v for k, v in others[0].items() if k not in mine})
        return result
    return None
