"""`copy.deepcopy` and `copy.copy` of tracked values, answered structurally instead of inlining the
copy module (whose memo is a dict keyed by id() numbers that are only known when the program runs).

The rules follow the copy module's dispatch: atomic values (constants, symbolic numbers, functions,
classes) are themselves; lists, dicts (plain, OrderedDict, defaultdict), sets and tuples are rebuilt
from copies of their items; an instance whose class reduces it in object's default way (no
`__reduce_ex__`, `__reduce__`, `__getstate__`, `__setstate__` or `__slots__` of its own) becomes a
new object of its class whose `__dict__` holds copies of the original's attributes (dataclasses and
plain config objects), a namedtuple a new one of copied fields; a class's own `__deepcopy__` or
`__copy__` is inlined. A tensor that needs no grad and is laid out densely from offset 0 is cloned
in the graph (eager copies its storage: same values, sizes and strides). The memo is kept per call
(keyed by the object each value is at trace time), so a value reached twice is copied once; the
memo a class's `__deepcopy__` receives is a MemoVariable that it may pass on, read and fill by id().
Anything else is a clean break (the call runs natively): tensors that need grad (eager makes new
leaves, or raises for a non-leaf), tensors that share storage (their copies would share one new
storage), nn.Modules, a caller's own memo dict, classes that pickle themselves.
Dynamo inlines the copy module (torch/_dynamo/polyfills) and breaks on any tensor's __deepcopy__.
"""
from __future__ import annotations

import collections
import copy
import copyreg
import inspect
import types
from typing import TYPE_CHECKING, Any, Sequence

import torch

from kiln.capture.trace_rules import builtin_rule, constructible, python_new
from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

_ATOMIC_TYPES = (type(None), int, float, bool, complex, bytes, str, types.CodeType, type, range,
                 types.BuiltinFunctionType, types.FunctionType, type(Ellipsis), type(NotImplemented),
                 property, torch.dtype, torch.device, torch.layout, torch.memory_format)
_DICT_TYPES = (dict, collections.OrderedDict, collections.defaultdict)
# class attributes whose presence means the class copies or pickles itself its own way
_OWN_PROTOCOL = ("__reduce_ex__", "__reduce__", "__getstate__", "__setstate__", "__getnewargs_ex__",
                 "__getnewargs__")
_OBJECT_DEFAULTS = {name: inspect.getattr_static(object, name, None) for name in _OWN_PROTOCOL}


def _refuse(what: str) -> Unsupported:
    return Unsupported(f"copy of {what}", kind="unsupported_call")


def _identity_of(var: Variable) -> Any:
    """The object `var` is at trace time (its Variable where it has no other identity)."""
    from kiln.capture.variables.object_id import ObjectIdVariable

    if isinstance(var, ObjectIdVariable):
        return _identity_of(var.target)
    found = var.identity()
    return var if found is None else found


class MemoVariable(Variable):
    """The memo of one traced deepcopy: copies by the id of what they copy (kept alive here)."""

    def __init__(self) -> None:
        self.copies: dict[int, tuple[Any, Variable]] = {}

    def describe(self) -> str:
        return "deepcopy memo"

    def python_type(self) -> type:
        return dict

    def identity(self) -> Any:
        return self

    def lookup(self, original: Variable) -> Variable | None:
        held = self.copies.get(id(_identity_of(original)))
        return None if held is None else held[1]

    def remember(self, original: Variable, made: Variable) -> None:
        ident = _identity_of(original)
        self.copies[id(ident)] = (ident, made)

    def _number(self, key: Variable) -> int:
        """The id() number a key stands for: an id() taken in the trace, or a known number."""
        from kiln.capture.variables.object_id import ObjectIdVariable

        if isinstance(key, ObjectIdVariable):
            return id(_identity_of(key.target))
        if key.is_constant() and type(key.as_constant()) is int:
            return int(key.as_constant())
        raise Unsupported(f"deepcopy memo keyed by {key.describe()}", kind="unsupported")

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name in ("get", "__getitem__", "__setitem__", "__contains__"):
            return BoundMethodVariable(self, name)
        raise Unsupported(f"{name!r} of a deepcopy memo", kind="unsupported_attribute")

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        if kwargs or not args:
            raise Unsupported(f"{name} of a deepcopy memo with these arguments", kind="unsupported")
        number = self._number(args[0])
        held = self.copies.get(number)
        if name == "__setitem__" and len(args) == 2:
            from kiln.capture.variables.object_id import ObjectIdVariable
            key = args[0]
            ident = _identity_of(key.target) if isinstance(key, ObjectIdVariable) else None
            self.copies[number] = (ident, args[1])
            return ConstantVariable(None)
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(held is not None)
        if name == "get" and len(args) in (1, 2):
            return held[1] if held is not None else (args[1] if len(args) == 2 else ConstantVariable(None))
        if name == "__getitem__" and len(args) == 1 and held is not None:
            return held[1]
        raise Unsupported(f"{name} of a deepcopy memo", kind="unsupported")


