"""Python builtins during capture (`len`, `range`, `zip`, `min`, ...), one rule each.

Each rule lives in a table filled by `@builtin_rule`, keyed by the builtin it handles. Rules compute
on trace-time values when they can (a constant answer, no node) and otherwise record graph ops (e.g.
`abs(tensor)`, `max(s0, 2)` on a symbolic size). A builtin without a rule is a graph break.
`isinstance`, `issubclass` and `type(obj)` are in type_checks.py; min/max, sum, any/all, divmod, hash,
repr/format and the number and text conversions in number_builtins.py.
Corresponds to torch/_dynamo/variables/builtin.py.
"""
from __future__ import annotations

import builtins
import collections
import functools
import inspect
import itertools
import operator
import sys
import types
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch

from kiln.capture.trace_rules import BUILTIN_RULES, BuiltinRule, builtin_rule
from kiln.capture.variables.base import BoundMethodVariable, Variable, constant_args
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.deque import DequeVariable
from kiln.capture.variables.exception import raise_in_trace
from kiln.capture.variables.ordering import sorted_rule
from kiln.capture.variables.symint import SymIntVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer

# The rule table itself lives with the other trace rules (a builtin with a rule is never inlined).
Rule = BuiltinRule
RULES = BUILTIN_RULES

# Builtins whose call is a break of a named kind (the hint table of kiln.capture.breaks keys on it).
_BREAK_KINDS = {builtins.print: "print", builtins.input: "unsupported_call", builtins.open: "unsupported_call",
                builtins.breakpoint: "unsupported_call", builtins.exec: "unsupported_call",
                builtins.eval: "unsupported_call"}


