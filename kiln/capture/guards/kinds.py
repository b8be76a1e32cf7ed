"""The guard records and the table of guard kinds: what a guard assumes, and the Python that checks it.

`Guard` is one assumption the trace relied on: a source (an expression over L, G, F), a kind (a
verb of GUARD_KINDS, registered by `@guard_kind`) and what that kind compares against (a type, an
object, a constant, a `TensorSpec`, ...). Each kind turns its record into `Check`s: Python
conditions over the value, bound constants held by an `Emitter`, each with the failure in the
user's words. The records other kinds compare against (FunctionCode, ClassAttribute,
ParametrizedClass) live beside their kinds; the kinds over process-wide state (grad mode,
GlobalState, ProcessQuery, ConstantCall) are in kiln.capture.guards.global_kinds, and the tensor
kind, which the boundary extension can check in one call, is in kiln.capture.guards.native.
"""
from __future__ import annotations

import enum
import itertools
import math
import re
import sys
import types
import weakref
from dataclasses import dataclass
from types import CodeType
from typing import Any, Callable, Iterable, Sequence

import torch

from kiln.capture.guards.identity import Expected, WeakHeld, held, held_weakly
from kiln.symbolic.marks import marked_dynamic


# ---------------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class Guard:
    """One assumption about the value at `source` (an expression over L, G, F; see docs/seams.md).

    `kind` names a verb of GUARD_KINDS; `expected` is what that verb compares against (a type, an
    object, a constant, a TensorSpec, a length, ...). `description` overrides the user-facing name
    derived from `source` (useful for closure cells: "free variable scale of f"). A check_id guard
    holds its object weakly where it can (kiln.capture.guards.identity): `expected` is then the
    object while it lives and `identity.GONE` after; so does a check_type guard on a class made by a call.
    """

    source: str
    kind: str
    expected: Any = Expected()
    description: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in GUARD_KINDS:
            raise ValueError(f"unknown guard kind {self.kind!r}; known: {sorted(GUARD_KINDS)}")
        if self.kind == "check_value" and type(self.expected) is set:
            # The value as the trace saw it: holding the live set itself, the check would compare
            # the set with itself after the program adds to it.
            object.__setattr__(self, "expected", set(self.expected))

    @property
    def name(self) -> str:
        return self.description or user_name(self.source)

    def key(self) -> tuple:
        """Identity used to drop duplicates (objects compared by id, constants by value)."""
        stored = held(self)
        if type(stored) is WeakHeld:
            return (self.source, self.kind, stored.id)
        if self.kind == "check_id":
            return (self.source, self.kind, id(stored))
        try:
            hash(self.expected)
            return (self.source, self.kind, type(self.expected), self.expected)
        except TypeError:
            return (self.source, self.kind, repr(self.expected))

    def __getstate__(self) -> dict:
        # the object, not the weak reference (which does not pickle): a cache file names it
        return {**self.__dict__, "expected": self.expected}

    def __str__(self) -> str:
        if not self.source:
            return f"{self.kind}({describe_expected(self.expected)})"
        if self.kind == "check_shape":
            where = f"  # {self.expected}" if isinstance(self.expected, str) else ""
            return f"check_shape({user_name(self.source)}){where}"
        return f"{self.kind}({self.source}, {describe_expected(self.expected)})"