def _guard_absent(tx: "Tracer", cls: type, names: Sequence[str], receiver: Variable) -> None:
    from kiln.capture.guards import ABSENT
    from kiln.capture.variables.functions import guard_class_attribute

    for name in names:
        static = inspect.getattr_static(cls, name, ABSENT)
        guard_class_attribute(tx, cls, name, static, receiver if getattr(receiver, "source", None) else None)


def _class_hook(tx: "Tracer", var: Variable, cls: type, name: str) -> Any:
    """The class's own Python `__deepcopy__` / `__copy__` (guarded either way), or None."""
    from kiln.capture.guards import ABSENT

    static = inspect.getattr_static(cls, name, ABSENT)
    _guard_absent(tx, cls, [name], var)
    if static is ABSENT:
        return None
    if not isinstance(static, types.FunctionType):
        raise _refuse(f"a {cls.__qualname__} (its {name} is not a Python function)")
    return static


def _plain_instance(tx: "Tracer", var: Variable, cls: type) -> None:
    """Refuse unless `cls` reduces its instances in object's default way (guarded)."""
    for name in _OWN_PROTOCOL:
        if inspect.getattr_static(cls, name, None) is not _OBJECT_DEFAULTS[name]:
            raise _refuse(f"a {cls.__qualname__} (its class defines {name})")
    if cls in copyreg.dispatch_table or any(base.__dict__.get("__slots__") for base in cls.__mro__):
        raise _refuse(f"a {cls.__qualname__} (registered with copyreg, or with __slots__)")
    if python_new(cls) is not None or not constructible(cls, own_new=True):
        raise _refuse(f"a {cls.__qualname__} (a class capture does not build)")
    _guard_absent(tx, cls, _OWN_PROTOCOL, var)


def _instance_attrs(tx: "Tracer", var: Variable) -> list[tuple[str, Variable]]:
    from kiln.capture.variables.dict import DictVariable
    from kiln.capture.variables.user_object import NewObjectVariable

    if isinstance(var, NewObjectVariable):
        return list(var.attrs.items())
    held = tx.getattr(var, "__dict__")
    if not isinstance(held, DictVariable) or not all(isinstance(k, str) for k in held.items):
        raise _refuse(f"the __dict__ of {var.describe()}")
    return list(held.items.items())


def _new_instance(tx: "Tracer", var: Variable, cls: type) -> Variable:
    from kiln.capture.sources import TypeSource
    from kiln.capture.variables.user_object import NewObjectVariable

    cls_source = getattr(var, "cls_source", None)
    if cls_source is None and var.source is not None:
        cls_source = TypeSource(var.source)
    return NewObjectVariable(cls, cls_source)


def _user_instance(var: Variable) -> type | None:
    from kiln.capture.variables.user_object import NewObjectVariable, ObjectVariable

    if isinstance(var, NewObjectVariable):
        return var.cls
    if isinstance(var, ObjectVariable) and not isinstance(var.value, (type, types.ModuleType)) \
            and not isinstance(var.value, (torch.nn.Module, torch.Tensor)) and not var.is_constant():
        return type(var.value)
    return None


