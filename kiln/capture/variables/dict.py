"""Dicts (dict, OrderedDict, defaultdict, subclasses of dict), whose values are tracked values.

Keys are known at trace time (strings, ints, tuples of them, ..., or objects compared by identity
such as classes and functions), or are tracked values hashed by identity as CPython hashes them:
tensors and objects whose class keeps object's `__hash__` (`IdentityKey`). Values may be anything.
A dict from the caller that the frame mutates is reported to the side-effect log, so the glue
rewrites its contents after the graph has run. A dict subclass's methods written in Python are
inlined, with `super()` coming back to dict's own. The keys' rules serve sets too (sets.py).
Corresponds to torch/_dynamo/variables/dicts.py.
"""
from __future__ import annotations

import collections
import inspect
import types
import typing
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from kiln.capture.guards import ABSENT
from kiln.capture.sources import AttrSource
from kiln.capture.trace_rules import builtin_rule
from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.symint import SymIntVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.sources import Source
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.iterator import IteratorVariable


_OBJECT_CLASS = vars(object)["__class__"]


def is_identity_key(value: Any) -> bool:
    """True for objects that hash and compare by identity and whose identity the builder guards:
    classes (with a metaclass that keeps identity equality), functions, modules and typing's
    special forms (`typing.Union`). They may key a traced dict next to literal keys."""
    kind = type(value)
    if kind.__hash__ is not object.__hash__ or kind.__eq__ is not object.__eq__:
        return False
    return isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType,
                              typing._SpecialForm))


class IdentityKey:
    """A dict key or set element that hashes and compares by identity, as CPython does for it: a
    tensor (`Tensor.__hash__` is `id`), or an object whose class keeps object's `__hash__` and
    `__eq__`. `var` is the tracked value (what iteration gives back, what the glue rebuilds)."""

    __slots__ = ("var", "obj")
    by_hash = False  # hashes as eager's table does (a user __hash__, user_hashed_keys.HashedKey)

    def __init__(self, var: Variable, obj: Any) -> None:
        self.var = var
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdentityKey) and other.obj is self.obj

    def __repr__(self) -> str:
        return f"<{self.var.describe()}>"


class TupleKey(IdentityKey):
    """A tuple key some of whose items hash by identity (`{(a, b): 1}` with tensors a, b): it hashes
    and compares as the tuple of its items' keys, as CPython's tuple hash and == do."""

    __slots__ = ()

    def __hash__(self) -> int:
        return hash(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TupleKey) and other.obj == self.obj


def _hashes_by_identity(kind: type) -> bool:
    if issubclass(kind, torch.Tensor):
        return kind.__hash__ is torch.Tensor.__hash__
    return kind.__hash__ is object.__hash__ and kind.__eq__ is object.__eq__


def key_of(var: Variable) -> Any:
    """The hashable trace-time value of a dict key or set element (an IdentityKey for a tracked
    value hashed by identity)."""
    if var.is_constant():
        value = var.as_constant()
        try:
            hash(value)
        except TypeError as exc:
            raise Unsupported(f"unhashable dict key {value!r}", kind="unsupported") from exc
        return value
    try:
        value = var.as_python_value()
    except Unsupported:
        value = None
    if value is not None and is_identity_key(value):
        return value
    if getattr(var, "tuple_type", None) is tuple:  # a TupleVariable (sequence.py imports this module)
        keys = tuple(key_of(item) for item in var.items)  # type: ignore[attr-defined]
        if not any(isinstance(k, IdentityKey) for k in keys):
            return keys  # plain values (sizes decided above): equal to the same tuple from outside
        return TupleKey(var, keys)
    pin_number = getattr(var, "pin_number", None)
    if pin_number is not None and not getattr(var, "keyed_by_identity", True):
        return pin_number()  # id() of an outside tensor, looked up as the number a dict from outside holds
    if isinstance(var, SymIntVariable):
        # a size or int argument hashed as a key (`table[tuple(x.shape)]`, `{x.shape[0] for ...}`):
        # the lookup depends on its value, which the ShapeEnv guards (as hashing a SymInt does)
        return var.specialize()
    identity = var.identity()
    if identity is not None and getattr(var, "keyed_by_identity", False):
        # id() of a value made in the frame (object_id.py): no dict from outside can hold that number,
        # so equal ids, the same object, are the same key
        return IdentityKey(var, identity)
    if identity is not None:
        try:
            kind = var.python_type()
        except Unsupported:
            kind = None
        if kind is not None and _hashes_by_identity(kind):
            pin = getattr(var, "pin_identity", None)
            if pin is not None:  # an instance from outside, guarded by type: the key is this object
                pin()
            return IdentityKey(var, identity)
    raise Unsupported(f"dict key {var.describe()} is not a constant", kind="unsupported")


