"""The protocols CPython runs through a user object's own Python methods, followed during capture:
len() and truth (`__len__`, `__bool__`), iteration (`__iter__`), str/repr/format (`__str__`,
`__repr__`, `__format__`), the `__getattr__` fallback, `operator.attrgetter`/`itemgetter` calls,
the views a collections.abc.Mapping hands out, attribute lookups after the trace wrote a class
attribute (`C.k = v`, replayed after the graph), and the flags of torch.backends read as process
settings. Each inlines the method the class writes, guarded on the class (or reads the value and
guards it). Used by user_object.py. Corresponds to parts of torch/_dynamo/variables/user_defined.py.
"""
from __future__ import annotations

import collections.abc
import functools
import inspect
import operator
import sys
import types
from typing import TYPE_CHECKING, Any

from kiln.capture.guards import ABSENT, Guard, ProcessQuery
from kiln.capture.trace_rules import is_library_code
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable, is_constant_value
from kiln.capture.variables.exception import RaisedInTrace, raise_in_trace
from kiln.capture.variables.functions import (
    UserFunctionVariable,
    UserMethodVariable,
    accessor_source,
    class_dict_source,
    guard_class_attribute,
    receiver_class_source,
)
from kiln.capture.variables.iterator import IteratorVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer

MISSING = object()  # what a class lookup that found nothing gives (user_object.py shares it)


def holds_backend_settings(obj: Any) -> bool:
    """torch.backends and its submodules, and the flag holders in them (`torch.backends.cuda.matmul`):
    their attributes are process-wide settings a program may change between calls."""
    if isinstance(obj, type):
        return False
    module = obj.__name__ if isinstance(obj, types.ModuleType) else type(obj).__module__ or ""
    return module == "torch.backends" or module.startswith("torch.backends.")


def read_backend_setting(tx: "Tracer", obj: Any, name: str) -> Variable:
    """A flag read now and guarded (check_query) as torch.compile's global-state guard checks the ones
    it knows; anything else there (a submodule, a function) is fixed for the process."""
    try:
        value = getattr(obj, name)
    except AttributeError as exc:
        from kiln.capture.variables.exception import raise_in_trace
        raise raise_in_trace(exc, f"{obj!r} has no attribute {name!r} (raised natively)") from exc
    if is_constant_value(value):
        owner = obj.__name__ if isinstance(obj, types.ModuleType) else type(obj).__qualname__
        tx.state.output.guards.append(Guard("", "check_query", ProcessQuery(getattr, (obj, name), value,
                                                                           f"{owner}.{name}")))
    return tx.wrap(value, None)


def python_len(tx: "Tracer", var: Variable, cls: type) -> Variable | None:
    """`len(obj)` through a `__len__` written in Python (ReformerDynamicCache's), inlined; None
    when there is none or it does not give a trace-time int."""
    if not isinstance(inspect.getattr_static(cls, "__len__", None), types.FunctionType):
        return None
    result = var.getattr(tx, "__len__").call(tx, [], {})
    if result.is_constant():
        _check_len_result(result.as_constant())
        return ConstantVariable(int(result.as_constant()))
    return None


def _check_len_result(value: Any) -> None:
    """What CPython's slot_sq_length asks of a `__len__` result: an int (its __index__), >= 0; else
    eager's TypeError or ValueError, raised in the trace."""
    if not isinstance(value, int):
        error: Exception = TypeError(f"'{type(value).__name__}' object cannot be interpreted as an integer")
    elif value < 0:
        error = ValueError("__len__() should return >= 0")
    elif value > sys.maxsize:
        error = OverflowError(f"cannot fit '{type(value).__name__}' into an index-sized integer")
    else:
        return
    raise raise_in_trace(error, f"{type(error).__name__}: {error} (raised natively)")


def python_hash(tx: "Tracer", var: Variable, cls: type) -> int:
    """`hash(obj)` through the class's Python `__hash__`, inlined (what it reads is guarded), as a
    dict lookup computes it from the int that returns (CPython's slot_tp_hash)."""
    result = var.getattr(tx, "__hash__").call(tx, [], {})
    if not result.is_constant() or type(result.as_constant()) is not int:
        raise Unsupported(f"{cls.__qualname__}.__hash__ does not give an int known at trace time", kind="unsupported")
    value = result.as_constant()
    if -2 ** 63 <= value < 2 ** 63:  # CPython keeps a __hash__ result that fits a Py_ssize_t, -1 made -2
        return -2 if value == -1 else value
    return hash(value)  # else the hash of the int


