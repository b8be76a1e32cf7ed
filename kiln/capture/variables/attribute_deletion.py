"""`del obj.name` and `delattr(obj, name)` during capture.

Only the plain protocol is followed: the class deletes with object.__delattr__ and has no data
descriptor (a property, a slot) of that name, so the attribute lives in the instance dict. An object
made in the frame loses it at once; for an object from outside, the deletion is a side effect
(side_effects.delete_attr) that later reads of the trace see (`hasattr` answers False, a read raises
AttributeError) and that the glue replays after the graph. That the attribute was there is guarded
by reading it first, as the program's own read would be. Anything else is a clean break.
Corresponds to the delattr handling of torch/_dynamo/variables/builtin.py.
"""
from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING

import torch

from kiln.capture.variables.base import Variable
from kiln.capture.variables.builtin import builtin_rule
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.exception import no_attribute
from kiln.capture.variables.functions import (UserFunctionVariable, UserMethodVariable, accessor_source,
                                              class_dict_source, guard_class_attribute, receiver_class_source)
from kiln.capture.variables.instance_dict import held_instance_dict, written_instance_dict
from kiln.capture.variables.module import NNModuleVariable
from kiln.capture.variables.object_protocol import is_data_descriptor
from kiln.capture.variables.user_object import NewObjectVariable, ObjectVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

_MISSING = object()


def _plain_deletion(kind: type, name: str) -> bool:
    """True when `del obj.name` on an instance of `kind` only removes `name` from its instance dict."""
    if getattr(kind, "__delattr__", None) is not object.__delattr__:
        return False
    static = inspect.getattr_static(kind, name, _MISSING)
    descriptor = type(static)
    return not (hasattr(descriptor, "__set__") or hasattr(descriptor, "__delete__")
                or isinstance(static, types.MemberDescriptorType))


def _own_slot(kind: type, name: str) -> bool:
    """`name` is a __slots__ member of `kind` (deleted with object's protocol): emptying it is all
    `del` does."""
    static = inspect.getattr_static(kind, name, _MISSING)
    return getattr(kind, "__delattr__", None) is object.__delattr__ \
        and isinstance(static, types.MemberDescriptorType) and static.__objclass__ in kind.__mro__


def _python_deleter(tx: "Tracer", obj: Variable, kind: type, name: str) -> bool:
    """`del obj.name` where the class holds a property with a Python deleter (or a descriptor
    whose `__delete__` is Python code) and deletes through object's protocol (nn.Module's ends in
    it for names outside its tables): the deleter inlined, as object.__delattr__ calls it. False
    when no such deleter is involved."""
    module_tables = isinstance(obj, NNModuleVariable) and any(
        name in getattr(obj.module, table) for table in ("_parameters", "_buffers", "_modules"))
    if getattr(kind, "__delattr__", None) not in (object.__delattr__, torch.nn.Module.__delattr__) or module_tables:
        return False
    static = inspect.getattr_static(kind, name, _MISSING)
    if isinstance(static, property) and isinstance(static.fdel, types.FunctionType):
        guard_class_attribute(tx, kind, name, static, obj)
        source = accessor_source(obj, kind, name, "fdel") if static.fdel.__closure__ else None
        UserFunctionVariable(static.fdel, source).call(tx, [obj], {})
        return True
    delete = inspect.getattr_static(type(static), "__delete__", None)
    if isinstance(delete, types.FunctionType) and not isinstance(static, property):
        guard_class_attribute(tx, kind, name, static, obj)
        guard_class_attribute(tx, type(static), "__delete__", delete)
        source = class_dict_source(receiver_class_source(obj), kind, name)
        UserMethodVariable(delete, tx.wrap(static, source)).call(tx, [obj], {})
        return True
    return False


def _child_module_deleted(tx: "Tracer", obj: NNModuleVariable, name: str) -> bool:
    """`del module.name` of a submodule (ModuleList.__delitem__ ends here): nn.Module.__delattr__
    removes it from `_modules`, a change of that table that later reads of the children see (the
    table as the trace changed it, when it did). False when `name` is no submodule."""
    table = obj.getattr(tx, "_modules")
    if not table.call_method(tx, "__contains__", [ConstantVariable(name)], {}).as_constant():
        return False
    if name in obj.module._parameters or name in obj.module._buffers or name in obj.module.__dict__:
        return False
    table.call_method(tx, "__delitem__", [ConstantVariable(name)], {})
    return True


