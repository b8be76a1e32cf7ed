"""Custom torch.autograd.Function calls during capture: `MyFunction.apply(*args)` becomes one node.

The node's target is an `AutogradFunctionCall` (one per Function class) that calls `apply` when the
graph runs. Backends that run the torch-level graph call `apply` for real; AOT autograd traces
through it at ATen level, so the forward's ops land in the forward graph and, in the joint trace,
autograd calls the user's `backward` and its ops land in the backward graph.

Before recording the node, the forward (and `setup_context`, and the backward when a gradient can
flow) is traced speculatively with the ordinary tracer, on a stand-in `ctx`: whatever would break
there (`.item()`, `print`, a write to a global) keeps today's graph break, since code running
inside the node only runs while the node is traced, not on each call. The speculative nodes are
then erased; only the guards the speculation installed stay (reading globals, the Function class).
PyTorch counterpart: torch/_dynamo/variables/misc.py (AutogradFunctionVariable).
"""
from __future__ import annotations

import inspect
import types
import weakref
from typing import TYPE_CHECKING, Any, Sequence

import torch

from kiln.capture.sources import AttrSource, Source
from kiln.capture.variables.base import Variable
from kiln.capture.variables.user_object import NewObjectVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer

_BASE_SETUP_CONTEXT = inspect.getattr_static(torch.autograd.Function, "setup_context")
_BASE_BACKWARD = inspect.getattr_static(torch.autograd.Function, "backward")
_BASE_FORWARD = inspect.getattr_static(torch.autograd.Function, "forward")


class AutogradFunctionCall:
    """The graph target standing for `function.apply`: FX renders a bound classmethod of torch's
    Function by its torch module path, which does not resolve, so the graph calls this instead."""

    def __init__(self, function: type[torch.autograd.Function]) -> None:
        self.function = function
        self.__name__ = f"{function.__name__}_apply"
        self.__qualname__ = f"{function.__qualname__}.apply"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function.apply(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.__qualname__}>"


_CALLS: "weakref.WeakKeyDictionary[type, AutogradFunctionCall]" = weakref.WeakKeyDictionary()


def autograd_function_call(function: type) -> AutogradFunctionCall:
    """The one graph target of `function` (the same object each time, so graphs name it once)."""
    call = _CALLS.get(function)
    if call is None:
        call = _CALLS[function] = AutogradFunctionCall(function)
    return call


def _static_function(function: type, name: str, base: Any) -> types.FunctionType | None:
    """The plain Python function behind the staticmethod `name` of `function`, None if inherited."""
    static = inspect.getattr_static(function, name, None)
    if static is base or static is None:
        return None
    if isinstance(static, staticmethod):
        static = static.__func__
    return static if isinstance(static, types.FunctionType) else None


class InferenceApply:
    """What the glue calls for `function.apply(*args)` at a graph break with grad mode off: apply's
    forward runs in no-grad mode anyway, and with grad off nothing records a backward, so calling the
    forward on a fresh context is the same call; the forward is then captured as a frame of its own
    (`compiled_forward`), as torch.compile captures it, instead of running uncompiled inside apply.
    With grad mode on it calls apply on a subclass whose forward is that captured frame: autograd
    records the Function's own backward, which the subclass inherits, around the compiled forward."""

    def __init__(self, function: type[torch.autograd.Function], compiled_forward: Any) -> None:
        self.function = function
        self.compiled_forward = compiled_forward
        self._recording: type[torch.autograd.Function] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # keywords go to the forward as apply hands them on (no setup_context here: none are bound)
        if torch._C._are_functorch_transforms_active():
            return self.function.apply(*args, **kwargs)
        if torch.is_grad_enabled():
            if self._recording is None:
                namespace = {"forward": staticmethod(self.compiled_forward), "__module__": self.function.__module__,
                             "__qualname__": self.function.__qualname__}
                self._recording = type(self.function.__name__, (self.function,), namespace)
            return self._recording.apply(*args, **kwargs)
        return self.compiled_forward(torch.autograd.function.FunctionCtx(), *args, **kwargs)


