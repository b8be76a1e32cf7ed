"""Tracing a captured graph to ATen: the inference graph, and the joint forward+backward graph.

Input: the torch-level GraphModule and its example inputs (real tensors, Kiln fakes, or torch's
fakes from the real Dynamo). Module tensors the graph reads (parameters, buffers, constants) are
lifted to extra inputs so their gradients and mutations flow like any input's. The forward trace
gives the functional graph and its FunctionalMeta; the joint trace runs the forward then
`torch.autograd.grad` under the same tracer, so the backward is recorded as ATen ops too.
PyTorch counterpart: torch/_functorch/_aot_autograd/traced_function_transforms.py (create_joint).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any, Iterator

import torch
import torch.fx as fx
from torch.utils._pytree import TreeSpec, tree_flatten

from kiln.autograd.checkpoint import run_user_graph
from kiln.autograd.functionalize import FunctionalMeta, FunctionalSession
from kiln.autograd.tracer import AtenTracer, graph_module, is_symbolic
from kiln.errors import Unsupported
from kiln.fake.composites import python_dispatcher
from kiln.fake.mode import caller_saved_tensor_hooks_suspended


@dataclasses.dataclass(frozen=True)
class TraceInputs:
    """Example values for tracing, in placeholder order: the user inputs, then lifted module tensors."""

    values: tuple[Any, ...]
    num_user: int
    lifted: tuple[str, ...]  # attribute paths on the captured module, one per lifted value
    fake_mode: Any  # the dispatch mode making fakes; None when tracing on real tensors


@dataclasses.dataclass(frozen=True)
class ForwardTrace:
    """The functional forward graph: outputs are (*new values of mutated inputs, *user graph
    outputs, *intermediate bases)."""

    gm: fx.GraphModule
    meta: FunctionalMeta
    out_spec: TreeSpec
    outputs: tuple[Any, ...]  # the traced (fake) value of each graph output
    requires_grad: tuple[bool, ...]  # per graph output, whether autograd tracked it
    cloned: frozenset[int] = frozenset()  # inputs mutated while requiring grad (see visible_inputs)
    # the grad mode around the graph while it was traced (the caller's at capture, which a guard
    # holds); the joint graph is traced in it too, so that only the graph's own enable_grad regions
    # record a backward when the caller's mode is off
    grad_enabled: bool = True


@dataclasses.dataclass(frozen=True)
class JointTrace:
    """The joint graph: placeholders primals_*, tangents_*; outputs (*forward outputs, *grads),
    one grad per primal (None where the primal needs none)."""

    gm: fx.GraphModule
    num_forward_outputs: int
    differentiable: tuple[int, ...]  # forward output positions that have a tangent, in order
    # forward outputs whose backward reaches an op without a derivative (floor_divide), with the
    # error eager raises when a backward reaches them: no tangent here, the runtime attaches the error
    no_derivative: tuple[tuple[int, str], ...] = ()
    # per primal, whether eager's gradient under create_graph=True (tangents that do not require
    # grad) has a history; None: every gradient has one (only known where `_once_differentiable_call`)
    grads_with_history: tuple[bool, ...] | None = None


def _fake_mode_of(values: list[Any]) -> Any:
    for v in values:
        mode = getattr(v, "fake_mode", None) if isinstance(v, torch.Tensor) else None
        if mode is not None:
            return mode
    return None


def _to_fake(mode: Any, t: torch.Tensor) -> torch.Tensor:
    # Kiln's mode names it from_real; torch's own (fed to us by the real Dynamo) from_tensor.
    if hasattr(mode, "from_real"):
        return mode.from_real(t)
    return mode.from_tensor(t)


def module_tensors(gm: fx.GraphModule) -> list[tuple[str, torch.Tensor]]:
    """Parameters, buffers and tensor attributes the graph reads, each tensor once (tied weights)."""
    found: dict[int, tuple[str, torch.Tensor]] = {}
    for name, p in gm.named_parameters(remove_duplicate=True):
        found.setdefault(id(p), (name, p))
    for name, b in gm.named_buffers(remove_duplicate=True):
        found.setdefault(id(b), (name, b))
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = _get_path(gm, node.target)
            if isinstance(value, torch.Tensor):
                found.setdefault(id(value), (node.target, value))
    return list(found.values())


def _get_path(root: Any, path: str) -> Any:
    for part in path.split("."):
        root = getattr(root, part)
    return root


def _set_path(root: torch.nn.Module, path: str, value: Any) -> Any:
    *owners, leaf = path.split(".")
    for part in owners:
        root = getattr(root, part)
    for table in (root._parameters, root._buffers):
        if leaf in table:
            old = table[leaf]
            table[leaf] = value
            return old
    old = root.__dict__[leaf]
    root.__dict__[leaf] = value
    return old


@contextlib.contextmanager
def swapped(gm: fx.GraphModule, paths: tuple[str, ...], values: list[Any]) -> Iterator[None]:
    """Temporarily replace module tensors by traced values (bypassing nn.Parameter type checks)."""
    old = [_set_path(gm, p, v) for p, v in zip(paths, values)]
    try:
        yield
    finally:
        for p, v in zip(paths, old):
            _set_path(gm, p, v)


def prepare_inputs(gm: fx.GraphModule, example_inputs: list[Any]) -> TraceInputs:
    """Fakes for every input, made by the inputs' own fake mode or a new Kiln one for real inputs."""
    lifted = module_tensors(gm)
    example_inputs = _prefer_traced_values(gm, list(example_inputs))
    mode = _fake_mode_of(list(example_inputs))
    if mode is None:
        from kiln.fake import FakeTensorMode

        mode = FakeTensorMode()
    values = [_to_fake(mode, v) if isinstance(v, torch.Tensor) and getattr(v, "fake_mode", None) is None
              else v for v in example_inputs]
    values += [_to_fake(mode, t) for _, t in lifted]
    return TraceInputs(tuple(values), len(example_inputs), tuple(name for name, _ in lifted), mode)


