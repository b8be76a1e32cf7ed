"""Checkpointed regions in AOT autograd: from capture's tags to what the partitioner recomputes.

Capture tags each torch-level node of a `torch.utils.checkpoint` body (kiln/capture/variables/
checkpoint.py: `meta["recompute"]`, `meta["ac_graph_id"]`, and `meta["checkpoint_policy"]` for a
selective checkpoint). `run_user_graph` runs such a graph node by node while the ATen trace records,
and stamps the same tags on every ATen node a tagged node produced; a selective policy is asked
about each ATen op there, as torch.compile asks it. `recompute_plan` then turns the joint graph's
tags into the partitioner's decisions (kiln/autograd/partition.py): MUST/PREFER_RECOMPUTE nodes
are recomputed in the backward, never saved; MUST_SAVE nodes are pinned to the forward.

A random op inside a region is saved, not recomputed: eager's checkpoint replays the RNG state so
the recomputed dropout mask is the forward's, and a second draw in a compiled backward would not
be. A region's inputs are kept as eager keeps them: a value made outside the region, or in an
earlier region, that a region reads is saved (so consecutive checkpointed layers recompute one
layer each, not the whole forward from the graph's inputs).
PyTorch counterpart: torch/_higher_order_ops/wrap.py (tag_activation_checkpoint) and
torch/_functorch/partitioners.py (must_recompute, cleanup_recompute_tags).
"""
from __future__ import annotations

import dataclasses
import itertools
import operator
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

from kiln.errors import KilnError

# The meta keys capture writes (the first two are the names torch.compile's partitioner reads)
RECOMPUTE = "recompute"
REGION = "ac_graph_id"
POLICY = "checkpoint_policy"

_RECOMPUTE_POLICIES = frozenset({CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE})
# Kiln keeps saved values where they are: an offload policy saves (the values are the same).
_OFFLOAD_AS_SAVE = {CheckpointPolicy.MUST_CPU_OFFLOAD: CheckpointPolicy.MUST_SAVE,
                    CheckpointPolicy.PREFER_CPU_OFFLOAD: CheckpointPolicy.PREFER_SAVE}
# Ops torch's selective checkpoint never asks the policy about (extra detaches, device queries)
_POLICY_IGNORED = frozenset({torch.ops.aten.detach.default, torch.ops.prim.device.default})


def has_regions(gm: fx.GraphModule) -> bool:
    """Whether capture tagged any node of `gm` as part of a checkpointed region."""
    return any(RECOMPUTE in n.meta for n in gm.graph.nodes)


def must_recompute(policy: Any) -> bool:
    return policy in _RECOMPUTE_POLICIES


class _RegionStamper(TorchDispatchMode):
    """Sits above the ATen tracer while one tagged torch-level node runs, and tags the ATen nodes
    each op it sees adds to `graph` (the op and, through its decomposition, the ops it becomes)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as the ATen tracer: never under Dynamo, and importing it costs seconds

    def __init__(self, graph: fx.Graph, region: int, default: Any, policy: Callable[..., Any] | None) -> None:
        super().__init__()
        self.graph = graph
        self.region = region
        self.default = default
        self.policy = policy

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = len(self.graph.nodes)
        out = func(*args, **kwargs)
        added = len(self.graph.nodes) - before
        if added:
            decision = self._decide(func, args, kwargs, out)
            for node in itertools.islice(reversed(self.graph.nodes), added):
                if node.op == "call_function":
                    node.meta[RECOMPUTE] = decision
                    node.meta[REGION] = self.region
        return out

    def _decide(self, func: Any, args: tuple, kwargs: dict, out: Any) -> CheckpointPolicy:
        if self.policy is None or func in _POLICY_IGNORED:
            return self.default
        decision = self.policy(SelectiveCheckpointContext(is_recompute=False, op_output=out), func, *args, **kwargs)
        if isinstance(decision, bool):  # the policy's old form: True saves
            decision = CheckpointPolicy.MUST_SAVE if decision else CheckpointPolicy.PREFER_RECOMPUTE
        if not isinstance(decision, CheckpointPolicy):
            raise KilnError(f"checkpoint policy returned {decision!r} for {func}; expected a CheckpointPolicy")
        return _OFFLOAD_AS_SAVE.get(decision, decision)


class _RegionInterpreter(fx.Interpreter):
    """Runs the captured graph as its generated code would, stamping the ATen nodes of tagged nodes."""

    def __init__(self, gm: fx.GraphModule, graph: fx.Graph) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.aten_graph = graph

    def run_node(self, n: fx.Node) -> Any:
        if RECOMPUTE not in n.meta or n.op not in ("call_function", "call_method"):
            return super().run_node(n)
        with _RegionStamper(self.aten_graph, n.meta[REGION], n.meta[RECOMPUTE], n.meta.get(POLICY)):
            return super().run_node(n)


def run_user_graph(gm: fx.GraphModule, args: list[Any], graph: fx.Graph | None) -> Any:
    """`gm(*args)` while an ATen trace records into `graph`; with checkpointed regions, node by node
    so that the region's ATen nodes carry its tags."""
    if graph is None or not has_regions(gm):
        # forward, not Module.__call__: the graph is not one of the program's modules, and global
        # module hooks (register_module_forward_hook) must not run on it
        return gm.forward(*args)
    return _RegionInterpreter(gm, graph).run(*args)