@dataclass(frozen=True)
class TensorSpec:
    """The metadata of a tensor that a graph depends on. A size or stride of None is dynamic."""

    type: type
    dtype: torch.dtype
    device: torch.device
    layout: torch.layout
    requires_grad: bool
    sizes: tuple[int | None, ...]
    strides: tuple[int | None, ...]
    inference: bool = False
    conj: bool = False
    neg: bool = False
    # (i, j): free stride i equals size[j] * stride[j], the dense layout it had when captured
    stride_links: tuple[tuple[int, int], ...] = ()
    # Dims that kiln.mark_dynamic may mark on the tensor without a recompile (the dims captured
    # dynamic, and those marked then); None: marks are not checked (a module's parameters and buffers).
    markable: tuple[int, ...] | None = None

    @staticmethod
    def of(t: torch.Tensor, dynamic_dims: Iterable[int] = (), watch_marks: bool = False) -> "TensorSpec":
        """The spec of a real tensor, with the sizes in `dynamic_dims` (and strides built from them) free.
        `watch_marks`: a later mark_dynamic on a dim the graph specialized must miss (as torch.compile)."""
        # A size of 0 or 1 is specialized by the ShapeEnv even in a dynamic dim (seams: create_symbol),
        # so the graph assumed it and the guard must check it.
        dynamic = {d for d in dynamic_dims if t.shape[d] not in (0, 1)}
        sizes = tuple(None if d in dynamic else s for d, s in enumerate(t.shape))
        strides: tuple[int | None, ...] = ()
        links: list[tuple[int, int]] = []
        if t.layout == torch.strided:
            real_sizes, real_strides = tuple(t.shape), tuple(t.stride())
            strides, own = _static_strides(real_sizes, real_strides, dynamic)
            for i, s in enumerate(strides):
                j = _dense_inner_dim(real_sizes, real_strides, i) if s is None and i not in own else None
                if j is not None:
                    links.append((i, j))
        markable = None
        if watch_marks:
            markable = tuple(sorted({d for d, s in enumerate(sizes) if s is None} | set(marked_dynamic(t))))
        return TensorSpec(
            type=type(t), dtype=t.dtype, device=t.device, layout=t.layout,
            requires_grad=t.requires_grad, sizes=sizes, strides=strides,
            inference=t.is_inference(), conj=t.is_conj(), neg=t.is_neg(),
            stride_links=tuple(links), markable=markable,
        )

    def __str__(self) -> str:
        sizes = ", ".join("?" if s is None else str(s) for s in self.sizes)
        grad = ", requires_grad" if self.requires_grad else ""
        return f"{self.type.__name__}[{sizes}] {self.dtype} {self.device}{grad}"


def _static_strides(sizes: tuple[int, ...], strides: tuple[int, ...],
                    dynamic: set[int]) -> tuple[tuple[int | None, ...], set[int]]:
    # The strides the fake input has as symbols (kiln.fake.convert.symbolic_strides, the same walk):
    # from the smallest stride up, while the layout is dense, a stride is the product of the sizes
    # laid out inside it; it is left free when one of those sizes is dynamic, and its dense
    # relation is checked instead (see check_tensor), so a new batch size does not recompile
    # through the stride guard. From the first stride that breaks the chain (a padded row; a broadcast
    # 0 is stepped over) on, a stride laid out outside a dynamic size is a symbol of its own, checked
    # by the size guards (the second result: those dims, which have no dense relation); the fake
    # keeps the others as the captured integers and the guard checks them.
    out: list[int | None] = list(strides)
    own: set[int] = set()
    if not dynamic:
        return tuple(out), own
    dense, chain, symbolic = 1, True, False
    for d in sorted(range(len(sizes)), key=lambda d: (strides[d], -d)):
        if strides[d] == 0:  # a broadcast dim: its 0 is checked, the chain goes on past it
            continue
        if chain and strides[d] == dense:
            if symbolic:
                out[d] = None
            dense *= sizes[d]
        else:
            chain = False
            if symbolic and strides[d] >= 2:
                out[d] = None
                own.add(d)
        symbolic = symbolic or d in dynamic
    return tuple(out), own


def _dense_inner_dim(real_sizes: Sequence[int], real_strides: Sequence[int], i: int) -> int | None:
    """The dim laid out just inside dim i, if stride[i] == size[j] * stride[j] held when captured."""
    candidates = [j for j in range(len(real_sizes)) if j != i and (real_strides[j], -j) < (real_strides[i], -i)]
    if not candidates:
        return None
    j = max(candidates, key=lambda k: (real_strides[k], -k))
    return j if real_strides[i] == real_sizes[j] * real_strides[j] else None


# ---------------------------------------------------------------------------------------------------
# The table of guard kinds


@dataclass(frozen=True)
class Check:
    """One boolean condition of a guard: `code` is Python over `{v}` (the value) and bound names.

    The code of a guard over a value never holds text from the program (a string value, an
    attribute or key name): those are bound constants (Emitter.bind), so `render` can put the
    value's expression in place of `{v}` by plain replacement, and no name of the user's can be
    read as a template field. A guard over no one value (source "": aliasing) holds source texts
    and is used as it is, never rendered."""

    code: str
    why: Callable[[Any], str]  # the failure in the user's words, given the current value

    def render(self, value: str) -> str:
        return self.code.replace("{v}", value)


