"""Partitioning the joint graph into a forward graph and a backward graph.

`save_all` (the default partitioner): the forward saves every forward value the backward reads.
`min_cut` (rematerialization, Kiln's default): the saved set is a minimum s-t cut over the joint
graph, each node costing its size in bytes; cheap pointwise and view ops may be recomputed in the
backward, while matmul, convolution, reductions and random ops are pinned to the forward so their
results are saved (a saved dropout mask is the same mask in both passes), and so is a pointwise
value a convolution's backward reads below channels-last sizes (the backward would store it again). Nodes of a checkpointed
region (torch.utils.checkpoint, tagged by capture) are recomputed whatever they cost, except what a
selective policy says to save (kiln/autograd/checkpoint.py); `Partition.recomputed` lists what the
backward computes again. JointTrace -> Partition.
PyTorch counterpart: torch/_functorch/partitioners.py (default_partition, min_cut_rematerialization).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
from typing import AbstractSet, Any, Iterable

import sympy
import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from torch.utils.checkpoint import CheckpointPolicy

from kiln.autograd.checkpoint import RecomputedValue, must_recompute, recompute_plan, recomputed_values
from kiln.autograd.joint import JointTrace
from kiln.autograd.reorder import is_view_op as _is_view, reorder_for_peak_memory
from kiln.autograd.tracer import expr_of, size_hint
from kiln.fake.value_checks import raises_on_values

aten = torch.ops.aten

# Non-pointwise ops that are cheap enough to recompute: copies, broadcasts and fills.
CHEAP_OPS = frozenset({
    aten.clone.default, aten._to_copy.default, aten.expand.default, aten.full.default,
    aten.zeros.default, aten.ones.default, aten.scalar_tensor.default, aten.full_like.default,
    aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default, aten.fill.Scalar,
    aten.where.self, aten.lift_fresh_copy.default, aten.detach.default, aten.alias.default,
    aten.sym_size.int, aten.copy.default, aten.empty.memory_format, aten.empty_strided.default,
})


@dataclasses.dataclass(frozen=True)
class SavedValue:
    """One value the forward hands to the backward."""

    name: str
    produced_by: str  # the op that made it, e.g. "aten.gelu.default" or "placeholder"
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    aliases_input: bool = False  # an input or a view of one: saving it costs no extra memory


@dataclasses.dataclass(frozen=True)
class Partition:
    """forward: primals -> (*forward outputs, *saved tensors, *saved symints);
    backward: (*saved tensors, *saved symints, *tangents) -> one grad per primal (None if none)."""

    policy: str
    forward: fx.GraphModule
    backward: fx.GraphModule
    num_forward_outputs: int
    saved_tensors: tuple[SavedValue, ...]
    saved_symints: tuple[SavedValue, ...]
    recomputed: tuple[RecomputedValue, ...] = ()  # forward values the backward computes again

    @property
    def saved_bytes(self) -> int:
        return sum(s.nbytes for s in self.saved_tensors)

    @property
    def activation_bytes(self) -> int:
        """Saved bytes that are not inputs or views of inputs: the memory a partition really holds."""
        return sum(s.nbytes for s in self.saved_tensors if not s.aliases_input)


def is_recomputable(node: fx.Node) -> bool:
    """May the backward compute this node again instead of loading it? Cheap, deterministic ops."""
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem or not isinstance(target, torch._ops.OpOverload):
        return True  # tuple projections and symbolic-size arithmetic
    tags = target.tags
    if torch.Tag.nondeterministic_seeded in tags:
        return False  # a second draw would give a different mask
    return torch.Tag.pointwise in tags or _is_view(target) or target in CHEAP_OPS


def node_bytes(node: fx.Node) -> int | None:
    """Bytes to keep this node's value alive, from its traced value; None if it cannot be saved."""
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        numel = 1
        for s in value.shape:
            numel *= size_hint(s)
        return numel * value.element_size()
    if isinstance(value, (torch.SymInt, torch.SymFloat, int, float)):  # SymFloat: a float argument
        return 0
    return None


def _computed_from_float(node: fx.Node) -> bool:
    """A scalar computed (not a placeholder) from a float argument's symbol (kiln.symbolic's zf<n>)."""
    value = node.meta.get("val")
    if node.op == "placeholder" or not isinstance(value, (torch.SymInt, torch.SymFloat)):
        return False
    expr = getattr(value.node, "expr", None)
    from kiln.symbolic.expr import is_float_symbol

    return any(is_float_symbol(str(s)) for s in getattr(expr, "free_symbols", ()))


