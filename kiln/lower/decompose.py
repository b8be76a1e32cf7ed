"""The `decompose` pass: rewrite ATen ops that have no Kiln lowering into ops that do.

For each such node with an entry in PyTorch's Core ATen decomposition table (or a
CompositeImplicitAutograd kernel), the decomposition is run on meta tensors under a small dispatch
mode that records every op it reaches, and the recorded ops replace the node in the graph. Ops
with their own lowering are recorded as they are (Kiln's lowering beats the decomposition: softmax,
layer norm, gelu stay whole so they fuse). Corresponds to torch/_inductor/decomposition.py.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
import torch.fx
from torch._dispatch.python import enable_python_dispatcher
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from kiln import config, log
from kiln.fake.value_checks import raises_on_values
from kiln.lower.eager_dtypes import EAGER_REFUSES
from kiln.lower.lowerings import LOWERINGS
from kiln.lower.lowerings.extern import is_random

aten = torch.ops.aten

# metadata queries reach the mode too; they are not ops of the graph
_IGNORED = {torch.ops.prim.device.default, torch.ops.prim.layout.default, aten.sym_size.int,
            aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default, aten.is_contiguous.default}


@functools.lru_cache(maxsize=None)
def decomposition_table() -> dict[Any, Any]:
    table = dict(torch._decomp.core_aten_decompositions())
    # train-mode BatchNorm and its backward too (kiln.lower.lowerings.batch_norm): track_running_stats=False
    # is the no_stats overload; the packet's default (running statistics written in place) has a rule
    extra: list[Any] = [
        aten.native_batch_norm, aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
        aten._native_batch_norm_legit.no_stats, aten.addcmul, aten.addcdiv, aten.mish, aten.std_mean,
        aten.native_group_norm, aten.glu, aten.baddbmm, aten.logit, aten.xlogy, aten.log_sigmoid_forward,
        aten.softshrink, aten.hardshrink, aten.celu, aten.selu, aten.rrelu_with_noise, aten.im2col, aten.col2im]
    table.update(torch._decomp.get_decompositions(extra))
    table.update(foreach_decompositions())
    # Losses whose eager kernel checks its inputs' values run as the ATen call, which raises eager's
    # error: nll_loss's forward (PyTorch's decomposition gathers the targets, so a target out of
    # range raised gather's RuntimeError, not eager's IndexError "Target 3 is out of bounds.": one
    # read per row) and binary_cross_entropy ("all elements of input should be between 0 and 1":
    # the decomposition returned NaN, or a loss of a target of 2).
    # So do bernoulli of a tensor of probabilities, which checks each is in [0, 1] (the
    # decomposition drew against 1.5 as if it were 1), and max_unpool, which checks every index
    # ("Found an invalid max index": the decomposition's index_put raised IndexError, and wrapped -1).
    for op in (aten.nll_loss_forward.default, aten.nll_loss2d_forward.default, aten.binary_cross_entropy.default,
               aten.bernoulli.default, aten.max_unpool2d.default, aten.max_unpool3d.default):
        table.pop(op, None)
    # A lazily conjugated or negated view is a bit on the tensor that eager's kernels resolve as
    # they read it; Kiln's kernels read the memory as it is (`z.conj().imag * 1` came out negated):
    # the bits are materialized where they are set.
    table[aten._conj.default] = aten.conj_physical.default
    table[aten._neg_view.default] = aten.neg.default
    table[aten.nll_loss_backward.default] = functools.partial(nll_loss_backward, table[aten.nll_loss_backward.default])
    table[aten.embedding_dense_backward.default] = functools.partial(
        embedding_dense_backward, table[aten.embedding_dense_backward.default])
    table[aten.native_group_norm.default] = functools.partial(
        native_group_norm, table[aten.native_group_norm.default])
    table[aten.native_group_norm_backward.default] = functools.partial(
        native_group_norm_backward, table[aten.native_group_norm_backward.default])
    return table


def embedding_dense_backward(summing_in_float: Any, grad_output: torch.Tensor, indices: torch.Tensor,
                             num_weights: Any, padding_idx: int, scale_grad_by_freq: bool) -> torch.Tensor:
    """The gradient of an embedding table in float16/bfloat16 as ATen's CPU kernel makes it: each
    looked-up row's gradient added into its table row in turn, in the table's type (rounding after
    every add, which loses small gradients once a row's sum is large). PyTorch's decomposition
    (`summing_in_float`, used for the other types and for scale_grad_by_freq) sums in float32 and
    rounds once: far from eager for a token that occurs thousands of times."""
    if grad_output.dtype not in (torch.float16, torch.bfloat16) or scale_grad_by_freq:
        return summing_in_float(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
    width = grad_output.shape[-1]
    rows = aten.reshape.default(indices, [-1])
    grad = aten.reshape.default(grad_output, [-1, width])
    skipped = aten.unsqueeze.default(aten.eq.Scalar(rows, padding_idx), 1)  # padding_idx -1: none
    zero = aten.scalar_tensor.default(0.0, dtype=grad.dtype, device=grad.device)
    grad = aten.where.self(skipped, zero, grad)
    table = aten.zeros.default([num_weights, width], dtype=grad.dtype, device=grad.device)
    return aten.index_put.default(table, [rows], grad, True)


def native_group_norm(in_input_dtype: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                      *sizes_and_eps: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group norm of a float16/bfloat16 input with float32 parameters on CPU (autocast's mixed
    type): ATen's kernel keeps the saved mean and rstd in float32 (kiln.fake.impls says so), where
    PyTorch's decomposition (`in_input_dtype`) rounds them to the input's type. The decomposition
    computes in float32 anyway, so it runs on the input widened to float32 and only the normalized
    result is rounded back. The tensors here are meta ones, whatever the device: on a GPU, where
    the statistics keep the input's type, the dtypes disagree with the traced node's and the op
    stays an ATen call (see _agree_with_eager)."""
    mixed = any(isinstance(t, torch.Tensor) and t.dtype != x.dtype for t in (weight, bias))
    if not mixed and x.dtype in (torch.float32, torch.float64):
        return _group_norm_scale_shift(x, weight, bias, *sizes_and_eps)
    if not mixed or x.dtype not in (torch.float16, torch.bfloat16):
        return in_input_dtype(x, weight, bias, *sizes_and_eps)
    wide = aten._to_copy.default(x, dtype=torch.float32)
    out, mean, rstd = in_input_dtype(wide, weight, bias, *sizes_and_eps)
    return aten._to_copy.default(out, dtype=x.dtype), mean, rstd



def _group_norm_scale_shift(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, n: Any, c: Any,
                            hxw: Any, groups: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group norm as ATen's CPU kernel computes it: per sample and channel a scale (rstd times the
    weight) and a shift (the bias less the mean times the scale), stored once (the as_strided of a
    contiguous copy makes them buffers), then one multiply-add per element. In PyTorch's
    decomposition for other devices the normalization stays `(x - mean) * rstd * weight + bias`
    with rstd lazy: each element of the result recomputed its group's rsqrt and two divisions and
    gathered its group's statistics (a group norm and SiLU of a 64-channel NHWC activation ran 2.7x
    eager's time)."""
    per = c // groups
    grouped = aten.reshape.default(x, [n, groups, per, hxw])
    var, mean = aten.var_mean.correction(grouped, [2, 3], correction=0, keepdim=True)
    rstd = aten.rsqrt.default(aten.add.Scalar(var, eps))
    scale = (aten.expand.default(rstd, [n, groups, per, 1]) if weight is None
             else aten.mul.Tensor(rstd, aten.reshape.default(weight, [1, groups, per, 1])))
    shift = aten.neg.default(aten.mul.Tensor(mean, scale))
    if bias is not None:
        shift = aten.add.Tensor(shift, aten.reshape.default(bias, [1, groups, per, 1]))
    spread = [n, c] + [1] * (x.dim() - 2)

    def stored(t: torch.Tensor) -> torch.Tensor:
        flat = aten.as_strided.default(aten.clone.default(t, memory_format=torch.contiguous_format), [n, c], [c, 1])
        return aten.reshape.default(flat, spread)

    out = aten.add.Tensor(aten.mul.Tensor(x, stored(scale)), stored(shift))
    return out, aten.reshape.default(mean, [n, groups]), aten.reshape.default(rstd, [n, groups])

def native_group_norm_backward(promoting: Any, grad_output: torch.Tensor, x: torch.Tensor, mean: torch.Tensor,
                               rstd: torch.Tensor, weight: torch.Tensor | None,
                               *rest: Any) -> tuple[torch.Tensor | None, ...]:
    """The gradients in the dtypes of ATen's kernel (see kiln.fake.impls): the input's in its own,
    the weight's and bias's in the weight's. PyTorch's decomposition (`promoting`) gives all three
    the promoted type of its arguments: float32 for a half input with float32 statistics."""
    grads = promoting(grad_output, x, mean, rstd, weight, *rest)
    wanted = (x.dtype, *(weight.dtype if weight is not None else x.dtype,) * 2)
    return tuple(g if g is None or g.dtype == dtype else aten._to_copy.default(g, dtype=dtype)
                 for g, dtype in zip(grads, wanted))


def nll_loss_backward(scattering: Any, grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                      weight: torch.Tensor | None, reduction: int, ignore_index: int,
                      total_weight: torch.Tensor) -> torch.Tensor:
    """The gradient of nll_loss as one pointwise expression: -scale (times the class weight) where a
    class is its row's target and the row is not ignored, else 0. PyTorch's decomposition scatters
    into zeros instead: two kernels and a [rows, classes] buffer the cross-entropy backward then
    reads back. Targets out of range give 0 here; the forward's nll_loss has raised for them.
    Other ranks, and a symbolic class count (arange would take a raw SymInt into the graph), go
    through `scattering`, PyTorch's decomposition."""
    channel = self.dim() - 1
    if self.dim() not in (1, 2) or target.dim() != channel or not isinstance(self.shape[channel], int):
        return scattering(grad_output, self, target, weight, reduction, ignore_index, total_weight)
    classes = aten.arange.start(0, self.shape[channel], dtype=target.dtype, device=self.device)
    rows = aten.unsqueeze.default(target, channel)
    hit = aten.logical_and.default(aten.eq.Tensor(classes, rows), aten.ne.Scalar(rows, ignore_index))
    scale = grad_output if reduction != 1 else aten.div.Tensor(grad_output, total_weight)
    if reduction == 0 and self.dim() == 2:
        scale = aten.unsqueeze.default(scale, channel)  # one gradient per row
    grad = aten.neg.default(scale)
    if weight is not None:
        grad = aten.mul.Tensor(grad, weight)  # the weight of each column: its row's target's where it hits
    zero = aten.scalar_tensor.default(0.0, dtype=self.dtype, device=self.device)
    return aten.where.self(hit, aten._to_copy.default(grad, dtype=self.dtype), zero)


# The foreach ops a compiled optimizer step is made of (torch.optim's foreach=True path), whose
# result for each tensor is the plain op's on that tensor (ATen's CPU kernels loop over them so):
# split per tensor, each lowers to a pointwise node and the scheduler fuses them with their
# neighbours, instead of one ATen call per op over every tensor, a list of buffers each time.
_FOREACH_POINTWISE = ("add", "sub", "mul", "div", "addcmul", "addcdiv", "lerp", "sqrt", "exp", "log", "neg",
                      "abs", "sign", "reciprocal", "maximum", "minimum", "clamp_min", "clamp_max", "pow",
                      "sigmoid", "tanh", "sin", "cos", "expm1", "log1p", "erf", "floor", "ceil", "round", "trunc",
                      "frac")


def foreach_decompositions() -> dict[Any, Any]:
    """{aten._foreach_<op>.<overload>: its per-tensor split} for the functional overloads whose
    arguments are lists (indexed per tensor) or values shared by every tensor. An overload with a
    tensor of per-tensor scalars (`_foreach_addcmul.Tensor`'s `scalars`) is left whole."""
    table: dict[Any, Any] = {}
    for name in _FOREACH_POINTWISE:
        packet = getattr(aten, f"_foreach_{name}", None)
        plain = getattr(aten, name, None)
        if packet is None or plain is None:
            continue
        for overload_name in packet.overloads():
            overload = getattr(packet, overload_name)
            arguments = overload._schema.arguments
            if overload._schema.is_mutable or any(str(a.type) == "Tensor" and a.name == "scalars" for a in arguments):
                continue
            # an argument the plain op takes by keyword only (addcmul's `value`, positional in
            # _foreach_addcmul.Scalar) is passed by name; the others by position, as names differ
            # (_foreach_lerp's `tensors1` is lerp's `end`)
            by_name = frozenset(a.name for a in arguments if a.name in _keyword_only(plain))
            table[overload] = functools.partial(_split_foreach, plain, [a.name for a in arguments], by_name)
    return table


def _keyword_only(packet: Any) -> frozenset[str]:
    return frozenset(a.name for o in packet.overloads() for a in getattr(packet, o)._schema.arguments if a.kwarg_only)


def _split_foreach(plain: Any, names: list[str], by_name: frozenset[str], *args: Any, **kwargs: Any) -> list[Any]:
    bound = dict(zip(names, args), **kwargs)
    count = next(len(v) for v in bound.values() if isinstance(v, (list, tuple)))

    def at(value: Any, i: int) -> Any:
        return value[i] if isinstance(value, (list, tuple)) else value

    positional = [name for name in names if name in bound and name not in by_name]
    keywords = [name for name in names if name in bound and name in by_name]
    return [plain(*(at(bound[n], i) for n in positional), **{n: at(bound[n], i) for n in keywords})
            for i in range(count)]


def wants_decomposition(target: Any, keep: frozenset[str] = frozenset()) -> bool:
    """`keep`: op names (`str(overload)`) left whole, for the bisector's one-at-a-time switch."""
    if target in LOWERINGS or target in _IGNORED or not isinstance(target, torch._ops.OpOverload):
        return False
    if keep and str(target) in keep:
        return False
    if config.fallback_random and is_random(target):  # stays whole: run as the ATen call
        return False
    if target in decomposition_table():
        return True
    return torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")


class _Recorder(TorchDispatchMode):
    """Runs ops on meta tensors and appends each op that has a lowering (or no decomposition) to the graph."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Otherwise TorchDispatchMode wraps __torch_dispatch__ in torch._dynamo.disable, whose
        # first call imports Dynamo (slow). This mode never runs under Dynamo.
        return False

    def __init__(self, graph: torch.fx.Graph, nodes: dict[int, torch.fx.Node],
                 keep: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.graph = graph
        self.nodes = nodes
        self.keep = keep

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _IGNORED:
            return func(*args, **kwargs)
        if wants_decomposition(func, self.keep):
            table = decomposition_table()
            with self:
                out = table[func](*args, **kwargs) if func in table else func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **_on_meta(kwargs, args))
        fx_args, fx_kwargs = pytree.tree_map(self._node_of, (args, kwargs))
        with warnings.catch_warnings():
            # A decomposition's scalar may be a SymFloat/SymInt (linspace's step from a float
            # argument): the lowering reads it as its symbolic expression, so torch.fx's warning
            # about raw symbolic arguments is noise for the user here.
            warnings.filterwarnings("ignore", message="Raw Sym", category=UserWarning)
            node = self.graph.call_function(func, tuple(fx_args), fx_kwargs)
        node.meta["val"] = out
        if isinstance(out, torch.Tensor):
            self.nodes[id(out)] = node
        elif isinstance(out, (tuple, list)):
            for k, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    item = self.graph.call_function(lambda_getitem(), (node, k))
                    item.meta["val"] = o
                    self.nodes[id(o)] = item
        return out

    def _node_of(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            if id(a) not in self.nodes:  # a constant made inside the decomposition
                name = f"_decomp_const_{len(self.nodes)}"
                owner = self.graph.owning_module
                setattr(owner, name, a)
                self.nodes[id(a)] = self.graph.get_attr(name)
                self.nodes[id(a)].meta["val"] = a
            return self.nodes[id(a)]
        return a


def lambda_getitem() -> Any:
    import operator
    return operator.getitem


def _meta(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    return v


def _agree_with_eager(graph: torch.fx.Graph, node: torch.fx.Node, out: Any, expected: Any,
                      nodes: dict[int, torch.fx.Node]) -> Any:
    """`out` if the decomposition's outputs have the shapes and dtypes the node's traced value has,
    else None. Torch's batch-norm decompositions run here on meta tensors, which they take for
    a GPU, and so return eval-mode statistics of shape (C,) where eager on CPU returns empty
    tensors: such an output is replaced by a new empty tensor of eager's metadata."""
    if expected is None:
        return out
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    wants = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    if len(outs) != len(wants):
        return None
    fixed = []
    for got, want in zip(outs, wants):
        if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor) and got.dtype != want.dtype:
            return None  # the code after it reads the buffer in the traced dtype, symbolic sizes or not
        if not isinstance(want, torch.Tensor) or not _static(got.shape) or not _static(want.shape):
            fixed.append(got)  # nothing to compare with, or symbolic sizes: trust the decomposition
            continue
        if tuple(got.shape) != tuple(want.shape):
            if want.numel() != 0:
                return None
            with graph.inserting_before(node):
                empty = graph.call_function(aten.empty.memory_format, (list(want.shape),),
                                            {"dtype": want.dtype, "device": want.device})
            got = torch.empty(want.shape, dtype=want.dtype, device="meta")
            empty.meta["val"] = want
            nodes[id(got)] = empty
        fixed.append(got)
    return fixed[0] if isinstance(out, torch.Tensor) else type(out)(fixed)