class BuiltinVariable(Variable):
    """A Python builtin function (or a stdlib function treated like one, e.g. operator.add)."""

    def __init__(self, fn: Any, source: Any = None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return f"builtin {getattr(self.fn, '__name__', self.fn)}"

    def truth(self, tx: "Tracer") -> bool:
        return bool(self.fn)  # the real function, fixed for the process (guarded by identity)

    def python_type(self) -> type:
        return type(self.fn)

    def as_python_value(self) -> Any:
        return self.fn

    def is_constant(self) -> bool:
        return False

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if self.fn is builtins.__build_class__:
            raise Unsupported("a class statement in the compiled frame (the glue builds the class natively)",
                              kind="unsupported_call",
                              hint="define the class at module level to keep the code around it in one graph")
        if self.fn in _BREAK_KINDS:
            raise Unsupported(f"call to {self.fn.__name__}()", kind=_BREAK_KINDS[self.fn])
        rule = RULES.get(self.fn)
        if rule is None:
            raise Unsupported(f"builtin {getattr(self.fn, '__name__', self.fn)} is not supported",
                              kind="unsupported_call")
        return rule(tx, list(args), dict(kwargs))

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        try:
            value = getattr(self.fn, name)
        except AttributeError as exc:  # a builtin's attributes are fixed: the program's own AttributeError
            raise raise_in_trace(exc, f"{exc} (raised natively)") from None
        return tx.wrap_result(value)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return glue.constant(self.fn)


# Builtin containers whose methods, read off the class (`list.__getitem__`, `dict.get`), are called
# on a traced value of that type as its own method.
_METHOD_OWNERS = (list, tuple, dict, set, frozenset, str, bytes, int, float, collections.OrderedDict,
                  collections.defaultdict, collections.deque)


def is_unbound_builtin_method(value: Any) -> bool:
    """`list.__getitem__`, `dict.get`, `str.join`: a method descriptor of a builtin container."""
    return isinstance(value, (types.MethodDescriptorType, types.WrapperDescriptorType)) \
        and value.__objclass__ in _METHOD_OWNERS


class UnboundMethodVariable(Variable):
    """A builtin type's method called with its receiver first: `list.__getitem__(items, 1)`. A dict
    receiver runs dict's own method even when its class overrides it, as in CPython."""

    def __init__(self, method: Any, source: Any = None) -> None:
        self.method = method
        self.source = source

    def describe(self) -> str:
        return f"{self.method.__objclass__.__name__}.{self.method.__name__}"

    def python_type(self) -> type:
        return type(self.method)

    def as_python_value(self) -> Any:
        return self.method

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.dict import DictMethodVariable, DictVariable

        owner, name = self.method.__objclass__, self.method.__name__
        if not args:
            raise Unsupported(f"{self.describe()} called without its receiver (raised natively)", kind="unsupported")
        receiver = args[0]
        if not issubclass(receiver.python_type(), owner):
            raise Unsupported(f"{self.describe()} called on {receiver.describe()} (raised natively)", kind="unsupported")
        if isinstance(receiver, DictVariable) and owner in (dict, collections.OrderedDict, collections.defaultdict):
            return DictMethodVariable(receiver, name).call(tx, args[1:], kwargs)
        return receiver.call_method(tx, name, args[1:], kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return glue.constant(self.method)


def _has_graph_values(args: Sequence[Variable]) -> bool:
    from kiln.capture.variables.symint import SymIntVariable
    from kiln.capture.variables.tensor import TensorVariable

    return any(isinstance(a, (TensorVariable, SymIntVariable)) for a in args)


def fold_call(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """Run `fn` at trace time on constants, or record it as a graph op on tensors / symbols."""
    consts = constant_args(args, kwargs)
    if consts is not None:
        try:
            return tx.wrap_result(fn(*consts[0], **consts[1]))
        except Exception as exc:
            from kiln.capture.variables.exception import raise_in_trace
            raise raise_in_trace(exc, f"{fn.__name__} raised {type(exc).__name__}: {exc} (raised natively)") from exc
    if _has_graph_values(args):
        return tx.call_op("call_function", fn, args, kwargs)
    raise Unsupported(f"{fn.__name__} on {[a.describe() for a in args]}", kind="unsupported_call")


@builtin_rule(len)
def len_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    return args[0].length(tx)


@builtin_rule(callable)
def callable_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.functions import (NestedFunctionVariable,
                                                  UserFunctionVariable, UserMethodVariable)
    from kiln.capture.variables.tensor import TensorVariable

    obj = args[0]
    if isinstance(obj, (BoundMethodVariable, NestedFunctionVariable, UserFunctionVariable,
                        UserMethodVariable, BuiltinVariable)):
        return ConstantVariable(True)
    if isinstance(obj, TensorVariable) or obj.is_constant():
        return ConstantVariable(False)
    try:
        kind = obj.python_type()
    except Unsupported:
        return ConstantVariable(callable(obj.as_python_value()))
    # what callable() asks: whether the type (its MRO, never its metaclass) defines __call__
    return ConstantVariable(any("__call__" in base.__dict__ for base in kind.__mro__))


@builtin_rule(getattr)
def getattr_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.exception import RaisedInTrace

    obj, name = args[0], args[1].as_constant()
    if len(args) == 3:
        # one lookup, as eager's: a __getattr__ / property runs once (its side effects once)
        try:
            return tx.getattr(obj, name)
        except RaisedInTrace as raised:
            if issubclass(raised.exception.exc_type, AttributeError):
                return args[2]
            raise
        except Unsupported:
            if not tx.has_attr(obj, name):
                return args[2]
            raise
    return tx.getattr(obj, name)


@builtin_rule(hasattr)
def hasattr_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    return ConstantVariable(tx.has_attr(args[0], args[1].as_constant()))


@builtin_rule(setattr)
def setattr_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    tx.setattr(args[0], args[1].as_constant(), args[2])
    return ConstantVariable(None)


@builtin_rule(range)
def range_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.sequence import native

    return ConstantVariable(native(range, *[tx.as_int(a) for a in args]))  # a zero step: eager's ValueError


@builtin_rule(enumerate)
def enumerate_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.iterator import open_iterator
    from kiln.capture.variables.live_iterators import EnumerateVariable

    start = tx.as_int(args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0)))
    # its iterator read one step at a time: a list appended to in the loop body is seen, and
    # across a graph break it is rebuilt as the real enumerate over the rebuilt iterator
    return EnumerateVariable(open_iterator(tx, args[0]), ConstantVariable(start))


@builtin_rule(zip)
def zip_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.iterator import IteratorVariable, LazyIteratorVariable, open_iterator
    from kiln.capture.variables.live_iterators import ZipVariable
    from kiln.capture.variables.sequence import TupleVariable

    strict = kwargs.pop("strict", ConstantVariable(False)).as_constant()
    if not strict:
        return ZipVariable([open_iterator(tx, a) for a in args])  # read a row at a time, as eager's zip
    columns = [tx.iterate(a) for a in args]
    rows: list[Variable] = [TupleVariable(list(row)) for row in zip(*columns)]
    if len({len(c) for c in columns}) > 1:
        return LazyIteratorVariable(_rows_then_length_error(columns, rows), "zip")
    return IteratorVariable(rows)


def _rows_then_length_error(columns: list[list[Variable]], rows: list[Variable]) -> Iterator[Variable]:
    """zip(strict=True) of unequal lengths: the full rows, then eager's ValueError (its own text,
    from zipping stand-ins of the same lengths) when the next row is asked for."""
    from kiln.capture.variables.exception import raise_in_trace

    yield from rows
    try:
        list(zip(*[range(len(c)) for c in columns], strict=True))
    except ValueError as error:
        raise raise_in_trace(error, f"ValueError: {error} (raised natively)") from error


@builtin_rule(map)
def map_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.iterator import open_iterator
    from kiln.capture.variables.lazy_itertools import lazy_map

    # the function runs when each item is read, as in eager: its side effects (and the tensors it
    # reads) interleave with the consumer's
    return lazy_map(tx, args[0], [open_iterator(tx, a) for a in args[1:]])


@builtin_rule(filter)
def filter_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.iterator import lazy_filter

    return lazy_filter(tx, args[0], args[1])  # the predicate runs as each item is read


# torch's own indexed module containers (not subclasses, which may index their own way): reversed()
# reads them by __len__ and __getitem__, which give the items in their iteration order
_INDEXED_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ParameterList)