def inference_apply(value: Any, wrap_frame: Any) -> InferenceApply | None:
    """An InferenceApply for the bound `Function.apply` `value`, or None when apply is more than its
    forward: a forward that takes no ctx (setup_context), or one that is not plain Python."""
    function = getattr(value, "__self__", None)
    if not isinstance(function, type) or not issubclass(function, torch.autograd.Function):
        return None
    forward = _static_function(function, "forward", _BASE_FORWARD)
    if forward is None or _static_function(function, "setup_context", _BASE_SETUP_CONTEXT) is not None:
        return None
    if "vjp" in function.__dict__ or getattr(function, "generate_vmap_rule", False):
        return None
    if "mark_dirty" in forward.__code__.co_names:
        # its captured frame would break again on the store into the real ctx's dirty_tensors (a
        # C++ descriptor): the forward runs inside apply as it is
        return None
    return InferenceApply(function, wrap_frame(forward))


def call_autograd_function(tx: "Tracer", function: Any, args: Sequence[Variable],
                           kwargs: dict[str, Variable], source: Source | None = None) -> Variable:
    """Record `function.apply(*args)` as one node, after checking its code traces without a break.
    `source` is where the class was read from: its forward/backward/setup_context are guarded by
    identity there, so assigning a new one recompiles (the graph bakes in what they traced to)."""
    from kiln.capture.variables.tensor import TensorVariable

    name = getattr(function, "__qualname__", "Function")
    if not isinstance(function, type) or not issubclass(function, torch.autograd.Function):
        raise _break(name, "it is not a torch.autograd.Function class")
    forward = _static_function(function, "forward", _BASE_FORWARD)
    backward = _static_function(function, "backward", _BASE_BACKWARD)
    if forward is None or backward is None:
        raise _break(name, "its forward or backward is not a plain Python staticmethod")
    if "vjp" in function.__dict__:
        raise _break(name, "it defines vjp (autograd would call it instead of backward)")
    setup_context = _static_function(function, "setup_context", _BASE_SETUP_CONTEXT)
    if setup_context is not None:
        args, kwargs = _bind_defaults(tx, name, forward, args, kwargs)
    elif any(isinstance(v, TensorVariable) for v in kwargs.values()):
        # apply counts it among the inputs (needs_input_grad, the backward's gradients) by position
        raise _break(name, "a tensor passed to apply by keyword")
    if source is not None:
        tx.wrap(function, source)  # the class itself, by identity
        for attr, fn in (("forward", forward), ("backward", backward), ("setup_context", setup_context)):
            if fn is not None:
                tx.wrap(fn, AttrSource(source, attr))  # installs the identity guard
    _speculate(tx, name, forward, backward, setup_context, list(args), dict(kwargs))
    result = tx.call_op("call_function", autograd_function_call(function), list(args), dict(kwargs))
    node = next(reversed(tx.output.graph.nodes))
    while node.target is not autograd_function_call(function):
        node = node.prev  # past the getitem nodes of a tuple result
    if tx.state.grad_enabled and _returns_input_view(args, node.meta["example_value"]):
        # AOT autograd hands back an output aliasing an input as a view rebuilt from the input,
        # whose gradient would be the view's, not the user's backward (the capture restarts on
        # this break, so the node just recorded goes with it)
        raise _break(name, "an output is a view of an input (the user backward would be lost)")
    return result


def _returns_input_view(args: Sequence[Variable], outputs: Any) -> bool:
    """Whether a tensor output is a view of (the base of) an input that requires grad."""
    inputs = [getattr(a, "example", None) for a in args]
    bases = {id(t._base if t._base is not None else t) for t in inputs
             if isinstance(t, torch.Tensor) and t.requires_grad}
    outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return any(isinstance(o, torch.Tensor) and o._base is not None and id(o._base) in bases for o in outs)


def _bind_defaults(tx: "Tracer", name: str, forward: types.FunctionType, args: Sequence[Variable],
                   kwargs: dict[str, Variable]) -> tuple[list[Variable], dict[str, Variable]]:
    """What apply does for a Function with setup_context: the arguments bound to the forward's
    signature with its defaults filled in, so setup_context's `inputs` holds the defaults too."""
    try:
        bound = inspect.signature(forward).bind(*args, **kwargs)
    except TypeError as exc:
        raise _break(name, f"its arguments do not bind to the forward ({exc}; raised natively)") from exc
    bound.apply_defaults()
    wrap = lambda v: v if isinstance(v, Variable) else tx.wrap_result(v)  # noqa: E731 - a default's value
    return [wrap(v) for v in bound.args], {k: wrap(v) for k, v in bound.kwargs.items()}


def _break(name: str, why: str) -> Unsupported:
    return Unsupported(f"{name}.apply, a custom torch.autograd.Function: {why}", kind="autograd_function")