_SYMBOLIC_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _on_meta(kwargs: dict, args: tuple) -> dict:
    """The keywords to run a factory op with while recording: a decomposition's factory (eye's
    aranges, a one-hot's zeros) names the graph's device, and on a real device its kernel turns a
    symbolic size into its example value, a guard that specialized the graph to it (one graph per
    size under dynamic=True). On the meta device its Python meta kernel keeps the size symbolic;
    the recorded node keeps the device the program asked for."""
    device = kwargs.get("device")
    if device is None or torch.device(device).type == "meta" \
            or not any(isinstance(a, _SYMBOLIC_SCALARS) for a in pytree.tree_leaves((args, kwargs))):
        return kwargs
    return dict(kwargs, device=torch.device("meta"), **({"pin_memory": False} if kwargs.get("pin_memory") else {}))


def _static(shape: Any) -> bool:
    return all(type(s) is int for s in shape)


def decompose(gm: torch.fx.GraphModule, metas: dict[torch.fx.Node, Any], *,
              keep: frozenset[str] = frozenset()) -> torch.fx.GraphModule:
    """Replace every node that wants a decomposition by the ops of its decomposition, in place;
    ops named in `keep` stay whole (lowered by their rule, or run as an ATen call)."""
    changed = 0
    abandoned: set[torch.fx.Node] = set()  # what a decomposition given up on recorded: dead, checked or not
    with enable_python_dispatcher():
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or not wants_decomposition(node.target, keep) \
                    or EAGER_REFUSES in node.meta:  # stays whole: its ATen call raises eager's error
                continue
            nodes: dict[int, torch.fx.Node] = {}
            env: dict[torch.fx.Node, Any] = {}

            def meta_of(a: Any) -> Any:
                if isinstance(a, torch.fx.Node):
                    if a not in env:
                        env[a] = _meta(metas[a])
                        if isinstance(env[a], torch.Tensor):
                            nodes[id(env[a])] = a
                    return env[a]
                return a

            args, kwargs = pytree.tree_map(meta_of, (node.args, node.kwargs))
            changed += 1  # even a decomposition given up on may have left dead nodes to sweep
            try:
                with gm.graph.inserting_before(node), _Recorder(gm.graph, nodes, keep):
                    out = node.target(*args, **kwargs)
            except Exception as e:  # the op stays and falls back to an ATen call
                log.debug("lower", f"decomposition of {node.target} failed: {e}")
                abandoned.update(n for n in nodes.values() if n not in env)
                continue
            if not isinstance(out, torch.Tensor) and not (
                    isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out)):
                abandoned.update(n for n in nodes.values() if n not in env)
                continue  # a size or a mixed result: the recorded ops are dead code, removed below
            out = _agree_with_eager(gm.graph, node, out, metas.get(node), nodes)
            if out is None:
                abandoned.update(n for n in nodes.values() if n not in env)
                continue  # metadata other than eager's: keep the op as an ATen call
            if isinstance(out, torch.Tensor):
                new = nodes[id(out)]
                node.replace_all_uses_with(new)
                metas[new] = new.meta["val"]
            else:
                for user in list(node.users):
                    k = user.args[1]
                    new = nodes[id(out[k])]
                    user.replace_all_uses_with(new)
                    metas[new] = new.meta["val"]
                    gm.graph.erase_node(user)
            for n in gm.graph.nodes:
                if n not in metas and "val" in n.meta:
                    metas[n] = n.meta["val"]
            gm.graph.erase_node(node)
    if changed:
        # an op that checks its inputs' values raises in eager even when nothing reads its result
        gm.graph.eliminate_dead_code(lambda n: n.is_impure() or (raises_on_values(n) and n not in abandoned))
        gm.recompile()
    return gm
