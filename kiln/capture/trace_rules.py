"""The trace rules: for any callable or code capture meets, whether it is inlined (its bytecode
traced), put into the graph (one node), answered at trace time, or skipped (run natively at a
graph break), and why.

Every place that makes that decision asks this module: the variable factory (builder.wrap_value)
when it picks a kind for a value, the call of a Python function (functions.call_python_function)
when it honours the user's marks, the kinds that look attributes up on classes and modules
(user_object, functions), the torch-function kind (variables/torch.py), the builtin kind
(variables/builtin.py fills BUILTIN_RULES), and the tracer when it reports a break at the user's
line. The rules, in the order the factory applies them to a function:

1. the user's and torch's marks (`marked_rule`): kiln.disable / torch's disable -> skip;
   kiln.allow_in_graph -> one node; the callable kiln.compile returned -> inline its original;
   assume_constant_result -> run now, its result a constant;
2. torch functions (`is_torch_function`): graph ops, or answered at trace time from the tables
   below, or a break of a named kind (`torch_break_kind`);
3. libraries never inlined (`runs_natively`): I/O, logging, randomness, numpy, collectives;
4. builtins and stdlib functions with a rule of their own (`has_builtin_rule`);
5. everything else written in Python: inlined.
When the object kind calls a class or a library function, section 5 below says whether it runs
now (a pure library function on constants, `is_pure_library_function`), is built in the trace (a
class `constructible` attribute by attribute, a module class built from constants,
`trace_time_module_class`), or is a break, and of which kind (`break_kind_of`).

This module sits at the base of capture: it imports torch and the standard library only (the
kinds import it, never the other way round), so it adds nothing to capture's import cycle.
Corresponds to torch/_dynamo/trace_rules.py and the skip/allow lists of torch._dynamo.
"""
from __future__ import annotations

import dis
import enum
import inspect
import os
import sys
import traceback
import types
from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:
    from kiln.capture.tracer import Tracer
    from kiln.capture.variables.base import Variable


# ---- 1. marks set on functions ----------------------------------------------------------------
# The markers are plain attributes set on user functions by kiln.disable / kiln.allow_in_graph /
# kiln.compile (and by torch's own decorators); read with `getattr(fn, MARKER, False)`.

# A function carrying this attribute (True) is never traced: calls to it run natively (a graph break).
DISABLE_MARKER = "_kiln_disable"
# torch's own marks for functions Dynamo must not trace: torch._dynamo.disable and
# torch.compiler.disable set this attribute on their wrapper ...
TORCH_DISABLE_MARKER = "_torchdynamo_disable"
# ... and torch._disable_dynamo (on Optimizer.zero_grad, state_dict, load_state_dict, ...) wraps the
# function in a closure that imports torch._dynamo on its first call; it is known by its code.
_TORCH_LAZY_DISABLE_CODE = torch._disable_dynamo(lambda: None).__code__
# A function carrying this attribute (True) is put into the graph as one call_function node.
ALLOW_IN_GRAPH_MARKER = "_kiln_allow_in_graph"
# Set on the callable that kiln.compile returns; the tracer inlines `ORIGINAL_ATTR` instead of it.
COMPILED_MARKER = "_kiln_compiled"
ORIGINAL_ATTR = "_kiln_original"
# Set by torch._dynamo.assume_constant_result (and libraries that spell it without importing torch,
# as transformers' import probes do): a call with constant arguments runs for real while tracing,
# and its result is a constant of the graph.
CONSTANT_RESULT_MARKER = "_dynamo_marked_constant"


def is_disabled(fn: Any) -> bool:
    """True for a function capture must not trace: calls to it run natively (a graph break), and
    kiln.compile of it gives it back as it is. kiln.disable's mark, and torch's, as torch.compile
    honours them: torch marks the functions whose Python it keeps out of every graph (an
    optimizer's zero_grad and state_dict, the fused optimizer kernels' drivers)."""
    fn = getattr(fn, "__func__", fn)  # a bound method carries its function's marks
    if getattr(fn, DISABLE_MARKER, False) or getattr(fn, TORCH_DISABLE_MARKER, False) is True:
        return True
    return getattr(fn, "__code__", None) is _TORCH_LAZY_DISABLE_CODE


