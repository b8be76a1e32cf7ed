"""The runtime of one compiled graph: what the glue calls with real tensors, and how it is persisted.

`AotRuntime` appends the module tensors the trace lifted, runs the compiled forward (inside a
torch.autograd.Function when a backward was compiled, so `loss.backward()` runs the compiled
backward), copies the new values of mutated inputs back into the caller's tensors exactly once,
and rebuilds outputs that alias inputs or each other as views so user code sees eager's aliasing.
kiln.autograd.backend builds it after tracing; this module imports only torch, so that a runtime
rebuilt from the persistent frame cache (`graph_recipe` / `load_graph_recipe`) runs in a process
that never loads the tracer, sympy or kiln.lower.

A recipe is plain data (pickled by kiln.capture.persist): per compiled half (forward, backward) the
wrapper's Python source, the names its globals need (dtypes, devices, ATen overloads by name), the
argument kinds of each kernel and the path of the kernels' shared object in the C++ cache; plus the
AOT facts the runtime reads (mutated inputs, how each output is made, the output tree spec, the
autograd.Function's saved-tensor counts). A graph whose runtime holds anything else (symbolic view
sizes, lifted module tensors, constant tensors, a backend other than the built-in lowering) has no
recipe and its frame is not persisted.
PyTorch counterpart: torch/_functorch/_aot_autograd/runtime_wrappers.py and AOTAutogradCache.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import marshal
import operator
import types
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree

RECIPE_ATTR = "__kiln_recipe__"  # set by kiln.lower's make_wrapper on the wrapper function


def relayout(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """A copy of `t` with the strides the kernels were compiled for (the wrapper's `_relayout`)."""
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


# ---------------------------------------------------------------------------------------------------
# The wrapper of one lowered graph


@dataclasses.dataclass(frozen=True)
class WrapperRecipe:
    """Everything needed to rebuild a lowered graph's wrapper function without kiln.lower.

    `constants`: global name -> a dtype, device, layout, memory format or ATen overload (pickled by
    name); `kernels`: kernel name -> its ctypes argument kinds ("p" pointer, "i" int64);
    `library`: the shared object's path in the C++ cache (None when there are no kernels)."""

    source: str
    constants: dict[str, Any]
    kernels: dict[str, str]
    library: str | None
    output_spec: str | None
    code: bytes | None = None  # marshal of `source` compiled: loading skips compile()


_PORTABLE_CONSTANTS = (torch.dtype, torch.device, torch.layout, torch.memory_format, torch._ops.OpOverload)
_CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int64}
_libraries: dict[str, ctypes.CDLL] = {}


def wrapper_recipe(source: str, env: dict[str, Any], argtypes: dict[str, list[Any]], library: str | None,
                   output_spec: str | None, code: types.CodeType | None = None) -> WrapperRecipe | None:
    """The recipe of a wrapper made from `source` and its globals `env`; None when a global (a
    constant tensor, say) cannot be named in another process."""
    constants = {}
    for name, value in env.items():
        if name in ("torch", "_relayout"):
            continue
        if not isinstance(value, _PORTABLE_CONSTANTS):
            return None
        constants[name] = value
    kernels = {name: "".join("p" if t is ctypes.c_void_p else "i" for t in types)
               for name, types in argtypes.items()}
    if kernels and library is None:
        return None
    return WrapperRecipe(source, constants, kernels, library, output_spec,
                         marshal.dumps(code) if code is not None else None)


def bind_overloads(env: dict[str, Any]) -> None:
    """Replace each ATen overload among a wrapper's globals by the C++ callable it forwards to:
    OpOverload.__call__ is one Python frame that only calls `_op`, paid per extern per call. The
    recipe keeps the overload itself, which pickles by name."""
    for name, value in env.items():
        if isinstance(value, torch._ops.OpOverload):
            env[name] = getattr(value, "_op", value)


