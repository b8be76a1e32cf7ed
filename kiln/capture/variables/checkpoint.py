"""Activation checkpointing during capture: `torch.utils.checkpoint.checkpoint(fn, *args, ...)`.

The call is not traced through torch's own implementation (saved-tensor hooks, a generator, an
autograd.Function that reruns `fn` in the backward): the body `fn(*args, **kwargs)` is inlined into
the one graph, and every node it adds is tagged in `node.meta` as a checkpointed region:
`"recompute"` (a `torch.utils.checkpoint.CheckpointPolicy`), `"ac_graph_id"` (the region, in
program order) and, for a selective checkpoint, `"checkpoint_policy"` (the SAC policy function,
called by AOT autograd on each ATen op of the region). AOT autograd carries the tags to the joint
graph and its min-cut partitioner recomputes the region in the backward instead of saving it
(kiln/autograd/checkpoint.py). Values are the body's; only what is saved changes.

A body that cannot be traced makes the whole checkpoint call a graph break (it runs eagerly, as
torch.compile runs it); the reason names the break inside. So does a body that changes state outside
the function (a list a forward hook appends to, a counter): eager's backward runs it once more. Corresponds to
torch/_dynamo/variables/higher_order_ops.py (CheckpointHigherOrderVariable) and
torch/_higher_order_ops/wrap.py (tag_activation_checkpoint).
"""
from __future__ import annotations

import contextlib
import itertools
import warnings
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch.utils.checkpoint as torch_checkpoint
from torch.utils.checkpoint import CheckpointPolicy

from kiln.capture.sources import Source
from kiln.capture.variables.base import Variable
from kiln.capture.variables.exception import RaisedInTrace
from kiln.capture.variables.grad_mode import set_grad_mode
from kiln.capture.variables.real_value import real_value
from kiln.capture.variables.tensor import TensorVariable
from kiln.errors import Unsupported

if TYPE_CHECKING:
    from kiln.capture.glue import GlueBuilder
    from kiln.capture.tracer import Tracer

# The meta keys a checkpointed node carries (the names torch.compile's partitioner reads, plus ours)
RECOMPUTE = "recompute"
REGION = "ac_graph_id"
POLICY = "checkpoint_policy"

# Region ids only need to grow in program order within a graph (the partitioner saves a value that
# flows from an earlier region into a later one); one counter for the process does that.
_region_ids = itertools.count(1)

_CHECKPOINT_FUNCTIONS: frozenset[Any] = frozenset(
    f for f in (torch_checkpoint.checkpoint, getattr(torch_checkpoint.checkpoint, "__wrapped__", None))
    if f is not None)
_DETERMINISM_CHECKS = ("default", "none")


def is_checkpoint_function(value: Any) -> bool:
    """`torch.utils.checkpoint.checkpoint` (or the function its dynamo-disable wrapper wraps)."""
    try:
        return value in _CHECKPOINT_FUNCTIONS
    except TypeError:  # unhashable
        return False


class CheckpointVariable(Variable):
    """`torch.utils.checkpoint.checkpoint`; calling it traces the body as a tagged region."""

    def __init__(self, fn: Any, source: Source | None = None) -> None:
        self.fn = fn
        self.source = source

    def describe(self) -> str:
        return "torch.utils.checkpoint.checkpoint"

    def python_type(self) -> type:
        return type(self.fn)

    def as_python_value(self) -> Any:
        return self.fn

    def call(self, tx: "Tracer", args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if not args:
            raise Unsupported("checkpoint() called without a function (raised natively)", kind="checkpoint")
        options = dict(kwargs)
        use_reentrant = _pop_constant(options, "use_reentrant", None)
        context_fn = options.pop("context_fn", None)
        determinism_check = _pop_constant(options, "determinism_check", "default")
        debug = _pop_constant(options, "debug", False)
        _pop_constant(options, "early_stop", True)
        _pop_constant(options, "preserve_rng_state", True)  # the body runs once: the RNG advances once
        if use_reentrant is None:
            # eager warns (a UserWarning at the calling line) and then uses True
            _warn_at(tx, "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly; "
                         "without it, use_reentrant=True is used")
            use_reentrant = True
        if use_reentrant:
            if options:
                raise Unsupported("checkpoint(use_reentrant=True) with keyword arguments for the function "
                                  "(eager raises ValueError)", kind="checkpoint")
            if context_fn is not None and not _is_noop(context_fn) or debug:
                raise Unsupported("checkpoint(use_reentrant=True) with context_fn or debug (eager raises "
                                  "ValueError)", kind="checkpoint")
        elif determinism_check not in _DETERMINISM_CHECKS:
            raise Unsupported(f"checkpoint(determinism_check={determinism_check!r}) (eager raises ValueError)",
                              kind="checkpoint")
        policy = None if context_fn is None else selective_policy(context_fn)
        body, body_args = args[0], list(args[1:])
        # Reentrant checkpoint is an autograd.Function over the positional tensors: with none that
        # requires grad its outputs require none either (eager warns, and the body ran under no_grad).
        no_grad_body = bool(use_reentrant) and tx.state.grad_enabled and not any(
            isinstance(a, TensorVariable) and a.example.requires_grad for a in body_args)
        if no_grad_body:
            _warn_at(tx, "None of the inputs have requires_grad=True. Gradients will be None")
        return trace_region(tx, body, body_args, options, policy, no_grad_body)

    def reconstruct(self, glue: "GlueBuilder") -> str:
        if self.source is not None:
            return self.source.name()
        return glue.constant(self.fn)


def _warn_at(tx: "Tracer", message: str) -> None:
    """Eager's warning, at the user's line that called checkpoint (issued while tracing: a capture
    warns once where eager, under Python's default filter, also warns once per line)."""
    module = tx.f_globals.get("__name__", "__main__")
    registry = tx.f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, UserWarning, tx.code.co_filename, tx.lineno, module, registry)


