"""Attribute access in the trace: `obj.name` read, tested (hasattr) and written, as the program's
own lookup would make them.

Reads go through each Variable's getattr (guarded as it goes) after the writes the trace made to
a class; hasattr follows the same lookup and turns an AttributeError into False; writes go to the
table Module.__setattr__ would change (parameters, buffers, submodules), to an object made in the
frame, or to the side effects replayed after the graph, inlining a Python __setattr__ first.
The Tracer's getattr/has_attr/setattr call these. Corresponds to the attribute parts of
torch/_dynamo/variables (GetAttrVariable, BuiltinVariable's hasattr and setattr).
"""
from __future__ import annotations

import inspect
import types
from typing import TYPE_CHECKING

import torch

from kiln.capture.sources import AttrSource
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.deque import DequeVariable
from kiln.capture.variables.dict import DictVariable
from kiln.capture.variables.exception import ExceptionVariable, RaisedInTrace, raise_in_trace
from kiln.capture.variables.functions import NestedFunctionVariable, UserFunctionVariable, UserMethodVariable, \
    guard_class_attribute
from kiln.capture.variables.grad_mode import set_grad_mode
from kiln.capture.variables.instance_dict import held_instance_dict, written_instance_dict
from kiln.capture.variables.model_output import ModelOutputVariable
from kiln.capture.variables.object_protocol import (class_attribute_written, python_setattr, store_class_attribute,
                                                   type_has_attr, user_class)
from kiln.capture.variables.sequence import BaseSequenceVariable
from kiln.capture.variables.sets import SetVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.capture.variables.user_object import NewObjectVariable, ObjectVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

_OBJECT_CLASS = vars(object)["__class__"]  # the descriptor behind obj.__class__


def get_attribute(tx: "Tracer", obj: Variable, name: str) -> Variable:
    if name == "__class__" and isinstance(obj, (BaseSequenceVariable, DictVariable, SetVariable, DequeVariable)):
        # a container's class, as type() gives it (its type's lookup found a bound method
        # named __class__); a subclass overriding __class__ keeps its own lookup
        kind = obj.python_type()
        if inspect.getattr_static(kind, name) is _OBJECT_CLASS:
            return tx.wrap_result(kind)
    if tx.side_effects.writes_class_attribute(name):  # `C.k = v` earlier: replayed after the graph
        written = _class_write_seen(tx, obj, name)
        if written is not None:
            return written
    return obj.getattr(tx, name)


def _class_write_seen(tx: "Tracer", obj: Variable, name: str) -> Variable | None:
    """What `obj.name` reads where the trace set `name` on obj's class or a base of it (on a class,
    a subclass, an instance made in the frame or from outside, a module): class_attribute_written."""
    from kiln.capture.variables.module import NNModuleVariable

    if isinstance(obj, NewObjectVariable):
        return class_attribute_written(tx, obj.cls, name, name in obj.attrs)
    real = obj.module if isinstance(obj, NNModuleVariable) else obj.value if isinstance(obj, ObjectVariable) else None
    if real is None or isinstance(real, types.ModuleType):
        return None
    if isinstance(real, type):
        return class_attribute_written(tx, real, name, None)
    own = name in getattr(real, "__dict__", {}) or tx.side_effects.pending_attr(real, name) is not None
    return class_attribute_written(tx, type(real), name, own)


def has_attribute(tx: "Tracer", obj: Variable, name: str) -> bool:
    from kiln.capture.variables.module import NNModuleVariable

    if isinstance(obj, (ObjectVariable, NNModuleVariable)):
        real = obj.as_python_value()
        if tx.side_effects.pending_attr(real, name) is not None:
            return True
        try:
            obj.getattr(tx, name)  # the lookup as the program makes it, guarded as it goes
        except RaisedInTrace as raised:
            if issubclass(raised.exception.exc_type, AttributeError):
                return False
            raise
        except Unsupported:
            # a lookup capture cannot follow (a __getattr__ of the class): asked of the object
            # itself, with the instance dict's lack of the name guarded
            if obj.source is not None and name not in getattr(real, "__dict__", {name: None}):
                tx.output.note_absent(AttrSource(obj.source, "__dict__"), name)
            return hasattr(real, name)
        return True
    if isinstance(obj, TensorVariable):
        return _tensor_has_attr(tx, obj, name)
    if obj.is_constant():
        return hasattr(obj.as_constant(), name)
    try:
        obj.getattr(tx, name)
    except RaisedInTrace as raised:
        if issubclass(raised.exception.exc_type, AttributeError):
            return False
        raise
    except Unsupported:
        known = type_has_attr(obj, name)
        if known is None:
            raise
        return known
    return True