# Helpers that generated checks call by a fixed name, filled by the modules of kinds defined outside
# this one (global_kinds) when they are imported.
CHECK_HELPERS: dict[str, Callable[..., Any]] = {}


class Emitter:
    """Binds the constants that generated code refers to (types, objects, dtypes) to fresh names.

    `native`: the boundary extension (kiln.runtime.boundary), whose `tensor_ok` and `same_keys` check
    a tensor's metadata and a dict's keys in one call each; None: every check is Python. Its names
    are `___n<k>` where the Python variant's are `___c<k>`, so code made for one variant never
    binds to the other's constants."""

    def __init__(self, native: Any = None) -> None:
        self.native = native
        self.prefix = "___c" if native is None else "___n"
        self.constants: dict[str, Any] = {"___grad_enabled": torch.is_grad_enabled,
                                          "___default_dtype": torch.get_default_dtype,
                                          "___any_autocast": torch._C._is_any_autocast_enabled,
                                          "___same_items": _same_items,
                                          "___class_lookup": class_lookup,
                                          "___same_mapping": _same_mapping,
                                          "___same_sequence": _same_sequence,
                                          "___zero_signs": _zero_signs,
                                          "___same_order": _same_order,
                                          "___absent": _absent,
                                          "___parametrized_class": parametrized_class_holds,
                                          "math": math,  # math.sqrt in a shape guard (symbolic/render.py)
                                          **CHECK_HELPERS}
        if native is not None:
            self.constants["___tensor_ok"] = native.tensor_ok
            self.constants["___same_keys"] = native.same_keys
            self.constants["___empty_attrs"] = native.empty_attrs
            if hasattr(native, "state_ok"):  # an extension built before it had none
                self.constants["___state_ok"] = native.state_ok
        self._names: dict[Any, str] = {}
        self.weak: list[weakref.ref] = []  # the weak references bind_weak bound, in order

    def bind(self, obj: Any) -> str:
        # By identity (check_id compares with `is`), except devices: each tensor hands out a new
        # but equal torch.device, compared with ==, and one name per device reads better.
        key = ("device", str(obj)) if isinstance(obj, torch.device) else id(obj)
        name = self._names.get(key)
        if name is None:
            name = f"{self.prefix}{len(self._names)}"
            self._names[key] = name
            self.constants[name] = obj
        return name

    def bind_weak(self, obj: Any) -> str:
        """A name for a weak reference to `obj`: code reads the object as `name()`, None once it is
        freed. Named `<prefix>w<k>`: code made where this object was held strongly (another process's
        policy, kiln.capture.guards.identity.held_weakly) never binds to it. The objects bound so
        are `self.weak`, which the check function watches (identity.watch)."""
        key = ("weak", id(obj))
        name = self._names.get(key)
        if name is None:
            name = f"{self.prefix}w{len(self._names)}"
            self._names[key] = name
            self.constants[name] = ref = weakref.ref(obj)
            self.weak.append(ref)
        return name


GuardKindFn = Callable[[Any, str, Emitter], list[Check]]
GUARD_KINDS: dict[str, GuardKindFn] = {}


def guard_kind(fn: GuardKindFn) -> GuardKindFn:
    """Register a guard kind under its function name, which must be a verb starting with check_."""
    assert fn.__name__.startswith("check_"), fn.__name__
    GUARD_KINDS[fn.__name__] = fn
    return fn


@guard_kind
def check_type(expected: type, name: str, em: Emitter) -> list[Check]:
    if not held_weakly(expected):
        return [Check(f"type({{v}}) is {em.bind(expected)}",
                      lambda v: f"{name} changed type {type_change(expected, type(v))}")]
    # a class made by a call (identity.held_weakly): `type(v)` is never None, a dead reference's
    ref = weakref.ref(expected)

    def why(v: Any) -> str:
        cls = ref()
        return f"{name} changed type {'from a class freed since to ' + _tname(type(v)) if cls is None else type_change(cls, type(v))}"
    return [Check(f"type({{v}}) is {em.bind_weak(expected)}()", why)]