def _ancestors(roots: Iterable[Any], stop: AbstractSet[fx.Node] = frozenset()) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    work = [r for r in roots if isinstance(r, fx.Node)]
    while work:
        node = work.pop()
        if node in seen:
            continue
        seen.add(node)
        if node not in stop:
            work.extend(node.all_input_nodes)
    return seen


def _describe(node: fx.Node) -> SavedValue:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        shape = tuple(size_hint(s) for s in value.shape)
        dtype = str(value.dtype).replace("torch.", "")
    else:
        shape, dtype = (), type(value).__name__
    if node.op == "placeholder":
        made_by = "input"
    elif node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        made_by = f"output {node.args[1]} of {node.args[0].target}"
    else:
        made_by = str(node.target)
    return SavedValue(node.name, made_by, shape, dtype, node_bytes(node) or 0, _aliases_input(node))


def _aliases_input(node: fx.Node) -> bool:
    return _input_base(node) is not None


def _input_base(node: fx.Node) -> fx.Node | None:
    """The placeholder whose memory `node` is (itself, or through a chain of views), else None."""
    while node.op == "call_function" and _is_view(node.target):
        base = node.args[0]
        if not isinstance(base, fx.Node):  # a view of a constant: the backward of `z * (1 + 2j)`
            return None                    # conjugates the Python scalar with aten._conj
        node = base
    return node if node.op == "placeholder" else None


def _saved_by_save_all(nodes: list[fx.Node], fw: set[fx.Node], bw_needed: set[fx.Node]) -> list[fx.Node]:
    # a multi-output op's tuple cannot be saved: the forward projects what the backward reads
    projections = {n for n in bw_needed if n.target is operator.getitem and n.args[0] in fw}
    forward = fw | projections
    bw_nodes = bw_needed - forward
    return [n for n in nodes if n in forward and any(u in bw_nodes for u in n.users)]


def _inputs_eager_keeps(nodes: list[fx.Node]) -> set[fx.Node]:
    """The inputs eager's autograd keeps for its backward: those an op of the backward reads, the
    input itself or a view of it. The others eager never keeps (sigmoid keeps its output, a matmul
    of a transposed input a contiguous copy of it): its backward runs even when the caller writes
    such an input in place after the forward, where a backward that read it would raise autograd's
    version-counter error (or, unchecked, differentiate the new values)."""
    kept: set[fx.Node] = set()
    for node in nodes:
        if node.meta.get("traced_in_backward"):
            for read in node.all_input_nodes:
                base = _input_base(read)
                if base is not None:
                    kept.add(base)
    return kept


# backward ops that run as externs on stored inputs (oneDNN's convolution backward): what they read
# is stored in the backward anyway, so computing it there again costs a pass of its own
_READS_STORED_INPUTS = frozenset({aten.convolution_backward.default})
# from this many pixels a CPU float32 convolution runs channels-last when nothing else reads its
# input: kiln.lower.conv_layout.CHANNELS_LAST_MIN_PIXELS (autograd does not import the lowering;
# tests/autograd/test_partition_cnn.py checks that the two agree)
NHWC_CONV_MIN_PIXELS = 256


def _stored_for_backward_extern(node: fx.Node, tangent_dependent: set[fx.Node]) -> bool:
    """Whether `node` is a pointwise value (an activation, a residual sum) that an extern of the
    backward reads: saved rather than recomputed, as PyTorch's partitioner bans recomputing what the
    backward must materialize. The forward stores it anyway (it is the next convolution's input),
    so saving it costs no pass, where computing it again (a ReLU6 of a saved BatchNorm output) costs
    the backward a read and a write of the whole tensor per layer."""
    target, value = node.target, node.meta.get("val")
    if not (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and torch.Tag.pointwise in target.tags and isinstance(value, torch.Tensor)):
        return False
    if (value.dim() == 4 and value.dtype == torch.float32 and value.device.type == "cpu"
            and size_hint(value.shape[2]) * size_hint(value.shape[3]) >= NHWC_CONV_MIN_PIXELS):
        # the forward's convolution runs channels-last on an input it alone reads (a graph output
        # keeps eager's layout): saved, it would run NCHW, which cost a ResNeXt-style training step
        # at 32x32 pixels 7% more than the backward's pass that computes the input again
        return False
    return any(u in tangent_dependent and u.target in _READS_STORED_INPUTS for u in node.users)


