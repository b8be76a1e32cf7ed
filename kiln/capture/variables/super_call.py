"""`super()` during capture: the attribute lookup that starts after a class in the receiver's MRO.

A Python method found there is inlined with the same receiver; the base-class methods that are not
Python (object's `__init__`/`__setattr__`/`__getattribute__`, nn.Module's `__call__`/`__getattr__`,
dict's reads and methods, a builtin exception's `__init__`/`__str__`) are small Variables here that
do what the base's method does, skipping the subclass's override. A method of a user class read
this way is guarded as `self.method` would be (the classes after `cls` in the MRO).
Corresponds to torch/_dynamo/variables/misc.py (SuperVariable).
"""
from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Sequence

import torch

from kiln.capture.guards import Guard
from kiln.capture.sources import ItemSource, RawItemSource
from kiln.capture.trace_rules import in_stable_module
from kiln.capture.variables.base import Variable, constant_args
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.dict import BUILTIN_DICTS as DICT_BASES, DictMethodVariable, DictVariable
from kiln.capture.variables.exception import ExceptionVariable
from kiln.capture.variables.functions import (PartialVariable, UserFunctionVariable, UserMethodVariable,
                                             guard_class_attribute, python_function)
from kiln.capture.variables.tensor import TensorVariable
from kiln.capture.variables.user_object import NewObjectVariable, ObjectVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


_TENSOR_BASES = (torch.nn.Parameter, torch.Tensor, torch._C.TensorBase)


class SuperVariable(Variable):
    """`super()` inside an inlined method: attribute lookup starts after `cls` in the MRO of self."""

    def __init__(self, cls: type, obj: Variable) -> None:
        self.cls = cls
        self.obj = obj

    def describe(self) -> str:
        return f"super({self.cls.__name__})"

    def _receiver_class(self) -> type | None:
        """The class `super()` binds to inside a classmethod (its `cls`), else None (an instance)."""
        try:
            value = self.obj.as_python_value()
        except Unsupported:
            return None
        return value if isinstance(value, type) and issubclass(value, self.cls) else None

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        receiver_class = self._receiver_class()
        mro = (receiver_class or self.obj.python_type()).__mro__
        if self.cls not in mro:
            raise Unsupported(f"super({self.cls.__name__}, obj): obj is not an instance or subtype of "
                              f"{self.cls.__name__} (raised natively)", kind="unsupported")
        start = mro.index(self.cls) + 1
        for base in mro[start:]:
            if name in base.__dict__:
                attr = base.__dict__[name]
                if base in _TENSOR_BASES and isinstance(self.obj, TensorVariable) \
                        and callable(getattr(torch.Tensor, name, None)):
                    # `super().sum()` in a method of a Parameter subclass: torch.Tensor.sum on it, a
                    # graph call of that function (a method call in the graph would find the override)
                    return PartialVariable(tx.wrap(getattr(torch.Tensor, name), None), [self.obj], {})
                if base is torch.nn.Module and name == "__getattr__" and hasattr(self.obj, "table_getattr"):
                    return GenericGetattrVariable(self.obj, "table_getattr")
                if base is torch.nn.Module and name == "__call__" and hasattr(self.obj, "call_impl"):
                    return ModuleCallVariable(self.obj)
                if base is torch.nn.Module and name == "__setattr__" and hasattr(self.obj, "call_impl"):
                    return ObjectSetattrVariable(self.obj)  # the module class's own __setattr__ was inlined
                if isinstance(attr, (types.FunctionType, staticmethod, classmethod)) and \
                        not in_stable_module(base.__module__):
                    guard_class_attribute(tx, mro[0], name, attr, classes=tuple(mro[start:]))
                if isinstance(attr, types.FunctionType):
                    # inside a classmethod (`super().make()` with cls), a plain function stays unbound
                    return tx.wrap(attr, None) if receiver_class is not None else UserMethodVariable(attr, self.obj)
                if isinstance(attr, staticmethod):
                    return tx.wrap(attr.__func__, None)
                if isinstance(attr, classmethod):
                    owner = self.obj if receiver_class is not None else tx.wrap(self.obj.python_type(), None)
                    return UserMethodVariable(python_function(attr.__func__, "a classmethod"), owner)
                if isinstance(attr, property) and isinstance(attr.fget, types.FunctionType) and receiver_class is None:
                    # `super().scale` in a property override: the base's getter, on this object
                    if not in_stable_module(base.__module__):
                        guard_class_attribute(tx, mro[0], name, attr, classes=tuple(mro[start:]))
                    return UserFunctionVariable(attr.fget).call(tx, [self.obj], {})
                if name == "__new__" and isinstance(attr, types.BuiltinFunctionType):
                    # `super().__new__(cls, ...)` in a class's own __new__: object's or tuple's,
                    # a static method (each has its rule in builtin.py)
                    return tx.wrap(attr, None)
                if base is object and name == "__init__":
                    return tx.wrap(lambda *a, **k: None, None)
                if base is object and name == "__setattr__" and isinstance(self.obj, (ObjectVariable, DictVariable,
                                                                                       NewObjectVariable)):
                    return ObjectSetattrVariable(self.obj)
                if base is object and name == "__getattribute__" and hasattr(self.obj, "generic_getattr"):
                    return GenericGetattrVariable(self.obj)
                if isinstance(self.obj, DictVariable) and base in (dict, *DICT_BASES):
                    return DictMethodVariable(self.obj, name)
                if name in ("__init__", "__str__", "__repr__") and issubclass(base, BaseException) \
                        and base.__module__ == "builtins":
                    if isinstance(self.obj, ExceptionVariable):  # the builtin exception's own method
                        return BuiltinExceptionMethodVariable(self.obj, name)
                if base is dict and name in _DICT_READS and isinstance(self.obj, ObjectVariable):
                    return DictReadVariable(self.obj, name)
                raise Unsupported(f"super().{name} of kind {type(attr).__name__}", kind="unsupported_attribute")
        raise Unsupported(f"super() has no attribute {name!r}", kind="unsupported_attribute")


