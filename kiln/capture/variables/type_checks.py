"""The builtins that ask about types during capture: `isinstance`, `issubclass` and `type(obj)`.

Each answers at trace time from the tracked value's Python type (a tensor is a torch.Tensor, never
a FakeTensor), so no node is recorded. What can change the answer later is guarded: abc's registry
(its cache token), and a user object's class read through `type(obj)` keeps a source so that what
is read from it is guarded where it is read. A metaclass's own `__instancecheck__` is inlined.
The rules register into trace_rules' builtin table, beside builtin.py's.
Corresponds to the isinstance/type parts of torch/_dynamo/variables/builtin.py.
"""
from __future__ import annotations

import abc
import inspect
import types
import typing
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture.guards import Guard
from kiln.capture.sources import ModuleFunctionCallSource, TypeSource
from kiln.capture.trace_rules import builtin_rule
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.exception import RaisedInTrace
from kiln.capture.variables.functions import UserFunctionVariable
from kiln.capture.variables.protocol_check import is_data_protocol, protocol_instancecheck
from kiln.capture.variables.sequence import TupleVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.capture.variables.user_object import NewObjectVariable, ObjectVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer


@builtin_rule(isinstance)
def isinstance_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    obj, classes = args
    cls = _class_value(classes)
    _guard_abc_registry(tx, cls)
    # A metaclass's own __instancecheck__ (duck typing on the object, not its type) decides for
    # its classes: inlined, as isinstance calls it.
    flat = cls if isinstance(cls, tuple) else (cls,)
    class_vars = classes.items if isinstance(classes, TupleVariable) else [classes]
    if any(_instancecheck_hook(c) is not None for c in flat):
        if any(isinstance(c, tuple) for c in flat):
            raise Unsupported("isinstance with nested tuples of classes with a custom __instancecheck__",
                              kind="unsupported_builtin")
        for var in class_vars:
            hook = _instancecheck_hook(var.as_python_value())
            if hook is None:
                answer = _is_subclass(obj.python_type(), var.as_python_value()) \
                    or _tensor_flag(tx, obj, var.as_python_value())
            else:
                answer = UserFunctionVariable(hook).call(tx, [var, obj], {}).truth(tx)
            if answer:
                return ConstantVariable(True)
        return ConstantVariable(False)
    if is_data_protocol(cls):
        return ConstantVariable(protocol_instancecheck(tx, obj, cls))
    kind = obj.python_type()
    if isinstance(cls, tuple):
        result = any(_is_subclass(kind, c) or _tensor_flag(tx, obj, c) for c in cls)
    else:
        result = _is_subclass(kind, cls) or _tensor_flag(tx, obj, cls)
    return ConstantVariable(result)


# torch's own metaclasses of Parameter and Buffer answer isinstance from a flag on the tensor too:
# `nn.Buffer(t)` is a plain tensor marked `_is_buffer`, which isinstance(t, nn.Buffer) reads.
_TENSOR_FLAGS: dict[type, str] = {torch.nn.Parameter: "_is_param", torch.nn.Buffer: "_is_buffer"}


def _tensor_flag(tx: "Tracer", obj: Variable, cls: Any) -> bool:
    """`getattr(obj, flag, False)` for the flag `cls`'s metaclass reads (Parameter's, Buffer's),
    read as the program would read it (guarded on an input's instance dict); False for other classes."""
    flag = _TENSOR_FLAGS.get(cls) if isinstance(cls, type) else None
    if flag is None or not isinstance(obj, TensorVariable):
        return False
    if obj.real() is None and tx.side_effects.pending_attr(obj.example, flag) is None:
        return False  # a tensor the frame computed, never marked
    try:
        value = obj.getattr(tx, flag)
    except RaisedInTrace as raised:
        if issubclass(raised.exception.exc_type, AttributeError):
            return False
        raise
    return value.truth(tx)


