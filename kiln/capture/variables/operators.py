"""Operators on tracked values: `binary_op`, `compare_op`, `subscript`, `contains`, `identity`, `unary_op`.

On constants an operator runs at trace time; on tensors or symbolic sizes it becomes a node
(`operator.add`, `operator.lt`, `operator.getitem`, ...); on containers it has the container's
meaning (concatenation, membership). In-place forms on tensors (`x += y`) record the in-place
operator so the caller's tensor changes as in eager. The layer above the kinds: it imports them,
they never import it (a kind that needs an operator asks the tracer: `tx.binary_op`, ...). The
opcodes that run these (BINARY_OP, COMPARE_OP, IS_OP, CONTAINS_OP, UNARY_*, subscripting) are in
opcodes/operations.py. Corresponds to the operator handlers of torch/_dynamo/symbolic_convert.py
and BuiltinVariable's operator rules.
"""
from __future__ import annotations

import collections
import inspect
import operator
import types
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture.guards import ABSENT
from kiln.capture.trace_rules import BUILTIN_RULES, BuiltinRule
from kiln.capture.variables.base import Variable
from kiln.capture.variables.builtin import BuiltinVariable
from kiln.capture.variables.constant import ConstantVariable, DeferredTextVariable
from kiln.capture.variables.deque import DequeVariable
from kiln.capture.variables.dict import DictVariable
from kiln.capture.variables.dict_view import DictViewVariable, involves_view, view_operator
from kiln.capture.variables.functions import UserFunctionVariable, UserMethodVariable
from kiln.capture.variables.numpy_array import NumpyArrayVariable, numpy_operator, numpy_unary
from kiln.capture.variables.object_id import ObjectIdVariable
from kiln.capture.variables.sequence import BaseSequenceVariable, ListVariable, TupleVariable
from kiln.capture.variables.sets import SetVariable
from kiln.capture.variables.symint import SymIntVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.capture.variables.user_object import NewObjectVariable, ObjectVariable
from kiln.capture.variables.iterator import open_iterator
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

BINARY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
          "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
          "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
          ">>": operator.rshift}
INPLACE = {"+": operator.iadd, "-": operator.isub, "*": operator.imul, "/": operator.itruediv,
           "//": operator.ifloordiv, "%": operator.imod, "**": operator.ipow, "@": operator.imatmul,
           "&": operator.iand, "|": operator.ior, "^": operator.ixor, "<<": operator.ilshift,
           ">>": operator.irshift}
BINARY_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%",
                  "pow": "**", "matmul": "@", "and_": "&", "or_": "|", "xor": "^", "lshift": "<<",
                  "rshift": ">>"}
COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
           ">=": operator.ge, "lt": operator.lt, "le": operator.le, "eq": operator.eq, "ne": operator.ne,
           "gt": operator.gt, "ge": operator.ge}


def _graph_values(*vs: Variable) -> bool:
    return any(isinstance(v, (TensorVariable, SymIntVariable)) for v in vs)


def _const(fn: Any, *vs: Variable) -> Variable:
    try:
        return _wrap(fn(*(v.as_constant() for v in vs)))
    except Exception as exc:
        from kiln.capture.variables.exception import raise_in_trace
        raise raise_in_trace(exc, f"{getattr(fn, '__name__', fn)} raised {type(exc).__name__}: {exc} (raised natively)") from exc


def _wrap(value: Any) -> Variable:
    from kiln.capture.variables.builder import wrap_result
    return wrap_result(value)