def key_variable(tx: "Tracer", key: Any) -> Variable:
    """The tracked value of a key (what iterating a dict or set gives)."""
    if isinstance(key, IdentityKey):
        return key.var
    return tx.wrap_result(key)


def key_text(glue: "GlueBuilder", key: Any) -> str:
    """The glue's expression of a key."""
    if isinstance(key, IdentityKey):
        return glue.reconstruct(key.var)
    return glue.constant(key)


def constant_keys(keys: Any) -> bool:
    return not any(isinstance(k, IdentityKey) for k in keys)


_DESCRIBING: set[int] = set()  # dicts whose describe() is running (one that holds a key naming itself)

class DictVariable(Variable):
    """A dict; `dict_type` is dict, OrderedDict, defaultdict (with `default_factory`, a tracked
    callable or None) or a subclass of one of them made in the frame (`attrs`: its instance dict)."""

    def __init__(self, items: dict[Any, Variable], dict_type: type = dict, source: "Source | None" = None,
                 default_factory: Variable | None = None) -> None:
        self.items = dict(items)
        self.dict_type = dict_type
        self.source = source
        self.default_factory = default_factory
        self.attrs: dict[str, Variable] = {}
        self.layout = 0  # how often the trace changed its keys (eager's OrderedDict state)
        self.real: Any = None  # a subclass instance from outside: its instance attributes are read off it

    def describe(self) -> str:
        if id(self) in _DESCRIBING:  # a key that names this dict (deepcopy's memo[id(memo)]): as repr's {...}
            return f"{self.dict_type.__name__} {{...}}"
        _DESCRIBING.add(id(self))
        try:
            return f"{self.dict_type.__name__} with keys {list(self.items)}"
        finally:
            _DESCRIBING.discard(id(self))

    def python_type(self) -> type:
        return self.dict_type

    def identity(self) -> Any:
        return self

    def is_constant(self) -> bool:
        return self.dict_type in (dict, collections.OrderedDict) and constant_keys(self.items) \
            and all(v.is_constant() for v in self.items.values())

    def as_constant(self) -> Any:
        if not self.is_constant():
            return super().as_constant()
        return self.dict_type((k, v.as_constant()) for k, v in self.items.items())

    def truth(self, tx: "Tracer") -> bool:
        override = self._override(tx, "__len__")
        if override is not None:
            return bool(tx.as_int(override.call(tx, [], {})))
        return bool(self.items)

    def length(self, tx: "Tracer") -> Variable:
        override = self._override(tx, "__len__")
        if override is not None:
            return override.call(tx, [], {})
        return ConstantVariable(len(self.items))

    def open_iterator(self, tx: "Tracer") -> "IteratorVariable | None":
        return self.live_iterator(tx, "keys")

    def live_iterator(self, tx: "Tracer", kind: str, reverse: bool = False) -> "IteratorVariable | None":
        """An iterator over the keys, values or items (`reversed` of them when `reverse`) that
        reads this dict at each step (eager's RuntimeError once its size changed); None for a dict
        whose class iterates its own way."""
        made = DictVariable.iterator_kind
        own = "__reversed__" if reverse else "__iter__"
        if made is None or self.dict_type not in BUILTIN_DICTS or self._override(tx, own) is not None:
            return None
        return made(self, kind, lambda key: key_variable(tx, key), reverse)

    # live_iterators.ContainerIteratorVariable, set by that module (it imports this one)
    iterator_kind: "Callable[[Variable, str, Callable[[Any], Variable], bool], IteratorVariable] | None" = None

    def iterate(self, tx: "Tracer") -> list[Variable]:
        override = self._override(tx, "__iter__")
        if override is not None:
            return tx.iterate(override.call(tx, [], {}))
        return [key_variable(tx, k) for k in self.items]

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.exception import no_attribute

        if name in self.attrs:
            return self.attrs[name]
        if self.real is not None and self.source is not None and name in vars(self.real):
            self.attrs[name] = tx.wrap(vars(self.real)[name], AttrSource(self.source, name))
            return self.attrs[name]
        if name == "default_factory" and issubclass(self.dict_type, collections.defaultdict):
            return self.default_factory if self.default_factory is not None else ConstantVariable(None)
        if _is_user_subclass(self.dict_type):
            if name == "__class__" and inspect.getattr_static(self.dict_type, name) is _OBJECT_CLASS:
                # object's own descriptor (unless a subclass overrides it): not a class attribute
                # to bind, which gave the descriptor itself, named "__class__", for the class
                return tx.wrap_result(self.dict_type)
            static = inspect.getattr_static(self.dict_type, name, _MISSING)
            owner = _defining_class(self.dict_type, name)
            if owner is not None and owner not in BUILTIN_DICTS:
                bound = tx.class_attribute(static, self, self.dict_type, name)
                if bound is not None:
                    return bound
                tx.guard_class_attribute(self.dict_type, name, static)
                return tx.wrap(static, None)
        if not hasattr(self.dict_type, name):
            raise no_attribute(self.dict_type, name)
        return BoundMethodVariable(self, name)

    def _override(self, tx: "Tracer", name: str) -> Variable | None:
        """The subclass's own method `name` (Python code), bound to this dict; None when dict's own
        method runs. Which one the lookup found is guarded on the class."""
        if not _is_user_subclass(self.dict_type):
            return None
        static = inspect.getattr_static(self.dict_type, name, _MISSING)
        tx.guard_class_attribute(self.dict_type, name, static)
        owner = _defining_class(self.dict_type, name)
        if owner is None or owner in BUILTIN_DICTS:
            return None
        if not isinstance(static, types.FunctionType):
            raise Unsupported(f"{self.dict_type.__qualname__}.{name} is not a Python function",
                              kind="unsupported_call")
        return tx.bind_method(static, self)

    def python_setattr(self, tx: "Tracer") -> Variable | None:
        """The subclass's own `__setattr__` written in Python (diffusers' BaseOutput keeps an item
        in step with a field), bound to this dict; None when attribute stores are plain."""
        if not isinstance(inspect.getattr_static(self.dict_type, "__setattr__"), types.FunctionType):
            return None
        return self._override(tx, "__setattr__")

    def _mutated(self, tx: "Tracer") -> None:
        tx.side_effects.mutate(self)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        override = self._override(tx, name)
        if override is not None:
            return override.call(tx, args, kwargs)
        return self.dict_method(tx, name, args, kwargs)

    def _missing(self, tx: "Tracer", key: Any) -> Variable:
        """`d[key]` for a key the dict lacks: the subclass's `__missing__`, the default factory
        (which stores its value, as defaultdict's `__missing__` does), or KeyError."""
        hook = self._override(tx, "__missing__")
        if hook is not None:
            return hook.call(tx, [key_variable(tx, key)], {})
        if self.default_factory is not None:
            value = self.default_factory.call(tx, [], {})
            self._mutated(tx)
            self.items[key] = value
            return value
        from kiln.capture.variables.exception import raise_in_trace
        raise raise_in_trace(KeyError(key), f"KeyError: {key!r} (raised natively)")

    def merge(self, tx: "Tracer", pairs: dict[Any, Variable]) -> None:
        """`self.update(pairs)`: a key equal to one already here (a user-hashed key, by its __eq__)
        keeps that key and takes the new value."""
        if not any(isinstance(k, IdentityKey) for k in (*self.items, *pairs)):
            self.items.update(pairs)
            return
        for key, value in pairs.items():
            self.items[self._key(tx, key_variable(tx, key), write=True)] = value

    def dict_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        """dict's own method `name` (what `super().name` and `dict.name(d, ...)` reach)."""
        read = self._read_method(tx, name, args, kwargs)
        if read is not None:
            return read
        keys = list(self.items)
        result = self._write_method(tx, name, args, kwargs)
        if list(self.items) != keys:
            self.layout += 1  # a key added, removed or moved: an OrderedDict's iterators raise
        return result

    # user_hashed_keys.key_for, set by that module (it imports this one): the key a lookup finds
    # where a user class's __hash__/__eq__ decides
    key_resolver: "Callable[[Tracer, DictVariable, Variable, bool], Any] | None" = None

    def _key(self, tx: "Tracer", var: Variable, write: bool = False) -> Any:
        resolver = DictVariable.key_resolver
        return key_of(var) if resolver is None else resolver(tx, self, var, write)

    def _read_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                     kwargs: dict[str, Variable]) -> Variable | None:
        """A dict method that reads the dict (None for the others)."""
        none = ConstantVariable(None)
        if name == "__getitem__" and len(args) == 1:
            key = self._key(tx, args[0])
            if getattr(key, "absent", False):  # eager's KeyError shows the key's own repr: raised natively
                raise Unsupported(f"KeyError for the user-hashed key {args[0].describe()} (raised natively)",
                                  kind="unsupported")
            if key not in self.items:
                return self._missing(tx, key)
            return self.items[key]
        if name == "get" and 1 <= len(args) <= 2:
            return self.items.get(self._key(tx, args[0]), args[1] if len(args) == 2 else none)
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(self._key(tx, args[0]) in self.items)
        if name == "__len__":
            return self.length(tx)
        if name in ("keys", "values", "items") and not args and not kwargs:
            from kiln.capture.variables.dict_view import DictViewVariable
            return DictViewVariable(self, name)  # live: it sees later changes to the dict
        if name == "copy" and not args:
            if self.dict_type in BUILTIN_DICTS:
                return DictVariable(self.items, self.dict_type, default_factory=self.default_factory)
            if _builtin_base(self.dict_type) is dict:
                return DictVariable(self.items)  # dict.copy of a subclass is a plain dict
            raise Unsupported(f"{self.dict_type.__qualname__}.copy() builds the subclass anew",
                              kind="unsupported_call")
        if name == "__iter__" and not args:
            from kiln.capture.variables.iterator import IteratorVariable
            live = self.live_iterator(tx, "keys")
            return live if live is not None else IteratorVariable([key_variable(tx, k) for k in self.items])
        if name == "fromkeys":
            return from_keys(tx, self.dict_type, args, kwargs)
        return None

    def _write_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                      kwargs: dict[str, Variable]) -> Variable:
        """A dict method that changes the dict (each one noted as a mutation first)."""
        from kiln.capture.variables.sequence import TupleVariable

        none = ConstantVariable(None)
        if name == "__setitem__" and len(args) == 2:
            key = self._key(tx, args[0], write=True)
            self._mutated(tx)
            self.items[key] = args[1]
            return none
        if name == "__delitem__" and len(args) == 1:
            key = self._key(tx, args[0])
            if key not in self.items:
                raise key_error(key, args[0])
            self._mutated(tx)
            del self.items[key]
            return none
        if name == "pop" and 1 <= len(args) <= 2:
            key = self._key(tx, args[0])
            if key not in self.items:
                if len(args) == 1:
                    raise key_error(key, args[0])
                return args[1]
            self._mutated(tx)
            return self.items.pop(key)
        if name == "setdefault" and 1 <= len(args) <= 2:
            key = self._key(tx, args[0], write=True)
            if key not in self.items:
                self._mutated(tx)
                self.items[key] = args[1] if len(args) == 2 else none
            return self.items[key]
        if name == "__init__" and issubclass(self.dict_type, collections.defaultdict):
            # defaultdict.__init__(factory, *dict_args, **kwargs)
            factory = args[0] if args else None
            self.default_factory = None if factory is None or factory.is_constant() and factory.as_constant() is None \
                else factory
            args = args[1:]
        if name in ("update", "__init__"):
            self._mutated(tx)
            for arg in args:
                self.merge(tx, pairs_of(tx, arg, into=self))
            for key, value in kwargs.items():
                self.items[key] = value
            return none
        if name == "clear":
            self._mutated(tx)
            self.items.clear()
            return none
        if name == "popitem" and not args:
            # dict pops the newest entry; OrderedDict.popitem(last=False) the oldest
            last = kwargs["last"].as_constant() if "last" in kwargs else True
            if not last and self.dict_type is dict:
                raise Unsupported("dict.popitem(last=...) (raised natively)", kind="unsupported")
            if not self.items:
                from kiln.capture.variables.exception import raise_in_trace
                empty = KeyError("popitem(): dictionary is empty" if not issubclass(self.dict_type, collections.OrderedDict)
                                 else "dictionary is empty")
                raise raise_in_trace(empty, f"KeyError: {empty} (raised natively)")
            self._mutated(tx)
            key = next(reversed(self.items)) if last else next(iter(self.items))
            return TupleVariable([key_variable(tx, key), self.items.pop(key)])
        if name == "move_to_end" and len(args) == 1 and self.dict_type is not dict:
            key = self._key(tx, args[0])
            last = kwargs["last"].as_constant() if "last" in kwargs else True
            if key not in self.items:
                from kiln.capture.variables.exception import raise_in_trace
                raise raise_in_trace(KeyError(key), f"KeyError: {key!r} (raised natively)")
            self._mutated(tx)
            value = self.items.pop(key)
            self.items = {key: value, **self.items} if not last else {**self.items, key: value}
            return none
        raise Unsupported(f"{self.dict_type.__name__}.{name}", kind="unsupported_call")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()
        body = "{" + ", ".join(f"{key_text(glue, k)}: {glue.reconstruct(v)}" for k, v in self.items.items()) + "}"
        if self.dict_type is dict:
            return body
        if self.dict_type is collections.OrderedDict:
            return f"{glue.constant(self.dict_type)}({body})"
        factory = "None" if self.default_factory is None else glue.reconstruct(self.default_factory)
        if self.dict_type is collections.defaultdict:
            return f"{glue.constant(self.dict_type)}({factory}, {body})"
        # A subclass: made without running its __init__ again, filled through its builtin base's
        # own __setitem__ (the subclass may override it), with its instance dict.
        cls, base = glue.constant(self.dict_type), glue.constant(_builtin_base(self.dict_type))
        name = glue.fresh("d")
        glue.line(f"{name} = {cls}.__new__({cls})")
        for key, value in self.items.items():
            glue.line(f"{base}.__setitem__({name}, {key_text(glue, key)}, {glue.reconstruct(value)})")
        if issubclass(self.dict_type, collections.defaultdict):
            glue.line(f"{name}.default_factory = {factory}")
        if self.attrs:
            attrs = ", ".join(f"{k!r}: {glue.reconstruct(v)}" for k, v in self.attrs.items())
            glue.line(f"{name}.__dict__.update({{{attrs}}})")
        return name


