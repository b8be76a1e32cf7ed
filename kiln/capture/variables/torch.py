"""Functions of the torch namespace: `torch.*`, `torch.nn.functional.*`, `Tensor.*` unbound methods.

A call becomes one `call_function` node, except for the functions answered at trace time (grad-mode
queries, dtype helpers, `torch.is_tensor`, ...), the context managers of grad mode, and calls that
cannot be captured (random seeding, `torch.save`, ...). Corresponds to
torch/_dynamo/variables/torch.py (TorchInGraphFunctionVariable). Which functions these are, and
how each is answered, is decided by the tables of kiln.capture.trace_rules.
"""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from kiln.capture.trace_rules import (
    COMPILING_FNS,
    CONSTANT_FNS,
    EXPORTING_FNS,
    GUARDED,
    MANAGER_PROTOCOL,
    MODE_CALLS,
    QUERIES,
    TELEMETRY_FNS,
    TORCH_FUNCTION_CHECKS,
    TRACING_STATE,
    is_library_code,
    is_state_getter,
    torch_break_kind,
)
from kiln.capture.device_context import applies_to
from kiln.capture.guards import Guard, ProcessQuery
from kiln.capture.variables.base import Variable, constant_args
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.out_variant import call_with_out, has_out_argument
from kiln.capture.variables.symint import holds_symbolic_number
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer

# torch functions traced in a way of their own by a module that registers its rule here (the
# foreach overloads with tensor scalars, variables/foreach.py): it imports this module's
# neighbours, so this module does not import it. A rule returns None where it does not apply.
CALL_RULES: list[Callable[["Tracer", Any, Sequence[Variable], dict[str, Variable]], Variable | None]] = []