def _saved_by_min_cut(nodes: list[fx.Node], fw: set[fx.Node], bw_needed: set[fx.Node],
                      tangent_dependent: set[fx.Node], mutated: AbstractSet[str] = frozenset(),
                      module_state: AbstractSet[str] = frozenset()) -> list[fx.Node]:
    import networkx as nx  # a quarter second to import, and only the min-cut policy needs it

    plan = recompute_plan(nodes)  # checkpointed regions: recompute, or save what the policy says
    # an input (or a view of one) eager does not keep is never saved either: the backward then
    # raises, or not, where eager's does when the caller writes the input before the backward.
    # Module state (parameters, buffers) is exempt: programs do not write it between a forward and
    # its backward, and recomputing from it (a causal mask's `== 0` of a buffer) saves memory
    # (a size or float argument has no version counter: saving it is always safe)
    banned_inputs = {n for n in nodes if n.op == "placeholder" and n.name.startswith("primals")
                     and isinstance(n.meta.get("val"), torch.Tensor)
                     and n.name not in module_state} - _inputs_eager_keeps(nodes)
    g = nx.DiGraph()
    g.add_node("source")
    g.add_node("sink")
    for node in nodes:
        if node not in bw_needed:
            continue
        name = node.name
        if node in tangent_dependent:
            g.add_edge(name + "_in", "sink", capacity=math.inf)
            continue
        policy = plan.get(node)
        if node.op == "placeholder":
            g.add_edge("source", name + "_in", capacity=math.inf)
        elif must_recompute(policy):
            # computed again in the backward, whatever it costs: it can never be on the saved side
            g.add_edge(name + "_in", "sink", capacity=math.inf)
        elif node in fw and (policy is CheckpointPolicy.MUST_SAVE or not is_recomputable(node)
                             or (policy is None and _stored_for_backward_extern(node, tangent_dependent))):
            g.add_edge("source", name + "_in", capacity=math.inf)
        cost = node_bytes(node)
        base = _input_base(node)
        if base in banned_inputs:
            cost = None
        if cost is not None and base is not None and base.name not in mutated:
            # an input's memory (a parameter, a buffer, the caller's tensor) is held by its owner
            # anyway: saving it adds no bytes, so a value computed from it (a causal mask's `== 0`)
            # is recomputed in the backward rather than kept as a new tensor. Not for an input the
            # graph mutates: by the backward its memory holds the new value.
            cost = 0
            if node is not base and base.name not in module_state:
                # the caller's input itself rather than a view of it (x.t() for a matmul's backward),
                # made again in the backward: a view the forward made under no_grad, its base then
                # written by the caller, fails autograd's view check instead of eager's version check
                cost = 1
        if cost is not None and _computed_from_float(node):
            # a float argument itself rather than a number computed from it (f / 3, int(f * 10)):
            # the backward can recompute the number, never the float from the number
            cost += 1
        # a tiny constant per node makes the cut prefer fewer saved values among equal byte counts
        g.add_edge(name + "_in", name + "_out", capacity=math.inf if cost is None else cost + 1)
        for user in node.users:
            if user in bw_needed:
                g.add_edge(name + "_out", user.name + "_in", capacity=math.inf)
    if not nx.has_path(g, "source", "sink"):
        return []
    try:
        _, (reachable, _) = nx.minimum_cut(g, "source", "sink")
    except nx.NetworkXUnbounded:
        # an unsaveable value (a tuple) sits between a pinned forward op and the backward: no
        # finite cut exists, so fall back to saving what the backward reads
        return _saved_by_save_all(nodes, fw, bw_needed)
    return [n for n in nodes if n in bw_needed and n not in tangent_dependent
            and n.name + "_in" in reachable and n.name + "_out" not in reachable]