def has_constant_result(fn: Any) -> bool:
    """True for a function marked assume_constant_result: the user vouches that its result depends
    on nothing the graph could change, so it runs now and its result is folded in."""
    return getattr(fn, CONSTANT_RESULT_MARKER, False) is True


class Marked(enum.Enum):
    """What a mark on a Python function asks of a call to it."""

    SKIP = "disabled"  # run natively at a graph break (kiln.disable, torch's disable)
    IN_GRAPH = "allow_in_graph"  # one call_function node, its body never traced
    COMPILED = "compiled"  # a kiln.compile result: trace the function it wraps, not the wrapper
    CONSTANT_RESULT = "constant_result"  # run now, its result a constant of the graph


def marked_rule(fn: Any) -> Marked | None:
    """The rule a mark on `fn` sets for calling it, None for an unmarked function (inlined).
    The user's marks come first: they are how a user overrides every other rule."""
    if is_disabled(fn):
        return Marked.SKIP
    if getattr(fn, ALLOW_IN_GRAPH_MARKER, False):
        return Marked.IN_GRAPH
    if getattr(fn, COMPILED_MARKER, False):
        return Marked.COMPILED
    if has_constant_result(fn):
        return Marked.CONSTANT_RESULT
    return None


# ---- 2. torch functions -----------------------------------------------------------------------

# Answered at trace time from constant arguments (dtype helpers, scripting/tracing flags, nn's
# _pair family): their result is a Python value the code branches on, not a tensor, so there is no
# node to record and the answer is folded in.
def _constant_fns() -> set[Any]:
    fns = {torch.get_default_dtype, torch.is_floating_point, torch.is_complex,
           torch.promote_types, torch.can_cast, torch.finfo, torch.iinfo, torch.device, torch.dtype,
           torch.is_autocast_enabled, torch.is_inference_mode_enabled, torch.jit.is_scripting,
           torch.jit.is_tracing, torch.nn.modules.utils._pair, torch.nn.modules.utils._single, torch.nn.modules.utils._triple,
           torch.nn.modules.utils._ntuple}
    return fns


CONSTANT_FNS = _constant_fns()
# "Does any argument (or a mode) override __torch_function__?": answered at trace time (variables/torch.py).
TORCH_FUNCTION_CHECKS = {torch._C._has_torch_function, torch._C._has_torch_function_unary,
                         torch._C._has_torch_function_variadic, torch.overrides.has_torch_function,
                         torch.overrides.has_torch_function_unary, torch.overrides.has_torch_function_variadic,
                         torch.overrides.is_tensor_like}
# "Am I being compiled?": True while capturing (model code picks its compile-friendly path on it);
# inlining them would read torch.compile's own flags and answer False.
COMPILING_FNS = {torch.compiler.is_compiling, torch.compiler.is_dynamo_compiling, torch._utils.is_compiling}
EXPORTING_FNS = {torch.compiler.is_exporting}
def graph_break() -> None:
    """End the graph here (`kiln.graph_break()`, as `torch._dynamo.graph_break()`): a no-op when run,
    a graph break where capture meets it; the code after it resumes in a new graph."""


# torch's own forced break, known by name: capture never imports torch._dynamo to compare it
_TORCH_GRAPH_BREAK = ("torch._dynamo.decorators", "graph_break")

# Calls with effects the graph cannot hold, each a break of the given kind.
BREAK_FNS = {graph_break: "graph_break", torch.manual_seed: "random", torch.seed: "random", torch.save: "unsupported_call",
             torch.load: "unsupported_call", torch.set_printoptions: "unsupported_call", torch.Tensor.item: "item",
             torch.Tensor.tolist: "item", torch.Tensor.numpy: "numpy", torch.Tensor.backward: "unsupported_call",
             torch.autograd.grad: "unsupported_call", torch.autograd.backward: "unsupported_call"}
# Calls of the torch namespace that read or change state of the process rather than compute: as
# graph nodes they returned nothing any other node reads, so they were run once at trace time and
# then dropped from the graph (a second call of the compiled code did not set the thread count;
# set_rng_state did not rewind the generator). Each is a break, run for real where the program runs it.
BREAK_FNS.update({fn: "random" for fn in (torch.get_rng_state, torch.set_rng_state, torch.initial_seed,
                                          torch.random.fork_rng)})