class BuiltinExceptionMethodVariable(Variable):
    """`super().__init__(msg)` (or `__str__`) in a user exception class: BaseException's own."""

    def __init__(self, obj: Variable, name: str) -> None:
        self.obj = obj
        self.name = name

    def describe(self) -> str:
        return f"BaseException.{self.name} of {self.obj.describe()}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        exc = self.obj
        assert isinstance(exc, ExceptionVariable)
        if self.name == "__init__":
            if kwargs:
                raise Unsupported("BaseException.__init__ with keyword arguments (raised natively)", kind="unsupported")
            exc.args = list(args)
            return ConstantVariable(None)
        if not all(a.is_constant() for a in exc.args):
            raise Unsupported(f"BaseException.{self.name} of arguments unknown at trace time", kind="unsupported_call")
        real = BaseException.__new__(exc.exc_type)
        real.args = tuple(a.as_constant() for a in exc.args)
        base = next(b for b in exc.exc_type.__mro__ if b.__module__ == "builtins")
        return ConstantVariable(getattr(base, self.name)(real))


class GenericGetattrVariable(Variable):
    """`super().__getattribute__` bound to an object (an ObjectVariable or a module): the generic
    lookup, skipping the override; with `lookup="table_getattr"`, nn.Module's own `__getattr__`
    reached by `super().__getattr__` from a module class that defines one."""

    def __init__(self, obj: Variable, lookup: str = "generic_getattr") -> None:
        self.obj = obj
        self.lookup = lookup

    def describe(self) -> str:
        return f"{self._method().__qualname__} of {self.obj.describe()}"

    def _method(self) -> Any:
        return torch.nn.Module.__getattr__ if self.lookup == "table_getattr" else object.__getattribute__

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if len(args) != 1 or kwargs:
            raise Unsupported(f"{self._method().__qualname__} with these arguments", kind="unsupported_attribute")
        return getattr(self.obj, self.lookup)(tx, args[0].as_constant())

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.constant(self._method())}.__get__({self.obj.reconstruct(glue)})"


class ModuleCallVariable(Variable):
    """`super().__call__` from a module class that overrides `__call__`: nn.Module's own call
    (hooks and forward), skipping the override."""

    def __init__(self, module: Variable) -> None:
        self.module = module

    def describe(self) -> str:
        return f"Module.__call__ of {self.module.describe()}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return self.module.call_impl(tx, args, kwargs)  # type: ignore[attr-defined]  # an NNModuleVariable

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.constant(torch.nn.Module.__call__)}.__get__({self.module.reconstruct(glue)})"


class ObjectSetattrVariable(Variable):
    """`super().__setattr__` bound to an object: the plain store, skipping the override."""

    def __init__(self, obj: Variable) -> None:
        self.obj = obj

    def describe(self) -> str:
        return f"object.__setattr__ of {self.obj.describe()}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if len(args) != 2 or kwargs:
            raise Unsupported("object.__setattr__ with these arguments", kind="unsupported")
        tx.setattr(self.obj, args[0].as_constant(), args[1], bypass=True)
        return ConstantVariable(None)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.constant(object.__setattr__)}.__get__({self.obj.reconstruct(glue)})"


# dict's own read methods, reached through `super()` from a dict subclass (a registry keyed by
# strings, like transformers' _CanRecordRegistry.get).
_DICT_READS = frozenset({"get", "__getitem__", "__contains__"})


class DictReadVariable(Variable):
    """`super().get(key)` on a real dict-subclass object: read at trace time with a constant key,
    guarded on the dict's keys and on the value read (through `base[key]`)."""

    def __init__(self, obj: ObjectVariable, name: str) -> None:
        self.obj = obj
        self.name = name

    def describe(self) -> str:
        return f"dict.{self.name} of {self.obj.describe()}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        d, source = self.obj.value, self.obj.source
        consts = constant_args(list(args), kwargs)
        if consts is None or kwargs or not consts[0] or source is None or _python_override(type(d), "keys"):
            raise Unsupported(f"super().{self.name} of {type(d).__qualname__} with these arguments",
                              kind="unsupported_attribute")
        tx.state.output.guards.append(Guard(source.name(), "check_keys", tuple(d.keys())))
        key = consts[0][0]
        if self.name == "__contains__":
            return tx.wrap(key in dict.keys(d), None)
        if key in dict.keys(d):
            # `base[key]` would run a Python __getitem__ of the subclass (transformers' ACT2FN
            # builds an instance in it); the guard must read the stored value.
            item = RawItemSource(source, key) if _python_override(type(d), "__getitem__") else ItemSource(source, key)
            return tx.wrap(dict.__getitem__(d, key), item)
        if self.name == "__getitem__":
            raise Unsupported(f"KeyError {key!r} (raised natively)", kind="unsupported")
        return args[1] if len(args) > 1 else tx.wrap(None, None)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.constant(getattr(dict, self.name))}.__get__({self.obj.reconstruct(glue)})"


def _python_override(kind: type, name: str) -> bool:
    """True when `kind` (a dict subclass) gets `name` from a class written in Python."""
    for base in kind.__mro__:
        if name in base.__dict__:
            return base.__module__ not in ("builtins", "collections")
    return False