@builtin_rule(reversed)
def reversed_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """reversed(x) as its type has it: a class's own Python __reversed__ is called, a tensor is
    flipped (Tensor.__reversed__), and what has neither __reversed__ nor the sequence protocol
    (a set, a generator) raises TypeError; the rest is its items in reverse."""
    from kiln.capture.variables.functions import UserMethodVariable
    from kiln.capture.variables.iterator import IteratorVariable
    from kiln.capture.variables.tensor import TensorVariable

    if len(args) != 1 or kwargs:
        raise Unsupported("reversed() with these arguments", kind="unsupported_call")
    value = args[0]
    if isinstance(value, TensorVariable):
        return value if value.example.dim() == 0 else value.call_method(tx, "flip", [ConstantVariable(0)], {})
    kind = value.python_type()
    own = inspect.getattr_static(kind, "__reversed__", None)
    if isinstance(own, types.FunctionType):
        return UserMethodVariable(own, value).call(tx, [], {})
    if own is None and not (hasattr(kind, "__len__") and hasattr(kind, "__getitem__")):
        raise raise_in_trace(TypeError(f"'{kind.__name__}' object is not reversible"),
                             f"reversed() of a {kind.__name__} (raised natively)")
    if not (kind.__module__ == "builtins" or kind is torch.Size or issubclass(kind, (tuple, list, dict))
            or kind.__module__ == "collections" or kind in _INDEXED_CONTAINERS):
        raise Unsupported(f"reversed() of {value.describe()}", kind="unsupported_call")
    from kiln.capture.variables.sequence import ListVariable
    from kiln.capture.variables.dict import DictVariable
    from kiln.capture.variables.dict_view import DictViewVariable
    if isinstance(value, DictViewVariable):
        return value.call_method(tx, "__reversed__", [], {})
    if isinstance(value, DictVariable):  # reads the dict at each step: eager's error once it changed size
        live = value.live_iterator(tx, "keys", reverse=True)
        if live is not None:
            return live
    if type(value) is ListVariable:  # by a falling index over the list as it is at each step
        from kiln.capture.variables.live_iterators import ReversedListIteratorVariable
        return ReversedListIteratorVariable(value)
    return IteratorVariable(list(reversed(tx.iterate(value))))