def binary_op(tx: "Tracer", symbol: str, a: Variable, b: Variable, inplace: bool = False) -> Variable:
    """`a <symbol> b` (or `a <symbol>= b`) on tracked values."""
    fn = INPLACE[symbol] if inplace else BINARY[symbol]
    if isinstance(a, NumpyArrayVariable) or isinstance(b, NumpyArrayVariable):
        return numpy_operator(tx, symbol, a, b, inplace)
    if involves_view(a, b):
        return view_operator(tx, symbol, a, b)  # in place too: `s = d.keys(); s |= x` rebinds s to a set
    if _python_type(a) is not None or _python_type(b) is not None:
        result = _python_binary(tx, symbol, a, b, inplace)
        if result is not None:
            return result
    if _graph_values(a, b):
        if inplace and not isinstance(a, TensorVariable):
            fn = BINARY[symbol]  # ints and SymInts are immutable: `n += 1` is `n = n + 1`
        numbers = all(isinstance(v, (SymIntVariable, ConstantVariable)) for v in (a, b))
        if numbers and symbol in _DIVISIONS and isinstance(b, SymIntVariable) \
                and isinstance(b.example, (torch.SymInt, torch.SymFloat)):
            if b.example.node.hint == 0:
                # this call divides by zero: the instruction runs natively and raises, after what the
                # frame did before it, as in eager (the divisor is guarded equal to 0)
                return _const(fn, *(ConstantVariable(v.specialize()) if isinstance(v, SymIntVariable) else v
                                    for v in (a, b)))
            tx.output.divisors.append(b.example.node.expr)  # tested before the graph runs
        if symbol == "//" and numbers and float in (a.python_type(), b.python_type()):
            # Python's float // goes through fmod (1.0 // 0.1 is 9.0), SymFloat's own `//` is
            # floor(1.0 / 0.1), 10.0: the graph calls Python's (SymFloat's `%` is Python's already).
            # Imported here for start-up time: kiln.symbolic.node loads sympy, which static captures never need.
            from kiln.symbolic.node import sym_floordiv
            fn = sym_floordiv
        if not all(isinstance(v, (TensorVariable, SymIntVariable, ConstantVariable)) for v in (a, b)):
            if isinstance(a, BaseSequenceVariable) or isinstance(b, BaseSequenceVariable):
                return _sequence_op(tx, symbol, a, b, inplace)
            raise Unsupported(f"{a.describe()} {symbol} {b.describe()}", kind="unsupported")
        return tx.call_op("call_function", fn, [a, b], {})
    if symbol == "+" and _concatenates_size_text(a, b):
        # `"rows: " + str(x.shape[0])`: still text the glue may format after the graph
        return DeferredTextVariable(lambda: a.as_constant() + b.as_constant(),
                                    lambda glue: f"({glue.reconstruct(a)} + {glue.reconstruct(b)})")
    if a.is_constant() and b.is_constant() and isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
        return _const(fn, a, b)
    if isinstance(a, (BaseSequenceVariable, DictVariable, SetVariable)):
        return _sequence_op(tx, symbol, a, b, inplace)
    if isinstance(b, BaseSequenceVariable) and symbol == "*":
        return _sequence_op(tx, symbol, b, a, False)
    if a.is_constant() and b.is_constant():
        return _const(fn, a, b)
    raise Unsupported(f"{a.describe()} {symbol} {b.describe()}", kind="unsupported")


_DIVISIONS = frozenset({"//", "%", "/"})


def _concatenates_size_text(a: Variable, b: Variable) -> bool:
    """Two strings, one of them formatted from sizes and not yet read by the trace."""
    return (isinstance(a, DeferredTextVariable) or isinstance(b, DeferredTextVariable)) and \
        all(isinstance(v, ConstantVariable) and v.python_type() is str for v in (a, b))


_BINARY_DUNDERS = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod",
                   "**": "pow", "@": "matmul", "&": "and", "|": "or", "^": "xor", "<<": "lshift", ">>": "rshift"}
# operands whose own method answers NotImplemented for a user object, so its reflected method runs
# (a str or bytes repeated by a user object with __index__ is the exception: left to the caller)
_PLAIN_NUMBERS = (bool, int, float, complex, str, bytes, type(None))


def _python_binary(tx: "Tracer", symbol: str, a: Variable, b: Variable, inplace: bool) -> Variable | None:
    """`a + b` (or `a += b`) where a user class defines the operator in Python, in CPython's order:
    `__iadd__` first for `+=`; then `a.__add__(b)`, then `b.__radd__(a)` (first when b's class is a
    proper subclass of a's that overrides it); NotImplemented moves on, and from all a TypeError.
    None when no Python method is involved (the caller goes on)."""
    stem = _BINARY_DUNDERS[symbol]
    left, right = _python_type(a), _python_type(b)
    if symbol == "*" and any(kind is not None and hasattr(kind, "__index__") for kind in (left, right)):
        return None
    if inplace and left is not None:
        method = _method(tx, a, f"__i{stem}__")
        if method is not None:
            result = UserMethodVariable(method, a).call(tx, [b], {})
            if not (result.is_constant() and result.as_constant() is NotImplemented):
                return result
    steps: list[tuple[Variable, str, Variable]] = []
    # a tensor or container operand: what its own method does with a user object is not modelled,
    # so when the user class's methods give NotImplemented the caller decides (a break)
    modelled = all(side is not None or v.is_constant() and type(v.as_constant()) in _PLAIN_NUMBERS
                   or _tensor_against_plain_object(v, left if v is b else right)
                   for side, v in ((left, a), (right, b)))
    if left is not None:
        steps.append((a, f"__{stem}__", b))
    elif not modelled:
        return None  # its own method comes first
    if right is not None and right is not left:
        reflected = (b, f"__r{stem}__", a)
        if left is not None and issubclass(right, left) and _method(tx, b, f"__r{stem}__") is not None:
            steps.insert(0, reflected)
        else:
            steps.append(reflected)
    found = False
    for receiver, name, other in steps:
        method = _method(tx, receiver, name)
        if method is None:
            continue
        found = True
        result = UserMethodVariable(method, receiver).call(tx, [other], {})
        if not (result.is_constant() and result.as_constant() is NotImplemented):
            return result
    if not modelled or not found and any(_python_has(receiver, name) for receiver, name, _ in steps):
        return None  # a builtin base's own method (a dict or int subclass), or a tensor's: the caller's
    from kiln.capture.variables.exception import raise_in_trace
    operator_text = f"{symbol}=" if inplace else "** or pow()" if symbol == "**" else symbol
    error = TypeError(f"unsupported operand type(s) for {operator_text}: "
                      f"'{a.python_type().__name__}' and '{b.python_type().__name__}'")
    raise raise_in_trace(error, f"TypeError: {error} (raised natively)")