def _prefer_traced_values(gm: fx.GraphModule, example_inputs: list[Any]) -> list[Any]:
    """Capture's placeholder `example_value`s carry its symbolic sizes (the real Dynamo passes real
    tensors and ints as example inputs but keeps the fakes with SymInt sizes in the node meta)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return example_inputs
    chosen = []
    for node, example in zip(placeholders, example_inputs):
        traced = node.meta.get("example_value", node.meta.get("val"))
        fake = isinstance(traced, torch.Tensor) and getattr(traced, "fake_mode", None) is not None
        chosen.append(traced if fake or is_symbolic(traced) else example)
    return chosen


@contextlib.contextmanager
def tracing(inputs: TraceInputs, tracer: AtenTracer) -> Iterator[None]:
    """The dispatch stack of a trace: python dispatcher (symbolic meta kernels), fakes, tracer."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(caller_saved_tensor_hooks_suspended())
        if any(_has_symbols(v) for v in inputs.values):
            stack.enter_context(python_dispatcher())
        if inputs.fake_mode is not None:
            stack.enter_context(inputs.fake_mode)
        stack.enter_context(tracer)
        yield


def _has_symbols(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        strides = v.stride() if v.layout == torch.strided else ()  # compressed sparse layouts have none
        return any(isinstance(s, torch.SymInt) for s in (*v.shape, *strides))
    return is_symbolic(v)


def call_user_graph(gm: fx.GraphModule, inputs: TraceInputs, args: list[Any],
                    graph: fx.Graph | None = None) -> tuple[list[Any], TreeSpec]:
    """Run the captured graph with lifted tensors swapped in; returns its flattened outputs.
    `graph`: the ATen graph being recorded, whose nodes get the tags of checkpointed regions."""
    user, lifted = args[:inputs.num_user], args[inputs.num_user:]
    with swapped(gm, inputs.lifted, lifted):
        out = run_user_graph(gm, user, graph)
    return tree_flatten(out)


def trace_forward(gm: fx.GraphModule, inputs: TraceInputs, decompositions: dict,
                  *, grad: bool) -> ForwardTrace:
    """The functional forward graph, traced with grad mode `grad` around it (the graph's own
    no_grad/enable_grad regions switch it inside), and which outputs require grad."""
    try:
        return _trace_forward(gm, inputs, decompositions, grad=grad, cloned=frozenset())
    except RuntimeError as exc:
        if _FROZEN_STORAGE in str(exc):
            # functionalization refuses an in-place update of a tensor that set_ gave another
            # storage or layout (`y.set_(z); y.add_(1)`): eager runs it
            raise Unsupported("an in-place update of a tensor after set_ gave it another storage or layout",
                              kind="unsupported_call", hint="update the tensor set_ took its storage from, "
                              "or make the new tensor with a view op instead of set_") from exc
        if "leaf Variable that requires grad" not in str(exc):
            raise
    # An input that requires grad is mutated in place (a non-leaf in the caller's program): find
    # which ones without autograd, then trace again mutating clones of them.
    try:
        plain = _trace_forward(gm, inputs, decompositions, grad=False, cloned=frozenset())
    except RuntimeError as exc:
        if "leaf Variable that requires grad" not in str(exc):
            raise
        # an enable_grad region inside the graph turned autograd back on: find them on clones of
        # every input that requires grad
        every = frozenset(i for i, v in enumerate(inputs.values) if isinstance(v, torch.Tensor) and v.requires_grad)
        plain = _trace_forward(gm, inputs, decompositions, grad=False, cloned=every)
    cloned = frozenset(i for i in plain.meta.mutated_inputs if inputs.values[i].requires_grad)
    return _trace_forward(gm, inputs, decompositions, grad=grad, cloned=cloned)


_FROZEN_STORAGE = "cannot mutate tensors with frozen storage"  # functionalization's refusal after set_


def _trace_forward(gm: fx.GraphModule, inputs: TraceInputs, decompositions: dict, *, grad: bool,
                   cloned: frozenset[int]) -> ForwardTrace:
    tracer = AtenTracer(decompositions)
    session = FunctionalSession(tracer)
    with tracing(inputs, tracer):
        for i, v in enumerate(inputs.values):
            session.add_input(f"arg{i}", v)
        with session.active(), torch.set_grad_enabled(grad):
            outs, spec = call_user_graph(gm, inputs, session.visible_inputs(cloned), tracer.graph)
        input_infos = session.input_infos()
        out_infos, graph_outs, bases = session.classify_outputs(outs)
        mutated = [session.visible[i] for i, info in enumerate(input_infos) if info.mutates_data]
        wrapped = mutated + graph_outs + bases
        values = [session.unwrap(v) for v in wrapped]
        tracer.output(values)
        versions = tuple((k, n) for k, v in enumerate(graph_outs + bases) if isinstance(v, torch.Tensor)
                         and torch._is_functional_tensor(v) and (n := session.eager_version(v)) > 0)
    meta = FunctionalMeta(input_infos, tuple(out_infos), len(graph_outs) + len(bases), len(bases), versions)
    # a leaf input mutated under no_grad (a weight update) stays a leaf in eager: its new value is
    # data, not something to differentiate
    requires_grad = tuple(isinstance(v, torch.Tensor) and v.requires_grad
                          and not (k < len(mutated) and v.is_leaf) for k, v in enumerate(wrapped))
    return ForwardTrace(graph_module(tracer), meta, spec, tuple(values), requires_grad, cloned, grad)


def _tangent_for(value: torch.Tensor) -> torch.Tensor:
    return torch.empty(value.shape, dtype=value.dtype, device=value.device)


def differentiable_outputs(forward: ForwardTrace) -> tuple[int, ...]:
    """Forward output positions that get a gradient from autograd (so a tangent in the backward)."""
    return tuple(k for k, (value, grad) in enumerate(zip(forward.outputs, forward.requires_grad))
                 if grad and _differentiable_dtype(value))


def _differentiable_dtype(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and (value.dtype.is_floating_point or value.is_complex())


def _is_missing_derivative(exc: RuntimeError) -> bool:
    text = str(exc)
    return text.startswith("derivative for ") and "is not implemented" in text


def trace_joint(gm: fx.GraphModule, inputs: TraceInputs, forward: ForwardTrace,
                decompositions: dict) -> JointTrace:
    """Forward and backward in one graph: grads of the differentiable outputs w.r.t. the primals.

    An op without a derivative (floor_divide on floats) raises in eager only when a backward
    reaches it, while tracing the backward reaches every path at once: the outputs whose own
    backward raises are found one by one and traced without a tangent, each with eager's error."""
    diff = differentiable_outputs(forward)
    try:
        return _trace_joint(gm, inputs, forward, decompositions, diff)
    except RuntimeError as exc:
        if not _is_missing_derivative(exc):
            raise
    missing: list[tuple[int, str]] = []
    for k in diff:
        try:
            _trace_joint(gm, inputs, forward, decompositions, (k,))
        except RuntimeError as exc:
            if not _is_missing_derivative(exc):
                raise
            missing.append((k, str(exc)))
    clean = tuple(k for k in diff if k not in dict(missing))
    joint = _trace_joint(gm, inputs, forward, decompositions, clean)
    return dataclasses.replace(joint, no_derivative=tuple(missing))


def _trace_joint(gm: fx.GraphModule, inputs: TraceInputs, forward: ForwardTrace, decompositions: dict,
                 diff: tuple[int, ...]) -> JointTrace:
    with contextlib.ExitStack() as stack:
        if inputs.fake_mode is not None:
            stack.enter_context(inputs.fake_mode)
        tangent_values = [_tangent_for(forward.outputs[k]) for k in diff]
    tracer = AtenTracer(decompositions)
    session = FunctionalSession(tracer)
    with tracing(inputs, tracer):
        primals = [session.add_input(f"primals_{i + 1}", v) for i, v in enumerate(inputs.values)]
        tangents = [session.add_input(f"tangents_{j + 1}", t) for j, t in enumerate(tangent_values)]
        with session.active(), torch.set_grad_enabled(forward.grad_enabled):
            visible = session.visible_inputs(forward.cloned)
            outs, _ = call_user_graph(gm, inputs, visible[:len(primals)], tracer.graph)
            input_infos = session.input_infos()[:len(primals)]
            _, graph_outs, bases = session.classify_outputs(outs)
            mutated = [visible[i] for i, info in enumerate(input_infos) if info.mutates_data]
            fw_values = mutated + graph_outs + bases
            # a tensor passed twice gets its gradient once, in its first slot (autograd would
            # otherwise accumulate it twice into the same tensor)
            needs = [isinstance(p, torch.Tensor) and p.requires_grad and i not in session.duplicate_of
                     for i, p in enumerate(primals)]
            wrt = [p for p, need in zip(primals, needs) if need]
            before_backward = set(tracer.graph.nodes)
            # A custom Function's once_differentiable backward runs under no_grad, so under
            # create_graph=True eager's gradients that only it computes have no history: tracing
            # with create_graph shows which (the other graphs keep the cheaper trace)
            history = _once_differentiable_call(gm)
            grads = torch.autograd.grad([fw_values[k] for k in diff], wrt, tangents, allow_unused=True,
                                        create_graph=history) if diff and wrt else [None] * len(wrt)
            # what the backward computes, tangents read or not (a custom Function's backward may
            # check its saved inputs' values): the partitioner keeps those checks in the backward
            for node in tracer.graph.nodes:
                if node not in before_backward:
                    node.meta["traced_in_backward"] = True
        it = iter(grads)
        full = [next(it) if need else None for need in needs]
        tracer.output([session.unwrap(v) for v in fw_values] +
                      [session.unwrap(g) if g is not None else None for g in full])
    with_history = tuple(g is not None and g.requires_grad for g in full) if history else None
    return JointTrace(graph_module(tracer), len(fw_values), diff, grads_with_history=with_history)


# the code of every wrapper torch's once_differentiable makes (functools.wraps copies the name)
_ONCE_DIFFERENTIABLE_CODE = torch.autograd.function.once_differentiable(lambda ctx, *grads: None).__code__


def _once_differentiable_call(gm: fx.GraphModule) -> bool:
    """Whether the captured graph applies a custom autograd.Function (capture's graph target keeps
    the class as `function`) whose backward is wrapped by torch's `once_differentiable`."""
    for node in gm.graph.nodes:
        function = getattr(node.target, "function", None) if node.op == "call_function" else None
        if isinstance(function, type) and issubclass(function, torch.autograd.Function):
            backward = inspect.getattr_static(function, "backward", None)
            backward = getattr(backward, "__func__", backward)
            if getattr(backward, "__code__", None) is _ONCE_DIFFERENTIABLE_CODE:
                return True
    return False
