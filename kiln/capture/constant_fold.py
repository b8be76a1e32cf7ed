"""Tensors whose value capture knows: ops on Python numbers, folded as torch.compile folds them.

`torch.div(n, w, rounding_mode="trunc")` on Python ints (Longformer computes chunk counts this way)
makes a 0-d tensor that the code then uses as a size. The op stays in the graph, and its result
is also computed for real while tracing (eager's kernel, so eager's dtype, rounding and errors)
and kept on the TensorVariable as `constant`. Reading that tensor's value (`.item()`, `int(t)`,
`if t:`, an op that takes it as an int) then gives the real value instead of a break. An op that
fails on its fake inputs because it read a number out of such a tensor (`x.view(b, t, w)`) is
recorded again with the number in its place. The fold is sound because the value depends only on
trace-time constants, which capture guards like any other.

Only small results (one element) of functional ops in the tables below are folded. A constant
tensor handed to any other op loses its value (that op may alias or mutate it), as does one
written in place. Corresponds to the constant propagation of PyTorch's FakeTensor
(torch/_subclasses/fake_tensor.py, `constant` on small tensors made from scalars).
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch

from kiln.capture.guards import Guard
from kiln.capture.sources import CallSource, Source
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.dict import DictVariable
from kiln.capture.variables.sequence import ListVariable, TupleVariable
from kiln.capture.variables.tensor import TensorVariable

# Comparisons fold on trace-time constants only (a while_loop counter made in the frame), as
# torch.compile's fake-tensor constants do; a comparison with a guarded input value stays an op.
_COMPARISON_FUNCTIONS: frozenset[Any] = frozenset({
    torch.lt, torch.le, torch.gt, torch.ge, torch.eq, torch.ne, torch.logical_and, torch.logical_or,
    torch.logical_not, operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne,
})
_COMPARISON_METHODS: frozenset[str] = frozenset({
    "lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_not",
    "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__",
})
# Deterministic ops that make a new tensor (never random, in place, a view, or possibly the input
# itself, as `.long()` of a long tensor is).
FOLDABLE_FUNCTIONS: frozenset[Any] = frozenset({
    torch.div, torch.true_divide, torch.floor_divide, torch.remainder, torch.fmod, torch.add,
    torch.sub, torch.mul, torch.neg, torch.abs, torch.ceil, torch.floor, torch.trunc, torch.round,
    torch.clamp, torch.minimum, torch.maximum, torch.pow, torch.sqrt, torch.log2, torch.scalar_tensor,
    torch.tensor, operator.add, operator.sub, operator.mul, operator.truediv,
    operator.floordiv, operator.mod, operator.neg, operator.pow, operator.abs,
}) | _COMPARISON_FUNCTIONS
FOLDABLE_METHODS: frozenset[str] = frozenset({
    "add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "neg", "abs",
    "ceil", "floor", "trunc", "round", "clamp", "pow", "sqrt", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__neg__", "__pow__",
    "__rpow__",
}) | _COMPARISON_METHODS
_NUMEL_LIMIT = 1
_PLAIN_ARGS = (int, float, bool, complex, str, type(None), torch.dtype, torch.device)


def _leaves(var: Any) -> list[Any]:
    if isinstance(var, (TupleVariable, ListVariable)):
        return [leaf for item in var.items for leaf in _leaves(item)]
    if isinstance(var, DictVariable):
        return [leaf for item in var.items.values() for leaf in _leaves(item)]
    return [var]


def _real(var: Any) -> Any:
    if isinstance(var, TensorVariable):
        return var.constant
    if isinstance(var, TupleVariable):
        return tuple(_real(i) for i in var.items)
    if isinstance(var, ListVariable):
        return [_real(i) for i in var.items]
    return var.value


def _foldable_leaf(var: Any) -> bool:
    if isinstance(var, TensorVariable):
        return var.constant is not None
    return isinstance(var, ConstantVariable) and isinstance(var.value, _PLAIN_ARGS)


def _in_tables(kind: str, target: Any) -> bool:
    if kind == "call_function":
        return target in FOLDABLE_FUNCTIONS
    return kind == "call_method" and target in FOLDABLE_METHODS


def after_op(kind: str, target: Any, args: Sequence[Variable], kwargs: dict[str, Variable],
             example: Any) -> torch.Tensor | None:
    """After capture recorded an op: the real value of its result when every input is known (else
    None); an op outside the tables makes its tensor inputs' values unknown (it may alias or
    write them)."""
    if not _in_tables(kind, target):
        forget_inputs(args, kwargs)
        return None
    return fold(kind, target, args, kwargs, example)


def fold(kind: str, target: Any, args: Sequence[Variable], kwargs: dict[str, Variable],
         example: Any) -> torch.Tensor | None:
    """The real value of `target(*args, **kwargs)` when every input is known, else None."""
    if not _in_tables(kind, target) or not isinstance(example, torch.Tensor) or example.requires_grad:
        return None
    numel = example.numel()
    if not isinstance(numel, int) or numel > _NUMEL_LIMIT or example.device.type != "cpu":
        return None
    leaves = [leaf for v in [*args, *kwargs.values()] for leaf in _leaves(v)]
    if not all(_foldable_leaf(leaf) for leaf in leaves):
        return None
    if (target in _COMPARISON_FUNCTIONS or target in _COMPARISON_METHODS) and guards_of(args, kwargs):
        return None
    real_args = [_real(a) for a in args]
    real_kwargs = {k: _real(v) for k, v in kwargs.items()}
    if _may_trap(target, example, [*real_args, *real_kwargs.values()]):
        return None
    try:
        with torch.no_grad():
            if kind == "call_method":
                result = getattr(real_args[0], target)(*real_args[1:], **real_kwargs)
            else:
                result = target(*real_args, **real_kwargs)
    except Exception:  # e.g. an integer division by zero: the graph raises it at run time, as eager does
        return None
    if not isinstance(result, torch.Tensor) or result.shape != example.shape or result.dtype != example.dtype:
        return None
    return result


# Integer divisions: a divisor of -1 and the type's minimum as dividend overflow, which traps
# (SIGFPE) in some of ATen's CPU kernels (torch.div(..., rounding_mode="trunc") on int64 and int32):
# such ops are not folded while tracing; the compiled graph computes them without trapping.
_DIVISIONS = frozenset({torch.div, torch.floor_divide, torch.remainder, torch.fmod, operator.floordiv,
                        operator.mod, "div", "floor_divide", "remainder", "fmod", "__floordiv__",
                        "__rfloordiv__", "__mod__", "__rmod__"})


def _may_trap(target: Any, example: torch.Tensor, values: Sequence[Any]) -> bool:
    if target not in _DIVISIONS or example.dtype.is_floating_point or example.dtype.is_complex:
        return False
    for value in values:
        if isinstance(value, torch.Tensor) and not value.dtype.is_floating_point and bool((value == -1).any()):
            return True
        if isinstance(value, int) and not isinstance(value, bool) and value == -1:
            return True
    return False


def guards_of(args: Sequence[Variable], kwargs: dict[str, Variable]) -> tuple[Any, ...]:
    """The value guards of the known input tensors a folded result was computed from."""
    found: list[Any] = []
    for v in [*args, *kwargs.values()]:
        for leaf in _leaves(v):
            if isinstance(leaf, TensorVariable):
                found.extend(g for g in leaf.constant_guards if g not in found)
    return tuple(found)


def known_input(value: torch.Tensor, var: TensorVariable, source: Source) -> None:
    """A 0-d integer or bool tensor passed into the frame (Longformer's global-attention count,
    returned by one graph and passed to the next): its value is known while tracing. Code that
    reads it as a number (a size, `int(t)`, `if t:`) specializes on it, guarded by
    `source.item() == value` where it is read, as Dynamo makes a symbol of it instead of breaking."""
    if type(value) is not torch.Tensor or value.dim() != 0 or value.requires_grad or value.device.type != "cpu":
        return
    if value.dtype.is_floating_point or value.dtype.is_complex:
        return

    var.constant = value.detach().clone()
    var.constant_guards = (Guard(CallSource(source, "item").name(), "check_value", value.item()),)


def forget_inputs(args: Sequence[Variable], kwargs: dict[str, Variable]) -> None:
    """An op outside the tables may alias or write its tensor inputs: their values are no longer known."""
    for v in [*args, *kwargs.values()]:
        for leaf in _leaves(v):
            if isinstance(leaf, TensorVariable):
                leaf.constant = None


def with_numbers(args: Sequence[Variable], kwargs: dict[str, Variable], guards: list[Any]
                 ) -> tuple[list[Variable], dict[str, Variable]] | None:
    """`args` and `kwargs` with each known 0-d tensor replaced by its Python number (what the op
    read from it), or None when there is none to replace; the reads' guards go to `guards`."""
    replaced = False

    def swap(var: Any) -> Any:
        nonlocal replaced
        if isinstance(var, TensorVariable) and var.constant is not None and var.constant.dim() == 0:
            replaced = True
            guards.extend(var.constant_guards)
            return ConstantVariable(var.constant.item())
        if isinstance(var, TupleVariable):
            return TupleVariable([swap(i) for i in var.items], var.tuple_type)
        if isinstance(var, ListVariable):
            return ListVariable([swap(i) for i in var.items])
        return var

    new_args = [swap(a) for a in args]
    new_kwargs = {k: swap(v) for k, v in kwargs.items()}
    return (new_args, new_kwargs) if replaced else None


__all__ = ["FOLDABLE_FUNCTIONS", "FOLDABLE_METHODS", "after_op", "fold", "forget_inputs", "guards_of", "known_input", "with_numbers"]
