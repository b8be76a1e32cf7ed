"""Grad-mode context managers during capture: `torch.no_grad()`, `enable_grad()`, `set_grad_enabled(b)`.

Entering one records `torch._C._set_grad_enabled(mode)` in the graph (and switches the real mode
while tracing, so fakes get the right requires_grad); the with-exit sequence restores it. After a
graph break inside the block the glue enters a real manager of the same kind and passes its bound
`__exit__` to the resume function, which `WithExitVariable` reads back when that is captured.
Corresponds to torch/_dynamo/variables/ctx_manager.py (GradModeVariable).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.errors import InferenceModeEscapes, Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer


def set_grad_mode(tx: "Tracer", enabled: bool) -> None:
    """Switch grad mode at this point of the graph (a node) and in the tracer's process."""
    if tx.state.grad_enabled == enabled:
        return
    tx.output.create_node("call_function", torch._C._set_grad_enabled, (enabled,), {}, None)
    tx.state.grad_enabled = enabled
    torch._C._set_grad_enabled(enabled)


def _inference_mode(tx: "Tracer", args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`torch.inference_mode()` in the frame, as a manager or a decorator: a no-grad region whose
    results the output graph follows as eager's inference tensors (OutputGraph.follow_inference):
    where one would be seen to differ from a normal tensor, the frame is captured again with the
    block as a break (state.inference_breaks), as it was before. As torch.compile, one graph."""
    if tx.state.inference_breaks or tx.output.inference_inputs:
        raise Unsupported("torch.inference_mode inside a compiled region, whose results leave the block "
                          "as inference tensors", kind="unsupported_call")
    if len(args) == 1 and not kwargs and not args[0].is_constant():  # `@torch.inference_mode` without parentheses
        return GradModeVariable(False, torch.inference_mode, (True,)).call(tx, args, {})
    mode = (args[0] if args else kwargs.get("mode", ConstantVariable(True))).as_constant()
    if mode is not True or set(kwargs) - {"mode"}:
        raise Unsupported(f"torch.inference_mode({mode!r}) inside a compiled region", kind="unsupported_call")
    return GradModeVariable(False, torch.inference_mode, (True,))


class GradModeVariable(Variable):
    """A grad-mode manager; `target` is the mode inside the block, `ctor` rebuilds it at run time."""

    def __init__(self, target: bool, ctor: Any, ctor_args: tuple[Any, ...]) -> None:
        self.target = target
        self.ctor = ctor
        self.ctor_args = ctor_args
        self.prev: bool | None = None

    @staticmethod
    def create(tx: "Tracer", fn: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        if fn is torch.inference_mode:
            return _inference_mode(tx, args, kwargs)
        if fn in (torch.no_grad, torch.enable_grad):
            made = GradModeVariable(fn is torch.enable_grad, fn, ())
            if len(args) == 1 and not kwargs:
                return made.call(tx, args, {})  # `@torch.no_grad` without parentheses decorates
            return made
        mode = (args[0] if args else kwargs["mode"]).as_constant()
        var = GradModeVariable(bool(mode), fn, (bool(mode),))
        # set_grad_enabled(b) takes effect when called, not when entered.
        var.prev = tx.state.grad_enabled
        set_grad_mode(tx, bool(mode))
        return var

    def describe(self) -> str:
        return f"{self.ctor.__name__}()"

    def python_type(self) -> type:
        return self.ctor

    def enter(self, tx: "Tracer") -> Variable:
        if self.target and tx.output.inference_depth:
            # grad mode on inside inference_mode: eager still records nothing there
            raise InferenceModeEscapes(f"{self.describe()} inside torch.inference_mode")
        if self.prev is None:
            self.prev = tx.state.grad_enabled
        set_grad_mode(tx, self.target)
        if self.ctor is torch.inference_mode:
            tx.output.inference_depth += 1
        return ConstantVariable(None)

    def exit(self, tx: "Tracer") -> Variable:
        set_grad_mode(tx, bool(self.prev))
        if self.ctor is torch.inference_mode:
            tx.output.inference_depth -= 1
        return ConstantVariable(None)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name in ("__enter__", "__exit__"):
            return WithExitVariable(self) if name == "__exit__" else _EnterVariable(self)
        raise Unsupported(f"attribute {name!r} of {self.describe()}", kind="unsupported_attribute")

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        """Used as a decorator (`@torch.no_grad()` on a function): the function, run in the mode."""
        if len(args) != 1 or kwargs:
            raise Unsupported(f"{self.describe()} called with these arguments (raised natively)", kind="unsupported")
        if self.ctor is torch.set_grad_enabled and self.prev is not None:
            set_grad_mode(tx, self.prev)  # decorating undoes what set_grad_enabled(b) did when made
        return GradModeFunctionVariable(self, args[0])

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{glue.constant(self.ctor)}({', '.join(repr(a) for a in self.ctor_args)})"


class GradModeFunctionVariable(Variable):
    """A function decorated with a grad-mode manager: each call runs it in the manager's mode and
    restores the mode the caller had, also when it raises."""

    def __init__(self, ctx: GradModeVariable, fn: Variable) -> None:
        self.ctx = ctx
        self.fn = fn

    def describe(self) -> str:
        return f"{self.fn.describe()} under {self.ctx.describe()}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        outer = tx.state.grad_enabled
        set_grad_mode(tx, self.ctx.target)
        try:
            return self.fn.call(tx, args, kwargs)
        finally:
            set_grad_mode(tx, outer)

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        if name == "__wrapped__":
            return self.fn
        return self.fn.getattr(tx, name)  # functools.wraps copied the function's attributes

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return f"{self.ctx.reconstruct(glue)}({glue.reconstruct(self.fn)})"


class _EnterVariable(Variable):
    def __init__(self, ctx: GradModeVariable) -> None:
        self.ctx = ctx

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return self.ctx.enter(tx)


class WithExitVariable(Variable):
    """The bound `__exit__` that BEFORE_WITH leaves on the stack for an entered grad-mode manager."""

    def __init__(self, ctx: GradModeVariable, source: Any = None) -> None:
        self.ctx = ctx
        self.source = source

    def describe(self) -> str:
        return f"__exit__ of {self.ctx.describe()}"

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return self.ctx.exit(tx)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        # Enter a real manager of the same kind now, so the native instruction and the resume
        # function run in the block's grad mode; the resume function exits it.
        # The new manager's exit restores the mode it finds on entry: that must be the block's own
        # outer mode (`prev`), not the mode of the break (inside an enclosing no_grad entered by
        # an earlier glue, a fresh no_grad would find grad off and leave it off after the frame).
        name = glue.fresh("ctx")
        if self.ctx.prev is not None:
            glue.line(f"{glue.constant(torch._C._set_grad_enabled)}({bool(self.ctx.prev)})")
        glue.line(f"{name} = {self.ctx.reconstruct(glue)}")
        glue.line(f"{name}.__enter__()")
        return f"{name}.__exit__"