# ------------------------------------------------------------------------------ the partitioner's view

def recompute_plan(nodes: list[fx.Node]) -> dict[fx.Node, CheckpointPolicy]:
    """Each tagged joint-graph node's policy as the partitioner applies it (see the module doc)."""
    plan: dict[fx.Node, CheckpointPolicy] = {}
    for node in nodes:
        policy = node.meta.get(RECOMPUTE)
        if node.op != "call_function" or not isinstance(policy, CheckpointPolicy):
            continue
        if must_recompute(policy) and _is_random(node):
            policy = CheckpointPolicy.MUST_SAVE  # eager replays the RNG; a compiled backward cannot
        plan[node] = policy
    for node in nodes:
        if node.target is operator.getitem and must_recompute(plan.get(node)):
            parent = node.args[0]
            if isinstance(parent, fx.Node) and not must_recompute(plan.get(parent)):
                plan[node] = CheckpointPolicy.MUST_SAVE  # a saved tuple op is saved through its items
    for node in nodes:
        policy = plan.get(node)
        if node.op != "call_function" or not any(must_recompute(plan.get(u)) for u in node.users):
            continue
        parent = node.args[0] if node.target is operator.getitem else None
        if policy is None and not (isinstance(parent, fx.Node) and must_recompute(plan.get(parent))):
            plan[node] = CheckpointPolicy.MUST_SAVE  # a region's input, made outside it: kept, as eager keeps it
        elif must_recompute(policy):
            region = node.meta.get(REGION, 0)
            if any(must_recompute(plan.get(u)) and u.meta.get(REGION, 0) > region for u in node.users):
                plan[node] = CheckpointPolicy.MUST_SAVE
    return plan


def _is_random(node: fx.Node) -> bool:
    """An op that draws random numbers here: seeded ops, except attention with dropout_p == 0
    (scaled_dot_product_attention's kernels carry the tag for their optional dropout)."""
    target = node.target
    if not (isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags):
        return False
    for k, arg in enumerate(target._schema.arguments):
        if arg.name == "dropout_p":
            value = node.kwargs.get("dropout_p", node.args[k] if k < len(node.args) else arg.default_value)
            return not (isinstance(value, (int, float)) and value == 0)
    return True


@dataclasses.dataclass(frozen=True)
class RecomputedValue:
    """A forward value the backward graph computes again instead of loading it."""

    name: str
    op: str
    region: int | None  # the checkpointed region it belongs to; None: the min-cut chose to recompute it
    policy: str | None  # the region's policy for it (PREFER_RECOMPUTE for a plain checkpoint)


def recomputed_values(forward: fx.GraphModule, backward: fx.GraphModule,
                      joint: dict[str, fx.Node]) -> tuple[RecomputedValue, ...]:
    """The ops both graphs compute (the partition keeps the joint graph's node names): values the
    backward computes again instead of loading them. Backward-only ops on forward values (a
    derivative's `-sin(x)`) are not recomputations and are not listed."""
    in_forward = {n.name for n in forward.graph.nodes if n.op == "call_function"}
    found = []
    for node in backward.graph.nodes:
        if node.op != "call_function" or node.name not in in_forward or node.name not in joint:
            continue
        policy = joint[node.name].meta.get(RECOMPUTE)
        found.append(RecomputedValue(node.name, str(node.target), joint[node.name].meta.get(REGION),
                                     policy.name if isinstance(policy, CheckpointPolicy) else None))
    return tuple(found)
