"""The AOT autograd backend: captured torch-level graph in, runtime wrapper over compiled ATen graphs out.

`aot_autograd(fw_compiler, bw_compiler)` makes a backend (the torch.compile contract): trace to
functional ATen; when grad is on and an input requires grad, trace the joint graph, partition it
(min-cut by default) and hand both halves to the compilers. `aot_eager` runs the ATen graphs as
they are; `trace_aten` gives lower's tests a graph. Reports: KILN_LOGS=aot_graphs prints both
graphs with the saved tensors, the bytes saved under each partitioner and the ops the backward
recomputes (checkpointed regions first) (`AotReport`).
PyTorch counterpart: torch/_functorch/aot_autograd.py and torch/_dynamo/backends/common.py.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import operator
import traceback
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from kiln.autograd.checkpoint import RecomputedValue
from kiln.autograd.decompose import DecompositionTable, resolve_decompositions
from kiln.autograd.functionalize import functionalize_fresh_fills, verify_aten_graph
from kiln.autograd.joint import (JointTrace, TraceInputs, differentiable_outputs, prepare_inputs, trace_forward,
                                 trace_joint)
from kiln.autograd.partition import Partition, SavedValue, partition as split_joint
from kiln.autograd.runtime import (INPUT_UPDATES, MODULE_STATE, AotRuntime, bind_symbols, make_autograd_function,
                                   with_missing_derivatives)
from kiln import compile_time, log

Compiler = Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]
Backend = Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]


_names = itertools.count()
_recent: collections.deque["AotReport"] = collections.deque(maxlen=32)


@dataclasses.dataclass(frozen=True)
class AotReport:
    """Per graph: saved bytes under each partitioner, and the saved values of the chosen one."""

    graph: str
    policy: str
    saved_bytes: dict[str, int]  # "save_all" and "min_cut" -> bytes saved for backward
    activation_bytes: dict[str, int]  # the same, less inputs and views of inputs (no extra memory)
    saved: tuple[SavedValue, ...]
    forward_code: str = dataclasses.field(repr=False)
    backward_code: str = dataclasses.field(repr=False)
    recomputed: tuple[RecomputedValue, ...] = ()  # forward values the backward computes again

    def __str__(self) -> str:
        lines = [f"AOT graph {self.graph}: partitioned with {self.policy}; bytes saved for backward: "
                 + ", ".join(f"{k}={v}" for k, v in self.saved_bytes.items())
                 + "; of them activations: "
                 + ", ".join(f"{k}={v}" for k, v in self.activation_bytes.items())]
        lines.append("  saved tensors:")
        for s in self.saved:
            alias = " (an input's memory)" if s.aliases_input and s.produced_by != "input" else ""
            lines.append(f"    {s.name:<24} {s.dtype:<9} {str(list(s.shape)):<20} {s.nbytes:>10} B"
                         f"  from {s.produced_by}{alias}")
        if not self.saved:
            lines.append("    (none)")
        lines.extend(_recomputed_lines(self.recomputed))
        return "\n".join(lines)


def _recomputed_lines(recomputed: tuple[RecomputedValue, ...]) -> list[str]:
    """The recomputed values, those of checkpointed regions first, grouped by region."""
    if not recomputed:
        return []
    regions = sorted({r.region for r in recomputed if r.region is not None})
    chosen = [r for r in recomputed if r.region is None]
    lines = [f"  recomputed in the backward: {len(recomputed)} ops ({len(recomputed) - len(chosen)} in "
             f"{len(regions)} checkpointed region(s), {len(chosen)} chosen by the min-cut)"]
    for region in regions:
        ops = [r for r in recomputed if r.region == region]
        lines.append(f"    checkpoint region {region}: " + ", ".join(f"{r.name} ({r.op})" for r in ops))
    if chosen:
        lines.append("    cheaper to recompute than to save: " + ", ".join(f"{r.name} ({r.op})" for r in chosen))
    return lines


def make_report(joint: JointTrace, chosen: Partition) -> AotReport:
    """Report on a partition, comparing it with the other policy's saved bytes."""
    other_policy = "save_all" if chosen.policy == "min_cut" else "min_cut"
    other = split_joint(joint, other_policy)
    by_policy = {chosen.policy: chosen, other_policy: other}
    order = ("save_all", "min_cut")
    report = AotReport(f"aot_{next(_names)}", chosen.policy,
                       {k: by_policy[k].saved_bytes for k in order},
                       {k: by_policy[k].activation_bytes for k in order},
                       chosen.saved_tensors + chosen.saved_symints,
                       chosen.forward.code, chosen.backward.code, chosen.recomputed)
    _recent.append(report)
    return report