def _set_child_module(tx: "Tracer", obj: Variable, name: str, value: Variable) -> bool:
    """Module.__setattr__ of a module value (or None over a submodule): an entry of `_modules`
    (ModuleList's `layers[i] = m` ends here), changed in the table so that later reads of the
    children see it. False where the value is no submodule."""
    module = obj.module  # type: ignore[attr-defined]
    if name == "_modules" and isinstance(value, DictVariable) and isinstance(module.__dict__.get(name), dict):
        # `tx._modules = OrderedDict(...)` (ModuleList.__delitem__ renumbering what is left):
        # the table's contents replaced, so that reads of the children in this trace see them
        # (the replay fills the dict the module has, where eager binds a new one)
        table = obj.getattr(tx, "_modules")
        table.call_method(tx, "clear", [], {})
        for key, child in value.items.items():
            table.call_method(tx, "__setitem__", [ConstantVariable(key), child], {})
        return True
    is_module = issubclass(value.python_type(), torch.nn.Module)
    if not is_module and not (name in module._modules and value.is_constant() and value.as_constant() is None):
        if name in module._modules:
            raise Unsupported(f"assigning a {value.python_type().__name__} over submodule {name!r}", kind="unsupported")
        return False
    if name in module.__dict__ or name in module._parameters or name in module._buffers \
            or tx.side_effects.pending_attr(module, name) is not None:
        raise Unsupported(f"assigning a submodule to {name!r}, which names another attribute", kind="unsupported")
    table = obj.getattr(tx, "_modules")
    table.call_method(tx, "__setitem__", [ConstantVariable(name), value], {})
    return True


def _tensor_has_attr(tx: "Tracer", obj: TensorVariable, name: str) -> bool:
    """hasattr on a tensor: its class's attributes are the fake's; a Python attribute the program
    set on a real input (`x.scale = 2.0`) is in the real tensor's __dict__ alone, so that is asked,
    and its absence guarded (setting one later recompiles)."""
    real = obj.real()
    if real is None and tx.side_effects.pending_attr(obj.example, name) is not None:
        return True  # set by the trace on a tensor the frame computed
    if real is None or hasattr(type(real), name):
        return hasattr(obj.example, name)
    if tx.side_effects.pending_attr(real, name) is not None:
        return True
    if obj.source is None:
        raise Unsupported(f"hasattr({name!r}) on a tensor capture cannot guard", kind="unsupported_attribute")
    if name in getattr(real, "__dict__", {}):
        tx.wrap(real.__dict__[name], AttrSource(obj.source, name))  # its guard fails once it is gone
        return True
    tx.output.note_absent(AttrSource(obj.source, "__dict__"), name)
    return False