BUILTIN_DICTS = (dict, collections.OrderedDict, collections.defaultdict)
_MISSING = ABSENT  # what a class lookup that finds nothing gives (and what its guard expects)


def _is_user_subclass(kind: type) -> bool:
    return kind not in BUILTIN_DICTS


def _builtin_base(kind: type) -> type:
    """The builtin dict class a subclass derives from (the first of its MRO)."""
    return next(base for base in kind.__mro__ if base in BUILTIN_DICTS)


def _defining_class(kind: type, name: str) -> type | None:
    return next((base for base in kind.__mro__ if name in base.__dict__), None)


def constructible_dict_subclass(kind: type) -> bool:
    """A subclass of dict (or OrderedDict, defaultdict) whose instances capture builds as a traced
    dict: its own `__new__`, if any, is a builtin's, and its `__setattr__` is object's or a Python
    function (inlined: diffusers' BaseOutput keeps an item in step with each field it sets)."""
    if not isinstance(kind, type) or not issubclass(kind, dict) or kind in BUILTIN_DICTS:
        return False
    base = _builtin_base(kind)
    setattr_ = inspect.getattr_static(kind, "__setattr__")
    return kind.__new__ is base.__new__ and getattr(kind, "__dictoffset__", 0) != 0 \
        and (setattr_ is object.__setattr__ or isinstance(setattr_, types.FunctionType))