def _clamp_backward_reads_output(gm: fx.GraphModule, tangent_dependent: set[fx.Node]) -> bool:
    """Point each hardtanh_backward (ReLU6's) of the backward at the forward's hardtanh output
    instead of its input (or a clone of it, as an in-place ReLU6 is traced): the same mask, since
    for min < max, x <= min exactly when clamp(x) <= min, x >= max exactly when clamp(x) >= max,
    and NaN stays NaN. The output is what the next convolution reads, saved for its backward
    anyway; the input is a BatchNorm's output, which the cut must otherwise save as well (or the
    backward recompute). Eager's own backward of an in-place ReLU6 reads the output. Returns whether
    the graph changed."""
    changed = False
    for node in gm.graph.nodes:
        if node.target is not aten.hardtanh_backward.default or node not in tangent_dependent:
            continue
        _, source, low, high = node.args[:4]
        if not isinstance(source, fx.Node) or not (isinstance(low, (int, float)) and isinstance(high, (int, float))
                                                   and low < high):
            continue
        base = source
        while base.op == "call_function" and base.target is aten.clone.default and isinstance(base.args[0], fx.Node):
            base = base.args[0]
        out = next((u for u in base.users if u.target is aten.hardtanh.default and u not in tangent_dependent
                    and len(u.args) == 3 and not u.kwargs and u.args[1:] == (low, high)), None)
        if out is not None and out.meta.get("val") is not None and source.meta.get("val") is not None \
                and out.meta["val"].dtype == source.meta["val"].dtype:
            node.replace_input_with(source, out)
            changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


def _norm_output_source(node: fx.Node) -> tuple[fx.Node, list[fx.Node]] | None:
    """If `node` is a layer norm's output (native_layer_norm's item 0), possibly through view ops,
    the layer norm node and the views from its output up to `node`; else None."""
    views: list[fx.Node] = []
    while node.op == "call_function" and _is_view(node.target):
        views.append(node)
        base = node.args[0]
        if not isinstance(base, fx.Node):
            return None
        node = base
    if not (node.op == "call_function" and node.target is operator.getitem and node.args[1] == 0):
        return None
    norm = node.args[0]
    if not (isinstance(norm, fx.Node) and norm.target is aten.native_layer_norm.default):
        return None
    return norm, views[::-1]


def _recompute_norm_outputs(gm: fx.GraphModule, tangent_dependent: set[fx.Node]) -> bool:
    """Give the backward its own copy of each layer norm output it reads, written as the pointwise
    `(x - mean) * rstd * weight + bias` over the input and the saved statistics.

    native_layer_norm is one op, pinned to the forward, so without this the cut must save its
    output (as large as the input) for a weight gradient. With the copy the cut can save the
    statistics (one number per row) and the input, which the norm's own backward keeps anyway, and
    recompute the output late in the backward, as PyTorch's partitioner does on its decomposed
    graph. Only float32/float64 norms, whose statistics have the input's dtype, so the recomputed
    output is rounded as the forward's. Returns whether the graph changed."""
    graph = gm.graph
    items: dict[fx.Node, dict[int, fx.Node]] = {}
    for node in graph.nodes:
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node) \
                and node.args[0].target is aten.native_layer_norm.default:
            items.setdefault(node.args[0], {})[int(node.args[1])] = node
    copies: dict[fx.Node, fx.Node] = {}
    for user in list(graph.nodes):
        if user not in tangent_dependent:
            continue
        for arg in list(user.all_input_nodes):
            if arg in tangent_dependent:
                continue
            found = _norm_output_source(arg)
            if found is None:
                continue
            norm, views = found
            stats = items.get(norm, {})
            x, _, weight, bias = norm.args[:4]
            if 0 not in stats or 1 not in stats or 2 not in stats or not isinstance(x, fx.Node):
                continue
            xv = x.meta.get("val")
            if not isinstance(xv, torch.Tensor) or xv.dtype not in (torch.float32, torch.float64) \
                    or stats[1].meta["val"].dtype != xv.dtype:
                continue
            if arg not in copies:
                copies[arg] = _emit_norm_output(graph, stats[0], x, stats[1], stats[2], weight, bias, views)
            user.replace_input_with(arg, copies[arg])
    if copies:
        graph.lint()
        gm.recompile()
    return bool(copies)


