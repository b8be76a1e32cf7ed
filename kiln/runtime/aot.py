"""The runtime of one compiled graph: what the glue calls with real tensors, and how it is persisted.

`AotRuntime` appends the module tensors the trace lifted, runs the compiled forward (inside a
torch.autograd.Function when a backward was compiled, so `loss.backward()` runs the compiled
backward), copies the new values of mutated inputs back into the caller's tensors exactly once,
and rebuilds outputs that alias inputs or each other by replaying their view ops on the real
base (kiln.runtime.views), so user code sees eager's aliasing, strides and offsets. A call whose
inputs share memory with one the graph updates runs the captured graph op by op instead (the
functional graph traced each input as its own tensor).
kiln.autograd.backend builds it after tracing; this module imports only torch and the runtime
(kiln.runtime.views reads symbolic sizes with kiln.symbolic.node, inside the functions that meet
them: docs/seams.md), so that a runtime rebuilt from the persistent frame cache runs in a process
that never loads the tracer, sympy or kiln.lower.

It follows the artifact protocol (kiln.runtime.artifact): `AotRuntime.artifact_recipe()` is a
Recipe of kind "aot" holding the recipes of its compiled halves (forward, backward), the AOT facts
the runtime reads (mutated inputs, how each output is made, the output tree spec) and the
autograd.Function's saved-tensor counts; the loader of kind "aot" rebuilds it. A runtime holding
anything else (view op arguments that are size symbols, lifted module tensors, output constants
that are not literals, halves without a recipe) describes itself as None, and its frame is not
persisted.
PyTorch counterpart: torch/_functorch/_aot_autograd/runtime_wrappers.py and AOTAutogradCache.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Callable, Sequence

import torch
from torch.autograd import forward_ad
from torch.utils import _pytree as pytree

from kiln.runtime import boundary
from kiln.runtime.artifact import Recipe, describe, loader, rebuild
from kiln.runtime.records import record_type
from kiln.runtime.views import ViewReplay, ViewStep, is_plain, overlapping, storage_groups


# The key of an inference graph's `gm.meta` that tells its compiler which outputs are the new
# values of mutated inputs: ((output index, input position), ...). A compiler may compute such an
# output into the input's own storage and return the input itself; AotRuntime then has nothing to
# copy (it bumps the input's version counter, as the in-place ops it stands for would).
INPUT_UPDATES = "kiln_input_updates"
# The key of an inference graph's `gm.meta` that names the inputs that are a module's parameters or
# buffers (input positions): a compiler may keep values computed from them (a weight packed for
# oneDNN) between calls, checked against their version counters on each call.
MODULE_STATE = "kiln_module_state"


# ---------------------------------------------------------------------------------------------------
# The autograd.Function and the AOT runtime wrapper


# The boundary extension once loaded (kiln.runtime.boundary): a training graph whose forward runs grad
# free records its backward as one C++ node through it (`apply_node`) instead of applying the Python
# autograd.Function. Empty until then, and where a test turns the node path off.
node_module: list[Any] = []
boundary.when_loaded(node_module.append)


def make_autograd_function(compiled_forward: Callable, compiled_backward: Callable, *,
                           num_forward_outputs: int,
                           num_saved_tensors: int, differentiable: Sequence[int],
                           primal_needs_grad: Sequence[bool],
                           cut_inputs: Sequence[int] = (),
                           forward_grad_free: bool = False,
                           forward_on_node: bool = False,
                           grads_with_history: Sequence[bool] | None = None,
                           output_versions: Sequence[tuple[int, int]] = ()) -> type[torch.autograd.Function]:
    """A torch.autograd.Function whose forward and backward are the two compiled graphs.

    The class carries `fast_apply`, what AotRuntime calls: outside functorch transforms it goes
    straight to the C++ Function.apply. The Python classmethod in front of it binds default
    arguments with inspect (this forward has none) and rebuilds the argument tuple to unwrap dead
    functorch wrappers, about half the cost of applying a 20-input function.

    `forward_grad_free`: the compiled forward reads neither grad mode nor its inputs' autograd
    state (`grad_free_forward`: only Kiln's own kernels, allocations and views), so it runs on the
    caller's tensors under the Function's own no_grad, without the detached copies and the grad
    mode switch the general case pays per call.

    `forward_on_node`: a forward that is not grad free but is Kiln's own (a lowered graph calling
    ATen externs that may read grad mode or requires_grad) records its backward as the C++ node too,
    its inputs that require grad detached and grad mode on inside, as the Function's forward runs it.

    `grads_with_history`: per primal, whether eager's gradient under create_graph=True has a history
    (JointTrace.grads_with_history); None: all of them. The others come back without one.

    `output_versions`: (forward output position, eager's version counter) for outputs eager updated
    in place, bumped inside the forward: before the Function saves them for the backward.

    `cut_inputs`: the inputs the backward gives no gradient, passed to the Function detached."""
    diff = tuple(differentiable)
    non_diff = tuple(k for k in range(num_forward_outputs) if k not in diff)
    end_saved = num_forward_outputs + num_saved_tensors
    needs = tuple(primal_needs_grad)
    every_grad = all(needs)
    all_diff = diff == tuple(range(num_forward_outputs))
    set_grad = torch._C._set_grad_enabled
    is_grad = torch.is_grad_enabled
    Tensor = torch.Tensor
    contiguous = Tensor.contiguous
    # a C++ wrapper's list entry (kiln.runtime.kernel_wrapper.positional); None for other compilers
    steal = getattr(compiled_backward, "steal", None) or getattr(getattr(compiled_backward, "fn", None), "steal", None)
    run_forward = bumping_versions(direct_callable(compiled_forward), output_versions)
    node_backward: Callable[[list], Any] = steal if steal is not None else lambda args: compiled_backward(*args)
    # the backward's native handle, once its native wrapper runs: the C++ node runs it without the GIL
    backward_handle: Any = None

    def forward_on_native(native: Callable) -> None:
        nonlocal run_forward
        run_forward = bumping_versions(native, output_versions)

    def backward_on_native(native: Callable) -> None:
        nonlocal steal, node_backward, backward_handle
        steal = getattr(native, "steal", None) or (lambda args: native(*args))
        node_backward = steal
        if isinstance(steal, functools.partial) and node_module and steal.func is node_module[0].steal:
            backward_handle = steal.args[0]

    class CompiledFunction(torch.autograd.Function):
        not_views: tuple[int, ...] = ()  # set by AotRuntime (the positions of not_views)

        @staticmethod
        def forward(ctx, *args):
            if forward_grad_free:  # Function.forward runs with grad mode off: nothing records
                outs = run_forward(*args)
            else:
                # The joint graph was traced with grad mode on, and some kernels look at it (the
                # mkldnn RNN returns its workspace for the backward only then); detached inputs keep
                # autograd from recording anything in here.
                detached = [a.detach() if isinstance(a, Tensor) else a for a in args]
                previous = is_grad()
                set_grad(True)
                try:
                    outs = run_forward(*detached)
                finally:
                    set_grad(previous)
            fw_outs = not_views(outs[:num_forward_outputs], CompiledFunction.not_views)
            # what ctx.save_for_backward and ctx.mark_non_differentiable store, without their frames
            ctx.to_save = tuple(outs[num_forward_outputs:end_saved])
            if len(outs) > end_saved:
                ctx.symints = tuple(outs[end_saved:])
            if non_diff:
                ctx.non_differentiable = tuple([fw_outs[k] for k in non_diff if isinstance(fw_outs[k], Tensor)])
            return tuple(fw_outs)

        @staticmethod
        def backward(ctx, *grad_outputs):
            # the backward graph was traced with contiguous tangents; a zero grad arrives for an
            # unused output because materialize_grads is on
            if all_diff:
                tangents = list(map(contiguous, grad_outputs))
            else:
                tangents = [grad_outputs[k].contiguous() for k in diff]
            if is_grad():  # backward(create_graph=True): the gradients get a history that refuses a second backward
                grads = gradients_without_second_backward(compiled_backward, [*ctx.saved_tensors, *ctx.symints],
                                                          tangents, grads_with_history)
            elif steal is None:
                grads = compiled_backward(*ctx.saved_tensors, *ctx.symints, *tangents)
            else:  # the wrapper gets the only references: each activation is freed after its last use
                args = [*ctx.saved_tensors, *ctx.symints, *tangents]
                del tangents
                ctx.maybe_clear_saved_tensors()  # keeps them under retain_graph=True
                grads = steal(args)
            if every_grad:
                return grads if type(grads) is tuple else tuple(grads)
            return tuple([g if need else None for g, need in zip(grads, needs)])

    # The engine calls its node's `apply` by name. torch's own (BackwardCFunction.apply) looks the
    # user's backward up through two Python frames per call (vjp or backward, boxed or not); this
    # class has exactly one, so the node calls it directly.
    backward_node = getattr(CompiledFunction, "_backward_cls", None)
    if backward_node is not None and not getattr(CompiledFunction, "boxed_grads_call", False):
        backward_node.apply = CompiledFunction.backward
        backward_node.symints = ()  # a graph without size outputs sets none per call

    c_apply = super(torch.autograd.Function, CompiledFunction).apply  # torch._C._FunctionBase's
    functorch_active = torch._C._are_functorch_transforms_active
    python_apply = CompiledFunction.apply

    def fast_apply(*args: Any) -> Any:
        if functorch_active():
            return python_apply(*args)
        try:
            return c_apply(*args)
        except SystemError as exc:
            raise _raised_inside(exc) from None

    if forward_grad_free or forward_on_node:
        # The node path: the boundary extension runs the forward and records a C++ node whose
        # backward calls `node_backward` (what the Function's backward does, less its Python frames
        # and context object). Under functorch transforms or forward-mode AD (the Function has no
        # jvp: dual inputs raise eager's error) the Function runs as before.
        detached = not forward_grad_free
        num_tangents = len(diff)
        non_diff_flags = tuple(k in non_diff for k in range(num_forward_outputs)) if non_diff else None

        def create_graph_backward(args: list) -> Any:  # backward(create_graph=True)
            split = len(args) - num_tangents
            return gradients_without_second_backward(compiled_backward, args[:split], args[split:],
                                                     grads_with_history)

        function_apply = fast_apply

        def fast_apply(*args: Any) -> Any:  # noqa: F811  # the same entry, on the node path when it can
            if node_module and forward_ad._current_level < 0 and not functorch_active():
                return node_module[0].apply_node(run_forward, node_backward, create_graph_backward, args,
                                                 num_forward_outputs, num_saved_tensors, non_diff_flags, needs,
                                                 detached, backward_handle)
            return function_apply(*args)

    if cut_inputs:
        # Inputs without a gradient (never read, read for their shape, or only through ops without
        # a derivative) reach the Function detached: one that requires grad would be an edge of the
        # Function's node, and the backward would walk into its history (freed by an earlier
        # backward), where eager's has no edge to it.
        gradless = tuple(cut_inputs)
        linked_apply = fast_apply

        def fast_apply(*args: Any) -> Any:  # noqa: F811  # the same entry, gradless inputs cut off
            cut = list(args)
            for k in gradless:
                a = cut[k]
                if isinstance(a, Tensor) and a.requires_grad:
                    cut[k] = a.detach()
            return linked_apply(*cut)

    # once a half's native wrapper runs, call it directly, without its TieredWrapper's frame
    follow_forward = getattr(run_forward, "when_native", None)
    if follow_forward is not None:
        follow_forward(forward_on_native)
    follow_backward = getattr(getattr(compiled_backward, "fn", None), "when_native", None)
    if steal is not None and follow_backward is not None:
        follow_backward(backward_on_native)
    CompiledFunction.fast_apply = staticmethod(fast_apply)  # type: ignore[attr-defined]
    CompiledFunction.recipe = dict(  # type: ignore[attr-defined]  # for graph_recipe
        backward=compiled_backward, num_forward_outputs=num_forward_outputs,
        num_saved_tensors=num_saved_tensors, differentiable=diff, primal_needs_grad=tuple(primal_needs_grad),
        forward_grad_free=forward_grad_free, forward_on_node=forward_on_node, output_versions=tuple(output_versions),
        cut_inputs=tuple(cut_inputs))
    return CompiledFunction


def bumping_versions(forward: Callable, versions: Sequence[tuple[int, int]]) -> Callable:
    """`forward` whose results at the given positions leave with eager's version counters: an
    intermediate updated in place (`y = x * 2; y.add_(1); return y`) is a fresh graph result at 0."""
    if not versions:
        return forward

    def run(*args: Any) -> Any:
        outs = forward(*args)
        bump_versions(outs, versions)
        return outs
    return run


def bump_versions(outs: Sequence[Any], versions: Sequence[tuple[int, int]]) -> None:
    for position, version in versions:
        t = outs[position]
        if isinstance(t, torch.Tensor) and not t.is_inference() and t._version < version:
            # the counter moves once per occurrence in the list; views of t share it
            torch.autograd.graph.increment_version([t] * (version - t._version))


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
    requires grad, so the history is there even when no incoming gradient requires grad. The saved
    tensors that require grad (a primal saved as it is) come after the tangents, so that a gradient
    taken of these gradients with respect to them meets this error rather than autograd's "appears
    to not have been used in the graph"."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, backward: Callable, saved: list, n_tangents: int,
                *tangents_then_links: torch.Tensor) -> Any:
        # autograd.Function.forward runs with grad mode off
        return tuple(backward(*saved, *tangents_then_links[:n_tangents]))

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        raise RuntimeError(DOUBLE_BACKWARD_ERROR)


def direct_callable(compiled: Callable) -> Callable:
    """What a lowered graph (kiln.lower.CompiledGraph, whose __call__ only forwards to its wrapper
    function `fn`) forwards to, so that a call skips that frame; anything else as it is."""
    fn = getattr(compiled, "fn", None) if type(compiled).__name__ == "CompiledGraph" else None
    return fn if callable(fn) else compiled


def gradients_without_second_backward(compiled_backward: Callable, saved: list, tangents: list,
                                      with_history: Sequence[bool] | None = None) -> list:
    """The compiled backward's gradients with a history that raises on a second backward; with
    `with_history` (per gradient, eager's) and no tangent requiring grad, only those it marks get
    one, the others none, as eager's (a once_differentiable backward's, computed under no_grad)."""
    if with_history is not None and not any(t.requires_grad for t in tangents if isinstance(t, torch.Tensor)):
        if not any(with_history):
            with torch.no_grad():
                return list(compiled_backward(*saved, *tangents))
        grads = _with_refusing_history(compiled_backward, saved, tangents)
        return [g if keep or not isinstance(g, torch.Tensor) else g.detach() for g, keep in zip(grads, with_history)]
    return list(_with_refusing_history(compiled_backward, saved, tangents))


def _with_refusing_history(compiled_backward: Callable, saved: list, tangents: list) -> Any:
    anchor = torch.empty(0, requires_grad=True)
    links = [s for s in saved if isinstance(s, torch.Tensor) and s.requires_grad]
    return _CompiledBackward.apply(anchor, compiled_backward, saved, len(tangents), *tangents, *links)


def not_views(outs: Sequence[Any], positions: tuple[int, ...]) -> Sequence[Any]:
    """The graph's results with those at `positions` (user outputs that eager gives as no view) that a
    compiled wrapper hands out as views of its own buffers (a matmul's 2-d result viewed as 3-d, a
    slice of a larger buffer) replaced by detached aliases: same storage and version counter, but no
    autograd view. Autograd treats a view differently: an in-place op on one raised where eager's
    runs ("a view created inside a custom Function", or "created in no_grad mode" for an inference
    graph's result modified later with grad on)."""
    changed = None
    for k in positions:
        o = outs[k]
        if isinstance(o, torch.Tensor) and o._is_view():
            if changed is None:
                changed = list(outs)
            changed[k] = o.detach()
    return outs if changed is None else type(outs)(changed)  # type: ignore[call-arg]


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
class OutputRecord:
    """The fields of kiln.autograd.functionalize.OutputInfo the runtime reads (see there)."""

    kind: str
    base: int | None = None
    graph_index: int | None = None
    value: Any = None
    steps: tuple[ViewStep, ...] | None = None
    view: bool = False
    no_grad: bool = False


@record_type
@dataclasses.dataclass(frozen=True)
class RuntimeMeta:
    """The fields of FunctionalMeta the runtime reads, as plain data (a persisted runtime's meta)."""

    mutated_inputs: tuple[int, ...]
    outputs: tuple[OutputRecord, ...]
    num_graph_outputs: int
    num_intermediate_bases: int
    # (input index, the view ops giving its new layout) for inputs whose metadata changed
    metadata_mutations: tuple[tuple[int, tuple[ViewStep, ...]], ...] = ()
    # mutated inputs whose version counter eager leaves alone (batch norm's running statistics)
    untracked_mutations: tuple[int, ...] = ()
    # (input index, n): eager updates the input in place n times more than the runtime's copy back
    extra_version_bumps: tuple[tuple[int, int], ...] = ()
    # (graph output position, eager's version counter) for results eager updated in place
    output_versions: tuple[tuple[int, int], ...] = ()
    storage_sets: tuple[int, ...] = ()  # mutated inputs given another storage (`w.data = v`): they take it


def plan_views(meta: Any, binding: dict) -> dict[int, ViewReplay]:
    """Output position -> the replay of its view ops, for each output that is a view of an input
    or of an intermediate base. A view whose arguments hold a size no input carries (an unbacked
    size made inside the graph) is refused here, at compile time: the frame runs eagerly."""
    if meta is None:
        return {}
    return {k: ViewReplay(info.steps, binding, what=f"output {k}")
            for k, info in enumerate(meta.outputs) if info.steps is not None}


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


def _raised_inside(exc: SystemError) -> BaseException:
    """The exception the forward raised, where torch's Function.apply turned it into a SystemError:
    a warning buffered earlier in the same apply (var() over one element) is flushed while the
    forward's exception is pending, and CPython reports "<class 'UserWarning'> returned a result
    with an exception set" with the forward's exception as its cause. Eager raises that one (after
    printing the warning, which is lost here)."""
    cause = exc.__cause__
    if cause is not None and "returned a result with an exception set" in str(exc):
        return cause
    return exc


def _unflatten(leaves: list[Any], spec: Any) -> Any:
    return pytree.tree_unflatten(leaves, spec)


def _unshared(flat: Sequence[Any], mutated: tuple[int, ...],
              groups: tuple[dict[int, int], dict[int, list[int]]]) -> Sequence[Any]:
    """`flat` itself, or, where a mutated input shares its storage with another input (a view of
    it passed too), `flat` with the mutated inputs cloned: the graph then reads every input's value
    from before the call, as a graph that computes mutated inputs' new values into their storage
    must not see them early; the runtime copies the new values back after the call. Inputs that
    share storage but are only read (one lr tensor reached through two paths) need no copy.
    `groups`: kiln.runtime.views.storage_groups(flat)."""
    ids, storages = groups
    if not any(len(storages[ids[index]]) > 1 for index in mutated if index in ids):
        return flat
    copies = list(flat)
    with torch.no_grad():  # copies to compute into, not values autograd records
        for index in mutated:
            copies[index] = flat[index].clone()
    return copies


class AotRuntime:
    """The callable handed back to capture for one graph.

    `meta` is a FunctionalMeta (after a trace) or a RuntimeMeta (rebuilt from a recipe); `binding`
    maps each size symbol to (flat input index, dim or None) for views with symbolic sizes.
    What each call needs from them (lifted attribute getters, the mutation count, whether the graph's
    outputs are the user outputs as they are) is worked out here once, not per call."""

    # set where compiled (kiln.autograd.backend.gradient_facts), read by a graph-level cond about its
    # branch (kiln.runtime.pieces.gradient_facts): whether the forward saves a result for the
    # backward, and which inputs the backward gives a gradient; None: not known (a rebuilt graph)
    gradient_facts: tuple[int, ...] | None = None

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
        self._views = plan_views(meta, binding)
        self._restrides = tuple((index, ViewReplay(steps, binding, what=f"the new layout of input {index}"))
                                for index, steps in getattr(meta, "metadata_mutations", ()))
        # user inputs updated in place, checked against the other inputs before each call
        self._updated = tuple(sorted({*getattr(meta, "mutated_inputs", ()), *(i for i, _ in self._restrides)}))
        # updated inputs whose new values are written without moving their version counters, as
        # eager's batch norm writes its running statistics
        self._untracked = frozenset(getattr(meta, "untracked_mutations", ()))
        self._storage_sets = frozenset(getattr(meta, "storage_sets", ()))
        # each input index once per bump beyond the copy back's, bumped with the written inputs in
        # one call (the counter moves once per occurrence in the list)
        self._extra_bumps = tuple(index for index, extra in getattr(meta, "extra_version_bumps", ())
                                  for _ in range(extra))
        # an inference graph's results eager updated in place, by position after the mutated inputs'
        # values (a training graph's are bumped in its forward, make_autograd_function)
        self._output_versions = tuple((len(getattr(meta, "mutated_inputs", ())) + k, n)
                                      for k, n in getattr(meta, "output_versions", ())) if function is None else ()
        # the per-call plan
        self._getters = tuple(operator.attrgetter(path) for path in lifted)  # dotted paths work
        # the grad mode the graph runs under where the caller's (a guard holds it) is not the one
        # it was traced for: None, the caller's; False, an inference graph traced with grad on and
        # inputs requiring grad (`without_grad`); True, a training graph captured under no_grad
        # whose gradients come from an enable_grad region inside it (`with_grad`)
        self.grad_mode = grad_mode
        run = getattr(function, "fast_apply", function.apply) if function is not None else direct_callable(forward)
        self._run = without_grad(run) if grad_mode is False else with_grad(run) if grad_mode else run
        self._unflatten = _unflattener(out_spec)
        self._not_views: tuple[int, ...] = ()
        self._plain = False
        if meta is None:
            self._num_mutated, self._passthrough, self._num_outputs = 0, False, 0
            self._shared_check: tuple[int, ...] = ()
            self._follow_native(run)
            return
        self._num_mutated = len(meta.mutated_inputs)
        # By position in the graph's results: an inference graph's results that eager gives as no
        # autograd view (eager's own views, made under no_grad, refuse a later in-place op with grad
        # on as eager's do); every result of a training graph (an in-place op on an eager view is
        # fine, on a view made inside an autograd.Function it raises); and the intermediate bases
        # other outputs are replayed on (a view of such a view would refuse it too).
        graph = [info for info in meta.outputs if info.kind == "graph"]
        num_user = meta.num_graph_outputs - meta.num_intermediate_bases
        bases = tuple(range(self._num_mutated + num_user, self._num_mutated + meta.num_graph_outputs))
        if function is None:
            self._not_views = tuple(self._num_mutated + info.graph_index for info in graph
                                    if not getattr(info, "view", False)) + bases
        else:
            setattr(function, "not_views", tuple(self._num_mutated + info.graph_index for info in graph) + bases)
        # an inference graph's compiler may compute mutated inputs' new values in their own
        # storage (INPUT_UPDATES): safe only while no other input shares that storage
        self._shared_check = tuple(meta.mutated_inputs) if function is None else ()
        outputs = meta.outputs
        self._num_outputs = len(outputs)
        # the graph returns exactly the user outputs, in order, and the spec is a flat tuple: the
        # graph's tuple (after the mutated inputs' new values) is the result itself
        self._passthrough = (self._unflatten is tuple and meta.num_intermediate_bases == 0
                             and len(outputs) == meta.num_graph_outputs
                             and all(info.kind == "graph" and info.graph_index == k
                                     for k, info in enumerate(outputs)))
        # nothing to do around the graph: no module tensors to append, no input updated in place or
        # re-laid out, no output rebuilt (AotRuntime.__call__'s first branch)
        self._plain = self._passthrough and not self._getters and not self._updated \
            and not self._shared_check and not self._restrides and self._num_mutated == 0 and not self._extra_bumps \
            and not self._output_versions
        self._follow_native(run)

    def _follow_native(self, run: Callable) -> None:
        follow = getattr(run, "when_native", None) if self.function is None else None
        if follow is not None:  # once the native wrapper runs, call it without its TieredWrapper's frame
            follow(self._on_native)

    def _on_native(self, native: Callable) -> None:
        grad_mode = self.grad_mode
        self._run = without_grad(native) if grad_mode is False else with_grad(native) if grad_mode else native
        direct = self._direct(native)
        if direct is not None:
            self.__class__ = _direct_class(direct)

    def _direct(self, native: Callable) -> Any:
        """The boundary extension's direct call of a plain inference graph whose native wrapper is
        `native` (the extension's `call` bound to a handle): what the plain branch of __call__ does
        around it, as one C call (grad mode off for an inference graph run under without_grad), or
        None where anything else happens around the graph."""
        module = node_module[0] if node_module else None
        if module is None or not self._plain or self.function is not None or self.grad_mode is True:
            return None
        if not (isinstance(native, functools.partial) and native.func is module.call and len(native.args) == 1
                and not native.keywords):
            return None
        return module.direct(native.args[0], self._not_views, self._num_outputs, self.grad_mode is False)

    def artifact_recipe(self) -> Recipe | None:
        """This runtime as data (kiln.runtime.artifact), or None when it cannot travel."""
        return _recipe(self)

    def _lifted_values(self) -> list[torch.Tensor]:
        root = self.root
        return [get(root) for get in self._getters]

    def __call__(self, *args: Any) -> Any:
        if self._plain:  # the common call: the graph's results are the user's outputs as they are
            outs = self._run(*args)
            if type(outs) is tuple and len(outs) == self._num_outputs:
                for k in self._not_views:  # not_views inline: its call cost more than the check
                    o = outs[k]
                    if isinstance(o, torch.Tensor) and o._is_view():
                        return not_views(outs, self._not_views)
                return outs
            if self._not_views:
                outs = not_views(outs, self._not_views)
            return self._user_outputs(args, args, outs)
        if self._getters:
            flat: Any = list(args)
            root = self.root
            flat.extend(get(root) for get in self._getters)
        else:
            flat = args
        run_args = flat
        if self._updated or self._shared_check:
            groups = storage_groups(flat)  # one pass over the inputs for both checks
            if self._updated and self.root is not None and \
                    overlapping(flat, [i for i in self._updated if i < len(args)], groups):
                # two inputs share memory that one of them updates, or one updated input shares
                # memory between its own elements (an expand): the graph would not show the update
                # through the other elements, eager does (run the captured graph as it is, op by op)
                return self.root(*args)
            if self._shared_check:
                run_args = _unshared(flat, self._shared_check, groups)
        # a mutated input's new value computed in its storage by an ATen out= call moved its counter
        before = [flat[i]._version for i in self.meta.mutated_inputs] if self._shared_check else None
        outs = self._run(*run_args)
        if self._output_versions:
            bump_versions(outs, self._output_versions)
        if self._not_views:  # an inference graph's (a training graph's are handled in its forward)
            outs = not_views(outs, self._not_views)
        entry = flat
        if self._restrides:
            # eager changed these inputs' sizes or strides in place (t_, unsqueeze_): the caller's
            # tensor takes the layout its own view chain gives, while views traced from the input,
            # and the sizes symbols stand for, start from its layout on entry (an alias of it)
            entry = list(flat)
            for index, _ in self._restrides:
                entry[index] = flat[index].view_as(flat[index])
            for index, replay in self._restrides:
                final = replay(entry[index], entry)
                flat[index].as_strided_(final.size(), final.stride(), final.storage_offset())
        num_mutated = self._num_mutated
        if num_mutated:
            written: list[torch.Tensor] = []
            untracked = self._untracked
            for k, (index, new) in enumerate(zip(self.meta.mutated_inputs, outs[:num_mutated])):
                old = flat[index]
                if new is old:
                    if index not in untracked and (before is None or old._version == before[k]):
                        written.append(old)  # computed into the input's storage (INPUT_UPDATES)
                    continue
                if index in untracked:
                    # through an alias with its own version counter (`.data`): the caller's
                    # tensor's counter stays where eager's kernel leaves it
                    with torch.no_grad():
                        if index in self._storage_sets:
                            old.data = new.detach()  # `w.data = v`: w takes v's storage, as in eager
                        else:
                            old.data.copy_(new)
                    continue
                # once per call, after the graph: the caller's tensor (a buffer such as a BatchNorm
                # running mean, or a user input) ends up as eager would leave it; a new value that
                # carries a gradient is copied with autograd on, so the caller's tensor gets its history
                if new.requires_grad and torch.is_grad_enabled():
                    old.copy_(new)
                else:
                    with torch.no_grad():
                        old.copy_(new)
            if written:
                # what the in-place ops would have done: a tensor saved for a backward before this
                # call is seen as modified there
                torch.autograd.graph.increment_version(written)
            graph_outs = outs[num_mutated:]
        else:
            graph_outs = outs
        if self._extra_bumps:
            # the rest of eager's in-place ops on these inputs (add_ then mul_: two bumps; squeeze_
            # of a view of one: one, with no data written), so that code reading `_version` (a
            # later backward's saved-tensor check) sees eager's count
            torch.autograd.graph.increment_version([flat[index] for index in self._extra_bumps])
        if self._passthrough and type(graph_outs) is tuple and len(graph_outs) == self._num_outputs:
            return graph_outs
        return self._user_outputs(flat, entry, graph_outs)

    def _user_outputs(self, flat: Sequence[Any], entry: Sequence[Any], graph_outs: Sequence[Any]) -> Any:
        """The user's outputs (their tree) from the graph's results after the mutated inputs' values,
        the inputs as they are now (`flat`) and as they entered (`entry`)."""
        meta = self.meta
        num_user = meta.num_graph_outputs - meta.num_intermediate_bases
        bases = graph_outs[num_user:]
        results: list[Any] = []
        for k, info in enumerate(meta.outputs):
            results.append(self._output(k, info, flat, entry, graph_outs, bases, results))
        assert self._unflatten is not None  # only a runtime built by hand without meta has no spec
        return self._unflatten(results)

    def _output(self, k: int, info: Any, flat: Sequence[Any], entry: Sequence[Any], graph_outs: Sequence[Any],
                bases: Sequence[Any], results: list[Any]) -> Any:
        kind = info.kind
        if kind == "graph":
            return graph_outs[info.graph_index]
        if kind == "input":
            return flat[info.base]
        if kind == "input_view":  # after the copy-back above: the view sees the input's new data
            if info.no_grad:  # eager's view was made with grad mode off: a leaf without history
                with torch.no_grad():
                    return self._views[k](entry[info.base], entry)
            return self._views[k](entry[info.base], entry)
        if kind == "base":
            return bases[info.base]
        if kind == "base_view":
            if info.no_grad:
                with torch.no_grad():
                    return self._views[k](bases[info.base], entry)
            return self._views[k](bases[info.base], entry)
        if kind == "same_as":
            return results[info.base]
        return info.value


def _direct_class(direct: Any) -> type:
    """AotRuntime with `direct` as its __call__: a runtime whose plain call is one C call switches to
    it (its own class: the call is the C object's, with no Python frame between the glue and the
    graph; everything else, its recipe included, is AotRuntime's)."""
    return type(AotRuntime.__name__, (AotRuntime,), {"__call__": direct, "__slots__": (),
                                                     "__module__": AotRuntime.__module__,
                                                     "__qualname__": AotRuntime.__qualname__})


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
    if not all(is_plain(steps) for _, steps in meta.metadata_mutations):
        return None  # a view op argument that is a size symbol
    tensors = sum(1 for info in getattr(meta, "inputs", ()) if info.is_tensor)
    if runtime._updated and tensors > 1:
        return None  # inputs that may share memory with an updated one run the captured graph, kept here
    outputs = []
    for info in meta.outputs:
        if not _plain(info.value):
            return None  # an output constant with no literal
        if info.steps is not None and not is_plain(info.steps):
            return None  # a view op argument that is a size symbol
        outputs.append(OutputRecord(info.kind, info.base, info.graph_index, info.value, info.steps, info.view,
                                    getattr(info, "no_grad", False)))
    fields: dict[str, Any] = {
        "forward": forward,
        "meta": RuntimeMeta(tuple(meta.mutated_inputs), tuple(outputs), meta.num_graph_outputs,
                            meta.num_intermediate_bases, tuple(meta.metadata_mutations),
                            tuple(getattr(meta, "untracked_mutations", ())),
                            tuple(getattr(meta, "extra_version_bumps", ())),
                            tuple(getattr(meta, "output_versions", ())),
                            tuple(getattr(meta, "storage_sets", ()))),
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


@loader("aot")
def _load(fields: dict[str, Any]) -> AotRuntime:
    """A runtime from its recipe's fields (build.LibraryError when a kernel library has left the cache)."""
    meta = fields["meta"]
    if not isinstance(meta, RuntimeMeta) or not all(isinstance(o, OutputRecord) for o in meta.outputs):
        raise ValueError("an aot recipe without its RuntimeMeta")
    chains = [r.steps for r in meta.outputs if r.steps is not None] + [c for _, c in meta.metadata_mutations]
    if not all(isinstance(c, tuple) and all(isinstance(s, ViewStep) for s in c) and is_plain(c) for c in chains):
        raise ValueError("an aot recipe with a malformed view chain")
    forward = rebuild(fields["forward"])
    function = None
    if fields["function"] is not None:
        counts = dict(fields["function"])
        backward = rebuild(counts.pop("backward"))
        function = make_autograd_function(forward, backward, **counts)
    return AotRuntime(root=None, lifted=(), meta=meta, out_spec=pytree.treespec_loads(fields["out_spec"]),
                      binding={}, forward=forward, function=function,
                      grad_mode=fields.get("grad_mode"))