@guard_kind
def check_id(expected: Any, name: str, em: Emitter) -> list[Check]:
    # Compared with the object itself, never its id (a new object may reuse a freed one's): held
    # strongly, or weakly where identity.held_weakly says so, and then freed with the user's last
    # reference (the check function is invalidated then, see CheckFn.invalidate).
    if not held_weakly(expected):
        checks = [Check(f"{{v}} is {em.bind(expected)}", lambda v: f"{name} is a different object than when "
                        f"compiled (was {_short(expected)}, now {_short(v)})")]
    else:
        ref = weakref.ref(expected)
        # A dead reference gives None: `is not None` keeps a None there from passing (a function's
        # next check, `.__code__`, raises on None already)
        tail = "" if isinstance(expected, types.FunctionType) else " is not None"
        checks = [Check(f"{{v}} is {em.bind_weak(expected)}(){tail}",
                        lambda v: f"{name} is a different object than when compiled (was {_short(ref())}, "
                                  f"now {_short(v)})" if ref() is not None else
                                  f"{name} was an object freed since it was compiled (now {_short(v)})")]
    if isinstance(expected, types.FunctionType):
        checks += _function_contents(expected, name, em)
    return checks


def _function_contents(fn: types.FunctionType, name: str, em: Emitter) -> list[Check]:
    """What a function object can change without changing identity, and capture baked in when it
    inlined the body: `__code__` (autoreload assigns it), `__defaults__` and `__kwdefaults__`.
    Compared by identity: a new tuple of defaults recompiles even when equal (rare, and cheap).
    In another process the function is found by name with a digest of these (kiln.capture.persist),
    and binding them again from the function found there keeps this check meaningful."""
    checks = [Check(f"{{v}}.__code__ is {em.bind(fn.__code__)}",
                    lambda v: f"the code of {name} changed since it was compiled")]
    defaults = fn.__defaults__
    checks.append(Check(f"{{v}}.__defaults__ is {'None' if defaults is None else em.bind(defaults)}",
                        lambda v: f"{name}.__defaults__ changed from {defaults!r} to {v.__defaults__!r}"))
    kwdefaults = fn.__kwdefaults__
    if kwdefaults is None:
        checks.append(Check("{v}.__kwdefaults__ is None",
                            lambda v: f"{name}.__kwdefaults__ changed from None to {v.__kwdefaults__!r}"))
    else:
        # The dict can be changed in place: compare its items (keys by value, values by identity).
        items = tuple(kwdefaults.items())
        checks.append(Check(f"___same_items({{v}}.__kwdefaults__, {em.bind(items)})",
                            lambda v: f"{name}.__kwdefaults__ changed from {dict(items)!r} to {v.__kwdefaults__!r}"))
    return checks


@dataclass(frozen=True)
class FunctionCode:
    """A function known by its contents rather than its identity: a function local to another one
    (a validator a library makes per field), which another process cannot find by name. What
    inlining it relied on: its code object, its defaults (literals) and the module whose globals
    it reads; its closure cells are guarded where the trace read them. kiln.capture.persist
    writes an identity guard on such a function as this (the code found again through the
    function that defines it, by name and digest)."""

    code: CodeType
    module: str
    defaults: tuple | None
    kwdefaults: tuple | None  # the items of __kwdefaults__

    def __str__(self) -> str:
        return f"function with the code of {self.code.co_qualname}"


@guard_kind
def check_code(expected: FunctionCode, name: str, em: Emitter) -> list[Check]:
    def why(v: Any) -> str:
        return f"{name} is not a function with the code and defaults of {expected.code.co_qualname} (now {_short(v)})"

    module = sys.modules.get(expected.module)
    kwdefaults = "None" if expected.kwdefaults is None else em.bind(dict(expected.kwdefaults))
    return [Check(f"type({{v}}) is {em.bind(types.FunctionType)} and {{v}}.__code__ is {em.bind(expected.code)} "
                  f"and {{v}}.__globals__ is {em.bind(getattr(module, '__dict__', None))} "
                  f"and {{v}}.__defaults__ == {em.bind(expected.defaults)} and {{v}}.__kwdefaults__ == {kwdefaults}",
                  why)]


def _same_items(d: Any, items: tuple) -> bool:
    return type(d) is dict and len(d) == len(items) and all(
        k in d and d[k] is value for k, value in items)


_LITERALS = (int, float, str, bytes, bool, type(None))


def _zero_signs(value: Any) -> tuple:
    """The signs of the float zeros in `value` (nested in tuples), in order: 0.0 == -0.0, but a
    trace that read one (math.copysign, 1 / v, str(v)) is wrong for the other."""
    if type(value) is float:
        return (math.copysign(1.0, value),) if value == 0.0 else ()
    if type(value) is tuple:
        return tuple(sign for item in value for sign in _zero_signs(item))
    return ()