@builtin_rule(next)
def next_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.iterator import IteratorVariable

    it = args[0]
    if not isinstance(it, IteratorVariable):
        raise Unsupported(f"next() on {it.describe()}", kind="unsupported_call")
    item = it.next_traced(tx)
    if item is None:
        if len(args) > 1:
            return args[1]
        from kiln.capture.variables.generator import GeneratorVariable
        if isinstance(it, GeneratorVariable):
            raise it.stop_error()  # carries what the generator's `return` gave
        from kiln.capture.variables.exception import raise_in_trace
        raise raise_in_trace(StopIteration(), "StopIteration from next() (raised natively)")
    return item


def _list_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.sequence import ListVariable
    return ListVariable(tx.iterate(args[0]) if args else [])


def _tuple_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.sequence import TupleVariable
    return TupleVariable(tx.iterate(args[0]) if args else [])


RULES[list] = _list_rule
RULES[tuple] = _tuple_rule


@builtin_rule(dict)
def dict_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.dict import DictVariable, pairs_of

    items = pairs_of(tx, args[0]) if args else {}
    items.update(kwargs)
    return DictVariable(items)


def _ordered_dict_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.dict import DictVariable

    made = dict_rule(tx, args, kwargs)
    assert isinstance(made, DictVariable)
    return DictVariable(made.items, collections.OrderedDict)


RULES[collections.OrderedDict] = _ordered_dict_rule


@builtin_rule(collections.deque)
def deque_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    return DequeVariable.create(tx, args, kwargs)


@builtin_rule(collections.defaultdict)
def defaultdict_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`defaultdict(factory, *dict_args, **kwargs)`: a dict whose missing keys call the factory."""
    from kiln.capture.variables.dict import DictVariable

    factory = args[0] if args else None
    if factory is not None and factory.is_constant() and factory.as_constant() is None:
        factory = None
    made = dict_rule(tx, args[1:], kwargs)
    assert isinstance(made, DictVariable)
    return DictVariable(made.items, collections.defaultdict, default_factory=factory)


def _from_keys_rule(dict_type: type) -> Rule:
    def rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.dict import from_keys
        return from_keys(tx, dict_type, args, kwargs)
    return rule


for _dict_type in (dict, collections.OrderedDict, collections.defaultdict):
    RULES[_dict_type.fromkeys] = _from_keys_rule(_dict_type)


@builtin_rule(tuple.__new__)
def tuple_new_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`tuple.__new__(cls, items)`: how a namedtuple's `_make` and `__new__` build the instance."""
    from kiln.capture.variables.sequence import TupleVariable

    if not args or kwargs or len(args) > 2:
        raise Unsupported("tuple.__new__ with these arguments", kind="unsupported_call")
    cls = args[0].as_python_value()
    if not (isinstance(cls, type) and issubclass(cls, tuple)):
        raise Unsupported(f"tuple.__new__ of {cls!r}", kind="unsupported_call")
    return TupleVariable(tx.iterate(args[1]) if len(args) == 2 else [], cls)


def _set_of(kind: type) -> Rule:
    def rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.sets import SetVariable
        made = SetVariable([], kind)
        return made.update_from(tx, args[0]) if args else made
    return rule


RULES[set] = _set_of(set)
RULES[frozenset] = _set_of(frozenset)


RULES[sorted] = sorted_rule