def _speculate(tx: "Tracer", name: str, forward: types.FunctionType, backward: types.FunctionType,
               setup_context: types.FunctionType | None, args: list[Variable], kwargs: dict[str, Variable]) -> None:
    """Trace forward (+ setup_context, + backward) on a stand-in ctx, then drop what they recorded."""
    from kiln.capture.variables.functions import call_python_function
    from kiln.capture.variables.sequence import TupleVariable
    from kiln.capture.variables.tensor import TensorVariable

    graph = tx.output.graph
    before = set(graph.nodes)
    effects = len(tx.side_effects)
    grad = tx.state.grad_enabled
    needs = [grad and isinstance(a, TensorVariable) and bool(a.example.requires_grad) for a in args]
    ctx = AutogradCtxVariable(needs)
    # apply runs forward and backward with grad mode off; so does the speculation
    tx.state.grad_enabled = False
    torch._C._set_grad_enabled(False)
    try:
        if setup_context is None:
            out = call_python_function(tx, forward, None, [ctx, *args], kwargs)
        else:
            out = call_python_function(tx, forward, None, list(args), kwargs)
            call_python_function(tx, setup_context, None, [ctx, TupleVariable(list(args)), out], {})
        if _dirties_graph_input(graph, ctx.attrs.get("dirty_tensors")):
            raise _break(name, "ctx.mark_dirty on a graph input or a view of one: eager bumps its version "
                               "counter once more for mark_dirty, a compiled graph once per input it writes")
        if len(tx.side_effects) != effects:
            raise _break(name, "its forward or setup_context changes state outside the function")
        if any(needs):
            outs = out.items if isinstance(out, TupleVariable) else [out]
            grads = [tx.call_op("call_function", torch.ones_like, [o], {}) if isinstance(o, TensorVariable)
                     else tx.wrap_result(None) for o in outs]
            body = getattr(backward, "__wrapped__", backward)  # once_differentiable's inner function
            if not isinstance(body, types.FunctionType):
                body = backward
            call_python_function(tx, body, None, [ctx, *grads], {})
            if len(tx.side_effects) != effects:
                raise _break(name, "its backward changes state outside the function")
    except Unsupported as exc:
        if exc.kind == "autograd_function":
            raise
        raise _break(name, f"{exc}") from exc
    finally:
        tx.state.grad_enabled = grad
        torch._C._set_grad_enabled(grad)
    for node in reversed(list(graph.nodes)):
        if node not in before and node.op != "placeholder":
            graph.erase_node(node)


def _dirties_graph_input(graph: Any, dirty: Variable | None) -> bool:
    """Whether `ctx.mark_dirty`'s tensors (the Variable stored as ctx.dirty_tensors) include a graph
    input or a view of one. Tensors the graph computes may be marked dirty: apply's extra version
    bump on them is not observable past the graph, whose outputs are new tensors."""
    items = getattr(dirty, "items", None)
    if dirty is None:
        return False
    if items is None:
        return True  # not a tuple of tensors: treated as an input, the break keeps eager's apply
    inputs = {id(n.meta.get("example_value")) for n in graph.nodes if n.op == "placeholder"}
    for item in items:
        example = getattr(item, "example", None)
        if not isinstance(example, torch.Tensor):
            return True
        base = example._base if example._base is not None else example
        if getattr(item, "source", None) is not None or id(example) in inputs or id(base) in inputs:
            return True
    return False


class AutogradCtxVariable(NewObjectVariable):
    """The `ctx` a speculative forward/backward sees: attribute stores are tracked like those of any
    object made during the trace (the real ctx is made by apply at run time); save_for_backward and
    friends are FunctionCtx's own Python methods, inlined."""

    def __init__(self, needs_input_grad: list[bool]) -> None:
        super().__init__(torch.autograd.function.FunctionCtx)
        self.needs_input_grad = tuple(needs_input_grad)

    def describe(self) -> str:
        return "autograd.Function ctx"

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        from kiln.capture.variables.sequence import BaseSequenceVariable, TupleVariable

        if name == "needs_input_grad":
            return tx.wrap_result(self.needs_input_grad)
        if name in ("saved_tensors", "saved_variables"):
            saved = self.attrs.get("to_save")
            if saved is not None and not isinstance(saved, BaseSequenceVariable):
                raise Unsupported("ctx.saved_tensors after ctx.to_save was set to a non-sequence", kind="unsupported")
            return TupleVariable([] if saved is None else list(saved.items))
        return super().getattr(tx, name)

    def reconstruct(self, glue: Any) -> str:
        raise Unsupported("the ctx of an autograd.Function escaping its forward", kind="autograd_function")