def new_dict_subclass(tx: "Tracer", kind: type, args: Sequence[Variable], kwargs: dict[str, Variable]) -> "DictVariable":
    """An instance of a dict subclass made in the frame: empty, then its `__init__` (the subclass's
    Python one, inlined, or the builtin's)."""
    made = DictVariable({}, kind)
    init = made._override(tx, "__init__")
    if init is not None:
        init.call(tx, args, kwargs)
    else:
        made.dict_method(tx, "__init__", args, kwargs)
    return made


class DictMethodVariable(Variable):
    """The builtin dict's own method `name` bound to a traced dict, past any override of its
    subclass: `super().__setitem__(k, v)` in a subclass, `dict.get(d, k)`."""

    def __init__(self, obj: DictVariable, name: str) -> None:
        self.obj = obj
        self.name = name

    def describe(self) -> str:
        return f"dict.{self.name} of {self.obj.describe()}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return self.obj.dict_method(tx, self.name, args, kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        method = getattr(_builtin_base(self.obj.dict_type), self.name)
        return f"{glue.constant(method)}.__get__({glue.reconstruct(self.obj)})"


def wrappable_dict_subclass(kind: type) -> bool:
    """A dict subclass whose instances from outside capture reads as traced dicts: constructible as
    one, and with dict's own `keys` (what the keys guard calls)."""
    return constructible_dict_subclass(kind) and _defining_class(kind, "keys") in BUILTIN_DICTS