def set_attribute(tx: "Tracer", obj: Variable, name: str, value: Variable, bypass: bool = False) -> None:
    from kiln.capture.variables.module import NNModuleVariable

    if isinstance(obj, NNModuleVariable):
        if obj.built_children is not None:
            obj.built_written = True  # a container built in the frame, rebuilt by the glue without this write
        kind = type(obj.module)
        custom = inspect.getattr_static(kind, "__setattr__")
        overridden = isinstance(custom, types.FunctionType) and custom is not torch.nn.Module.__setattr__
        if overridden and not bypass:
            # the module class's own __setattr__, inlined; its super().__setattr__ comes back with bypass set
            guard_class_attribute(tx, kind, "__setattr__", custom, obj)
            UserMethodVariable(custom, obj).call(tx, [ConstantVariable(name), value], {})
            return
        if python_setattr(tx, obj, kind, name, value):
            return  # a property's setter or a descriptor's __set__, inlined (as Module.__setattr__ ends in object's)
        if isinstance(value, TensorVariable) and (name in obj.module._parameters or name in obj.module._buffers):
            # the tensor there now, read (made a graph input) only when the trace already had it:
            # an unused input that requires grad would tie the graph to its autograd history
            held = obj.module._parameters.get(name, obj.module._buffers.get(name))
            seen = held is not None and any(entry[0] is held for entry in tx.state.wrapped.values())
            current = obj.getattr(tx, name) if seen or tx.side_effects.pending_attr(obj.module, name) \
                or obj._changed_table(tx, "_buffers") is not None else None
            if isinstance(current, TensorVariable) and current.example is value.example:
                return  # `tx.count += 1`: the in-place op already updated the buffer; the store rebinds it to itself
            if name in obj.module._parameters:
                raise Unsupported(f"assigning a new tensor to parameter {name!r} of a module", kind="unsupported")
            # a buffer rebound to a new tensor (an EMA `tx.avg = tx.avg * m + x`, a cache
            # filled on the first call) is what Module.__setattr__ does with it: `_buffers[name]
            # = value`, a change of that table which later reads in the trace (the attribute,
            # named_buffers, state_dict) see, replayed after the graph
            table = obj.getattr(tx, "_buffers")
            table.call_method(tx, "__setitem__", [ConstantVariable(name), value], {})
            return
        if _set_child_module(tx, obj, name, value):
            return
        # the replay must not run an override already traced
        tx.side_effects.store_attr(obj.module, obj, name, value,
                                     base_setattr=torch.nn.Module.__setattr__ if overridden else None)
        return
    if isinstance(obj, NewObjectVariable):
        custom = inspect.getattr_static(obj.cls, "__setattr__")
        if not bypass and isinstance(custom, types.FunctionType):
            # the class's own __setattr__, inlined; its object.__setattr__ comes back with bypass set
            guard_class_attribute(tx, obj.cls, "__setattr__", custom, class_source=obj.cls_source)
            UserMethodVariable(custom, obj).call(tx, [ConstantVariable(name), value], {})
            return
        if not python_setattr(tx, obj, obj.cls, name, value):
            if not getattr(obj.cls, "__dictoffset__", 0) and not isinstance(
                    inspect.getattr_static(obj.cls, name, None), types.MemberDescriptorType):
                message = f"{obj.cls.__name__!r} object has no attribute {name!r}"  # not one of its __slots__
                raise raise_in_trace(AttributeError(message), f"{message} (raised natively)")
            obj.attrs[name] = value  # made during the trace: nothing outside can see it yet
        return
    if isinstance(obj, TensorVariable) and name == "grad":
        obj.set_grad(tx, value)
        return
    if isinstance(obj, TensorVariable) and name == "data":
        _set_data(tx, obj, value)
        return
    if isinstance(obj, TensorVariable) and obj.real() is not None and obj.source is not None \
            and inspect.getattr_static(type(obj.real()), name, None) is None:
        # a Python attribute of an input tensor (`x.tag = ...`): stored in its __dict__ after the graph
        tx.side_effects.store_attr(obj.real(), obj, name, value)
        return
    if isinstance(obj, TensorVariable) and obj.real() is None and obj.source is None \
            and obj.python_type() is torch.Tensor \
            and inspect.getattr_static(torch.Tensor, name, None) is None:
        # a Python attribute of a tensor the frame computes (`y.tag = 1`): set on the graph's output
        # by the glue after the graph (no object exists before it), read back by the trace
        tx.side_effects.store_attr(obj.example, obj, name, value, made=True)
        return
    if isinstance(obj, (NestedFunctionVariable, ExceptionVariable)):
        obj.set_attribute(name, value)  # a function or exception made during the trace
        return
    if isinstance(obj, DictVariable) and not bypass and (obj.source is None or obj.real is not None):
        custom = obj.python_setattr(tx)
        if custom is not None:
            custom.call(tx, [ConstantVariable(name), value], {})
            return
    if isinstance(obj, DictVariable) and obj.source is None and obj.dict_type.__dictoffset__:
        obj.attrs[name] = value  # an instance of a dict subclass made during the trace
        return
    if isinstance(obj, DictVariable) and obj.real is not None:
        tx.side_effects.store_attr(obj.real, obj, name, value)  # a dict subclass from outside
        obj.attrs[name] = value
        return
    if isinstance(obj, ModelOutputVariable):
        obj.set_field(name, value)  # likewise made during the trace
        return
    if isinstance(obj, ObjectVariable) and not isinstance(obj.value, (type, types.ModuleType)):
        kind = type(obj.value)
        custom = inspect.getattr_static(kind, "__setattr__")
        if not bypass and isinstance(custom, types.FunctionType):
            # A Python __setattr__ (transformers' configs map attribute aliases; a frozen
            # dataclass's, which raises FrozenInstanceError) is inlined; its
            # `super().__setattr__` comes back here with bypass set.
            UserMethodVariable(custom, obj).call(tx, [ConstantVariable(name), value], {})
            return
        if not bypass and (kind.__setattr__ is not object.__setattr__ or
                           getattr(kind, "__dataclass_params__", None) is not None and kind.__dataclass_params__.frozen):
            raise Unsupported(f"{kind.__qualname__} has a custom __setattr__", kind="unsupported")
        if python_setattr(tx, obj, kind, name, value):
            return
        if written_instance_dict(tx, obj.value) is not None:
            raise Unsupported(f"setting {name!r} of {obj.describe()} after the trace wrote its __dict__",
                              kind="unsupported")
        # the override (if any) was inlined: the replay is the plain store it ends in
        tx.side_effects.store_attr(obj.value, obj, name, value, plain=kind.__setattr__ is not object.__setattr__)
        instance_dict = held_instance_dict(tx, obj.value)
        if instance_dict is not None:
            instance_dict.items[name] = value  # `d = obj.__dict__` read earlier: a store into d
        return
    if isinstance(obj, ObjectVariable) and isinstance(obj.value, type) and user_class(obj.value):
        store_class_attribute(tx, obj, name, value)
        return
    if type(obj) is UserFunctionVariable and obj.source is not None and (
            inspect.getattr_static(types.FunctionType, name, None) is None or _function_text_attribute(name, value)):
        # a plain attribute of a function from outside (`helper.calls += 1`): its __dict__, written
        # after the graph; what the trace reads of it later is the value written
        # (UserFunctionVariable.getattr)
        tx.side_effects.store_attr(obj.fn, obj, name, value)
        return
    raise Unsupported(f"setting attribute {name!r} on {obj.describe()}", kind="unsupported")