BREAK_FNS.update({fn: "unsupported_call" for fn in (
    torch.set_num_threads, torch.set_num_interop_threads, torch.set_float32_matmul_precision,
    torch.use_deterministic_algorithms, torch.set_deterministic_debug_mode, torch.set_anomaly_enabled,
    torch.set_flush_denormal, torch.set_warn_always, torch.set_default_device, torch.set_default_tensor_type)})
# The protocol methods of torch's mode managers called as functions (contextlib.ExitStack's
# enter_context calls `type(cm).__enter__(cm)`): capture follows these managers as `with` blocks
# only, so entered this way the real object was never entered, and native code exiting it later
# (the stack's __exit__ after a break) raised AttributeError. A break runs each call for real on a
# manager from outside; one made in the frame has no identity a break can hand on (each rebuild is
# a new object), so its frame runs eagerly, as torch.compile runs it (kind "frame_eager").
MANAGER_PROTOCOL = frozenset(getattr(cls, method)
                             for cls in (torch.autocast, torch.cpu.amp.autocast, torch.no_grad, torch.enable_grad,
                                         torch.set_grad_enabled, torch.inference_mode)
                             for method in ("__enter__", "__exit__"))
BREAK_FNS.update({fn: "unsupported_call" for fn in MANAGER_PROTOCOL})


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


QUERIES = _query_table()
# Getters of process-wide settings that the table does not name (torch.is_anomaly_enabled,
# torch.is_warn_always_enabled, torch.get_deterministic_debug_mode, torch.get_autocast_dtype("cpu")):
# torch functions named as a question or a getter. Called on constant arguments only, they answer
# from the process, so the answer is guarded as a GUARDED query's (a graph made with anomaly mode
# off was reused with it on, its `if torch.is_anomaly_enabled()` branch stale).
_GETTER_PREFIXES = ("is_", "are_", "get_", "_is_", "_get_")


def is_state_getter(fn: Any) -> bool:
    name = getattr(fn, "__name__", None)
    return isinstance(name, str) and name.startswith(_GETTER_PREFIXES) and is_torch_function(fn)
# Tracing-state questions with one answer during capture: Kiln's trace is neither an FX symbolic
# trace nor TorchScript (torch.compile answers the same; is_fx_tracing would also log a warning).
TRACING_STATE = {torch.fx._symbolic_trace.is_fx_tracing: False,
                 torch.fx._symbolic_trace.is_fx_symbolic_tracing: False,
                 torch._C._get_tracing_state: None, torch._C._is_tracing: False,
                 torch.onnx.is_in_onnx_export: False,
                 # nn.MultiheadAttention's fast path is one opaque kernel; torch.compile answers that a
                 # tracer runs, so the decomposed path is traced (its batch-first output made contiguous
                 # as the fast path's: fast_path_blocked_by_tracing)
                 torch.nn.modules.activation._is_make_fx_tracing: True}
# Usage telemetry (torchvision logs each model and op it runs, once per process, to whatever logger
# a deployment installed): no effect on any value, so traced away as torch.compile's graph keeps it
# out of the computation; nothing is left to replay.
TELEMETRY_FNS = {torch._C._log_api_usage_once, torch._C._log_api_usage_metadata}
# Answered at trace time from the tensors' metadata by a call rule (variables/foreach.py): how
# torch.optim and clip_grad_norm_ split their tensor lists by device and dtype.
METADATA_FNS = {torch._C._group_tensors_by_device_and_dtype}
# Calls that change a process-wide setting at their point of the graph (process_modes.py).
MODE_CALLS = {torch.set_default_dtype, torch._C._set_default_dtype, torch._C._set_grad_enabled,
              torch._C._autograd._saved_tensors_hooks_disable, torch._C._autograd._saved_tensors_hooks_enable,
              torch._C._autograd._saved_tensors_hooks_get_disabled_error_message}


def torch_break_kind(fn: Any) -> str | None:
    """The break kind of a call to fn, seen through functools.wraps wrappers: importing torch._dynamo
    replaces torch.manual_seed with a wrapper (torch._disable_dynamo) that BREAK_FNS does not hold."""
    for _ in range(4):
        try:
            kind = BREAK_FNS.get(fn)
        except TypeError:  # unhashable
            return None
        # read without running a user class's __getattr__ (its side effects are the trace's)
        if kind is None and isinstance(fn, types.FunctionType) and (fn.__module__, fn.__qualname__) == _TORCH_GRAPH_BREAK:
            kind = "graph_break"
        wrapped = _own_wrapped(fn)
        if kind is not None or wrapped is None:
            return kind
        fn = wrapped
    return None


