"""Python builtins on numbers and their text during capture: min/max, sum, any/all, divmod, hash,
repr/format, and the int/float/bool/str/complex conversions, one rule each, in the table of
kiln.capture.variables.builtin (filled by `@builtin_rule`). On symbolic numbers they record what
torch.compile records (sym_max/sym_min, a // b and a % b) rather than guard a value; on constants
they fold. Corresponds to the number parts of torch/_dynamo/variables/builtin.py.
"""
from __future__ import annotations

import functools
import operator
import inspect
import types
from typing import TYPE_CHECKING, Any, Callable

import torch

from kiln.capture.trace_rules import BUILTIN_RULES as RULES
from kiln.capture.trace_rules import BuiltinRule as Rule
from kiln.capture.trace_rules import builtin_rule
from kiln.capture.variables.base import Variable
from kiln.capture.variables.builtin import fold_call
from kiln.capture.variables.constant import ConstantVariable, DeferredTextVariable
from kiln.capture.variables.ordering import Ordered, constant_of, traced_numbers, user_objects
from kiln.capture.variables.sequence import ListVariable, TupleVariable, native
from kiln.capture.variables.symint import SymIntVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


def _minmax(fn: Any) -> Rule:
    def rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.tensor import TensorVariable

        if not args:
            from kiln.capture.variables.exception import raise_in_trace
            no_args = TypeError(f"{fn.__name__} expected at least 1 argument, got 0")
            raise raise_in_trace(no_args, f"TypeError: {no_args} (raised natively)")
        items = tx.iterate(args[0]) if len(args) == 1 else args
        key = kwargs.get("key")
        if set(kwargs) <= {"key", "default"} and (key is None or not key.is_constant() or key.as_constant() is not None):
            if not items:
                if "default" in kwargs:
                    return kwargs["default"]
                from kiln.capture.variables.exception import raise_in_trace
                error = ValueError(f"{fn.__name__}() arg is an empty sequence")
                raise raise_in_trace(error, f"ValueError: {error} (raised natively)")
            if key is not None:
                # the first item whose key is largest (smallest), as Python picks it
                results = [key.call(tx, [item], {}) for item in items]
                if traced_numbers(results) or user_objects(results):
                    return items[fn(range(len(results)), key=lambda i: Ordered(tx, results[i]))]
                keys = [constant_of(result, f"{fn.__name__}() key") for result in results]
                best = native(fn, range(len(keys)), key=keys.__getitem__)  # keys eager cannot compare: its TypeError
                return items[best]
            kwargs = {}
        if kwargs:
            return fold_call(tx, fn, args, kwargs)
        if all(i.is_constant() for i in items):
            return tx.wrap_result(native(fn, [i.as_constant() for i in items]))
        if user_objects(items) and not any(isinstance(i, TensorVariable) for i in items):
            # instances of user classes: compared by their traced dunders, in eager's order
            return items[fn(range(len(items)), key=lambda i: Ordered(tx, items[i]))]
        if any(isinstance(i, TensorVariable) for i in items):
            if len(items) == 2 and all(isinstance(i, TensorVariable) for i in items):
                return tx.call_op("call_function", torch.maximum if fn is max else torch.minimum, items, {})
            raise Unsupported(f"{fn.__name__}() over tensors compares their values", kind="data_dependent_branch")
        if _one_number_kind(items):
            # sizes and numbers computed from them (torchvision's `min(image.shape[-2:])`): the
            # symbolic min/max, as torch.compile records it, where comparing would guard which
            # side is smaller and recompile when it flips. Of numbers of one kind only: min(2, 2.0)
            # is the int 2, the first of the equal ones.
            result = items[0]
            for item in items[1:]:
                result = tx.call_op("call_function", torch.sym_max if fn is max else torch.sym_min, [result, item], {})
            return result
        result = items[0]
        for item in items[1:]:
            result = tx.call_op("call_function", fn, [result, item], {})
        return result
    return rule


def _one_number_kind(items: list[Variable]) -> bool:
    """Symbolic numbers (some, not all, may be constants) that are all ints or all floats."""
    kinds = set()
    for item in items:
        if isinstance(item, SymIntVariable):
            kinds.add(item.python_type())
        elif item.is_constant() and type(item.as_constant()) in (int, float):
            kinds.add(type(item.as_constant()))
        else:
            return False
    return len(kinds) == 1 and kinds <= {int, float} and any(isinstance(i, SymIntVariable) for i in items)


