"""Tuples and lists (and namedtuples, torch.Size) whose items are themselves tracked values.

Tuples are immutable; lists are mutated in place during the trace, and a list that came from the
caller (it has a source) is reported to the side-effect log so the glue rewrites its contents after
the graph has run. Corresponds to torch/_dynamo/variables/lists.py.
"""
from __future__ import annotations

import collections
import operator
import types
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, Sequence, TypeGuard

import torch

from kiln.capture.trace_rules import BUILTIN_RULES, python_new
from kiln.capture.variables.base import BoundMethodVariable, Variable, constant_args
from kiln.capture.variables.constant import ConstantVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.sources import Source
    from kiln.capture.tracer import Tracer


def _index(tx: "Tracer", key: Variable) -> Any:
    from kiln.capture.variables.slice import SliceVariable
    from kiln.capture.variables.symint import SymIntVariable

    if isinstance(key, SliceVariable):
        return key.as_slice(tx)
    if isinstance(key, SymIntVariable):
        return key.specialize()
    return key.as_constant()


def _raised(error: Exception) -> Exception:
    """The trace-time raise of `error`, where the program's handlers can catch it."""
    from kiln.capture.variables.exception import raise_in_trace
    return raise_in_trace(error, f"{type(error).__name__}: {error} (raised natively)")