def _own_wrapped(fn: Any) -> Any:
    """`fn.__wrapped__` set on the object itself (functools.wraps, lru_cache), else None."""
    try:
        namespace = object.__getattribute__(fn, "__dict__")
    except AttributeError:
        return None
    return namespace.get("__wrapped__") if isinstance(namespace, dict) else None


_CLASS_DESCRIPTORS = (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType,
                      types.GetSetDescriptorType, types.MemberDescriptorType)


def is_torch_function(value: Any) -> bool:
    """True for callables of the torch namespace that capture treats as graph ops: one node each,
    unless a table above answers the call at trace time or makes it a break. torch's own Python
    plumbing outside the op namespaces is not: it is inlined like user code."""
    if isinstance(value, type):
        return value in (torch.Size, torch.no_grad, torch.enable_grad, torch.set_grad_enabled,
                         torch.inference_mode, torch.finfo, torch.iinfo, torch.device, torch.dtype)
    if isinstance(value, torch._library.custom_ops.CustomOpDef):
        return True  # torch.library.custom_op: one node (its fake impl gives the output)
    # only descriptors of a class carry __objclass__: asking any value for it would run a user
    # class's __getattr__, which may raise anything (a KeyError from a table lookup)
    objclass = value.__objclass__ if isinstance(value, _CLASS_DESCRIPTORS) else None
    if objclass is not None and objclass in (torch._C.TensorBase, torch.Tensor):
        return True
    try:
        if (value in CONSTANT_FNS or torch_break_kind(value) is not None or value in TORCH_FUNCTION_CHECKS
                or value in COMPILING_FNS or value in EXPORTING_FNS or value in QUERIES
                or value in TRACING_STATE or value in MODE_CALLS or value in TELEMETRY_FNS
                or value in METADATA_FNS):
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


# ---- 3. libraries never inlined ---------------------------------------------------------------

# Libraries whose Python functions are never inlined: they do I/O, logging or randomness, or work on
# numpy arrays rather than tensors; their calls run natively at a graph break.
NEVER_TRACED = frozenset({"numpy", "scipy", "pandas", "logging", "warnings", "random", "os", "sys",
                          "json", "pickle", "time", "datetime", "subprocess", "threading", "socket",
                          "pdb", "traceback", "tqdm"})


# Packages of torch itself that are never inlined: torch.distributed's Python drives collectives and
# process groups (a collective traced on fake tensors would talk to other processes at trace time).
NEVER_TRACED_PACKAGES = ("torch.distributed",)

# Functions run natively by the rules of a module that registers a test here (torch.optim's fused
# drivers, variables/optimizer.py): their Python launches kernels the graph cannot hold.
NATIVE_FUNCTIONS: list[Callable[[Any], bool]] = []


def in_packages(module: str, packages: tuple[str, ...]) -> bool:
    """True when `module` is one of `packages` or a submodule of one."""
    return any(module == p or module.startswith(p + ".") for p in packages)


def never_traced(fn: Any) -> bool:
    """True for a function of a library in NEVER_TRACED or NEVER_TRACED_PACKAGES (see there)."""
    module = fn.__module__ or ""
    return module.split(".")[0] in NEVER_TRACED or in_packages(module, NEVER_TRACED_PACKAGES)


# torch's own Python functions that run natively at a graph break, as torch.compile skips them:
# packing a padded batch and padding a packed one sort by the lengths and read them on the CPU (the
# batch sizes), which fake tensors do not have; inlined, each broke several times inside torch's code
# (and left a small graph between the breaks) instead of once at the user's call.
NATIVE_TORCH_FUNCTIONS = frozenset({("torch.nn.utils.rnn", "pack_padded_sequence"),
                                    ("torch.nn.utils.rnn", "pad_packed_sequence")})