def _same_literal(item: Any, value: Any) -> bool:
    """Literals by type and value, a float zero by its sign too."""
    return type(item) is type(value) and item == value and (
        type(value) is not float or value != 0.0 or math.copysign(1.0, item) == math.copysign(1.0, value))


def _same_tree(item: Any, value: Any) -> bool:
    """Literals by type and value (a float zero by its sign too), plain tuples of them item by item."""
    if type(value) is tuple:
        return type(item) is tuple and len(item) == len(value) and all(map(_same_tree, item, value))
    return _same_literal(item, value)


def _same_order(items: Any, expected: tuple) -> bool:
    """A set iterates these elements, in this order (see check_set_order)."""
    return len(items) == len(expected) and all(map(_same_tree, items, expected))


def _same_sequence(items: Any, expected: tuple) -> bool:
    """`items` is a list with these items: by identity, literals by type and value."""
    return type(items) is list and len(items) == len(expected) and all(
        item is value or type(value) in _LITERALS and _same_literal(item, value)
        for item, value in zip(items, expected))


def _same_mapping(d: Any, items: tuple) -> bool:
    """`d` is a dict with these items: values by identity, literals by type and value (an entry
    read from disk holds equal literals, not the same objects)."""
    return type(d) is dict and len(d) == len(items) and all(
        k in d and (d[k] is value or type(value) in _LITERALS and _same_literal(d[k], value))
        for k, value in items)


@guard_kind
def check_value(expected: Any, name: str, em: Emitter) -> list[Check]:
    def why(v: Any) -> str:
        if type(v) is not type(expected):
            return f"{name} changed from {expected!r} ({_tname(type(expected))}) to {v!r} ({_tname(type(v))})"
        return f"{name} changed from {expected!r} to {v!r}"

    if expected is None or isinstance(expected, (bool, torch.dtype, torch.layout)) or expected is Ellipsis:
        return [Check(f"{{v}} is {em.bind(expected)}", why)]
    if isinstance(expected, float) and math.isnan(expected):
        return [Check(f"type({{v}}) is {em.bind(type(expected))} and {{v}} != {{v}}", why)]  # np.float64 too
    if type(expected) is int or (type(expected) is float and math.isfinite(expected)):
        literal = repr(expected)
    else:
        literal = em.bind(expected)  # strings too: the program's text is never pasted into code
    # Type first: 1 == 1.0 == True, and a graph specialized on an int must not take a float.
    check = f"type({{v}}) is {em.bind(type(expected))} and {{v}} == {literal}"
    signs = _zero_signs(expected)
    if signs:  # -0.0 == 0.0: the sign of each float zero too
        check += f" and ___zero_signs({{v}}) == {signs!r}"
    return [Check(check, why)]


@dataclass(frozen=True)
class ClassAttribute:
    """What looking up `name` on `classes` (searched in order, as an MRO or the part of one that
    `super()` searches) found when the trace read it: `value`, or ABSENT when no class had it.

    For a class the trace reached without a source (an instance built inside the frame whose class
    came from a call's result, a `super()` lookup): with a source, the attribute is guarded by
    reading `<source>.name`. In another process the classes are found by name (their digests cover
    their methods) and `value` compared as here: literals by value, anything else by identity."""

    classes: tuple[type, ...]
    name: str
    value: Any
    # A container's contents when the trace read it (dict items, list items, set members): the
    # check compares with these, not with the live container, which the program may change in
    # place before the guards are compiled (again: a switch to the native checks recompiles them).
    snapshot: Any = None

    def __post_init__(self) -> None:
        if self.snapshot is None:
            value = self.value
            snapshot = tuple(value.items()) if type(value) is dict else tuple(value) if type(value) is list \
                else frozenset(value) if type(value) is set else None
            object.__setattr__(self, "snapshot", snapshot)

    def __str__(self) -> str:
        return f"{self.classes[0].__qualname__}.{self.name} = {_short(self.value)}"


ABSENT = type("Absent", (), {"__repr__": lambda self: "<absent>"})()