def native(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn` on constants, its IndexError, ValueError or TypeError raised in the trace as eager raises it."""
    try:
        return fn(*args, **kwargs)
    except (IndexError, ValueError, TypeError) as error:
        raise _raised(error) from None


class _NamedTupleClass(Protocol):
    _fields: ClassVar[tuple[str, ...]]
    _field_defaults: ClassVar[dict[str, Any]]


def is_namedtuple_type(cls: type) -> TypeGuard[type[_NamedTupleClass]]:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def is_structseq_type(cls: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "n_fields")


class BaseSequenceVariable(Variable):
    """What tuples and lists share: items, indexing, iteration, counting."""

    items: list[Variable]

    def python_type(self) -> type:
        raise NotImplementedError

    def is_constant(self) -> bool:
        return all(i.is_constant() for i in self.items)

    def length(self, tx: "Tracer") -> Variable:
        return ConstantVariable(len(self.items))

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return list(self.items)

    def truth(self, tx: "Tracer") -> bool:
        return bool(self.items)

    def getitem(self, tx: "Tracer", key: Variable) -> Variable:
        index = _index(tx, key)
        if isinstance(index, slice):
            return self.rebuild(native(self.items.__getitem__, index))  # a zero step: eager's ValueError
        try:
            return self.items[index]
        except (IndexError, TypeError) as exc:
            from kiln.capture.variables.exception import raise_in_trace
            kind = self.python_type()
            name = "tuple" if issubclass(kind, tuple) else "deque" if issubclass(kind, collections.deque) else "list"
            if name != "list" and str(exc).startswith("list "):
                exc = type(exc)(f"{name} {str(exc)[len('list '):]}")  # the items are held in a list: eager's text
            raise raise_in_trace(exc, f"{type(exc).__name__}: {exc} (raised natively)") from None

    def rebuild(self, items: list[Variable]) -> Variable:
        raise NotImplementedError

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__len__":
            return self.length(tx)
        if name in ("count", "index", "__contains__") and constant_args(args, kwargs) and self.is_constant():
            try:
                return ConstantVariable(getattr(self.as_constant(), name)(*[a.as_constant() for a in args]))
            except ValueError as missing:  # index of a missing item, raised where the program can catch it
                from kiln.capture.variables.exception import raise_in_trace
                raise raise_in_trace(missing, f"ValueError: {missing} (raised natively)") from None
        if name in ("count", "index") and len(args) == 1 and not kwargs:
            # item by item as CPython does (`item is x or item == x`, stopping at index's first
            # match), each `==` traced (a user __eq__ runs) and known at trace time, or a break
            found = 0
            for n, item in enumerate(self.items):
                equal = ConstantVariable(True) if item is args[0] else tx.compare_op("==", item, args[0])
                if not equal.is_constant() and equal.python_type() is bool and _symbolic(equal):
                    equal = ConstantVariable(equal.truth(tx))  # a size compared: decided and guarded
                if not equal.is_constant():
                    raise Unsupported(f"{self.python_type().__name__}.{name} comparing {args[0].describe()}",
                                      kind="unsupported_call")
                if equal.as_constant():
                    if name == "index":
                        return ConstantVariable(n)
                    found += 1
            if name == "count":
                return ConstantVariable(found)
            from kiln.capture.variables.exception import raise_in_trace
            absent = ValueError(f"{self.python_type().__name__}.index(x): x not in {self.python_type().__name__}")
            raise raise_in_trace(absent, f"ValueError: {absent} (raised natively)")
        raise Unsupported(f"{self.python_type().__name__}.{name}", kind="unsupported_call")

    def getattr(self, tx: "Tracer", name: str) -> Variable:

        if not hasattr(self.python_type(), name):
            # `hasattr(output, "buckets")` on a namedtuple without that field must be False
            from kiln.capture.variables.exception import no_attribute
            raise no_attribute(self.python_type(), name)
        return BoundMethodVariable(self, name)


def product(tx: "Tracer", items: list[Variable]) -> Variable:
    """The product of numbers, folded when constant (Size.numel())."""
    result: Variable = ConstantVariable(1)
    for item in items:
        result = tx.binary_op("*", result, item)
    return result


def _symbolic(value: Variable) -> bool:
    from kiln.capture.variables.symint import SymIntVariable
    return isinstance(value, SymIntVariable)


def _user_attribute(cls: type, name: str) -> Any:
    """`name` as defined by a class of `cls`'s MRO written in Python (not tuple or object)."""
    for klass in cls.__mro__:
        if klass in (tuple, object):
            return None
        if name in vars(klass):
            return vars(klass)[name]
    return None


class TupleVariable(BaseSequenceVariable):
    """A tuple, namedtuple, torch.Size or torch.return_types structseq."""

    # the real tuple of one read from outside (set by the builder): two tuples from outside are one
    # object or not as theirs are (a new Variable per read: tuples are not kept by identity)
    real: "tuple | None" = None

    def __init__(self, items: Sequence[Variable], tuple_type: type = tuple, source: "Source | None" = None) -> None:
        self.items = list(items)
        self.tuple_type = tuple_type
        self.source = source

    def describe(self) -> str:
        return f"{self.tuple_type.__name__} of {len(self.items)}"

    def python_type(self) -> type:
        return self.tuple_type

    def as_constant(self) -> Any:
        values = [i.as_constant() for i in self.items]
        if python_new(self.tuple_type) is not None:  # its own __new__ maps arguments to items: not again
            return tuple.__new__(self.tuple_type, values)
        if is_namedtuple_type(self.tuple_type):
            return self.tuple_type(*values)
        try:
            return self.tuple_type(values)
        except TypeError:  # a structseq Python cannot make (sys.version_info, sys.flags): its items
            return tuple(values)

    def rebuild(self, items: list[Variable]) -> Variable:
        kind = torch.Size if self.tuple_type is torch.Size else tuple
        return TupleVariable(items, kind)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        fields = getattr(self.tuple_type, "_fields", ()) or getattr(self.tuple_type, "__match_args__", ())
        if name in fields:
            return self.items[list(fields).index(name)]
        if name in ("_fields",) and fields:
            return tx.wrap_result(tuple(fields))
        if name in ("_replace", "_asdict") and is_namedtuple_type(self.tuple_type):
            return BoundMethodVariable(self, name)
        if is_namedtuple_type(self.tuple_type) or python_new(self.tuple_type) is not None:
            method = _user_attribute(self.tuple_type, name)
            if isinstance(method, types.FunctionType):  # a method of a typing.NamedTuple class
                return tx.bind_method(method, self)
            if isinstance(method, property) and method.fget is not None:
                return tx.wrap(method.fget, None).call(tx, [self], {})
            if isinstance(method, staticmethod):  # `self.make(...)` on a namedtuple subclass
                return tx.wrap(method.__func__, None)
            if isinstance(method, classmethod):
                bound = tx.class_attribute(method, self, self.tuple_type, None)  # bound to the class
                assert bound is not None
                return bound
        return super().getattr(tx, name)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        if name == "_replace" and is_namedtuple_type(self.tuple_type):
            items = list(self.items)
            for key, value in kwargs.items():
                items[list(self.tuple_type._fields).index(key)] = value
            return TupleVariable(items, self.tuple_type)
        if name == "_asdict" and not args and is_namedtuple_type(self.tuple_type):
            from kiln.capture.variables.dict import DictVariable
            return DictVariable(dict(zip(self.tuple_type._fields, self.items)))
        if name == "numel" and self.tuple_type is torch.Size:
            return product(tx, self.items)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()
        parts = [glue.reconstruct(i) for i in self.items]
        body = ", ".join(parts) + ("," if len(parts) == 1 else "")
        if self.tuple_type is tuple:
            return f"({body})"
        if python_new(self.tuple_type) is not None:  # its own __new__ maps arguments to items: not again
            return f"{glue.constant(tuple.__new__)}({glue.constant(self.tuple_type)}, ({body}))"
        if is_namedtuple_type(self.tuple_type):
            return f"{glue.constant(self.tuple_type)}({', '.join(parts)})"
        return f"{glue.constant(self.tuple_type)}(({body}))"


class ListVariable(BaseSequenceVariable):
    """A list. Mutations of a list from outside the frame are replayed by the glue."""

    def __init__(self, items: Sequence[Variable], source: "Source | None" = None) -> None:
        self.items = list(items)
        self.source = source

    def describe(self) -> str:
        return f"list of {len(self.items)}"

    def python_type(self) -> type:
        return list

    def as_constant(self) -> Any:
        return [i.as_constant() for i in self.items]

    def rebuild(self, items: list[Variable]) -> Variable:
        return ListVariable(items)

    def _mutated(self, tx: "Tracer") -> None:
        tx.side_effects.mutate(self)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        none = ConstantVariable(None)
        if name == "append" and len(args) == 1:
            self._mutated(tx)
            self.items.append(args[0])
            return none
        if name in ("extend", "__iadd__") and len(args) == 1:
            self._mutated(tx)
            # appended as each is read: a generator over this list sees it grow, as in eager
            self.items.extend(list(self.items) if args[0] is self else args[0].each_item(tx))
            return self if name == "__iadd__" else none
        if name == "insert" and len(args) == 2:
            where = native(operator.index, _index(tx, args[0]))  # insert("a", v) is eager's TypeError
            self._mutated(tx)
            self.items.insert(where, args[1])
            return none
        if name == "pop" and len(args) <= 1:
            at = native(operator.index, _index(tx, args[0])) if args else -1
            if not self.items or not -len(self.items) <= at < len(self.items):
                raise _raised(IndexError("pop from empty list" if not self.items else "pop index out of range"))
            self._mutated(tx)
            return self.items.pop(at)
        if name == "clear" and not args:
            self._mutated(tx)
            self.items.clear()
            return none
        if name == "reverse" and not args:
            self._mutated(tx)
            self.items.reverse()
            return none
        if name == "copy" and not args:
            return ListVariable(self.items)
        if name == "remove" and len(args) == 1 and self.is_constant() and args[0].is_constant():
            values = [i.as_constant() for i in self.items]
            if args[0].as_constant() not in values:
                raise _raised(ValueError("list.remove(x): x not in list"))
            where = values.index(args[0].as_constant())
            self._mutated(tx)
            del self.items[where]
            return none
        if name == "sort" and self.is_constant() and constant_args(args, kwargs):
            # the items themselves reordered (a tuple of constants stays the TupleVariable it was);
            # sorting their positions by value is the same stable permutation as sorting the values
            values = self.as_constant()
            order = native(sorted, range(len(values)), key=values.__getitem__,
                           **{k: v.as_constant() for k, v in kwargs.items()})
            self._mutated(tx)
            self.items[:] = [self.items[i] for i in order]
            return none
        if name == "sort" and not args and set(kwargs) <= {"key", "reverse"}:
            # sorted()'s rule (ordering.sorted_rule, which builds on this module; builtin.py registers it)
            ordered = BUILTIN_RULES[sorted](tx, [self], kwargs)  # the key may raise: the list is left as it was
            assert isinstance(ordered, ListVariable)
            self._mutated(tx)
            self.items[:] = ordered.items
            return none
        if name == "__setitem__" and len(args) == 2:
            index = _index(tx, args[0])
            # eager's IndexError (out of range) or ValueError (an extended slice given the wrong
            # number of items) is raised in the trace with the list left as it was
            items = list(self.items)
            native(items.__setitem__, index, tx.iterate(args[1]) if isinstance(index, slice) else args[1])
            self._mutated(tx)
            self.items[:] = items
            return none
        if name == "__delitem__" and len(args) == 1:
            items = list(self.items)
            native(items.__delitem__, _index(tx, args[0]))
            self._mutated(tx)
            self.items[:] = items
            return none
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()
        return "[" + ", ".join(glue.reconstruct(i) for i in self.items) + "]"