def _call_query(tx: "Tracer", fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """A process query answered now; its answer guarded unless fixed or tracked (see QUERIES)."""
    consts = constant_args(list(args), kwargs)
    if consts is None or consts[1]:
        raise Unsupported(f"{fn.__qualname__} with arguments unknown at trace time", kind="unsupported_call")
    try:
        result = fn(*consts[0])
    except Exception as exc:  # e.g. get_rank() without a process group: raised again natively
        raise Unsupported(f"{fn.__qualname__} raised {type(exc).__name__} (raised natively)",
                          kind="unsupported_call") from exc
    if QUERIES[fn] == GUARDED:
        label = f"{fn.__module__}.{fn.__qualname__}()"
        tx.state.output.guards.append(Guard("", "check_query", ProcessQuery(fn, tuple(consts[0]), result, label)))
    return tx.wrap_result(result)


def _call_state_getter(tx: "Tracer", fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable | None:
    """A getter of process state (trace_rules.is_state_getter) called on constants: answered now and
    guarded; None where it is not such a call (a tensor argument, a result that is not a constant)."""
    from kiln.capture.variables.constant import is_constant_value

    consts = constant_args(list(args), kwargs)
    if consts is None or consts[1]:
        return None
    try:
        result = fn(*consts[0])
    except Exception:  # raised again by the op as recorded
        return None
    if not (result is None or is_constant_value(result)):
        return None
    label = f"{getattr(fn, '__module__', None) or 'torch'}.{getattr(fn, '__qualname__', fn)}()"
    tx.state.output.guards.append(Guard("", "check_query", ProcessQuery(fn, tuple(consts[0]), result, label)))
    return tx.wrap_result(result)


def _call_mode(tx: "Tracer", fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """A call that reads or sets a process-wide setting (see kiln.capture.process_modes)."""
    from kiln.capture.process_modes import DEFAULT_DTYPE, SAVED_TENSORS_HOOKS
    from kiln.capture.variables.grad_mode import set_grad_mode

    consts = constant_args(list(args), kwargs)
    if consts is None or consts[1]:
        raise Unsupported(f"{getattr(fn, '__qualname__', fn)} with arguments unknown at trace time",
                          kind="unsupported_call")
    values = consts[0]
    modes = tx.state.modes
    if fn is torch._C._set_grad_enabled and len(values) == 1:
        set_grad_mode(tx, bool(values[0]))
    elif fn in (torch.set_default_dtype, torch._C._set_default_dtype) and len(values) == 1:
        if not (isinstance(values[0], torch.dtype) and values[0].is_floating_point):
            raise Unsupported(f"set_default_dtype({values[0]!r}) (raised natively)", kind="unsupported")
        modes.write(tx.state, DEFAULT_DTYPE, values[0])
    elif fn is torch._C._autograd._saved_tensors_hooks_disable and len(values) == 1 and isinstance(values[0], str):
        modes.write(tx.state, SAVED_TENSORS_HOOKS, values[0])
    elif fn is torch._C._autograd._saved_tensors_hooks_enable and not values:
        modes.write(tx.state, SAVED_TENSORS_HOOKS, None)
    elif fn is torch._C._autograd._saved_tensors_hooks_get_disabled_error_message and not values:
        return tx.wrap_result(modes.read(tx.state, SAVED_TENSORS_HOOKS))
    else:
        raise Unsupported(f"{getattr(fn, '__qualname__', fn)} with these arguments (raised natively)",
                          kind="unsupported")
    return ConstantVariable(None)


class TorchFunctionVariable(Variable):
    """A function of the torch namespace; calling it records a node (or folds at trace time)."""

    def __init__(self, fn: Any, source: Any = None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return f"torch function {getattr(self.fn, '__qualname__', self.fn)}"

    def truth(self, tx: "Tracer") -> bool:
        return bool(self.fn)  # the real function, fixed for the process (guarded by identity)

    def python_type(self) -> type:
        return type(self.fn)

    def as_python_value(self) -> Any:
        return self.fn

    def getattr(self, tx: "Tracer", name: str) -> Variable:
        return tx.wrap(getattr(self.fn, name), None)

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.grad_mode import GradModeVariable
        from kiln.capture.variables.tensor import TensorVariable, scalar_tensor_rewrite

        fn = self.fn
        device = tx.output.default_device
        if device is not None and applies_to(fn) and _no_device(kwargs.get("device")):
            # as the DeviceContext the frame was called under does (kiln.capture.device_context)
            kwargs = {**kwargs, "device": ConstantVariable(device)}
        if fn is torch.get_default_device and not args and not kwargs:
            return ConstantVariable(_default_device(device))
        if fn in (torch.from_numpy, torch.as_tensor, torch.asarray, torch.tensor):
            from kiln.capture.variables.numpy_array import numpy_to_tensor
            converted = numpy_to_tensor(tx, fn, args, kwargs)
            if converted is not None:
                return converted
        if fn is torch.tensor and holds_symbolic_number(args[0] if args else kwargs.get("data")):
            # torch.tensor(h // 2) of a dynamic size: the factory would read the number's value
            # (a guard, a recompile per size, torchvision's resize_boxes); its Python reference
            # builds the same tensor from the symbols (scalar_tensor, stack)
            return tx.call_op("call_function", torch._refs.tensor, args, kwargs)
        if fn is torch._assert and args and args[0].is_constant() and args[0].as_constant():
            # an assertion that holds at trace time: nothing to record, and its message (often
            # formatted from sizes) is never made, so those sizes are not specialized
            return ConstantVariable(None)
        if fn in MANAGER_PROTOCOL and args and args[0].source is None:
            raise Unsupported(f"{fn.__qualname__} called on a manager made in the frame (contextlib.ExitStack, a "
                              f"manual __enter__): a graph break cannot hand the same object on, so the frame runs "
                              f"eagerly, as under torch.compile", kind="frame_eager")
        kind = torch_break_kind(fn)
        if kind == "graph_break" and is_library_code(tx.code.co_filename):
            # torch's own forced breaks (optimizer.step's no_grad wrapper) keep Kiln's one graph:
            # only the program's own graph_break() calls end it
            return ConstantVariable(None)
        if kind is not None:
            raise Unsupported(f"call to {getattr(fn, '__qualname__', fn)}", kind=kind)
        if fn in (torch.no_grad, torch.enable_grad, torch.set_grad_enabled, torch.inference_mode):
            return GradModeVariable.create(tx, fn, list(args), kwargs)
        if _in(fn, QUERIES):
            return _call_query(tx, fn, args, kwargs)
        if _in(fn, TRACING_STATE):
            return ConstantVariable(TRACING_STATE[fn])
        if _in(fn, MODE_CALLS):
            return _call_mode(tx, fn, args, kwargs)
        if _in(fn, TELEMETRY_FNS):
            return ConstantVariable(None)
        if fn in TORCH_FUNCTION_CHECKS:
            return ConstantVariable(_torch_function_check(tx, fn, args, kwargs))
        if fn is torch.is_tensor:
            return ConstantVariable(isinstance(_argument(fn, args, kwargs, None), TensorVariable))
        if fn is torch.Size:
            from kiln.capture.variables.sequence import TupleVariable
            return TupleVariable(tx.iterate(args[0]) if args else [], torch.Size)
        if fn in COMPILING_FNS or fn in EXPORTING_FNS:
            if fn in COMPILING_FNS:
                tx.state.read_compiling = True  # the path may differ from eager's (frame_capture)
            return ConstantVariable(fn in COMPILING_FNS)
        if fn is torch.is_inference_mode_enabled and tx.output.inference_depth:
            return ConstantVariable(True)  # inside a traced inference_mode block (the process is not in one)
        if fn in CONSTANT_FNS:
            consts = constant_args(list(args), kwargs)
            if consts is None:
                if fn in (torch.is_floating_point, torch.is_complex):
                    tensor = _argument(fn, args, kwargs, "input")
                    if isinstance(tensor, TensorVariable) and len(args) + len(kwargs) == 1:
                        return tx.wrap_result(fn(tensor.example))
                raise Unsupported(f"{fn.__name__} on values unknown at trace time", kind="unsupported_call")
            return tx.wrap_result(fn(*consts[0], **consts[1]))
        if fn is torch.numel and len(args) + len(kwargs) == 1 \
                and isinstance(_argument(fn, args, kwargs, "input"), TensorVariable):
            return _argument(fn, args, kwargs, "input").call_method(tx, "numel", [], {})
        if (fn is torch.Tensor.size or fn is torch.Tensor.dim) and args:
            return args[0].call_method(tx, fn.__name__, list(args[1:]), kwargs)
        if isinstance(fn, type) and issubclass(fn, torch.nn.Module):
            raise Unsupported(f"constructing {fn.__name__} inside a compiled region", kind="unsupported_call")
        if has_out_argument(kwargs):
            return call_with_out(tx, fn, list(args), kwargs)
        if is_state_getter(fn):
            answered = _call_state_getter(tx, fn, args, kwargs)
            if answered is not None:
                return answered
        for rule in CALL_RULES:
            traced = rule(tx, fn, args, kwargs)
            if traced is not None:
                return traced
        if _in(fn, _SCALED_FUNCTIONS) and args and isinstance(args[0], TensorVariable):
            rewritten = scalar_tensor_rewrite(tx, fn.__name__, args[0], args[1:], kwargs)
            if rewritten is not None:
                return rewritten
        return tx.call_op("call_function", fn, list(args), kwargs)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        return glue.constant(self.fn)


def _no_device(given: Variable | None) -> bool:
    """A DeviceContext fills `device=` where the call gave none or None (a keyword only, as it does)."""
    return given is None or (given.is_constant() and given.as_constant() is None)


def _default_device(device: torch.device | None) -> torch.device:
    """torch.get_default_device() under the frame's DeviceContext (`device`) or none: with its
    index, as eager's (the one a tensor made there gets); the guard on the context covers it."""
    if device is None:
        return torch.device("cpu")
    return device if device.index is not None else torch.empty(0, device=device).device


# torch functions whose `alpha` / `value` may come as a tensor (tensor.scalar_tensor_rewrite)
_SCALED_FUNCTIONS = {torch.add, torch.sub, torch.addcmul, torch.addcdiv}


def _in(fn: Any, table: Any) -> bool:
    try:
        return fn in table
    except TypeError:  # unhashable
        return False


def _torch_function_attribute(var: Variable) -> Any:
    """`var.__torch_function__` as torch looks it up, on the object itself: a class (Duck, or
    torch.Tensor) has its own, an instance its class's or one set on it; None when it has none."""
    if not isinstance(var.python_type(), type) or not issubclass(var.python_type(), torch.Tensor):
        try:
            real = var.as_python_value()
        except Unsupported:  # an object made in the frame: its class's
            real = None
        if real is not None:
            return inspect.getattr_static(real, "__torch_function__", None)
    return inspect.getattr_static(var.python_type(), "__torch_function__", None)


def _overrides_torch_function(var: Variable) -> bool:
    """Whether torch would hand a call with `var` among its arguments to a __torch_function__: any
    object with one other than the disabled one (Parameter's) but a plain tensor. The tensors
    capture traces are plain tensors and Parameters (a subclass input runs its frame eagerly)."""
    if var.python_type() is torch.Tensor:
        return False
    impl = _torch_function_attribute(var)
    return impl is not None and impl is not torch._C._disabled_torch_function_impl


def _torch_function_check(tx: "Tracer", fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> bool:
    """torch.overrides' questions, answered as eager does: `is_tensor_like(x)`, and whether a call
    would go to a __torch_function__, an argument's or a mode's. The only mode a trace runs under
    is the default device's DeviceContext (capture's `default_device`), which makes every such
    check True, as it does in eager."""
    if fn is torch.overrides.is_tensor_like:
        return _torch_function_attribute(_argument(fn, args, kwargs, "inp")) is not None
    if kwargs:
        raise Unsupported(f"{getattr(fn, '__name__', fn)} with keyword arguments", kind="unsupported_call")
    if fn in (torch._C._has_torch_function, torch.overrides.has_torch_function):
        if len(args) != 1:
            raise Unsupported(f"{fn.__name__} with {len(args)} arguments", kind="unsupported_call")
        relevant = tx.iterate(args[0])
    elif fn in (torch._C._has_torch_function_unary, torch.overrides.has_torch_function_unary):
        if len(args) != 1:
            raise Unsupported(f"{fn.__name__} with {len(args)} arguments", kind="unsupported_call")
        relevant = list(args)
    else:
        relevant = list(args)
    if tx.output.default_device is not None:
        return True
    if not any(_overrides_torch_function(v) for v in relevant):
        return False
    # an object's override counts only while torch function handling is on (off inside
    # DisableTorchFunctionSubclass, as in a subclass's own __torch_function__): read and guarded
    enabled = torch._C._is_torch_function_enabled()
    tx.output.guards.append(Guard("", "check_query", ProcessQuery(
        torch._C._is_torch_function_enabled, (), enabled, "torch._C._is_torch_function_enabled()")))
    return enabled


def _argument(fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable], keyword: str | None) -> Variable:
    """The first argument of a call, given by position or (where torch's signature allows) by
    `keyword` (`torch.is_floating_point(input=y)`); a call without it raises natively."""
    if args:
        return args[0]
    if keyword is not None and keyword in kwargs:
        return kwargs[keyword]
    raise Unsupported(f"TypeError calling {getattr(fn, '__name__', fn)}: missing its first argument "
                      "(raised natively)", kind="unsupported")


