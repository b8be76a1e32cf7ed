"""The `fold_batch_norm` pass: an inference BatchNorm after a convolution becomes the convolution's own
weight and bias, so the pair is one oneDNN call instead of a convolution and a pass over its output.

Runs on the ATen graph before `decompose`. BatchNorm in eval mode is an affine map per channel,
y = (conv(x, w) + b - mean) * g / sqrt(var + eps) + beta, so the same y is conv(x, w * s) + b' with
s = g / sqrt(var + eps) and b' = (b - mean) * s + beta. The folded weights are computed by the op
`kiln::fold_conv_bn` (kiln.runtime.folded_weights), called from the wrapper like any extern, which
keeps them between calls and recomputes them when any of its inputs changed (see `FoldCache`).
Corresponds to Inductor's freezing-time conv/BN folding (torch/_inductor/fx_passes/
freezing_patterns.py), which instead assumes the weights never change after compile.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from kiln import log
from kiln.lower.conv_layout import channels_last_eligible, channels_last_pays, small_conv_kind
from kiln.runtime.folded_weights import FOLD_CACHE, FoldCache, fold_conv_bn, fold_conv_bn_packed

aten = torch.ops.aten
mkldnn_convolution = torch.ops.mkldnn._convolution_pointwise.default

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
    xv, out = _val(_x), vals[-1]
    if (isinstance(xv, torch.Tensor) and isinstance(_groups, int)
            and small_conv_kind(tuple(xv.shape), tuple(vals[0].shape), tuple(out.shape), _groups, bool(transposed),
                                dtype, device) is not None):
        return False  # computed without oneDNN: BatchNorm's affine map fuses into what reads the result
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


def _packs(x: Any, weight: Any) -> bool:
    """Whether the folded weight is reordered for oneDNN once (kiln::fold_conv_bn_packed) and the
    convolution becomes mkldnn::_convolution_pointwise: 2-d float32 on CPU, static input size."""
    xv, wv = _val(x), _val(weight)
    return (isinstance(xv, torch.Tensor) and channels_last_eligible(wv.dtype, wv.device, wv.dim())
            and xv.dim() == 4 and all(isinstance(s, int) for s in xv.shape))


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
        bn_args = (weight, bias, parts[1], parts[2], parts[3], parts[4], float(parts[5]))
        packs = _packs(x, weight)
        with graph.inserting_before(conv):
            if packs:
                fold = graph.call_function(fold_conv_bn_packed, bn_args + (
                    list(padding), list(stride), list(dilation), groups, list(_val(x).shape)))
            else:
                fold = graph.call_function(fold_conv_bn, bn_args + (_runs_channels_last(x, weight),))
            new_weight = graph.call_function(operator.getitem, (fold, 0))
            new_bias = graph.call_function(operator.getitem, (fold, 1))
        if packs:
            # oneDNN's own convolution on the packed weight (it returns NHWC, whatever x's layout:
            # its meta kernel says so, and the node's metadata is computed from it)
            with graph.inserting_before(conv):
                fused = graph.call_function(mkldnn_convolution, (x, new_weight, new_bias, list(padding), list(stride),
                                                                 list(dilation), groups, "none", [None], None))
            # ... but the program saw BatchNorm's result in eager's layout: that is the node's value, so a
            # graph output (and a view of it replayed outside) gets eager's strides; the lowering still
            # stores it NHWC inside (relaid_out) and copies it out once where it is returned
            eager_val = next((u.meta.get("val") for u in bn.users if u.args[1] == 0), None)
            if isinstance(eager_val, torch.Tensor):
                fused.meta["val"] = eager_val
            conv.replace_all_uses_with(fused)
            graph.erase_node(conv)
            conv = fused
        else:
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


__all__ = ["fold_batch_norm", "fold_conv_bn", "fold_conv_bn_packed", "FOLD_CACHE", "FoldCache"]