def _tensor_against_plain_object(v: Variable, other: type | None) -> bool:
    """A tensor operand whose own method answers NotImplemented for the other operand: Tensor's
    binary dunders turn the TypeError of an argument that is neither a tensor nor a number into
    NotImplemented, so a user class's reflected method runs (`x + Wrapper(x)`). Not for a class
    with a __torch_function__ (torch dispatches to it) or a number-like one (__index__, __float__,
    __complex__: the argument parser may take it as a scalar)."""
    if not isinstance(v, TensorVariable) or other is None or issubclass(other, (torch.Tensor, dict)):
        return False
    return not any(hasattr(other, name) for name in ("__torch_function__", "__index__", "__float__", "__complex__",
                                                     "__int__", "__array__", "__len__", "__iter__", "__getitem__"))


def _python_has(v: Variable, name: str) -> bool:
    """The user class of `v` has `name` from a builtin base (its slot, not Python code)."""
    kind = _python_type(v)
    return kind is not None and inspect.getattr_static(kind, name, None) is not None


def _sequence_op(tx: "Tracer", symbol: str, a: Variable, b: Variable, inplace: bool) -> Variable:
    if symbol == "+" and isinstance(a, DequeVariable):
        if inplace:
            return a.call_method(tx, "__iadd__", [b], {})
        if isinstance(b, DequeVariable):
            return DequeVariable(a.items + b.items, a.maxlen)
    if symbol == "+" and isinstance(a, ListVariable) and isinstance(b, BaseSequenceVariable):
        if inplace:
            a.call_method(tx, "extend", [b], {})
            return a
        if isinstance(b, ListVariable):
            return ListVariable(a.items + b.items)
    if symbol == "+" and isinstance(a, TupleVariable) and isinstance(b, TupleVariable):
        # torch.Size's __add__ and __radd__ give a torch.Size (a namedtuple's give a plain tuple)
        kind = torch.Size if torch.Size in (a.tuple_type, b.tuple_type) else tuple
        return TupleVariable(a.items + b.items, kind)
    if symbol == "*" and isinstance(a, BaseSequenceVariable):
        if b.is_constant() and not hasattr(type(b.as_constant()), "__index__"):
            from kiln.capture.variables.exception import raise_in_trace
            error = TypeError(f"can't multiply sequence by non-int of type '{type(b.as_constant()).__name__}'")
            raise raise_in_trace(error, f"TypeError: {error} (raised natively)")
        count = tx.as_int(b)
        return a.rebuild(a.items * count) if not (inplace and isinstance(a, ListVariable)) else _extend_times(tx, a, count)
    if symbol == "|" and isinstance(a, DictVariable) and inplace:
        a.call_method(tx, "update", [b], {})  # dict.__ior__ takes what update takes: pairs too
        return a
    if symbol == "|" and isinstance(a, DictVariable) and isinstance(b, DictVariable):
        return _dict_union(tx, a, b)
    if isinstance(a, SetVariable):
        return a.binary(tx, symbol, b, inplace)
    raise Unsupported(f"{a.describe()} {symbol} {b.describe()}", kind="unsupported")


def _dict_union(tx: "Tracer", a: DictVariable, b: DictVariable) -> DictVariable:
    """`a | b` of builtin mappings: b's __ror__ first where b's class is a proper subclass of a's
    with its own (`dict | OrderedDict` is an OrderedDict); dict's method makes a plain dict,
    OrderedDict's and defaultdict's one of the receiver's class (a defaultdict keeps its factory)."""
    import collections

    receiver = a
    if b.dict_type is not a.dict_type and issubclass(b.dict_type, a.dict_type) \
            and getattr(b.dict_type, "__ror__") is not getattr(a.dict_type, "__ror__"):
        receiver = b
    owner = next(k for k in receiver.dict_type.__mro__ if k in (collections.OrderedDict, collections.defaultdict, dict))
    result = DictVariable({}, dict if owner is dict else receiver.dict_type)
    result.merge(tx, a.items)
    result.merge(tx, b.items)  # a key equal to one of a's (a user-hashed key) keeps a's key
    if issubclass(result.dict_type, collections.defaultdict):
        result.default_factory = receiver.default_factory
    return result


def _extend_times(tx: "Tracer", a: ListVariable, count: int) -> Variable:
    items = list(a.items)
    a.call_method(tx, "__setitem__", [ConstantVariable(slice(None)), ListVariable(items * count)], {})
    return a


