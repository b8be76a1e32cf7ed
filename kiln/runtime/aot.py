"""The runtime of one compiled graph: what the glue calls with real tensors, and how it is persisted.

`AotRuntime` appends the module tensors the trace lifted, runs the compiled forward (inside a
torch.autograd.Function when a backward was compiled, so `loss.backward()` runs the compiled
backward), copies the new values of mutated inputs back into the caller's tensors exactly once,
and rebuilds outputs that alias inputs or each other as views so user code sees eager's aliasing.
kiln.autograd.backend builds it after tracing; this module imports only torch and the runtime at
import time (kiln.symbolic.node only inside the functions that read symbolic sizes, see
docs/seams.md), so that a runtime rebuilt from the persistent frame cache runs in a process that
never loads the tracer, sympy or kiln.lower.

It follows the artifact protocol (kiln.runtime.artifact): `AotRuntime.artifact_recipe()` is a
Recipe of kind "aot" holding the recipes of its compiled halves (forward, backward), the AOT facts
the runtime reads (mutated inputs, how each output is made, the output tree spec) and the
autograd.Function's saved-tensor counts; the loader of kind "aot" rebuilds it. A runtime holding
anything else (symbolic view sizes other than whole dims of the view's base, lifted module
tensors, output constants that are not literals, halves without a recipe) describes itself as
None, and its frame is not persisted.
PyTorch counterpart: torch/_functorch/_aot_autograd/runtime_wrappers.py and AOTAutogradCache.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree

from kiln.runtime.artifact import Recipe, describe, loader, rebuild
from kiln.runtime.records import record_type


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
    # a C++ wrapper's list entry (kiln.runtime.kernel_wrapper.positional); None for other compilers
    steal = getattr(compiled_backward, "steal", None) or getattr(getattr(compiled_backward, "fn", None), "steal", None)

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
            if is_grad():  # backward(create_graph=True): the gradients get a history that refuses a second backward
                grads = gradients_without_second_backward(compiled_backward, [*ctx.saved_tensors, *ctx.symints],
                                                          tangents)
            elif steal is None:
                grads = compiled_backward(*ctx.saved_tensors, *ctx.symints, *tangents)
            else:  # the wrapper gets the only references: each activation is freed after its last use
                args = [*ctx.saved_tensors, *ctx.symints, *tangents]
                del tangents
                ctx.maybe_clear_saved_tensors()  # keeps them under retain_graph=True
                grads = steal(args)
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


DOUBLE_BACKWARD_ERROR = (
    "kiln: a backward through gradients that a compiled graph computed (backward(create_graph=True) or "
    "autograd.grad(..., create_graph=True), then a second backward) is not supported: the compiled backward "
    "has no derivative of its own. Compute second-order gradients (gradient penalties, Hessian-vector "
    "products) outside kiln.compile, e.g. with kiln.disable on the function whose gradients you "
    "differentiate again.")


class _CompiledBackward(torch.autograd.Function):
    """The compiled backward under create_graph=True: its gradients come out with a grad_fn, as
    eager's do, whose own backward raises DOUBLE_BACKWARD_ERROR. Without that history a gradient
    penalty added to the loss would silently contribute nothing. The first input is a leaf that
    requires grad, so the history is there even when no incoming gradient requires grad."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, backward: Callable, saved: list, *tangents: torch.Tensor) -> Any:
        return tuple(backward(*saved, *tangents))  # autograd.Function.forward runs with grad mode off

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        raise RuntimeError(DOUBLE_BACKWARD_ERROR)


def gradients_without_second_backward(compiled_backward: Callable, saved: list, tangents: list) -> list:
    """The compiled backward's gradients with a history that raises on a second backward."""
    anchor = torch.empty(0, requires_grad=True)
    return list(_CompiledBackward.apply(anchor, compiled_backward, saved, *tangents))


def without_grad(forward: Callable) -> Callable:
    """An inference graph's compiled forward, run with grad mode off.

    No output of such a graph carries a gradient (AOT autograd traced no backward for it), so
    autograd must record nothing while it runs: a matmul writing through its out= overload raises
    when grad mode is on and an argument requires grad (a module's parameters under `torch.no_grad()`
    inside the compiled function), and any other ATen call would hand out results with a grad_fn
    that eager's do not have. Graphs whose inputs require no grad, or that were traced with grad
    off, need no such wrapper (what it costs a call is paid only where it is needed)."""
    set_grad = torch._C._set_grad_enabled
    is_grad = torch.is_grad_enabled

    def run(*args: Any) -> Any:
        if not is_grad():
            return forward(*args)
        set_grad(False)
        try:
            return forward(*args)
        finally:
            set_grad(True)

    return run


