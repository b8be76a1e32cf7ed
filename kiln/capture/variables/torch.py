"""Functions of the torch namespace: `torch.*`, `torch.nn.functional.*`, `Tensor.*` unbound methods.

A call becomes one `call_function` node, except for the functions answered at trace time (grad-mode
queries, dtype helpers, `torch.is_tensor`, ...), the context managers of grad mode, and calls that
cannot be captured (random seeding, `torch.save`, ...). Corresponds to
torch/_dynamo/variables/torch.py (TorchInGraphFunctionVariable).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from kiln.capture.variables.base import Variable, constant_args
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.out_variant import call_with_out, has_out_argument
from kiln.capture.variables.sequence import BaseSequenceVariable
from kiln.capture.variables.symint import SymIntVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer



# torch functions traced in a way of their own by a module that registers its rule here (the
# foreach overloads with tensor scalars, variables/foreach.py): it imports this module's
# neighbours, so this module does not import it. A rule returns None where it does not apply.
CALL_RULES: list[Callable[["Tracer", Any, Sequence[Variable], dict[str, Variable]], Variable | None]] = []

def _constant_fns() -> set[Any]:
    fns = {torch.get_default_dtype, torch.is_floating_point, torch.is_complex,
           torch.promote_types, torch.can_cast, torch.finfo, torch.iinfo, torch.device, torch.dtype,
           torch.is_autocast_enabled, torch.is_inference_mode_enabled, torch.jit.is_scripting,
           torch.jit.is_tracing, torch.nn.modules.utils._pair, torch.nn.modules.utils._single, torch.nn.modules.utils._triple,
           torch.nn.modules.utils._ntuple}
    return fns


_CONSTANT_FNS = _constant_fns()
# "Does any argument override __torch_function__?": never, for the plain tensors capture traces.
_TORCH_FUNCTION_CHECKS = {torch._C._has_torch_function, torch._C._has_torch_function_unary,
                          torch._C._has_torch_function_variadic, torch.overrides.has_torch_function,
                          torch.overrides.has_torch_function_unary, torch.overrides.has_torch_function_variadic,
                          torch.overrides.is_tensor_like}
# "Am I being compiled?": True while capturing (model code picks its compile-friendly path on it);
# inlining them would read torch.compile's own flags and answer False.
_COMPILING_FNS = {torch.compiler.is_compiling, torch.compiler.is_dynamo_compiling, torch._utils.is_compiling}
_EXPORTING_FNS = {torch.compiler.is_exporting}
# Calls with effects the graph cannot hold, each a break of the given kind.
_BREAK_FNS = {torch.manual_seed: "random", torch.seed: "random", torch.save: "unsupported_call",
              torch.load: "unsupported_call", torch.set_printoptions: "unsupported_call", torch.Tensor.item: "item",
              torch.Tensor.tolist: "item", torch.Tensor.numpy: "numpy", torch.Tensor.backward: "unsupported_call",
              torch.autograd.grad: "unsupported_call", torch.autograd.backward: "unsupported_call"}


# Questions about the process that a trace answers now, and how each answer stays right:
# FIXED - the same for the life of the process (how torch was built), assumed as torch.compile does;
# GUARDED - asked again before the graph is reused (a check_query guard);
# TRACKED - a setting the trace follows itself (autocast regions it enters), whose value at entry
# the entry's global-state guard checks.
FIXED, GUARDED, TRACKED = "fixed", "guarded", "tracked"


def _query_table() -> dict[Any, str]:
    table: dict[Any, str] = {
        torch.distributed.is_available: FIXED,
        torch._C._get_privateuse1_backend_name: GUARDED,  # renamed once, before first use
        torch._C._get_cublas_allow_tf32: GUARDED,
        torch._C._is_any_autocast_enabled: TRACKED,
        torch.autograd._is_checkpoint_valid: GUARDED,  # False only inside a backward without checkpointing
        torch._C._current_graph_task_id: GUARDED,  # -1 unless called from inside a backward pass
        torch.is_grad_enabled: TRACKED,
        torch.cuda.is_available: FIXED,  # CUDA is found (or not) once per process
        torch.cuda.device_count: FIXED,
        torch.backends.mps.is_available: FIXED,
        torch.get_num_threads: GUARDED,  # torch.set_num_threads may change it between calls
        torch.are_deterministic_algorithms_enabled: GUARDED,
        torch.is_deterministic_algorithms_warn_only_enabled: GUARDED,
    }
    if torch.distributed.is_available():
        dist = torch.distributed
        table.update({dist.is_initialized: GUARDED, dist.get_rank: GUARDED, dist.get_world_size: GUARDED})
    return table


_QUERIES = _query_table()
# Tracing-state questions with one answer during capture: Kiln's trace is neither an FX symbolic
# trace nor TorchScript (torch.compile answers the same; is_fx_tracing would also log a warning).
_TRACING_STATE = {torch.fx._symbolic_trace.is_fx_tracing: False,
                  torch.fx._symbolic_trace.is_fx_symbolic_tracing: False,
                  torch._C._get_tracing_state: None, torch._C._is_tracing: False,
                  torch.onnx.is_in_onnx_export: False}
# Usage telemetry (torchvision logs each model and op it runs, once per process, to whatever logger
# a deployment installed): no effect on any value, so traced away as torch.compile's graph keeps it
# out of the computation; nothing is left to replay.
_TELEMETRY_FNS = {torch._C._log_api_usage_once, torch._C._log_api_usage_metadata}
# Calls that change a process-wide setting at their point of the graph (process_modes.py).
_MODE_CALLS = {torch.set_default_dtype, torch._C._set_default_dtype, torch._C._set_grad_enabled,
               torch._C._autograd._saved_tensors_hooks_disable, torch._C._autograd._saved_tensors_hooks_enable,
               torch._C._autograd._saved_tensors_hooks_get_disabled_error_message}


def _call_query(tx: "Tracer", fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """A process query answered now; its answer guarded unless fixed or tracked (see _QUERIES)."""
    from kiln.capture.guards import Guard, ProcessQuery

    consts = constant_args(list(args), kwargs)
    if consts is None or consts[1]:
        raise Unsupported(f"{fn.__qualname__} with arguments unknown at trace time", kind="unsupported_call")
    try:
        result = fn(*consts[0])
    except Exception as exc:  # e.g. get_rank() without a process group: raised again natively
        raise Unsupported(f"{fn.__qualname__} raised {type(exc).__name__} (raised natively)",
                          kind="unsupported_call") from exc
    if _QUERIES[fn] == GUARDED:
        label = f"{fn.__module__}.{fn.__qualname__}()"
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


def _break_kind(fn: Any) -> str | None:
    """The break kind of a call to fn, seen through functools.wraps wrappers: importing torch._dynamo
    replaces torch.manual_seed with a wrapper (torch._disable_dynamo) that _BREAK_FNS does not hold."""
    for _ in range(4):
        try:
            kind = _BREAK_FNS.get(fn)
        except TypeError:  # unhashable
            return None
        if kind is not None or not hasattr(fn, "__wrapped__"):
            return kind
        fn = fn.__wrapped__
    return None


class TorchFunctionVariable(Variable):
    """A function of the torch namespace; calling it records a node (or folds at trace time)."""

    def __init__(self, fn: Any, source: Any = None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return f"torch function {getattr(self.fn, '__qualname__', self.fn)}"

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
        if fn in (torch.from_numpy, torch.as_tensor, torch.asarray, torch.tensor):
            from kiln.capture.variables.numpy_array import numpy_to_tensor
            converted = numpy_to_tensor(tx, fn, args, kwargs)
            if converted is not None:
                return converted
        if fn is torch.tensor and _holds_symbolic_number(args[0] if args else kwargs.get("data")):
            # torch.tensor(h // 2) of a dynamic size: the factory would read the number's value
            # (a guard, a recompile per size, torchvision's resize_boxes); its Python reference
            # builds the same tensor from the symbols (scalar_tensor, stack)
            return tx.call_op("call_function", torch._refs.tensor, args, kwargs)
        if fn is torch._assert and args and args[0].is_constant() and args[0].as_constant():
            # an assertion that holds at trace time: nothing to record, and its message (often
            # formatted from sizes) is never made, so those sizes are not specialized
            return ConstantVariable(None)
        kind = _break_kind(fn)
        if kind is not None:
            raise Unsupported(f"call to {getattr(fn, '__qualname__', fn)}", kind=kind)
        if fn in (torch.no_grad, torch.enable_grad, torch.set_grad_enabled, torch.inference_mode):
            return GradModeVariable.create(tx, fn, list(args), kwargs)
        if _in(fn, _QUERIES):
            return _call_query(tx, fn, args, kwargs)
        if _in(fn, _TRACING_STATE):
            return ConstantVariable(_TRACING_STATE[fn])
        if _in(fn, _MODE_CALLS):
            return _call_mode(tx, fn, args, kwargs)
        if _in(fn, _TELEMETRY_FNS):
            return ConstantVariable(None)
        if fn in _TORCH_FUNCTION_CHECKS:
            if fn is torch.overrides.is_tensor_like:
                return ConstantVariable(isinstance(_argument(fn, args, kwargs, "inp"), TensorVariable))
            return ConstantVariable(False)
        if fn is torch.is_tensor:
            return ConstantVariable(isinstance(_argument(fn, args, kwargs, None), TensorVariable))
        if fn is torch.Size:
            from kiln.capture.variables.sequence import TupleVariable
            return TupleVariable(tx.iterate(args[0]) if args else [], torch.Size)
        if fn in _COMPILING_FNS or fn in _EXPORTING_FNS:
            return ConstantVariable(fn in _COMPILING_FNS)
        if fn in _CONSTANT_FNS:
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


# torch functions whose `alpha` / `value` may come as a tensor (tensor.scalar_tensor_rewrite)
_SCALED_FUNCTIONS = {torch.add, torch.sub, torch.addcmul, torch.addcdiv}


def _in(fn: Any, table: Any) -> bool:
    try:
        return fn in table
    except TypeError:  # unhashable
        return False


def _argument(fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable], keyword: str | None) -> Variable:
    """The first argument of a call, given by position or (where torch's signature allows) by
    `keyword` (`torch.is_floating_point(input=y)`); a call without it raises natively."""
    if args:
        return args[0]
    if keyword is not None and keyword in kwargs:
        return kwargs[keyword]
    raise Unsupported(f"TypeError calling {getattr(fn, '__name__', fn)}: missing its first argument "
                      "(raised natively)", kind="unsupported")


def _holds_symbolic_number(data: Variable | None) -> bool:
    """A symbolic number, or a list or tuple holding one at any depth."""
    if isinstance(data, SymIntVariable):
        return True
    return isinstance(data, BaseSequenceVariable) and any(_holds_symbolic_number(item) for item in data.items)


def is_torch_function(value: Any) -> bool:
    """True for callables of the torch namespace that capture treats as graph ops."""
    if isinstance(value, type):
        return value in (torch.Size, torch.no_grad, torch.enable_grad, torch.set_grad_enabled,
                         torch.inference_mode, torch.finfo, torch.iinfo, torch.device, torch.dtype)
    if isinstance(value, torch._library.custom_ops.CustomOpDef):
        return True  # torch.library.custom_op: one node (its fake impl gives the output)
    objclass = getattr(value, "__objclass__", None)
    if objclass is not None and objclass in (torch._C.TensorBase, torch.Tensor):
        return True
    try:
        if (value in _CONSTANT_FNS or _break_kind(value) is not None or value in _TORCH_FUNCTION_CHECKS
                or value in _COMPILING_FNS or value in _EXPORTING_FNS or value in _QUERIES
                or value in _TRACING_STATE or value in _MODE_CALLS or value in _TELEMETRY_FNS):
            return True
    except TypeError:  # unhashable objects are never torch functions
        return False
    module = getattr(value, "__module__", None) or ""
    if not callable(value) or not (module == "torch" or module.startswith("torch.")):
        return False
    # Functions of torch's own Python modules that are plumbing rather than ops are inlined or
    # break; the op namespaces (torch, torch.nn.functional, torch.linalg, torch.fft, torch.special,
    # torch._C._nn, torch.ops) are graph ops.
    return (module in ("torch", "torch.functional", "torch.nn.functional", "torch._C._nn", "torch._C._fft",
                       "torch._C._linalg", "torch._C._special", "torch._C._VariableFunctions",
                       "torch.linalg", "torch.fft", "torch.special", "torch._tensor", "torch.random")
            or module.startswith("torch._ops") or isinstance(value, torch._ops.OpOverloadPacket)
            or isinstance(value, torch._ops.OpOverload) or module.startswith("torch.nn.init"))