def _instance_dict_entry_of_module(obj: NNModuleVariable, kind: type | None, name: str) -> bool:
    """`del module.name` that nn.Module.__delattr__ hands to object.__delattr__: a plain attribute
    (a counter, a cached tensor) outside its parameter, buffer and submodule tables, with no data
    descriptor of that name on the class."""
    m = obj.module
    return kind is not None and getattr(kind, "__delattr__", None) is torch.nn.Module.__delattr__ \
        and obj.source is not None and not any(name in getattr(m, t) for t in ("_parameters", "_buffers", "_modules")) \
        and not is_data_descriptor(inspect.getattr_static(kind, name, None))


def _delete_from_outside(tx: "Tracer", obj: Variable, real: object, name: str) -> None:
    """The deletion of `real.name` from its instance dict as a side effect replayed after the graph;
    later reads of the trace no longer find it. Deleting what is not there raises as in eager."""
    if tx.side_effects.deleted_attr(real, name):
        raise no_attribute(type(real), name)
    if tx.side_effects.pending_attr(real, name) is None:
        if name not in real.__dict__:
            raise no_attribute(type(real), name)
        obj.getattr(tx, name)  # read as the program's read is: its presence is guarded
    tx.side_effects.delete_attr(real, obj, name)
    held = held_instance_dict(tx, real)
    if held is not None:
        held.items.pop(name, None)  # `d = obj.__dict__` read earlier: a removal from d


def delete_attribute(tx: "Tracer", obj: Variable, name: str) -> None:
    """`del obj.name` as the program makes it (see the module docstring)."""
    kind = obj.cls if isinstance(obj, NewObjectVariable) else \
        type(obj.module) if isinstance(obj, NNModuleVariable) else \
        type(obj.value) if isinstance(obj, ObjectVariable) and not isinstance(obj.value, (type, types.ModuleType)) \
        else None
    if kind is not None and _python_deleter(tx, obj, kind, name):
        return
    if isinstance(obj, NNModuleVariable) and getattr(kind, "__delattr__", None) is torch.nn.Module.__delattr__ \
            and obj.source is not None and _child_module_deleted(tx, obj, name):
        return
    if isinstance(obj, NNModuleVariable) and _instance_dict_entry_of_module(obj, kind, name):
        _delete_from_outside(tx, obj, obj.module, name)
        return
    if isinstance(obj, NewObjectVariable) and (_plain_deletion(obj.cls, name) or _own_slot(obj.cls, name)):
        if name not in obj.attrs:  # a slot's value is kept with the attributes too (tracer.setattr)
            raise no_attribute(obj.cls, name)
        del obj.attrs[name]
        return
    if isinstance(obj, ObjectVariable) and not isinstance(obj.value, (type, types.ModuleType)) \
            and obj.source is not None and _plain_deletion(type(obj.value), name) \
            and isinstance(getattr(obj.value, "__dict__", None), dict):
        real = obj.value
        if written_instance_dict(tx, real) is not None:
            raise Unsupported(f"deleting {name!r} of {obj.describe()} after the trace wrote its __dict__",
                              kind="unsupported")
        _delete_from_outside(tx, obj, real, name)
        return
    if type(obj) is UserFunctionVariable and obj.source is not None \
            and inspect.getattr_static(types.FunctionType, name, None) is None:
        _delete_from_outside(tx, obj, obj.fn, name)  # a plain attribute of a function from outside
        return
    raise Unsupported(f"deleting attribute {name!r} of {obj.describe()}", kind="unsupported")


@builtin_rule(delattr)
def delattr_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    if len(args) != 2 or kwargs or not args[1].is_constant() or not isinstance(args[1].as_constant(), str):
        raise Unsupported("delattr() with a name not known at trace time", kind="unsupported_call")
    delete_attribute(tx, args[0], args[1].as_constant())
    return ConstantVariable(None)