def load_wrapper(recipe: WrapperRecipe) -> Callable[..., Any]:
    """The wrapper function of a recipe, bound to its kernels (OSError if the library is gone)."""
    env: dict[str, Any] = {"torch": torch, "_relayout": relayout, **recipe.constants}
    bind_overloads(env)
    if recipe.kernels:
        lib = _libraries.get(recipe.library)  # type: ignore[arg-type]
        if lib is None:
            lib = _libraries[recipe.library] = ctypes.CDLL(recipe.library)  # type: ignore[index]
        for name, kinds in recipe.kernels.items():
            fn = getattr(lib, name)
            fn.argtypes = [_CTYPES[k] for k in kinds]
            fn.restype = None
            env[name] = fn
    # marshal data is tied to the Python version, which is part of the frame cache's key
    code = marshal.loads(recipe.code) if recipe.code is not None else compile(recipe.source, "<kiln wrapper>", "exec")
    exec(code, env)
    call = env["call"]
    if recipe.output_spec is None:
        return call
    spec = pytree.treespec_loads(recipe.output_spec)
    flat_call = call

    def nested(*args: Any) -> Any:
        return pytree.tree_unflatten(list(flat_call(*args)), spec)
    return nested


def _compiled_recipe(compiled: Any) -> WrapperRecipe | None:
    # kiln.lower's CompiledGraph keeps its wrapper function in `.fn`; make_wrapper tags it.
    return getattr(getattr(compiled, "fn", None), RECIPE_ATTR, None)


# ---------------------------------------------------------------------------------------------------
# The autograd.Function and the AOT runtime wrapper


def make_autograd_function(compiled_forward: Callable, compiled_backward: Callable, *,
                           num_forward_outputs: int,
                           num_saved_tensors: int, differentiable: Sequence[int],
                           primal_needs_grad: Sequence[bool]) -> type[torch.autograd.Function]:
    """A torch.autograd.Function whose forward and backward are the two compiled graphs.

    The class carries `fast_apply`, what AotRuntime calls: outside functorch transforms it goes
    straight to the C++ Function.apply. The Python classmethod in front of it binds default
    arguments with inspect (this forward has none) and rebuilds the argument tuple to unwrap dead
    functorch wrappers, about half the cost of applying a 20-input function."""
    diff = tuple(differentiable)
    non_diff = tuple(k for k in range(num_forward_outputs) if k not in diff)
    end_saved = num_forward_outputs + num_saved_tensors
    needs = tuple(primal_needs_grad)
    set_grad = torch._C._set_grad_enabled
    is_grad = torch.is_grad_enabled
    Tensor = torch.Tensor

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            # The joint graph was traced with grad mode on, and some kernels look at it (the
            # mkldnn RNN returns its workspace for the backward only then); detached inputs keep
            # autograd from recording anything in here.
            detached = [a.detach() if isinstance(a, Tensor) else a for a in args]
            previous = is_grad()
            set_grad(True)
            try:
                outs = compiled_forward(*detached)
            finally:
                set_grad(previous)
            fw_outs = outs[:num_forward_outputs]
            ctx.save_for_backward(*outs[num_forward_outputs:end_saved])
            ctx.symints = tuple(outs[end_saved:])
            if non_diff:
                ctx.mark_non_differentiable(*[fw_outs[k] for k in non_diff
                                              if isinstance(fw_outs[k], Tensor)])
            return tuple(fw_outs)

        @staticmethod
        def backward(ctx, *grad_outputs):
            # the backward graph was traced with contiguous tangents; a zero grad arrives for an
            # unused output because materialize_grads is on
            tangents = [grad_outputs[k].contiguous() for k in diff]
            grads = compiled_backward(*ctx.saved_tensors, *ctx.symints, *tangents)
            return tuple(g if need else None for g, need in zip(grads, needs))

    c_apply = super(torch.autograd.Function, CompiledFunction).apply  # torch._C._FunctionBase's
    functorch_active = torch._C._are_functorch_transforms_active
    python_apply = CompiledFunction.apply

    def fast_apply(*args: Any) -> Any:
        if functorch_active():
            return python_apply(*args)
        return c_apply(*args)

    CompiledFunction.fast_apply = staticmethod(fast_apply)  # type: ignore[attr-defined]
    CompiledFunction.recipe = dict(  # type: ignore[attr-defined]  # for graph_recipe
        backward=compiled_backward, num_forward_outputs=num_forward_outputs,
        num_saved_tensors=num_saved_tensors, differentiable=diff, primal_needs_grad=tuple(primal_needs_grad))
    return CompiledFunction