def class_lookup(classes: tuple[type, ...], name: str) -> Any:
    """The raw class-dict entry for `name` in the first of `classes` that has one, else ABSENT."""
    for klass in classes:
        found = klass.__dict__.get(name, ABSENT)
        if found is not ABSENT:
            return found
    return ABSENT


@guard_kind
def check_class_attr(expected: ClassAttribute, name: str, em: Emitter) -> list[Check]:
    # Source "": the classes are bound as constants, so the check reads no frame value.
    value = expected.value
    found = f"___class_lookup({em.bind(expected.classes)}, {em.bind(expected.name)})"
    owner = f"{expected.classes[0].__qualname__}.{expected.name}"

    def why(env: Any) -> str:
        now = class_lookup(expected.classes, expected.name)
        return f"class attribute {owner} changed from {_short(value)} to {_short(now)}"

    if type(value) is int or (type(value) is float and math.isfinite(value)):
        zero_sign = f" and ___zero_signs({found}) == {_zero_signs(value)!r}" if _zero_signs(value) else ""
        return [Check(f"type({found}) is {em.bind(type(value))} and {found} == {value!r}{zero_sign}", why)]
    if type(value) in (str, bytes):
        return [Check(f"type({found}) is {em.bind(type(value))} and {found} == {em.bind(value)}", why)]
    def changed(env: Any) -> str:
        return f"class attribute {owner} changed from {_short(value)} to " \
               f"{_short(class_lookup(expected.classes, expected.name))}"

    if type(value) is dict:
        # A dict on a class (a registry such as transformers' ExpertsInterface._global_mapping),
        # read without a source: the trace used its items, and a registration changes them in
        # place. Keys by value, values by identity (literals by value), at check time.
        return [Check(f"___same_mapping({found}, {em.bind(expected.snapshot)})", changed)]
    if type(value) is list:
        # a list changed in place (an append, an item replaced): its items as the trace read them
        return [Check(f"___same_sequence({found}, {em.bind(expected.snapshot)})", changed)]
    if type(value) is set:
        return [Check(f"type({found}) is set and {found} == {em.bind(expected.snapshot)}", changed)]
    checks = [Check(f"{found} is {em.bind(value)}", why)]
    # Once the lookup found this very object, its contents are read off the bound constant: one
    # MRO walk per check instead of one per item (a config class's __getattribute__ is checked on
    # every call of a transformers model).
    function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    where = em.bind(function)
    if isinstance(function, types.FunctionType):  # the method's body was inlined: its code too
        checks += [Check(c.render(where), lambda env: f"the code or defaults of {owner} changed")
                   for c in _function_contents(function, owner, em)]
    return checks


@dataclass(frozen=True)
class ParametrizedClass:
    """A class torch.nn.utils.parametrize made for one module (`ParametrizedConv1d`, one per
    parametrized module, so another process cannot name it): on `base`, with exactly the class-dict
    `names`, each function and property of it torch's own code. kiln.capture.persist writes a
    check_type on such a class as this; within a process the class is compared by identity."""

    base: type
    names: tuple[str, ...]

    def __str__(self) -> str:
        return f"Parametrized{self.base.__qualname__} ({', '.join(n for n in self.names if not n.startswith('__'))})"


PARAMETRIZE_MODULE = "torch.nn.utils.parametrize"


def parametrized_class_holds(cls: Any, expected: ParametrizedClass) -> bool:
    """Whether `cls` is what parametrize makes from `expected.base` for `expected.names`: its own
    name and module, one base, those dict entries, every function (a property's too) and every
    function in their closures written in parametrize's source, a property's closure strings its
    own name (the tensor it reads), any other closure value the one module the class was made for."""
    if type(cls) is not type or cls.__bases__ != (expected.base,) or cls.__module__ != PARAMETRIZE_MODULE \
            or cls.__name__ != f"Parametrized{expected.base.__name__}" or tuple(sorted(cls.__dict__)) != expected.names:
        return False
    source = getattr(sys.modules.get(PARAMETRIZE_MODULE), "__file__", None)
    for name, value in cls.__dict__.items():
        if name in ("__module__", "__doc__"):
            if value is not None and not isinstance(value, str):
                return False
            continue
        functions = [value.fget, value.fset, value.fdel] if isinstance(value, property) else [value]
        if not all(f is None or _parametrize_code(f, cls, source, name if isinstance(value, property) else None, 0)
                   for f in functions):
            return False
    return True