def compare_op(tx: "Tracer", symbol: str, a: Variable, b: Variable) -> Variable:
    fn = COMPARE[symbol]
    if isinstance(a, NumpyArrayVariable) or isinstance(b, NumpyArrayVariable):
        return numpy_operator(tx, {"lt": "<", "le": "<=", "eq": "==", "ne": "!=", "gt": ">", "ge": ">="}
                              .get(symbol, symbol), a, b)
    if involves_view(a, b):
        return view_operator(tx, symbol, a, b)
    if symbol in ("==", "!=", "eq", "ne") and isinstance(a, BaseSequenceVariable) \
            and isinstance(b, BaseSequenceVariable) and not (a.is_constant() and b.is_constant()):
        # x.shape == y.shape with symbolic sizes: item by item, each decided (and guarded) now.
        equal = len(a.items) == len(b.items) and _sequence_kind(a) is _sequence_kind(b)
        if equal and _numbers_only(a.items, b.items):
            # sizes against sizes: two known numbers that differ decide it before any symbolic
            # pair is compared (and guarded), as the conjunction of the pairs would (Dynamo's
            # outcome), so `x.shape == (4, 9)` leaves a mark_dynamic dim 0 of size 4 alone
            equal = all(left.as_constant() == right.as_constant() for left, right in zip(a.items, b.items)
                        if left.is_constant() and right.is_constant())
        for left, right in zip(a.items, b.items):
            if not equal:
                break
            if _identity(left, right):
                continue  # CPython's container compare takes `is` for equal before calling __eq__
            equal = compare_op(tx, "==", left, right).truth(tx)
        return ConstantVariable(equal if symbol in ("==", "eq") else not equal)
    if symbol in _ORDERINGS and isinstance(a, BaseSequenceVariable) and isinstance(b, BaseSequenceVariable) \
            and not (a.is_constant() and b.is_constant()) and _sequence_kind(a) is _sequence_kind(b) \
            and _sequence_kind(a) in (tuple, list) and _builtin_ordering(a, symbol) and _builtin_ordering(b, symbol):
        return _sequence_order(tx, symbol, a, b)
    if isinstance(a, SetVariable) and isinstance(b, SetVariable):
        return ConstantVariable(a.compare(symbol, b))
    if _graph_values(a, b):
        if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
            return tx.call_op("call_function", fn, [a, b], {})
        if all(isinstance(v, (SymIntVariable, ConstantVariable)) for v in (a, b)):
            return tx.call_op("call_function", fn, [_plain_number(a), _plain_number(b)], {})
        if symbol in ("==", "!=", "eq", "ne"):
            return ConstantVariable((symbol in ("!=", "ne")))  # a tensor never equals a container
        raise Unsupported(f"{a.describe()} {symbol} {b.describe()}", kind="unsupported")
    if a.is_constant() and b.is_constant():
        return _const(fn, a, b)
    compared = _python_compare(tx, symbol, a, b)
    if compared is not None:
        return compared
    if symbol in ("==", "!=", "eq", "ne"):
        same = _equal(a, b)
        if same is None and (_sequence_and_scalar(a, b) or _sequence_and_scalar(b, a)):
            same = False  # a tuple or list never equals a str or a number (`case "relu":` on a tuple)
        if same is not None:
            return ConstantVariable(same if symbol in ("==", "eq") else not same)
    raise Unsupported(f"{a.describe()} {symbol} {b.describe()}", kind="unsupported")


_ORDERINGS = ("<", "<=", ">", ">=", "lt", "le", "gt", "ge")


def _builtin_ordering(v: Variable, symbol: str) -> bool:
    """The sequence's class orders (and compares equal) as tuple or list do (no override of its own)."""
    kind, base = v.python_type(), _sequence_kind(v)
    names = (_DUNDERS[_SYMBOLS.get(symbol, symbol)], _REFLECTED[_DUNDERS[_SYMBOLS.get(symbol, symbol)]], "__eq__")
    return all(getattr(kind, n) is getattr(base, n) for n in names)


def _sequence_order(tx: "Tracer", symbol: str, a: BaseSequenceVariable, b: BaseSequenceVariable) -> Variable:
    """`a < b` of two tuples (or two lists) holding traced values, as CPython orders them: the
    first pair of items that are not equal (`is`, then `==`) decides with the operator itself (its
    result returned as it is); when one runs out first, the lengths decide. A heap entry
    `(priority, i, tensor)` is ordered by its numbers and never asks about the tensor."""
    for left, right in zip(a.items, b.items):
        if _identity(left, right):
            continue
        if not compare_op(tx, "==", left, right).truth(tx):
            return compare_op(tx, symbol, left, right)
    return _const(COMPARE[symbol], ConstantVariable(len(a.items)), ConstantVariable(len(b.items)))


def _numbers_only(*rows: list[Variable]) -> bool:
    """Every item a size or a plain number (no __eq__ of the user's, so the pairs can be compared
    in any order) and at least one of them symbolic."""
    symbolic = False
    for row in rows:
        for item in row:
            if isinstance(item, SymIntVariable):
                symbolic = True
            elif not (item.is_constant() and type(item.as_constant()) in (int, float, bool)):
                return False
    return symbolic


def _sequence_and_scalar(a: Variable, b: Variable) -> bool:
    return isinstance(a, BaseSequenceVariable) and isinstance(b, ConstantVariable) \
        and type(b.as_constant()) in (str, bytes, int, float, bool, complex, type(None))