@builtin_rule(inspect.signature)
def signature_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    # Signatures depend only on the function (guarded by identity where it was read), so they are
    # computed at trace time instead of inlining the inspect module.
    from kiln.capture.variables.functions import UserFunctionVariable, UserMethodVariable
    from kiln.capture.variables.user_object import ObjectVariable

    fn = args[0] if len(args) == 1 and not kwargs else None
    if isinstance(fn, UserMethodVariable):
        signature = inspect.signature(fn.fn)
        return ObjectVariable(signature.replace(parameters=list(signature.parameters.values())[1:]))
    if isinstance(fn, UserFunctionVariable):
        return ObjectVariable(inspect.signature(fn.fn))
    raise Unsupported("inspect.signature of a value other than a Python function", kind="unsupported_call")


@builtin_rule(locals)
def locals_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """The calling function's bound names. CPython 3.11 keeps one dict per frame and refreshes it
    in place at each call (names still bound keep their place, new ones are appended, unbound ones
    removed), so an earlier result sees the later state too."""
    from kiln.capture.variables.dict import DictVariable

    if args or kwargs:
        raise Unsupported("locals() takes no arguments (raised natively)", kind="unsupported")
    bound = tx.frame_locals()
    if tx.locals_dict is None:
        tx.locals_dict = DictVariable({})
    held = tx.locals_dict.items
    for name in [n for n in held if n not in bound]:
        del held[name]
    held.update(bound)
    return tx.locals_dict


@builtin_rule(vars)
def vars_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """vars() is locals(); vars(obj) is obj.__dict__ itself, read as the program's `obj.__dict__`
    is (an object made in the frame hands out a dict over its very attributes)."""
    from kiln.capture.variables.exception import RaisedInTrace

    if not args and not kwargs:
        return locals_rule(tx, [], {})
    if len(args) != 1 or kwargs:
        raise Unsupported("vars() takes at most one argument (raised natively)", kind="unsupported")
    try:
        return tx.getattr(args[0], "__dict__")
    except RaisedInTrace as raised:  # eager's vars() raises TypeError there, not AttributeError
        raise Unsupported(f"vars() of {args[0].describe()}, which has no __dict__ (raised natively)",
                          kind="unsupported") from raised


@builtin_rule(sys.intern)
def intern_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    return fold_call(tx, sys.intern, args, kwargs)


@builtin_rule(id)
def id_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.dict import DictVariable
    from kiln.capture.guards import Guard
    from kiln.capture.variables.object_id import ObjectIdVariable, object_id
    from kiln.capture.variables.sequence import ListVariable
    from kiln.capture.variables.sets import SetVariable
    from kiln.capture.variables.tensor import TensorVariable

    if isinstance(args[0], (ListVariable, DictVariable, SetVariable)):
        # a mutable container: its python value is a fresh copy on every read, whose id() is no one's
        return object_id(args[0])
    try:
        value = args[0].as_python_value()
    except Unsupported:
        var = object_id(args[0])  # a tensor, an object made in the frame: compared by identity only
        real = args[0].real() if isinstance(args[0], TensorVariable) else None
        source = args[0].source
        # a parameter, or a tensor read from a global or an attribute (not an argument: the activations
        # a caller passes are new objects every call, and a guard on their identity would recompile)
        if real is not None and source is not None and isinstance(var, ObjectIdVariable) \
                and (isinstance(real, torch.nn.Parameter) or not source.name().startswith("L[")):
            def pin_number(real: Any = real, source: Any = source) -> int:
                tx.output.guards.append(Guard(source.name(), "check_id", real))
                return id(real)
            var.pin_number = pin_number
        return var
    pin = getattr(args[0], "pin_identity", None)
    if pin is not None:  # an instance guarded by type: the number is this very object's
        pin()
    return ConstantVariable(id(value))


@builtin_rule(slice)
def slice_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.slice import SliceVariable

    none = ConstantVariable(None)
    parts = list(args) + [none] * (3 - len(args))
    if len(args) == 1:
        parts = [none, args[0], none]
    return SliceVariable(*parts)