def _parametrize_code(fn: Any, cls: type, source: Any, tensor_name: str | None, depth: int) -> bool:
    if type(fn) is not types.FunctionType or fn.__code__.co_filename != source or depth > 2:
        return False
    for cell in fn.__closure__ or ():
        value = cell.cell_contents
        if isinstance(value, str):
            if value != tensor_name:
                return False
        elif type(value) is not cls and not _parametrize_code(value, cls, source, tensor_name, depth + 1):
            return False
    return True


@guard_kind
def check_parametrized_type(expected: ParametrizedClass, name: str, em: Emitter) -> list[Check]:
    return [Check(f"___parametrized_class(type({{v}}), {em.bind(expected)})",
                  lambda v: f"{name} is no longer a module parametrized as {expected} (now {_tname(type(v))})")]


@guard_kind
def check_none(expected: Any, name: str, em: Emitter) -> list[Check]:
    return [Check("{v} is None", lambda v: f"{name} was None and is now {_short(v)}")]


@guard_kind
def check_not_none(expected: Any, name: str, em: Emitter) -> list[Check]:
    return [Check("{v} is not None", lambda v: f"{name} was not None and is now None")]


@guard_kind
def check_len(expected: int, name: str, em: Emitter) -> list[Check]:
    return [Check(f"len({{v}}) == {int(expected)}", lambda v: f"len({name}) changed from {expected} to {len(v)}")]


@guard_kind
def check_min_len(expected: int, name: str, em: Emitter) -> list[Check]:
    # An iterator the trace read only part of: it relied on there being at least this many items.
    return [Check(f"len({{v}}) >= {int(expected)}",
                  lambda v: f"len({name}) is {len(v)}, fewer than the {expected} the trace read")]


@guard_kind
def check_keys(expected: tuple, name: str, em: Emitter) -> list[Check]:
    # Dicts keep insertion order and iteration over them is unrolled in that order.
    def why(v: Any) -> str:
        try:
            now = list(v.keys())
        except Exception:  # not a mapping any more (its type guard, when it has one, says so first)
            return f"keys of {name} changed from {list(expected)}: it is now {_short(v)}"
        return f"keys of {name} changed from {list(expected)} to {now}"

    if em.native is not None:
        return [Check(f"___same_keys({{v}}, {em.bind(tuple(expected))})", why)]
    return [Check(f"list({{v}}.keys()) == {em.bind(list(expected))}", why)]


@guard_kind
def check_set_order(expected: tuple, name: str, em: Emitter) -> list[Check]:
    # A set's iteration order is its hash table's (sizes, collisions, dummies of removed elements):
    # two equal sets may iterate differently, and a graph that unrolled an iteration took one order.
    # Each element by type and value, into tuples: {1} == {True} and (1, 2) == (1.0, 2), but a graph
    # that unrolled the iteration took the elements it saw.
    return [Check(f"___same_order({{v}}, {em.bind(tuple(expected))})",
                  lambda v: f"the iteration order of {name} changed from {list(expected)} to {_short(list(v))}")]


_INLINE_ABSENT = 8  # names an absent-check tests inline; more go through one ___absent call


def _absent(d: Any, names: frozenset) -> bool:
    for name in names:
        if name in d:
            return False
    return True


@guard_kind
def check_absent(expected: frozenset, name: str, em: Emitter) -> list[Check]:
    # `expected`: names an object's instance dict (the source) did not hold when the trace looked
    # them up elsewhere (its class, a module's parameter and submodule tables): an instance
    # attribute of that name now would be found first.
    def why(v: Any) -> str:
        found = sorted(n for n in expected if n in v)
        owner = name[: -len(".__dict__")] if name.endswith(".__dict__") else name
        return f"{owner} now has instance attribute(s) {found}, which shadow what the trace read"

    if len(expected) <= _INLINE_ABSENT and all(type(n) is str and n.isidentifier() for n in expected):
        # `in` tests in the check itself: a call of ___absent costs more than a few of them
        return [Check(" and ".join(f"{n!r} not in {{v}}" for n in sorted(expected)) or "True", why)]
    return [Check(f"___absent({{v}}, {em.bind(frozenset(expected))})", why)]


@guard_kind
def check_shape(expected: Any, name: str, em: Emitter) -> list[Check]:
    # The source of a shape guard is its own Python text (over L, G, F); it reads no `{v}`.
    return [Check("", lambda v: v)]