_DUNDERS = {"==": "__eq__", "!=": "__ne__", "<": "__lt__", "<=": "__le__", ">": "__gt__", ">=": "__ge__"}
_REFLECTED = {"__eq__": "__eq__", "__ne__": "__ne__", "__lt__": "__gt__", "__le__": "__ge__",
              "__gt__": "__lt__", "__ge__": "__le__"}
_SYMBOLS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _python_compare(tx: "Tracer", symbol: str, a: Variable, b: Variable) -> Variable | None:
    """A comparison one operand's class defines in Python, run as CPython runs it: the left
    operand's method, then the right's reflected one when the left gave NotImplemented (first when
    the right's class is a subclass of the left's); `!=` from `__eq__` when only that is written.
    None when neither class has Python code for it."""
    name = _DUNDERS[_SYMBOLS.get(symbol, symbol)]
    order = [(a, name, b), (b, _REFLECTED[name], a)]
    left, right = _python_type(a), _python_type(b)
    if left is not None and right is not None and right is not left and issubclass(right, left) \
            and _method(tx, b, _REFLECTED[name]) is not None:
        order.reverse()
    found = False
    for receiver, method_name, other in order:
        method = _method(tx, receiver, method_name)
        if method is None and method_name == "__ne__" and _method(tx, receiver, "__eq__") is not None:
            # object.__ne__ inverts __eq__ (when that gives a bool)
            result = UserMethodVariable(_method(tx, receiver, "__eq__"), receiver).call(tx, [other], {})
            found = True
            if not (result.is_constant() and result.as_constant() is NotImplemented):
                return ConstantVariable(not result.truth(tx))
            continue
        if method is None:
            continue
        found = True
        result = UserMethodVariable(method, receiver).call(tx, [other], {})
        if not (result.is_constant() and result.as_constant() is NotImplemented):
            return result
    if not found:
        return None
    if name in ("__eq__", "__ne__"):  # both gave NotImplemented: identity, as object's
        same = _identity(a, b)
        if same is not None:
            return ConstantVariable(same == (name == "__eq__"))
    from kiln.capture.variables.exception import raise_in_trace
    error = TypeError(f"'{symbol}' not supported between these operands")
    raise raise_in_trace(error, f"TypeError: {error} (raised natively)")


def _python_type(v: Variable) -> type | None:
    if isinstance(v, DictVariable) and v.dict_type is not dict:
        return v.dict_type  # a dict subclass: Counter's `+`, `-`, `&`, `|` are Python methods
    if not isinstance(v, (ObjectVariable, NewObjectVariable)):
        return None
    kind = v.python_type()
    return None if isinstance(kind, type) and issubclass(kind, type) else kind


def _method(tx: "Tracer", v: Variable, name: str) -> Any:
    """The Python function `name` of the class of a user object (None for builtins' slots); what
    the lookup found is guarded on the class."""
    from kiln.capture.variables.functions import guard_class_attribute

    kind = _python_type(v)
    if kind is None or (isinstance(v, ObjectVariable) and isinstance(v.value, (type, types.ModuleType))):
        return None
    method = inspect.getattr_static(kind, name, ABSENT)
    guard_class_attribute(tx, kind, name, method)
    return method if isinstance(method, types.FunctionType) else None


def _sequence_kind(v: Variable) -> type:
    """What `==` compares a sequence as: tuples (namedtuples, torch.Size) equal tuples, lists
    equal lists, deques equal deques, and no kind equals another."""
    kind = v.python_type()
    return next((k for k in (tuple, list) if issubclass(kind, k)), kind)


def _identity(a: Variable, b: Variable) -> bool | None:
    """Whether a and b are the same object, when that is known at trace time."""
    if a is b:
        if isinstance(a, UserFunctionVariable):
            a.pin_identity()  # guarded by its code until now: `f is f` holds for this very object
        return True
    if isinstance(a, TensorVariable) and isinstance(b, TensorVariable):
        return a.example is b.example
    if isinstance(a, (TensorVariable, SymIntVariable)) or isinstance(b, (TensorVariable, SymIntVariable)):
        return False
    if isinstance(a, ObjectIdVariable) and isinstance(b, ObjectIdVariable):
        return _identity(a.target, b.target)  # `id(l) == id(m)`: as `l is m`, guarded alike
    if a.guard_identity is not None and b.guard_identity is not None:
        # two containers from outside: different Variables of mutable ones are different objects
        # now (the same list passed twice is one Variable), two tuples are what their real ones
        # are; guarded to stay so (`l is m` of two list arguments)
        real_a, real_b = getattr(a, "real", None), getattr(b, "real", None)
        same = real_a is real_b if real_a is not None and real_b is not None else False
        if a.python_type() is b.python_type() and b.source is not None:
            a.guard_identity(b.source, same)
        return same
    if type(a) is ListVariable and type(b) is ListVariable and (a.source is None or b.source is None):
        # a list made in the frame is no other list (two lists from outside may be one object
        # on the next call: that is not decided here, nothing guards it)
        return False
    try:
        same = a.as_python_value() is b.as_python_value()
    except Unsupported:
        pass
    else:
        _pin_identities(a, b)
        return same
    mine, theirs = a.identity(), b.identity()
    _pin_identities(a, b)
    if mine is not None and theirs is not None:
        return mine is theirs  # objects made in the frame (the Variable is the object), containers
    if type(a) is not type(b):
        return False
    return None