def python_equal(tx: "Tracer", a: Variable, b: Variable) -> bool:
    """`a == b` as a dict lookup asks it of a key with an equal hash: a's Python `__eq__`, inlined, then
    b's where a's gives NotImplemented; neither deciding means not equal (the objects differ)."""
    for left, right in ((a, b), (b, a)):
        try:
            kind = left.python_type()
        except Unsupported:
            continue
        if not isinstance(inspect.getattr_static(kind, "__eq__", None), types.FunctionType):
            if left.is_constant() and right.is_constant():
                return bool(left.as_constant() == right.as_constant())
            continue
        result = left.getattr(tx, "__eq__").call(tx, [right], {})
        if not result.is_constant():
            raise Unsupported(f"{kind.__qualname__}.__eq__ does not give a value known at trace time", kind="unsupported")
        if result.as_constant() is not NotImplemented:
            return bool(result.as_constant())
    return False


def call_getter(tx: "Tracer", getter: Any, target: Variable) -> Variable:
    """`operator.attrgetter("a.b", "c")(obj)` and `operator.itemgetter(k)(obj)`: the reads they make,
    traced one by one (their names and keys come from the getter's own `__reduce__`)."""
    from kiln.capture.variables.sequence import TupleVariable

    keys = getter.__reduce__()[1]
    found: list[Variable] = []
    for key in keys:
        if isinstance(getter, operator.attrgetter):
            value = target
            for part in key.split("."):
                value = tx.getattr(value, part)
        else:
            value = tx.subscript(target, tx.wrap(key, None))
        found.append(value)
    return found[0] if len(found) == 1 else TupleVariable(found)


def call_method_caller(tx: "Tracer", caller: operator.methodcaller, target: Variable) -> Variable:
    """`operator.methodcaller("sum", 0)(obj)`: `obj.sum(0)`, its name and arguments read from the
    caller's `__reduce__` (made from constants at trace time)."""
    reduced: Any = caller.__reduce__()
    maker, rest = reduced
    if isinstance(maker, functools.partial):  # with keywords: partial(methodcaller, name, **kw), args
        name, args, kwargs = maker.args[0], list(rest), dict(maker.keywords)
    else:
        name, args, kwargs = rest[0], list(rest[1:]), {}
    method = tx.getattr(target, name)
    return method.call(tx, [tx.wrap(a, None) for a in args], {k: tx.wrap(v, None) for k, v in kwargs.items()})


def python_getattr(tx: "Tracer", kind: type, name: str, static: Any, in_instance: bool) -> types.FunctionType | None:
    """The class's Python `__getattr__` when CPython calls it for `name`: the ordinary lookup
    found nothing (not in the instance dict, not on the class). A class attribute that is a
    descriptor could raise AttributeError and fall through to it: not decided here, a break."""
    # looked up on the class's MRO only, as CPython's slot does: a metaclass's __getattr__ (Enum's
    # EnumType has one) answers for the class, never for its instances
    getattr_fn = next((base.__dict__["__getattr__"] for base in kind.__mro__ if "__getattr__" in base.__dict__), None)
    if getattr_fn is None:
        return None
    if not isinstance(getattr_fn, types.FunctionType):
        raise Unsupported(f"{kind.__qualname__}.__getattr__ is not a Python function", kind="unsupported_attribute")
    guard_class_attribute(tx, kind, "__getattr__", getattr_fn)
    if in_instance or name == "__class__":
        return None
    if static is not MISSING:
        guard_class_attribute(tx, kind, name, static)
        if hasattr(type(static), "__get__") and not isinstance(static, (types.FunctionType, staticmethod, classmethod,
                                                                         types.GetSetDescriptorType)):
            raise Unsupported(f"{kind.__qualname__}.{name} is a descriptor of a class defining __getattr__",
                              kind="unsupported_attribute")
        return None
    guard_class_attribute(tx, kind, name, ABSENT)  # still not on the class next time
    return getattr_fn


