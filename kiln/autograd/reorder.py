"""Reordering a backward graph for a lower peak of live memory.

The joint graph lists a backward's ops in the order autograd reached them: for a linear layer the
input gradient's matmul comes before the weight gradient's, and values the partitioner chose to
recompute come first of all. Both keep large buffers alive longer than they need to be: in a
transformer block's MLP, the gradient of the hidden layer (allocated by the first matmul) is
alive while the recomputed GELU output waits for the weight-gradient matmul that frees it.

`reorder_for_peak_memory` estimates the peak of an order by walking it: a node allocates its
value's bytes (views and tuple items allocate nothing: they share their base's storage; nor does
a pointwise value read only by pointwise ops, which the lowering fuses into its readers), and a
storage is freed after the last user of every value that shares it; inputs (the saved
activations, which the runtime hands over and frees at their last use) are live from the start
and graph outputs to the end; a pointwise node that can write over an input of its size dying
with it allocates nothing (the lowering's memory plan does that). It then builds a second order
greedily: of the ready nodes, one that frees memory or allocates none runs first (the one freeing
most); otherwise the allocating node whose value is read soonest in the original order, so that a
recomputed value is not made long before its reader. The new order is kept only when its
estimated peak is lower. Data dependencies are the only constraints: a backward graph is
functional (no mutation, no random op), and a graph that has either is left as it is. The estimate
knows the lowering's fusion only roughly (its scheduler may still move a kernel earlier), so the
measured peak (benchmarks/memory.py) is the judge: gpt_block_training 21.0 -> 20.0 MiB. PyTorch counterpart: the peak-memory reordering of
torch/_inductor/memory.py, done here on the ATen graph before the lowering.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from kiln.autograd.tracer import size_hint

MAX_NODES = 4000  # the greedy pass is quadratic in the number of nodes; larger graphs keep their order


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        numel = 1
        for s in value.shape:
            numel *= size_hint(s)
        return numel * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_bytes(v) for v in value)
    return 0


def is_view_op(target: Any) -> bool:
    """An op whose first result aliases its input without writing it (view, t, expand, ...)."""
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def _is_view(node: fx.Node) -> bool:
    return node.target is operator.getitem or is_view_op(node.target)


def _pointwise(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags


def _fused_away(node: fx.Node) -> bool:
    """A pointwise value whose every reader is pointwise too (or a view read only by pointwise
    ops): the lowering computes it inside its readers' kernel and never stores it."""
    if node.op != "call_function" or not _pointwise(node):
        return False
    work = list(node.users)
    while work:
        user = work.pop()
        if user.op == "output":
            return False
        if _is_view(user) and user.target is not operator.getitem:
            work.extend(user.users)
        elif not _pointwise(user):
            return False
    return True


def _reorderable(graph: fx.Graph) -> bool:
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            schema = node.target._schema
            if schema.is_mutable or torch.Tag.nondeterministic_seeded in node.target.tags:
                return False
        elif node.op not in ("placeholder", "output", "get_attr", "call_function"):
            return False
    return True


class _Storages:
    """Which storage each value lives in (a view's is its base's), and each storage's bytes."""

    def __init__(self, nodes: list[fx.Node], borrowed: frozenset[str]) -> None:
        self.root: dict[fx.Node, fx.Node] = {}
        self.size: dict[fx.Node, int] = {}
        for node in nodes:
            if node.op == "placeholder" and node.name in borrowed:
                self.root[node] = node
                self.size[node] = 0  # another owner keeps it alive: reading it last frees nothing
                continue
            base = node.args[0] if node.op == "call_function" and node.args else None
            if node.op == "call_function" and _is_view(node) and isinstance(base, fx.Node):
                self.root[node] = self.root[base]
            else:
                self.root[node] = node
                self.size[node] = 0 if _fused_away(node) else _bytes(node.meta.get("val"))
        # the nodes that must all have run before a storage can go: every user of every value in it
        self.users: dict[fx.Node, set[fx.Node]] = {r: set() for r in self.size}
        for node in nodes:
            self.users[self.root[node]].update(node.users)