def _pop_constant(options: dict[str, Variable], name: str, default: Any) -> Any:
    var = options.pop(name, None)
    if var is None:
        return default
    if not var.is_constant():
        raise Unsupported(f"checkpoint({name}=...) not known at trace time", kind="checkpoint")
    return var.as_constant()


def _is_noop(var: Variable) -> bool:
    try:
        return real_value(var) is torch_checkpoint.noop_context_fn
    except Unsupported:
        return False


def trace_region(tx: "Tracer", body: Variable, args: list[Variable], kwargs: dict[str, Variable],
                 policy: Callable[..., Any] | None, no_grad: bool) -> Variable:
    """Inline `body(*args, **kwargs)` and tag the nodes it added as one checkpointed region."""
    graph = tx.output.graph
    before = set(graph.nodes)
    grad_mode = tx.state.grad_enabled
    if no_grad:
        set_grad_mode(tx, False)
    tx.side_effects.open_body()
    try:
        result = body.call(tx, args, kwargs)
    except RaisedInTrace:
        raise  # the body raised: the exception leaves checkpoint as it is, for the frame's handlers
    except Unsupported as exc:
        if exc.kind == "checkpoint":
            raise  # a nested checkpoint already said why
        tx.state.innermost = tx  # the break is the checkpoint call itself
        raise Unsupported(f"checkpointed function cannot be traced ({exc.reason}); the checkpoint call "
                          "runs eagerly", kind="checkpoint") from exc
    finally:
        unchanged = tx.side_effects.close_body()
    if not unchanged:
        # Eager runs the body twice (again in the backward, to recompute what it did not save): a
        # write outside the function (a list a forward hook appends to, a counter) happens twice
        # there, once in a graph. As torch.compile, the checkpoint call runs eagerly.
        tx.state.innermost = tx
        raise Unsupported("checkpointed function changes state outside the function (eager's backward "
                          "runs it again); the checkpoint call runs eagerly", kind="checkpoint")
    if no_grad:
        set_grad_mode(tx, grad_mode)
    region = next(_region_ids)
    for node in graph.nodes:
        if node in before or node.op == "placeholder":
            continue
        # nested regions: the outermost id (the whole outer body is recomputed), the innermost policy
        node.meta[RECOMPUTE] = CheckpointPolicy.PREFER_RECOMPUTE
        node.meta[REGION] = region
        if policy is not None:
            node.meta.setdefault(POLICY, policy)
    return result


# ------------------------------------------------------------------------------ selective policies

def selective_policy(context_fn: Variable) -> Callable[..., Any] | None:
    """The SAC policy function of a `context_fn`, or None for plain checkpointing.

    As torch.compile does, the context_fn itself is called (once, at trace time) and what it
    returns is read: `create_selective_checkpoint_contexts(policy_fn_or_list)` gives a caching mode
    that holds the policy; a pair of null contexts is plain checkpointing. Anything else (a user's
    own dispatch mode) cannot be honoured inside a graph: the checkpoint runs eagerly."""
    fn = real_value(context_fn)
    if fn is torch_checkpoint.noop_context_fn:
        return None
    if not callable(fn):
        raise Unsupported(f"checkpoint(context_fn={fn!r}) is not callable", kind="checkpoint")
    try:
        contexts = fn()
    except Exception as exc:  # raised again where the call runs natively
        raise Unsupported(f"checkpoint's context_fn raised {type(exc).__name__}: {exc}",
                          kind="checkpoint") from exc
    if not (isinstance(contexts, tuple) and len(contexts) == 2):
        raise Unsupported("checkpoint's context_fn did not return two context managers", kind="checkpoint")
    forward_ctx = contexts[0]
    caching = getattr(torch_checkpoint, "_CachingTorchDispatchMode", None)
    if caching is not None and isinstance(forward_ctx, caching):
        policy: Callable[..., Any] = forward_ctx.policy_fn
        return policy
    if all(isinstance(c, contextlib.nullcontext) for c in contexts):
        return None
    raise Unsupported(f"checkpoint's context_fn returned {type(forward_ctx).__name__}, not the contexts of "
                      "create_selective_checkpoint_contexts", kind="checkpoint")