def _pin_identities(a: Variable, b: Variable) -> None:
    """Guard by identity the outside instances whose identity decided a comparison (they are
    guarded by type only until then): `arg is GLOBAL` must not hold for the next call's object.
    Against a constant or an object made in the frame the answer follows from the type alone."""
    for var, other in ((a, b), (b, a)):
        pin = getattr(var, "pin_identity", None)
        if pin is None or isinstance(var, UserFunctionVariable) or other.is_constant():
            continue
        real = other.identity()
        if real is not None and real is not other:
            pin()


def _equal(a: Variable, b: Variable) -> bool | None:
    """`a == b` when that is known at trace time without running a user `__eq__`: constants by
    value, then identity, which decides inequality only for types that compare by identity (a
    string from `device.type` equals the literal "cpu" without being the same object)."""
    if a.is_constant() and b.is_constant():
        return bool(a.as_constant() == b.as_constant())
    same = _identity(a, b)
    if same or same is None:
        return same
    if isinstance(a, ObjectIdVariable) and isinstance(b, ObjectIdVariable):
        return False  # the ids of two different objects
    if _tensor_and_number(a, b) or _tensor_and_number(b, a):
        return None  # `tensor == 3`, `t1 == t2` are elementwise: the truth is the tensor's (ambiguous, or data-dependent)
    if _symbolic_and_number(a, b) or _symbolic_and_number(b, a):
        return None  # `x.shape[0] == 3`: the ShapeEnv decides it (and guards it), not the hint
    if isinstance(a, (TensorVariable, SymIntVariable)) or isinstance(b, (TensorVariable, SymIntVariable)):
        return False  # a tensor never equals None, a str, a container or an object
    return False if _compares_by_identity(a) and _compares_by_identity(b) else None


def decided_equal(tx: "Tracer", a: Variable, b: Variable) -> bool | None:
    """`_equal`, and a size against a number (`x.shape[0] in (3, 4)` asks `s0 == 3`) decided by the
    ShapeEnv, which guards the answer (the hint alone would hold for this size only)."""
    same = _equal(a, b)
    if same is None and (_symbolic_and_number(a, b) or _symbolic_and_number(b, a)
                         or _plain_sequence(a) and _plain_sequence(b)):
        same = compare_op(tx, "==", b, a).truth(tx)  # `x.shape in [(4, 2), (7, 2)]`: item by item
    return same


def _plain_sequence(v: Variable) -> bool:
    return isinstance(v, (TupleVariable, ListVariable)) and v.python_type() in (tuple, list, torch.Size)


def _symbolic_and_number(a: Variable, b: Variable) -> bool:
    if not isinstance(a, SymIntVariable):
        return False
    if isinstance(b, SymIntVariable):
        return True
    return b.is_constant() and isinstance(b.as_constant(), (int, float, complex))  # an IntEnum member too


def _plain_number(v: Variable) -> Variable:
    """An int or float subclass's constant (an IntEnum member) as the plain number it compares as:
    a SymInt compared with an IntEnum member answers NotImplemented both ways (then `is`: False)."""
    if isinstance(v, ConstantVariable) and type(v.value) not in (int, float, bool) \
            and isinstance(v.value, (int, float)) and not isinstance(v.value, bool):
        return ConstantVariable(int(v.value) if isinstance(v.value, int) else float(v.value))
    return v


def _tensor_and_number(a: Variable, b: Variable) -> bool:
    if not isinstance(a, TensorVariable):
        return False
    if isinstance(b, (SymIntVariable, TensorVariable)):
        return True
    return b.is_constant() and type(b.as_constant()) in (int, float, bool, complex)


def _compares_by_identity(v: Variable) -> bool:
    try:
        kind = v.python_type()
    except Unsupported:
        return False
    return kind.__eq__ is object.__eq__ or v.is_constant() and kind in (type(None), bool)


def subscript(tx: "Tracer", obj: Variable, key: Variable) -> Variable:
    """`obj[key]`."""
    if isinstance(obj, TensorVariable):
        if isinstance(key, SymIntVariable) and key.python_type() is int:
            # `x[i]` with an int that became symbolic: Tensor.__getitem__ would take its __index__
            # (a guard on its value, a recompile per index); select keeps it a symbol in the graph
            return tx.call_op("call_function", torch.select, [obj, ConstantVariable(0), key], {})
        return tx.call_op("call_function", operator.getitem, [obj, key], {})
    if isinstance(obj, ConstantVariable) and key.is_constant():
        return _const(operator.getitem, obj, key)
    if isinstance(obj, (ObjectVariable, BuiltinVariable)) and _subscriptable_type(obj.as_python_value()):
        # `List[Tuple[int, int]]` (torchvision's torch.jit.annotate), `list[int]`: typing's
        # __getitem__ and __class_getitem__ are pure and cached, and their arguments are classes
        # and forms known at trace time, so the alias is made now, as the interpreter would,
        # instead of tracing typing's internals
        return tx.wrap(obj.as_python_value()[_type_argument(key)], None)
    return obj.call_method(tx, "__getitem__", [key], {})