def python_text(tx: "Tracer", var: Variable, name: str, spec: str = "") -> str | None:
    """`str(obj)`, `repr(obj)` or `format(obj, spec)` (name `__str__`, `__repr__`, `__format__`)
    of a user object (an instance, not a class or module) whose class writes the method CPython
    would call in Python (str falls back to
    `__repr__`, format with an empty spec to str): inlined, and its string is the answer. None when
    no Python method answers (object's own would print an address)."""
    kind = var.python_type()
    chain = {"__format__": ["__format__", "__str__", "__repr__"], "__str__": ["__str__", "__repr__"],
             "__repr__": ["__repr__"]}[name]
    for candidate in chain:
        method = inspect.getattr_static(kind, candidate, ABSENT)
        guard_class_attribute(tx, kind, candidate, method)
        if isinstance(method, types.FunctionType):
            arguments = [tx.wrap(spec, None)] if candidate == "__format__" else []
            if candidate != "__format__" and name == "__format__" and spec:
                return None  # object.__format__ refuses a spec: raised natively
            result = UserMethodVariable(method, var).call(tx, arguments, {})
            if not (result.is_constant() and isinstance(result.as_constant(), str)):
                raise Unsupported(f"{kind.__qualname__}.{candidate} returned {result.describe()}",
                                  kind="unsupported_call")
            return result.as_constant()
        if method is not ABSENT and getattr(method, "__objclass__", None) is not object:
            return None  # a builtin base's own method
    return None


def python_iter(tx: "Tracer", var: Variable, cls: type) -> list[Variable] | None:
    """`list(obj)`: every item of `iter(obj)` through an `__iter__` written in Python (a user
    Mapping's), inlined and run to its end; None when the class has none."""
    iterator = python_iterator(tx, var, cls)
    return None if iterator is None else iterator.iterate(tx)


def python_iterator(tx: "Tracer", var: Variable, cls: type) -> IteratorVariable | None:
    """`iter(obj)` through an `__iter__` written in Python; None when the class has none. An
    iterator whose `__next__` is Python too (often the object itself: `return self`) is stepped
    lazily, so a loop that stops early leaves it where eager leaves it."""
    found = inspect.getattr_static(cls, "__iter__", MISSING)
    if found is MISSING or found is None:  # what decides the protocol is guarded with the rest
        guard_class_attribute(tx, cls, "__iter__", ABSENT if found is MISSING else None, var)
    if found is None:  # `__iter__ = None`: not iterable
        error = TypeError(f"{cls.__name__!r} object is not iterable")
        raise raise_in_trace(error, f"TypeError: {error} (raised natively)")
    if not isinstance(inspect.getattr_static(cls, "__iter__", None), types.FunctionType):
        if found is MISSING and \
                isinstance(inspect.getattr_static(cls, "__getitem__", None), types.FunctionType):
            return PythonIteratorVariable(tx, var, by_index=True)  # the old protocol: obj[0], obj[1] ...
        return None
    iterator = var.getattr(tx, "__iter__").call(tx, [], {})
    if isinstance(iterator, IteratorVariable):
        return iterator
    if is_python_iterator(iterator):
        return PythonIteratorVariable(tx, iterator)
    return IteratorVariable(tx.iterate(iterator))


def is_python_iterator(var: Variable) -> bool:
    """A user object whose class has a `__next__` written in Python (python_type() of a traced
    value may not be known: then it is not one)."""
    try:
        kind = var.python_type()
    except Unsupported:
        return False
    return isinstance(inspect.getattr_static(kind, "__next__", None), types.FunctionType)


# a Python iterator that has not stopped after this many steps is left to run natively
MAX_PYTHON_ITERATIONS = 10_000


class PythonIteratorVariable(IteratorVariable):
    """An iterator whose `__next__` is written in Python: each FOR_ITER or next() inlines one
    call; StopIteration from it ends the iteration, any other exception goes to the handlers."""

    def __init__(self, tx: "Tracer", iterator: Variable, by_index: bool = False) -> None:
        super().__init__([])
        self.tx = tx  # the frame that opened it (whose handlers see what __next__ raises)
        self.iterator = iterator
        # a class with `__getitem__` and no `__iter__`: `obj[i]` for i = 0, 1, ... until IndexError
        self.by_index = by_index
        self.exhausted = False

    def describe(self) -> str:
        return f"iterator over {self.iterator.describe()}"

    def next_item(self) -> Variable | None:
        if self.exhausted:
            return None
        if len(self.items) >= MAX_PYTHON_ITERATIONS:
            raise Unsupported(f"{self.iterator.describe()} did not stop within {MAX_PYTHON_ITERATIONS} items",
                              kind="unsupported_iter")
        try:
            if self.by_index:
                index = self.tx.wrap(len(self.items), None)
                item = self.iterator.getattr(self.tx, "__getitem__").call(self.tx, [index], {})
            else:
                item = self.iterator.getattr(self.tx, "__next__").call(self.tx, [], {})
        except RaisedInTrace as raised:
            if not issubclass(raised.exception.exc_type, (StopIteration, IndexError) if self.by_index else StopIteration):
                raise
            self.exhausted = True
            return None
        self.items.append(item)
        self.position += 1
        return item

    def remaining(self) -> list[Variable]:
        raise Unsupported(f"the items left in {self.describe()} (its __next__ has side effects)", kind="unsupported_iter")

    def iterate(self, tx: "Tracer") -> list[Variable]:
        return self.step_to_the_end()

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.by_index:  # where it stands is not in the object: the rest is read natively
            return f"{glue.constant(_iterate_by_index)}({glue.reconstruct(self.iterator)}, {len(self.items)})"
        # its state lives in the object (its attribute writes are replayed): the object is the iterator
        return glue.reconstruct(self.iterator)


