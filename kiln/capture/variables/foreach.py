"""`torch._foreach_*` calls whose scalar is a tensor, traced as one op per list element.

torch.optim's multi-tensor (`foreach=True`) updates pass their step sizes as tensors under
compilation (`_foreach_addcdiv_(params, exp_avgs, denoms, step_sizes)` with `step_sizes` a 1-d
tensor, one per parameter). ATen implements those overloads by reading the tensor's values into a
list of numbers, which neither a fake tensor nor functionalization can do. As Dynamo's polyfills
do, capture spells such a call as the per-tensor ops it stands for (`p.addcdiv_(a, d, value=s[i])`
for each i): the same arithmetic, in the graph. Foreach calls with plain numbers stay one node
(the lowering splits them per tensor where it fuses them).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.dict import DictVariable
from kiln.capture.variables.sequence import ListVariable, TupleVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.capture.variables.torch import CALL_RULES
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

_PREFIX = "_foreach_"
# Ops whose tensor scalar holds one number per list element (their `.Tensor` overload's `scalars`)
_PER_ELEMENT_SCALARS = frozenset({"addcdiv", "addcmul"})


def is_foreach_with_tensor_scalar(fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> bool:
    name = getattr(fn, "__name__", "")
    if not name.startswith(_PREFIX) or getattr(fn, "__module__", None) not in ("torch", None):
        return False
    if fn is not getattr(torch, name, None):
        return False
    return any(isinstance(a, TensorVariable) for a in [*args, *kwargs.values()])


def call_foreach_per_tensor(tx: "Tracer", fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`torch._foreach_<op>[_](lists..., scalar)` as `lists[0][i].<op>[_](...)` for each i."""
    name = fn.__name__[len(_PREFIX):]
    base = name.rstrip("_")
    if not args or not isinstance(args[0], (ListVariable, TupleVariable)):
        raise Unsupported(f"torch.{fn.__name__} without a list of tensors first", kind="unsupported_call")
    n = len(args[0].items)
    lists = [a for a in args if isinstance(a, (ListVariable, TupleVariable))]
    if any(len(lst.items) != n for lst in lists):
        raise Unsupported(f"torch.{fn.__name__} on lists of different lengths (raised natively)", kind="unsupported_call")

    def element(value: Variable, i: int) -> Variable:
        if isinstance(value, (ListVariable, TupleVariable)):
            return value.items[i]
        if isinstance(value, TensorVariable) and base in _PER_ELEMENT_SCALARS and value.example.dim() == 1:
            if value.example.shape[0] != n:
                raise Unsupported(f"torch.{fn.__name__} with {value.example.shape[0]} scalars for {n} tensors "
                                  "(raised natively)", kind="unsupported_call")
            return tx.call_op("call_function", torch.select, [value, ConstantVariable(0), ConstantVariable(i)], {})
        return value

    results = []
    for i in range(n):
        first, *rest = [element(a, i) for a in args]
        named = {k: element(v, i) for k, v in kwargs.items()}
        if base in _PER_ELEMENT_SCALARS and len(rest) == 3:
            named["value"] = rest.pop()  # the schema's positional `scalars` is the method's `value=`
        results.append(first.call_method(tx, name, rest, named))
    if name.endswith("_"):
        return ConstantVariable(None)
    return ListVariable(results)


__all__ = ["call_foreach_per_tensor", "is_foreach_with_tensor_scalar"]


def _foreach_rule(tx: "Tracer", fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable | None:
    return call_foreach_per_tensor(tx, fn, args, kwargs) if is_foreach_with_tensor_scalar(fn, args, kwargs) else None


CALL_RULES.append(_foreach_rule)


def _group_by_device_and_dtype(tx: "Tracer", fn: Any, args: Sequence[Variable],
                               kwargs: dict[str, Variable]) -> Variable | None:
    """`torch._C._group_tensors_by_device_and_dtype(lists, with_indices)`: which tensors of the
    first list share a device and dtype is metadata the trace knows (and the tensors' guards check),
    so the grouping is made now, as a dict of the same tensors. The real function decides the
    groups' order: it runs on empty stand-ins of each tensor's device and dtype."""
    if fn is not torch._C._group_tensors_by_device_and_dtype:
        return None
    names = ("tensorlistlist", "with_indices")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    if len(args) > 2 or set(bound) - set(names) or "tensorlistlist" not in bound:
        raise Unsupported(f"{fn.__name__} with these arguments (raised natively)", kind="unsupported_call")
    lists = bound["tensorlistlist"]
    with_indices = bound.get("with_indices", ConstantVariable(False))
    if not isinstance(lists, (ListVariable, TupleVariable)) or not with_indices.is_constant() \
            or not all(isinstance(lst, (ListVariable, TupleVariable)) for lst in lists.items):
        raise Unsupported(f"{fn.__name__} on lists not known at trace time", kind="unsupported_call")

    rows: list[list[Variable]] = [lst.items for lst in lists.items]  # type: ignore[attr-defined]

    def stand_in(item: Variable) -> Any:
        if isinstance(item, TensorVariable):
            return torch.empty(0, dtype=item.example.dtype, device=item.example.device)
        if item.is_constant() and item.as_constant() is None:
            return None
        raise Unsupported(f"{fn.__name__} on a list holding {item.describe()}", kind="unsupported_call")

    try:
        groups = fn([[stand_in(i) for i in row] for row in rows], True)
    except RuntimeError as error:  # eager raises the same at run time: the call runs there
        raise Unsupported(f"{fn.__name__} raises ({error}) (raised natively)", kind="unsupported_call") from error
    result: dict[Any, Variable] = {}
    for key, (_, indices) in groups.items():
        picked = [ListVariable([row[i] for i in indices] if row else []) for row in rows]
        order = [ConstantVariable(i) for i in indices] if with_indices.as_constant() else []
        result[key] = TupleVariable([ListVariable(picked), ListVariable(order)])
    return DictVariable(result)


CALL_RULES.append(_group_by_device_and_dtype)
