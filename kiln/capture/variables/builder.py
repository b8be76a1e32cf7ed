"""Turning a real Python value read from the frame into a Variable, with the guards it needs.

`wrap_value` is the one place that decides what kind of tracked value an outside object becomes
(a tensor input, a constant, a container of tracked items, a module, a function, ...) and which
guard protects that decision: tensors by metadata, constants by value, containers by type and
length (or keys), modules, functions and classes by identity, other objects by type.
Corresponds to torch/_dynamo/variables/builder.py (VariableBuilder).
"""
from __future__ import annotations

import builtins
import collections
import enum
import functools
import inspect
import os
import sys
import types
import weakref
from typing import TYPE_CHECKING, Any, Callable, TypeGuard

import numpy as np
import torch

from kiln.capture.guards import FunctionCode, Guard
from kiln.capture.constant_fold import known_input
from kiln.capture.sources import (AttrSource, CallSource, DictKeySource, DictValueSource, GlobalSource, ItemSource,
                                  RawItemSource, Source, resume_stack_slot)
from kiln.capture.trace_rules import (
    has_builtin_rule,
    has_constant_result,
    in_stable_module,
    is_torch_function,
    never_traced,
    runs_natively,
)
from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.builtin import BuiltinVariable, UnboundMethodVariable, is_unbound_builtin_method
from kiln.capture.variables.checkpoint import CheckpointVariable, is_checkpoint_function
from kiln.capture.variables.class_dict import ClassDictVariable
from kiln.capture.variables.constant import ConstantVariable, ItemConstantVariable, is_constant_value
from kiln.capture.variables.context_manager import (
    AUTOCAST_CLASSES,
    ContextManagerClassVariable,
    HeldLockExitVariable,
    is_context_manager_class,
    is_held_lock_exit,
    wrap_autocast_instance,
)
from kiln.capture.variables.deque import DequeVariable
from kiln.capture.variables.dict import DictVariable, is_identity_key, wrappable_dict_subclass
from kiln.capture.variables.numpy_array import wrap_ndarray_input
from kiln.capture.variables.numpy_functions import NumpyFunctionVariable, is_numpy_function
from kiln.capture.variables.numpy_scalar_args import NumpyScalarVariable
from kiln.capture.variables import numpy_fft_grids  # noqa: F401  (fills NUMPY_FUNCTIONS with np.fft, np.meshgrid)
from kiln.capture.variables import lazy_itertools  # noqa: F401  (fills the rules of itertools.count, cycle, tee, islice)
from kiln.capture.variables import object_copy  # noqa: F401  (fills the rules of copy.deepcopy and copy.copy)
from kiln.capture.variables import stdlib_twins  # noqa: F401  (fills the rules of heapq's and bisect's C functions)
from kiln.capture.variables import type_checks  # noqa: F401  (fills the rules of isinstance, issubclass, type)
from kiln.capture.variables import number_builtins  # noqa: F401  (fills the rules of min, max, sum, int, str, ...)
from kiln.capture.variables import globals_dict  # noqa: F401  (fills the rule of globals())
from kiln.capture.variables import python_random  # noqa: F401  (fills the rule of random.Random(seed))
from kiln.capture.variables import frame_namedtuple  # noqa: F401  (fills the rule of collections.namedtuple)
from kiln.capture.variables.constant_calls import constant_element, constant_element_var  # and bytes(), struct.*
from kiln.capture.variables.model_output import ModelOutputVariable, is_model_output_class
from kiln.capture.variables.functions import (
    ConstantResultVariable,
    LruCacheVariable,
    UserFunctionVariable,
    UserMethodVariable,
    WeakRefVariable,
)
from kiln.capture.variables.grad_mode import GradModeVariable, WithExitVariable
from kiln.capture.variables.user_hashed_keys import HashedKey, hashes_in_python
from kiln.capture.variables.higher_order import HigherOrderFunctionVariable, is_higher_order_function
from kiln.capture.variables.func_grad import GradImplVariable, is_grad_impl
from kiln.capture.variables.func_jacobian import JacobianTransformVariable, is_jacobian_transform
from kiln.capture.variables.vmap import VmapImplVariable, is_vmap_impl
from kiln.capture.variables.iterator import (IteratorVariable, LiveListIterator, LiveListIteratorVariable,
                                             OutsideIteratorVariable, OutsideListIteratorVariable,
                                             PassedIteratorVariable)
from kiln.capture.variables.live_iterators import (EnumerateVariable, LiveDequeIterator, LiveDictIterator,
                                                   LiveEnumerate, LiveReversedIterator, LiveSetIterator, LiveZip,
                                                   PassedContainerIteratorVariable, PassedDequeIteratorVariable,
                                                   ZipVariable)
from kiln.capture.variables.module import NNModuleVariable
from kiln.capture.variables.pytree import PyTreeFunctionVariable, TreeSpecVariable, is_pytree_function, is_treespec
from kiln.capture.variables.sequence import ListVariable, TupleVariable, is_namedtuple_type, is_structseq_type
from kiln.capture.variables.sets import SetVariable, replayed_shadow_of
from kiln.capture.variables.tensor import TensorVariable
from kiln.capture.variables.torch import TorchFunctionVariable
from kiln.capture.variables.environ import GetenvVariable
from kiln.capture.variables.user_object import ObjectVariable
from kiln.errors import KilnError, Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import CaptureState