def _iterate_by_index(obj: Any, start: int) -> Any:
    """What the glue resumes a `__getitem__` iteration with: `obj[start]`, `obj[start + 1]`, ..."""
    index = start
    while True:
        try:
            yield obj[index]
        except (IndexError, StopIteration):
            return
        index += 1


MAPPING_VIEWS: dict[type, str] = {collections.abc.KeysView: "keys", collections.abc.ValuesView: "values",
                  collections.abc.ItemsView: "items"}


class MappingViewVariable(Variable):
    """`KeysView(m)`, `ValuesView(m)`, `ItemsView(m)` over a traced mapping (what a
    collections.abc.Mapping's `keys()`, `values()`, `items()` return): live, so each use reads the
    mapping through its own `__iter__`, `__getitem__` and `__len__` again."""

    def __init__(self, view_type: type, mapping: Variable) -> None:
        self.view_type = view_type
        self.mapping = mapping

    def describe(self) -> str:
        return f"{self.view_type.__name__} of {self.mapping.describe()}"

    def python_type(self) -> type:
        return self.view_type

    def length(self, tx: "Tracer") -> Variable:
        return self.mapping.length(tx)

    def truth(self, tx: "Tracer") -> bool:
        return bool(tx.as_int(self.length(tx)))

    def iterate(self, tx: "Tracer") -> list[Variable]:
        from kiln.capture.variables.sequence import TupleVariable

        keys = tx.iterate(self.mapping)
        kind = MAPPING_VIEWS[self.view_type]
        if kind == "keys":
            return keys
        values = [self.mapping.call_method(tx, "__getitem__", [k], {}) for k in keys]
        return values if kind == "values" else [TupleVariable([k, v]) for k, v in zip(keys, values)]

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.constant(self.view_type)}({glue.reconstruct(self.mapping)})"


def python_truth(tx: "Tracer", var: Variable, cls: type) -> bool | None:
    """`bool(obj)` in Python's order (__bool__, else __len__ != 0), inlining the one written in
    Python; None when that is not possible."""
    for name in ("__bool__", "__len__"):
        static = inspect.getattr_static(cls, name, None)
        if isinstance(static, types.FunctionType):
            result = var.getattr(tx, name).call(tx, [], {})
            if not result.is_constant():
                return None
            value = result.as_constant()
            if name == "__len__":
                _check_len_result(value)
            elif type(value) is not bool:  # no other truth value is taken from __bool__
                error = TypeError(f"__bool__ should return bool, returned {type(value).__name__}")
                raise raise_in_trace(error, f"TypeError: {error} (raised natively)")
            return bool(value)
        if static is not None:
            return None
    return None


def is_data_descriptor(static: Any) -> bool:
    """A class attribute that wins over the instance dict on reads and handles writes itself
    (a property, a descriptor with `__set__` or `__delete__`, a `__slots__` member)."""
    kind = type(static)
    return hasattr(kind, "__set__") or hasattr(kind, "__delete__")


def python_setattr(tx: "Tracer", receiver: Variable, kind: type, name: str, value: Variable) -> bool:
    """`obj.name = value` as object.__setattr__ does it, for what the class decides: a property's
    setter or a descriptor's `__set__` written in Python is inlined (True: nothing left to store).
    False when the value goes into the instance (its dict, or a `__slots__` member): the caller
    stores it. A data descriptor of another kind is a break."""
    static = inspect.getattr_static(kind, name, MISSING)
    if static is MISSING or not is_data_descriptor(static):
        return False
    if isinstance(static, types.MemberDescriptorType):
        return False  # a __slots__ member: object.__setattr__ stores into it
    guard_class_attribute(tx, kind, name, static, receiver)
    if isinstance(static, property):
        if static.fset is None:
            error = AttributeError(f"property {name!r} of {kind.__name__!r} object has no setter")
            raise raise_in_trace(error, f"AttributeError: {error} (raised natively)")
        if not isinstance(static.fset, types.FunctionType):
            raise Unsupported(f"the setter of property {name!r} of {kind.__qualname__} is not Python code",
                              kind="unsupported_attribute")
        source = accessor_source(receiver, kind, name, "fset") if static.fset.__closure__ else None
        UserFunctionVariable(static.fset, source).call(tx, [receiver, value], {})
        return True
    setter = inspect.getattr_static(type(static), "__set__", None)
    if isinstance(setter, types.FunctionType):
        guard_class_attribute(tx, type(static), "__set__", setter)
        descriptor = tx.wrap(static, class_dict_source(receiver_class_source(receiver), kind, name))
        UserMethodVariable(setter, descriptor).call(tx, [receiver, value], {})
        return True
    raise Unsupported(f"assigning {name!r} through a {type(static).__name__} of {kind.__qualname__}",
                      kind="unsupported_attribute")


