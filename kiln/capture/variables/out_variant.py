"""Calls with `out=`: `torch.mul(x, 2, out=buf)`, `torch.max(x, 0, out=(values, indices))`.

Capture keeps the call as it is, one `call_function` node whose `out` keyword names the tensors
it writes, so every backend sees eager's op: the eager backend runs it, and AOT autograd's
functionalization turns the ATen `.out` overload into the functional op plus a write of the new
value into the out tensor (an input mutation when the out tensor is a graph input). The call's
result is the out tensor itself (`torch.add(a, b, out=c) is c`), or a structseq of the out
tensors, as in eager. Torch.compile's counterpart is the `out=` branch of
torch/_dynamo/variables/torch.py (TorchInGraphFunctionVariable.call_function).
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Sequence

import torch

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.sequence import BaseSequenceVariable, TupleVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

# Reductions whose out= variant computes in out's dtype when no dtype is given (eager's
# `torch.sum(x32, 0, out=o64)` accumulates in float64). The functional op that AOT autograd's
# functionalization substitutes would accumulate in x's dtype and only then cast, so capture
# states the dtype eager infers.
_DTYPE_FROM_OUT = frozenset({torch.sum, torch.nansum, torch.mean, torch.prod, torch.cumsum, torch.cumprod})
_RESIZE_HINT = ("give the out= tensor the result's shape before the call (or drop out= and write "
                "`buf.copy_(f(x))`), so that the compiled graph need not resize one of its inputs")


def has_out_argument(kwargs: dict[str, Variable]) -> bool:
    """True for a call that passes a tensor (or tensors) as `out=` (`out=None` is the plain call)."""
    return not _absent(kwargs.get("out"))


def call_with_out(tx: "Tracer", fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """Record `fn(*args, **kwargs)` whose `out=` names existing tensors; return what eager returns.

    Eager's own checks (the result's dtype must be castable to out's, no out= under autograd, out
    overlapping an input ...) happen when the op runs on the fakes: a failure there is a graph
    break, and the call then raises eager's error natively.
    """
    targets = _out_tensors(kwargs["out"])
    if fn in _DTYPE_FROM_OUT and len(targets) == 1 and _absent(kwargs.get("dtype")):
        kwargs = dict(kwargs, dtype=ConstantVariable(targets[0].example.dtype))
    before = [_layout(t.example) for t in targets]
    with warnings.catch_warnings():
        # The fake run resizes as eager does and so repeats eager's deprecation warning for a
        # non-empty out tensor of the wrong size; the user sees eager's own when the op runs.
        warnings.filterwarnings("ignore", message="An output with one or more elements was resized")
        result = tx.call_op("call_function", fn, list(args), kwargs)
    for target, layout in zip(targets, before):
        if _layout(target.example) != layout and not _made_in_graph(target):
            # The fake of a graph input (or of a view of one) was just resized: the graph would
            # have to change an input's shape, which AOT autograd does not support; torch.compile
            # breaks here too. Eager resizes (and warns when the tensor was not empty).
            raise Unsupported(
                f"{_name(fn)}(..., out=) resizes {target.describe()} from {list(layout[0])} to "
                f"{list(target.example.shape)}, a tensor that existed before the compiled region",
                kind="input_metadata_mutation", hint=_RESIZE_HINT)
    return _returned(result, targets)


def _absent(value: Variable | None) -> bool:
    return value is None or (isinstance(value, ConstantVariable) and value.value is None)


def _out_tensors(out: Variable) -> list[TensorVariable]:
    if isinstance(out, TensorVariable):
        return [out]
    if isinstance(out, BaseSequenceVariable) and out.items and all(isinstance(i, TensorVariable) for i in out.items):
        return list(out.items)  # type: ignore[arg-type]
    raise Unsupported(f"out= given {out.describe()}, not a tensor or a tuple of tensors (raised natively)",
                      kind="unsupported_call")


def _layout(t: torch.Tensor) -> tuple[tuple[Any, ...], tuple[Any, ...], Any]:
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


def _made_in_graph(target: TensorVariable) -> bool:
    """An out tensor the graph itself created (`torch.empty(0)` in the frame) may be resized in it."""
    return target.source is None and target.node.op != "placeholder" and not target.example._is_view()


def _returned(result: Variable, targets: list[TensorVariable]) -> Variable:
    """The out tensors themselves where the op returned them (eager returns the same objects)."""
    if len(targets) == 1 and isinstance(result, TensorVariable):
        return targets[0] if result.example is targets[0].example else result
    if isinstance(result, TupleVariable) and len(result.items) == len(targets):
        items = [t if isinstance(r, TensorVariable) and r.example is t.example else r
                 for r, t in zip(result.items, targets)]
        return TupleVariable(items, result.tuple_type)
    return result


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


__all__ = ["call_with_out", "has_out_argument"]