def runs_natively(fn: Any) -> bool:
    """True for a Python function whose calls run natively at a graph break: a never-traced
    library's, one of NATIVE_TORCH_FUNCTIONS, or one a registered NATIVE_FUNCTIONS test claims."""
    if (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)) in NATIVE_TORCH_FUNCTIONS:
        return True
    return never_traced(fn) or any(test(fn) for test in NATIVE_FUNCTIONS)


# Attributes of these modules never change while a program runs: reading them needs no guard, and
# their classes' attributes are fixed for the process.
STABLE_MODULES = frozenset({"torch", "math", "operator", "functools", "itertools", "collections",
                             "typing", "builtins", "dataclasses", "enum", "inspect", "numpy", "types",
                             "abc", "copy", "warnings", "logging", "random", "einops"})


def in_stable_module(module_name: str | None) -> bool:
    """True when `module_name` belongs to a package of STABLE_MODULES (see there)."""
    return (module_name or "").split(".")[0] in STABLE_MODULES


# The directories of torch and the standard library: a break raised while inlining code from them
# is reported at the user's line that called into them (the user cannot act on torch's line).
LIBRARY_DIRS = tuple(os.path.dirname(p) + os.sep for p in (torch.__file__, os.__file__))


def is_library_code(filename: str) -> bool:
    """True for code of torch or the standard library (see LIBRARY_DIRS)."""
    return filename.startswith(LIBRARY_DIRS)


# ---- 4. builtins with a rule of their own -----------------------------------------------------

# The rule of each builtin (and stdlib function treated like one, e.g. operator.add) that capture
# answers itself rather than inlining or running natively: filled with @builtin_rule (below) by
# variables/builtin.py and the kinds and operators that add rules of their own. A Python function held here is called through its rule, never inlined.
BuiltinRule = Callable[["Tracer", list["Variable"], dict[str, "Variable"]], "Variable"]
BUILTIN_RULES: dict[Any, BuiltinRule] = {}


def builtin_rule(*fns: Any) -> Callable[[BuiltinRule], BuiltinRule]:
    """Register the rule for builtins `fns` (the function's name must be `<builtin>_rule`)."""

    def register(rule: BuiltinRule) -> BuiltinRule:
        for fn in fns:
            assert fn not in BUILTIN_RULES, fn
            BUILTIN_RULES[fn] = rule
        return rule

    return register


def has_builtin_rule(value: Any) -> bool:
    """True for a callable BUILTIN_RULES holds (unhashable values never are)."""
    try:
        return value in BUILTIN_RULES
    except TypeError:
        return False


# ---- 5. calls answered or objects built at trace time, and the kind of a break ----------------
# Read by the object kind (variables/user_object.py) when a class, a library function or any other
# object is called.

# Libraries whose calls are graph breaks of a named kind.
LIBRARY_BREAK_KINDS = {"numpy": "numpy", "scipy": "numpy", "pandas": "numpy", "math": "unsupported_call", "random": "random",
                       "logging": "logging", "time": "unsupported_call", "os": "unsupported_call",
                       "sys": "unsupported_call", "warnings": "logging", "builtins": "unsupported_call"}


# functions that read the Python frames calling them (namedtuple and Enum's functional API take the
# new class's __module__ from there): no traced frame is the one they would see
FRAME_INTROSPECTION: tuple[Any, ...] = (sys._getframe, inspect.currentframe, inspect.stack, inspect.trace,
                                        traceback.extract_stack, traceback.format_stack, traceback.print_stack,
                                        traceback.walk_stack)


def break_kind_of(value: Any) -> str:
    if any(value is reader for reader in FRAME_INTROSPECTION):
        return "frame_introspection"
    module = getattr(value, "__module__", None) or type(value).__module__ or ""
    if isinstance(value, types.ModuleType):
        module = value.__name__
    if in_packages(module, NEVER_TRACED_PACKAGES):
        return "collective"
    root = module.split(".")[0]
    return LIBRARY_BREAK_KINDS.get(root, "unsupported_call")


# Functions of these modules are pure: on trace-time constants they run while tracing.
PURE_MODULES = frozenset({"math", "cmath", "operator", "itertools", "functools", "string", "re", "copy"})


