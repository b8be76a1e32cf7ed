"""Python functions during capture: user functions and methods (inlined), closures made during the
trace, bound methods of tracked values, and closure cells.

Calling a user function inlines it: a child tracer runs its bytecode over the same graph. A function
marked `kiln.disable` is a graph break; one marked `kiln.allow_in_graph` becomes one call node, as
does a custom autograd.Function's `apply` (kiln/capture/variables/autograd_function.py); a
function already compiled with kiln.compile is inlined through its original. Corresponds to
torch/_dynamo/variables/functions.py.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import types
import weakref
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from kiln.capture.guards import ClassAttribute, ConstantCall, Guard, note_constant_result
from kiln.capture.trace_rules import ORIGINAL_ATTR, Marked, in_stable_module, marked_rule
from kiln.capture.sources import AttrSource, ClosureSource, ItemSource, Source, TypeSource, WeakRefCallSource
from kiln.capture.variables.base import BoundMethodVariable, Variable
from kiln.capture.variables.constant import ConstantVariable, is_constant_value
from kiln.capture.variables.dict import DictVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


class CellVariable(Variable):
    """A closure cell. Either made during the trace (`contents` tracked), or a real cell from outside
    (`real` set, read through `source` and written through the side-effect log)."""

    def __init__(self, contents: Variable | None = None, real: types.CellType | None = None,
                 source: Source | None = None) -> None:
        self.contents = contents
        self.real = real
        self.source = source
        self.loaded = real is None

    def describe(self) -> str:
        return "cell"

    def load(self, tx: "Tracer") -> Variable:
        if not self.loaded:
            assert self.real is not None  # only a cell made from a real one starts unloaded
            try:
                value = self.real.cell_contents
            except ValueError as exc:
                raise Unsupported("free variable referenced before assignment", kind="unsupported") from exc
            self.contents = tx.wrap(value, self.source)
            if self.source is None and isinstance(value, _MUTABLE_CONTAINERS):
                # a cell of a function reached without a source (a method of a class defined in
                # the frame's closure, found on an object built in the trace): the glue cannot
                # reach the container to replay a change, so changing it must not be traced
                tx.side_effects.unreachable(self.contents)
            self.loaded = True
        if self.contents is None:
            raise Unsupported("free variable referenced before assignment", kind="unsupported")
        return self.contents

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name == "cell_contents":  # an empty cell's ValueError: refused by load, raised by eager
            return self.load(tx)
        return super().getattr(tx, name)

    def store(self, tx: "Tracer", value: Variable) -> None:
        self.contents = value
        self.loaded = True
        if self.real is not None:
            tx.side_effects.store_cell(self, value)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.real is not None and self.source is not None:
            return self.source.name().rsplit(".cell_contents", 1)[0]
        inner = "" if self.contents is None else glue.reconstruct(self.contents)
        return f"{glue.constant(types.CellType)}({inner})"


_MUTABLE_CONTAINERS = (list, dict, set, bytearray, collections.deque)


def python_function(fn: object, what: str) -> types.FunctionType:
    """`fn` as a Python function the tracer can inline; anything else (a builtin, a partial, a
    property without a getter) is a graph break."""
    if not isinstance(fn, types.FunctionType):
        raise Unsupported(f"{what} that is not a Python function ({type(fn).__name__})", kind="unsupported_call")
    return fn


class UserFunctionVariable(Variable):
    """A Python function that exists outside the frame (a global, an attribute, a closure value).

    `pin`: for a function guarded by its code rather than its identity (builder), adds the
    identity guard once the trace relies on which object it is (`is`, a dict key, a native call)."""

    def __init__(self, fn: types.FunctionType, source: Source | None = None,
                 pin: Callable[[], None] | None = None) -> None:
        self.fn = fn
        self.source = source
        self.pin = pin

    def describe(self) -> str:
        return f"function {self.fn.__qualname__}"

    def truth(self, tx: "Tracer") -> bool:
        return True  # a function object is always true (FunctionType has no __bool__ or __len__)

    def python_type(self) -> type:
        return type(self.fn)

    def as_python_value(self) -> Any:
        self.pin_identity()
        return self.fn

    def pin_identity(self) -> None:
        if self.pin is not None:
            self.pin()
            self.pin = None

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name == "__get__":
            return FunctionGetVariable(self)  # a fresh method-wrapper each read: nothing to guard by identity
        written = tx.side_effects.pending_attr(self.fn, name)
        if written is not None:
            return written  # set earlier in the trace, stored after the graph
        deleted = tx.side_effects.deleted_attr(self.fn, name)
        if deleted or not hasattr(self.fn, name):
            if self.source is not None and inspect.getattr_static(types.FunctionType, name, None) is None:
                # missing from its __dict__ (guarded so): eager's AttributeError, which getattr's
                # default or hasattr answers in the trace
                from kiln.capture.variables.exception import raise_in_trace

                if not deleted:
                    tx.output.note_absent(AttrSource(self.source, "__dict__"), name)
                message = f"'function' object has no attribute {name!r}"
                raise raise_in_trace(AttributeError(message), f"{message} (raised natively)")
            raise Unsupported(f"function {self.fn.__qualname__} has no attribute {name!r}",
                              kind="unsupported_attribute")
        return tx.wrap(getattr(self.fn, name), None if self.source is None else AttrSource(self.source, name))

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return call_python_function(tx, self.fn, self.source, list(args), kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.pin is not None and self.source is not None:
            return self.source.name()  # the function this call was given, not the traced one
        return glue.constant(self.fn)


class FunctionGetVariable(Variable):
    """`fn.__get__`: the descriptor protocol spelt out (torch's lr schedulers wrap `optimizer.step`
    as `func.__get__(opt, type(opt))(...)`); calling it with an instance binds fn as a method."""

    def __init__(self, fn: UserFunctionVariable) -> None:
        self.fn = fn

    def describe(self) -> str:
        return f"__get__ of {self.fn.describe()}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        instance = args[0] if args else kwargs.get("instance")
        if instance is None or len(args) + len(kwargs) > 2 or \
                isinstance(instance, ConstantVariable) and instance.as_constant() is None:
            raise Unsupported(f"{self.describe()} without an instance", kind="unsupported_call")
        return UserMethodVariable(self.fn.fn, instance, self.fn.source)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.reconstruct(self.fn)}.__get__"


class WeakRefVariable(Variable):
    """A `weakref.ref` from outside the frame (a closure's `opt_ref`): calling it reads the object
    it refers to now, through `ref()` as its source, guarded as any value read from outside."""

    def __init__(self, ref: weakref.ReferenceType, source: Source) -> None:
        self.ref = ref
        self.source = source
        self.ref_source = source

    def describe(self) -> str:
        return "weak reference"

    def python_type(self) -> type:
        return type(self.ref)

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if args or kwargs:
            raise Unsupported("calling a weak reference with arguments (raised natively)", kind="unsupported_call")
        return tx.wrap(self.ref(), WeakRefCallSource(self.ref_source))


def _call_for_constant(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """A function marked as having a constant result (assume_constant_result): called for real now,
    with its arguments' trace-time values, and its result kept as a constant, as Dynamo does. The
    mark promises the answer holds for the process's lifetime (an install probe, a hardware
    capability), so nothing it read is guarded; the call itself is (check_constant_result: made again,
    once, by a process that reads the entry from disk)."""
    if not all(a.is_constant() for a in [*args, *kwargs.values()]):
        raise Unsupported(f"{fn.__qualname__} (marked as having a constant result) called with arguments "
                          "unknown at trace time", kind="unsupported_call")
    try:
        result = fn(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
    except Exception as exc:  # raised again where the call runs natively
        raise Unsupported(f"{fn.__qualname__} (marked as having a constant result) raised "
                          f"{type(exc).__name__}", kind="unsupported_call") from exc
    if not is_constant_value(result):
        raise Unsupported(f"{fn.__qualname__} (marked as having a constant result) returned a "
                          f"{type(result).__name__}, not a constant", kind="unsupported_call")
    # Constant within this process only: an entry another process reads from disk calls it again
    call = ConstantCall(fn, tuple(a.as_constant() for a in args),
                        tuple((k, v.as_constant()) for k, v in kwargs.items()), result)
    note_constant_result(call)
    tx.state.output.guards.append(Guard("", "check_constant_result", call))
    return ConstantVariable(result)


class ConstantResultVariable(Variable):
    """A callable whose calls are made for real while tracing (`_call_for_constant`): the lru_cache
    wrapper of a function marked as having a constant result, so that its cache is what eager's
    calls would find (the probe runs once per process, not once per trace)."""

    def __init__(self, fn: Any, source: Source | None = None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return f"function {getattr(self.fn, '__qualname__', '?')}"

    def python_type(self) -> type:
        return type(self.fn)

    def as_python_value(self) -> Any:
        return self.fn

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return _call_for_constant(tx, self.fn, list(args), kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return glue.constant(self.fn)


class LruCacheVariable(Variable):
    """A `functools.lru_cache` wrapper (`wrapper`) around Python code, called through `inner`
    (the wrapped function, or the method bound to its receiver). As Dynamo does, the cache is
    stepped past and the body traced, which is right only while the body is pure: eager runs it on
    a miss alone, so a body that writes anything outside the frame (appends to a list, sets a
    global, prints) is a graph break, and the call is made for real through the cache."""

    def __init__(self, wrapper: Any, inner: Variable, source: Source | None = None) -> None:
        self.wrapper = wrapper
        self.inner = inner
        self.source = source

    def describe(self) -> str:
        return f"lru_cache function {getattr(self.wrapper, '__qualname__', '?')}"

    def python_type(self) -> type:
        return type(self.wrapper)

    def as_python_value(self) -> Any:
        return self.wrapper

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name in ("cache_info", "cache_clear", "cache_parameters"):
            raise Unsupported(f"{name}() of an lru_cache function: the trace does not model its cache",
                              kind="unsupported_call")
        return self.inner.getattr(tx, name)

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        effects = tx.state.side_effects
        before = effects.writes
        effects.cached_bodies_open += 1
        try:
            result = self.inner.call(tx, args, kwargs)
        finally:
            effects.cached_bodies_open -= 1
        if effects.writes != before:
            raise Unsupported(f"{self.describe()} writes outside the frame; eager runs its body only "
                              f"on a cache miss, so the call is made for real", kind="unsupported_call")
        if effects.cached_bodies_open == 0 and not kwargs and all(_hashable_constant(a) for a in args):
            # eager's call fills the cache (its recursive calls too, on a miss): the outermost call
            # is made again through the cache after the graph; with arguments that are not
            # constants (a tensor) the cache keeps what the trace cannot make again cheaply
            effects.replay_cached_call(self, list(args))
        return result

    def reconstruct(self, glue: "GlueBuilder") -> str:
        # the wrapper, never the function under it: a call made for real goes through the cache
        if isinstance(self.inner, UserMethodVariable):
            return f"{glue.constant(types.MethodType)}({glue.constant(self.wrapper)}, {glue.reconstruct(self.inner.obj)})"
        return self.source.name() if self.source is not None else glue.constant(self.wrapper)


def _hashable_constant(value: Variable) -> bool:
    """A constant the cache can key on, or a symbolic number (the glue passes its value)."""
    from kiln.capture.variables.symint import SymIntVariable

    if isinstance(value, SymIntVariable):
        return True
    if not value.is_constant():
        return False
    try:
        hash(value.as_constant())
    except TypeError:
        return False
    return True


_GENERATOR_CM_PROTOCOL = (contextlib._GeneratorContextManager.__enter__, contextlib._GeneratorContextManager.__exit__)


def call_python_function(tx: "Tracer", fn: Any, source: Source | None, args: list[Variable],
                         kwargs: dict[str, Variable]) -> Variable:
    """Call a real Python function: honor the kiln markers, then inline its bytecode."""
    marked = marked_rule(fn)
    if marked is Marked.SKIP:
        raise Unsupported(f"{fn.__qualname__} is marked kiln.disable (or torch's disable)", kind="disabled")
    if marked is Marked.IN_GRAPH:
        return tx.call_op("call_function", fn, args, kwargs)
    if marked is Marked.COMPILED:
        original = getattr(fn, ORIGINAL_ATTR)
        return tx.wrap(original, None).call(tx, args, kwargs)
    if marked is Marked.CONSTANT_RESULT:
        return _call_for_constant(tx, fn, args, kwargs)
    if fn in _GENERATOR_CM_PROTOCOL and args and args[0].python_type() is contextlib._GeneratorContextManager:
        # `type(cm).__enter__(cm)` (ExitStack.enter_context, a bound __exit__ it calls later) on a
        # @contextmanager object the trace runs in halves: its own protocol, not contextlib's code
        bound = args[0].getattr(tx, fn.__name__)
        # a real object from outside gives back contextlib's own method: inlined below, as any
        # function (calling the bound method would come straight back here)
        if not (isinstance(bound, UserMethodVariable) and bound.fn is fn):
            return bound.call(tx, args[1:], kwargs)
    if fn is _FUNCTION_APPLY:
        from kiln.capture.variables.autograd_function import call_autograd_function
        if not args:
            raise Unsupported("Function.apply called without its class", kind="autograd_function")
        owner = args[0]
        return call_autograd_function(tx, owner.as_python_value(), args[1:], kwargs, getattr(owner, "source", None))
    closure = None
    if fn.__closure__:
        closure = [tx.state.real_cell(cell, ClosureSource(i, source) if source is not None else None)
                   for i, cell in enumerate(fn.__closure__)]
    defaults: tuple = fn.__defaults__ or ()
    kwdefaults: dict[str, Any] = fn.__kwdefaults__ or {}
    if source is not None:
        # a tensor held as a default (`def g(v, b=bias)`) is an input of the graph, read from the
        # function where it lives (a tensor reachable from nowhere could not be); a mutable one
        # (`def g(v, store=[])`) is the same object in every call: its contents are guarded and its
        # changes replayed there
        defaults = tuple(d if is_constant_value(d) else tx.wrap(d, ItemSource(AttrSource(source, "__defaults__"), i))
                         for i, d in enumerate(defaults))
        kwdefaults = {k: d if is_constant_value(d) else tx.wrap(d, ItemSource(AttrSource(source, "__kwdefaults__"), k))
                      for k, d in kwdefaults.items()}
    return tx.inline_call(fn.__code__, fn.__globals__, closure, defaults,
                          kwdefaults, args, kwargs, name=fn.__qualname__, fn=fn)


# apply is a classmethod; torch's stub types it as a plain function
_FUNCTION_APPLY = torch.autograd.Function.apply.__func__  # type: ignore[attr-defined]


def is_autograd_function_apply(value: Any) -> bool:
    return isinstance(value, types.MethodType) and value.__func__ is _FUNCTION_APPLY


class UserMethodVariable(Variable):
    """A Python function bound to a tracked `self` (a module, a user object)."""

    def __init__(self, fn: types.FunctionType, obj: Variable, source: Source | None = None) -> None:
        self.fn = fn
        self.obj = obj
        self.source = source

    def describe(self) -> str:
        return f"method {self.fn.__qualname__}"

    def truth(self, tx: "Tracer") -> bool:
        return True  # a function object is always true (FunctionType has no __bool__ or __len__)

    def python_type(self) -> type:
        return types.MethodType

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name == "__self__":
            return self.obj
        if name == "__func__":
            return UserFunctionVariable(self.fn)
        return UserFunctionVariable(self.fn).getattr(tx, name)

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        # the function's source (when it has one) gives its closure cells theirs: what the body reads
        # through a cell (a decorator's registry object) is guarded like any other read, and what
        # it writes there (a list a dunder or a descriptor's __set__ appends to) is replayed
        source = self.source
        if source is None and self.fn.__closure__:
            source = _method_source(self.obj, self.fn)
        return call_python_function(tx, self.fn, source, [self.obj, *args], kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.constant(types.MethodType)}({glue.constant(self.fn)}, {glue.reconstruct(self.obj)})"


def _method_source(receiver: Variable, fn: types.FunctionType) -> Source | None:
    """`type(receiver).<name>` where that lookup finds `fn` itself (a method, a dunder, a
    descriptor's __get__/__set__/__delete__ bound to the descriptor); None where it does not."""
    class_source = receiver_class_source(receiver)
    kind = receiver.python_type()
    if class_source is None or not isinstance(kind, type) or inspect.getattr_static(kind, fn.__name__, None) is not fn:
        return None
    return AttrSource(class_source, fn.__name__)


def accessor_source(receiver: Variable, owner: type, name: str, accessor: str) -> Source | None:
    """Where a property's fget/fset/fdel is read from: the class-dict entry of the property."""
    entry = class_dict_source(receiver_class_source(receiver), owner, name)
    return None if entry is None else AttrSource(entry, accessor)


def guard_class_attribute(tx: "Tracer", owner: type, name: str, static: Any, receiver: Variable | None = None,
                          class_source: Source | None = None, classes: tuple[type, ...] | None = None) -> None:
    """Guard that looking `name` up on `owner` still finds `static` (the raw class-dict entry the
    trace used: a method, property, staticmethod, classmethod or plain value).

    Read through the receiver's source when the receiver (an instance of `owner`) has one, else
    through the class's source, else (a class reached without a source, or the part of an MRO
    that `super()` searches, given as `classes`) by a check_class_attr guard that holds the classes.
    Reading through a source lets Python's own lookup decide where in the MRO the attribute is now
    found, so a value set later on a subclass or removed from a base is seen. Classes of torch and
    the standard library are left out: their attributes are fixed for the process."""
    if in_stable_module(owner.__module__):
        return
    guards = tx.state.output.guards
    receiver_source = getattr(receiver, "source", None) if receiver is not None and classes is None else None
    function = static.__func__ if isinstance(static, (staticmethod, classmethod)) else static
    if receiver_source is not None and isinstance(static, (types.FunctionType, staticmethod, classmethod, property)):
        # Through type(receiver): reading through the instance would run a Python __getattribute__.
        read = AttrSource(TypeSource(receiver_source), name)
        if isinstance(static, classmethod):
            read = AttrSource(read, "__func__")
        guards.append(Guard(read.name(), "check_id", function))
        return
    if class_source is not None and isinstance(static, (types.FunctionType, staticmethod, classmethod, property)):
        read = AttrSource(class_source, name)
        if isinstance(static, classmethod):
            read = AttrSource(read, "__func__")
        guards.append(Guard(read.name(), "check_id", function))
        return
    guards.append(Guard("", "check_class_attr", ClassAttribute(classes or owner.__mro__, name, static)))


def bind_class_attribute(tx: "Tracer", static: Any, receiver: Variable, owner: type,
                         name: str | None = None) -> Variable | None:
    """What reading a class attribute through an instance gives, following Python's descriptor
    rules for functions, properties, staticmethods and classmethods; None for any other kind.
    With `name`, the attribute is guarded (guard_class_attribute) when it is one of those kinds."""
    if name is not None and isinstance(static, (property, types.FunctionType, staticmethod, classmethod)):
        guard_class_attribute(tx, owner, name, static, receiver)
    if isinstance(static, property):
        return read_property(tx, static, receiver, name)
    if isinstance(static, types.FunctionType):
        receiver_source = getattr(receiver, "source", None)
        # the function as guard_class_attribute reads it (its identity is guarded there)
        fn_source = AttrSource(TypeSource(receiver_source), name) if name is not None and receiver_source else None
        return UserMethodVariable(static, receiver, fn_source)
    if isinstance(static, staticmethod):
        return tx.wrap(static.__func__, None)
    if isinstance(static, classmethod) and static.__func__ is _FUNCTION_APPLY:
        # `MyFunction.apply`: kept as the bound method; calling it records one graph node (see
        # kiln.capture.variables.autograd_function) or, if its code cannot be traced, breaks and
        # the glue calls it as it is (inlining apply would trace torch's dispatch internals).
        from kiln.capture.variables.user_object import ObjectVariable
        return ObjectVariable(static.__get__(None, owner))
    if isinstance(static, classmethod):
        return UserMethodVariable(python_function(static.__func__, "a classmethod"), tx.wrap(owner, None))
    if isinstance(static, functools._lru_cache_wrapper) and isinstance(getattr(static, "__wrapped__", None),
                                                                        types.FunctionType):
        # a method under @functools.lru_cache: as Dynamo does, the cache is stepped past
        if name is not None:
            guard_class_attribute(tx, owner, name, static, receiver)
        receiver_source = getattr(receiver, "source", None)
        # the wrapped function's source gives its closure cells theirs (a write through one is replayed)
        fn_source = AttrSource(AttrSource(TypeSource(receiver_source), name), "__wrapped__") \
            if name is not None and receiver_source else None
        method = UserMethodVariable(python_function(static.__wrapped__, "an lru_cache method"), receiver, fn_source)
        return LruCacheVariable(static, method)
    return None


def read_property(tx: "Tracer", prop: property, receiver: Variable, name: str | None) -> Variable:
    """`obj.name` for a property: a getter written in Python is inlined; one written in C is called
    as the builtin it is (`property(len)`), or, for an object from outside the frame (a pybind11
    attribute: its getter is a C function with no side effects), read for real and guarded as read."""
    fget = prop.fget
    if isinstance(fget, types.FunctionType):
        owner = receiver.python_type()
        source = accessor_source(receiver, owner, name, "fget") \
            if name is not None and isinstance(owner, type) and fget.__closure__ \
            and inspect.getattr_static(owner, name, None) is prop else None
        return UserFunctionVariable(fget, source).call(tx, [receiver], {})
    if fget is None:
        from kiln.capture.variables.exception import raise_in_trace
        error = AttributeError(f"property {name!r} has no getter")
        raise raise_in_trace(error, f"AttributeError: {error} (raised natively)")
    real = receiver.identity()
    module = getattr(fget, "__module__", None) or ""
    c_getter = isinstance(fget, types.BuiltinFunctionType) or type(fget).__name__ == "instancemethod"
    if c_getter and module not in ("builtins", "operator", "_operator") and name is not None \
            and real is not None and real is getattr(receiver, "value", None):
        source = getattr(receiver, "source", None)
        return tx.wrap(getattr(real, name), None if source is None else AttrSource(source, name))
    return tx.wrap(fget, None).call(tx, [receiver], {})


def bind_python_descriptor(tx: "Tracer", static: Any, receiver: Variable, owner: type, name: str) -> Variable | None:
    """`receiver.name` where the class holds a descriptor whose `__get__` is Python code: the
    call `type(d).__get__(d, receiver, owner)` inlined, with the descriptor read through the class
    dict that holds it (so what its `__get__` reads of it is guarded); None for any other kind."""
    get = inspect.getattr_static(type(static), "__get__", None)
    if not isinstance(get, types.FunctionType):
        return None
    guard_class_attribute(tx, owner, name, static)
    guard_class_attribute(tx, type(static), "__get__", get)
    class_source = receiver_class_source(receiver)
    owner_var = tx.wrap(owner, class_source)
    descriptor = tx.wrap(static, class_dict_source(class_source, owner, name))
    return UserMethodVariable(get, descriptor).call(tx, [receiver, owner_var], {})


def receiver_class_source(receiver: Variable) -> Source | None:
    """Where the class of `receiver` is read from: `type(<source>)` of an object from outside, the
    class's own source for an object made in the frame; None when neither is known."""
    receiver_source = getattr(receiver, "source", None)
    if receiver_source is not None:
        return TypeSource(receiver_source)
    return getattr(receiver, "cls_source", None)


def class_dict_source(class_source: Source | None, owner: type, name: str) -> Source | None:
    """`cls.__mro__[i].__dict__[name]`: the class-dict entry a lookup of `name` on `owner` finds, read
    where Python's lookup finds it (so what a descriptor's own code reads of it is guarded)."""
    if class_source is None:
        return None
    index = next(i for i, k in enumerate(owner.__mro__) if name in k.__dict__)
    mro = AttrSource(class_source, "__mro__")
    return ItemSource(AttrSource(ItemSource(mro, index), "__dict__"), name)


class NestedFunctionVariable(Variable):
    """A function made by MAKE_FUNCTION during the trace: a lambda, an inner def, a comprehension."""

    def __init__(self, code: types.CodeType, f_globals: dict[str, Any], qualname: str,
                 defaults: tuple[Variable, ...], kwdefaults: dict[str, Variable],
                 closure: list[CellVariable] | None) -> None:
        self.code = code
        self.f_globals = f_globals
        self.qualname = qualname
        self.defaults = defaults
        self.kwdefaults = kwdefaults
        self.closure = closure
        # what the frame set on the function: special attributes (functools.wraps copies __name__,
        # __doc__, ...) and its __dict__ (made on first use)
        self.special: dict[str, Variable] = {}
        self.func_dict: DictVariable | None = None

    def describe(self) -> str:
        return f"function {self.qualname}"

    def truth(self, tx: "Tracer") -> bool:
        return True  # a function object is always true (FunctionType has no __bool__ or __len__)

    def python_type(self) -> type:
        return types.FunctionType

    def identity(self) -> Any:
        return self

    def _dict(self) -> DictVariable:
        if self.func_dict is None:
            self.func_dict = DictVariable({})
        return self.func_dict

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.sequence import TupleVariable

        if name in self.special:
            return self.special[name]
        if name in _WRITABLE_SPECIAL:
            # as MAKE_FUNCTION sets them: the code's names, the module of its globals, the first
            # constant of the code when it is a string (its docstring)
            doc = self.code.co_consts[0] if self.code.co_consts and isinstance(self.code.co_consts[0], str) else None
            return tx.wrap_result({"__name__": self.code.co_name, "__qualname__": self.qualname,
                                   "__module__": self.f_globals.get("__name__"), "__doc__": doc}[name])
        if name == "__code__":
            return tx.wrap_result(self.code)
        if name == "__defaults__":
            return TupleVariable(list(self.defaults)) if self.defaults else tx.wrap_result(None)
        if name == "__kwdefaults__":
            return DictVariable(dict(self.kwdefaults)) if self.kwdefaults else tx.wrap_result(None)
        if name == "__dict__":
            return self._dict()
        if name == "__annotations__":
            self.special[name] = DictVariable({})  # made on first read, then the same dict
            return self.special[name]
        if self.func_dict is not None and name in self.func_dict.items:
            return self.func_dict.items[name]
        if name in ("__call__", "__get__"):
            return BoundMethodVariable(self, name)
        if not hasattr(types.FunctionType, name):
            # made in the frame, so its own __dict__ holds only what the trace wrote: the lookup fails
            # as in CPython
            from kiln.capture.variables.exception import raise_in_trace
            message = f"'function' object has no attribute {name!r}"
            raise raise_in_trace(AttributeError(message), f"{message} (raised natively)")
        raise Unsupported(f"attribute {name!r} of a function made during the trace", kind="unsupported_attribute")

    def set_attribute(self, name: str, value: Variable) -> None:
        """`fn.name = value` on a function made in the frame (nothing outside sees it yet)."""
        if name in _WRITABLE_SPECIAL or name in ("__wrapped__", "__annotations__"):
            self.special[name] = value
        elif name.startswith("__") and name.endswith("__"):
            raise Unsupported(f"setting {name} of a function made during the trace", kind="unsupported")
        else:
            self._dict().items[name] = value

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable],
                    kwargs: dict[str, Variable]) -> Variable:
        if name == "__call__":
            return self.call(tx, args, kwargs)
        return super().call_method(tx, name, args, kwargs)

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return tx.inline_call(self.code, self.f_globals, self.closure, self.defaults, self.kwdefaults,
                              list(args), kwargs, name=self.qualname, fn=None)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        defaults = "None" if not self.defaults else "(" + "".join(glue.reconstruct(d) + ", " for d in self.defaults) + ")"
        closure = "None" if not self.closure else "(" + "".join(glue.reconstruct(c) + ", " for c in self.closure) + ")"
        text = (f"{glue.constant(types.FunctionType)}({glue.constant(self.code)}, G, "
                f"{self.code.co_name!r}, {defaults}, {closure})")
        if self.kwdefaults:
            raise Unsupported("rebuilding a function with keyword-only defaults", kind="reconstruct")
        if self.f_globals is not glue.f_globals:
            raise Unsupported("rebuilding a function of another module", kind="reconstruct")
        if not self.special and not (self.func_dict is not None and self.func_dict.items):
            return text
        name = glue.fresh("fn")
        glue.line(f"{name} = {text}")
        for attr, value in self.special.items():
            glue.line(f"{name}.{attr} = {glue.reconstruct(value)}")
        if self.func_dict is not None and self.func_dict.items:
            glue.line(f"{name}.__dict__.update({glue.reconstruct(self.func_dict)})")
        return name