def _atomic(var: Variable) -> bool:
    from kiln.capture.variables.functions import UserFunctionVariable
    from kiln.capture.variables.symint import SymIntVariable
    from kiln.capture.variables.user_object import ObjectVariable

    if isinstance(var, (SymIntVariable, UserFunctionVariable)):
        return True
    if isinstance(var, ConstantVariable):
        return isinstance(var.as_constant(), _ATOMIC_TYPES) or var.is_constant() and _frozen(var.as_constant())
    if isinstance(var, ObjectVariable):
        return isinstance(var.value, _ATOMIC_TYPES) or var.is_constant() and hasattr(type(var.value), "__deepcopy__")
    try:
        return type(var.as_python_value()) in (types.BuiltinFunctionType, types.FunctionType, type)
    except Unsupported:
        return False


def _frozen(value: Any) -> bool:
    if isinstance(value, (tuple, frozenset)):
        return all(_frozen(v) for v in value)
    return isinstance(value, _ATOMIC_TYPES)


# ---- deepcopy ------------------------------------------------------------------------------------

def deepcopy_value(tx: "Tracer", var: Variable, memo: MemoVariable) -> Variable:
    """`copy.deepcopy(var, memo)` of one tracked value (see the module docstring)."""
    from kiln.capture.variables.dict import DictVariable, constant_keys
    from kiln.capture.variables.functions import UserMethodVariable
    from kiln.capture.variables.sequence import ListVariable, TupleVariable
    from kiln.capture.variables.sets import SetVariable
    from kiln.capture.variables.tensor import TensorVariable

    if _atomic(var):
        return var
    found = memo.lookup(var)
    if found is not None:
        return found
    made: Variable
    if isinstance(var, TensorVariable):
        made = _deepcopy_tensor(tx, var, memo)
    elif type(var) is ListVariable:
        made = ListVariable([])
        memo.remember(var, made)
        made.items.extend(deepcopy_value(tx, item, memo) for item in var.items)
    elif isinstance(var, TupleVariable) and var.python_type() is tuple:
        items = [deepcopy_value(tx, item, memo) for item in var.items]
        found = memo.lookup(var)  # a tuple reached again from inside itself (through a list)
        if found is not None:
            return found
        made = var if all(a is b for a, b in zip(items, var.items)) else TupleVariable(items)
    elif isinstance(var, TupleVariable) and (var.python_type() is torch.Size or _plain_namedtuple(var.python_type())):
        made = TupleVariable([deepcopy_value(tx, item, memo) for item in var.items], var.python_type())
    elif type(var) is DictVariable and var.dict_type in _DICT_TYPES and not var.attrs and var.real is None:
        if not constant_keys(var.items):
            raise _refuse(f"{var.describe()} (keys that are not constants)")
        factory = var.default_factory
        if factory is not None:
            factory = deepcopy_value(tx, factory, memo)
        made = DictVariable({}, var.dict_type, default_factory=factory)
        memo.remember(var, made)
        assert isinstance(made, DictVariable)
        for key, value in list(var.items.items()):
            made.items[key] = deepcopy_value(tx, value, memo)
    elif type(var) is SetVariable and var.python_type() in (set, frozenset) and all(_atomic(v) for v in var.items.values()):
        from kiln.capture.variables.builtin import RULES
        made = RULES[var.python_type()](tx, [ListVariable(list(var.items.values()))], {})
    else:
        cls = _user_instance(var)
        if cls is None:
            raise _refuse(var.describe())
        hook = _class_hook(tx, var, cls, "__deepcopy__")
        if hook is not None:
            made = UserMethodVariable(hook, var).call(tx, [memo], {})
        else:
            _plain_instance(tx, var, cls)
            made = _new_instance(tx, var, cls)
            memo.remember(var, made)
            for name, value in _instance_attrs(tx, var):
                made.attrs[name] = deepcopy_value(tx, value, memo)  # type: ignore[attr-defined]
    memo.remember(var, made)
    return made