def is_pure_library_function(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    if isinstance(obj, types.BuiltinFunctionType) and module in PURE_MODULES:
        return True
    if is_numpy_math(obj):
        return True
    return module in ("math", "cmath") and callable(obj) and not isinstance(obj, type)


def is_numpy_math(obj: Any) -> bool:
    """numpy ufuncs (np.sqrt, np.exp, ...): pure, so on Python scalars they fold like math.* does."""
    return type(obj).__name__ == "ufunc" and type(obj).__module__ == "numpy"


def trace_time_module_class(obj: Any) -> bool:
    """A module class capture may construct at trace time: torch.nn's own, or a subclass whose
    every `__init__` outside torch.nn only stores attributes on self (transformers' activations,
    built by `ACT2FN[name]` inside a forward). The instance is made once per trace, so its
    constructor must not touch anything else."""
    if not isinstance(obj, type) or not issubclass(obj, torch.nn.Module):
        return False
    for base in obj.__mro__:
        if base.__module__.startswith("torch.nn.") or base is object:
            continue
        init = base.__dict__.get("__init__")
        if init is not None and not (isinstance(init, types.FunctionType) and only_stores_on_self(init)):
            return False
        if any(k in base.__dict__ for k in ("__new__", "__init_subclass__", "__setattr__")):
            return False
    return True


IMPURE_OPS = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF", "IMPORT_NAME",
                         "STORE_SUBSCR", "DELETE_SUBSCR", "DELETE_ATTR", "CALL_FUNCTION_EX", "YIELD_VALUE",
                         "RAISE_VARARGS", "SETUP_WITH", "BEFORE_WITH"})


def only_stores_on_self(init: types.FunctionType) -> bool:
    """By its bytecode: `__init__` stores attributes only on its first argument, calls nothing but
    `super()` and the base `__init__`, and writes no global, cell or container."""
    code = init.__code__
    if code.co_argcount == 0 or code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE):
        return False
    self_name = code.co_varnames[0]
    calls = allowed = 0
    previous = None
    for ins in dis.get_instructions(code):
        if ins.opname in IMPURE_OPS:
            return False
        if ins.opname == "LOAD_METHOD" and ins.argval != "__init__":
            return False
        if ins.opname == "STORE_ATTR" and not (previous is not None and previous.opname == "LOAD_FAST"
                                                and previous.argval == self_name):
            return False
        if ins.opname == "STORE_FAST" and ins.argval == self_name:
            return False
        if ins.opname == "CALL":
            calls += 1
        if ins.opname == "LOAD_METHOD" or (ins.opname == "LOAD_GLOBAL" and ins.argval == "super"):
            allowed += 1
        previous = ins
    return calls <= allowed


def python_new(cls: type) -> tuple[type, types.FunctionType] | None:
    """The class on `cls`'s MRO whose `__new__` is found first, and that `__new__`, where it is
    the program's Python code (a cache, a singleton, a tuple subclass's field mapping); None where
    it is a builtin's or the one collections.namedtuple generated."""
    for base in cls.__mro__:
        if "__new__" in base.__dict__:
            if issubclass(base, tuple) and "_fields" in base.__dict__ and "_make" in base.__dict__:
                return None
            static = base.__dict__["__new__"]
            fn = static.__func__ if isinstance(static, staticmethod) else static
            return (base, fn) if isinstance(fn, types.FunctionType) else None
    return None


def constructible(cls: type, own_new: bool = False) -> bool:
    """A plain Python class whose instances capture can build attribute by attribute (with
    `own_new`, one whose Python `__new__` builds them with object.__new__)."""
    if cls.__module__ == "builtins" or issubclass(cls, (torch.nn.Module, torch.Tensor, BaseException, tuple, dict, list)):
        return False
    new_ok = cls.__new__ is object.__new__ or own_new and python_new(cls) is not None
    # a __setattr__ written in Python is inlined on each write (tracer.setattr); a builtin one is not
    if not new_ok or not (cls.__setattr__ is object.__setattr__ or
                          isinstance(inspect.getattr_static(cls, "__setattr__"), types.FunctionType)):
        return False
    if inspect.getattr_static(type(cls), "__call__") is not _TYPE_CALL:
        return False  # a metaclass's own __call__ decides what calling the class does
    init = inspect.getattr_static(cls, "__init__")
    return init is object.__init__ or isinstance(init, types.FunctionType)


_TYPE_CALL = type.__dict__["__call__"]