def log_graphs(report: AotReport) -> None:
    """KILN_LOGS=aot_graphs: both graphs and the saved-tensor table."""
    log.artifact("aot_graphs", lambda: (
        f"===== {report.graph} forward =====\n{report.forward_code.strip()}\n"
        f"===== {report.graph} backward =====\n{report.backward_code.strip()}\n{report}"))


def log_inference(gm: fx.GraphModule) -> None:
    log.artifact("aot_graphs", lambda: f"===== inference graph (no backward) =====\n{gm.code.strip()}")


def aot_saved_bytes(gm: fx.GraphModule, example_inputs: list[Any], *,
                    decompositions: str | DecompositionTable | None = None,
                    policy: str = "min_cut") -> AotReport:
    """Trace the joint graph of `gm` and report saved bytes under both partitioners (no compile)."""
    table = resolve_decompositions(decompositions)
    inputs = prepare_inputs(gm, example_inputs)
    forward = trace_forward(gm, inputs, table, grad=True)
    joint = trace_joint(gm, inputs, forward, table)
    return make_report(joint, split_joint(joint, policy))


def recent_reports() -> list[AotReport]:
    """The reports of the most recently compiled training graphs, oldest first."""
    return list(_recent)


def _example_inputs(gm: fx.GraphModule) -> list[Any]:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def compile_with_aot(gm: fx.GraphModule, example_inputs: list[Any], *, fw_compiler: Compiler,
                     bw_compiler: Compiler, partition: str = "min_cut",
                     decompositions: str | DecompositionTable | None = None) -> AotRuntime | fx.GraphModule:
    """Trace, partition and compile one captured graph; returns the callable for capture (the
    captured graph itself, run op by op under eager autograd, for a program whose backward eager
    refuses: an in-place op on a tensor the backward needs)."""
    table = resolve_decompositions(decompositions)
    inputs = prepare_inputs(gm, list(example_inputs))
    # A backward is traced when an input requires grad and grad mode is on somewhere in the graph:
    # around it (the caller's mode, guarded), or only inside an enable_grad region under the
    # caller's no_grad, where the autograd.Function is applied with grad on (AotRuntime).
    ambient = torch.is_grad_enabled()
    any_requires_grad = any(isinstance(v, torch.Tensor) and v.requires_grad for v in inputs.values)
    needs_grad = (ambient or _enables_grad(gm)) and any_requires_grad
    forward = trace_forward(gm, inputs, table, grad=ambient and needs_grad)
    log.debug("aot", lambda: f"trace_forward: {len(forward.gm.graph.nodes)} nodes, mutated inputs "
                             f"{list(forward.meta.mutated_inputs)}")
    binding = bind_symbols(inputs.values)
    common: dict[str, Any] = dict(root=gm, lifted=inputs.lifted, meta=forward.meta,
                                  out_spec=forward.out_spec, binding=binding)
    if not needs_grad or not differentiable_outputs(forward):
        log_inference(forward.gm)
        functionalize_fresh_fills(forward.gm)
        verify_aten_graph(forward.gm)
        # no backward reads an input's old value here: the compiler may write the new values of
        # mutated inputs (an optimizer's parameters and state) into their storage as it computes them
        forward.gm.meta[INPUT_UPDATES] = tuple(enumerate(forward.meta.mutated_inputs))
        forward.gm.meta[MODULE_STATE] = tuple(_module_state(gm, inputs))
        # run with grad off where autograd could record: grad on and an input requiring grad
        # (no_grad inside the function around modules whose parameters require grad)
        runtime = AotRuntime(forward=fw_compiler(forward.gm, list(inputs.values)),
                             grad_mode=False if ambient and any_requires_grad else None, **common)
        runtime.gradient_facts = (0,)  # no backward: nothing saved, no input given a gradient
        return runtime
    try:
        joint = trace_joint(gm, inputs, forward, table)
    except RuntimeError as exc:
        if not _refused_by_autograd(exc):
            raise
        # The program's own error, which eager raises only when its backward runs (and never when
        # no backward runs): the forward runs as the program wrote it, under eager's autograd.
        log.debug("aot", lambda: f"trace_joint: eager's backward would refuse ({str(exc).splitlines()[0]}); "
                                 f"the captured graph runs op by op")
        return gm
    log.debug("aot", lambda: f"trace_joint: {len(joint.gm.graph.nodes)} nodes, "
                             f"{len(joint.differentiable)} outputs with a gradient")
    parts = split_joint(joint, partition, forward.meta.mutated_inputs, _module_state(gm, inputs))
    report = make_report(joint, parts)
    log.debug("aot", lambda: f"partition ({partition}): {len(parts.saved_tensors)} tensors saved, "
                             f"{parts.saved_bytes} bytes, {len(parts.recomputed)} ops recomputed in the "
                             f"backward ({sum(r.region is not None for r in parts.recomputed)} checkpointed)")
    log_graphs(report)
    for graph in (parts.forward, parts.backward):
        functionalize_fresh_fills(graph)
        verify_aten_graph(graph)
    # both graphs lowered before either is finished: the forward's C++ compiles while the backward is
    # lowered, and beside the backward's (a compiler without `prepare` runs forward, then backward)
    finish_fw = prepare(fw_compiler, parts.forward, list(inputs.values))
    finish_bw = prepare(bw_compiler, parts.backward, _example_inputs(parts.backward))
    compiled_fw = finish_fw()
    compiled_bw = finish_bw()
    function = make_autograd_function(
        compiled_fw, compiled_bw, num_forward_outputs=parts.num_forward_outputs,
        num_saved_tensors=len(parts.saved_tensors), differentiable=joint.differentiable,
        primal_needs_grad=[isinstance(v, torch.Tensor) and v.requires_grad for v in inputs.values],
        cut_inputs=_gradless_inputs(parts, inputs.values),
        forward_grad_free=grad_free_forward(compiled_fw, parts.forward, parts.num_forward_outputs),
        forward_on_node=lowered_forward(compiled_fw, parts.forward, parts.num_forward_outputs),
        output_versions=_forward_versions(forward.meta),
        grads_with_history=joint.grads_with_history)
    function = with_missing_derivatives(function, joint.no_derivative)
    runtime = AotRuntime(forward=compiled_fw, function=function, report=report, grad_mode=None if ambient else True,
                         **common)
    runtime.gradient_facts = gradient_facts(parts)
    return runtime


