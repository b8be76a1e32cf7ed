"""In-place ops and out= that read the memory they write through another tensor.

A functional graph reads every element an op needs before it writes any; eager does not always:
- ops that check (TensorIterator's partial-overlap check, `assert_no_overlap` of index_put_,
  scatter_, index_copy_, take ...) refuse with "some elements of the input tensor and the written-to
  tensor refer to a single memory location";
- ops whose operands it cannot judge (an expanded or diagonal read, `x.mul_(x[:, :1])`,
  `x.sub_(x.diagonal())`) are computed element by element in its own order, a later element reading
  what an earlier one wrote;
- a few read a whole operand that is the written tensor itself in their own order
  (`x.masked_scatter_(m, x)`, `torch.bmm(x, x, out=x)`).
`aliased_read` names the read that makes a call a graph break (the call then runs eagerly: eager's
result, or eager's error); None where the graph computes what eager does: no read meets the
written memory, or the read is the written tensor itself (the same elements in the same order)
of an elementwise op, or of one of the few other ops measured to read a full alias of their output
before writing it.
No PyTorch counterpart: Dynamo traces these, and AOT's functionalization reads before writing.
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch

from kiln.runtime.overlap import elements_meet, same_elements

# Ops not tagged pointwise that still give, with an operand that is their output itself, the result
# of reading it first (eager copies or scans in order): each measured in tests/lower/test_dyntensor3_programs.py.
_FULL_ALIAS_SAFE = frozenset({"copy_", "cumsum", "cumsum_", "cumprod", "cumprod_", "logcumsumexp", "cummax", "cummin",
                              "mm", "addmm", "addmm_", "sort"})

_OPERATOR_NAMES = {operator.iadd: "add_", operator.isub: "sub_", operator.imul: "mul_", operator.itruediv: "div_",
                   operator.ifloordiv: "floor_divide_", operator.imod: "remainder_", operator.ipow: "pow_",
                   operator.iand: "bitwise_and_", operator.ior: "bitwise_or_", operator.ixor: "bitwise_xor_",
                   operator.ilshift: "bitwise_left_shift_", operator.irshift: "bitwise_right_shift_"}


def _op_name(kind: str, target: Any) -> str:
    if kind == "call_method" and isinstance(target, str):
        return target
    if isinstance(target, type(operator.iadd)) and target in _OPERATOR_NAMES:  # a hashable builtin
        return _OPERATOR_NAMES[target]
    return str(getattr(target, "__name__", ""))


def _reads_full_alias_first(name: str) -> bool:
    """Whether op `name` gives the functional result when an operand is its output itself."""
    if name in _FULL_ALIAS_SAFE:
        return True
    packet = getattr(torch.ops.aten, name, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return False
    # its tensor overloads are tagged pointwise (not the list and scalar ones: `mul_.t`, `mul.int`)
    return any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())


def _reads(kind: str, target: Any, args: Sequence[Any], kwargs: dict[str, Any],
           written: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors a call reads: its tensor arguments but the written positions (the receiver of an
    in-place method or function, `out=`); the same tensor passed again elsewhere is a read."""
    positional = list(args)
    out = kwargs.get("out")
    outs = out if isinstance(out, (list, tuple)) else (out,)
    receiver = [w for w in written if not any(w is o for o in outs)]  # `self` of an in-place op
    if positional and isinstance(positional[0], torch.Tensor) and any(positional[0] is w for w in receiver):
        positional = positional[1:]
    found: list[torch.Tensor] = []
    for key, value in [*((None, v) for v in positional), *kwargs.items()]:
        if key == "out":
            continue
        items = value if isinstance(value, (list, tuple)) else (value,)
        if isinstance(value, (list, tuple)) and any(any(i is w for w in written) for i in items):
            continue  # a foreach op's written list
        found += [i for i in items if isinstance(i, torch.Tensor)]
    return found


def aliased_read(kind: str, target: Any, destinations: Sequence[torch.Tensor], written: Sequence[torch.Tensor],
                 args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (read, destination) pair that makes this write a graph break, or None (module docstring)."""
    name = _op_name(kind, target)
    for read in _reads(kind, target, args, kwargs, written):
        if read.layout != torch.strided:
            continue
        for dest in destinations:
            if dest.layout != torch.strided or not elements_meet(dest, read):
                continue
            if same_elements(dest, read) and tuple(read.shape) == tuple(dest.shape) and _reads_full_alias_first(name):
                continue
            return read, dest
    return None
