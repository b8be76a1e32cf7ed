"""Other Python objects reached from the frame: modules of Python code, classes, and instances
(dataclass and namedtuple configs, plain objects), read attribute by attribute.

The object itself is a trace-time constant (guarded by identity for modules and classes, by type
for instances); each attribute read is wrapped with its own source and guard. Methods found on the
class are inlined with the object as `self`. Attribute writes go to the side-effect log.
Corresponds to torch/_dynamo/variables/user_defined.py and misc.py (PythonModuleVariable); `super()`
is super_call.py.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import math
import operator
import os
import random
import types
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from kiln.capture.sources import AttrSource, ItemSource, Source
from kiln.capture.trace_rules import (
    break_kind_of,
    constructible,
    in_stable_module,
    is_numpy_math,
    is_pure_library_function,
    never_traced,
    python_new,
    trace_time_module_class,
)
from kiln.capture.variables.base import Variable
from kiln.capture.variables.enum_calls import enum_member
from kiln.capture.variables.constant import is_constant_value
from kiln.capture.variables.environ import EnvironReadVariable
from kiln.capture.variables.dict import (
    DictVariable,
    constructible_dict_subclass,
    new_dict_subclass,
)
from kiln.capture.variables.model_output import ModelOutputVariable, is_model_output_class
from kiln.capture.variables.object_protocol import (
    MAPPING_VIEWS,
    MISSING,
    MappingViewVariable,
    call_getter,
    call_method_caller,
    holds_backend_settings,
    is_data_descriptor,
    python_getattr,
    python_iter,
    python_iterator,
    python_len,
    python_truth,
    read_backend_setting,
)
from kiln.capture.variables.functions import is_autograd_function_apply, python_function
from kiln.capture.variables.instance_dict import written_instance_dict
from kiln.capture.variables.symint import SymIntVariable, decided, holds_symbolic_number, symbolic_product
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.iterator import IteratorVariable

_MISSING = MISSING
# Classes whose call in the frame another module traces (module.py: nn.Sequential, nn.ModuleList
# built from modules), registered there so this module need not import it; None: the usual path.
CLASS_CALLS: dict[type, Callable[["Tracer", type, Sequence[Variable], dict[str, Variable]], "Variable | None"]] = {}
# of CLASS_CALLS' classes, those whose handler also takes a subclass (answering None where it cannot)
SUBCLASSES_TOO: set[type] = set()


class ObjectVariable(Variable):
    """A real Python object used as a trace-time constant whose attributes are read on demand."""

    def __init__(self, value: Any, source: Source | None = None, pin: Any = None) -> None:
        self.value = value
        self.source = source
        # An instance from outside is guarded by type only: `pin` adds the identity guard the first
        # time the trace decides something by which object it is (`is`, id(), a key hashed by identity).
        self.pin = pin

    def pin_identity(self) -> None:
        pin = getattr(self, "pin", None)
        if pin is not None:
            pin()
            self.pin = None

    def describe(self) -> str:
        if isinstance(self.value, (type, types.ModuleType)):
            return f"{type(self.value).__name__} {getattr(self.value, '__name__', '?')}"
        return f"{type(self.value).__qualname__} object"

    def python_type(self) -> type:
        return type(self.value)

    def as_python_value(self) -> Any:
        return self.value

    def identity(self) -> Any:
        return self.value

    def is_constant(self) -> bool:
        # Enum members and frozen dataclasses behave as constants (hashable, compared by value):
        # a frozen dataclass the trace built from constants (`{P(1, "a"), P(2, "b")}`, a dict key)
        return isinstance(self.value, enum.Enum) or self.source is None and _frozen_value_record(self.value)

    def as_constant(self) -> Any:
        if self.is_constant():
            return self.value
        return super().as_constant()

    def truth(self, tx: "Tracer") -> bool:
        kind = type(self.value)
        if isinstance(self.value, (type, types.ModuleType, types.FunctionType)):
            return True
        if getattr(kind, "__bool__", None) is None and getattr(kind, "__len__", None) is None:
            return True
        known = python_truth(tx, self, kind)
        if known is not None:
            return known
        raise Unsupported(f"truth value of {self.describe()}", kind="unsupported_builtin")

    def length(self, tx: "Tracer") -> Variable:
        if isinstance(self.value, enum.EnumMeta) and type(self.value).__len__ is enum.EnumMeta.__len__:
            return tx.wrap_result(len(self.value))
        if not isinstance(self.value, (type, types.ModuleType)):
            result = python_len(tx, self, type(self.value))
            if result is not None:
                return result
        raise Unsupported(f"len() of {self.describe()}", kind="unsupported_builtin")

    def iterate(self, tx: "Tracer") -> list[Variable]:
        if isinstance(self.value, enum.EnumMeta) and _plain_member_iteration(self.value):
            # an Enum class's members are fixed when it is made (the class is guarded by identity)
            members: list[Any] = list(self.value)
            return [tx.wrap_result(member) for member in members]
        if not isinstance(self.value, (type, types.ModuleType)):
            items = python_iter(tx, self, type(self.value))
            if items is not None:
                return items
        return super().iterate(tx)

    def open_iterator(self, tx: "Tracer") -> IteratorVariable | None:
        """`iter(obj)` through the class's Python `__iter__` (None when it has none)."""
        if isinstance(self.value, (type, types.ModuleType)):
            return None
        return python_iterator(tx, self, type(self.value))

    def _unset_slot(self, tx: "Tracer", name: str, error: AttributeError) -> Variable:
        """`obj.name` of a __slots__ member never set (or deleted): eager's AttributeError, raised
        where the program can catch it, with the slot guarded unset (set later, it recompiles)."""
        from kiln.capture.variables.exception import raise_in_trace

        if "__getattr__" in _class_dicts(type(self.value)):
            raise Unsupported(f"unset slot {name!r} of {self.describe()} with a __getattr__", kind="unsupported_attribute")
        if self.source is not None:
            from kiln.capture.guards import Guard
            tx.state.output.guards.append(Guard(f"hasattr({self.source.name()}, {name!r})", "check_value", False,
                                                f"whether {self.source.name()}.{name} is set"))
        raise raise_in_trace(error, f"{self.describe()} has no attribute {name!r} (raised natively)")

    def _attr_source(self, name: str) -> Source | None:
        return None if self.source is None else AttrSource(self.source, name)

    def _stored_source(self, name: str) -> Source | None:
        """Where the instance dict's own `name` is read: `obj.name`, or `obj.__dict__['name']` when the
        class's Python __getattribute__ may answer `obj.name` with something else (the guard
        checks what the generic lookup found)."""
        if self.source is not None and isinstance(inspect.getattr_static(type(self.value), "__getattribute__"),
                                                  types.FunctionType):
            return ItemSource(AttrSource(self.source, "__dict__"), name)
        return self._attr_source(name)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.functions import UserMethodVariable, guard_class_attribute

        obj = self.value
        pending = tx.side_effects.pending_attr(obj, name)
        if pending is not None:
            return pending
        if tx.side_effects.deleted_attr(obj, name):  # `del obj.name` earlier in the trace
            from kiln.capture.variables.exception import no_attribute
            if inspect.getattr_static(type(obj), name, _MISSING) is _MISSING and "__getattr__" not in _class_dicts(type(obj)):
                raise no_attribute(type(obj), name)
            raise Unsupported(f"reading {name!r} of {self.describe()} after the trace deleted it from the instance",
                              kind="unsupported_attribute")
        written = written_instance_dict(tx, obj)
        if written is not None and name == "__dict__":
            return written
        if written is not None:  # `vars(obj)[k] = v` earlier in the trace: the dict says what is there
            static = inspect.getattr_static(type(obj), name, _MISSING)
            plain = "__getattr__" not in _class_dicts(type(obj)) \
                and inspect.getattr_static(type(obj), "__getattribute__") is object.__getattribute__
            if not plain:
                raise Unsupported(f"reading {name!r} of {self.describe()} after the trace wrote its __dict__",
                                  kind="unsupported_attribute")
            # object's lookup order: a data descriptor of the class first (its __get__, traced
            # below, reads the written dict), then the instance dict, then the class attribute
            if static is _MISSING or not is_data_descriptor(static):
                found = written.items.get(name)
                if found is not None:
                    return found
                if static is _MISSING:
                    from kiln.capture.variables.exception import no_attribute
                    raise no_attribute(type(obj), name)
                if name in obj.__dict__:  # removed from the dict by the trace: the class's answer, not modelled
                    raise Unsupported(f"reading {name!r} of {self.describe()} after the trace removed it from "
                                      f"its __dict__", kind="unsupported_attribute")
        if name == "__dict__" and tx.side_effects.writes_attributes_of(obj):
            raise Unsupported(f"reading the __dict__ of {self.describe()} after the trace set or deleted its attributes",
                              kind="unsupported_attribute")
        if isinstance(obj, enum.Enum) and name in ("name", "value", "_name_", "_value_"):
            # a member's name and value (descriptors of the Enum class): read off the member, which
            # is guarded by identity, and guarded themselves through their source
            return tx.wrap(getattr(obj, name), self._attr_source(name))
        if holds_backend_settings(obj):
            return read_backend_setting(tx, obj, name)
        if isinstance(obj, (types.ModuleType, type)):
            if isinstance(obj, type):
                static = inspect.getattr_static(obj, name, _MISSING)
                if isinstance(static, classmethod) and is_autograd_function_apply(getattr(obj, name)):
                    # kept as the bound method: calling it records one node or breaks
                    return ObjectVariable(getattr(obj, name), self._attr_source(name))
                if isinstance(static, (classmethod, staticmethod)):
                    guard_class_attribute(tx, obj, name, static, class_source=self.source)
                    if isinstance(static, classmethod):
                        return UserMethodVariable(python_function(static.__func__, "a classmethod"), self)
                    return tx.wrap(static.__func__, None)
                if self.source is None and static is not _MISSING and any(name in k.__dict__ for k in obj.__mro__):
                    # a class reached without a source (type() of an object built in the frame):
                    # what was read from it is guarded on the class itself (not what its metaclass
                    # answers, `__name__`: fixed with the class, which is guarded by identity)
                    guard_class_attribute(tx, obj, name, static)
            try:
                value = getattr(obj, name)
            except AttributeError as exc:
                from kiln.capture.variables.exception import raise_in_trace
                raise raise_in_trace(exc, f"{self.describe()} has no attribute {name!r} (raised natively)") from exc
            if _is_stable_module(obj) and not isinstance(value, torch.Tensor) and not _patchable_torch_function(obj, value):
                return tx.wrap(value, None)  # torch.float32, math.pi: fixed for the process
            return tx.wrap(value, self._attr_source(name))
        kind = type(obj)
        if obj is os.environ and name in ("get", "__contains__", "__getitem__"):
            return EnvironReadVariable(self, name)
        getattribute = inspect.getattr_static(kind, "__getattribute__")
        if isinstance(getattribute, types.FunctionType):
            # A Python __getattribute__ (transformers' configs map attribute aliases in one) is
            # inlined like any method; its `super().__getattribute__(key)` comes back to
            # generic_getattr through SuperVariable.
            return UserMethodVariable(getattribute, self).call(tx, [tx.wrap(name, None)], {})
        return self.generic_getattr(tx, name)

    def generic_getattr(self, tx: "Tracer", name: str) -> Variable:
        """object.__getattribute__: data descriptors, then the instance dict, then the class."""
        from kiln.capture.variables.functions import bind_class_attribute

        obj = self.value
        kind = type(obj)
        instance_dict = getattr(obj, "__dict__", None)
        static = inspect.getattr_static(kind, name, _MISSING)
        fallback = python_getattr(tx, kind, name, static, instance_dict is not None and name in instance_dict)
        if fallback is not None:
            if self.source is not None:
                # the attribute is still missing next time: the instance dict holds the same names
                from kiln.capture.guards import Guard
                tx.state.output.guards.append(Guard(AttrSource(self.source, "__dict__").name(), "check_keys",
                                                    tuple(instance_dict or ())))
            from kiln.capture.variables.functions import UserMethodVariable
            return UserMethodVariable(fallback, self).call(tx, [tx.wrap(name, None)], {})
        data_descriptor = hasattr(type(static), "__set__") or hasattr(type(static), "__delete__")
        if instance_dict is not None and name in instance_dict and not data_descriptor:
            return tx.wrap(instance_dict[name], self._stored_source(name))
        if instance_dict is not None and not data_descriptor and self.source is not None:
            # found on the class (or nowhere): an instance attribute set later would be found first
            tx.output.note_absent(AttrSource(self.source, "__dict__"), name)
        if static is _MISSING:
            if name == "__class__":
                return tx.wrap(kind, None)
            if "__getattr__" not in _class_dicts(kind):
                from kiln.capture.guards import ABSENT
                from kiln.capture.variables.exception import no_attribute
                from kiln.capture.variables.functions import guard_class_attribute
                guard_class_attribute(tx, kind, name, ABSENT)
                raise no_attribute(kind, name)
            raise Unsupported(f"{self.describe()} has no attribute {name!r} (raised natively)",
                              kind="unsupported_attribute")
        if isinstance(static, types.FunctionType) and never_traced(static):
            # logger.info, rng.normal: a method of a library that is never inlined; calling it is a
            # break, and the glue reads the method from the object again at run time.
            return ObjectVariable(getattr(obj, name), self._attr_source(name))
        bound = bind_class_attribute(tx, static, self, kind, name)
        if bound is not None:
            return bound
        if type(static).__name__ in ("member_descriptor", "getset_descriptor"):
            try:
                value = getattr(obj, name)
            except AttributeError as exc:
                return self._unset_slot(tx, name, exc)
            return tx.wrap(value, self._attr_source(name))
        if hasattr(type(static), "__get__"):
            from kiln.capture.variables.functions import bind_python_descriptor
            bound = bind_python_descriptor(tx, static, self, kind, name)
            if bound is not None:
                return bound
            raise Unsupported(f"descriptor {name!r} of {kind.__qualname__}", kind="unsupported_attribute")
        if self.source is None:
            from kiln.capture.variables.functions import guard_class_attribute
            guard_class_attribute(tx, kind, name, static)  # with a source, `obj.name` is guarded as read
        return tx.wrap(static, self._attr_source(name))

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.sequence import is_namedtuple_type

        obj = self.value
        if getattr(obj, "__self__", None) is _MODULE_GENERATOR and _MODULE_GENERATOR is not None:
            from kiln.capture.variables.python_random import call_module_random
            drawn = call_module_random(tx, obj, list(args), kwargs)  # `random.seed(0)`, then draws
            if drawn is not None:
                return drawn
        if is_autograd_function_apply(obj):
            from kiln.capture.variables.autograd_function import call_autograd_function
            owner = None  # where the class is read from: `G['Fn']` of `G['Fn'].apply`, or `alias.__self__`
            if isinstance(self.source, AttrSource) and self.source.attr == "apply":
                owner = self.source.base
            elif self.source is not None:
                owner = AttrSource(self.source, "__self__")
            return call_autograd_function(tx, obj.__self__, list(args), kwargs, owner)
        own_new = python_new(obj) if isinstance(obj, type) else None
        if own_new is not None \
                and inspect.getattr_static(type(obj), "__call__") is _TYPE_CALL \
                and (constructible(obj, own_new=True) or issubclass(obj, tuple)):
            return _new_through_python_new(tx, obj, self, own_new, args, kwargs)
        if is_namedtuple_type(obj):
            return _new_namedtuple(tx, obj, args, kwargs)
        class_call = CLASS_CALLS.get(obj) if isinstance(obj, type) else None
        if class_call is None and isinstance(obj, type):
            base = next((b for b in obj.__mro__[1:] if b in SUBCLASSES_TOO), None)
            class_call = None if base is None else CLASS_CALLS[base]
        if class_call is not None:
            built = class_call(tx, obj, args, kwargs)
            if built is not None:
                return built
        if trace_time_module_class(obj):
            from kiln.capture.variables.base import constant_args
            consts = constant_args(list(args), kwargs)
            if consts is not None:
                with torch.random.fork_rng(devices=[]):  # a module with weights would draw them
                    module = obj(*consts[0], **consts[1])
                if next(module.parameters(), None) is None and next(module.buffers(), None) is None:
                    # `nn.ReLU()(x)`, `CrossEntropyLoss()` in a forward: built at trace time from
                    # constants; without tensors of its own it is just its forward's code.
                    return tx.wrap(module, None)
        if isinstance(obj, (operator.attrgetter, operator.itemgetter)) and len(args) == 1 and not kwargs:
            return call_getter(tx, obj, args[0])
        # identity, not `in`: a callable's own __eq__ may refuse a stranger (cmp_to_key's keys raise)
        if (obj is operator.attrgetter or obj is operator.itemgetter) and all(a.is_constant() for a in args) and not kwargs:
            return tx.wrap_result(obj(*[a.as_constant() for a in args]))  # immutable, made from constants
        if isinstance(obj, operator.methodcaller) and len(args) == 1 and not kwargs:
            return call_method_caller(tx, obj, args[0])
        if obj is operator.methodcaller and args and all(a.is_constant() for a in [*args, *kwargs.values()]):
            return tx.wrap_result(obj(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()}))
        if is_model_output_class(obj):
            return ModelOutputVariable.create(tx, obj, list(args), kwargs)
        if any(obj is view for view in MAPPING_VIEWS) and len(args) == 1 and not kwargs:
            return MappingViewVariable(obj, args[0])
        if isinstance(obj, type) and issubclass(obj, BaseException):
            from kiln.capture.variables.exception import construct_exception
            return construct_exception(tx, obj, list(args), kwargs)
        if isinstance(obj, enum.EnumMeta) and len(args) == 1 and not kwargs and _plain_member_lookup(obj) \
                and (args[0].is_constant() or isinstance(args[0], SymIntVariable)):
            # a symbolic int is specialized (guarded): the member depends on its value
            value = tx.as_int(args[0]) if isinstance(args[0], SymIntVariable) else args[0].as_constant()
            return enum_member(tx, obj, value)
        if isinstance(obj, enum.EnumMeta) and len(args) == 1 and not kwargs and args[0].is_constant() \
                and type(obj).__call__ is enum.EnumMeta.__call__:
            found = _user_missing_member(tx, self, obj, args[0])
            if found is not None:
                return found
        # dataclasses keeps its decorator's parameters there; typeshed's DataclassInstance omits it
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) \
                and obj.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            from kiln.capture.variables.base import constant_args
            consts = constant_args(list(args), kwargs)
            if consts is not None:
                return tx.wrap_result(obj(*consts[0], **consts[1]))
        call = inspect.getattr_static(type(obj), "__call__", None)
        if not isinstance(obj, type) and isinstance(call, types.FunctionType):
            from kiln.capture.variables.functions import UserMethodVariable, guard_class_attribute
            guard_class_attribute(tx, type(obj), "__call__", call, self)
            return UserMethodVariable(call, self).call(tx, args, kwargs)
        if is_pure_library_function(obj):
            return _fold_library_call(tx, obj, list(args), kwargs)
        if isinstance(obj, types.BuiltinMethodType) and _plain_constant(obj.__self__):
            folded = _fold_immutable_method(tx, obj, list(args), kwargs)
            if folded is not None:
                return folded
        if isinstance(obj, type) and constructible_dict_subclass(obj):
            return new_dict_subclass(tx, obj, list(args), kwargs)
        if isinstance(obj, type) and constructible(obj):
            return _new_object(tx, obj, self.source, args, kwargs)
        if isinstance(obj, type) and obj.__module__ == "builtins":
            raise Unsupported(f"constructing {obj.__name__}", kind="unsupported_call")
        name = getattr(obj, "__qualname__", type(obj).__qualname__)
        raise Unsupported(f"call to {name} ({getattr(obj, '__module__', None) or type(obj).__module__})",
                          kind=break_kind_of(obj))

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        return self.getattr(tx, name).call(tx, args, kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()
        return glue.constant(self.value)


def _new_namedtuple(tx: "Tracer", cls: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`Point(1, y=2)`: a namedtuple class called, the fields not given filled from its defaults."""
    from kiln.capture.variables.sequence import TupleVariable

    fields = list(cls._fields)
    values = list(args) + [None] * (len(fields) - len(args))
    for key, value in kwargs.items():
        values[fields.index(key)] = value
    filled: list[Variable] = []
    for n, given in enumerate(values):
        if given is None:
            default = cls._field_defaults.get(fields[n], _MISSING)
            if default is _MISSING:
                raise Unsupported(f"{cls.__name__}() missing {fields[n]} (raised natively)", kind="unsupported")
            given = tx.wrap(default, None)
        filled.append(given)
    return TupleVariable(filled, cls)


_TYPE_CALL = type.__dict__["__call__"]


def _new_through_python_new(tx: "Tracer", cls: type, cls_var: Variable, own_new: tuple[type, types.FunctionType],
                            args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`cls(...)` for a class with a Python `__new__`, as type.__call__ runs it: `__new__(cls, ...)`
    inlined (its `super().__new__(cls)` builds the instance), then `__init__` on what it returned
    when that is an instance of `cls` (a cached one from outside included: its writes are effects)."""
    from kiln.capture.variables.functions import UserFunctionVariable, UserMethodVariable, guard_class_attribute

    owner, new = own_new
    guard_class_attribute(tx, cls, "__new__", owner.__dict__["__new__"], class_source=cls_var.source)
    instance = UserFunctionVariable(new).call(tx, [cls_var, *args], kwargs)
    made = instance.python_type()
    if not (isinstance(made, type) and issubclass(made, cls)):
        return instance
    init = inspect.getattr_static(made, "__init__")
    if init is object.__init__:
        return instance
    if not isinstance(init, types.FunctionType):
        raise Unsupported(f"{made.__qualname__}.__init__ after its Python __new__", kind="unsupported_call")
    guard_class_attribute(tx, made, "__init__", init, class_source=cls_var.source if made is cls else None)
    UserMethodVariable(init, instance).call(tx, args, kwargs)
    return instance


def _new_object(tx: "Tracer", cls: type, cls_source: Source | None, args: Sequence[Variable],
                kwargs: dict[str, Variable]) -> Variable:
    """`cls(...)` for a class whose instance capture builds attribute by attribute (trace_rules'
    `constructible`): a NewObjectVariable, its `__init__` inlined with it as `self`."""
    abstract = getattr(cls, "__abstractmethods__", None)
    if abstract:
        # object.__new__ refuses a class with abstract methods left (an ABC not fully implemented)
        from kiln.capture.variables.exception import raise_in_trace
        error = TypeError(f"Can't instantiate abstract class {cls.__name__} with abstract method"
                          f"{'s' if len(abstract) > 1 else ''} {', '.join(sorted(abstract))}")
        raise raise_in_trace(error, f"{error} (raised natively)")
    instance = NewObjectVariable(cls, cls_source)
    init = inspect.getattr_static(cls, "__init__")
    if init is not object.__init__:
        from kiln.capture.variables.functions import UserMethodVariable, guard_class_attribute
        guard_class_attribute(tx, cls, "__init__", init, class_source=cls_source)
        UserMethodVariable(init, instance).call(tx, args, kwargs)
    elif args or kwargs:
        raise Unsupported(f"{cls.__qualname__}() takes no arguments (raised natively)", kind="unsupported")
    return instance


_SCALARS = (bool, int, float, complex)


# math functions kept symbolic on a float argument, and the graph op for each (torch._sym_log2 read here, not
# from kiln.symbolic.node: this module loads before the first capture's ShapeEnv, and sympy must load only in
# kiln.symbolic's guarded import, which an interrupt cannot leave half done)
_FLOAT_MATH: dict[Any, Any] = {math.sqrt: torch.sym_sqrt, math.floor: math.floor, math.ceil: math.ceil,
                               math.trunc: torch.sym_int, math.log2: getattr(torch, "_sym_log2")}


def _fold_library_call(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.symint import SymIntVariable
    from kiln.capture.variables.tensor import TensorVariable

    if any(isinstance(a, TensorVariable) for a in [*args, *kwargs.values()]):
        raise Unsupported(f"{fn.__module__}.{fn.__name__} on a tensor reads its data",
                          kind=break_kind_of(fn))
    symbolic_float = len(args) == 1 and not kwargs and isinstance(args[0], SymIntVariable) \
        and args[0].python_type() is float
    symbolic_int = len(args) == 1 and not kwargs and isinstance(args[0], SymIntVariable) \
        and args[0].python_type() is int
    if symbolic_int and fn in (math.floor, math.ceil, math.trunc):
        return args[0]  # an int's own value
    if symbolic_int and fn in (math.sqrt, math.log2):
        # the square root of a size (an attention scale) or its log2 (a pyramid's depth), kept
        # symbolic as torch.compile keeps them
        return tx.call_op("call_function", _FLOAT_MATH[fn], args, {})
    if symbolic_float and fn in _FLOAT_MATH:
        # a float argument's sqrt (a temperature, a scale) or rounding stays in the graph, as in
        # torch.compile; the ShapeEnv guards what it relies on (sqrt's and trunc's sign)
        return tx.call_op("call_function", _FLOAT_MATH[fn], args, {})
    if fn is math.prod and len(args) == 1 and set(kwargs) <= {"start"} and holds_symbolic_number(args[0]):
        return symbolic_product(tx, args[0].iterate(tx), kwargs.get("start") or tx.wrap_result(1))
    # A symbolic size given to math.* is specialized (guarded) to its value, in a list or tuple too
    values = [decided(a) for a in args]
    kw = {k: decided(v) for k, v in kwargs.items()}
    if is_numpy_math(fn) and not all(isinstance(v, _SCALARS) for v in [*values, *kw.values()]):
        # an array argument is mutable state the trace cannot own: the call runs natively
        raise Unsupported(f"numpy.{fn.__name__} on a numpy array", kind="numpy")
    try:
        return tx.wrap_result(fn(*values, **kw))
    except Exception as exc:
        raise Unsupported(f"{fn.__name__} raised {type(exc).__name__}: {exc} (raised natively)",
                          kind="unsupported") from exc


# the hidden generator whose methods are the random module's functions (variables/python_random.py)
_MODULE_GENERATOR = getattr(random, "_inst", None)

_PLAIN_SCALARS = (str, bytes, int, float, complex, bool, type(None))


def _plain_constant(value: Any) -> bool:
    """A value no call can change nor observe: a number, text, or a tuple/frozenset of them."""
    if type(value) in _PLAIN_SCALARS:
        return True
    return type(value) in (tuple, frozenset) and all(_plain_constant(v) for v in value)


def _fold_immutable_method(tx: "Tracer", method: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable | None:
    """A builtin method bound to an immutable plain value (`frozenset(words).__contains__` kept by
    collections.namedtuple, `"-".join`, `(3).to_bytes`) on constant arguments: it reads nothing but
    its receiver and arguments, so it runs now; None where an argument is not a constant. What it
    raises is raised natively (a break), as any call on constants that fails."""
    from kiln.capture.variables.base import constant_args
    consts = constant_args(args, kwargs)
    if consts is None or not all(_plain_constant(v) for v in [*consts[0], *consts[1].values()]):
        return None
    try:
        return tx.wrap_result(method(*consts[0], **consts[1]))
    except Exception as exc:
        name = f"{type(method.__self__).__name__}.{method.__name__}"
        raise Unsupported(f"{name} raised {type(exc).__name__}: {exc} (raised natively)", kind="unsupported") from exc


def _patchable_torch_function(module: Any, value: Any) -> bool:
    """A function of torch's namespaces (F.gelu, torch.sigmoid), or a submodule on the way to one
    (torch.nn in `torch.nn.functional.gelu`): guarded by identity where it is read, as torch.compile
    does, since a program or a library may replace it between calls (a graph that baked the old
    function in kept running it)."""
    # torch.ops and its op namespaces (torch.ops.aten, a library's torch.ops.transformers) are module
    # objects too, made once per process and never replaced: no guard (nor one a stored frame could name)
    return isinstance(module, types.ModuleType) and module.__name__.split(".")[0] == "torch" and isinstance(
        value, (types.FunctionType, types.BuiltinFunctionType, types.ModuleType)) and not any(
        str(getattr(v, "__name__", "")).startswith("torch.ops") for v in (module, value))


def _is_stable_module(obj: Any) -> bool:
    return isinstance(obj, types.ModuleType) and in_stable_module(obj.__name__)


def _class_dicts(kind: type) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for base in reversed(kind.__mro__[:-1]):
        merged.update(base.__dict__)
    return merged


class NewObjectVariable(Variable):
    """An instance of a user class created during the trace (a config, an output record).

    Its attributes are tracked values; the glue builds the real object with `cls.__new__(cls)` and
    fills its `__dict__` when it is returned or live at a break.
    """

    def __init__(self, cls: type, cls_source: Source | None = None) -> None:
        self.cls = cls
        self.cls_source = cls_source  # where the class was read from; class attributes are guarded there
        self.attrs: dict[str, Variable] = {}
        self.instance_dict: DictVariable | None = None

    def describe(self) -> str:
        return f"new {self.cls.__qualname__} object"

    def python_type(self) -> type:
        return self.cls

    def identity(self) -> Any:
        return self  # made once in the frame: this Variable is the object

    def truth(self, tx: "Tracer") -> bool:
        if getattr(self.cls, "__bool__", None) is None and getattr(self.cls, "__len__", None) is None:
            return True
        known = python_truth(tx, self, self.cls)
        if known is not None:
            return known
        raise Unsupported(f"truth value of {self.describe()}", kind="unsupported_builtin")

    def length(self, tx: "Tracer") -> Variable:
        result = python_len(tx, self, self.cls)
        if result is not None:
            return result
        raise Unsupported(f"len() of {self.describe()}", kind="unsupported_builtin")

    def iterate(self, tx: "Tracer") -> list[Variable]:
        items = python_iter(tx, self, self.cls)
        if items is not None:
            return items
        return super().iterate(tx)

    def open_iterator(self, tx: "Tracer") -> IteratorVariable | None:
        """`iter(obj)` through the class's Python `__iter__` (None when it has none)."""
        return python_iterator(tx, self, self.cls)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.functions import UserMethodVariable, guard_class_attribute

        getattribute = inspect.getattr_static(self.cls, "__getattribute__")
        if isinstance(getattribute, types.FunctionType):
            # the class's own __getattribute__ decides every read (as for an object from outside);
            # its `super().__getattribute__(name)` comes back to generic_getattr
            guard_class_attribute(tx, self.cls, "__getattribute__", getattribute, class_source=self.cls_source)
            return UserMethodVariable(getattribute, self).call(tx, [tx.wrap(name, None)], {})
        return self.generic_getattr(tx, name)

    def generic_getattr(self, tx: "Tracer", name: str) -> Variable:
        """object.__getattribute__ of an object built in the frame: its own dict is the trace's."""
        from kiln.capture.variables.functions import UserMethodVariable, guard_class_attribute

        static = inspect.getattr_static(self.cls, name, _MISSING)
        # a data descriptor of the class wins over the instance dict (a slot's value is kept there)
        shadowed = static is not _MISSING and is_data_descriptor(static) and \
            not isinstance(static, types.MemberDescriptorType)
        if name in self.attrs and not shadowed:
            return self.attrs[name]
        if name == "__class__":
            return tx.wrap(self.cls, self.cls_source)
        if name == "__dict__" and not getattr(self.cls, "__dictoffset__", 0):
            from kiln.capture.variables.exception import no_attribute  # __slots__ all the way down
            raise no_attribute(self.cls, name)
        if name == "__dict__" and any(base.__dict__.get("__slots__") for base in self.cls.__mro__):
            raise Unsupported(f"the __dict__ of {self.describe()}, whose class has __slots__ too",
                              kind="unsupported_attribute")
        if name == "__dict__":
            if self.instance_dict is None:  # a dict over the very attributes: writes through it show
                self.instance_dict = DictVariable({})
                self.instance_dict.items = self.attrs
            return self.instance_dict
        if static is _MISSING and "__getattr__" not in _class_dicts(self.cls):
            # Its own dict is what the trace built; that the class lacks the name is guarded.
            from kiln.capture.guards import ABSENT
            from kiln.capture.variables.exception import raise_in_trace
            guard_class_attribute(tx, self.cls, name, ABSENT)
            message = f"{self.cls.__name__!r} object has no attribute {name!r}"
            raise raise_in_trace(AttributeError(message), f"{message} (raised natively)")
        fallback = python_getattr(tx, self.cls, name, static, False)
        if fallback is not None:
            return UserMethodVariable(fallback, self).call(tx, [tx.wrap(name, None)], {})
        if isinstance(static, types.MemberDescriptorType) and static.__objclass__ in self.cls.__mro__:
            from kiln.capture.variables.exception import raise_in_trace  # a __slots__ member never set
            guard_class_attribute(tx, self.cls, name, static, class_source=self.cls_source)
            raise raise_in_trace(AttributeError(name), f"AttributeError: {name} (raised natively)")
        if static is not _MISSING and hasattr(type(static), "__get__") and not isinstance(
                static, (property, types.FunctionType, staticmethod, classmethod)):
            from kiln.capture.variables.functions import bind_python_descriptor
            bound = bind_python_descriptor(tx, static, self, self.cls, name)
            if bound is not None:
                return bound
        if static is _MISSING or (hasattr(type(static), "__get__") and not isinstance(
                static, (property, types.FunctionType, staticmethod, classmethod))):
            raise Unsupported(f"{self.describe()} has no attribute {name!r} (raised natively)",
                              kind="unsupported_attribute")
        # The instance was built in the frame, so its own dict is known; what comes from its class
        # (a method, a constant like `self.K`, inherited or not) is guarded on the class.
        if not isinstance(static, (property, types.FunctionType, staticmethod, classmethod)) \
                and self.cls_source is not None:
            from kiln.capture.sources import AttrSource
            return tx.wrap(static, AttrSource(self.cls_source, name))  # guarded as `A.K` is read
        guard_class_attribute(tx, self.cls, name, static, class_source=self.cls_source)
        if isinstance(static, property):
            from kiln.capture.variables.functions import read_property
            return read_property(tx, static, self, name)
        if isinstance(static, types.FunctionType):
            return UserMethodVariable(static, self)
        if isinstance(static, staticmethod):
            return tx.wrap(static.__func__, None)
        if isinstance(static, classmethod):
            return UserMethodVariable(python_function(static.__func__, "a classmethod"),
                                      tx.wrap(self.cls, self.cls_source))
        return tx.wrap_result(static)

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        return self.getattr(tx, name).call(tx, args, kwargs)

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        """`obj(...)`: the class's Python `__call__` (the instance dict is not consulted)."""
        from kiln.capture.variables.functions import UserMethodVariable, guard_class_attribute

        call = inspect.getattr_static(self.cls, "__call__", None)
        if not isinstance(call, types.FunctionType):
            return super().call(tx, args, kwargs)
        guard_class_attribute(tx, self.cls, "__call__", call, class_source=self.cls_source)
        return UserMethodVariable(call, self).call(tx, args, kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        cls = glue.constant(self.cls)
        name = glue.fresh("obj")
        # a class's own Python __new__ (a cache, a singleton) already ran in the trace: not again
        new = glue.constant(object.__new__) if python_new(self.cls) is not None else f"{cls}.__new__"
        glue.line(f"{name} = {new}({cls})")
        slots = {k for k in self.attrs if isinstance(inspect.getattr_static(self.cls, k, None), types.MemberDescriptorType)}
        for k in slots:  # a __slots__ member is set through its descriptor, never the instance dict
            glue.line(f"{glue.constant(object.__setattr__)}({name}, {k!r}, {glue.reconstruct(self.attrs[k])})")
        if len(self.attrs) > len(slots):
            body = ", ".join(f"{k!r}: {glue.reconstruct(v)}" for k, v in self.attrs.items() if k not in slots)
            glue.line(f"{name}.__dict__.update({{{body}}})")
        return name


def _plain_member_lookup(cls: enum.EnumMeta) -> bool:
    """`Color(2)` looks a member up by value and runs no Python of the program: the metaclass's
    own __call__ and the enum module's own _missing_ (Flag's combines members; a class's own
    _missing_ hook is user code)."""
    missing = getattr(inspect.getattr_static(cls, "_missing_", None), "__func__", None)
    return type(cls).__call__ is enum.EnumMeta.__call__ and missing in _LIBRARY_MISSING


def _frozen_value_record(value: Any) -> bool:
    """A frozen dataclass instance compared and hashed by its fields (the generated __eq__ and
    __hash__), every field a constant: a value, like a tuple of constants."""
    kind = type(value)
    params = getattr(kind, "__dataclass_params__", None)
    if params is None or not (params.frozen and params.eq) or isinstance(value, type):
        return False
    return all(is_constant_value(getattr(value, field.name)) or isinstance(getattr(value, field.name), enum.Enum)
               for field in dataclasses.fields(value))


def _plain_member_iteration(cls: enum.EnumMeta) -> bool:
    """`for m in Color` runs no Python of the program: the enum module's own __iter__ (a metaclass
    of the program's own may define another)."""
    return type(cls).__iter__ is enum.EnumMeta.__iter__


_LIBRARY_MISSING = (enum.Enum._missing_.__func__, enum.Flag._missing_.__func__)  # type: ignore[attr-defined]


def _user_missing_member(tx: "Tracer", cls_var: Variable, cls: enum.EnumMeta, key: Variable) -> Variable | None:
    """`Color(v)` of a class with its own `_missing_` classmethod: a value of a member is that member
    (no Python runs); another is what the hook, inlined, returns (None: eager's ValueError)."""
    from kiln.capture.variables.exception import raise_in_trace
    from kiln.capture.variables.functions import UserFunctionVariable

    value = key.as_constant()
    try:
        known = value in cls._value2member_map_
    except TypeError:  # unhashable: the class searches its members, then the hook
        known = False
    if known:
        return enum_member(tx, cls, value)
    hook = inspect.getattr_static(cls, "_missing_", None)
    if not isinstance(hook, classmethod) or not isinstance(hook.__func__, types.FunctionType):
        return None
    result = UserFunctionVariable(hook.__func__).call(tx, [cls_var, key], {})
    if result.is_constant() and result.as_constant() is None:
        error = ValueError(f"{value!r} is not a valid {cls.__qualname__}")
        raise raise_in_trace(error, f"ValueError: {error} (raised natively)")
    if isinstance(result, ObjectVariable) and isinstance(result.value, cls):
        return result
    return None