_ITERATOR_TYPES: tuple[type, ...] = (type(iter(())), type(iter([])), type(iter(range(0))))
_GRAD_MODE_TYPES = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)



# Objects wrapped by the rules of a module that registers them here (an optimizer,
# variables/optimizer.py): it imports this module's neighbours, so this module does not import it.
OBJECT_WRAPPERS: list[tuple[type, Callable[[Any, "Source | None"], Variable]]] = []

def _stable(source: Source | None) -> bool:
    """True when `source` reads an attribute of a stable module (trace_rules.STABLE_MODULES: no guard needed)."""
    while isinstance(source, AttrSource):
        source = source.base
    if isinstance(source, GlobalSource) and source.module is not None:
        return in_stable_module(source.module)
    return False


def wrap_value(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    """The Variable for `value` read from `source` (None: made at trace time, no guard)."""
    if isinstance(value, torch.Tensor):
        # One placeholder per source (their fakes are the same object, so aliasing is traced);
        # each source keeps its own tensor guard.
        key: Any = (id(value), None if source is None else source.name())
    else:
        key = id(value)
    cached = state.wrapped.get(key)
    if cached is not None and cached[0] is value and not is_constant_value(value):
        var = cached[1]
        if source is not None and var.source is not None and source != var.source:
            # The same mutable object reached through a second path is the same Variable (so
            # mutations are seen through both); the second path must lead to it next time too,
            # and the first must be it (a function guarded by its code is pinned to this object).
            if isinstance(var, _CONTAINERS + (NNModuleVariable,)):
                # any list passed twice: both paths lead to one, not to this one; a module the same
                # (a container kept on `self` and in a local across a break, a new one each call)
                _guard_aliasing(state, (var.source, source))
                return var
            if type(var) is ObjectVariable and getattr(var, "pin", None) is not None:
                # an instance guarded by type: any object reached by both paths will do
                _guard_aliasing(state, (var.source, source))
                return var
            _guard(state, source, "check_id", value)
            pin = getattr(var, "pin_identity", None)
            if pin is not None:  # a function guarded by its code, an instance guarded by type
                pin()
        return var
    var = _wrap(state, value, source)
    if not is_constant_value(value) and not isinstance(value, (tuple, frozenset)):
        state.wrapped[key] = (value, var)
    if source is not None and isinstance(var, _CONTAINERS + (TupleVariable,)) and var.source == source:
        # two containers from outside are told apart by their Variables (tuples by their real
        # objects): where the trace decides by identity, the guard keeps it so (`l is m`)
        if isinstance(var, TupleVariable):
            var.real = value
        var.guard_identity = functools.partial(_guard_identity, state, source)
    return var


def _guard_identity(state: "CaptureState", mine: Source, other: Source, same: bool) -> None:
    _guard_aliasing(state, (mine, other)) if same else _guard_aliasing(state, (mine,), (other,))


# Mutable containers from outside: one Variable per object, compared by which Variable it is.
_CONTAINERS = (ListVariable, DictVariable, SetVariable, DequeVariable)


def _guard_aliasing(state: "CaptureState", *groups: "tuple[Source, ...] | Source") -> None:
    """Guard which of the sources in `groups` are the same object (a group: the sources of one
    object; two groups: different objects). Names no object, so another pair of lists passes."""
    paths = tuple(tuple(s.name() for s in g) if isinstance(g, tuple) else (g.name(),) for g in groups)
    state.output.guards.append(Guard("", "check_aliasing", paths))


def _item(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    """An item of a list, tuple or dict from outside the frame: a constant is guarded by value
    only when the trace reads it (ItemConstantVariable); anything else is wrapped as usual."""
    if source is None or _stable(source) or not is_constant_value(value) \
            or type(value) in (int, float) and resume_stack_slot(source) \
            or type(value) is float and state.dynamic_float(value, source) \
            or type(value) is int and state.dynamic_int(value, source):
        # the items a glue passes a resume function may become symbolic (automatic dynamic), and
        # so does a number held in a dict or list once it changed (an optimizer's lr under a
        # scheduler, a config's int a script changes)
        return wrap_value(state, value, source)
    if value is None:
        return ItemConstantVariable(value, source, lambda: _guard(state, source, "check_none"))
    return ItemConstantVariable(value, source, lambda: _guard(state, source, "check_value", value))


def _guard(state: "CaptureState", source: Source | None, kind: str, expected: Any = None) -> None:
    if source is None or _stable(source):
        return
    state.output.guards.append(Guard(source.name(), kind, expected))


def _wrap(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    """The first row of _WRAP_RULES whose test holds makes the Variable (a row that returns None
    lets the later ones try); an object no row claims is wrapped by its type."""
    # The rows' tests ask the value for attributes (`__module__`, `__wrapped__`, ...); on an instance
    # of a class with its own __getattr__ a missing one runs it, and it may raise anything (a KeyError
    # from its table): that answers the test no, as hasattr answers no for AttributeError.
    quiet = isinstance(inspect.getattr_static(type(value), "__getattr__", None), types.FunctionType)
    for applies, wrap in _WRAP_RULES:
        try:
            holds = applies(state, value, source)
        except KilnError:
            raise
        except Exception:
            if not quiet:
                raise
            holds = False
        if holds:
            made = wrap(state, value, source)
            if made is not None:
                return made
    return _wrap_object(state, value, source)


_Test = Callable[["CaptureState", Any, "Source | None"], bool]
_Wrapper = Callable[["CaptureState", Any, "Source | None"], "Variable | None"]


def _given(source: Source | None) -> Source:
    """The source of a value whose row's test required one."""
    assert source is not None
    return source


def _by_identity(kind: Callable[[Any, Source | None], Variable]) -> _Wrapper:
    """A wrapper for a value fixed for the process (a function, a class): guarded by identity."""

    def wrap(state: "CaptureState", value: Any, source: Source | None) -> Variable:
        _guard(state, source, "check_id", value)
        return kind(value, source)

    return wrap


def _wrap_tensor(state: "CaptureState", value: torch.Tensor, source: Source | None) -> Variable:
    if source is None:
        raise Unsupported("a tensor created outside the traced code and not reachable from its inputs",
                          kind="unsupported")
    node, fake = state.output.tensor_input(value, source)
    var = TensorVariable(node, fake, source)
    var.real_ref = state.real_inputs
    var.real_key = state.real_inputs.add(value)
    state.output.input_tensors.setdefault(id(fake), var)
    known_input(value, var, source)
    return var


def _refuse_symbolic(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    raise Unsupported("a symbolic number from outside the frame", kind="unsupported")


def _wrap_constant(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    if value is None:
        _guard(state, source, "check_none")
    else:
        _guard(state, source, "check_value", value)
    return ConstantVariable(value, source)


def _wrap_numpy_scalar(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    """A numpy integer or float argument: symbolic where a graph op takes it as its number,
    guarded by value where anything else reads it (kiln/capture/variables/numpy_scalar_args.py)."""
    given = _given(source)
    return NumpyScalarVariable(value, given, lambda: _guard(state, given, "check_value", value),
                               lambda: state.symbolic_numpy_scalar(value, given))


def _wrap_module(state: "CaptureState", value: torch.nn.Module, source: Source | None) -> Variable:
    # By type, not by identity: another instance of the same class reuses the graph (its
    # parameters are inputs read through their sources, and each attribute the trace reads is
    # guarded where it is read; a name found on the class or in the module's tables is guarded
    # absent from the instance dict, NNModuleVariable.generic_getattr).
    _guard(state, source, "check_type", type(value))
    if source is not None:
        state.module_sources.add(source.name())
    return NNModuleVariable(value, source, pin=None if source is None else
                            lambda: _guard(state, source, "check_id", value))


def _is_tuple_like(value: Any) -> bool:
    return isinstance(value, tuple) and (type(value) in (tuple, torch.Size) or is_namedtuple_type(type(value))
                                         or is_structseq_type(type(value)))


def _wrap_tuple(state: "CaptureState", value: tuple, source: Source | None) -> Variable:
    _guard(state, source, "check_type", type(value))
    _guard(state, source, "check_len", len(value))
    items = [_item(state, v, None if source is None else ItemSource(source, i)) for i, v in enumerate(value)]
    return TupleVariable(items, type(value), source)


def _wrap_deque(state: "CaptureState", value: collections.deque, source: Source | None) -> Variable:
    _guard(state, source, "check_type", collections.deque)
    _guard(state, source, "check_len", len(value))
    _guard(state, None if source is None else AttrSource(source, "maxlen"), "check_value", value.maxlen)
    items = [wrap_value(state, v, None if source is None else ItemSource(source, i)) for i, v in enumerate(value)]
    return DequeVariable(items, value.maxlen, source)


def _wrap_list(state: "CaptureState", value: list, source: Source | None) -> Variable:
    _guard(state, source, "check_type", list)
    _guard(state, source, "check_len", len(value))
    items = [_item(state, v, None if source is None else ItemSource(source, i)) for i, v in enumerate(value)]
    return ListVariable(items, source)


def _wrap_made_mapping(state: "CaptureState", value: types.MappingProxyType, source: Source | None) -> Variable:
    # A class's or a Signature's read-only mapping, made during the trace: a constant dict.
    return DictVariable({k: wrap_value(state, v, None) for k, v in value.items()})


def _wrap_class_dict(state: "CaptureState", value: types.MappingProxyType, source: Source | None) -> Variable:
    source = _given(source)
    _guard(state, source, "check_type", type(value))
    _guard(state, source, "check_keys", tuple(value.keys()))
    return ClassDictVariable(value, source)


def _wrap_dict(state: "CaptureState", value: dict, source: Source | None) -> Variable:
    _guard(state, source, "check_type", type(value))
    _guard(state, source, "check_keys", tuple(value.keys()))
    factory = None
    if type(value) is collections.defaultdict and value.default_factory is not None:
        factory = wrap_value(state, value.default_factory,
                             None if source is None else AttrSource(source, "default_factory"))
    elif type(value) is collections.defaultdict and source is not None:
        _guard(state, AttrSource(source, "default_factory"), "check_none")
    entries = {k: _item(state, v, _dict_value_source(source, k, i)) for i, (k, v) in enumerate(value.items())}
    return DictVariable(entries, type(value), source, default_factory=factory)


def _wrap_model_output(state: "CaptureState", value: Any, source: Source | None) -> Variable | None:
    source = _given(source)
    _guard(state, source, "check_type", type(value))
    _guard(state, source, "check_keys", tuple(value.keys()))
    return ModelOutputVariable.wrap(value, source, lambda v, s: wrap_value(state, v, s))


def _wrap_constant_set(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    _guard(state, source, "check_value", value)
    replayed = replayed_shadow_of(value)
    made = SetVariable([constant_element_var(v) for v in value], type(value), source,
                       shadow=set(value) if replayed is None else replayed)
    if replayed is not None:
        return made
    order = tuple(value)
    return made.made_foreign(lambda: _guard(state, source, "check_set_order", order))


def _wrap_autocast_exit(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    # The `__exit__` of a region a glue entered (a break inside an autocast block): its Python
    # code sets the process's autocast state, so it is called natively, never inlined.
    _guard(state, source, "check_type", type(value))
    return ObjectVariable(value, source)


def _wrap_held_lock_exit(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    # a fresh bound method each time `lock.__exit__` is read: guarded by type, not identity
    _guard(state, source, "check_type", type(value))
    _guard(state, None if source is None else AttrSource(source, "__self__"), "check_type", type(value.__self__))
    return HeldLockExitVariable(value, source)


def _is_grad_exit(value: Any) -> bool:
    return isinstance(value, types.MethodType) and isinstance(value.__self__, _GRAD_MODE_TYPES) \
        and value.__func__.__name__ == "__exit__"


def _wrap_tracked_method(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    # `x.add` or `items.append` left on the stack by a graph break: the method of a tracked value.
    source = _given(source)
    _guard(state, source, "check_type", type(value))
    _guard(state, AttrSource(source, "__name__"), "check_value", value.__name__)
    owner = wrap_value(state, value.__self__, AttrSource(source, "__self__"))
    return BoundMethodVariable(owner, value.__name__)


def _wrap_lru_cache(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    # As Dynamo does: the cache is stepped past and the function it wraps is traced (the cache
    # only saves recomputing). A wrapped function marked as having a constant result, as
    # transformers' import probes are, is called for real through its cache.
    _guard(state, source, "check_id", value)
    if has_constant_result(value.__wrapped__):
        return ConstantResultVariable(value, source)
    inner = wrap_value(state, value.__wrapped__, None if source is None else AttrSource(source, "__wrapped__"))
    return LruCacheVariable(value, inner, source)


def _wrap_function(state: "CaptureState", value: types.FunctionType, source: Source | None) -> Variable:
    if source is not None and not _stable(source) and _known_by_code(value):
        # A function made inside another one (a closure, a lambda, an inner def) is made anew
        # by each call of its maker: as torch.compile does, it is guarded by its code, globals
        # and defaults (and its own dict's names), its cells where the trace reads them. Its
        # identity is guarded only if the trace uses it (`is`, a dict key, a native call).
        kwdefaults = None if value.__kwdefaults__ is None else tuple(value.__kwdefaults__.items())
        _guard(state, source, "check_code", FunctionCode(value.__code__, value.__module__, value.__defaults__,
                                                          kwdefaults))
        _guard(state, AttrSource(source, "__dict__"), "check_keys", tuple(value.__dict__))
        return UserFunctionVariable(value, source, pin=lambda: _guard(state, source, "check_id", value))
    _guard(state, source, "check_id", value)
    return UserFunctionVariable(value, source)


def _wrap_partial(state: "CaptureState", value: functools.partial, source: Source | None) -> Variable:
    from kiln.capture.variables.functions import PartialVariable
    source = _given(source)
    _guard(state, source, "check_type", functools.partial)
    fn = wrap_value(state, value.func, AttrSource(source, "func"))
    args = wrap_value(state, value.args, AttrSource(source, "args"))
    kwargs = wrap_value(state, value.keywords, AttrSource(source, "keywords"))
    # a tuple wraps as a TupleVariable, a dict of str keys as a DictVariable (rows above)
    assert isinstance(args, TupleVariable) and isinstance(kwargs, DictVariable)
    return PartialVariable(fn, list(args.items), dict(kwargs.items), source, value)


def _wrap_method(state: "CaptureState", value: types.MethodType, source: Source | None) -> Variable:
    self_source = None if source is None else AttrSource(source, "__self__")
    obj = wrap_value(state, value.__self__, self_source)
    func = value.__func__
    func_source = None if source is None else AttrSource(source, "__func__")
    cached = None
    if _is_lru_cache_wrapper(func):  # a cached method: its function is traced (see _wrap_lru_cache)
        _guard(state, func_source, "check_id", func)
        cached = func
        func = func.__wrapped__
        func_source = None if func_source is None else AttrSource(func_source, "__wrapped__")
    if isinstance(func, types.FunctionType) and never_traced(func):
        return ObjectVariable(value, source)
    if isinstance(func, types.FunctionType):
        _guard(state, func_source, "check_id", func)
        method = UserMethodVariable(func, obj, source)
        return method if cached is None else LruCacheVariable(cached, method, source)
    raise Unsupported(f"bound method {func!r}", kind="unsupported_call")


def _wrap_weakref(state: "CaptureState", value: weakref.ref, source: Source | None) -> Variable:
    _guard(state, source, "check_type", weakref.ref)
    return WeakRefVariable(value, _given(source))


def _wrap_object(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    """Any other object: guarded by type, its attributes read on demand (or wrapped by a
    registered OBJECT_WRAPPERS rule)."""
    _guard(state, source, "check_type", type(value))
    for kind, make in OBJECT_WRAPPERS:
        if isinstance(value, kind):
            return make(value, source)
    return ObjectVariable(value, source, pin=lambda: _guard(state, source, "check_id", value))


# How a value from outside becomes a Variable, in the order the tests are tried: the first row
# whose test holds wraps it. Values first (tensors, numbers, constants), then containers, then the
# callables capture knows by name (trace_rules decides which are graph ops, which run natively,
# which are inlined), then classes, modules and plain objects.
_WRAP_RULES: list[tuple[_Test, _Wrapper]] = [
    (lambda state, v, s: isinstance(v, torch.Tensor), _wrap_tensor),
    (lambda state, v, s: isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)), _refuse_symbolic),
    (lambda state, v, s: type(v) is int and s is not None and state.dynamic_int(v, s),
     lambda state, v, s: state.symbolic_int(v, _given(s))),
    (lambda state, v, s: type(v) is float and s is not None and state.dynamic_float(v, s),
     lambda state, v, s: state.symbolic_float(v, _given(s))),
    (lambda state, v, s: isinstance(v, (np.integer, np.floating)) and s is not None
     and state.dynamic_numpy_scalar(v, s), _wrap_numpy_scalar),
    (lambda state, v, s: is_constant_value(v), _wrap_constant),
    (lambda state, v, s: isinstance(v, enum.Enum), _by_identity(ObjectVariable)),
    (lambda state, v, s: isinstance(v, torch.nn.Module), _wrap_module),
    # containers
    (lambda state, v, s: _is_tuple_like(v), _wrap_tuple),
    (lambda state, v, s: type(v) is collections.deque, _wrap_deque),
    (lambda state, v, s: type(v) is list, _wrap_list),
    (lambda state, v, s: type(v) is types.MappingProxyType and s is None and _constant_keys(v), _wrap_made_mapping),
    (lambda state, v, s: type(v) is types.MappingProxyType and s is not None and _constant_keys(v), _wrap_class_dict),
    (lambda state, v, s: type(v) in (dict, collections.OrderedDict, collections.defaultdict) and _constant_keys(v),
     _wrap_dict),
    (lambda state, v, s: type(v) in (dict, collections.OrderedDict) and s is not None
     and all(isinstance(k, torch.Tensor) or is_constant_value(k) or hashes_in_python(type(k))
             or isinstance(k, torch.nn.Module) and type(k).__hash__ is object.__hash__ for k in v),
     lambda state, v, s: _wrap_tensor_keyed_dict(state, v, _given(s))),
    (lambda state, v, s: isinstance(v, dict) and s is not None and wrappable_dict_subclass(type(v))
     and not is_model_output_class(type(v)) and _constant_keys(v),
     lambda state, v, s: _wrap_dict_subclass(state, v, _given(s))),
    (lambda state, v, s: s is not None and is_model_output_class(type(v)), _wrap_model_output),
    (lambda state, v, s: type(v) in (set, frozenset) and all(constant_element(i) for i in v), _wrap_constant_set),
    (lambda state, v, s: type(v) in (LiveListIterator, LiveReversedIterator, LiveDequeIterator) and s is not None,
     lambda state, v, s: _wrap_live_iterator(state, v, _given(s))),
    (lambda state, v, s: type(v) in (LiveEnumerate, LiveZip) and s is not None,
     lambda state, v, s: _wrap_live_composite(state, v, _given(s))),
    (lambda state, v, s: type(v) in (LiveDictIterator, LiveSetIterator) and s is not None,
     lambda state, v, s: _wrap_live_container_iterator(state, v, _given(s))),
    (lambda state, v, s: isinstance(v, _ITERATOR_TYPES), lambda state, v, s: _wrap_iterator(state, v, s)),
    (lambda state, v, s: isinstance(v, np.ndarray) and type(v) is np.ndarray and s is not None,
     lambda state, v, s: wrap_ndarray_input(state, v, _given(s))),
    # callables and managers capture knows by name
    (lambda state, v, s: is_numpy_function(v), _by_identity(NumpyFunctionVariable)),
    (lambda state, v, s: is_context_manager_class(v), _by_identity(ContextManagerClassVariable)),
    (lambda state, v, s: isinstance(v, AUTOCAST_CLASSES) and hasattr(v, "fast_dtype"),
     lambda state, v, s: wrap_autocast_instance(state, v, s)),
    (lambda state, v, s: isinstance(v, types.MethodType) and isinstance(v.__self__, AUTOCAST_CLASSES),
     _wrap_autocast_exit),
    (lambda state, v, s: is_held_lock_exit(v), _wrap_held_lock_exit),
    (lambda state, v, s: _is_grad_exit(v), lambda state, v, s: _wrap_grad_exit(state, v, s)),
    (lambda state, v, s: isinstance(v, types.BuiltinMethodType) and s is not None
     and isinstance(v.__self__, (torch.Tensor, list, dict, set)), _wrap_tracked_method),
    (lambda state, v, s: is_checkpoint_function(v), _by_identity(CheckpointVariable)),
    (lambda state, v, s: is_higher_order_function(v), _by_identity(HigherOrderFunctionVariable)),
    (lambda state, v, s: is_vmap_impl(v), _by_identity(VmapImplVariable)),
    (lambda state, v, s: is_grad_impl(v), _by_identity(GradImplVariable)),
    (lambda state, v, s: is_jacobian_transform(v), _by_identity(JacobianTransformVariable)),
    (lambda state, v, s: is_pytree_function(v), _by_identity(PyTreeFunctionVariable)),
    (lambda state, v, s: is_treespec(v), _by_identity(TreeSpecVariable)),
    (lambda state, v, s: is_torch_function(v), _by_identity(TorchFunctionVariable)),
    # a stdlib function (never traced) that reads os.environ
    (lambda state, v, s: v is os.getenv, lambda state, v, s: GetenvVariable(s)),
    (lambda state, v, s: _is_lru_cache_wrapper(v), _wrap_lru_cache),
    # Python functions: run natively (calling it is a graph break of its library's kind) or inlined
    (lambda state, v, s: isinstance(v, types.FunctionType) and runs_natively(v), _by_identity(ObjectVariable)),
    (lambda state, v, s: isinstance(v, types.FunctionType) and not has_builtin_rule(v), _wrap_function),
    (lambda state, v, s: type(v) is functools.partial and s is not None, _wrap_partial),
    (lambda state, v, s: isinstance(v, types.MethodType), _wrap_method),
    # builtins, classes, modules, cells
    (lambda state, v, s: has_builtin_rule(v), _by_identity(BuiltinVariable)),
    # a method of a builtin type: fixed for the process
    (lambda state, v, s: is_unbound_builtin_method(v), lambda state, v, s: UnboundMethodVariable(v, s)),
    (lambda state, v, s: isinstance(v, (types.BuiltinFunctionType, types.BuiltinMethodType))
     and getattr(v, "__self__", None) is builtins, _by_identity(BuiltinVariable)),
    (lambda state, v, s: isinstance(v, (type, types.ModuleType)), _by_identity(ObjectVariable)),
    # a cell from outside (an item of a closure tuple): its contents read and written through it
    (lambda state, v, s: isinstance(v, types.CellType),
     lambda state, v, s: state.real_cell(v, None if s is None else AttrSource(s, "cell_contents"))),
    (lambda state, v, s: type(v) is weakref.ref and s is not None, _wrap_weakref),
    (lambda state, v, s: callable(v) and not hasattr(v, "__dict__") or isinstance(v, types.BuiltinFunctionType),
     _by_identity(ObjectVariable)),
]


def _known_by_code(fn: types.FunctionType) -> bool:
    """A function local to another one (or a lambda), in its module's globals, with literal defaults: what
    check_code can recognise again in another function object made by the same code."""
    module = sys.modules.get(fn.__module__ or "")
    kwdefaults = tuple((fn.__kwdefaults__ or {}).items())
    return ("<locals>" in fn.__qualname__ or fn.__name__ == "<lambda>") and module is not None and fn.__globals__ is module.__dict__ \
        and _literal(fn.__defaults__) and _literal(kwdefaults)


def _literal(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_literal(v) for v in value)
    return type(value) in (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


def _is_lru_cache_wrapper(value: Any) -> TypeGuard[functools._lru_cache_wrapper[Any]]:
    return isinstance(value, functools._lru_cache_wrapper) and \
        isinstance(inspect.getattr_static(value, "__wrapped__", None), types.FunctionType)


def _constant_keys(d: Any) -> bool:
    # an Enum member keys a dict as a constant: fixed for its class, hashed by its name, equal only
    # to itself (a tracked member is a constant too, ObjectVariable.is_constant)
    return all(is_constant_value(k) or is_identity_key(k) or isinstance(k, enum.Enum)
               or (isinstance(k, tuple) and all(is_constant_value(i) or is_identity_key(i) for i in k)) for k in d)


def _wrap_tensor_keyed_dict(state: "CaptureState", value: dict, source: Source) -> Variable:
    """A dict from outside with tensor or module keys (hashed by identity): each key read by its
    position and guarded as a tensor input (the aliasing guard then pins which input it is) or a
    module pinned by identity, its value likewise."""
    from kiln.capture.variables.dict import key_of

    _guard(state, source, "check_type", type(value))
    _guard(state, source, "check_len", len(value))
    entries: dict[Any, Variable] = {}
    for index, (key, item) in enumerate(value.items()):
        key_var = wrap_value(state, key, DictKeySource(source, index))
        if hashes_in_python(type(key)):
            # a user object: the very object, and the hash the dict stored for it (its __hash__ as
            # the dict called it), so that lookups meet it as CPython's do (DictVariable._resolve)
            _guard(state, DictKeySource(source, index), "check_id", key)
            entries[HashedKey(key_var, key, hash(key))] = wrap_value(state, item, DictValueSource(source, index))
            continue
        entries[key_of(key_var)] = wrap_value(state, item, DictValueSource(source, index))
    return DictVariable(entries, type(value), source)


def _wrap_dict_subclass(state: "CaptureState", value: dict, source: Source) -> Variable:
    """An instance of a dict subclass from outside: its keys guarded as a dict's, its values read
    from the dict's own storage (the subclass's __getitem__ may compute something else), its
    instance attributes read on demand behind a guard on their names."""
    _guard(state, source, "check_type", type(value))
    _guard(state, source, "check_keys", tuple(value.keys()))
    _guard(state, AttrSource(source, "__dict__"), "check_keys", tuple(vars(value)))
    entries = {k: wrap_value(state, v, RawItemSource(source, k)) for k, v in dict.items(value)}
    factory = None
    if isinstance(value, collections.defaultdict) and value.default_factory is not None:
        factory = wrap_value(state, value.default_factory, AttrSource(source, "default_factory"))
    made = DictVariable(entries, type(value), source, default_factory=factory)
    made.real = value
    return made


def _dict_value_source(source: Source | None, key: Any, index: int) -> Source | None:
    if source is None:
        return None
    if is_identity_key(key) or isinstance(key, enum.Enum) or (
            isinstance(key, tuple) and any(is_identity_key(i) for i in key)):  # no literal names the key: read by position
        return DictValueSource(source, index)
    return ItemSource(source, key)


def _wrap_iterator(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    # A tuple/list/range iterator (what the glue passes after a break inside a loop): its
    # __reduce__ gives the sequence and how far it went.
    reduced = value.__reduce__()
    if source is None or len(reduced) < 3:
        if source is None:
            raise Unsupported("an iterator created outside the traced code", kind="unsupported_iter")
        _guard(state, CallSource(source, "__reduce__"), "check_len", len(reduced))
        return IteratorVariable([])
    reduce_source = CallSource(source, "__reduce__")
    _guard(state, source, "check_type", type(value))
    _guard(state, reduce_source, "check_len", len(reduced))
    _guard(state, ItemSource(reduce_source, 2), "check_value", reduced[2])
    seq_source = ItemSource(ItemSource(reduce_source, 1), 0)
    seq = reduced[1][0]
    # its steps are replayed on the real iterator after the graph (another holder sees it advanced)
    real: Source = source

    def record(var: Any) -> None:
        state.side_effects.advance_iterator(var, real)
    if type(seq) is tuple:
        _guard(state, seq_source, "check_type", tuple)
        passed = PassedIteratorVariable(
            seq, seq_source.name(), reduced[2],
            read=lambda k: wrap_value(state, seq[k], ItemSource(seq_source, k)),
            guard=lambda kind, n: _guard(state, seq_source, kind, n))
        passed.record, passed.origin, passed.real_type = record, source.name(), type(value)
        return passed
    wrapped = wrap_value(state, seq, seq_source)
    if isinstance(wrapped, ListVariable) and type(seq) is list:  # read by index as the trace changes it
        outside: Variable = OutsideListIteratorVariable(wrapped, reduced[2], record)
    else:
        outside = OutsideIteratorVariable(state.tracer_iterate(wrapped)[reduced[2]:], record)
    outside.origin = source.name()  # type: ignore[attr-defined]
    outside.real_type = type(value)  # type: ignore[attr-defined]
    return outside


def _wrap_live_iterator(state: "CaptureState", value: LiveListIterator, source: Source) -> Variable:
    # The list iterator a glue passes after a break in a loop over a list: guarded by type, not by
    # its index (items are read relative to it); its list is the Variable the trace reaches another
    # way (a local, an argument), looked up when needed so that its mutations are seen.
    _guard(state, source, "check_type", type(value))
    try:
        ahead = value.ahead
    except RuntimeError as error:  # a deque iterator whose deque changed: eager's raises from now on
        raise Unsupported("a deque iterator whose deque changed", kind="unsupported_iter") from error
    ahead_source = AttrSource(source, "ahead")
    seq = value.list
    made = PassedDequeIteratorVariable if type(value) is LiveDequeIterator else LiveListIteratorVariable

    def find_list() -> ListVariable | None:
        cached = state.wrapped.get(id(seq))
        if cached is None or cached[0] is not seq:
            return None
        var = wrap_value(state, seq, AttrSource(source, "list"))  # the same Variable, its identity guarded
        if not isinstance(var, (DequeVariable if made is PassedDequeIteratorVariable else ListVariable)):
            raise Unsupported("a list iterator over a list traced as something else", kind="unsupported_iter")
        return var  # type: ignore[return-value]

    return made(
        source.name(), value.pos, ahead,
        read=lambda k: wrap_value(state, ahead[k], ItemSource(ahead_source, k)),
        guard=lambda kind, n: _guard(state, ahead_source, kind, n),
        guard_pos=lambda: _guard(state, AttrSource(source, "pos"), "check_value", value.pos),
        find_list=find_list, length=len(seq), reverse=type(value) is LiveReversedIterator)


def _wrap_live_composite(state: "CaptureState", value: Any, source: Source) -> Variable:
    # The enumerate or zip a glue passes after a break: each iterator inside is wrapped as itself
    # (a list iterator over the same list at its index); an enumerate's count is a number the
    # glue passed, which becomes symbolic once it changes (a loop compiles once, not per position).
    _guard(state, source, "check_type", type(value))
    if type(value) is LiveEnumerate:
        inner = wrap_value(state, value.inner, AttrSource(source, "inner"))
        count = _item(state, value.count, AttrSource(source, "count"))
        if not isinstance(inner, IteratorVariable):
            raise Unsupported("an enumerate over something that is not an iterator", kind="unsupported_iter")
        return EnumerateVariable(inner, count)
    columns_source = AttrSource(source, "columns")
    _guard(state, columns_source, "check_len", len(value.columns))
    columns = [wrap_value(state, c, ItemSource(columns_source, i)) for i, c in enumerate(value.columns)]
    if not all(isinstance(c, IteratorVariable) for c in columns):
        raise Unsupported("a zip over something that is not an iterator", kind="unsupported_iter")
    return ZipVariable(columns)  # type: ignore[arg-type]


def _wrap_live_container_iterator(state: "CaptureState", value: Any, source: Source) -> Variable:
    # The dict or set iterator a glue passes after a break: what is left is read relative to its
    # position (its `ahead` fails to read, failing the guard, once eager's iterator would raise);
    # its container is the Variable the trace reaches another way, looked up when needed.
    from kiln.capture.variables.dict import key_of

    is_set = type(value) is LiveSetIterator
    try:
        ahead = value.ahead
    except RuntimeError as error:  # eager's iterator raises from now on (its dict changed size)
        raise Unsupported("a dict iterator whose dict changed size", kind="unsupported_iter") from error
    if is_set and len(value.set) != value.size:
        raise Unsupported("a set iterator whose set changed size", kind="unsupported_iter")
    _guard(state, source, "check_type", type(value))
    if is_set:
        state.output.guards.append(Guard(f"len({source.name()}.set) == {source.name()}.size", "check_shape",
                                         "a set iterator's set is the size it began with"))
    else:
        _guard(state, AttrSource(source, "kind"), "check_value", value.kind)
        _guard(state, AttrSource(source, "reverse"), "check_value", value.reverse)
    real = value.set if is_set else value.dict

    def find() -> Variable | None:
        cached = state.wrapped.get(id(real))
        if cached is None or cached[0] is not real:
            return None
        var = wrap_value(state, real, AttrSource(source, "set" if is_set else "dict"))  # the same Variable
        if not isinstance(var, (SetVariable, DictVariable)):
            raise Unsupported("a dict or set iterator over a container traced as something else",
                              kind="unsupported_iter")
        return var

    ahead_source = AttrSource(source, "ahead")
    entries = PassedIteratorVariable(
        ahead, ahead_source.name(), 0,
        read=lambda k: wrap_value(state, ahead[k], ItemSource(ahead_source, k)),
        guard=lambda kind, n: _guard(state, ahead_source, kind, n))
    return PassedContainerIteratorVariable("set" if is_set else value.kind, entries, source.name(), find,
                                           key_of, list(real), type(real) is collections.OrderedDict,
                                           reverse=not is_set and value.reverse)


def _wrap_grad_exit(state: "CaptureState", value: Any, source: Source | None) -> Variable:
    ctx = value.__self__
    self_source = None if source is None else AttrSource(source, "__self__")
    _guard(state, self_source, "check_type", type(ctx))
    _guard(state, None if self_source is None else AttrSource(self_source, "prev"), "check_value", bool(ctx.prev))
    kind = type(ctx)
    target = {torch.no_grad: False, torch.enable_grad: True}.get(kind, torch.is_grad_enabled())
    args = () if kind in (torch.no_grad, torch.enable_grad) else (target,)
    var = GradModeVariable(target, kind, args)
    var.prev = bool(ctx.prev)
    return WithExitVariable(var, source)


def wrap_result(value: Any) -> Variable:
    """A Variable for a value computed at trace time (no source, no guard)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        # a symbolic number has a value only in the graph (a SymIntVariable with its node); as a
        # trace-time object it would reach the glue as a constant of the traced call
        raise Unsupported(f"a symbolic {type(value).__name__} computed outside the graph", kind="unsupported")
    if is_constant_value(value):
        return ConstantVariable(value)
    if isinstance(value, tuple) and (type(value) in (tuple, torch.Size) or is_namedtuple_type(type(value))):
        return TupleVariable([wrap_result(v) for v in value], type(value))
    if type(value) is list:
        return ListVariable([wrap_result(v) for v in value])
    if type(value) is dict:
        return DictVariable({k: wrap_result(v) for k, v in value.items()})
    if type(value) in (set, frozenset):
        if all(is_constant_value(v) for v in value):
            return SetVariable([ConstantVariable(v) for v in value], type(value), shadow=set(value))
        return SetVariable([wrap_result(v) for v in value], type(value))
    if is_torch_function(value):
        return TorchFunctionVariable(value)
    if isinstance(value, types.FunctionType) and not has_builtin_rule(value):
        return UserFunctionVariable(value)
    if has_builtin_rule(value):
        return BuiltinVariable(value)
    if is_unbound_builtin_method(value):
        return UnboundMethodVariable(value)
    if isinstance(value, torch.nn.Module):
        return NNModuleVariable(value, None)
    if isinstance(value, torch.Tensor):
        raise Unsupported("a tensor computed at trace time", kind="unsupported")
    return ObjectVariable(value)