def _is_typing_form(value: Any) -> bool:
    return type(value).__module__ == "typing" or isinstance(value, (types.GenericAlias, types.UnionType))


def _subscriptable_type(value: Any) -> bool:
    """A typing form, or a builtin or collections class whose `cls[...]` makes a generic alias."""
    if _is_typing_form(value):
        return True
    return isinstance(value, type) and value.__module__ in ("builtins", "collections", "collections.abc") \
        and any("__class_getitem__" in vars(base) for base in value.__mro__)  # OrderedDict: dict's


def _type_argument(var: Variable) -> Any:
    """The real argument of a typing subscript: classes, forms, None, `...`, forward-reference
    strings, and tuples of them; Unsupported for anything computed in the trace."""
    if isinstance(var, TupleVariable):
        return tuple(_type_argument(item) for item in var.items)
    value = var.as_python_value()
    if value is None or value is Ellipsis or isinstance(value, (type, str)) or _is_typing_form(value):
        return value
    raise Unsupported(f"subscripting a typing form with {var.describe()}", kind="unsupported")


def identity(a: Variable, b: Variable) -> bool:
    """`a is b` at trace time (also operator.is_ / is_not)."""
    same = _identity(a, b)
    if same is None:
        raise Unsupported(f"`is` between {a.describe()} and {b.describe()}", kind="unsupported")
    return same


def contains(tx: "Tracer", container: Variable, item: Variable) -> bool:
    """`item in container` at trace time (also operator.contains)."""
    if isinstance(container, (DictVariable, SetVariable, DictViewVariable)):
        result = container.call_method(tx, "__contains__", [item], {}).as_constant()
    elif isinstance(container, ConstantVariable) and item.is_constant():
        result = item.as_constant() in container.as_constant()
    elif isinstance(container, TensorVariable):
        raise Unsupported("`in` on a tensor compares its values", kind="data_dependent_branch")
    elif isinstance(container, (ObjectVariable, NewObjectVariable)) and _python_contains(container) is not None:
        # A mapping class (collections.abc.Mapping's __contains__ reads self[key]): `in` calls it.
        found = UserMethodVariable(_python_contains(container), container).call(tx, [item], {})
        result = found.truth(tx)
    elif (module_result := _module_contains(tx, container, item)) is not None:
        result = module_result
    else:
        # stepped one item at a time: a user iterator stops being read at the first match, as in eager
        iterator = open_iterator(tx, container)
        result = False
        candidate = iterator.next_item()
        while candidate is not None:
            if _matches(tx, item, candidate):
                result = True
                break
            candidate = iterator.next_item()
    return bool(result)


def _module_contains(tx: "Tracer", container: Variable, item: Variable) -> bool | None:
    """`item in module` through the module class's own `__contains__`; None for any other value."""
    from kiln.capture.variables.module import NNModuleVariable
    return container.contains(tx, item) if isinstance(container, NNModuleVariable) else None


def _matches(tx: "Tracer", item: Variable, candidate: Variable) -> bool:
    """`candidate is item or candidate == item`, as `in`, list.index and operator.countOf ask it."""
    if _unequal_to_itself(item) and _unequal_to_itself(candidate):
        # a NaN is in a list that holds that very float (`is` is asked first), and in no other;
        # two from outside are guarded to stay one object, or two
        identical = item.as_constant() is candidate.as_constant()
        if item.source is not None and candidate.source is not None and item.source != candidate.source:
            from kiln.capture.variables.builder import _guard_identity
            _guard_identity(tx.state, item.source, candidate.source, identical)
        return identical
    same = decided_equal(tx, item, candidate)
    if same is None and (_python_type(candidate) is not None or _python_type(item) is not None) \
            and _identity(item, candidate) is False:
        # a user __eq__: CPython asks `candidate == item` (after identity), traced
        same = compare_op(tx, "==", candidate, item).truth(tx)
    if same is None:
        raise Unsupported(f"comparing {item.describe()} with the items of a container", kind="unsupported")
    return bool(same)


def _unequal_to_itself(v: Variable) -> bool:
    if not v.is_constant():
        return False
    value = v.as_constant()
    return type(value) in (float, complex) and value != value


def _count_or_index(tx: "Tracer", name: str, container: Variable, item: Variable) -> Variable:
    """operator.countOf / operator.indexOf: the container read one item at a time, as in eager
    (indexOf stops at the first match; an iterator is left after it)."""
    from kiln.capture.variables.exception import raise_in_trace
    iterator = open_iterator(tx, container)
    count = 0
    candidate = iterator.next_item()
    while candidate is not None:
        if _matches(tx, item, candidate):
            if name == "indexOf":
                return ConstantVariable(count)
            count += 1
        elif name == "indexOf":
            count += 1
        candidate = iterator.next_item()
    if name == "indexOf":
        message = "sequence.index(x): x not in sequence"
        raise raise_in_trace(ValueError(message), f"{message} (raised natively)")
    return ConstantVariable(count)