def class_attribute_written(tx: "Tracer", cls: type, name: str, instance_has: bool | None) -> Variable | None:
    """What reading `name` gives where the trace wrote it on a class of `cls.__mro__` (the write is
    replayed after the graph, so the real lookup would still see the old value): read on the class
    itself (`instance_has` None: a class read through its base) or on an instance of it
    (`instance_has`: whether its own dict holds the name); None where no such write decides the
    lookup. A written value that binds (a function becomes a bound method on an instance), or an
    instance value that a data descriptor the write replaced stood before, is left to a break."""
    value = tx.side_effects.class_write(cls, name)
    if value is None or instance_has is None:
        return value
    if instance_has:
        if is_data_descriptor(inspect.getattr_static(cls, name, None)):
            raise Unsupported(f"reading {name!r} of a {cls.__qualname__} instance after the trace replaced the "
                              f"descriptor of its class that stood before the instance's own value",
                              kind="unsupported_attribute")
        return None  # the instance's own value comes first, as before the write
    try:
        kind: type | None = value.python_type()
    except Unsupported:
        kind = None
    if kind is None or hasattr(kind, "__get__"):
        raise Unsupported(f"reading {name!r} of a {cls.__qualname__} instance after the trace set it on its class "
                          f"to a value that binds (a function or descriptor)", kind="unsupported_attribute")
    return value


_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: builtins and C types refuse attribute writes


def user_class(cls: type) -> bool:
    """A class of the user's own code: its attributes may be written by the frame and replayed.
    Not a builtin or C type (the write raises), nor a class of torch or the standard library."""
    if cls.__flags__ & _IMMUTABLE_TYPE:
        return False
    module = sys.modules.get(cls.__module__)
    filename = getattr(module, "__file__", None)
    return not (isinstance(filename, str) and is_library_code(filename))


def store_class_attribute(tx: "Tracer", obj: Variable, name: str, value: Variable) -> None:
    """`C.k = v` on a user class from outside the frame: recorded and replayed after the graph (as
    torch.compile does); later reads in the frame, through the class, its subclasses and its
    instances, see `v` (SideEffects.class_write). Left as a break where the write would do more
    than bind a name in the class dict: a metaclass with its own __setattr__ (Enum's), a
    metaclass data descriptor, or a special method name (it changes the type's slots)."""
    cls = obj.as_python_value()
    if type(cls).__setattr__ is not type.__setattr__:
        raise Unsupported(f"setting attribute {name!r} on {obj.describe()}, whose metaclass "
                          f"{type(cls).__qualname__} has its own __setattr__", kind="unsupported")
    if name.startswith("__") and name.endswith("__"):
        raise Unsupported(f"setting the special attribute {name!r} on {obj.describe()} (it changes how the class "
                          f"behaves, not only what it holds)", kind="unsupported")
    if is_data_descriptor(inspect.getattr_static(type(cls), name, None)):
        raise Unsupported(f"setting attribute {name!r} on {obj.describe()} through a descriptor of its metaclass",
                          kind="unsupported")
    tx.side_effects.store_attr(cls, obj, name, value)


def type_has_attr(obj: Variable, name: str) -> bool | None:
    """`hasattr(obj, name)` answered from the value's type alone when its getattr could not say (the
    tracer's has_attr): True when the class has the attribute, False when it has not and its
    instances can hold no attributes of their own (no `__dict__`, no `__getattr__`); None when only
    the value knows."""
    try:
        kind = obj.python_type()
    except Unsupported:
        return None
    if inspect.getattr_static(kind, name, MISSING) is not MISSING:
        return True
    if any("__dict__" in base.__dict__ or "__getattr__" in base.__dict__ for base in kind.__mro__):
        return None
    return False
