"""The `pack_convolutions` pass: in an inference graph, a 2-d convolution whose weight is a module's
parameter (or buffer) has that weight reordered for oneDNN once, not on every call.

Runs on the ATen graph after `fold_batch_norm`, before `decompose`. ATen's convolution given a plain
weight reorders it into oneDNN's blocked format on every call (eager pays that too); for the 3x3 and
7x7 convolutions of a UNet or a ConvNeXt at small images that reorder is 10-40% of the call. The
rewritten graph calls `kiln::pack_conv_weight` (kiln.runtime.folded_weights), which keeps the reordered
weight between calls and reorders it again when the weight's data or version counter changed (an
optimizer step, `load_state_dict`, `w.mul_(2)` under no_grad), then oneDNN's own convolution on it.
Inductor packs weights so only under freezing (torch/_inductor/fx_passes/mkldnn_fusion.py, its weight
pack pass), which assumes the parameters never change after compile; without freezing it reorders
on every call, as eager does.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from kiln import log
from kiln.lower.conv_layout import channels_last_eligible, small_conv_kind
from kiln.runtime.folded_weights import pack_conv_weight

aten = torch.ops.aten
mkldnn_convolution = torch.ops.mkldnn._convolution_pointwise.default


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _static(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and all(isinstance(s, int) for s in t.shape)


def _packable(conv: torch.fx.Node, kept: set[torch.fx.Node]) -> bool:
    """A float32 2-d non-transposed convolution on CPU, of static sizes, that oneDNN runs (not one
    Kiln computes itself: kiln.lower.conv_layout.small_conv_kind), whose weight is in `kept`."""
    x, weight, _bias, stride, padding, dilation, transposed, _out_pad, groups = conv.args
    if transposed or weight not in kept or not isinstance(groups, int):
        return False
    if not all(isinstance(a, (list, tuple)) and all(isinstance(v, int) for v in a)
               for a in (stride, padding, dilation)):
        return False
    xv, wv, out = _val(x), _val(weight), _val(conv)
    if not (_static(xv) and _static(wv) and _static(out)):
        return False
    if not (channels_last_eligible(wv.dtype, wv.device, wv.dim()) and xv.dim() == 4 and xv.dtype == wv.dtype):
        return False
    return small_conv_kind(tuple(xv.shape), tuple(wv.shape), tuple(out.shape), groups, False,
                           wv.dtype, wv.device) is None


def pack_convolutions(gm: torch.fx.GraphModule, module_state: tuple[int, ...],
                      mutated: tuple[int, ...]) -> torch.fx.GraphModule:
    """Rewrite each packable aten.convolution into kiln::pack_conv_weight + mkldnn's convolution, in
    place. `module_state`: the input positions that are parameters or buffers; `mutated`: the
    positions the graph writes (their weights are left alone: a packed copy would be made anew on
    every call)."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    kept = {placeholders[p] for p in module_state if p < len(placeholders) and p not in mutated}
    packed = 0
    for conv in list(graph.nodes):
        if conv.op != "call_function" or conv.target is not aten.convolution.default or not _packable(conv, kept):
            continue
        x, weight, bias, stride, padding, dilation, _transposed, _out_pad, groups = conv.args
        # the bias goes through the pack (stamped with the weight) where it is module state too;
        # any other bias (computed in the graph) is read by the convolution as it is
        bias_in = bias if bias in kept else None
        with graph.inserting_before(conv):
            pack = graph.call_function(pack_conv_weight, (weight, bias_in, list(padding), list(stride),
                                                          list(dilation), groups, list(_val(x).shape)))
            new_weight = graph.call_function(operator.getitem, (pack, 0))
            new_bias = graph.call_function(operator.getitem, (pack, 1)) if bias_in is not None else bias
            # oneDNN's convolution returns NHWC whatever x's layout; the node keeps eager's value as
            # its meta (as fold_batch_norm's packed convolutions do), so that a returned result gets
            # eager's strides, copied out once by the lowering
            fused = graph.call_function(mkldnn_convolution, (x, new_weight, new_bias, list(padding), list(stride),
                                                             list(dilation), groups, "none", [None], None))
        fused.meta.update(conv.meta)
        conv.replace_all_uses_with(fused)
        graph.erase_node(conv)
        packed += 1
    if packed:
        graph.lint()
        gm.recompile()
        log.debug("lower", lambda: f"pack_convolutions: {packed} convolution weight(s) packed once for oneDNN")
    return gm


__all__ = ["pack_convolutions", "pack_conv_weight"]