@dataclasses.dataclass(frozen=True)
class OutputRecord:
    """The fields of kiln.autograd.functionalize.OutputInfo the runtime reads (see there)."""

    kind: str
    base: int | None = None
    graph_index: int | None = None
    value: Any = None
    view: tuple[tuple[Any, ...], tuple[Any, ...], Any] | None = None


@dataclasses.dataclass(frozen=True)
class RuntimeMeta:
    """The fields of FunctionalMeta the runtime reads, as plain data (a persisted runtime's meta)."""

    mutated_inputs: tuple[int, ...]
    outputs: tuple[OutputRecord, ...]
    num_graph_outputs: int
    num_intermediate_bases: int


def _evaluate(x: Any, binding: dict, args: Sequence[Any]) -> int:
    if not isinstance(x, torch.SymInt):
        return int(x)
    import sympy  # only symbolic view sizes get here, and they come from a capture (sympy loaded)

    from kiln.symbolic.node import expr_of

    expr = expr_of(x)
    values = {}
    for sym in expr.free_symbols:
        index, dim = binding[sym]
        values[sym] = sympy.Integer(args[index] if dim is None else args[index].shape[dim])
    return int(expr.xreplace(values))


def _rebuild_view(base: torch.Tensor, info: Any, binding: dict, args: Sequence[Any]) -> torch.Tensor:
    size, stride, offset, *dtype = info.view
    if dtype:  # a view that reinterprets its base's bytes (view_as_complex, view(dtype))
        base = base.view(dtype[0])
    return base.as_strided([_evaluate(s, binding, args) for s in size],
                           [_evaluate(s, binding, args) for s in stride],
                           _evaluate(offset, binding, args))


def _unflattener(spec: Any) -> Callable[[list[Any]], Any] | None:
    """A cheap function list of leaves -> `spec`'s structure, made once per runtime: a flat tuple
    or list of leaves (the common output spec) needs no pytree walk per call. None when `spec` is
    None (a runtime built by hand, as in tests)."""
    if spec is None:
        return None
    if spec.is_leaf():
        return operator.itemgetter(0)
    children = spec.children()
    if all(c.is_leaf() for c in children):
        if spec.type is tuple:
            return tuple
        if spec.type is list:
            return list
    return functools.partial(_unflatten, spec=spec)


def _unflatten(leaves: list[Any], spec: Any) -> Any:
    return pytree.tree_unflatten(leaves, spec)