def with_grad(apply: Callable) -> Callable:
    """A training graph's autograd.Function applied with grad mode on, for a graph captured under
    the caller's no_grad whose only gradients come from an enable_grad region inside it (a guard
    holds the caller's mode): applied under no_grad, its outputs would carry no grad_fn."""
    def run(*args: Any) -> Any:
        with torch.enable_grad():
            return apply(*args)

    return run


@record_type
@dataclasses.dataclass(frozen=True)
class BaseDim:
    """In a persisted view record: the size `dim` of the view's base, read at run time (an unbacked
    size, nonzero's count, that `plan_unbound_views` found to be a whole dim of the base)."""

    dim: int


@record_type
@dataclasses.dataclass(frozen=True)
class OutputRecord:
    """The fields of kiln.autograd.functionalize.OutputInfo the runtime reads (see there); `rank`:
    the base's rank, for a view whose record reads sizes of its base (BaseDim)."""

    kind: str
    base: int | None = None
    graph_index: int | None = None
    value: Any = None
    view: tuple[tuple[Any, ...], tuple[Any, ...], Any] | None = None
    rank: int | None = None


@record_type
@dataclasses.dataclass(frozen=True)
class RuntimeMeta:
    """The fields of FunctionalMeta the runtime reads, as plain data (a persisted runtime's meta)."""

    mutated_inputs: tuple[int, ...]
    outputs: tuple[OutputRecord, ...]
    num_graph_outputs: int
    num_intermediate_bases: int


# A binding entry (FROM_BASE, dim): the symbol is the size `dim` of the view's own base (a graph
# output), not of an input; how unbacked sizes (nonzero's count) are read back at run time.
FROM_BASE = -1


def _evaluate(x: Any, binding: dict, args: Sequence[Any], base: torch.Tensor | None = None) -> int:
    if isinstance(x, BaseDim):
        assert base is not None
        return int(base.shape[x.dim])
    if not isinstance(x, torch.SymInt):
        return int(x)
    import sympy  # only symbolic view sizes get here, and they come from a capture (sympy loaded)

    from kiln.symbolic.node import expr_of

    expr = expr_of(x)
    values = {}
    for sym in expr.free_symbols:
        index, dim = binding[sym]
        if index == FROM_BASE:
            assert base is not None
            values[sym] = sympy.Integer(base.shape[dim])
        elif dim is None and type(args[index]) is float:  # a float argument: sympy's Float is exact
            values[sym] = sympy.Float(args[index])
        else:
            values[sym] = sympy.Integer(args[index] if dim is None else args[index].shape[dim])
    return int(expr.xreplace(values))


def _rebuild_view(base: torch.Tensor, view: tuple, binding: dict, args: Sequence[Any]) -> torch.Tensor:
    size, stride, offset, *dtype = view
    if dtype:  # a view that reinterprets its base's bytes (view_as_complex, view(dtype))
        base = base.view(dtype[0])
    return base.as_strided([_evaluate(s, binding, args, base) for s in size],
                           [_evaluate(s, binding, args, base) for s in stride],
                           _evaluate(offset, binding, args, base))


def _symbols(view: tuple) -> set:
    from kiln.symbolic.node import expr_of

    found: set = set()
    for x in (*view[0], *view[1], view[2]):
        if isinstance(x, torch.SymInt):
            found |= expr_of(x).free_symbols
    return found


def _same_layout(traced: tuple, captured: tuple) -> bool:
    """Whether two (size, stride, offset) records of one view agree wherever either is a plain int
    (their symbols may differ: the AOT trace renames unbacked ones)."""
    t_size, t_stride, t_offset = traced[:3]
    c_size, c_stride, c_offset = captured[:3]
    if len(t_size) != len(c_size) or len(t_stride) != len(c_stride):
        return False
    for a, b in zip((*t_size, *t_stride, t_offset), (*c_size, *c_stride, c_offset)):
        if isinstance(a, torch.SymInt) != isinstance(b, torch.SymInt):
            return False
        if not isinstance(a, torch.SymInt) and a != b:
            return False
    return True