def replay_contents(glue: "GlueBuilder", effect: "DictVariable", target: str) -> None:
    """The glue lines that give the caller's dict `target` the final items of `effect`: through the
    builtin base's own methods for a subclass (its overrides ran in the trace already)."""
    tmp = glue.fresh("d")
    body = ", ".join(f"{key_text(glue, k)}: {glue.reconstruct(v)}" for k, v in effect.items.items())
    glue.line(f"{tmp} = {{{body}}}")
    if effect.dict_type in BUILTIN_DICTS:
        glue.line(f"{target}.clear()")
        glue.line(f"{target}.update({tmp})")
        return
    base = glue.constant(_builtin_base(effect.dict_type))
    glue.line(f"{base}.clear({target})")
    item = glue.fresh("item")
    glue.line(f"for {item} in {tmp}.items(): {base}.__setitem__({target}, *{item})")


def key_error(key: Any, var: Variable) -> Exception:
    """Eager's KeyError for a key the dict (or set) does not hold, raised in the trace: its
    argument is the key itself (a constant, or the tracked object a user key or tensor is)."""
    from kiln.capture.variables.exception import ExceptionVariable, RaisedInTrace, raise_in_trace
    if isinstance(key, IdentityKey) or getattr(key, "absent", False):
        return RaisedInTrace(ExceptionVariable(KeyError, [var]), f"KeyError: {var.describe()} (raised natively)")
    return raise_in_trace(KeyError(key), f"KeyError: {key!r} (raised natively)")


