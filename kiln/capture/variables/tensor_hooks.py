"""`t.register_hook(fn)` during capture, on a tensor from outside the frame (an input, a
parameter).

The hook runs in the backward pass, after the frame has returned, so registering it once the graph
has run is what eager's registration inside the frame amounts to: it is a side effect the glue
replays (`t.register_hook(fn)`, fn rebuilt as any value is). The handle it returns is not
modelled: using it (`handle.remove()`, returning it) is a clean break. A hook on a tensor the
graph computes would have to run inside the graph's backward: a clean break too, as is a tensor
that does not require grad (eager's RuntimeError).

`t.retain_grad()` likewise: a no-op on a leaf (its leafness guarded), replayed after the graph on
a non-leaf from outside (the graph's gradient reaches it through its own grad_fn, so its .grad
counts that part too), eager's RuntimeError without requires_grad, and a clean break on a tensor
the graph computes: its .grad must count the gradient the graph's own uses send it, which only
reaches the compiled backward's inside.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.exception import raise_in_trace
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.tensor import TensorVariable


class HookHandleVariable(Variable):
    """The RemovableHandle a replayed registration returns: not known during the trace."""

    def describe(self) -> str:
        return "the handle of a tensor hook registered in the frame"

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        raise Unsupported(f"using {self.describe()} ({name})", kind="unsupported_call")

    def call_method(self, tx: "Tracer", name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        raise Unsupported(f"using {self.describe()} ({name})", kind="unsupported_call")

    def reconstruct(self, glue: "GlueBuilder") -> str:
        raise Unsupported(f"{self.describe()} kept past the graph", kind="reconstruct")


def register_hook(tx: "Tracer", tensor: "TensorVariable", args: Sequence[Variable],
                  kwargs: dict[str, Variable]) -> Variable:
    """`tensor.register_hook(hook)` (see the module docstring)."""
    if len(args) != 1 or kwargs:
        raise Unsupported("Tensor.register_hook with other than one hook argument", kind="unsupported_call")
    if tensor.source is None:
        raise Unsupported("Tensor.register_hook() on a tensor the graph computes (its hook would run inside the "
                          "graph's backward)", kind="unsupported_call")
    if not tensor.example.requires_grad:
        error = RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        raise raise_in_trace(error, f"RuntimeError: {error} (raised natively)")
    tx.side_effects.register_tensor_hook(tensor, args[0])
    return HookHandleVariable()


def retain_grad(tx: "Tracer", tensor: "TensorVariable", args: Sequence[Variable],
                kwargs: dict[str, Variable]) -> Variable:
    """`tensor.retain_grad()` (see the module docstring)."""
    if args or kwargs:
        raise Unsupported("Tensor.retain_grad with arguments", kind="unsupported_call")
    if not tensor.example.requires_grad:
        error = RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        raise raise_in_trace(error, f"RuntimeError: {error} (raised natively)")
    if tensor.source is None:
        raise Unsupported("Tensor.retain_grad() on a tensor the graph computes (its .grad would have to count "
                          "the gradient the graph's own uses send it, inside the compiled backward)",
                          kind="unsupported_call",
                          hint="call retain_grad() outside the compiled function, or read the gradient "
                               "with a hook on an input")
    leaf = tensor.getattr(tx, "is_leaf")  # guarded: a leaf input and a non-leaf pass the same tensor guard
    if not leaf.as_constant():
        tx.side_effects.retain_tensor_grad(tensor)
    return ConstantVariable(None)