def _python_contains(container: "ObjectVariable | NewObjectVariable") -> Any:
    """The class's `__contains__` when it is Python code (None for builtins and classes without one)."""
    kind = _python_type(container)
    contains = None if kind is None else inspect.getattr_static(kind, "__contains__", None)
    return contains if isinstance(contains, types.FunctionType) else None


_UNARY_DUNDERS = {operator.neg: "__neg__", operator.pos: "__pos__", operator.invert: "__invert__"}


def unary_op(tx: "Tracer", fn: Any, value: Variable) -> Variable:
    """`fn(value)` for a unary operator (operator.neg, pos, invert) on a tracked value."""
    method = _method(tx, value, _UNARY_DUNDERS[fn]) if fn in _UNARY_DUNDERS and _python_type(value) else None
    if method is not None:  # `-v` of a user class with a Python __neg__
        return UserMethodVariable(method, value).call(tx, [], {})
    if isinstance(value, NumpyArrayVariable):
        return numpy_unary(tx, fn, value)
    if fn is operator.invert and isinstance(value, SymIntVariable) and value.python_type() is int:
        # torch.SymInt has no __invert__ (eager would take its value): ~n is -n - 1 for every int
        negated = tx.call_op("call_function", operator.neg, [value], {})
        return tx.call_op("call_function", operator.sub, [negated, ConstantVariable(1)], {})
    if isinstance(value, (TensorVariable, SymIntVariable)):
        return tx.call_op("call_function", fn, [value], {})
    return _const(fn, value)


# The operator module's functions behave like the operators themselves: their builtin rules (see
# variables/builtin.py) are registered here, with the operators.
def _operator_rule(name: str) -> BuiltinRule:
    def rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        if len(args) != 2 or kwargs:
            raise Unsupported(f"operator.{name} with {len(args)} arguments (raised natively)", kind="unsupported_call")
        if name == "getitem":
            return subscript(tx, args[0], args[1])
        if name == "contains":
            return ConstantVariable(contains(tx, args[0], args[1]))
        if name in ("countOf", "indexOf"):
            return _count_or_index(tx, name, args[0], args[1])
        if name in ("is_", "is_not"):
            return ConstantVariable(identity(args[0], args[1]) == (name == "is_"))
        if name == "concat":
            return binary_op(tx, "+", args[0], args[1])
        plain = {"iand": "and_", "ior": "or_"}.get(name, name[1:])
        if name.startswith("i") and plain in BINARY_SYMBOLS:  # iadd(a, b): `a += b`, then a
            return binary_op(tx, BINARY_SYMBOLS[plain], args[0], args[1], inplace=True)
        if name == "iconcat":
            return binary_op(tx, "+", args[0], args[1], inplace=True)
        if name in BINARY_SYMBOLS:
            return binary_op(tx, BINARY_SYMBOLS[name], args[0], args[1])
        return compare_op(tx, name, args[0], args[1])
    return rule


def _item_write_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable], name: str) -> Variable:
    """operator.setitem(obj, key, value) / operator.delitem(obj, key): `obj[key] = value` / `del obj[key]`."""
    if kwargs or len(args) != (3 if name == "setitem" else 2):
        raise Unsupported(f"operator.{name} with {len(args)} arguments (raised natively)", kind="unsupported_call")
    obj, key = args[0], args[1]
    if name == "setitem" and isinstance(obj, TensorVariable):
        tx.call_op("call_function", operator.setitem, [obj, key, args[2]], {})
    elif name == "setitem":
        obj.call_method(tx, "__setitem__", [key, args[2]], {})
    else:
        obj.call_method(tx, "__delitem__", [key], {})
    return ConstantVariable(None)


BUILTIN_RULES[operator.setitem] = lambda tx, args, kwargs: _item_write_rule(tx, args, kwargs, "setitem")
BUILTIN_RULES[operator.delitem] = lambda tx, args, kwargs: _item_write_rule(tx, args, kwargs, "delitem")

# Sized builtin containers: operator.length_hint of one is its len() (as CPython asks len() first)
_SIZED = (list, tuple, dict, set, frozenset, str, bytes, range, collections.OrderedDict,
          collections.defaultdict, collections.deque)


def _length_hint_rule(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    if not args or len(args) > 2 or kwargs or args[0].python_type() not in _SIZED:
        raise Unsupported("operator.length_hint of a value without a known size", kind="unsupported_call")
    return BUILTIN_RULES[len](tx, [args[0]], {})


BUILTIN_RULES[operator.length_hint] = _length_hint_rule


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_", "xor",
              "lshift", "rshift", "getitem", "lt", "le", "eq", "ne", "gt", "ge", "contains", "is_", "is_not",
              "countOf", "indexOf", "concat", "iconcat", "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "imatmul",
              "iand", "ior", "ixor", "ilshift", "irshift"):
    BUILTIN_RULES[getattr(operator, _name)] = _operator_rule(_name)