RULES[min] = _minmax(min)
RULES[max] = _minmax(max)


@builtin_rule(sum)
def sum_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    items = tx.iterate(args[0])
    result = args[1] if len(args) > 1 else kwargs.get("start", ConstantVariable(0))
    for item in items:
        result = tx.binary_op("+", result, item)
    return result


def _anyall(fn: Any) -> Rule:
    def rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.iterator import open_iterator
        from kiln.capture.variables.lazy_itertools import is_made_on_demand

        if not is_made_on_demand(args[0]):
            return ConstantVariable(fn(i.truth(tx) for i in tx.iterate(args[0])))
        # read one item at a time and stop where eager's any/all stops: a generator's body must
        # not run past the deciding item (what it logs after it would show)
        decided_by = fn is any
        iterator = open_iterator(tx, args[0])
        item = iterator.next_item()
        while item is not None:
            if item.truth(tx) is decided_by:
                return ConstantVariable(decided_by)
            item = iterator.next_item()
        return ConstantVariable(not decided_by)
    return rule


RULES[any] = _anyall(any)
RULES[all] = _anyall(all)


_DUNDERS = {abs: "__abs__", round: "__round__"}


def _fold_or_dunder(fn: Any, tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """abs/round of an instance of a user class run its Python __abs__/__round__, pow(a, b) of
    one is `a ** b` (with the reflected __rpow__); the rest fold on constants or go in the graph."""
    if fn in _DUNDERS and args and user_objects(args[:1]):
        method = inspect.getattr_static(args[0].python_type(), _DUNDERS[fn], None)
        if isinstance(method, types.FunctionType):
            return args[0].call_method(tx, _DUNDERS[fn], args[1:], kwargs)
    if fn is pow and len(args) == 2 and not kwargs and user_objects(args):
        return tx.binary_op("**", args[0], args[1])
    if fn is pow and len(args) == 3 and not kwargs and isinstance(args[0], SymIntVariable) \
            and _int_constant(args[1]) and args[1].as_constant() >= 0 \
            and _int_constant(args[2]) and args[2].as_constant() != 0:
        # pow(size, k, m) of a non-negative k is (size ** k) % m exactly (the sign of m's, as %);
        # SymInt has no three-argument __pow__ for the graph to call
        return tx.binary_op("%", tx.binary_op("**", args[0], args[1]), args[2])
    return fold_call(tx, fn, args, kwargs)


def _int_constant(v: Variable) -> bool:
    return v.is_constant() and type(v.as_constant()) in (int, bool)


for _fn in (abs, round, pow, chr, ord, ascii, bin, hex, oct):
    RULES[_fn] = functools.partial(_fold_or_dunder, _fn)
RULES[operator.abs] = RULES[abs]  # the operator module's abs is the builtin's (a user __abs__ included)


@builtin_rule(divmod)
def divmod_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """divmod of a symbolic number is (a // b, a % b): torch.SymInt and SymFloat have no
    __divmod__ (folding it on fake values fails), and an int size's quotient and remainder stay
    symbolic rather than a graph per length (a float's are decided by `//` and `%` themselves)."""
    from kiln.capture.variables.sequence import TupleVariable

    def number(a: Variable) -> bool:
        if isinstance(a, SymIntVariable):
            return a.python_type() in (int, float)
        return a.is_constant() and type(a.as_constant()) in (int, float)

    if len(args) == 2 and not kwargs and all(number(a) for a in args) \
            and any(isinstance(a, SymIntVariable) for a in args):
        return TupleVariable([tx.binary_op("//", args[0], args[1]), tx.binary_op("%", args[0], args[1])])
    return fold_call(tx, divmod, args, kwargs)


@builtin_rule(hash)
def hash_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """hash() of a symbolic int, or of a tuple (a torch.Size) holding some: the hash needs the
    numbers, which are specialized (guarded), as torch.compile does; the rest as any fold."""
    from kiln.capture.variables.sequence import BaseSequenceVariable

    def number(item: Variable) -> Any:
        if isinstance(item, SymIntVariable) and item.python_type() is int:
            return tx.as_int(item)
        return item.as_constant() if item.is_constant() else None

    if len(args) == 1 and not kwargs:
        value = args[0]
        if isinstance(value, SymIntVariable) and value.python_type() is int:
            return ConstantVariable(hash(tx.as_int(value)))
        if isinstance(value, BaseSequenceVariable) and issubclass(value.python_type(), tuple) \
                and value.python_type().__hash__ is tuple.__hash__ \
                and any(isinstance(i, SymIntVariable) for i in value.items) \
                and all(i.is_constant() or isinstance(i, SymIntVariable) and i.python_type() is int
                        for i in value.items):
            return ConstantVariable(hash(tuple(number(i) for i in value.items)))
    return fold_call(tx, hash, args, kwargs)


def number_value(var: Variable) -> Callable[[], Any] | None:
    """For a symbolic number, or a tuple, Size or list of numbers: what gives its Python value
    (each symbol guarded equal to its value) when called; None for anything else."""
    if isinstance(var, SymIntVariable):
        return var.specialize
    if var.is_constant():
        value = var.as_constant()
        return (lambda: value) if isinstance(value, (int, float, bool)) else None
    if not isinstance(var, (TupleVariable, ListVariable)) or var.python_type() not in (tuple, list, torch.Size):
        return None
    kind: Callable[[Any], Any] = var.python_type()
    items = [number_value(item) for item in var.items]
    makers = [item for item in items if item is not None]
    if len(makers) != len(items):
        return None
    return lambda: kind(make() for make in makers)


def text_of(tx: "Tracer", value: Variable, name: str, spec: str = "") -> Variable:
    """str(value), repr(value) or format(value, spec) of a traced value that is not a constant: an
    exception's, or a user object's written in Python (object_protocol.python_text)."""
    from kiln.capture.variables.exception import ExceptionVariable
    from kiln.capture.variables.object_protocol import python_text
    from kiln.capture.variables.user_object import NewObjectVariable, ObjectVariable

    if isinstance(value, ExceptionVariable) and not spec:
        return value.call_method(tx, "__repr__" if name == "__repr__" else "__str__", [], {})
    number = number_value(value)
    if number is not None:
        return _size_text(tx, value, number, name, spec)
    instance = isinstance(value, NewObjectVariable) or isinstance(value, ObjectVariable) \
        and not isinstance(value.value, (type, types.ModuleType))
    text = python_text(tx, value, name, spec) if instance else None
    if text is None:
        raise Unsupported(f"{name.strip('_')}() of {value.describe()}", kind="unsupported_call")
    return ConstantVariable(text)


def _size_text(tx: "Tracer", value: Variable, number: Callable[[], Any], name: str, spec: str) -> Variable:
    """str/repr/format of a symbolic size or a Size (tuple, list) of sizes: made, the sizes guarded
    by value, only if the trace reads it; else the glue formats it after the graph."""
    converters: dict[str, Callable[[Any], str]] = {"__str__": str, "__repr__": repr}
    convert = converters.get(name) or (lambda v: format(v, spec))

    def text() -> str:
        with tx.output.shape_env.because(f"{name.strip('_')}() of a size needs its value (one graph per value)"):
            return convert(number())

    def render(glue: "GlueBuilder") -> str:
        made = glue.reconstruct(value)
        if name == "__format__":
            return f"{glue.constant(format)}({made}, {spec!r})"
        return f"{glue.constant(convert)}({made})"
    return DeferredTextVariable(text, render)


@builtin_rule(repr)
def repr_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    if len(args) == 1 and not kwargs and not args[0].is_constant():
        return text_of(tx, args[0], "__repr__")
    return fold_call(tx, repr, args, kwargs)


@builtin_rule(format)
def format_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    if 1 <= len(args) <= 2 and not kwargs and not args[0].is_constant() and all(a.is_constant() for a in args[1:]):
        return text_of(tx, args[0], "__format__", args[1].as_constant() if len(args) == 2 else "")
    return fold_call(tx, format, args, kwargs)


def _convert(kind: type) -> Rule:
    def rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.symint import SymIntVariable
        from kiln.capture.variables.tensor import TensorVariable

        if args and isinstance(args[0], TensorVariable):
            if args[0].constant is not None and len(args) == 1 and not kwargs:  # a known value (constant_fold)
                tx.output.guards.extend(args[0].constant_guards)
                return tx.wrap_result(kind(args[0].constant))
            raise Unsupported(f"{kind.__name__}() of a tensor reads its data", kind="item")
        if args and isinstance(args[0], SymIntVariable):
            if kind is bool:
                return ConstantVariable(args[0].truth(tx))
            if kind is str and len(args) == 1 and not kwargs:
                return _size_text(tx, args[0], args[0].specialize, "__str__", "")
            if kind is int and args[0].python_type() is float:
                # int(f) of a float argument stays symbolic (truncation, its sign guarded), as
                # torch.compile's torch.sym_int: `x[: int(n * f)]` needs no new graph per value
                return tx.call_op("call_function", torch.sym_int, args, {})
            if kind is int and args[0].python_type() is int and len(args) == 1:
                # int(n) of a symbolic int is n itself: `int(x.shape[0])` and an int() around an
                # .item() result (a resume function's argument) must not specialize the size
                return args[0]
            if kind is float and args[0].python_type() is int and len(args) == 1:
                # float(size) stays symbolic too (torch.sym_float): torchvision pads a batch to
                # `math.ceil(float(h) / stride) * stride`, which would else guard h's value
                return tx.call_op("call_function", torch.sym_float, args, {})
            return tx.call_op("call_function", kind, args, {})
        if kind is bool and len(args) == 1 and not kwargs and not args[0].is_constant():
            return ConstantVariable(args[0].truth(tx))  # __bool__, else __len__, as `if obj:` asks
        if kind in _NUMBER_DUNDERS and len(args) == 1 and not kwargs and user_objects(args):
            converted = _number_dunder(tx, kind, args[0])
            if converted is not None:
                return converted
        if kind is str and len(args) == 1 and not kwargs and not args[0].is_constant():
            number = number_value(args[0])
            if number is not None:  # str(x.shape)
                return _size_text(tx, args[0], number, "__str__", "")
        if kind is str and len(args) == 1 and not kwargs and type(_class_of(args[0])) is type:
            # "<class 'pkg.Model'>": a class the trace already relies on (guarded by type or id),
            # whose plain metaclass prints it from its module and name.
            return ConstantVariable(str(_class_of(args[0])))
        if kind is str and len(args) == 1 and not kwargs and not args[0].is_constant():
            return text_of(tx, args[0], "__str__")
        return fold_call(tx, kind, args, kwargs)
    return rule


# int(obj) and float(obj) of an instance of a user class ask its Python methods, in CPython's order
_NUMBER_DUNDERS = {int: ("__int__", "__index__"), float: ("__float__", "__index__")}
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not a C type


def _number_dunder(tx: "Tracer", kind: type, obj: Variable) -> Variable | None:
    """`int(obj)` / `float(obj)` through the first of the class's number methods it defines, inlined,
    with the result checked as CPython's number protocol checks it (a TypeError raised in the
    trace). None where a builtin base's slot or an unknown result is involved (the caller folds
    or breaks)."""
    from kiln.capture.variables.exception import raise_in_trace

    cls = obj.python_type()
    for name in _NUMBER_DUNDERS[kind]:
        method = inspect.getattr_static(cls, name, None)
        if method is None:
            continue
        if not isinstance(method, types.FunctionType):
            return None
        result = obj.call_method(tx, name, [], {})
        wanted = float if name == "__float__" else int
        got = result.as_constant() if result.is_constant() else None
        if not result.is_constant() and result.python_type() is not wanted:
            return None
        if result.is_constant() and type(got) is not wanted:
            if isinstance(got, wanted):
                return None  # a strict subclass of int or float: accepted with a DeprecationWarning
            owner = f"{cls.__name__}." if name == "__float__" else ""
            error = TypeError(f"{owner}{name} returned non-{wanted.__name__} (type {type(got).__name__})")
            raise raise_in_trace(error, f"TypeError: {error} (raised natively)")
        if wanted is kind:
            return result
        if result.is_constant():
            return ConstantVariable(kind(got))
        return tx.call_op("call_function", torch.sym_float, [result], {})  # float(obj) of a symbolic __index__
    # none of them: eager's TypeError, where no builtin base (a str's text, int's __trunc__ path) answers
    if all(base is object or base.__flags__ & _HEAP_TYPE for base in cls.__mro__) \
            and inspect.getattr_static(cls, "__trunc__", None) is None:
        accepted = "a string, a bytes-like object or a real number" if kind is int else "a string or a real number"
        error = TypeError(f"{kind.__name__}() argument must be {accepted}, not '{cls.__name__}'")
        raise raise_in_trace(error, f"TypeError: {error} (raised natively)")
    return None


def _class_of(var: Variable) -> Any:
    """The class a Variable stands for, when it stands for one (None otherwise)."""
    try:
        value = var.as_python_value()
    except Unsupported:
        return None
    return value if isinstance(value, type) else None


for _kind in (int, float, bool, str, complex):
    RULES[_kind] = _convert(_kind)