def _emit_norm_output(graph: fx.Graph, norm_out: fx.Node, x: fx.Node, mean: fx.Node, rstd: fx.Node,
                      weight: Any, bias: Any, views: list[fx.Node]) -> fx.Node:
    """The recompute chain of one layer norm output (and its views), placed after the statistics."""
    mode = getattr(x.meta["val"], "fake_mode", None)

    def emit(target: Any, args: tuple, kwargs: dict | None = None) -> fx.Node:
        node = graph.call_function(target, args, kwargs or {})
        values, kw_values = pytree.tree_map_only(fx.Node, lambda a: a.meta["val"], (args, kwargs or {}))
        with mode if mode is not None else contextlib.nullcontext():
            node.meta["val"] = target(*values, **kw_values)
        return node

    order = {n: k for k, n in enumerate(graph.nodes)}
    needed = [mean, rstd] + [a for view in views for a in view.all_input_nodes if a not in views]
    anchor = max((n for n in needed if n in order), key=order.__getitem__)
    with graph.inserting_before(anchor.next):
        out = emit(aten.mul.Tensor, (emit(aten.sub.Tensor, (x, mean)), rstd))
        if isinstance(weight, fx.Node):
            out = emit(aten.mul.Tensor, (out, weight))
        if isinstance(bias, fx.Node):
            out = emit(aten.add.Tensor, (out, bias))
        if out.meta["val"].stride() != norm_out.meta["val"].stride():
            # the pointwise chain follows the input's layout (a transposed conv output, say), the norm
            # writes a contiguous one; the views below were recorded on the latter
            out = emit(aten.clone.default, (out,), {"memory_format": torch.contiguous_format})
        for view in views:
            out = emit(view.target, (out, *view.args[1:]), dict(view.kwargs))
    return out


def _symbols_in(value: Any, lone: bool) -> set[Any]:
    """The size symbols of a value's sizes, strides and storage offset (a tensor) or of itself (a
    SymInt); with `lone`, only those a single size or stride or the SymInt is equal to: the ones a
    graph that takes the value as an input can read off it."""
    if isinstance(value, torch.Tensor):
        parts = [*value.shape, *value.stride()] + ([] if lone else [value.storage_offset()])
    elif isinstance(value, torch.SymInt):
        parts = [value]
    else:
        return set()
    exprs = [expr_of(p) for p in parts if isinstance(p, torch.SymInt)]
    if lone:
        return {e for e in exprs if isinstance(e, sympy.Symbol)}
    return {s for e in exprs for s in e.free_symbols}


def _symbols_for_backward(joint: fx.GraphModule, nodes: list[fx.Node], fw: set[fx.Node],
                          inputs: list[fx.Node], bw_nodes: Iterable[fx.Node]) -> list[fx.Node]:
    """Forward values to save so that the backward can bind every size symbol it uses. A saved
    activation's sizes may be a product of symbols that none of the backward's inputs carries alone
    (XLNet's labels, [s10*s9] once flattened): the backward's kernels and buffers need s9 and s10,
    so the forward hands them over as SymInts, the forward's own input or a sym_size of one."""
    bound = set().union(*(_symbols_in(n.meta.get("val"), lone=True) for n in inputs))
    needed = set().union(*(_symbols_in(n.meta.get("val"), lone=False) for n in [*inputs, *bw_nodes]))
    extra: list[fx.Node] = []
    for symbol in sorted(needed - bound, key=str):
        found = next((n for n in nodes if n in fw and isinstance(n.meta.get("val"), torch.SymInt)
                      and expr_of(n.meta["val"]) == symbol), None)
        if found is None:
            for primal in (n for n in nodes if n.op == "placeholder" and n in fw):
                value = primal.meta.get("val")
                if not isinstance(value, torch.Tensor):
                    continue
                dims = [d for d, size in enumerate(value.shape)
                        if isinstance(size, torch.SymInt) and expr_of(size) == symbol]
                if dims:
                    with joint.graph.inserting_after(primal):
                        found = joint.graph.call_function(aten.sym_size.int, (primal, dims[0]))
                    found.meta["val"] = value.shape[dims[0]]
                    break
        if found is not None:  # else unbacked or not the forward's: the lowering says so
            extra.append(found)
    return extra


def _extract(joint: fx.GraphModule, order: list[fx.Node], inputs: list[fx.Node], keep: set[fx.Node],
             outputs: list[Any]) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in order:
        if node in keep and node not in env and node.op != "output":
            if node.op == "placeholder":
                raise AssertionError(f"partition needs {node.name} but it is not an input")
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs))
    gm = fx.GraphModule(joint, graph)
    gm.graph.eliminate_dead_code(lambda node: node.is_impure() or raises_on_values(node))
    gm.recompile()
    return gm