def _plain_namedtuple(cls: type) -> bool:
    """A namedtuple class (or a subclass adding only methods) that copies as namedtuple does."""
    if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
        return False
    base = next(k for k in cls.__mro__ if "_fields" in k.__dict__)
    for name in ("__new__", "__getnewargs__", "__reduce_ex__", "__reduce__", "__deepcopy__", "__copy__"):
        owner = next((k for k in cls.__mro__ if name in k.__dict__), None)
        if owner not in (base, tuple, object, None):
            return False
    return all("__slots__" in k.__dict__ for k in cls.__mro__[:cls.__mro__.index(base) + 1])


def _deepcopy_tensor(tx: "Tracer", var: Variable, memo: MemoVariable) -> Variable:
    from kiln.capture.variables.tensor import TensorVariable

    assert isinstance(var, TensorVariable)
    fake = var.example
    if var.python_type() is not torch.Tensor or fake.requires_grad:
        raise _refuse(f"{var.describe()} (a parameter or a tensor that requires grad: eager makes a new leaf)")
    real = var.real()
    if real is not None and (real.grad is not None or getattr(real, "__dict__", None)):
        raise _refuse(f"{var.describe()} (its .grad or Python attributes are copied too)")
    if fake.is_sparse or fake.is_quantized or fake.is_conj() or fake.is_neg():
        raise _refuse(f"{var.describe()} (its layout)")
    dense = fake.storage_offset() == 0 and (
        fake.is_contiguous() or fake.is_contiguous(memory_format=torch.channels_last))
    if not dense:
        raise _refuse(f"{var.describe()} (a view at an offset or with gaps: eager copies its whole storage)")
    storage = _storage_key(fake)
    for ident, other in memo.copies.values():
        if isinstance(ident, torch.Tensor) and ident is not fake and _storage_key(ident) == storage:
            raise _refuse(f"{var.describe()} (shares storage with another tensor copied: eager's copies share too)")
    made = tx.call_op("call_method", "clone", [var], {})
    return made


def _storage_key(fake: torch.Tensor) -> Any:
    try:
        return fake.untyped_storage()._cdata
    except Exception as exc:  # noqa: BLE001  (a tensor without a storage)
        raise _refuse("a tensor without a storage") from exc


@builtin_rule(copy.deepcopy)
def deepcopy_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    if not args or len(args) > 3 or set(kwargs) - {"memo", "_nil"}:
        raise _refuse("these arguments")
    memo = kwargs.get("memo", args[1] if len(args) > 1 else None)
    if memo is None or memo.is_constant() and memo.as_constant() is None:
        memo = MemoVariable()
    if not isinstance(memo, MemoVariable):
        raise _refuse(f"{args[0].describe()} with a memo dict of the caller's")
    return deepcopy_value(tx, args[0], memo)


# ---- copy ----------------------------------------------------------------------------------------

@builtin_rule(copy.copy)
def copy_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    from kiln.capture.variables.dict import DictVariable
    from kiln.capture.variables.functions import UserMethodVariable
    from kiln.capture.variables.sequence import ListVariable, TupleVariable
    from kiln.capture.variables.sets import SetVariable

    if len(args) != 1 or kwargs:
        raise _refuse("these arguments")
    var = args[0]
    if _atomic(var):
        return var
    if isinstance(var, TupleVariable) and var.python_type() is tuple:
        return var
    if isinstance(var, TupleVariable) and (var.python_type() is torch.Size or _plain_namedtuple(var.python_type())):
        return TupleVariable(list(var.items), var.python_type())
    if type(var) is ListVariable:
        return ListVariable(list(var.items))
    if type(var) is DictVariable and var.dict_type in _DICT_TYPES and not var.attrs and var.real is None:
        return DictVariable(var.items, var.dict_type, default_factory=var.default_factory)
    if type(var) is SetVariable and var.python_type() in (set, frozenset):
        return var if var.python_type() is frozenset else var.call_method(tx, "copy", [], {})
    cls = _user_instance(var)
    if cls is None:
        raise _refuse(var.describe())
    hook = _class_hook(tx, var, cls, "__copy__")
    if hook is not None:
        return UserMethodVariable(hook, var).call(tx, [], {})
    _plain_instance(tx, var, cls)
    made = _new_instance(tx, var, cls)
    made.attrs.update(_instance_attrs(tx, var))  # type: ignore[attr-defined]
    return made