def _output_examples(root: Any) -> list[Any] | None:
    """The captured graph's flat outputs as traced by capture (fake tensors), or None."""
    graph = getattr(root, "graph", None)
    if graph is None:
        return None
    for node in graph.nodes:
        if node.op == "output":
            leaves = pytree.tree_leaves(node.args[0])
            return [getattr(leaf, "meta", {}).get("example_value") for leaf in leaves]
    return None


def plan_unbound_views(root: Any, meta: Any, binding: dict) -> dict[int, tuple[tuple, dict, int]]:
    """Output position -> (view record, binding) for view outputs whose traced size, stride or
    offset holds a symbol that no input carries: an unbacked size made inside the graph (the
    count of a nonzero whose columns are returned, as `nonzero(as_tuple=True)` does).

    The AOT trace's view only names that symbol; its value is a size of the real base the graph
    returns. Capture's fake of the same output still knows its base (`_base`), so the view is
    rebuilt from capture's record, with each unbound symbol read from the base's shape where that
    symbol is a whole dim. Anything else is refused here, at compile time (the frame runs eagerly
    with that reason), rather than guessed at run time. The plan's last field is the base's rank,
    checked at run time before a size is read from it."""
    plans: dict[int, tuple[tuple, dict, int]] = {}
    if meta is None:
        return plans
    examples: list[Any] | None = None
    for k, info in enumerate(meta.outputs):
        if info.view is None or not (_symbols(info.view) - binding.keys()):
            continue
        if examples is None:
            examples = _output_examples(root) or []
        plan = _plan_from_capture(info, examples[k] if k < len(examples) else None, binding)
        if plan is None:
            from kiln.errors import Unsupported

            raise Unsupported(f"output {k} is a view of another output whose size depends on tensor data "
                              "(an unbacked size), and its size cannot be read back from its base",
                              kind="unbacked_view_output")
        plans[k] = plan
    return plans


def _plan_from_capture(info: Any, example: Any, binding: dict) -> tuple[tuple, dict, int] | None:
    from kiln.symbolic.node import expr_of

    base = getattr(example, "_base", None)
    if not isinstance(example, torch.Tensor) or base is None or info.kind != "base_view":
        return None
    captured = (tuple(example.shape), tuple(example.stride()), example.storage_offset(), *info.view[3:])
    if not _same_layout(info.view, captured):
        return None
    local = dict(binding)
    for dim, size in enumerate(base.shape):
        if isinstance(size, torch.SymInt):
            expr = expr_of(size)
            if getattr(expr, "is_Symbol", False) and expr not in local:
                local[expr] = (FROM_BASE, dim)
    if _symbols(captured) - local.keys():
        return None
    return captured, local, base.dim()


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
                 function: type[torch.autograd.Function] | None = None, report: Any = None,
                 grad_mode: bool | None = None) -> None:
        self.root = root
        self.lifted = lifted
        self.meta = meta
        self.out_spec = out_spec
        self.binding = binding
        self.forward = forward
        self.function = function
        self.aot_report = report
        self._views = plan_unbound_views(root, meta, binding)
        # the per-call plan
        self._getters = tuple(operator.attrgetter(path) for path in lifted)  # dotted paths work
        # the grad mode the graph runs under where the caller's (a guard holds it) is not the one
        # it was traced for: None, the caller's; False, an inference graph traced with grad on and
        # inputs requiring grad (`without_grad`); True, a training graph captured under no_grad
        # whose gradients come from an enable_grad region inside it (`with_grad`)
        self.grad_mode = grad_mode
        run = getattr(function, "fast_apply", function.apply) if function is not None else forward
        self._run = without_grad(run) if grad_mode is False else with_grad(run) if grad_mode else run
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

    def artifact_recipe(self) -> Recipe | None:
        """This runtime as data (kiln.runtime.artifact), or None when it cannot travel."""
        return _recipe(self)

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
        for k, info in enumerate(meta.outputs):
            results.append(self._output(k, info, flat, graph_outs, bases, results))
        assert self._unflatten is not None  # only a runtime built by hand without meta has no spec
        return self._unflatten(results)

    def _output(self, k: int, info: Any, flat: list[Any], graph_outs: Sequence[Any],
                bases: Sequence[Any], results: list[Any]) -> Any:
        kind = info.kind
        if kind == "graph":
            return graph_outs[info.graph_index]
        if kind == "input":
            return flat[info.base]
        if kind == "input_view":
            return _rebuild_view(flat[info.base], info.view, self.binding, flat)
        if kind == "base":
            return bases[info.base]
        if kind == "base_view":
            base = bases[info.base]
            plan = self._views.get(k)
            if plan is None:
                rank = getattr(info, "rank", None)  # a persisted view that reads sizes of its base
                if rank is not None and base.dim() != rank:
                    raise RuntimeError(f"kiln: output {k} is a view of a rank-{rank} base, and the graph returned "
                                       f"a rank-{base.dim()} one (an internal error: please report it)")
                return _rebuild_view(base, info.view, self.binding, flat)
            view, binding, rank = plan
            if base.dim() != rank:
                raise RuntimeError(f"kiln: output {k} is a view of a rank-{rank} base, and the graph returned "
                                   f"a rank-{base.dim()} one (an internal error: please report it)")
            return _rebuild_view(base, view, binding, flat)
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