def _instancecheck_hook(cls: Any) -> types.FunctionType | None:
    """The Python __instancecheck__ of `cls`'s metaclass, unless it is one whose answer follows
    from the object's type (ABCMeta's registry, typing's protocols, torch's Parameter, whose
    tensors' types capture models): None for those and for `type`."""
    hook = inspect.getattr_static(type(cls), "__instancecheck__", None)
    if not isinstance(hook, types.FunctionType) or hook in _TYPE_BASED_INSTANCECHECKS:
        return None
    if (hook.__module__ or "").split(".")[0] == "torch":
        return None
    return hook


_TYPE_BASED_INSTANCECHECKS = tuple(
    hook for hook in (inspect.getattr_static(abc.ABCMeta, "__instancecheck__", None),
                      inspect.getattr_static(type(typing.Protocol), "__instancecheck__", None))
    if isinstance(hook, types.FunctionType))


def _guard_abc_registry(tx: "Tracer", cls: Any) -> None:
    """isinstance/issubclass against an abstract base class answers from its registry, which
    `register()` changes at any time: abc's cache token (bumped by every register) is guarded."""
    classes = cls if isinstance(cls, tuple) else (cls,)
    if any(isinstance(c, abc.ABCMeta) for c in classes):
        token = ModuleFunctionCallSource("abc", "get_cache_token")
        tx.state.output.guards.append(Guard(token.name(), "check_value", abc.get_cache_token()))


def settle_abc_token(guards: list[Guard]) -> list[Guard]:
    """The abc cache token guards expect the token as the capture leaves it: Kiln's own lazy
    imports during a capture (sympy's, which registers its numbers with the `numbers` ABCs) bump
    it after the trace read an isinstance answer, and the fresh capture's guards then failed on
    its own inputs (an internal error, the frame run eagerly)."""
    name = ModuleFunctionCallSource("abc", "get_cache_token").name()
    now = abc.get_cache_token()
    return [Guard(name, "check_value", now) if g.source == name and g.kind == "check_value" else g for g in guards]


def _class_value(var: Variable) -> Any:
    """The class (or tuple of classes) a Variable stands for, e.g. `(list, tuple)`."""
    if isinstance(var, TupleVariable):
        return tuple(_class_value(item) for item in var.items)
    return var.as_python_value()


def _is_subclass(kind: type, cls: Any) -> bool:
    # A tensor variable's type is torch.Tensor (or Parameter): isinstance(t, nn.Parameter) must match
    # what eager sees, and a FakeTensor is never what the user asks about.
    try:
        return issubclass(kind, cls)
    except TypeError as exc:
        raise Unsupported(f"isinstance with {cls!r}", kind="unsupported_builtin") from exc


@builtin_rule(issubclass)
def issubclass_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    _guard_abc_registry(tx, _class_value(args[1]))
    try:
        return ConstantVariable(issubclass(args[0].as_python_value(), _class_value(args[1])))
    except TypeError as error:  # not a class: eager's TypeError, where the program can catch it
        from kiln.capture.variables.exception import raise_in_trace
        raise raise_in_trace(error, f"TypeError: {error} (raised natively)") from None


@builtin_rule(type)
def type_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    if len(args) != 1:
        raise Unsupported("type() with three arguments", kind="unsupported_call")
    obj = args[0]
    kind = obj.python_type()
    # The class of a user object keeps a source, so that what is read from it (`type(self).CACHE`)
    # is guarded where it is read, contents included, as `self.CACHE` would be.
    if isinstance(obj, ObjectVariable) and obj.source is not None and not isinstance(obj.value, type):
        return tx.wrap(kind, TypeSource(obj.source))
    if isinstance(obj, NewObjectVariable) and obj.cls_source is not None:
        return tx.wrap(kind, obj.cls_source)
    if obj.source is not None and isinstance(kind, type) and issubclass(kind, torch.nn.Module):
        return tx.wrap(kind, TypeSource(obj.source))  # a module's class likewise (`type(self).count += 1`)
    return tx.wrap_result(kind)