def _step(st: _Storages, waiting: dict[fx.Node, set[fx.Node]], kept: set[fx.Node], node: fx.Node,
          commit: bool) -> tuple[int, int]:
    """(bytes node allocates, bytes freed after it runs). A pointwise node writes in place over
    an input of its size that dies with it (as the lowering's memory plan does), allocating nothing."""
    grow = st.size[node] if st.root[node] is node and node.op != "placeholder" else 0
    dying = []
    for arg in set(node.all_input_nodes):
        root = st.root[arg]
        pending = waiting[root]
        if node in pending and len(pending) == 1 and root not in kept and root not in dying:
            dying.append(root)
        if commit:
            pending.discard(node)
    freed = sum(st.size[r] for r in dying)
    if grow and _pointwise(node) and any(st.size[r] == grow for r in dying):
        return 0, freed - grow
    return grow, freed


def estimated_peak(nodes: list[fx.Node], borrowed: frozenset[str] = frozenset()) -> int:
    """Peak live bytes of running `nodes` (a whole graph, in this order); `borrowed` names the
    inputs whose memory is not the graph's to free (a parameter, or a view of one)."""
    st = _Storages(nodes, borrowed)
    kept = {st.root[a] for a in nodes[-1].all_input_nodes}
    waiting = {r: set(users) for r, users in st.users.items()}
    live = sum(st.size[n] for n in nodes if n.op == "placeholder")
    peak = live
    for node in nodes:
        grow, freed = _step(st, waiting, kept, node, commit=True)
        live += grow
        peak = max(peak, live)
        live -= freed
    return peak


def _greedy_order(nodes: list[fx.Node], borrowed: frozenset[str]) -> list[fx.Node]:
    st = _Storages(nodes, borrowed)
    output = nodes[-1]
    kept = {st.root[a] for a in output.all_input_nodes}
    position = {n: k for k, n in enumerate(nodes)}
    waiting = {r: set(users) for r, users in st.users.items()}
    missing = {n: len(set(n.all_input_nodes)) for n in nodes}
    order = [n for n in nodes if n.op == "placeholder"]
    ready: set[fx.Node] = set()

    def ran(node: fx.Node) -> None:
        for user in node.users:
            missing[user] -= 1
            if missing[user] == 0 and user is not output:
                ready.add(user)

    for n in nodes:
        if n.op != "placeholder" and missing[n] == 0 and n is not output:
            ready.add(n)
    for n in order:
        ran(n)

    def net(node: fx.Node) -> int:
        grow, freed = _step(st, waiting, kept, node, commit=False)
        return grow - freed

    def needed_at(node: fx.Node) -> int:
        return min((position[u] for u in node.users), default=len(nodes))

    def priority(node: fx.Node) -> tuple[int, int, int]:
        change = net(node)
        if change <= 0:
            return (0, change, position[node])  # frees memory (or nothing): now, the most first
        return (1, needed_at(node), position[node])  # allocates: the one needed soonest first

    while ready:
        node = min(ready, key=priority)
        ready.discard(node)
        order.append(node)
        for arg in set(node.all_input_nodes):
            waiting[st.root[arg]].discard(node)
        ran(node)
    order.append(output)
    return order


def reorder_for_peak_memory(gm: fx.GraphModule, borrowed: frozenset[str] = frozenset()) -> tuple[int, int]:
    """Reorder gm's graph in place when that lowers its estimated peak; returns (peak before,
    peak after) in bytes (equal when the order was kept). `borrowed`: as for estimated_peak."""
    nodes = list(gm.graph.nodes)
    before = estimated_peak(nodes, borrowed)
    if len(nodes) > MAX_NODES or not _reorderable(gm.graph):
        return before, before
    order = _greedy_order(nodes, borrowed)
    if len(order) != len(nodes):  # a node never became ready: leave the graph alone
        return before, before
    after = estimated_peak(order, borrowed)
    if after >= before:
        return before, before
    previous = order[0]
    for node in order[1:]:
        previous.append(node)  # moves node to just after previous
        previous = node
    gm.graph.lint()
    gm.recompile()
    return before, after