@builtin_rule(types.MethodType)
def method_type_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`MethodType(fn, obj)`: a Python function bound by hand (ExitStack binds a context manager's
    __exit__ so), a method like any other."""
    from kiln.capture.variables.functions import UserFunctionVariable, UserMethodVariable

    if len(args) != 2 or kwargs or not isinstance(args[0], UserFunctionVariable):
        raise Unsupported("types.MethodType of something other than a Python function", kind="unsupported_call")
    return UserMethodVariable(args[0].fn, args[1])


@builtin_rule(super)
def super_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.super_call import SuperVariable

    if args:
        return SuperVariable(args[0].as_python_value(), args[1])
    return tx.zero_arg_super()


@builtin_rule(object.__setattr__)
def object_setattr_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    tx.setattr(args[0], args[1].as_constant(), args[2], bypass=True)
    return ConstantVariable(None)


@builtin_rule(object.__new__)
def object_new_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    # `cls.__new__(cls)` (a copy or a factory that runs __init__ itself): a bare instance
    from kiln.capture.trace_rules import constructible
    from kiln.capture.variables.user_object import NewObjectVariable, ObjectVariable

    cls = args[0].as_python_value() if len(args) == 1 and not kwargs and isinstance(args[0], ObjectVariable) else None
    if not isinstance(cls, type) or not constructible(cls, own_new=True) or getattr(cls, "__abstractmethods__", None):
        raise Unsupported("object.__new__ of a class capture does not build", kind="unsupported_call")
    return NewObjectVariable(cls, args[0].source)


@builtin_rule(object.__getattribute__)
def object_getattribute_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    # the generic lookup, skipping the class's own __getattribute__ (called from inside one)
    lookup = getattr(args[0], "generic_getattr", None) if len(args) == 2 and not kwargs else None
    if lookup is None or not args[1].is_constant():
        raise Unsupported(f"object.__getattribute__ of {args[0].describe() if args else 'nothing'}", kind="unsupported")
    return lookup(tx, args[1].as_constant())


for _unary in (operator.neg, operator.pos, operator.not_, operator.invert, operator.truth, operator.index):
    RULES[_unary] = functools.partial(lambda fn, tx, args, kwargs: fold_call(tx, fn, args, kwargs), _unary)
# operator.inv is another name of invert (a function object of its own)
RULES[operator.inv] = functools.partial(lambda tx, args, kwargs: fold_call(tx, operator.invert, args, kwargs))


@builtin_rule(operator.call)
def operator_call_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """operator.call(f, *args, **kwargs) is the call f(*args, **kwargs)."""
    if not args:
        raise Unsupported("operator.call without a callable (raised natively)", kind="unsupported_call")
    return args[0].call(tx, list(args[1:]), dict(kwargs))


# functools and itertools helpers that model code reaches for, unrolled like loops.
@builtin_rule(functools.reduce)
def reduce_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    fn, items = args[0], tx.iterate(args[1])
    if len(args) > 2:
        result = args[2]
    elif items:
        result, items = items[0], items[1:]
    else:
        raise Unsupported("reduce() of an empty sequence with no initial value (raised natively)", kind="unsupported")
    for item in items:
        result = fn.call(tx, [result, item], {})
    return result


@builtin_rule(functools.partial)
def partial_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.functions import PartialVariable

    return PartialVariable(args[0], list(args[1:]), dict(kwargs))


def _iterator_rule(make: Callable[..., Any]) -> Rule:
    def rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.iterator import IteratorVariable
        return IteratorVariable(make(tx, args, kwargs))
    return rule


def _tuples(rows: Any) -> list[Variable]:
    from kiln.capture.variables.sequence import TupleVariable
    return [TupleVariable(list(row)) for row in rows]


RULES[itertools.product] = _iterator_rule(
    lambda tx, args, kw: _tuples(itertools.product(*[tx.iterate(a) for a in args],
                                                   repeat=tx.as_int(kw.get("repeat", ConstantVariable(1))))))
RULES[itertools.combinations] = _iterator_rule(
    lambda tx, args, kw: _tuples(itertools.combinations(tx.iterate(args[0]), tx.as_int(args[1]))))