def partition(joint: JointTrace, policy: str = "min_cut", mutated: Iterable[int] = (),
              module_state: Iterable[int] = ()) -> Partition:
    """Split the joint graph; `policy` is "min_cut" or "save_all" (the default partitioner).
    `mutated`: positions of the inputs the graph mutates (primals_<k+1>); `module_state`: those
    that are parameters or buffers (any other input eager's backward does not read is never saved)."""
    nodes = list(joint.gm.graph.nodes)
    outputs = list(nodes[-1].args[0])
    fw_outputs, grads = outputs[:joint.num_forward_outputs], outputs[joint.num_forward_outputs:]
    primals = [n for n in nodes if n.op == "placeholder" and n.name.startswith("primals")]
    tangents = [n for n in nodes if n.op == "placeholder" and n.name.startswith("tangents")]
    # an op of the backward that checks its inputs' values (a custom Function's backward indexing
    # with a saved index) raises in eager's backward even when nothing reads its result: it is a
    # root of the backward as the grads are, and stays there (with the tangents' side of the cut)
    backward_checks = [n for n in nodes if n.meta.get("traced_in_backward") and raises_on_values(n)]
    tangent_dependent: set[fx.Node] = set(tangents) | set(backward_checks)
    for node in nodes:
        if any(i in tangent_dependent for i in node.all_input_nodes):
            tangent_dependent.add(node)
    if policy == "min_cut" and (_clamp_backward_reads_output(joint.gm, tangent_dependent)
                                | _recompute_norm_outputs(joint.gm, tangent_dependent)):
        nodes = list(joint.gm.graph.nodes)
    bw_roots = list(grads) + backward_checks
    fw = _ancestors(fw_outputs) | set(primals)
    bw_needed = _ancestors(bw_roots)
    if policy == "save_all":
        saved = _saved_by_save_all(nodes, fw, bw_needed)
    elif policy == "min_cut":
        saved = _saved_by_min_cut(nodes, fw, bw_needed, tangent_dependent,
                                  frozenset(f"primals_{k + 1}" for k in mutated),
                                  frozenset(f"primals_{k + 1}" for k in module_state))
    else:
        raise ValueError(f"unknown partition policy {policy!r}; use 'min_cut' or 'save_all'")
    # A gradient that depends on no tangent (angle's zeros_like(x)) reaches back to the inputs
    # without crossing the cut: keep the inputs it reads (a reference, no new memory).
    reached = _ancestors(bw_roots, stop=set(saved) | set(tangents))
    saved = list(saved) + [n for n in primals if n in reached and n not in saved]
    saved_tensors = [n for n in saved if isinstance(n.meta.get("val"), torch.Tensor)]
    saved_symints = [n for n in saved if n not in saved_tensors]
    # the backward may also read symbolic sizes that only the forward's inputs carry
    bw_keep = _ancestors(bw_roots, stop=set(saved) | set(tangents))
    more = _symbols_for_backward(joint.gm, nodes, fw, saved_tensors + saved_symints + tangents, bw_keep)
    if more:
        saved_symints += [n for n in dict.fromkeys(more) if n not in saved_symints]
        saved = list(saved) + [n for n in more if n not in saved]
        nodes = list(joint.gm.graph.nodes)
    for node in list(bw_keep):
        if node.op == "placeholder" and node not in tangents and node not in saved:
            raise AssertionError(f"partition lost {node.name}: the backward needs it but it is not saved")
    # a random op runs in the forward even when nothing reads it, so the RNG advances as in eager
    random_ops = [n for n in nodes if n not in tangent_dependent and n.op == "call_function"
                  and isinstance(n.target, torch._ops.OpOverload)
                  and torch.Tag.nondeterministic_seeded in n.target.tags]
    # and so does an op that checks its inputs' values (an index, an integer divisor): eager raises
    # in the forward even when nothing reads its result, or only the backward does
    checked_ops = [n for n in nodes if n not in tangent_dependent and raises_on_values(n)]
    forward = _extract(joint.gm, nodes, primals, _ancestors(fw_outputs + saved + random_ops + checked_ops),
                       fw_outputs + saved_tensors + saved_symints)
    backward = _extract(joint.gm, nodes, saved_tensors + saved_symints + tangents, bw_keep, grads)
    reorder_for_peak_memory(backward, frozenset(n.name for n in saved_tensors if _aliases_input(n)))
    return Partition(policy, forward, backward, len(fw_outputs),
                     tuple(_describe(n) for n in saved_tensors), tuple(_describe(n) for n in saved_symints),
                     recomputed_values(forward, backward, {n.name: n for n in nodes}))