# Attributes of a function that the frame may set (functools.wraps does) and read back.
_WRITABLE_SPECIAL = frozenset({"__name__", "__qualname__", "__module__", "__doc__"})


class PartialVariable(Variable):
    """`functools.partial(fn, *args, **kwargs)`: calling it calls `fn` with the bound arguments first.

    `value` is the real partial when one was read from the frame (its own `__dict__` entries are
    read through `source`); a partial made during the trace has none."""

    def __init__(self, fn: Variable, args: list[Variable], kwargs: dict[str, Variable], source: Source | None = None,
                 value: functools.partial[Any] | None = None) -> None:
        if isinstance(fn, PartialVariable) and fn.value is None:
            # CPython flattens partial(partial(f, 1), 2) into partial(f, 1, 2): `.func` is f
            inner: PartialVariable = fn
            args, kwargs, fn = [*inner.args, *args], {**inner.kwargs, **kwargs}, inner.fn
        self.fn: Variable = fn
        self.args: list[Variable] = args
        self.kwargs: dict[str, Variable] = kwargs
        self.source = source
        self.value: functools.partial[Any] | None = value

    def describe(self) -> str:
        return f"partial({self.fn.describe()})"

    def truth(self, tx: "Tracer") -> bool:
        if self.python_type() is functools.partial:
            return True  # functools.partial has no __bool__ or __len__
        return super().truth(tx)

    def python_type(self) -> type:
        return functools.partial if self.value is None else type(self.value)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.dict import DictVariable
        from kiln.capture.variables.sequence import TupleVariable

        if name == "func":
            return self.fn
        if name == "args":
            return TupleVariable(list(self.args))
        if name == "keywords":
            if self.value is not None and self.source is not None:
                return tx.wrap(self.value.keywords, AttrSource(self.source, "keywords"))
            return DictVariable(dict(self.kwargs))
        if self.value is not None:
            instance_dict = self.value.__dict__
            if self.source is not None:  # what the trace found (or did not) in the partial's own dict
                tx.state.output.guards.append(Guard(AttrSource(self.source, "__dict__").name(), "check_keys",
                                                    tuple(instance_dict.keys())))
            if name in instance_dict:
                return tx.wrap(instance_dict[name], None if self.source is None else AttrSource(self.source, name))
        if name == "__class__":
            return tx.wrap(self.python_type(), None)
        if not hasattr(self.python_type(), name):
            from kiln.capture.variables.exception import raise_in_trace
            message = f"'functools.partial' object has no attribute {name!r}"
            raise raise_in_trace(AttributeError(message), f"{message} (raised natively)")
        raise Unsupported(f"attribute {name!r} of a functools.partial", kind="unsupported_attribute")

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return self.fn.call(tx, [*self.args, *args], {**self.kwargs, **kwargs})

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()
        parts = [glue.reconstruct(self.fn)] + [glue.reconstruct(a) for a in self.args]
        parts += [f"{k}={glue.reconstruct(v)}" for k, v in self.kwargs.items()]
        return f"{glue.constant(functools.partial)}({', '.join(parts)})"