# ---------------------------------------------------------------------------------------------------
# Sources as the user writes them

_NAME_RE = re.compile(r"\b([LG])\['([A-Za-z_]\w*)'\]")
_MODULE_DICT_RE = re.compile(r"\.(?:_modules|_parameters|_buffers)\['(\w+)'\]")


def user_name(source: str) -> str:
    """`L['self']._modules['fc'].weight` -> `self.fc.weight`: a source as the user would write it."""
    text = _MODULE_DICT_RE.sub(lambda m: f"[{m[1]}]" if m[1].isdigit() else f".{m[1]}", source)
    return _NAME_RE.sub(r"\2", text)


# ---------------------------------------------------------------------------------------------------
# Printing


def _tname(t: type) -> str:
    module = getattr(t, "__module__", "")
    if module in ("builtins", None):
        return t.__name__
    if module.startswith("torch"):
        return f"torch.{'nn.' if module.startswith('torch.nn') else ''}{t.__name__}"
    return t.__qualname__


def type_change(old: type, new: type) -> str:
    """'from A to B'; two classes of one name (torch.nn.utils.parametrize makes a ParametrizedConv1d per
    module, a class made in a function per call) are told apart by where they live."""
    before, after = _tname(old), _tname(new)
    if before == after:
        return f"from {before} (class at {id(old):#x}) to another class of the same name (at {id(new):#x})"
    return f"from {before} to {after}"


def _short(obj: Any) -> str:
    if isinstance(obj, torch.Tensor):
        return f"a tensor of shape {tuple(obj.shape)}"
    if isinstance(obj, torch.nn.Module):
        return f"<{type(obj).__name__} at {id(obj):#x}>"
    if callable(obj) and hasattr(obj, "__qualname__"):
        return f"<{type(obj).__name__} {obj.__qualname__}>"
    text = _plain_repr(obj, 2)
    return text if len(text) < 60 else text[:57] + "..."


def _plain_repr(obj: Any, depth: int) -> str:
    """repr without running the program's code: a recompile message is written during a guard check, before
    the call runs, and a class's Python __repr__ may have side effects or raise (a dataclass that
    copy.deepcopy has made but not yet filled has no fields: its __repr__ raised AttributeError out of the
    compiled call). Containers show their first items the same way; a class with a Python __repr__ shows
    its name (Kiln's own classes excepted)."""
    kind = type(obj)
    # Kiln's own values (a freed object's marker, a process query) have reprs written for these messages
    python_repr = isinstance(getattr(kind, "__repr__", None), types.FunctionType) and \
        not kind.__module__.startswith("kiln.")
    base = next((b for b in (dict, tuple, list, set, frozenset) if isinstance(obj, b)), None)
    if base is tuple and hasattr(kind, "_fields"):  # a namedtuple: its class name, then its items
        return kind.__qualname__ + _plain_repr(tuple(obj), depth)
    if base is not None and not python_repr:
        kind, size = base, base.__len__(obj)  # the base's own methods: a subclass's Python ones are not run
        if depth == 0:
            return f"<{kind.__name__} of {size}>"
        items = list(itertools.islice(dict.items(obj) if kind is dict else kind.__iter__(obj), 6))
        parts = [f"{_plain_repr(k, depth - 1)}: {_plain_repr(v, depth - 1)}" for k, v in items] if kind is dict \
            else [_plain_repr(v, depth - 1) for v in items]
        more = ", ..." if size > len(items) else ""
        inner = ", ".join(parts) + more
        if kind is dict:
            return "{" + inner + "}"
        if kind is tuple:
            return f"({inner}{',' if size == 1 else ''})"
        return f"[{inner}]" if kind is list else f"{kind.__name__}({{{inner}}})"
    if isinstance(obj, enum.Enum):
        return f"{kind.__qualname__}.{obj.name}"
    if not python_repr:
        try:
            return repr(obj)  # a repr in C: ints, strings, torch.dtype, object's own <C object at ...>
        except Exception:  # noqa: BLE001 -- a C repr of a half-made object; the message must not raise
            pass
    return f"<{_tname(kind)} object at {id(obj):#x}>"


def describe_expected(expected: Any) -> str:
    if isinstance(expected, type):
        return _tname(expected)
    return str(expected) if isinstance(expected, (TensorSpec, ClassAttribute)) else _short(expected)