def gradient_facts(parts: Partition) -> tuple[int, ...]:
    """What a graph-level cond needs to know of its compiled branch (kiln.runtime.pieces): 1 if the
    forward saves for the backward a tensor sharing storage with one of its outputs (an in-place
    update of the result would make autograd refuse the backward), else 0; then the positions of
    the inputs the backward gives a gradient (the others get None from the compiled Function)."""
    (grads,) = [n.args[0] for n in parts.backward.graph.nodes if n.op == "output"]
    (outs,) = [n.args[0] for n in parts.forward.graph.nodes if n.op == "output"]
    results = {_storage_root(o) for o in outs[:parts.num_forward_outputs] if isinstance(o, fx.Node)}
    saved = outs[parts.num_forward_outputs:parts.num_forward_outputs + len(parts.saved_tensors)]
    saves = any(isinstance(s, fx.Node) and _storage_root(s) in results for s in saved)
    return (int(saves), *(k for k, g in enumerate(grads) if g is not None))


def _storage_root(node: fx.Node) -> fx.Node:
    """The node whose storage `node` shares through a chain of views (an op whose result aliases its
    first argument, or an element of one's list of views); itself where it makes its own."""
    while node.op == "call_function" and node.args and isinstance(node.args[0], fx.Node):
        op = node.target
        if op is operator.getitem:
            source = node.args[0]
            op = source.target
            if not isinstance(op, torch._ops.OpOverload) or not any(r.alias_info for r in op._schema.returns):
                return source  # one result of a multi-result op: its results share one root
        elif not isinstance(op, torch._ops.OpOverload) or not any(r.alias_info for r in op._schema.returns):
            return node
        node = node.args[0]
    return node


