"""The `fold_batch_norm` pass: an inference BatchNorm after a convolution becomes the convolution's own
weight and bias, so the pair is one oneDNN call instead of a convolution and a pass over its output.

Runs on the ATen graph before `decompose`. BatchNorm in eval mode is an affine map per channel,
y = (conv(x, w) + b - mean) * g / sqrt(var + eps) + beta, so the same y is conv(x, w * s) + b' with
s = g / sqrt(var + eps) and b' = (b - mean) * s + beta. The folded weights are computed by the op
`kiln::fold_conv_bn`, called from the wrapper like any extern, which keeps them between calls and
recomputes them when any of its inputs changed (see `FoldCache`). Corresponds to Inductor's
freezing-time conv/BN folding (torch/_inductor/fx_passes/freezing_patterns.py), which instead
assumes the weights never change after compile.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch.utils.weak import WeakIdKeyDictionary

from kiln import log
from kiln.lower.conv_layout import channels_last_eligible, channels_last_pays

aten = torch.ops.aten

_LIBRARY = torch.library.Library("kiln", "FRAGMENT")
# The results are the cache's tensors, which live as long as the weight's cache entry: the schema
# says they alias the weight, so that the wrapper's memory planner never hands their storage to
# another buffer (it reuses only results it knows to be fresh) and nothing writes to them.
_LIBRARY.define("fold_conv_bn(Tensor(a) weight, Tensor? bias, Tensor? bn_weight, Tensor? bn_bias, "
                "Tensor running_mean, Tensor running_var, float eps, bool channels_last) -> (Tensor(a), Tensor(a))")


def _folded(weight: torch.Tensor, bias: torch.Tensor | None, bn_weight: torch.Tensor | None,
            bn_bias: torch.Tensor | None, mean: torch.Tensor, var: torch.Tensor, eps: float,
            channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        scale = torch.rsqrt(var + eps)
        if bn_weight is not None:
            scale = scale * bn_weight
        shift = -mean if bias is None else bias - mean
        new_bias = shift * scale if bn_bias is None else torch.addcmul(bn_bias, shift, scale)
        new_weight = weight * scale.reshape((-1,) + (1,) * (weight.dim() - 1))
        if channels_last:  # the strides of the meta impl's empty_like, also for 1x1 kernels
            new_weight = torch.empty_like(new_weight, memory_format=torch.channels_last).copy_(new_weight)
    return new_weight, new_bias


class FoldCache:
    """Folded weights kept per convolution weight, valid while every input is the same tensor data.

    An entry holds its inputs' (data pointer, version counter) and a detached alias of each input.
    The version counter moves on every in-place write that autograd would see (an optimizer step,
    `load_state_dict`, `copy_` under no_grad, BatchNorm's running-stat update in train mode); a
    new tensor put in place (`module.weight = ...`, `.data = ...`) has another data pointer, which
    cannot be a reused address because the alias keeps the old storage alive. Writes through
    `.data`, which autograd does not see either, are not detected. Entries go with their weight
    (a weak key), so a freed model frees its folded copies.
    """

    def __init__(self) -> None:
        self.entries: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.folds = 0  # how many times weights were (re)computed, for tests

    @staticmethod
    def _stamp(tensors: tuple[torch.Tensor | None, ...]) -> tuple:
        return tuple(None if t is None else (t.data_ptr(), t._version, t.shape, t.stride(), t.dtype, t.device)
                     for t in tensors)

    def get(self, weight: torch.Tensor, bias: torch.Tensor | None, bn_weight: torch.Tensor | None,
            bn_bias: torch.Tensor | None, mean: torch.Tensor, var: torch.Tensor, eps: float,
            channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = (weight, bias, bn_weight, bn_bias, mean, var)
        stamp = (self._stamp(inputs), eps, channels_last)
        entry = self.entries.get(weight)
        if entry is not None and entry[0] == stamp:
            return entry[2]
        result = _folded(weight, bias, bn_weight, bn_bias, mean, var, eps, channels_last)
        aliases = tuple(None if t is None else t.detach() for t in inputs)
        self.entries[weight] = (stamp, aliases, result)
        self.folds += 1
        return result


FOLD_CACHE = FoldCache()


def _fold_conv_bn(weight: torch.Tensor, bias: torch.Tensor | None, bn_weight: torch.Tensor | None,
                  bn_bias: torch.Tensor | None, running_mean: torch.Tensor, running_var: torch.Tensor,
                  eps: float, channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # outputs are the cached tensors themselves: they are read by the convolution only (the pass
    # never lets them reach a graph output), and the schema keeps the wrapper from reusing them
    return FOLD_CACHE.get(weight, bias, bn_weight, bn_bias, running_mean, running_var, eps, channels_last)


def _fold_conv_bn_meta(weight: torch.Tensor, bias: torch.Tensor | None, bn_weight: torch.Tensor | None,
                       bn_bias: torch.Tensor | None, running_mean: torch.Tensor, running_var: torch.Tensor,
                       eps: float, channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return (torch.empty_like(weight, memory_format=fmt),
            torch.empty_like(running_mean, memory_format=torch.contiguous_format))


_LIBRARY.impl("fold_conv_bn", _fold_conv_bn, "CompositeExplicitAutograd")
_LIBRARY.impl("fold_conv_bn", _fold_conv_bn_meta, "Meta")
fold_conv_bn = torch.ops.kiln.fold_conv_bn.default

_FOLDABLE_DTYPES = (torch.float32, torch.float64)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _bn_parts(node: torch.fx.Node) -> tuple[Any, Any, Any, Any, Any, float] | None:
    """(input, weight, bias, running_mean, running_var, eps) of an inference BatchNorm node."""
    if node.target is aten._native_batch_norm_legit_no_training.default:
        x, w, b, mean, var, _momentum, eps = node.args
        return x, w, b, mean, var, float(eps)  # type: ignore[arg-type]
    if node.target is aten._native_batch_norm_legit.default and node.args[5] is False:
        x, w, b, mean, var, _training, _momentum, eps = node.args
        return x, w, b, mean, var, float(eps)  # type: ignore[arg-type]
    return None


def _only_first_output_used(node: torch.fx.Node) -> bool:
    return all(u.target is operator.getitem and (u.args[1] == 0 or not u.users) for u in node.users)


def _foldable(conv: Any, bn: torch.fx.Node, parts: tuple) -> bool:
    """A 2-d or 3-d, non-transposed convolution whose output only this BatchNorm reads, with every
    weight a graph input (a parameter or buffer) of one float dtype, and only BN's result used."""
    if not isinstance(conv, torch.fx.Node) or conv.target is not aten.convolution.default:
        return False
    _x, weight, bias, _stride, _padding, _dilation, transposed, _op, _groups = conv.args
    if transposed or len(conv.users) != 1 or not _only_first_output_used(bn):
        return False
    tensors = [weight, bias, *parts[1:5]]
    if not all(t is None or (isinstance(t, torch.fx.Node) and t.op == "placeholder") for t in tensors):
        return False
    vals = [_val(t) for t in tensors if t is not None] + [_val(conv)]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return False
    dtype, device = vals[0].dtype, vals[0].device
    return (dtype in _FOLDABLE_DTYPES and all(v.dtype == dtype and v.device == device for v in vals)
            and vals[0].dim() in (4, 5) and all(isinstance(s, int) for s in vals[0].shape))


def _runs_channels_last(x: Any, weight: Any) -> bool:
    """Whether the convolution will run NHWC once its weight is an NHWC folded one (the rule of
    kiln.lower.conv_layout; not for an input that is also a graph output, which stays NCHW)."""
    xv, wv = _val(x), _val(weight)
    if not (isinstance(xv, torch.Tensor) and channels_last_eligible(wv.dtype, wv.device, wv.dim())):
        return False
    if xv.dim() != 4 or not all(isinstance(s, int) for s in xv.shape):
        return False
    leaves = any(u.op == "output" for u in x.users)
    return not leaves and channels_last_pays(xv.shape[2] * xv.shape[3], nhwc_weight=True)


def fold_batch_norm(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite conv -> inference BatchNorm into conv(x, folded weight, folded bias), in place."""
    graph = gm.graph
    folded = 0
    for bn in list(graph.nodes):
        if bn.op != "call_function":
            continue
        parts = _bn_parts(bn)
        if parts is None or not _foldable(parts[0], bn, parts):
            continue
        conv = parts[0]
        x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = conv.args
        channels_last = _runs_channels_last(x, weight)
        with graph.inserting_before(conv):
            fold = graph.call_function(fold_conv_bn, (weight, bias, parts[1], parts[2], parts[3], parts[4],
                                                      float(parts[5]), channels_last))
            new_weight = graph.call_function(operator.getitem, (fold, 0))
            new_bias = graph.call_function(operator.getitem, (fold, 1))
        # the convolution keeps its node (and its output's metadata): BatchNorm preserves shape,
        # dtype and layout, so what read BN's result reads the convolution's instead
        conv.args = (x, new_weight, new_bias, stride, padding, dilation, transposed, output_padding, groups)
        for user in list(bn.users):  # getitem 0, and unused getitems of the saved statistics
            if user.args[1] == 0:
                user.replace_all_uses_with(conv)
            graph.erase_node(user)
        graph.erase_node(bn)
        folded += 1
    if folded:
        graph.lint()
        gm.recompile()
        log.debug("lower", lambda: f"fold_batch_norm: {folded} BatchNorm(s) folded into convolutions")
    return gm


__all__ = ["fold_batch_norm", "fold_conv_bn", "FOLD_CACHE", "FoldCache"]