class AotRuntime:
    """The callable handed back to capture for one graph.

    `meta` is a FunctionalMeta (after a trace) or a RuntimeMeta (rebuilt from a recipe); `binding`
    maps each size symbol to (flat input index, dim or None) for views with symbolic sizes.
    What each call needs from them (lifted attribute getters, the mutation count, whether the graph's
    outputs are the user outputs as they are) is worked out here once, not per call."""

    def __init__(self, *, root: torch.nn.Module | None, lifted: tuple[str, ...], meta: Any,
                 out_spec: pytree.TreeSpec, binding: dict, forward: Callable,
                 function: type[torch.autograd.Function] | None = None, report: Any = None) -> None:
        self.root = root
        self.lifted = lifted
        self.meta = meta
        self.out_spec = out_spec
        self.binding = binding
        self.forward = forward
        self.function = function
        self.aot_report = report
        # the per-call plan
        self._getters = tuple(operator.attrgetter(path) for path in lifted)  # dotted paths work
        self._run = getattr(function, "fast_apply", function.apply) if function is not None else forward
        self._unflatten = _unflattener(out_spec)
        if meta is None:
            self._num_mutated, self._passthrough, self._num_outputs = 0, False, 0
            return
        self._num_mutated = len(meta.mutated_inputs)
        outputs = meta.outputs
        self._num_outputs = len(outputs)
        # the graph returns exactly the user outputs, in order, and the spec is a flat tuple: the
        # graph's tuple (after the mutated inputs' new values) is the result itself
        self._passthrough = (self._unflatten is tuple and meta.num_intermediate_bases == 0
                             and len(outputs) == meta.num_graph_outputs
                             and all(info.kind == "graph" and info.graph_index == k
                                     for k, info in enumerate(outputs)))

    def _lifted_values(self) -> list[torch.Tensor]:
        root = self.root
        return [get(root) for get in self._getters]

    def __call__(self, *args: Any) -> Any:
        if self._getters:
            flat: Any = list(args)
            root = self.root
            flat.extend(get(root) for get in self._getters)
        else:
            flat = args
        outs = self._run(*flat)
        num_mutated = self._num_mutated
        if num_mutated:
            for index, new in zip(self.meta.mutated_inputs, outs[:num_mutated]):
                # once per call, after the graph: the caller's tensor (a buffer such as a BatchNorm
                # running mean, or a user input) ends up as eager would leave it; a new value that
                # carries a gradient is copied with autograd on, so the caller's tensor gets its history
                with torch.set_grad_enabled(torch.is_grad_enabled() and new.requires_grad):
                    flat[index].copy_(new)
            graph_outs = outs[num_mutated:]
        else:
            graph_outs = outs
        if self._passthrough and type(graph_outs) is tuple and len(graph_outs) == self._num_outputs:
            return graph_outs
        meta = self.meta
        num_user = meta.num_graph_outputs - meta.num_intermediate_bases
        bases = graph_outs[num_user:]
        results: list[Any] = []
        for info in meta.outputs:
            results.append(self._output(info, flat, graph_outs, bases, results))
        return self._unflatten(results)

    def _output(self, info: Any, flat: list[Any], graph_outs: Sequence[Any],
                bases: Sequence[Any], results: list[Any]) -> Any:
        kind = info.kind
        if kind == "graph":
            return graph_outs[info.graph_index]
        if kind == "input":
            return flat[info.base]
        if kind == "input_view":
            return _rebuild_view(flat[info.base], info, self.binding, flat)
        if kind == "base":
            return bases[info.base]
        if kind == "base_view":
            return _rebuild_view(bases[info.base], info, self.binding, flat)
        if kind == "same_as":
            return results[info.base]
        return info.value


# ---------------------------------------------------------------------------------------------------
# Recipes: a runtime as plain data, and back

_PLAIN = (int, float, bool, str, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return type(value) in _PLAIN


def graph_recipe(runtime: Any) -> dict | None:
    """The recipe of a compiled graph's runtime, or None when it cannot be rebuilt elsewhere."""
    if type(runtime) is not AotRuntime or runtime.lifted:
        return None
    forward = _compiled_recipe(runtime.forward)
    if forward is None:
        return None
    meta = runtime.meta
    outputs = []
    for info in meta.outputs:
        if not _plain(info.value) or (info.view is not None and not _plain(info.view)):
            return None  # a symbolic view size, or an output constant with no literal
        outputs.append(OutputRecord(info.kind, info.base, info.graph_index, info.value, info.view))
    recipe: dict[str, Any] = {
        "forward": forward,
        "meta": RuntimeMeta(tuple(meta.mutated_inputs), tuple(outputs), meta.num_graph_outputs,
                            meta.num_intermediate_bases),
        "out_spec": pytree.treespec_dumps(runtime.out_spec),
        "function": None,
    }
    if runtime.function is not None:
        fields = dict(getattr(runtime.function, "recipe", None) or {})
        backward = _compiled_recipe(fields.pop("backward", None))
        if backward is None:
            return None
        recipe["function"] = dict(fields, backward=backward)
    return recipe


def load_graph_recipe(recipe: dict) -> AotRuntime:
    """A runtime from graph_recipe's output (OSError when a kernel library has left the cache)."""
    forward = load_wrapper(recipe["forward"])
    function = None
    if recipe["function"] is not None:
        fields = dict(recipe["function"])
        backward = load_wrapper(fields.pop("backward"))
        function = make_autograd_function(forward, backward, **fields)
    return AotRuntime(root=None, lifted=(), meta=recipe["meta"],
                      out_spec=pytree.treespec_loads(recipe["out_spec"]), binding={}, forward=forward,
                      function=function)