def _function_text_attribute(name: str, value: Variable) -> bool:
    """`fn.__name__ = "text"` (functools.update_wrapper copying them): a function's text attributes
    set to a value its setter takes (a str; None too for __doc__ and __module__), replayed as eager's
    setattr; other FunctionType attributes (__code__, __defaults__, ...) change what a call does."""
    if name not in ("__name__", "__qualname__", "__doc__", "__module__") or not value.is_constant():
        return False
    text = value.as_constant()
    return type(text) is str or text is None and name in ("__doc__", "__module__")


def _set_data(tx: "Tracer", obj: TensorVariable, value: Variable) -> None:
    """`t.data = v` on a tensor from outside the frame (a parameter): `t.set_(v)` in the graph under
    no_grad, as torch.compile records it. t keeps its identity and requires_grad and takes v's
    storage, sizes and strides, as eager's shallow copy does. A tensor made in the frame, or a value
    of another dtype or device, is a graph break (torch.compile's too) and the store runs natively."""
    if obj.source is None:
        raise Unsupported("setting .data of a tensor made inside the compiled region", kind="unsupported")
    if not isinstance(value, TensorVariable) or value.example.dtype != obj.example.dtype \
            or value.example.device != obj.example.device or value.example.layout != obj.example.layout:
        raise Unsupported(f"setting .data of {obj.describe()} to a value of another kind, dtype or device",
                          kind="unsupported")
    if value.example is not obj.example and tx.state.output.shares_input_storage(value.example):
        # `w.data = v` (or a view of v) for another input v: eager's w shares v's storage from then
        # on, which a graph (that sees w's new value as a copy) does not give back: the store runs natively
        raise Unsupported(f"setting .data of {obj.describe()} to (a view of) another graph input", kind="unsupported")
    if value.example is obj.example:
        # `t.data = t.to(its own dtype)` (nn.Module.to/_apply on a parameter already so): `to`
        # returned t itself, and eager's shallow copy of a tensor onto itself changes nothing
        return
    if obj.example.requires_grad and not set(obj.node.users) <= _ancestors(value.node):
        # its earlier reads record autograd through t, and the functional graph of AOT autograd would
        # send their gradients nowhere (later reads are of the new value): the store runs natively
        raise Unsupported(f"setting .data of {obj.describe()}, which the graph already read", kind="unsupported")
    grad = tx.state.grad_enabled
    set_grad_mode(tx, False)
    try:
        # only v's data: what later reads of t compute has no autograd path into v
        tx.call_op("call_method", "set_", [obj, tx.call_op("call_method", "detach", [value], {})], {})
    finally:
        set_grad_mode(tx, grad)


def _ancestors(node: torch.fx.Node) -> set[torch.fx.Node]:
    """The nodes `node` is computed from (`p.data = p.clamp(0)` reads p only to make the new data)."""
    seen: set[torch.fx.Node] = set()
    todo = [node]
    while todo:
        for arg in todo.pop().all_input_nodes:
            if arg not in seen:
                seen.add(arg)
                todo.append(arg)
    return seen