def prepare(compiler: Compiler, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[[], Any]:
    """A compiler's work on one graph in two steps: what runs now, and the function that returns the
    compiled graph. A compiler with a `prepare` method (kiln.lower.LoweringCompiler) starts its
    build now and waits in the second step; any other compiler runs whole in the second step."""
    start = getattr(compiler, "prepare", None)
    if start is None:
        return lambda: compiler(gm, example_inputs)
    return start(gm, example_inputs)


def _forward_versions(meta: Any) -> tuple[tuple[int, int], ...]:
    """(forward output position, eager's version) of results eager updated in place: the forward's
    outputs are the mutated inputs' new values, then the graph's outputs."""
    return tuple((len(meta.mutated_inputs) + k, n) for k, n in meta.output_versions)


def grad_free_forward(compiled: Any, forward: fx.GraphModule, num_forward_outputs: int) -> bool:
    """Whether a compiled forward may run on the caller's tensors with grad mode off (the
    autograd.Function's fast path, kiln.runtime.aot.make_autograd_function): a C++ graph of Kiln's
    kernels and ATen externs that read neither grad mode nor their arguments' requires_grad. Its
    wrapper allocates, views and calls kernels on data pointers, none of which reads grad mode or
    requires_grad; an ATen extern's kernel runs below autograd, where grad mode off and detached
    arguments are the same thing (a convolution's `need_backward` is false either way), except the
    RNNs that keep their workspace only with grad mode on (`_reads_grad_mode`). Another
    namespace's op, a Python callable or another compiler's graph takes the general path. So does
    a graph returning one of its inputs as a user output: the Function would see its own input
    come back (a view of it, not a new output)."""
    if not lowered_forward(compiled, forward, num_forward_outputs) or getattr(compiled, "codegen", None) != "cpp":
        return False
    return not any(_reads_grad_mode(op) for op in getattr(compiled, "extern_ops", (None,)))


def lowered_forward(compiled: Any, forward: fx.GraphModule, num_forward_outputs: int) -> bool:
    """Whether a compiled forward is Kiln's own lowered graph (kiln.lower.CompiledGraph) returning
    no input as a user output: the C++ node may run it (with its inputs that require grad detached
    and grad mode on, as the Function does, where it is not `grad_free_forward`)."""
    if type(compiled).__name__ != "CompiledGraph":
        return False
    (results,) = [n.args[0] for n in forward.graph.nodes if n.op == "output"]
    user = list(results)[:num_forward_outputs] if isinstance(results, (tuple, list)) else [results]
    return not any(isinstance(r, fx.Node) and r.op == "placeholder" for r in user)


# words in the name of an ATen op whose kernel reads grad mode: the recurrent layers (oneDNN's,
# cuDNN's, MIOpen's) return their workspace for the backward only with it on
_GRAD_MODE_READERS = ("rnn", "lstm", "gru")


def _reads_grad_mode(op: Any) -> bool:
    """Whether an extern may behave differently with grad mode off than with it on over detached
    arguments: anything but an ATen (or prims) overload; the recurrent layers among those; and a
    composite that decomposes above autograd, where its arguments' requires_grad is seen (matmul
    folds a batch into one mm only for an input that needs no gradient)."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace not in ("aten", "prims"):
        return True
    name = op.name()
    if any(word in name.lower() for word in _GRAD_MODE_READERS):
        return True
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")


def _gradless_inputs(parts: Partition, values: Sequence[Any]) -> list[int]:
    """Positions of the inputs that require grad but get no gradient from the backward graph: read
    only for their shape (`ones_like(x)`), through ops without a gradient (`x > 0`, `x.argmax()`,
    `x.detach()`), or not at all. They reach the compiled Function detached, as eager records no edge
    to them: an edge would make a backward walk into their history, freed by an earlier backward
    (a GAN's `d(rec.detach())` then `d(rec)`). A tensor passed twice gets its gradient at its first
    position only (the joint trace's duplicate_of), so the other is cut and the first keeps its edge."""
    (grads,) = [n.args[0] for n in parts.backward.graph.nodes if n.op == "output"]
    return [k for k, (v, g) in enumerate(zip(values, grads))
            if g is None and isinstance(v, torch.Tensor) and v.requires_grad]


def _module_state(gm: fx.GraphModule, inputs: TraceInputs) -> list[int]:
    """Positions of the inputs that are parameters or buffers: the captured graph's placeholders
    whose source reaches into a module's `_parameters` or `_buffers`, and the lifted module tensors."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    owned = [k for k, n in enumerate(placeholders[:inputs.num_user])
             if any(table in str(n.meta.get("source", "")) for table in ("._parameters[", "._buffers["))]
    return owned + list(range(inputs.num_user, len(inputs.values)))


# autograd's version-counter check: a tensor saved for the backward was changed in place since
_SAVED_TENSOR_MODIFIED = "needed for gradient computation has been modified by an inplace operation"
# ... whose message autograd builds from the saved tensor's `sizes()`: under symbolic sizes C++ asks
# aten.size.default for `int[]` and pybind cannot take the fake's symbols, so the refusal arrives as
# this cast error, raised by the engine
_SYMBOLIC_SIZES_CAST = "Unable to cast Python instance of type <class 'torch.SymInt'>"


def _refused_by_autograd(exc: RuntimeError) -> bool:
    """Whether the joint trace failed on autograd's version check (eager's backward raises it, its
    forward runs): its own message, or, under symbolic sizes, the cast error its message building
    hits inside the engine's backward (`run_backward` on the traceback). Any other C++ code of the
    backward asking `sizes()` of a symbolic fake fails the same way; the captured graph then runs op
    by op too: eager's results, where the frame used to fall back to eager with an internal error."""
    if _SAVED_TENSOR_MODIFIED in str(exc):
        return True
    if _SYMBOLIC_SIZES_CAST not in str(exc):
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    return any(frame.name == "_engine_run_backward" for frame in frames)


def _enables_grad(gm: fx.GraphModule) -> bool:
    """Whether the captured graph turns grad mode on somewhere (an enable_grad region)."""
    return any(n.op == "call_function" and n.target is torch._C._set_grad_enabled and n.args and n.args[0] is True
               for n in gm.graph.nodes)


def aot_autograd(fw_compiler: Compiler, bw_compiler: Compiler | None = None, *,
                 partition: str = "min_cut",
                 decompositions: str | DecompositionTable | None = None) -> Backend:
    """A backend that lowers captured graphs to ATen forward/backward graphs for the given compilers."""
    backward_compiler = bw_compiler or fw_compiler

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        with compile_time.stage("aot"):  # the lowering inside reports its own passes
            return compile_with_aot(gm, example_inputs, fw_compiler=fw_compiler,
                                    bw_compiler=backward_compiler, partition=partition,
                                    decompositions=decompositions)

    backend.__name__ = f"aot_autograd({getattr(fw_compiler, '__name__', 'compiler')})"
    return backend


def run_eagerly(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The aot_eager compiler: the ATen graph runs op by op through PyTorch's kernels (its generated
    forward, not nn.Module.__call__: global module hooks the user registers are not the graph's)."""
    return gm.forward


aot_eager: Backend = aot_autograd(run_eagerly)


def trace_aten(gm: fx.GraphModule, example_inputs: list[Any],
               decompositions: str | DecompositionTable | None = None) -> fx.GraphModule:
    """The functional ATen graph of `gm`'s forward (grad off). Outputs: new values of mutated inputs
    first, then gm's flattened outputs. Module tensors gm reads become placeholders after its inputs."""
    inputs = prepare_inputs(gm, list(example_inputs))
    with torch.no_grad():
        return trace_forward(gm, inputs, resolve_decompositions(decompositions), grad=False).gm
