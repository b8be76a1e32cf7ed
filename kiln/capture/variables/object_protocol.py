"""The protocols CPython runs through a user object's own Python methods, followed during capture:
len() and truth (`__len__`, `__bool__`), iteration (`__iter__`), str/repr/format (`__str__`,
`__repr__`, `__format__`), the `__getattr__` fallback, `operator.attrgetter`/`itemgetter` calls,
the views a collections.abc.Mapping hands out, and the flags of torch.backends read as process
settings. Each inlines the method the class writes, guarded on the class (or reads the value and
guards it). Used by user_object.py. Corresponds to parts of torch/_dynamo/variables/user_defined.py.
"""
from __future__ import annotations

import collections.abc
import inspect
import operator
import types
from typing import TYPE_CHECKING, Any

from kiln.capture.variables.base import Variable
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
    from kiln.capture.guards import Guard, ProcessQuery
    from kiln.capture.variables.constant import is_constant_value

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
    if result.is_constant() and type(result.as_constant()) is int and result.as_constant() >= 0:
        return result
    return None


def call_getter(tx: "Tracer", getter: Any, target: Variable) -> Variable:
    """`operator.attrgetter("a.b", "c")(obj)` and `operator.itemgetter(k)(obj)`: the reads they make,
    traced one by one (their names and keys come from the getter's own `__reduce__`)."""
    from kiln.capture.opcodes.operators import subscript
    from kiln.capture.variables.sequence import TupleVariable

    keys = getter.__reduce__()[1]
    found: list[Variable] = []
    for key in keys:
        if isinstance(getter, operator.attrgetter):
            value = target
            for part in key.split("."):
                value = tx.getattr(value, part)
        else:
            value = subscript(tx, target, tx.wrap(key, None))
        found.append(value)
    return found[0] if len(found) == 1 else TupleVariable(found)


def python_getattr(tx: "Tracer", kind: type, name: str, static: Any, in_instance: bool) -> types.FunctionType | None:
    """The class's Python `__getattr__` when CPython calls it for `name`: the ordinary lookup
    found nothing (not in the instance dict, not on the class). A class attribute that is a
    descriptor could raise AttributeError and fall through to it: not decided here, a break."""
    getattr_fn = inspect.getattr_static(kind, "__getattr__", None)
    if getattr_fn is None:
        return None
    if not isinstance(getattr_fn, types.FunctionType):
        raise Unsupported(f"{kind.__qualname__}.__getattr__ is not a Python function", kind="unsupported_attribute")
    from kiln.capture.variables.functions import guard_class_attribute
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
    from kiln.capture.guards import ABSENT
    guard_class_attribute(tx, kind, name, ABSENT)  # still not on the class next time
    return getattr_fn


def python_text(tx: "Tracer", var: Variable, name: str, spec: str = "") -> str | None:
    """`str(obj)`, `repr(obj)` or `format(obj, spec)` (name `__str__`, `__repr__`, `__format__`)
    of a user object (an instance, not a class or module) whose class writes the method CPython
    would call in Python (str falls back to
    `__repr__`, format with an empty spec to str): inlined, and its string is the answer. None when
    no Python method answers (object's own would print an address)."""
    from kiln.capture.guards import ABSENT
    from kiln.capture.variables.functions import UserMethodVariable, guard_class_attribute

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
    """`iter(obj)` through an `__iter__` written in Python (a user Mapping's), inlined and run to
    its end; None when the class has none."""
    if not isinstance(inspect.getattr_static(cls, "__iter__", None), types.FunctionType):
        return None
    return tx.iterate(var.getattr(tx, "__iter__").call(tx, [], {}))


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
            if result.is_constant() and isinstance(result.as_constant(), (bool, int)):
                return bool(result.as_constant())
            return None
        if static is not None:
            return None
    return None