def from_keys(tx: "Tracer", dict_type: type, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`cls.fromkeys(iterable, value=None)`: every key maps to the one value (a defaultdict's has no
    factory)."""
    if not 1 <= len(args) <= 2 or kwargs or dict_type not in BUILTIN_DICTS:
        raise Unsupported(f"{dict_type.__qualname__}.fromkeys with these arguments", kind="unsupported_call")
    value = args[1] if len(args) == 2 else ConstantVariable(None)
    made = DictVariable({}, dict_type)
    for key in tx.iterate(args[0]):
        made.items[made._key(tx, key, write=True)] = value
    return made


def _has_keys_method(var: Variable) -> bool:
    try:
        kind = var.python_type()
    except Unsupported:
        return False
    return hasattr(kind, "keys")


def pairs_of(tx: "Tracer", arg: Variable, into: "DictVariable | None" = None) -> dict[Any, Variable]:
    """The (key, value) pairs of a dict, of a mapping (what its `keys()` gives, each read with
    `[]`, as CPython's dict update does for any object with a `keys` method), or of an iterable of
    pairs, as a dict. Where reading them raises in the trace, the pairs read before are merged
    into `into` first: eager's update stores each pair as it reads it."""
    if isinstance(arg, DictVariable) and arg._override(tx, "__iter__") is None:
        return dict(arg.items)  # CPython reads a dict's storage unless its class overrides __iter__
    from kiln.capture.variables.exception import RaisedInTrace

    out = DictVariable({})  # filled as a dict is: a user-hashed key found by its __hash__ and __eq__
    try:
        if _has_keys_method(arg):
            for key in tx.iterate(arg.call_method(tx, "keys", [], {})):
                out.items[out._key(tx, key, write=True)] = arg.call_method(tx, "__getitem__", [key], {})
            return out.items
        from kiln.capture.variables.iterator import open_iterator
        pairs = open_iterator(tx, arg)  # stepped: a generator that raises has given its pairs so far
        position = 0
        pair = pairs.next_traced(tx)
        while pair is not None:
            key, value = _pair(tx, pair, position)
            out.items[out._key(tx, key, write=True)] = value
            position += 1
            pair = pairs.next_traced(tx)
    except RaisedInTrace:
        if into is not None:
            into.merge(tx, out.items)
        raise
    return out.items


def _pair(tx: "Tracer", pair: Variable, position: int) -> tuple[Variable, Variable]:
    """One item of an iterable given to dict()/update(): exactly two, else eager's ValueError (a
    number or None, no sequence at all: eager's TypeError)."""
    from kiln.capture.variables.exception import raise_in_trace
    if pair.is_constant() and isinstance(pair.as_constant(), (int, float, complex, type(None))):
        error: Exception = TypeError(f"cannot convert dictionary update sequence element #{position} to a sequence")
        raise raise_in_trace(error, f"TypeError: {error} (raised natively)")
    items = tx.iterate(pair)
    if len(items) != 2:
        error = ValueError(f"dictionary update sequence element #{position} has length {len(items)}; 2 is required")
        raise raise_in_trace(error, f"ValueError: {error} (raised natively)")
    return items[0], items[1]


@builtin_rule(collections._count_elements)  # type: ignore[attr-defined]  # C helper of Counter.update
def count_elements_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    # Counter(iterable) / Counter.update(iterable): what the C helper does, one item at a time
    # (`mapping[elem] = mapping.get(elem, 0) + 1`, dict's own get: no __missing__)
    if len(args) != 2 or kwargs:
        raise Unsupported("collections._count_elements with these arguments", kind="unsupported_builtin")
    mapping, iterable = args
    for item in iterable.each_item(tx):  # counted as read: a generator that raises leaves the counts so far
        count = mapping.call_method(tx, "get", [item, ConstantVariable(0)], {})
        mapping.call_method(tx, "__setitem__", [item, tx.binary_op("+", count, ConstantVariable(1))], {})
    return ConstantVariable(None)