def _recipe(runtime: AotRuntime) -> Recipe | None:
    if runtime.lifted:
        return None  # module tensors read through `root` of this process
    forward = describe(runtime.forward)
    meta = runtime.meta
    if forward is None or meta is None:
        return None
    outputs = []
    for k, info in enumerate(meta.outputs):
        if not _plain(info.value):
            return None  # an output constant with no literal
        if info.view is not None and not _plain(info.view):
            record = _base_dims_view(runtime._views.get(k))
            if record is None:
                return None  # a symbolic view size that is not a whole dim of the view's base
            view, rank = record
            outputs.append(OutputRecord(info.kind, info.base, info.graph_index, info.value, view, rank))
            continue
        outputs.append(OutputRecord(info.kind, info.base, info.graph_index, info.value, info.view))
    fields: dict[str, Any] = {
        "forward": forward,
        "meta": RuntimeMeta(tuple(meta.mutated_inputs), tuple(outputs), meta.num_graph_outputs,
                            meta.num_intermediate_bases),
        "out_spec": pytree.treespec_dumps(runtime.out_spec),
        "function": None,
        "grad_mode": runtime.grad_mode,
    }
    if runtime.function is not None:
        function = dict(getattr(runtime.function, "recipe", None) or {})
        backward = describe(function.pop("backward", None))
        if backward is None:
            return None
        fields["function"] = dict(function, backward=backward)
    return Recipe("aot", fields)


def _base_dims_view(plan: tuple[tuple, dict, int] | None) -> tuple[tuple, int] | None:
    """A view plan of `plan_unbound_views` as plain data: each symbol that is a whole dim of the
    base becomes BaseDim; None when the plan reads anything else (an input's size)."""
    if plan is None:
        return None
    from kiln.symbolic.node import expr_of  # a capture made the plan: its symbols are loaded

    view, binding, rank = plan

    def element(x: Any) -> Any:
        if not isinstance(x, torch.SymInt):
            return x if type(x) is int else None
        expr = expr_of(x)
        index, dim = binding.get(expr, (None, None)) if getattr(expr, "is_Symbol", False) else (None, None)
        return BaseDim(dim) if index == FROM_BASE and type(dim) is int else None

    size, stride, offset = ([element(x) for x in view[0]], [element(x) for x in view[1]], element(view[2]))
    if view[3:] or any(x is None for x in (*size, *stride, offset)):
        return None
    return (tuple(size), tuple(stride), offset), rank


@loader("aot")
def _load(fields: dict[str, Any]) -> AotRuntime:
    """A runtime from its recipe's fields (build.LibraryError when a kernel library has left the cache)."""
    meta = fields["meta"]
    if not isinstance(meta, RuntimeMeta) or not all(isinstance(o, OutputRecord) for o in meta.outputs):
        raise ValueError("an aot recipe without its RuntimeMeta")
    forward = rebuild(fields["forward"])
    function = None
    if fields["function"] is not None:
        counts = dict(fields["function"])
        backward = rebuild(counts.pop("backward"))
        function = make_autograd_function(forward, backward, **counts)
    return AotRuntime(root=None, lifted=(), meta=meta, out_spec=pytree.treespec_loads(fields["out_spec"]),
                      binding={}, forward=forward, function=function,
                      grad_mode=fields.get("grad_mode"))
